"""Multi-replica serving: a router in front of independent replicas."""

from __future__ import annotations

import pytest

from sim.engine.run import run
from sim.core.errors import ConfigError
from sim.outputs.metrics import iterations_frame, requests_frame, summarize

from conftest import make_config

WL = {"kind": "poisson", "rate_rps": 60.0, "num_requests": 40,
      "lengths": {"source": "pairs", "prompt_tokens": [200, 50, 400, 120], "output_tokens": [20, 40, 10, 30]}}


def test_round_robin_assigns_in_turn_and_everything_finishes():
    res = run(make_config(parallel={"pp": 2, "tp": 1, "replicas": 3, "router": "round-robin"}, workload=WL))
    df = requests_frame(res)
    assert (df["status"] == "finished").all()
    assert df.sort_values("req_id")["replica"].tolist() == [i % 3 for i in range(40)]
    it = iterations_frame(res)
    assert set(it["replica"]) == {0, 1, 2}
    # replicas are independent: each replica's own iterations never overlap in time
    for _, g in it.groupby("replica"):
        assert (g["start_s"].to_numpy()[1:] >= g["end_s"].to_numpy()[:-1] - 1e-12).all()


def test_least_loaded_balances_outstanding_requests():
    wl = dict(WL, lengths={"source": "pairs", "prompt_tokens": [2000, 10], "output_tokens": [300, 2]})
    res = run(make_config(parallel={"pp": 1, "tp": 1, "replicas": 2, "router": "least-loaded"}, workload=wl))
    df = requests_frame(res)
    assert (df["status"] == "finished").all()
    counts = df["replica"].value_counts()
    assert set(counts.index) == {0, 1}
    rr = requests_frame(run(make_config(parallel={"pp": 1, "tp": 1, "replicas": 2}, workload=wl)))
    # round-robin sends every long request to replica 0; least-loaded spreads them
    assert rr[rr["prompt_tokens"] == 2000]["replica"].nunique() == 1
    assert df[df["prompt_tokens"] == 2000]["replica"].nunique() == 2


def test_more_replicas_lower_latency_under_load():
    one = summarize(run(make_config(parallel={"pp": 1, "tp": 1}, workload=WL)))
    two = summarize(run(make_config(parallel={"pp": 1, "tp": 1, "replicas": 2}, workload=WL)))
    assert two["p90_ttft_ms"] < one["p90_ttft_ms"]
    assert two["num_finished"] == one["num_finished"] == 40


def test_replicas_are_deterministic():
    cfg = make_config(parallel={"pp": 2, "tp": 1, "replicas": 2, "router": "least-loaded"}, workload=WL)
    a, b = requests_frame(run(cfg)), requests_frame(run(cfg))
    assert a.equals(b)


def test_bad_router_is_rejected():
    with pytest.raises(ConfigError, match="router must be one of"):
        make_config(parallel={"pp": 1, "tp": 1, "replicas": 2, "router": "random"})
