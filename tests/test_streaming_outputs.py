"""Compact run state (issue 14): requests are made when they arrive and leave the engine when
they finish, the per-iteration columns can be spilled to files, and the summary computed
column by column gives the numbers the frames gave."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.engine import requests as requests_mod
from sim.engine.requests import ItlCounts, ItlPool
from sim.engine.run import run
from sim.outputs.metrics import requests_frame, summarize

from conftest import make_config

WL = {"kind": "poisson", "rate_rps": 20.0, "num_requests": 120,
      "lengths": {"source": "pairs", "prompt_tokens": [200, 50, 400, 120], "output_tokens": [20, 40, 10, 30]}}
CASES = {
    "one replica": {},
    "two replicas": {"parallel": {"pp": 2, "tp": 1, "replicas": 2, "router": "least-loaded"}},
    "horizon": {"horizon_s": 3.0},
    "stopped": {"slo": {"ttft_ms": 30, "tpot_ms": 5, "stop_when_violated": True}},
}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])), k


@pytest.mark.parametrize("case", CASES)
def test_spilled_iterations_give_the_same_summary(case):
    cfg = make_config(workload=WL, **CASES[case])
    full, spilled = run(cfg), run(cfg, keep_iterations=False)
    _same(summarize(full), summarize(spilled))
    assert requests_frame(full).equals(requests_frame(spilled))


def test_finished_requests_leave_the_engine(monkeypatch):
    live = []
    finish = requests_mod.RequestTable.finish

    def watch(table, req):
        live.append(len(table.live))
        finish(table, req)

    monkeypatch.setattr(requests_mod.RequestTable, "finish", watch)
    res = run(make_config(workload=dict(WL, num_requests=400)))
    assert res.status == "ok" and len(live) == 400
    assert max(live) < 40  # at most the requests in the server, not every request so far
    assert res.requests.live == {}


def test_itl_counts_percentiles_are_numpys():
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.choice(rng.random(int(rng.integers(1, 50))) * 100, int(rng.integers(1, 2000)))
        counts = ItlCounts(*np.unique(x, return_counts=True))
        for q in (0, 50, 90, 95, 99, 100, 12.5):
            assert counts.percentile(q) == float(np.percentile(x, q))
        assert counts.max() == x.max()
        assert counts.mean() == pytest.approx(x.mean(), rel=1e-12)
        assert counts.std() == pytest.approx(x.std(), rel=1e-9, abs=1e-12)


def test_itl_pool_past_its_exact_limit_keeps_the_percentiles(monkeypatch):
    cfg = make_config(workload=WL)
    exact = summarize(run(cfg))
    monkeypatch.setattr(ItlPool, "EXACT_LIMIT", 100)
    monkeypatch.setattr(ItlPool, "MERGE_MIN", 50)
    res = run(cfg)
    assert not res.requests.itls.exact
    counted = summarize(res)
    for k, v in exact.items():
        if "itl" in k and ("mean" in k or "std" in k):
            assert counted[k] == pytest.approx(v, rel=1e-12)
        else:
            assert counted[k] == v or (isinstance(v, float) and math.isnan(v) and math.isnan(counted[k])), k


def test_itl_pool_writes_each_rows_largest_gap_across_its_modes(monkeypatch):
    """The pool writes each added row's largest gap (the builtin max of what it was handed) in
    blocks: in exact mode, when it turns to counts, at each merge, and on `write_max`."""
    from array import array

    monkeypatch.setattr(ItlPool, "EXACT_LIMIT", 300)
    monkeypatch.setattr(ItlPool, "MERGE_MIN", 120)
    rng = np.random.default_rng(7)
    n = 60
    out = array("d", [math.nan]) * n
    pool = ItlPool(n, out)
    expected = {}
    for row in rng.permutation(n).tolist():
        gaps = array("d", (rng.random(int(rng.integers(0, 40))) * 0.05).tolist())
        pool.add(row, gaps)
        if len(gaps):
            expected[row] = max(gaps)
        if row % 17 == 0:
            pool.write_max()  # (the table's close() may come at any point)
    pool.write_max()
    assert not pool.exact
    for row in range(n):
        if row in expected:
            assert out[row] == expected[row], row
        else:
            assert math.isnan(out[row]), row
