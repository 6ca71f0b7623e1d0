"""AIConfigurator's kernel database as a profile source (issue 42): the GEMM and attention lookups, the engine's
all-reduce choice and the FP8 memory arithmetic, each against a hand calculation on the package's own rows."""

from __future__ import annotations

import importlib.util
import math

import pandas as pd
import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                                reason="aiconfigurator-core not installed (the optional extra pipesim[aic])")

GIB = 1 << 30


@pytest.fixture(scope="module")
def h200():
    from sim.profiling.aic import AicData

    return AicData("h200_sxm")


def _rows(aic, op, name, **eq):
    df = pd.read_parquet(aic.data / op / "vllm" / aic.version / name)
    for k, v in eq.items():
        df = df[df[k] == v]
    return df


def test_gemm_lookup_reads_the_measured_row_and_interpolates_geometrically(h200):
    m, ms, how = h200.gemm_ms(4096, 4096, "bf16")
    rows = _rows(h200, "gemm", "gemm_perf.parquet", gemm_dtype="bfloat16", n=4096, k=4096)
    assert how == "measured"
    assert ms[list(m).index(4096)] == pytest.approx(float(rows.loc[rows["m"] == 4096, "latency"].iloc[0]))
    # Qwen2.5-7B's QKV (N = (28 + 2 x 4) x 128 = 4608) lies between the measured n = 4096 and 5120 (k = 3584):
    # w = ln(4608/4096) / ln(5120/4096) = 0.52784, t = t4096^(1-w) t5120^w
    m, ms, how = h200.gemm_ms(4608, 3584, "bf16")
    g = _rows(h200, "gemm", "gemm_perf.parquet", gemm_dtype="bfloat16", k=3584, m=1024)
    t1, t2 = (float(g.loc[g["n"] == n, "latency"].iloc[0]) for n in (4096, 5120))
    w = math.log(4608 / 4096) / math.log(5120 / 4096)
    assert w == pytest.approx(0.52784, abs=1e-5)
    assert ms[list(m).index(1024)] == pytest.approx(t1 ** (1 - w) * t2 ** w, rel=1e-12)
    assert "interpolated" in how
    # past the largest n (an LM head's vocabulary): linear in n from n = 65536
    m, ms, _ = h200.gemm_ms(131072, 4096, "bf16")
    g = _rows(h200, "gemm", "gemm_perf.parquet", gemm_dtype="bfloat16", n=65536, k=4096, m=1)
    assert ms[0] == pytest.approx(2 * float(g["latency"].iloc[0]))


def test_fp8_gemms_come_from_the_per_tensor_cutlass_kernel(h200):
    m, ms, _ = h200.gemm_ms(6144, 4096, "fp8")
    rows = _rows(h200, "gemm", "gemm_perf.parquet", gemm_dtype="fp8", n=6144, k=4096, m=2048)
    assert set(rows["kernel_source"]) == {"CutlassFP8ScaledMMLinearKernel"}
    assert ms[list(m).index(2048)] == pytest.approx(float(rows["latency"].iloc[0]))


def test_attention_rows_and_the_fitted_lookup(h200):
    rows, q, _ = h200.attention_rows("generation", 32, 8, 128, "bf16")
    assert q == 32 and set(rows["kernel_source"]) == {"vllm_flash_attn_fa3"} and set(rows["kv_cache_dtype"]) == {"bfloat16"}
    # Qwen2.5-7B at TP1 has 28 query heads, not in the table: the nearest count with its 4 KV heads (32:
    # |ln 32/28| = 0.134 < |ln 24/28| = 0.154) stands in, prefill rates scaled by 28/32
    fit28 = h200.attention_fit(28, 4, 128, "bf16", 32768)
    fit32 = h200.attention_fit(32, 4, 128, "bf16", 32768)
    assert fit28["prefill"]["b_c2"] == pytest.approx(fit32["prefill"]["b_c2"] * 28 / 32)
    assert fit28["decode"] == fit32["decode"]
    assert fit32["prefill"]["b_cp"] == pytest.approx(2 * fit32["prefill"]["b_c2"])
    # the decode fit at one measured point: batch 64 over 4096 tokens of context
    row = rows[(rows["batch_size"] == 64) & (rows["isl"] + rows["step"] == 4096)]
    fit = h200.attention_fit(32, 8, 128, "bf16", 131072)
    pred = fit["decode"]["a_ms"] + fit["decode"]["b_ctx"] * 64 * 4096
    assert pred == pytest.approx(float(row["latency"].iloc[0]), rel=0.3)


