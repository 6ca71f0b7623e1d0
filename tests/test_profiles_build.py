"""Tests of the committed A100 latency profiles and of profiles/build_a100.py, which re-derives them.

The rebuild and InternLM checks need the shared data folder next to the repository (../shared/data) and are
skipped without it; the other checks read only the committed tables.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder not found at {DATA}")

_spec = importlib.util.spec_from_file_location("build_a100", PROFILES / "build_a100.py")
build_a100 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_a100)

PCIE = PROFILES / "a100-pcie-40gb"
MODELS = ("qwen2.5-32b", "qwen2.5-14b")
TPS = (1, 2, 4)


def layer_table(model: str, tp: int, gpu_dir: Path = PCIE) -> pd.DataFrame:
    return pd.read_csv(gpu_dir / model / f"tp{tp}" / "layer_nonattn.csv").set_index("num_tokens")


def attention(model: str, tp: int) -> dict:
    df = pd.read_csv(PCIE / model / f"tp{tp}" / "attention.csv").fillna(0.0).set_index("component")
    return {comp: row.to_dict() for comp, row in df.iterrows()}


# (1) byte-for-byte rebuild -----------------------------------------------------------------------------------

@needs_data
def test_rebuild_reproduces_committed_files(tmp_path):
    proc = subprocess.run([sys.executable, str(PROFILES / "build_a100.py"), "--data", str(DATA),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    generated = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(PROFILES).as_posix()
                       for top in build_a100.HARDWARE for p in (PROFILES / top).rglob("*") if p.is_file())
    assert generated == committed
    assert len(generated) == 2 * len(MODELS) * len(TPS) * 3 + len(MODELS) * len(TPS)   # + comm.csv (NVSwitch)
    differing = [rel for rel in generated if (tmp_path / rel).read_bytes() != (PROFILES / rel).read_bytes()]
    assert not differing, f"rebuild differs from the committed files: {differing}"


# (2) base tables ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tp", TPS)
def test_layer_tables_well_formed_and_monotone_after_running_max(model, tp):
    t = layer_table(model, tp)
    grid = t.index.to_numpy()
    assert grid[0] == 1 and grid[-1] == 4096 and len(grid) == 259 and np.all(np.diff(grid) > 0)
    assert (t["layer_nonattn_ms"] > 0).all()
    rm = build_a100.running_max(t)
    assert np.all(np.diff(rm) >= 0)
    # the per-op columns add up to the totals (4-decimal rounding of each)
    gemm = t[build_a100.GEMM_COLS].sum(axis=1)
    assert np.allclose(gemm, t["linear_ms"], atol=3e-4)
    rest = t[["linear_ms"] + build_a100.OTHER_COLS].sum(axis=1)
    assert np.allclose(rest, t["layer_nonattn_ms"], atol=3e-4)
    # the NVSwitch profile carries the same tables
    assert t.equals(layer_table(model, tp, PROFILES / "a100-sxm-80gb-nvswitch"))


def test_32b_pp4_stage_matches_reference_sums():
    rm = pd.Series(build_a100.running_max(layer_table("qwen2.5-32b", 1)), index=layer_table("qwen2.5-32b", 1).index)
    expected = {128: 13.0, 136: 16.8, 256: 19.8, 512: 38.3, 2048: 144.1}   # latency-profiles.md section 4.3
    for tokens, ms in expected.items():
        assert 16 * rm[tokens] == pytest.approx(ms, abs=0.06), tokens


# (3) 14B MLP == InternLM-20B MLP --------------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("tp", TPS)
def test_14b_mlp_equals_internlm_rows(tp):
    ilm = build_a100.load_internlm(DATA).loc[tp]
    t = layer_table("qwen2.5-14b", tp)
    assert t.index.equals(ilm.index)
    for ours, theirs in (("gate_up_proj", "mlp_up_proj"), ("down_proj", "mlp_down_proj"), ("act", "mlp_act")):
        assert np.array_equal(t[ours].to_numpy(), ilm[theirs].round(4).to_numpy()), ours


def test_14b_tp2_rows_consistent_with_neighbours():
    """14B TP2 is derived here; its MLP is the 32B TP4 MLP (both InternLM TP2) and everything else is 32B TP2."""
    ours = layer_table("qwen2.5-14b", 2)
    assert ours[["gate_up_proj", "down_proj", "act"]].equals(
        layer_table("qwen2.5-32b", 4)[["gate_up_proj", "down_proj", "act"]])
    cols = ["qkv_proj", "o_proj", "rope", "rmsnorm_x2", "residual_add"]
    assert ours[cols].equals(layer_table("qwen2.5-32b", 2)[cols])


# (4) attention --------------------------------------------------------------------------------------------------

def test_attention_reproduces_section5_example():
    for model in MODELS:
        pre = attention(model, 1)["prefill"]
        assert build_a100.attention_ms(pre, 2048, 0) == pytest.approx(0.38, rel=0.02)
    # TP2 lies between TP1 and TP4: prefill by query heads, decode by KV heads
    for c, p in ((2048, 0), (576, 15552)):
        tp = [build_a100.attention_ms(attention("qwen2.5-32b", t)["prefill"], c, p) for t in TPS]
        assert tp[0] > tp[1] > tp[2]
    dec = [attention("qwen2.5-32b", t)["decode"] for t in TPS]
    assert dec[1]["b_ctx"] == pytest.approx(dec[2]["b_ctx"] + (dec[0]["b_ctx"] - dec[2]["b_ctx"]) / 3, rel=1e-5)


# (5) KV capacity and meta --------------------------------------------------------------------------------------

def test_kv_pool_matches_section10():
    models = build_a100.MODELS
    assert build_a100.kv_tokens(models["qwen2.5-32b"], 1, 4, 39.0)["pool"] == pytest.approx(325_000, abs=1_000)
    assert build_a100.kv_tokens(models["qwen2.5-14b"], 1, 4, 39.0)["pool"] == pytest.approx(616_000, abs=1_000)
    assert build_a100.kv_tokens(models["qwen2.5-32b"], 4, 1, 39.0)["pool"] == pytest.approx(325_000, abs=1_000)
    for name, m in models.items():
        assert build_a100.shape_layer_params(m) == pytest.approx(m["layer_params"], abs=0.05e6), name


def test_readme_holds_the_kv_table():
    readme = (PROFILES / "README.md").read_text()
    assert build_a100.kv_table(build_a100.PCIE) in readme


@pytest.mark.parametrize("gpu_dir", sorted(build_a100.HARDWARE))
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tp", TPS)
def test_meta_has_format_keys(gpu_dir, model, tp):
    meta = tomllib.loads((PROFILES / gpu_dir / model / f"tp{tp}" / "meta.toml").read_text())
    required = {
        "profile": ["gpu", "model", "tp", "base_hardware", "units", "sources"],
        "model": ["num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "vocab_size",
                  "layer_params", "embedding_params", "dtype_bytes"],
        "lookup": ["mode"],
        "scaling": ["s_mem", "s_comp", "mem_bound_tokens", "comp_bound_tokens"],
        "overhead": ["cpu_ms", "lm_head_ms", "embedding_ms", "sample_ms", "broadcast_us"],
        "comm": ["model", "p2p_alpha_us", "p2p_bw_gbps", "activation_bytes_per_token", "allreduce_alpha_us",
                 "allreduce_busbw_gbps"],
        "memory": ["gpu_mem_gib", "m_init_gib"],
    }
    for table, keys in required.items():
        missing = [k for k in keys if k not in meta[table]]
        assert not missing, (table, missing)
    assert meta["profile"]["model"] == model and meta["profile"]["tp"] == tp
    assert all(s.startswith("data/") and (DATA.parent / s).exists() or not DATA.is_dir()
               for s in meta["profile"]["sources"])
    fits = {f["param"] for f in meta["fit"]}
    assert fits == {"s_mem", "s_comp", "cpu_ms", "allreduce_busbw_gbps", "allreduce_alpha_us", "p2p_bw_gbps",
                    "p2p_alpha_us", "cpu_per_request_us", "jitter_cv", "stall_prob", "stall_mean_ms",
                    "slow_prob", "slow_mean"}
    assert set(meta["ground_truth"]) >= {"decode_wave_fraction", "sm_count", "cpu_per_request_us", "jitter_cv",
                                         "stall_prob", "stall_mean_ms", "slow_prob", "slow_mean"}
    if meta["comm"]["model"] == "table":
        comm = pd.read_csv(PROFILES / gpu_dir / model / f"tp{tp}" / "comm.csv")
        assert list(comm.columns) == ["op", "num_workers", "bytes", "ms"]
        assert set(comm["op"]) == {"all_reduce", "send_recv"}
        assert set(comm.loc[comm["op"] == "all_reduce", "num_workers"]) == {2, 4, 8}
