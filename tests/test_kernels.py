"""The kernel cost model (sim/profiling/kernels.py) and its committed data (profiles/kernels/)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, SHARED_DATA
from sim.profiling.kernels import (Arch, KernelModel, elementwise_bytes_per_token, fit_attention_points,
                                 fit_elementwise, gemm_shapes, layer_errors, leave_one_model_out,
                                 level_oracle_errors, predict_gemm, rel_err_summary, roofline_s, wave_utilisation)

QWEN32 = Arch(hidden_size=5120, intermediate_size=27648, num_q_heads=40, num_kv_heads=8, head_dim=128)
FAMILIES = ("a100", "h100", "a40")


def test_gemm_shapes_by_hand():
    # Qwen2.5-32B at TP2: 20 q + 2 x 4 kv heads of 128 -> N = 3584; FFN 27648 / 2 = 13824, gate+up fused.
    assert gemm_shapes(QWEN32, 2) == {"qkv_proj": (3584, 5120), "o_proj": (5120, 2560),
                                      "gate_up_proj": (27648, 5120), "down_proj": (5120, 13824)}
    # TP16 > 8 KV heads: KV heads replicated (one per GPU), not zero.
    assert gemm_shapes(Arch(4096, 14336, 32, 8, 128), 16)["qkv_proj"] == ((2 + 2) * 128, 4096)


def test_elementwise_bytes_by_hand():
    b = elementwise_bytes_per_token(QWEN32, 4)
    assert b["act"] == 3 * 6912 * 2             # read gate + up, write one, bf16
    assert b["rope"] == 2 * (10 + 2) * 128 * 2  # q and k heads per GPU, read + write
    assert b["rmsnorm"] == 2 * 5120 * 2
    assert b["residual_add"] == 3 * 5120 * 2


def test_roofline_by_hand():
    # 1 token, 1024 x 1024: bytes 2*(1024*1024 + 1024 + 1024) / 1e12 = 2.101e-6 s; flops 2*1024^2/1e14 = 2.1e-8.
    t = roofline_s(np.array([1.0]), 1024, 1024, flops=1e14, bytes_per_s=1e12)
    assert t[0] == pytest.approx(2 * (1024 * 1024 + 2048) / 1e12 + 5e-6)
    # 4096 tokens: compute bound, 2*4096*1024*1024/1e14.
    t = roofline_s(np.array([4096.0]), 1024, 1024, flops=1e14, bytes_per_s=1e12)
    assert t[0] == pytest.approx(2 * 4096 * 1024 * 1024 / 1e14 + 5e-6)


def test_prediction_is_exact_when_the_data_follow_the_roofline():
    grid = np.array([1.0, 64, 128, 1024, 4096])
    shapes = np.array([[1024, 1024], [4096, 1024], [1024, 4096], [8192, 8192], [2048, 2048]], dtype=float)
    table = np.array([roofline_s(grid, n, k, 1e14, 1e12) * 1e3 for n, k in shapes])
    pred = predict_gemm(grid, shapes, table, 3000, 5000, 1e14, 1e12, 108)
    np.testing.assert_allclose(pred, roofline_s(grid, 3000, 5000, 1e14, 1e12) * 1e3, rtol=1e-12)


def test_prediction_keeps_the_neighbours_step_structure():
    grid = np.array([1.0, 64, 65, 128, 129, 256])
    base = roofline_s(grid, 4096, 4096, 1e14, 1e12) * 1e3
    steps = np.array([1.0, 1.0, 1.3, 1.3, 1.6, 1.6])     # a step at 64 and 128, in every measured shape
    shapes = np.array([[4096, 4096], [4096, 2048], [2048, 4096], [8192, 4096]], dtype=float)
    table = np.array([roofline_s(grid, n, k, 1e14, 1e12) * 1e3 * steps for n, k in shapes])
    pred = predict_gemm(grid, shapes, table, 4096, 3072, 1e14, 1e12, 108)
    ratio = pred / (roofline_s(grid, 4096, 3072, 1e14, 1e12) * 1e3)
    np.testing.assert_allclose(ratio, steps, rtol=1e-9)
    assert base[0] > 0


def test_fit_elementwise_recovers_a_line():
    b = np.linspace(1e3, 1e8, 50)
    a_ms, b_ms, err = fit_elementwise(pd.DataFrame({"bytes": b, "ms": 0.003 + 2e-9 * b}))
    assert a_ms == pytest.approx(0.003, rel=1e-6) and b_ms == pytest.approx(2e-9, rel=1e-6)
    assert err.max() < 1e-9


def test_fit_attention_recovers_coefficients_and_scales_by_heads():
    rng = np.random.default_rng(0)    # local generator: test data only
    c = rng.integers(16, 2048, 80).astype(float)
    p = rng.integers(0, 4096, 80).astype(float)
    truth = dict(a_ms=0.012, b_c=2e-5, b_c2=5e-8, b_cp=1.2e-7)
    ms = truth["a_ms"] + truth["b_c"] * c + truth["b_c2"] * c * c + truth["b_cp"] * c * p
    pre = pd.DataFrame({"batch": 1.0, "chunk": c, "prefix": p, "q_dims": 4096.0, "ms": ms, "weight": 1.0})
    B = rng.integers(1, 128, 60).astype(float)
    ctx = rng.integers(32, 8192, 60).astype(float)
    dec = pd.DataFrame({"batch": B, "context": ctx, "kv_dims": 2048.0, "ms": 0.015 + 1.5e-6 * B * ctx,
                        "weight": 1.0})
    fp, fd, q = fit_attention_points(pre, dec)
    for k, v in truth.items():
        assert fp[k] == pytest.approx(v, rel=1e-6)
    # b_ctx is stated per 1024 KV dims: 1.5e-6 at 2048 dims -> 0.75e-6.
    assert fd["a_ms"] == pytest.approx(0.015, rel=1e-6) and fd["b_ctx"] == pytest.approx(0.75e-6, rel=1e-6)
    assert q["prefill"]["p90_rel_err"] < 1e-6


def test_kernel_model_attention_scaling_by_hand():
    km = KernelModel.load("a100")
    att = km.meta["attention"]
    pre, dec, status = km.attention(QWEN32, 2)       # 20 q x 128 = 2560 dims; 4 kv x 128 = 512 dims
    assert status == "fitted"
    assert pre["b_c2"] == pytest.approx(att["prefill"]["b_c2"] * 2560 / 4096)
    assert pre["a_ms"] == att["prefill"]["a_ms"]
    assert dec["b_ctx"] == pytest.approx(att["decode"]["b_ctx"] * 512 / 1024)
    for fam in ("h100", "a40"):
        assert KernelModel.load(fam).attention(QWEN32, 1)[2] == "scaled"


@pytest.mark.parametrize("family", FAMILIES)
def test_committed_kernel_data_is_consistent(family):
    km = KernelModel.load(family)
    assert list(km.grid[:5]) == [1, 2, 4, 8, 16] and km.grid[-1] == 4096
    # A measured shape comes back as measured.
    n, k = km.shapes[0]
    np.testing.assert_array_equal(km.gemm_ms(int(n), int(k)), km.table[0])
    # Every coefficient names its data.
    assert km.meta["sources"] and all(km.meta["elementwise"][op]["sources"] for op in km.meta["elementwise"])
    assert set(km.meta["gemm_sources"]) == {f"{int(a)}x{int(b)}" for a, b in km.shapes}


# Per-family single-GEMM LOO P90 reached by the wave-phase method (profiles/README.md), rounded up to 0.1 point;
# the plain neighbour average it replaced gave 12.3 / 14.6 / 14.9%.
LOO_P90_BOUND = {"a100": 0.114, "h100": 0.134, "a40": 0.136}


@pytest.mark.parametrize("family", FAMILIES)
def test_leave_one_model_out_from_committed_data(family):
    """Re-derive the LOO errors from the committed tables and guard them (profiles/README.md; targets: median
    5%, P90 10%). Per layer (the four GEMMs of one model and TP degree summed, what a stage time is built
    from) both targets hold; per single GEMM the median holds and the P90 is 11.4-13.6% (the README says why),
    and must not get worse than LOO_P90_BOUND."""
    km = KernelModel.load(family)
    owners, layers = [], {}
    for n, k in km.shapes:
        srcs = km.meta["gemm_sources"][f"{int(n)}x{int(k)}"]
        owners.append({src.split(" ")[0].split("/")[-2] for src in srcs})
        for src in srcs:       # "<mlp.csv path> tp<T> <vidur op>"
            path, tp, _ = src.split(" ")
            layers.setdefault((path.split("/")[-2], int(tp[2:])), []).append((int(n), int(k)))
    loo = leave_one_model_out(km.grid.astype(float), km.shapes, km.table, owners, km.flops, km.bytes_per_s,
                              km.sm_count)
    med, p90 = rel_err_summary(loo["rel_err"])
    val = km.meta["validation"]
    assert med == pytest.approx(val["loo_median_rel_err"], abs=1e-4)
    assert p90 == pytest.approx(val["loo_p90_rel_err"], abs=1e-4)
    assert med <= 0.05 and p90 <= LOO_P90_BOUND[family]
    lay = layer_errors(loo, layers)
    lmed, lp90 = rel_err_summary(lay["rel_err"])
    assert lmed == pytest.approx(val["layer_median_rel_err"], abs=1e-4)
    assert lp90 == pytest.approx(val["layer_p90_rel_err"], abs=1e-4)
    assert lmed <= 0.05 and lp90 <= 0.08
    assert len(lay) == val["layer_points"]


def test_wave_utilisation_by_hand():
    # A100, 108 SMs, N = 6912 = 54 tiles of 128: 256 tokens = 2 x 54 = 108 tiles, one full wave; 264 tokens =
    # 3 x 54 = 162 tiles in 2 waves of 108 -> 162 / 216 = 0.75; 512 tokens = 216 tiles, 2 full waves.
    u = wave_utilisation(np.array([256.0, 264, 512]), 6912, 108, (128, 128))
    np.testing.assert_allclose(u, [1.0, 0.75, 1.0])
    # Tiles of 128 rows x 256 columns: 27 column tiles; 256 tokens -> 54 tiles in one wave of 108 -> 0.5.
    assert wave_utilisation(np.array([256.0]), 6912, 108, (128, 256))[0] == pytest.approx(0.5)
    # H100, 132 SMs, N = 4096 (32 tiles of 128), 1 token: 1 tile row -> 32 / 132.
    assert wave_utilisation(np.array([1.0]), 4096, 132, (128, 128))[0] == pytest.approx(32 / 132)
    # 5 tile rows x 32 = 160 tiles -> 2 waves of 132 -> 160 / 264.
    assert wave_utilisation(np.array([600.0]), 4096, 132, (128, 128))[0] == pytest.approx(160 / 264)


def test_prediction_weights_neighbours_by_wave_phase():
    """Two measured shapes at the same distance from the target (N x 2 and N / 2, same K); only the first has a
    bump at 256 tokens, so the prediction there is exp(w0 / (w0 + w1) x log 1.5) with w = exp(-d / 0.1), d the
    mean |log| difference of wave utilisation over the three tiles, worked out by hand for 3 SMs."""
    sms = 3
    grid = np.array([1.0, 128, 256, 384, 512])           # memory bound throughout: no re-indexing
    flops, bw = 1e20, 1e12
    shapes = np.array([[1024, 2048], [256, 2048]], dtype=float)
    table = np.array([roofline_s(grid, n, k, flops, bw) * 1e3 for n, k in shapes])
    table[0] *= np.array([1.0, 1.0, 1.5, 1.0, 1.0])
    ratio = (predict_gemm(grid, shapes, table, 512, 2048, flops, bw, sms)
             / (roofline_s(grid, 512, 2048, flops, bw) * 1e3))
    # 256 tokens. Tiles 128 x 128: target 2 x 4 = 8 tiles in 3 waves -> 8/9; N 1024: 16 in 6 -> 8/9; N 256: 4 in 2
    # -> 2/3. Tiles 128 x 256: target 2 x 2 = 4 -> 4/6; N 1024: 8 -> 8/9; N 256: 2 -> 2/3. Tiles 256 x 128:
    # target 1 x 4 = 4 -> 4/6; N 1024: 8 -> 8/9; N 256: 2 -> 2/3.
    d0 = (0 + 2 * np.log(4 / 3)) / 3
    d1 = (np.log(4 / 3) + 0 + 0) / 3
    w0, w1 = np.exp(-d0 / 0.1), np.exp(-d1 / 0.1)
    assert ratio[2] == pytest.approx(np.exp(w0 / (w0 + w1) * np.log(1.5)), rel=1e-9)
    np.testing.assert_allclose(ratio[[0, 1, 3, 4]], 1.0, rtol=1e-9)


def test_prediction_reads_neighbours_at_the_targets_tile_count_when_compute_bound():
    """One neighbour with half the target's N (8 vs 16 column tiles of 128): where compute bound (M >= 3 x
    flops / bytes_per_s = 3 tokens here) it is read both at M and at 2 M (the same number of output tiles),
    half and half in log-time; at 1 token (memory bound) and where 2 M is off the grid only at M."""
    grid = np.array([1.0, 64, 128, 256, 512, 1024])
    flops, bw = 1e12, 1e12
    shapes = np.array([[1024, 1024]], dtype=float)
    bump = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 1.0])      # the neighbour is twice as slow at 512 tokens only
    table = roofline_s(grid, 1024, 1024, flops, bw)[None, :] * 1e3 * bump
    ratio = (predict_gemm(grid, shapes, table, 2048, 1024, flops, bw, 108)
             / (roofline_s(grid, 2048, 1024, flops, bw) * 1e3))
    np.testing.assert_allclose(ratio, [1.0, 1.0, 1.0, np.sqrt(2), np.sqrt(2), 1.0], rtol=1e-9)


def test_layer_errors_sum_the_four_gemms():
    loo = pd.DataFrame({"model": "m", "N": [1, 2, 1, 2], "K": 1, "num_tokens": [1, 1, 2, 2],
                        "pred_ms": [1.0, 3.0, 2.0, 2.0], "ms": [2.0, 2.0, 2.0, 2.0], "rel_err": 0.0})
    lay = layer_errors(loo, {("m", 1): [(1, 1), (2, 1)]})
    np.testing.assert_allclose(lay["rel_err"], [0.0, 0.0])       # -50% and +50% cancel; 0% and 0%
    lay = layer_errors(loo, {("m", 1): [(2, 1)]})
    np.testing.assert_allclose(lay["rel_err"], [0.5, 0.0])


def test_level_oracle_divides_out_each_shapes_own_level():
    """Hand count: one shape at +10%, +10%, +21% has level +10% (the median in log time), leaving
    0, 0 and +10% (1.21 / 1.1); a second shape at -50% alone is all level. Split at 65 tokens, the
    +21% point is a range of its own and all its error is level."""
    loo = pd.DataFrame({"model": ["m", "m", "m", "m"], "N": [1, 1, 1, 2], "K": 1, "num_tokens": [1, 2, 100, 1],
                        "rel_err": [0.1, 0.1, 0.21, -0.5]})
    np.testing.assert_allclose(level_oracle_errors(loo), [0.0, 0.0, 0.1, 0.0], atol=1e-12)
    np.testing.assert_allclose(level_oracle_errors(loo, (65,)), [0.0, 0.0, 0.0, 0.0], atol=1e-12)
    other = loo.assign(model=["m", "m", "x", "m"])  # the same shape of another held-out model: its own level
    np.testing.assert_allclose(level_oracle_errors(other), [0.0, 0.0, 0.0, 0.0], atol=1e-12)


@pytest.mark.skipif(not (SHARED_DATA / "vidur-profiles").is_dir(), reason="../shared/data/vidur-profiles absent")
def test_build_kernels_check_reproduces_committed_data():
    r = subprocess.run([sys.executable, "profiles/build_kernels.py", "--check"], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to date" in r.stdout


@pytest.mark.parametrize("family, gpu", [("h100", "h100-sxm-80gb"), ("a40", "a40-48gb")])
def test_attention_scaling_ratios_agree_with_the_datasheets(family, gpu):
    """The measured GEMM time ratios behind the scaled attention agree with the peak-FLOPs and HBM-bandwidth
    ratios of the GPU TOMLs (A100 80GB SXM as the reference) within 15%."""
    from sim.latency.hardware import load_gpu

    att = KernelModel.load(family).meta["attention"]
    ref, g = load_gpu("a100-sxm-80gb"), load_gpu(gpu)
    assert att["compute_ratio"] == pytest.approx(ref.bf16_tflops / g.bf16_tflops, rel=0.15)
    assert att["memory_ratio"] == pytest.approx(ref.hbm_bw_gbps / g.hbm_bw_gbps, rel=0.15)