def test_custom_allreduce_below_vllms_max_size_nccl_at_and_above(h200):
    # the tables count 16-bit elements: 1 MiB is 524288 of them
    kind, ms = h200.allreduce_choice(4, 1 << 20)            # 1 MiB < 8 MiB, 4 GPUs: vLLM's custom all-reduce
    ca = h200.custom_ar
    assert kind == "custom"
    assert ms == float(ca[(ca["num_gpus"] == 4) & (ca["message_size"] == 1 << 19)]["latency"].median())
    kind, ms = h200.allreduce_choice(4, 8 << 20)            # inp_size < max_size is strict: 8 MiB goes to NCCL
    nc = h200.nccl
    assert kind == "nccl"                                   # two repeated rows: their median
    assert ms == float(nc[(nc["num_gpus"] == 4) & (nc["message_size"] == 4 << 20)]["latency"].median())
    kind, _ = h200.allreduce_choice(8, 1 << 20)             # 8 GPUs (fully connected NVSwitch): custom too
    assert kind == "custom"
    assert h200.nccl_version == "2.26.2"                    # systems/h200_sxm.yaml misc.nccl_version


def test_fp8_memory_arithmetic(tmp_path, h200):
    from sim.latency.profiled import Profile, kv_capacity_tokens
    from sim.profiling.aic import build_aic_profile
    from sim.latency.cluster import kv_transfer_bytes, model_of_profile
    from sim.latency.hardware import load_gpu
    from sim.profiling.specs import load_model

    model, gpu = load_model("llama-3.1-8b"), load_gpu("h200-sxm")
    build_aic_profile(model, gpu, 1, tmp_path / "fp8", weight_dtype="fp8", kv_dtype="fp8", aic=h200)
    build_aic_profile(model, gpu, 1, tmp_path / "bf16", aic=h200)
    fp8, bf16 = Profile.load(tmp_path / "fp8"), Profile.load(tmp_path / "bf16")
    # Llama-3.1-8B: a layer holds 4096 x 6144 (QKV) + 4096 x 4096 (O) + 3 x 4096 x 14336 (MLP) + 2 x 4096 (norms)
    # = 218,112,000 parameters; the untied embedding and LM head 128256 x 4096 = 525,336,576 each, kept 16-bit.
    assert fp8.shape().layer_params == 218_112_000 and fp8.shape().embedding_params == 525_336_576
    weights_fp8 = 32 * 218_112_000 * 1 + 2 * 525_336_576 * 2        # 9,080,930,304 B
    weights_bf16 = 32 * 218_112_000 * 2 + 2 * 525_336_576 * 2       # 16,060,514,304 B
    cell_fp8, cell_bf16 = 8 * 128 * 32 * 2 * 1, 8 * 128 * 32 * 2 * 2  # 64 KiB, 128 KiB per token
    m_init = 139.2
    expect = lambda w, cell: int((m_init - w / GIB - m_init * 0.1) * GIB // cell)  # noqa: E731
    assert kv_capacity_tokens(fp8, 1, 0.9) == expect(weights_fp8, cell_fp8)
    assert kv_capacity_tokens(bf16, 1, 0.9) == expect(weights_bf16, cell_bf16)
    assert kv_capacity_tokens(fp8, 1, 0.9) > 2 * kv_capacity_tokens(bf16, 1, 0.9)
    # FP8 weights with a BF16 KV cache: the weights' saving, the BF16 cell
    build_aic_profile(model, gpu, 1, tmp_path / "mixed", weight_dtype="fp8", kv_dtype="bf16", aic=h200)
    assert kv_capacity_tokens(Profile.load(tmp_path / "mixed"), 1, 0.9) == expect(weights_fp8, cell_bf16)
    # a KV transfer (disaggregation) moves 1 byte per element: 2 x 32 layers x 8 heads x 128 x 1000 tokens
    assert kv_transfer_bytes(model_of_profile(fp8.meta, "fp8"), 1000, 1) == 2 * 32 * 8 * 128 * 1000
    assert kv_transfer_bytes(model_of_profile(bf16.meta, "bf16"), 1000, 1) == 2 * 32 * 8 * 128 * 2 * 1000
    # the roofline of the FP8 profile is the dense FP8 peak
    assert fp8.bounds().peak_flops == 1979e12 and bf16.bounds().peak_flops == 989e12
    # the all-reduce message stays 16-bit: act_dtype_bytes
    assert fp8.shape().act_bytes == 2 and fp8.shape().kv_bytes == 1 and fp8.shape().dtype_bytes == 1


def test_provenance_and_the_shipped_library_rebuilds_byte_for_byte(tmp_path, h200):
    from sim.profiling.aic import AIC_DIR, aic_dir, build_aic_profile, package_version
    from sim.latency.hardware import load_gpu
    from sim.profiling.specs import load_model

    gpu, model = load_gpu("h200-sxm"), load_model("llama-3.1-8b")
    prof = build_aic_profile(model, gpu, 2, tmp_path / "p", weight_dtype="fp8", kv_dtype="fp8", compact=True,
                             aic=h200)
    p = prof.meta["profile"]
    assert (p["aic_version"], p["aic_system"], p["engine"], p["engine_version"]) == (package_version(), "h200_sxm",
                                                                                     "vllm", "0.24.0")
    assert (p["weight_dtype"], p["kv_dtype"], p["gemm_kernel"]) == ("fp8", "fp8", "CutlassFP8ScaledMMLinearKernel")
    shipped = aic_dir(AIC_DIR, gpu, "vllm", model.name, "fp8", "fp8", 2)
    for f in ("meta.toml", "layer_nonattn.csv", "attention.csv", "comm.csv"):
        assert (tmp_path / "p" / f).read_bytes() == (shipped / f).read_bytes(), f


def test_resolve_profile_of_an_aic_only_gpu_is_the_shipped_aic_profile():
    from sim.profiling.library import resolve_profile

    path = resolve_profile("qwen2.5-32b", "h200-sxm", 2, None)
    assert path == REPO / "profiles" / "aic" / "h200-sxm" / "vllm" / "qwen2.5-32b-bf16-kvbf16" / "tp2"
    # the H100 keeps its Vidur-built default
    assert "built" in resolve_profile("qwen2.5-32b", "h100-sxm-80gb", 2, None).parts


def test_missing_package_is_a_one_line_error(monkeypatch):
    from sim.core.errors import DataError
    from sim.profiling import aic

    monkeypatch.setattr(aic.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install 'pipesim\[aic\]'"):
        aic.package_root()


def test_sglang_tables_and_its_custom_allreduce(tmp_path):
    """--engine sglang: SGLang 0.5.14's own GEMM, attention (fa3 on Hopper) and custom all-reduce tables, with
    SGLang's rule (_MAX_CAR_SIZE = 8 MiB, the same as vLLM's)."""
    from sim.profiling.aic import AicData, build_aic_profile
    from sim.latency.hardware import load_gpu
    from sim.profiling.specs import load_model

    sg = AicData("h200_sxm", "sglang")
    assert sg.version == "0.5.14" and sg.attention_kernels() == ("fa3", "fa3")
    kind, ms = sg.allreduce_choice(2, 1 << 20)
    ca = sg.custom_ar
    assert kind == "custom" and set(ca["kernel_source"]) == {"SGLang_CustomAllReduce_graph"}
    assert ms == float(ca[(ca["num_gpus"] == 2) & (ca["message_size"] == 1 << 19)]["latency"].median())
    prof = build_aic_profile(load_model("llama-3.1-8b"), load_gpu("h200-sxm"), 2, tmp_path / "p", engine="sglang",
                             aic=sg)
    p = prof.meta["profile"]
    assert (p["engine"], p["engine_version"], p["gemm_kernel"]) == ("sglang", "0.5.14", "sglang_torch_linear")
    assert "SGLang's choice" in prof.meta["derivation"]["comm"]


def test_sm100_fp8_rows_of_one_dispatch_range_read_as_their_median():
    """vLLM's SM100 FP8 GEMM runs one kernel on one grid for m in [1, 16] and in (16, 64] (m = 64 at k < 4096
    excepted): each range's rows become their median (by hand), others stay as measured; the B200 table's M = 1
    outlier (qkv 2560 x 8192: 0.0272 ms against 0.013 at M = 3..16) is gone from the shipped profile."""
    import numpy as np

    from sim.profiling.aic import AicData, SM100_FP8_SAME_GRID, same_grid_medians

    ms = np.array([1, 2, 4, 16, 17, 64, 65])
    ks = np.array([2048, 8192])
    col = np.array([3.0, 1.0, 2.0, 1.5, 4.0, 6.0, 9.0])  # ms per m at one (n, k)
    cube = np.stack([col, col], axis=1)[:, None, :]  # m x n(1) x k(2)
    out = same_grid_medians(ms, ks, cube, SM100_FP8_SAME_GRID)
    # [1, 16]: median(3, 1, 2, 1.5) = 1.75; (16, 64] at k 8192: median(4, 6) = 5; at k 2048 m = 64 is another
    # configuration: 17 alone (4), 64 kept (6); 65 as measured
    assert out[:, 0, 1].tolist() == [1.75, 1.75, 1.75, 1.75, 5.0, 5.0, 9.0]
    assert out[:, 0, 0].tolist() == [1.75, 1.75, 1.75, 1.75, 4.0, 6.0, 9.0]
    b200 = AicData("b200_sxm")
    m, t, _ = b200.gemm_ms(2560, 8192, "fp8")
    small = t[(m >= 1) & (m <= 16)]
    assert np.ptp(small) == 0 and 0.012 < small[0] < 0.014  # the range's median, not the 0.0272 ms M = 1 row
    h, th, _ = AicData("h200_sxm").gemm_ms(2560, 8192, "fp8")
    assert th[0] == pytest.approx(0.0149, abs=5e-5)  # Hopper rows as measured
