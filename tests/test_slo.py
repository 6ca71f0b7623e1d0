"""SLOs at any percentile: the goodput criterion, the early-stop guard, summaries, the CLI
spec, and fractional-rate sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.config import config_from_table
from sim.engine.pipeline import SLOGuard
from sim.engine.state import Req
from sim.core.errors import ConfigError
from sim.outputs.metrics import _stats, meets_slo
from sim.core.slo import SLO, need_over, need_under, parse_slo_spec, pkey, slo_from_specs, slo_overrides
from sim.studies.sweep import Runner, Search, goodput_searches, parse_rates

from conftest import REPO


def test_percentile_values_by_hand():
    # 100, 200, ..., 1000: numpy's linear interpolation at h = 9 q / 100
    st = _stats("ttft_ms", [100.0 * i for i in range(1, 11)], (95.0, 99.9))
    assert st["p50_ttft_ms"] == pytest.approx(550.0)  # h = 4.5
    assert st["p90_ttft_ms"] == pytest.approx(910.0)  # h = 8.1
    assert st["p95_ttft_ms"] == pytest.approx(955.0)  # h = 8.55
    assert st["p99_ttft_ms"] == pytest.approx(991.0)  # h = 8.91
    assert st["p99.9_ttft_ms"] == pytest.approx(999.1)  # h = 8.991
    assert pkey(99.9, "ttft") == "p99.9_ttft_ms" and pkey(95.0, "tpot") == "p95_tpot_ms"


def _summary(**kw):
    return {"status": "ok", "num_requests": 10, "num_finished": 10, **kw}


def test_goodput_criterion_reads_the_named_percentiles():
    s = _summary(p90_ttft_ms=910.0, p99_ttft_ms=991.0, p90_tpot_ms=120.0, p95_tpot_ms=160.0)
    assert meets_slo(s, SLO(ttft_ms=1000, ttft_percentile=99))
    assert not meets_slo(s, SLO(ttft_ms=990, ttft_percentile=99))  # P99 991 > 990
    assert meets_slo(s, SLO(ttft_ms=990, ttft_percentile=90))  # P90 910 <= 990
    assert not meets_slo(s, SLO(tpot_ms=150, tpot_percentile=95))  # P95 TPOT 160 > 150
    assert meets_slo(s, SLO(tpot_ms=150))  # P90 TPOT 120
    assert meets_slo(s, 2000, 200)  # the legacy P90/P90 call
    # an E2E objective, when set, is part of the criterion
    assert not meets_slo({**s, "p90_e2e_ms": 5000.0}, SLO(e2e_ms=4000))
    assert meets_slo({**s, "p90_e2e_ms": 3000.0}, SLO(e2e_ms=4000))
    # a percentile the summary lacks is an error, not a silent pass
    with pytest.raises(ConfigError, match="p95_ttft_ms"):
        SLO(ttft_percentile=95).meets(s)
    # margin: the smallest relative slack, 1 - 991/1000 for TTFT vs 1 - 120/200 for TPOT
    assert SLO(ttft_ms=1000, ttft_percentile=99).margin(s) == pytest.approx(0.009)


@pytest.mark.parametrize("n", [1, 2, 7, 10, 20, 33, 400])
@pytest.mark.parametrize("q", [50.0, 90.0, 95.0, 99.0, 99.9, 100.0])
def test_need_over_is_exact_for_numpys_percentile(n, q):
    """In the worst case for the guard (b values just over x, the rest 0), numpy's percentile
    exceeds x exactly when b >= need_over(n, q): the rule is as early as it can be, never wrong."""
    x = 1.0
    for b in range(n + 1):
        v = np.array([0.0] * (n - b) + [x + 1e-9] * b)
        assert (np.percentile(v, q) > x) == (b >= need_over(n, q)), (n, q, b)


@pytest.mark.parametrize("n", [1, 2, 7, 10, 11, 20, 33, 400])
@pytest.mark.parametrize("q", [50.0, 90.0, 95.0, 99.0, 99.9, 100.0])
def test_need_under_is_exact_for_numpys_percentile(n, q):
    """In the worst case for the pass rule (g values at x, the rest far over it), numpy's
    percentile stays within x exactly when g >= need_under(n, q)."""
    x = 1.0
    for g in range(n + 1):
        v = np.array([x] * g + [1e6] * (n - g))
        assert (np.percentile(v, q) <= x) == (g >= need_under(n, q)), (n, q, g)


def test_need_under_by_hand():
    # n = 10, P90: h = 8.1 interpolates order statistics 8 and 9 (0-based): both, so 10 values;
    # n = 11: h = 9 exactly, order statistic 9 only: 10 values; n = 0: no percentile, nothing
    assert need_under(10, 90.0) == 10 and need_under(11, 90.0) == 10 and need_under(21, 90.0) == 19
    assert need_under(0, 90.0) == 0 and need_under(1, 90.0) == 1 and need_under(4, 50.0) == 3


def test_a_met_summary_passes_its_own_slo_only():
    met = {"status": "met", "slo": SLO(ttft_ms=1600, tpot_ms=160).describe(), "num_finished": 80,
           "num_requests": 100, "p90_ttft_ms": 5000.0}
    assert SLO(ttft_ms=1600, tpot_ms=160).meets(met)
    with pytest.raises(ConfigError, match="certain to meet"):
        SLO().meets(met)
    with pytest.raises(ConfigError, match="stop_when_met needs"):
        SLO(stop_when_met=True).validate("x.toml")
    SLO(stop_when_met=True, stop_when_violated=True).validate("x.toml")


@pytest.mark.parametrize("bad_rows, met", [((0, 1, 2), True), ((37, 38, 39), False)])
def test_certain_to_meet_counts_the_late_arrivals_too(bad_rows, met):
    """40 requests arriving at t = 0..39 s, all finished, 3 over the TTFT SLO: the overall P90
    (37 of 40 within, need_under = 37) is certain either way, the late quarter's (arrivals from
    39 - 0.25 x 39 = 29.25 s: rows 30-39, need 10 of 10) only when the 3 are early ones."""
    from sim.engine.requests import RequestArrays, RequestTable
    from sim.workloads import RequestSpec

    specs = [RequestSpec(i, float(i), 100, 10) for i in range(40)]
    table = RequestTable(RequestArrays.of(specs), 10_000, 10_000)
    guard = SLOGuard(table, 2.0, 0.2, kv_tokens=100_000)
    for i, spec in enumerate(specs):
        r = table.make(i)
        r.first_token_s = spec.arrival_s + (3.0 if i in bad_rows else 0.5)
        r.finish_s = r.first_token_s + 9 * 0.05
        guard.finished(r)
        del table.live[i]
    assert guard.check(45.0) == met
    assert guard.outcome == ("met" if met else "stopped") and ("certain to meet" in guard.reason) == met


def test_certain_to_meet_waits_for_every_arrival_and_room_in_the_pool():
    """P50 SLOs over 40 requests arriving at t = 0..39 s (need 21 overall, 6 of the 10 late):
    the counts are there after 39 good finishes, but the run is certain only once the last
    request has arrived and the pool holds every live request at its full length."""
    from sim.engine.requests import RequestArrays, RequestTable
    from sim.workloads import RequestSpec

    specs = [RequestSpec(i, float(i), 100, 10) for i in range(40)]
    table = RequestTable(RequestArrays.of(specs), 10_000, 10_000)
    guard = SLOGuard(table, 2.0, 0.2, ttft_percentile=50.0, tpot_percentile=50.0, kv_tokens=110)

    def finish(i):
        r = table.live[i]
        r.first_token_s, r.finish_s = specs[i].arrival_s + 0.5, specs[i].arrival_s + 0.95
        guard.finished(r)
        del table.live[i]

    for i in range(39):
        table.make(i)
        if i != 5:
            finish(i)
    assert not guard.check(39.0)  # request 39 has not arrived
    table.make(39)
    finish(39)
    guard.kv_tokens = 109
    assert not guard.check(40.0)  # request 5 (100 + 10 tokens) does not fit in 109
    guard.kv_tokens = 110
    assert guard.check(40.0) and guard.outcome == "met"


def _req(rid, arrival, first=None):
    r = Req(rid, arrival, 100, 10, 10_000, 10_000)
    r.first_token_s = first
    return r


def test_guard_follows_the_percentile():
    # 20 requests at t=0; at t=3 s, two still lack a first token (TTFT > 2 s), 18 got it at 0.1 s.
    def reqs():
        return [_req(i, 0.0, None if i < 2 else 0.1) for i in range(20)]

    # need: P99 20 - floor(18.81) = 2; P90 20 - floor(17.1) = 3; P50 20 - floor(9.5) = 11
    assert SLOGuard(reqs(), 2.0, 1.0, ttft_percentile=99).check(3.0)
    assert not SLOGuard(reqs(), 2.0, 1.0, ttft_percentile=90).check(3.0)
    assert not SLOGuard(reqs(), 2.0, 1.0).check(3.0)
    g = SLOGuard(reqs(), 2.0, 1.0, ttft_percentile=99)
    g.check(3.0)
    assert "P99 TTFT is certain to exceed" in g.reason
    # E2E: every request has been in the system 3 s > 2.5 s
    g = SLOGuard(reqs(), 10.0, 10.0, e2e_s=2.5, e2e_percentile=50)
    assert g.check(3.0) and "P50 E2E" in g.reason


def _small(rate, slo):
    return {"seed": 1, "parallel": {"pp": 2, "tp": 1},
            "scheduler": {"chunk_size_tokens": 256, "kv_tokens": 50_000},
            "latency": {"kind": "constant", "stage_ms": 10.0},
            "workload": {"kind": "synthetic-uniform", "rate_rps": rate, "num_requests": 150,
                         "input_range": [10, 600], "output_range": [2, 30]},
            "slo": slo}


def test_guarded_run_reaches_the_same_verdict_at_p99():
    from sim.engine.run import run
    from sim.outputs.metrics import summarize

    slo = {"ttft_ms": 400.0, "ttft_percentile": 99.0, "tpot_ms": 60.0, "tpot_percentile": 99.0}
    for rate in (4.0, 30.0):
        full = summarize(run(config_from_table(_small(rate, dict(slo)))))
        res = run(config_from_table(_small(rate, {**slo, "stop_when_violated": True})))
        early = summarize(res)
        assert "p99_ttft_ms" in full and full["meets_slo"] == early["meets_slo"]
        if res.status == "stopped":
            assert "P99" in res.reason and not full["meets_slo"]
    # the summary carries a percentile only the SLO names
    from sim.outputs.metrics import requests_frame

    res = run(config_from_table(_small(2.0, {"ttft_ms": 400.0, "ttft_percentile": 95.0})))
    s, df = summarize(res), requests_frame(res)
    assert s["p95_ttft_ms"] == pytest.approx(float(np.percentile(df["ttft_ms"].dropna(), 95)))
    assert "P95 TTFT <= 400 ms" in s["slo"]


def test_slo_specs_and_config_keys():
    assert parse_slo_spec("ttft:p99:1000") == ("ttft", 99.0, 1000.0)
    assert parse_slo_spec("TPOT:P99.9:80") == ("tpot", 99.9, 80.0)
    slo = slo_from_specs(["ttft:p99:1000", "tpot:p90:100"])
    assert (slo.ttft_ms, slo.ttft_percentile, slo.tpot_ms, slo.tpot_percentile) == (1000, 99, 100, 90)
    assert slo.describe() == "P99 TTFT <= 1000 ms and P90 TPOT <= 100 ms"
    assert slo_overrides(["e2e:p95:9000"]) == ["slo.e2e_ms=9000.0", "slo.e2e_percentile=95.0"]
    for bad in ("ttft:99:1000", "latency:p99:1", "ttft:p0:1", "ttft:p101:1", "ttft:p99:-3", "ttft:p99"):
        with pytest.raises(ConfigError, match="--slo"):
            parse_slo_spec(bad)
    cfg = config_from_table(_small(1.0, {"ttft_ms": 1500.0, "ttft_percentile": 99.0}))
    assert cfg.slo.ttft_percentile == 99.0 and cfg.slo.tpot_percentile == 90.0 and cfg.slo.e2e_ms is None
    with pytest.raises(ConfigError, match="ttft_percentile must be in"):
        config_from_table(_small(1.0, {"ttft_percentile": 0.0}))
    with pytest.raises(ConfigError, match="unknown key 'p99'"):
        config_from_table(_small(1.0, {"p99": 1.0}))


def test_fractional_rates():
    assert parse_rates("1:4") == [1.0, 2.0, 3.0, 4.0]
    assert parse_rates("0.25:1") == [0.25, 0.5, 0.75, 1.0]
    assert parse_rates("0.5:2:0.5") == [0.5, 1.0, 1.5, 2.0]
    assert parse_rates("0.1:0.35:0.1") == [0.1, 0.2, 0.3]
    for bad, msg in (("0:3", "need 0 < LO <= HI"), ("a:b", "expected LO:HI"), ("1:2:0", "STEP"),
                     ("3:1", "need 0 < LO"), ("1", "expected LO:HI")):
        with pytest.raises(ConfigError, match=msg):
            parse_rates(bad)


def _fake(threshold):
    def evaluate(table):
        rate = table["workload"]["rate_rps"]
        return {"status": "ok", "num_requests": 10, "num_finished": 10,
                "p99_ttft_ms": 2000.0 * rate / threshold, "p90_tpot_ms": 100.0}

    return evaluate


@pytest.mark.parametrize("threshold", [0.07, 0.18, 0.3, 0.62, 0.9])
def test_bisection_below_one_request_per_second(threshold):
    runner = Runner(None, progress=False, evaluate_fn=_fake(threshold))
    s = Search({}, {"workload": {}}, parse_rates("0.25:2"), slo=SLO(ttft_percentile=99))
    (res,) = goodput_searches(runner, [s], tol=0.05)
    g = res["goodput_rps"]
    # within 0.05 req/s, and within 10% once the bracket is below 0.5 req/s
    assert g <= threshold + 1e-9 and threshold - g <= min(0.05, 0.1 * threshold + 1e-9) + 1e-9, g


def test_cli_run_and_goodput_take_slo_flags(tmp_path, capsys):
    from sim.cli import main

    cfg = str(REPO / "experiments" / "configs" / "default.toml")
    code = main(["run", cfg, "--set", "workload.num_requests=30", "--slo", "ttft:p95:3000", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code in (0, 1) and "p95_ttft_ms" in out and "P95 TTFT <= 3000 ms" in out
    assert main(["run", cfg, "--slo", "ttft:p99", "--out", str(tmp_path)]) == 2
    assert "expected METRIC:pQ:MS" in capsys.readouterr().err
    assert main(["goodput", cfg, "--rates", "0.5:x"]) == 2
    assert "--rates '0.5:x'" in capsys.readouterr().err
