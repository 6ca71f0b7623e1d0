"""Sweep runner and goodput search: bisection, bracketing, resume, parallel executors."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.studies.sweep import Runner, Search, evaluate, goodput_searches, mean_ci, meets_slo, point_id

from conftest import make_config


def fake_eval(threshold):
    """A monotone fake run: P90 TTFT grows with the rate and crosses 2000 ms at `threshold`."""

    def evaluate(table):
        rate = table["workload"]["rate_rps"]
        return {"status": "ok", "num_requests": 10, "num_finished": 10,
                "p90_ttft_ms": 2000.0 * rate / threshold, "p90_tpot_ms": 100.0}

    return evaluate


@settings(max_examples=40, deadline=None)
@given(st.floats(0.3, 14.0))
def test_bisection_finds_the_threshold_to_tolerance(threshold):
    runner = Runner(None, jobs=1, progress=False, evaluate_fn=fake_eval(threshold))
    s = Search({"k": 1}, {"workload": {}}, list(range(1, 11)))
    (res,) = goodput_searches(runner, [s], tol=0.05)
    assert threshold - 0.05 - 1e-9 <= res["goodput_rps"] <= threshold + 1e-9
    # above the sweep's range the search extends instead of capping the goodput
    assert res["flag"] == ("extended beyond the sweep range" if threshold >= 10 else "")


def test_goodput_above_the_cap_is_flagged():
    runner = Runner(None, progress=False, evaluate_fn=fake_eval(500.0))
    (res,) = goodput_searches(runner, [Search({}, {"workload": {}}, [1, 2, 3])], tol=0.05, max_rate=20)
    assert res["goodput_rps"] == 20 and "not_bracketed" in res["flag"]


def test_non_monotone_outcome_is_flagged():
    def evaluate(table):
        rate = table["workload"]["rate_rps"]
        ok = rate <= 3 or rate == 6
        return {"status": "ok", "num_requests": 1, "num_finished": 1, "p90_ttft_ms": 10 if ok else 5000,
                "p90_tpot_ms": 1}

    runner = Runner(None, progress=False, evaluate_fn=evaluate)
    (res,) = goodput_searches(runner, [Search({}, {"workload": {}}, list(range(1, 9)))], tol=0.05)
    assert 3 <= res["goodput_rps"] < 4 and res["flag"] == "non_monotone"


def test_failed_runs_do_not_meet_the_slo():
    assert not meets_slo({"status": "failed", "num_requests": 1, "num_finished": 1, "p90_ttft_ms": 1, "p90_tpot_ms": 1}, 2000, 200)
    assert not meets_slo({"status": "ok", "num_requests": 2, "num_finished": 1, "p90_ttft_ms": 1, "p90_tpot_ms": 1}, 2000, 200)
    assert meets_slo({"status": "ok", "num_requests": 1, "num_finished": 1, "p90_ttft_ms": 1, "p90_tpot_ms": None}, 2000, 200)


class Interrupted(Exception):
    pass


def test_results_are_written_as_they_complete_and_a_sweep_resumes(tmp_path):
    cache = tmp_path / "points.jsonl"
    calls = []
    interrupt = [True]

    def evaluate(table):
        calls.append(table["workload"]["rate_rps"])
        if table["workload"]["rate_rps"] == 3 and interrupt[0]:
            raise Interrupted  # interrupted half-way
        return {"status": "ok", "rate": table["workload"]["rate_rps"]}

    tables = [{"workload": {"rate_rps": r}} for r in (1, 2, 3, 4)]
    with pytest.raises(Interrupted):
        Runner(cache, progress=False, evaluate_fn=evaluate).run(tables)
    lines = [json.loads(x) for x in cache.read_text().splitlines()]
    assert [x["summary"]["rate"] for x in lines] == [1, 2]
    calls.clear()
    interrupt[0] = False
    out = Runner(cache, progress=False, evaluate_fn=evaluate).run(tables)
    assert calls == [3, 4]  # the finished points were not simulated again
    assert [o["rate"] for o in out] == [1, 2, 3, 4]
    assert len(set(point_id(t) for t in tables)) == 4


def small_table(rate):
    cfg = make_config()
    return {"parallel": {"pp": 2, "tp": 1}, "scheduler": {"chunk_size_tokens": 256, "kv_tokens": 50_000},
            "latency": {"kind": "constant", "stage_ms": 10.0},
            "workload": {"kind": "synthetic-uniform", "rate_rps": rate, "num_requests": 20,
                         "input_range": [10, 600], "output_range": [2, 30]}} if cfg else None


def with_siblings(tables):
    """`tables` plus, for the first one, two siblings at other SLOs (one lock-step run)."""
    out = list(tables)
    for ttft in (500.0, 100.0):
        t = copy.deepcopy(tables[0])
        t["slo"] = {"ttft_ms": ttft, "tpot_ms": 50.0, "stop_when_violated": True}
        out.append(t)
    return out


def test_process_pool_matches_in_process(tmp_path):
    tables = with_siblings([small_table(r) for r in (1.0, 2.0, 3.0)])
    serial = Runner(None, jobs=1, progress=False).run(tables)
    parallel = Runner(tmp_path / "c.jsonl", jobs=2, progress=False).run(tables)
    assert serial == parallel == [evaluate(t) for t in tables]


def test_ray_executor_on_a_local_instance(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install '.[ray]')")
    tables = with_siblings([small_table(r) for r in (1.0, 2.0)])
    try:
        out = Runner(tmp_path / "r.jsonl", jobs=2, executor="ray", progress=False).run(tables)
    finally:
        ray.shutdown()
    assert out == Runner(None, progress=False).run(tables) == [evaluate(t) for t in tables]


def test_mean_ci():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and lo < 2.0 < hi
    assert mean_ci([5.0]) == (5.0, 5.0, 5.0)
    assert all(math.isnan(x) for x in mean_ci([]))


@pytest.mark.parametrize("threshold", [0.5, 3.3, 7.0, 12.5])
def test_lazy_sweep_finds_the_same_goodput_with_fewer_runs(threshold):
    full_runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
    lazy_runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
    (full,) = goodput_searches(full_runner, [Search({}, {"workload": {}}, list(range(1, 11)))], tol=0.05)
    (lazy,) = goodput_searches(lazy_runner, [Search({}, {"workload": {}}, list(range(1, 11)))], tol=0.05,
                               full_sweep=False)
    assert full["goodput_rps"] == lazy["goodput_rps"]
    assert len(lazy_runner.cache) <= len(full_runner.cache)


def test_stop_when_violated_ends_overloaded_runs_early_without_changing_the_verdict():
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import summarize

    base = small_table(200.0)
    base["workload"]["num_requests"] = 300
    base["slo"] = {"ttft_ms": 200.0, "tpot_ms": 30.0}
    full = summarize(run(config_from_table(base)))
    base["slo"]["stop_when_violated"] = True
    res = run(config_from_table(base))
    early = summarize(res)
    assert not full["meets_p90_slo"] and not early["meets_p90_slo"]
    assert res.status == "stopped" and "certain to exceed" in res.reason
    assert early["num_iterations"] < full["num_iterations"]
    # a passing point is not stopped
    ok = small_table(1.0)
    ok["slo"] = {"ttft_ms": 2000.0, "tpot_ms": 200.0, "stop_when_violated": True}
    assert run(config_from_table(ok)).status == "ok"


def test_a_sweep_run_keeps_no_gaps_and_returns_the_same_summary():
    """Sweeps run without inter-token gaps (`run(itls=False)`): what a sweep keeps (`_plain`)
    is the same, value for value; only the `*_itl_ms` names and max_itl_ms are left out."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import requests_frame, summarize
    from sim.studies.sweep import _plain

    t = small_table(4.0)
    t["slo"] = {"ttft_ms": 2000.0, "tpot_ms": 200.0, "ttft_percentile": 95.0}
    with_gaps, without = run(config_from_table(t)), run(config_from_table(t), itls=False)
    full, lean = summarize(with_gaps), summarize(without)
    assert {k for k in full if k not in lean} == {k for k in full if "_itl_" in k} != set()
    assert all(lean[k] == full[k] or (lean[k] != lean[k] and full[k] != full[k]) for k in lean)
    assert json.dumps(_plain(lean), sort_keys=True) == json.dumps(_plain(full), sort_keys=True)
    assert "p95_ttft_ms" in _plain(lean) and evaluate(t) == _plain(full)
    assert requests_frame(with_gaps)["max_itl_ms"].notna().any()
    assert requests_frame(without)["max_itl_ms"].isna().all()
    assert len(without.requests.itls.values) == 0


