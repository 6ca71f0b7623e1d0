"""MoE routing distributions (issue 44, sim/latency/moe_routing.py): AIConfigurator's power-law routing drawn as
its collector draws it, the experts a batch touches under it, and the roofline floor of a skewed profile, each
against a hand calculation."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.errors import DataError
from sim.latency.moe_routing import (power_law_alpha, power_law_slots, sample_power_law, slots_per_expert,
                                     touched_experts)
from sim.latency.roofline import expected_experts


def test_inverse_cdf_by_hand():
    # u = 0 gives xmin, u -> 1 gives xmax; alpha 2 on [1, 4]: x = ((4^-1 - 1) u + 1)^-1, u = 0.5: 1 / 0.625 = 1.6
    x = sample_power_law(np.array([0.0, 0.5, 1.0]), 2.0, 1.0, 4.0)
    assert x == pytest.approx([1.0, 1.6, 4.0])


def test_slots_round_and_fix_the_sum_by_hand():
    # 3 tokens x top-2 = 6 slots; weights 5:3:1:1 -> 3, 1.8, 0.6, 0.6 -> rounded 3, 2, 1, 1 = 7: one too many,
    # taken from the smallest (the last of equal counts in descending order)
    assert slots_per_expert(np.array([5.0, 3.0, 1.0, 1.0]), 3, 2).tolist() == [3, 2, 1, 0]
    # 1 token x top-1 = 1 slot over 0.45, 0.45, 0.1: all round to 0; the one missing slot goes to the first of
    # the largest counts
    assert slots_per_expert(np.array([0.45, 0.45, 0.1]), 1, 1).tolist() == [1, 0, 0]
    # half to even, as torch.round: 2 slots over 1:3 -> 0.5, 1.5 -> 0, 2
    assert slots_per_expert(np.array([1.0, 3.0]), 1, 2).tolist() == [0, 2]


def test_power_law_draw_uses_the_collectors_ranges():
    # T k = 4 <= E = 8: weights on [0.01, 2]; T k = 32 > 8: on [1, 0.8 T]; the slots always sum to T k
    u = np.linspace(0.05, 0.95, 8)
    few = power_law_slots(2, 8, 2, 1.2, u)
    many = power_law_slots(16, 8, 2, 1.2, u)
    assert few.sum() == 4 and many.sum() == 32
    w = sample_power_law(u, 1.2, 1.0, 12.8)
    assert many.tolist() == slots_per_expert(w, 16, 2).tolist()


def test_touched_experts_by_hand():
    # balanced: the uniform expectation, E (1 - (1 - k/E)^T): 8 (1 - 0.75^4) = 5.46875
    assert touched_experts(8, 2, 4, "balanced") == pytest.approx(8 * (1 - 0.75 ** 4)) == expected_experts(8, 2, 4)
    # one token, top-1: exactly one expert under any routing
    assert touched_experts(8, 1, 1, "power_law_1.2") == 1.0
    # skew reaches fewer experts at few tokens, all of them at many; deterministic (fixed seed)
    assert 1.0 <= touched_experts(8, 2, 1, "power_law_1.2") <= 2.0
    assert touched_experts(128, 8, 16, "power_law_1.2") < touched_experts(128, 8, 16, "balanced")
    assert touched_experts(8, 2, 4096, "power_law_1.2") == pytest.approx(8.0, abs=0.1)
    assert touched_experts(128, 8, 16, "power_law_1.01") == touched_experts(128, 8, 16, "power_law_1.01")
    assert power_law_alpha("power_law_1.01") == 1.01 and power_law_alpha("balanced") is None
    with pytest.raises(DataError, match="allowed: balanced, power_law_1.01, power_law_1.2"):
        touched_experts(8, 2, 4, "zipf")


def test_skewed_profile_floor_counts_the_skewed_touched_experts():
    from sim.latency.profiled import Profile

    base = "profiles/moe/h100-sxm-80gb/vllm/mixtral-8x7b-bf16-kvbf16"
    bal, skew = Profile.load(f"{base}/tp2"), Profile.load(f"{base}-power_law_1.2/tp2")
    assert (bal.shape().moe_distribution, skew.shape().moe_distribution) == ("balanced", "power_law_1.2")
    from sim.latency.roofline import Floors, bounds_from_meta

    bounds = bounds_from_meta(skew.meta, "test")
    fl = Floors.for_shape(bounds, skew.shape(), 2)
    expert = 176_160_768 / 2 * 2                                  # one expert's TP-2 shard, bf16 bytes
    fixed = (skew.shape().layer_params - 8 * 176_160_768) / 2 * 2
    assert fl.weight_bytes(4) == pytest.approx(fixed + touched_experts(8, 2, 4, "power_law_1.2") * expert)
    fb = Floors.for_shape(bounds, bal.shape(), 2)
    assert fb.weight_bytes(4) == pytest.approx(fixed + 8 * (1 - 0.75 ** 4) * expert)


def test_bad_distribution_in_a_profile_is_a_one_line_error(tmp_path):
    import shutil

    from sim.latency.profiled import Profile

    src = "profiles/moe/h100-sxm-80gb/vllm/mixtral-8x7b-bf16-kvbf16/tp2"
    shutil.copytree(src, tmp_path / "p")
    meta = tmp_path / "p" / "meta.toml"
    meta.write_text(meta.read_text().replace('distribution = "balanced"', 'distribution = "zipf"'))
    with pytest.raises(DataError) as e:
        Profile.load(tmp_path / "p").shape()
    msg = str(e.value)
    assert "[moe] distribution = 'zipf'" in msg and "allowed: balanced" in msg and "\n" not in msg


def test_interpolated_expert_points_never_below_their_floor_by_hand():
    from sim.latency.hardware import load_gpu
    from sim.profiling.moe import expert_curve_on_grid
    from sim.profiling.specs import load_model

    model, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm-80gb")
    # the floor at 5 tokens, balanced, TP 1: 8 (1 - 0.75^5) experts x 176,160,768 params x 2 B / 3350 GB/s
    floor5 = 8 * (1 - 0.75 ** 5) * 176_160_768 * 2 / 3350e9 * 1e3
    grid = np.array([4, 5, 8])
    ms, lifted = expert_curve_on_grid(model, np.array([4, 8]), np.array([1.0, 2.0]), grid, gpu, 2, 989.0, 1,
                                      "balanced")
    assert ms[1] == pytest.approx(2 ** (np.log(5 / 4) / np.log(2))) and lifted == ""   # log-log, above the floor
    ms, lifted = expert_curve_on_grid(model, np.array([4, 8]), np.array([1e-3, 2e-3]), grid, gpu, 2, 989.0, 1,
                                      "balanced")
    assert ms[1] == pytest.approx(floor5) and lifted.startswith("4: ") and "5: " in lifted


@pytest.mark.parametrize("folder", ["mixtral-8x7b-bf16-kvbf16", "mixtral-8x7b-bf16-kvbf16-power_law_1.2"])
def test_a100_moe_profiles_run_under_the_engine(folder):
    """The A100 MoE profiles (balanced and skewed) load with their routing and run a small workload to the end."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.latency.profiled import Profile
    from sim.outputs.metrics import request_columns

    path = f"profiles/moe/a100-sxm-80gb/vllm/{folder}/tp2"
    table = {"seed": 1, "parallel": {"tp": 2}, "scheduler": {"engine": "vllm-v0"}, "latency": {"profile": path},
             "workload": {"kind": "synthetic-uniform", "num_requests": 6, "rate_rps": 50.0,
                          "input_range": [100, 300], "output_range": [5, 20]}}
    res = run(config_from_table(table, "test"), keep_iterations=False)
    c = request_columns(res)
    assert res.status == "ok" and len(c["status"]) == 6
    prof = Profile.load(path)
    assert prof.shape().moe_distribution == ("balanced" if folder.endswith("kvbf16") else "power_law_1.2")
