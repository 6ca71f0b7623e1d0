"""The conservative goodput of issue 39 (sim.studies.sweep.holds_on_seeds): a rate counts for a deployment only
if every paired seed passes the test `ppsim plan --verify` applies and the lower end of the 95% t interval of
the seeds' margins is not below zero. Hand cases: a constant-latency deployment on a tiny workload whose
three seeds all pass (the old rule accepts it) with a thin, scattered margin (the new one refuses), and a
goodput search whose first seed's highest pass fails on another seed."""

from __future__ import annotations

import math

import pytest

from sim.studies.sweep import Runner, SustainedSLO, evaluate, holds_on_seeds, sustained

T_975_2 = 4.302652729911275  # Student t, 97.5th percentile, 2 degrees of freedom (tables: 4.303)


def _table(seed: int, ttft_ms: float) -> dict:
    return {"seed": seed, "parallel": {"pp": 1, "tp": 1}, "scheduler": {"chunk_size_tokens": 256, "kv_tokens": 50_000},
            "latency": {"kind": "constant", "stage_ms": 10.0}, "slo": {"ttft_ms": ttft_ms, "tpot_ms": 1e6},
            "workload": {"kind": "synthetic-uniform", "rate_rps": 4.0, "num_requests": 40,
                         "input_range": [10, 600], "output_range": [2, 30]}}


def _hand_lower_end(margins: list[float]) -> float:
    n = len(margins)
    mean = sum(margins) / n
    sd = math.sqrt(sum((m - mean) ** 2 for m in margins) / (n - 1))
    return mean - T_975_2 * sd / math.sqrt(n)


def test_every_seed_passing_thinly_is_refused_by_hand():
    runs = [evaluate(_table(seed, 33.0)) for seed in (1, 2, 3)]
    assert all(r["status"] == "ok" and not r["saturated"] for r in runs)
    slo = SustainedSLO(ttft_ms=33.0, tpot_ms=1e6)
    # the old rule (every seed meets the SLOs) accepts the rate
    assert all(slo.meets(r) for r in runs)
    # each margin by hand: the smaller slack of P90 TTFT over all requests and over the late arrivals
    margins = [min(1 - r["p90_ttft_ms"] / 33.0, 1 - r["late_p90_ttft_ms"] / 33.0) for r in runs]
    assert [slo.margin(r) for r in runs] == pytest.approx(margins)
    assert min(margins) < 0.05 < max(margins)  # thin on one seed, wide on another: scattered
    assert _hand_lower_end(margins) < 0
    assert not holds_on_seeds(slo, runs)
    # with room to spare the same runs count (their verdicts do not read the threshold)
    wide = SustainedSLO(ttft_ms=60.0, tpot_ms=1e6)
    assert _hand_lower_end([wide.margin(r) for r in runs]) > 0 and holds_on_seeds(wide, runs)
    # one seed: no interval, the seed's verdict alone (the plan's --seeds 1)
    assert holds_on_seeds(slo, runs[:1]) and not holds_on_seeds(slo, [])


def test_margin_reads_the_late_arrivals_and_saturation_as_meets_does():
    """A probe and --verify judge alike (`SustainedSLO.meets`); the margin a row shows agrees with it: a
    run that misses only on its late arrivals, or is saturated, has a negative margin (it showed +0.042)."""
    slo = SustainedSLO(ttft_ms=1000.0, tpot_ms=50.0)
    base = {"status": "ok", "num_requests": 100, "num_finished": 100, "p90_ttft_ms": 500.0, "p90_tpot_ms": 47.9,
            "late_p90_ttft_ms": 600.0, "late_p90_tpot_ms": 49.0, "saturated": False}
    assert slo.meets(base) and slo.margin(base) == pytest.approx(1 - 49.0 / 50.0)
    late = {**base, "late_p90_tpot_ms": 51.0}
    assert not slo.meets(late) and slo.margin(late) == pytest.approx(1 - 51.0 / 50.0)
    sat = {**base, "saturated": True, "offered_rate_rps": 10.0, "completion_rate_rps": 8.0}
    assert not slo.meets(sat) and slo.margin(sat) == pytest.approx(-0.2)
    assert sustained(slo) is slo


def _seeded_server():
    """P90 TTFT = 100 ms x rate x f(seed) (f = 1, 1.08, 0.95), TPOT 10 ms: seed 1 meets 1,000 ms up to 10 req/s,
    seed 2 up to 9.26, seed 3 up to 10.53."""
    f = {1: 1.0, 2: 1.08, 3: 0.95}

    def ev(table):
        rate, n = table["workload"]["rate_rps"], table["workload"]["num_requests"]
        ttft = 100.0 * rate * f[table["seed"]]
        return {"status": "ok", "num_requests": n, "num_finished": n, "p90_ttft_ms": ttft, "p90_tpot_ms": 10.0,
                "late_p90_ttft_ms": ttft, "late_p90_tpot_ms": 10.0, "saturated": False}

    return ev