# the table's rate_rps sets the searches' window (60 requests over 7.5 s or 60 s), which the extension past
# the sweep holds at every rate: both windows stop some runs and end others "met" early
@pytest.mark.parametrize("window_rate", [8.0, pytest.param(1.0, marks=pytest.mark.slow)])
def test_goodput_is_the_same_with_early_stopping(window_rate):
    tables = []
    for stop, met in ((False, False), (True, False), (True, True)):
        t = small_table(window_rate)
        t["workload"]["num_requests"] = 60
        t["slo"] = {"ttft_ms": 300.0, "tpot_ms": 40.0, "stop_when_violated": stop, "stop_when_met": met}
        tables.append(t)
    runners = [Runner(None, progress=False) for _ in tables]
    results = [goodput_searches(r, [Search({}, t, list(range(1, 9)), 300.0, 40.0)], tol=0.1)[0]["goodput_rps"]
               for r, t in zip(runners, tables)]
    assert results[0] == results[1] == results[2]
    assert "met" in {s["status"] for s in runners[2].cache.values()}
    assert "stopped" in {s["status"] for s in runners[1].cache.values()}


@pytest.mark.parametrize("rate", [1.0, 3.0, 5.0, 7.0, 9.0, 12.0])
@pytest.mark.parametrize("slo", [(2000.0, 200.0), (400.0, 40.0), (250.0, 25.0)])
def test_stopping_once_the_verdict_is_certain_never_changes_it(rate, slo):
    """Across loads from idle to overload (where early arrivals are served well and late ones
    are not, the late-arrival check's case), a run with both early stops gives the full run's
    verdict, and stops "met" only where the full run passes."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import summarize

    t = small_table(rate)
    t["workload"].update(num_requests=150, output_range=[2, 120])
    t["slo"] = {"ttft_ms": slo[0], "tpot_ms": slo[1]}
    full = summarize(run(config_from_table(t)))
    t["slo"].update(stop_when_violated=True, stop_when_met=True)
    early = summarize(run(config_from_table(t)))
    assert early["meets_slo"] == full["meets_slo"], (early["status"], early["reason"])
    assert early["status"] != "met" or full["meets_slo"]


def test_a_run_certain_to_meet_its_slo_stops_with_the_full_runs_verdict():
    """`stop_when_met`: a passing run ends (status "met") once the SLO's every percentile, over
    all requests and over the late arrivals, is certain, after the last arrival; its verdict is
    the full run's. A failing run is unchanged, and it never stands for a sibling at another SLO
    (tests/test_slo.py: the arrival and KV pool conditions)."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import summarize
    from sim.core.slo import SLO
    from sim.studies.sweep import _sibling_groups

    t = small_table(2.0)
    t["workload"].update(num_requests=300, output_range=[2, 200])
    t["slo"] = {"ttft_ms": 2000.0, "tpot_ms": 200.0}
    full = summarize(run(config_from_table(t)))
    assert full["meets_slo"]
    t["slo"].update(stop_when_violated=True, stop_when_met=True)
    res = run(config_from_table(t))
    met = summarize(res)
    assert res.status == "met" and "certain to meet" in res.reason and met["meets_slo"]
    assert SLO().meets(met) and met["num_finished"] < met["num_requests"] == 300
    assert met["num_iterations"] < full["num_iterations"]
    assert res.end_s >= float(res.requests.arrival_s.max())  # never before the last arrival
    t["slo"].update(ttft_ms=20.0, tpot_ms=2.0)  # a miss: stopped as before
    assert run(config_from_table(t)).status == "stopped"
    a, b = copy.deepcopy(t), copy.deepcopy(t)
    b["slo"]["ttft_ms"] = 1000.0
    assert sorted(map(len, _sibling_groups({"a": a, "b": b}))) == [1, 1]
    with pytest.raises(Exception, match="lock step"):
        run(config_from_table(a), alt_slos=(config_from_table(b).slo,))


