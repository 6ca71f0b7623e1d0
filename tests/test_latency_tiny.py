"""The tiny synthetic profile (tests/data/tiny-profile) through the whole engine."""

from __future__ import annotations

import pytest

from sim.engine.run import build_latency, run
from sim.latency.base import BatchStats
from sim.outputs.metrics import iterations_frame, requests_frame

from conftest import TINY_PROFILE, make_config


def tiny(pp: int):
    return make_config(parallel={"pp": pp, "tp": 1}, latency={"kind": "profile", "profile": str(TINY_PROFILE)},
                       scheduler={"chunk_size_tokens": 256})


def test_split_composes_per_layer_tables():
    one, two = build_latency(tiny(1)), build_latency(tiny(2))
    st = BatchStats.prefill(200)
    t1 = one.stage_time(st, 0)
    a, b = two.stage_time(st, 0), two.stage_time(st, 1)
    # 4 layers: one stage holds all, two stages hold 2 each; linear + attention split evenly
    assert a.attention_s + b.attention_s == pytest.approx(t1.attention_s)
    layer_linear = 2.0e-3  # 200 tokens round up to the 256-token row (2.0 ms per layer)
    assert a.linear_s == pytest.approx(2 * layer_linear)
    assert b.linear_s == pytest.approx(2 * layer_linear + 0.5e-3)  # last stage adds the LM head
    assert a.comm_s > 0 and b.comm_s == 0  # activation send into the next stage only
    assert one.iteration_overhead_s == pytest.approx(1e-3)


def test_tiny_profile_runs_end_to_end():
    res = run(tiny(2))
    df = requests_frame(res)
    assert (df["status"] == "finished").all()
    it = iterations_frame(res)
    busy = it[it["mode"] != "idle"]
    # iteration = overhead + the slowest stage of the micro-batches in flight
    assert (busy["iter_ms"] >= 1.0 + busy[["stage0_busy_ms", "stage1_busy_ms"]].max(axis=1) - 1e-9).all()