def test_goodput_steps_down_until_every_seed_holds_by_hand():
    from sim.studies.plan import goodputs_above

    slo = SustainedSLO(ttft_ms=1000.0, tpot_ms=50.0)
    tab = lambda seed: {"seed": seed, "workload": {"rate_rps": 4.0, "num_requests": 240}}  # noqa: E731
    runner = Runner(None, progress=False, evaluate_fn=_seeded_server())
    # the first seed alone: 4 and 8 pass, 16 fails; bisection sqrt(8 x 16) = 11.31 fails, sqrt(8 x 11.31) = 9.514
    # passes, sqrt(9.514 x 11.31) = 10.37 fails; 10.37 / 9.514 < 1.1: the goodput is 9.514, where seed 2 fails
    ((old, _),) = goodputs_above(runner, [tab(1)], 4.0, slo)
    assert old == pytest.approx(9.5137, abs=1e-4)
    # with the other seeds: margins 1 - 0.1 r f; the interval's lower end 1 - 0.1 r (mean f + 4.303 sd(f) /
    # sqrt 3) = 1 - 0.11730 r is >= 0 up to r = 8.525: 9.514 (seed 2 fails) and 9.514 / 1.1 = 8.649 (every
    # seed passes, lower end -0.0145) are refused, 8.649 / 1.1 = 7.863 counts
    ((new, at),) = goodputs_above(runner, [tab(1)], 4.0, slo, seed_tables=[[tab(2), tab(3)]])
    r1 = round(round(old / 1.1, 4) / 1.1, 4)
    assert new == pytest.approx(r1) and new == pytest.approx(7.8626, abs=1e-3)
    margins = [1 - 0.1 * f * r1 for f in (1.0, 1.08, 0.95)]
    assert _hand_lower_end(margins) >= 0
    r0 = round(old / 1.1, 4)
    assert _hand_lower_end([1 - 0.1 * f * r0 for f in (1.0, 1.08, 0.95)]) < 0
    assert at["p90_ttft_ms"] == pytest.approx(100.0 * r1)  # the first seed's run at the goodput
    # never below the demanded rate, where the deployment met the SLOs: the ladder ends there
    tight = SustainedSLO(ttft_ms=480.0, tpot_ms=50.0)  # seed 1 meets up to 4.8 req/s, seed 2 up to 4.44
    ((g, at4),) = goodputs_above(runner, [tab(1)], 4.0, tight, seed_tables=[[tab(2), tab(3)]])
    assert g == 4.0 and at4["p90_ttft_ms"] == pytest.approx(400.0)


def test_a_row_refused_for_a_thin_margin_says_so():
    import numpy as np

    from sim.studies.cluster_plan import _cluster_warnings
    from sim.studies.plan import _warnings, at_rate_row

    slo = SustainedSLO(ttft_ms=33.0, tpot_ms=1e6)
    runs = [evaluate(_table(seed, 33.0)) for seed in (1, 2)]
    runs.append({**runs[0], "p90_ttft_ms": 32.9, "late_p90_ttft_ms": 32.9})  # a third seed passing at +0.3%
    row = {"status": "ok", "num_seeds": 3, **at_rate_row(runs, slo)}
    assert row["seeds_meeting"] == 3 and row["meets_slo"] is False and row["refused_thin_margin"] is True
    for text in (_warnings(row, "rate"), _cluster_warnings(row)):
        assert "meets the SLOs on every seed, but thinly" in text and f"{row['margin_ci_lo']:+.1%}" in text
    assert "thinly" in _warnings({**row, "refused_thin_margin": np.bool_(True)}, "rate")
    assert "thinly" not in _warnings({**row, "refused_thin_margin": np.nan}, "rate")


def test_goodput_mode_ladder_ends_at_zero_without_a_demanded_rate():
    """`counted_rates` as goodput mode calls it (no demanded rate: floor 0.05 req/s, which does not count
    unchecked): from the lowest seed's goodput down the 10% ladder; a deployment no rung of which counts has
    no goodput."""
    from sim.studies.plan import counted_rates
    from sim.studies.sweep import Search

    slo = SustainedSLO(ttft_ms=1000.0, tpot_ms=50.0)
    runner = Runner(None, progress=False, evaluate_fn=_seeded_server())
    group = [Search({}, {"seed": sd, "workload": {"rate_rps": 4.0, "num_requests": 240}}, [4.0], slo=slo)
             for sd in (1, 2, 3)]
    # seed goodputs 10, 9.25, 10.5 (0.05 grid): the ladder starts at the lowest, 9.25, where every seed passes
    # (seed 2: 999 ms) but the margins' lower end is 1 - 0.11730 x 9.25 < 0 (above); 9.25 / 1.1 = 8.4091 counts
    ((g, summ),) = counted_rates(runner, [group], [9.25], slo, 0.05, "t", floor_counts=False)
    assert g == pytest.approx(round(9.25 / 1.1, 4)) and len(summ) == 3
    never = SustainedSLO(ttft_ms=1.0, tpot_ms=50.0)  # 100 r f <= 1 ms only below 0.0093 req/s: no rung above 0.05
    ((g0, s0),) = counted_rates(runner, [group], [0.2], never, 0.05, "t", floor_counts=False)
    assert g0 == 0.0 and s0 == []