def test_grid_only_search_is_the_highest_rate_below_the_first_failure():
    """tol = inf and no extension: what profiles/calibrate_tp.py uses on its fine rate grid."""
    rates = [round(2.0 + 0.1 * i, 1) for i in range(31)]
    for threshold, expected in ((3.47, 3.4), (1.0, 0.0), (9.0, 5.0)):
        runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
        (res,) = goodput_searches(runner, [Search({}, {"workload": {}}, rates)], tol=math.inf, max_rate=max(rates))
        assert res["goodput_rps"] == expected
        assert len(runner.cache) == len(rates)  # no bisection, no extension


# -- sustainable goodput (fidelity issue): a burst the server absorbs is not a goodput -------------------------

def test_with_rate_holds_the_arrival_window():
    from sim.studies.sweep import with_rate

    t = {"workload": {"name": "x", "num_requests": 400}}
    assert with_rate(t, 5.0, 40.0)["workload"]["num_requests"] == 400       # 5 x 40 s = 200 < 400
    assert with_rate(t, 16.0, 40.0)["workload"]["num_requests"] == 640      # 16 x 40 s
    assert with_rate(t, 16.0)["workload"]["num_requests"] == 400            # no window: unchanged
    s = Search({}, t, list(range(1, 11)))
    assert s.window_s == pytest.approx(40.0)                                # 400 requests / 10 req/s
    assert s.at(10.0)["workload"]["num_requests"] == 400
    assert s.at(12.5)["workload"]["num_requests"] == 500


