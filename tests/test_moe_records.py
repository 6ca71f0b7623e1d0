"""An MoE run's iterations record the routed slots of the mean and the busiest expert-parallel rank
(sim/outputs/moe.py), against hand calculations; a dense run's iterations.csv is unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.latency.moe_routing import busiest_rank
from sim.outputs.moe import ITERATION_COLUMNS, MoeLayout, rank_slots

EP_DIR = "profiles/moe/h100-sxm-80gb/vllm"


def test_balanced_ranks_are_equally_busy_by_hand():
    mean, busiest = rank_slots(MoeLayout(128, 8, 4, "balanced"), [0, 3, 100])
    assert list(mean) == [0.0, 6.0, 200.0]          # T x top-k / ep: 3 x 8 / 4, 100 x 8 / 4
    assert list(busiest) == list(mean)


def test_power_law_busiest_rank_is_the_collectors_draw_at_powers_of_two():
    lay = MoeLayout(128, 8, 8, "power_law_1.2")
    mean, busiest = rank_slots(lay, [1, 2, 3, 4, 64])
    for i, t in ((0, 1), (1, 2), (3, 4), (4, 64)):  # exact at powers of two
        assert busiest[i] == pytest.approx(busiest_rank(128, 8, t, 8, "power_law_1.2")[0])
    # 3 tokens: the busiest / mean ratio halfway (in log2 T) between 2 and 4 tokens' ratios, times 3 x 8 / 8
    r2 = busiest_rank(128, 8, 2, 8, "power_law_1.2")[0] / 2
    r4 = busiest_rank(128, 8, 4, 8, "power_law_1.2")[0] / 4
    w = math.log2(3) - 1
    assert mean[2] == 3.0 and busiest[2] == pytest.approx(3.0 * (r2 + w * (r4 - r2)))
    assert (busiest >= mean).all() and busiest[4] > 1.4 * mean[4]  # skewed: 64 tokens, 91 slots vs 64


def _table(profile: str, tp: int, ep: int | None) -> dict:
    par = {"tp": tp, **({"ep": ep} if ep else {})}
    return {"seed": 1, "parallel": par, "scheduler": {"engine": "vllm-v1"}, "latency": {"profile": profile},
            "workload": {"kind": "synthetic-uniform", "num_requests": 4, "rate_rps": 50.0,
                         "input_range": [50, 200], "output_range": [3, 10]}}


def test_iterations_csv_has_the_rank_slots_of_an_moe_run_only():
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import iterations_frame

    t = _table(f"{EP_DIR}/qwen3-30b-a3b-bf16-kvbf16-power_law_1.2/tp4-ep4", 4, 4)
    df = iterations_frame(run(config_from_table(t, "test")))
    busy = df[df["num_tokens"] > 0]
    assert np.allclose(busy["moe_mean_rank_slots"], busy["num_tokens"] * 8 / 4)
    assert (busy["moe_busiest_rank_slots"] >= busy["moe_mean_rank_slots"]).all()
    dense = _table("profiles/a100-pcie-40gb/qwen2.5-14b/tp1", 1, None)
    dense["scheduler"] = {}
    cols = iterations_frame(run(config_from_table(dense, "test"))).columns
    assert not set(ITERATION_COLUMNS) & set(cols)