def test_the_documented_example():
    from sim.studies.sweep import mean_ci

    # README "How a goodput is measured" and sim/studies/sweep.py: +1%, +4%, +12% -> lower end -8.5%
    assert _hand_lower_end([0.01, 0.04, 0.12]) == pytest.approx(-0.0846, abs=5e-5)
    assert mean_ci([0.01, 0.04, 0.12])[1] == pytest.approx(_hand_lower_end([0.01, 0.04, 0.12]))


def test_a_thin_refusal_shows_the_margin_its_verdict_read():
    """plan.csv's margin has its verdict's sign (issue 39: failing candidates showed positive margins): a
    candidate meeting the SLOs on every seed but refused by the interval shows the interval's lower end,
    below zero, and keeps the seeds' mean beside it."""
    from sim.studies.plan import at_rate_row

    runs = [evaluate(_table(seed, 33.0)) for seed in (1, 2, 3)]
    slo = SustainedSLO(ttft_ms=33.0, tpot_ms=1e6)
    margins = [slo.margin(r) for r in runs]
    row = at_rate_row(runs, slo)
    assert row["seeds_meeting"] == 3 and not row["meets_slo"] and row["refused_thin_margin"]
    assert row["margin"] == pytest.approx(_hand_lower_end(margins)) and row["margin"] < 0
    assert row["margin_ci_lo"] == row["margin"] and row["margin_seed_mean"] == pytest.approx(sum(margins) / 3)
    wide = SustainedSLO(ttft_ms=60.0, tpot_ms=1e6)
    ok = at_rate_row(runs, wide)
    assert ok["meets_slo"] and ok["margin"] == pytest.approx(sum(wide.margin(r) for r in runs) / 3)
    assert ok["margin"] > 0 and not ok["refused_thin_margin"]


def _seeded_clients():
    """Closed loop: P90 TTFT = 45 ms x clients x f(seed) (f = 1, 1.08, 0.95), TPOT 10 ms."""
    f = {1: 1.0, 2: 1.08, 3: 0.95}

    def ev(table):
        m, n = table["workload"]["concurrency"], table["workload"]["num_requests"]
        ttft = 45.0 * m * f[table["seed"]]
        return {"status": "ok", "num_requests": n, "num_finished": n, "p90_ttft_ms": ttft, "p90_tpot_ms": 10.0,
                "late_p90_ttft_ms": ttft, "late_p90_tpot_ms": 10.0, "saturated": False, "duration_s": 10.0}

    return ev


def test_goodput_in_clients_steps_down_until_every_seed_holds_by_hand():
    """Issue 41: `ppsim plan --concurrency N`'s goodput_clients counts by the rule the rate's goodput does."""
    from sim.studies.concurrency_plan import clients_above

    slo = SustainedSLO(ttft_ms=1000.0, tpot_ms=50.0)
    tab = lambda seed: {"seed": seed, "workload": {"concurrency": 4, "num_requests": 240}}  # noqa: E731
    runner = Runner(None, progress=False, evaluate_fn=_seeded_clients())
    # the first seed alone (meets 1,000 ms up to 22 clients): 4, 8, 16 pass, 32 fails; bisection sqrt(16 x 32)
    # -> 23 fails, sqrt(16 x 23) -> 19 passes, sqrt(19 x 23) -> 21 passes; 23 / 21 < 1.1: 21 clients
    ((old, _, _),) = clients_above(runner, [tab(1)], 4, slo)
    assert old == 21
    # with the other seeds: at 21 seed 2 fails (45 x 21 x 1.08 = 1,020.6 ms); floor(21 / 1.1) = 19: every seed
    # passes, but the margins 1 - 0.855 f have a lower end below zero; floor(19 / 1.1) = 17 counts
    ((new, at, flag),) = clients_above(runner, [tab(1)], 4, slo, seed_tables=[[tab(2), tab(3)]])
    assert 45.0 * 21 * 1.08 > 1000.0
    assert _hand_lower_end([1 - 0.045 * 19 * f for f in (1.0, 1.08, 0.95)]) < 0
    assert _hand_lower_end([1 - 0.045 * 17 * f for f in (1.0, 1.08, 0.95)]) >= 0
    assert new == 17 and at["p90_ttft_ms"] == pytest.approx(45.0 * 17) and flag == ""  # the first seed's run
    # never below N, which counts: seed 1 holds 250 ms up to 5 clients, where the interval reaches below zero
    tight = SustainedSLO(ttft_ms=250.0, tpot_ms=50.0)
    assert _hand_lower_end([1 - 45.0 * 5 * f / 250.0 for f in (1.0, 1.08, 0.95)]) < 0
    ((g, at4, _),) = clients_above(runner, [tab(1)], 4, tight, seed_tables=[[tab(2), tab(3)]])
    assert g == 4 and at4["p90_ttft_ms"] == pytest.approx(180.0)