def absorbing_server(capacity_rps: float):
    """A fluid server of `capacity_rps`: above it the queue grows linearly, so a request arriving at
    t waits (rate - capacity) t / capacity on top of 0.5 s; P90 TTFT is that of the 90th-percentile
    arrival. It passes a short burst above its capacity and fails the same rate held longer."""

    def evaluate(table):
        wl = table["workload"]
        rate, n = wl["rate_rps"], wl["num_requests"]
        span = n / rate
        grow = max(0.0, rate - capacity_rps) / capacity_rps

        def ttft_ms(q):  # the arrival at quantile q of the window
            return (0.5 + grow * q * span) * 1e3

        return {"status": "ok", "num_requests": n, "num_finished": n, "p90_ttft_ms": ttft_ms(0.9),
                "p90_tpot_ms": 100.0, "late_p90_ttft_ms": ttft_ms(0.975), "late_p90_tpot_ms": 100.0}

    return evaluate


def test_a_rate_that_passes_1000_requests_but_fails_4000_is_not_a_goodput():
    ev = absorbing_server(27.0)
    one_k = ev({"workload": {"rate_rps": 28.0, "num_requests": 1000}})
    four_k = ev({"workload": {"rate_rps": 28.0, "num_requests": 4000}})
    assert meets_slo(one_k, 2000, 200) and not meets_slo(four_k, 2000, 200)
    # the artifact's sweep: 1000 requests at 1..7 req/s, i.e. a window of at least 1000 / 7 = 143 s
    s = Search({}, {"workload": {"num_requests": 1000}}, list(range(1, 8)))
    (res,) = goodput_searches(Runner(None, progress=False, evaluate_fn=ev), [s], tol=0.05)
    assert res["goodput_rps"] < 28.0
    assert 27.0 <= res["goodput_rps"] < 27.5  # the capacity, found with the window held
    # without the window rule the burst would have been reported as a goodput above 28
    s_old = Search({}, {"workload": {"num_requests": 1000}}, list(range(1, 8)), min_window_s=0.0)
    (old,) = goodput_searches(Runner(None, progress=False, evaluate_fn=ev), [s_old], tol=0.05)
    assert old["goodput_rps"] > 28.0


