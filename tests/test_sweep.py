"""Sweep runner and goodput search: bisection, bracketing, resume, parallel executors."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.sweep import Runner, Search, goodput_searches, mean_ci, meets_slo, point_id

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


def test_process_pool_matches_in_process(tmp_path):
    tables = [small_table(r) for r in (1.0, 2.0, 3.0)]
    serial = Runner(None, jobs=1, progress=False).run(tables)
    parallel = Runner(tmp_path / "c.jsonl", jobs=2, progress=False).run(tables)
    assert serial == parallel


def test_ray_executor_on_a_local_instance(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install '.[ray]')")
    tables = [small_table(r) for r in (1.0, 2.0)]
    try:
        out = Runner(tmp_path / "r.jsonl", jobs=2, executor="ray", progress=False).run(tables)
    finally:
        ray.shutdown()
    assert out == Runner(None, progress=False).run(tables)


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
    from sim.config import config_from_table
    from sim.engine.run import run
    from sim.metrics import summarize

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


def test_goodput_is_the_same_with_early_stopping():
    tables = []
    for stop in (False, True):
        t = small_table(1.0)
        t["workload"]["num_requests"] = 60
        t["slo"] = {"ttft_ms": 300.0, "tpot_ms": 40.0, "stop_when_violated": stop}
        tables.append(t)
    results = [goodput_searches(Runner(None, progress=False), [Search({}, t, list(range(1, 9)), 300.0, 40.0)],
                                tol=0.1)[0]["goodput_rps"] for t in tables]
    assert results[0] == results[1]


def test_grid_only_search_is_the_highest_rate_below_the_first_failure():
    """tol = inf and no extension: what profiles/calibrate_tp.py uses on its fine rate grid."""
    rates = [round(2.0 + 0.1 * i, 1) for i in range(31)]
    for threshold, expected in ((3.47, 3.4), (1.0, 0.0), (9.0, 5.0)):
        runner = Runner(None, progress=False, evaluate_fn=fake_eval(threshold))
        (res,) = goodput_searches(runner, [Search({}, {"workload": {}}, rates)], tol=math.inf, max_rate=max(rates))
        assert res["goodput_rps"] == expected
        assert len(runner.cache) == len(rates)  # no bisection, no extension