def test_late_arrivals_must_meet_the_slo_too():
    base = {"status": "ok", "num_requests": 100, "num_finished": 100, "p90_ttft_ms": 1500.0, "p90_tpot_ms": 150.0}
    assert meets_slo(base, 2000, 200)  # no late figures (one request): the overall P90s decide
    assert meets_slo({**base, "late_p90_ttft_ms": 1900.0, "late_p90_tpot_ms": 190.0}, 2000, 200)
    assert not meets_slo({**base, "late_p90_ttft_ms": 2100.0, "late_p90_tpot_ms": 150.0}, 2000, 200)
    assert not meets_slo({**base, "late_p90_ttft_ms": 1000.0, "late_p90_tpot_ms": 201.0}, 2000, 200)


def test_late_window_hand_calculation():
    import pandas as pd

    from sim.outputs.metrics import late_arrivals

    df = pd.DataFrame({"arrival_s": [0.0, 10.0, 70.0, 75.0, 76.0, 100.0]})
    # window [0, 100]: the last quarter starts at 75 s
    assert late_arrivals(df)["arrival_s"].tolist() == [75.0, 76.0, 100.0]
    assert late_arrivals(df.iloc[:1]).empty


def test_full_and_climbing_searches_share_batches():
    """A search with its own `full_sweep` runs every rate; a climbing one stops at its first
    failure; both end at the same goodput (monotone outcome)."""
    runner = Runner(None, progress=False, evaluate_fn=fake_eval(3.3))
    full = Search({"k": "full"}, {"workload": {"seed_tag": 1}}, list(range(1, 11)), full_sweep=True)
    climb = Search({"k": "climb"}, {"workload": {"seed_tag": 2}}, list(range(1, 11)), full_sweep=False)
    a, b = goodput_searches(runner, [full, climb], tol=0.05)
    assert a["goodput_rps"] == b["goodput_rps"]
    assert set(range(1, 11)) <= set(full.results)
    assert max(r for r in climb.results if r == int(r)) == 4  # climbed 1, 2, 3, 4 and stopped


def test_studies_share_runs_that_do_not_read_the_slo(tmp_path):
    """fig12-style study: static schemes at every scale, and every scheme at scale 1.0, run the
    goodput figures' own configs (no early stop) at the sweep's rates; the dynamic schemes below
    scale 1.0 stop early at every rate, with their own scaled SLO in the table, and every other
    run is a probe that stops early (off the sweep, or a hinted climb's rate)."""
    from experiments.common import Context, goodput_study

    def study(**kwargs) -> list[dict]:
        """The tables a study simulates (on a fake, monotone outcome)."""
        seen = []

        def evaluate(table):
            seen.append(table)
            return fake_eval(2.5)(table)

        ctx = Context(tmp_path, quick=True, progress=False, seeds=(1, 2))
        ctx._runner = Runner(None, progress=False, evaluate_fn=evaluate)
        goodput_study(ctx, ["qwen2.5-32b"], ["azure-conv"], ["TP", "DCP_pred"], **kwargs)
        return seen

    seen = study(slo_scales=(1.0, 0.5), full_sweep=False, extend=False, stop_early=True)
    figs = study(full_sweep="first-seed")
    fig_ids = {point_id(t) for t in figs}
    for t in seen:
        dynamic = t["scheduler"]["chunk_policy"]["name"] != "static"
        stop = t["slo"].get("stop_when_violated", False)
        on_sweep = t["workload"]["rate_rps"] in (1, 3, 5, 7, 9)  # the quick sweep's rates
        if not stop:  # a full run: one of the goodput figures' own, at a rate of the sweep
            assert t["slo"]["ttft_ms"] == 2000.0 and on_sweep and point_id(t) in fig_ids
        elif t["slo"]["ttft_ms"] == 2000.0:  # scale 1.0: a probe off the sweep, or the 2nd seed's climb
            assert not on_sweep or t["seed"] != 1
        else:
            assert t["slo"]["ttft_ms"] == 1000.0
        if dynamic and t["slo"]["ttft_ms"] != 2000.0:
            assert stop  # nobody shares a dynamic scheme's run at a tighter scale
    # every sweep rate of the first seed at scale 1.0 is the full, shared run
    assert {t["workload"]["rate_rps"] for t in seen if t["seed"] == 1 and not t["slo"].get("stop_when_violated")} \
        >= {1.0, 3.0}
    # the per-rate study: the first seed runs every integer rate, the second stops climbing
    rates = {s: {t["workload"]["rate_rps"] for t in figs if t["seed"] == s and t["parallel"]["tp"] == 4}
             for s in (1, 2)}
    assert {1.0, 3.0, 5.0, 7.0, 9.0} <= rates[1] and 9.0 not in rates[2]
    # ... and gallops from the first seed's goodput (2.5; the quick grid is 0.25 req/s): 2.5 passes,
    # 2.5 + 0.4 on the grid (3.0) fails, bisection takes 2.75; no rate below the hint
    assert rates[2] == {2.5, 2.75, 3.0}


@pytest.mark.parametrize("threshold", [0.5, 1.0, 3.3, 7.0, 9.9, 10.0, 12.5, 70.0])
@pytest.mark.parametrize("hint", [None, 0.0, 0.2, 1.0, 4.43, 4.5, 7.0, 10.0, 12.45, 30.0])
def test_a_hinted_search_finds_the_same_goodput_from_anywhere(threshold, hint):
    """Wherever a search starts, a monotone outcome gives the full sweep's goodput and flag (the
    rates 1-10, extended up to 64 req/s); from a hint within one step (0.4 req/s) of the goodput
    a galloping search takes at most 5 runs, none farther than that step from the hint."""
    full_runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
    (full,) = goodput_searches(full_runner, [Search({}, {"workload": {}}, list(range(1, 11)))], tol=0.05)
    runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
    s = Search({}, {"workload": {}}, list(range(1, 11)), full_sweep=False, hint_rps=hint)
    (res,) = goodput_searches(runner, [s], tol=0.05)
    assert res == full
    if hint is not None and 1 <= hint and abs(hint - threshold) < 0.4:
        assert len(s.results) <= 5 and all(abs(r - hint) <= 0.4 + 1e-9 for r in s.results), sorted(s.results)
    if hint is not None:  # every galloped rate is on the 0.05 grid (bisection then splits whole cells)
        assert all(abs(r * 20 - round(r * 20)) < 1e-9 for r in s.results if r >= 1)


def test_a_gallop_doubles_its_steps_from_the_hint():
    """Hand count: hint 3.0, goodput 5.0 (fake verdict: rate <= 5 passes). Up: 3.0, 3.4 (+0.4),
    4.2 (+0.8), 5.8 (+1.6) fails; bracket (4.2, 5.8) is 32 cells, split at 16, 8, 4, 2, 1 cells:
    5.0, 5.4, 5.2, 5.1, 5.05. Down from hint 7.0 (goodput 5.0): 7.0, 6.6, 5.8 fail, 4.2 passes."""
    s = Search({}, {"workload": {}}, list(range(1, 11)), full_sweep=False, hint_rps=3.0)
    (res,) = goodput_searches(Runner(None, progress=False, evaluate_fn=fake_eval(5.0)), [s], tol=0.05)
    assert list(s.results) == [3.0, 3.4, 4.2, 5.8, 5.0, 5.4, 5.2, 5.1, 5.05]
    assert res["goodput_rps"] == 5.0
    s = Search({}, {"workload": {}}, list(range(1, 11)), full_sweep=False, hint_rps=7.0)
    goodput_searches(Runner(None, progress=False, evaluate_fn=fake_eval(5.0)), [s], tol=0.05)
    assert list(s.results)[:4] == [7.0, 6.6, 5.8, 4.2]
    # capped at max_rate: a search passing there is not bracketed, a lower bound
    s = Search({}, {"workload": {}}, list(range(1, 11)), full_sweep=False, hint_rps=9.9)
    (res,) = goodput_searches(Runner(None, progress=False, evaluate_fn=fake_eval(50.0)), [s], tol=0.05,
                              max_rate=11.0)
    assert list(s.results) == [9.9, 10.3, 11.0] and res["goodput_rps"] == 11.0
    assert res["flag"].startswith("not_bracketed")


def test_other_seeds_start_from_their_pilots_ratio(tmp_path):
    """goodput_study's last phase: the first two schemes of the second seed (the pilots) start at
    the first seed's goodput; the third at its first-seed goodput times the pilots' mean ratio of
    found to first-seed goodput. Here seed 2 raises every scheme's goodput by 1.5x, so the third
    scheme's first run is at its own goodput (4.0 x 1.5 = 6.0)."""
    from experiments.common import PILOTS, Context, goodput_study

    assert PILOTS == 2
    first = {"TP": 2.0, "PP_2048": 3.0, "DCP_pred": 4.0}
    seen = []

    def evaluate(table):
        scheme = ("DCP_pred" if table["scheduler"]["chunk_policy"]["name"] == "predictive"
                  else "TP" if table["parallel"]["tp"] == 4 else "PP_2048")
        seen.append((scheme, table["seed"], table["workload"]["rate_rps"]))
        return fake_eval(first[scheme] * (1.5 if table["seed"] == 2 else 1.0))(table)

    ctx = Context(tmp_path, quick=False, progress=False, seeds=(1, 2))
    ctx._runner = Runner(None, progress=False, evaluate_fn=evaluate)
    _, good = goodput_study(ctx, ["qwen2.5-32b"], ["azure-conv"], ["TP", "PP_2048", "DCP_pred"],
                            full_sweep="first-seed")
    assert {(r.scheme, r.seed): r.goodput_rps for r in good.itertuples()} == {
        ("TP", 1): 2.0, ("PP_2048", 1): 3.0, ("DCP_pred", 1): 4.0, ("TP", 2): 3.0, ("PP_2048", 2): 4.5,
        ("DCP_pred", 2): 6.0}
    runs = {k: [r for sch, sd, r in seen if (sch, sd) == k] for k in [("TP", 2), ("PP_2048", 2), ("DCP_pred", 2)]}
    assert runs[("TP", 2)][0] == 2.0 and runs[("PP_2048", 2)][0] == 3.0  # pilots: from seed 1's goodput
    assert runs[("DCP_pred", 2)][0] == 6.0 and len(runs[("DCP_pred", 2)]) == 5  # 6.0, 6.4, then 3 splits
    # the pilots ran before the third scheme's first run
    order = [k for k in seen if k[1] == 2]
    assert order.index(("DCP_pred", 2, 6.0)) > max(i for i, k in enumerate(order) if k[0] != "DCP_pred")


def test_off_sweep_probes_use_the_cheaper_table_unless_the_shared_one_is_cached():
    runner = Runner(None, progress=False, evaluate_fn=fake_eval(2.5))
    table = {"workload": {"num_requests": 10}}
    probe = {"workload": {"num_requests": 10}, "slo": {"stop_when_violated": True}}
    s = Search({}, table, [1, 2, 3], probe_table=probe)
    assert "slo" not in s.at(2) and s.at(2.5)["slo"]["stop_when_violated"]
    runner.run([dict(table, workload={"num_requests": 10, "rate_rps": 2.5})])
    assert "slo" not in s.at(2.5, runner.has)  # the shared run at 2.5 is cached: use it
    (res,) = goodput_searches(Runner(None, progress=False, evaluate_fn=fake_eval(2.5)), [s], tol=0.05)
    assert 2.45 <= res["goodput_rps"] <= 2.5


@pytest.mark.parametrize("threshold", [0.01, 0.03, 0.031, 0.05, 0.2, 0.4999, 0.77, 0.99])
def test_a_search_failing_at_its_lowest_rate_probes_the_floor_first(threshold):
    """Bracket (0, 1): the lowest bisection probe runs first; the goodput is plain bisection's
    (written out here: 20 cells of 0.05 split at cell boundaries, then halving once the 10% rule
    below 1 req/s makes the cells uneven), and with no goodput at all the search takes one run
    below the sweep instead of five."""
    def passes(rate):
        return 2000.0 * rate / threshold <= 2000.0  # fake_eval's verdict

    lo, hi = 0.0, 1.0
    while hi - lo > (res := (min(0.05, 0.1 * hi) if lo > 0 else 0.05)) + 1e-9:
        n = (hi - lo) / res
        mid = round(lo + res * (round(n) // 2), 6) if abs(n - round(n)) < 1e-6 else round((lo + hi) / 2, 6)
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
    s = Search({}, {"workload": {}}, list(range(1, 11)), full_sweep=False)
    (res,) = goodput_searches(runner, [s], tol=0.05)
    assert res["goodput_rps"] == round(lo, 4)
    below = sorted(r for r in s.results if r < 1)
    assert below[0] == 0.05  # 0.5, 0.25, 0.1, 0.05: the probes of a search failing everywhere
    if lo == 0:
        assert below == [0.05]


def test_an_integer_bracket_is_bisected_on_the_005_grid():
    """[3, 4] is 20 cells of 0.05 req/s: every probe is a multiple of 0.05, the search ends with a
    passing and a failing rate one cell apart, and over the 20 cells a goodput takes 4 probes in
    12 of them and 5 in 8 (4.4 on average; halving to 1/32 took 5 in every cell). Hand count:
    20 -> 10 + 10 -> 5 + 5 -> (2 + 3) each, and a 2- or 3-cell part takes 1 or 2 more probes."""
    counts = []
    for i in range(20):
        threshold = 3.0 + 0.05 * i + 0.025  # inside cell i
        s = Search({}, {"workload": {}}, list(range(1, 11)))
        (res,) = goodput_searches(Runner(None, progress=False, evaluate_fn=fake_eval(threshold)), [s], tol=0.05)
        probes = sorted(r for r in s.results if r not in s.rates)
        assert all(abs(r * 20 - round(r * 20)) < 1e-9 for r in probes), probes
        assert res["goodput_rps"] == round(3.0 + 0.05 * i, 4)
        counts.append(len(probes))
    assert sorted(counts) == [4] * 12 + [5] * 8


def _pid_eval(table):
    import os

    return {"pid": os.getpid(), "rate": table["workload"]["rate_rps"]}


def test_worker_processes_last_between_rounds_until_closed():
    """A search calls `run` once per round: the workers (and their per-process caches) stay."""
    runner = Runner(None, jobs=2, progress=False, evaluate_fn=_pid_eval)
    try:
        first = {r["pid"] for r in runner.run([{"workload": {"rate_rps": float(i)}} for i in range(6)])}
        again = {r["pid"] for r in runner.run([{"workload": {"rate_rps": float(i)}} for i in range(6, 12)])}
        assert len(first | again) <= 2  # the same (at most two) workers serve both rounds
        runner.close()
        fresh = {r["pid"] for r in runner.run([{"workload": {"rate_rps": float(i)}} for i in range(12, 16)])}
        assert not fresh & (first | again)
    finally:
        runner.close()
    assert runner._pool is None


def _failing_eval(table):
    raise ValueError("boom")


def test_a_failing_round_leaves_no_pool_behind():
    runner = Runner(None, jobs=2, progress=False, evaluate_fn=_failing_eval)
    with pytest.raises(ValueError, match="boom"):
        runner.run([{"workload": {"rate_rps": 1.0}}, {"workload": {"rate_rps": 2.0}}])
    assert runner._pool is None
