"""Mixture-of-experts models (issue 44): the `[moe]` spec and Hugging Face configs, parameter counts, memory per
GPU, the expected experts a batch touches and the roofline floor that counts only them, each against a hand
calculation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.core.errors import DataError
from sim.latency.roofline import Bounds, Floors, expected_experts
from sim.profiling.specs import load_model, model_from_hf_config

GIB = 1 << 30

# config.json of mistralai/Mixtral-8x7B-Instruct-v0.1 and of Qwen/Qwen3-30B-A3B on Hugging Face (the fields
# the reader uses)
MIXTRAL_HF = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
              "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
              "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
QWEN3_MOE_HF = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 6144,
                "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                "vocab_size": 151936, "max_position_embeddings": 40960, "num_experts": 128,
                "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu",
                "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False}


def _hf(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def test_mixtral_parameters_by_hand():
    m = load_model("mixtral-8x7b")
    # attention: q 4096x4096, k and v 4096x1024 each, o 4096x4096, two norms of 4096
    attn = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 2 * 4096
    assert m.attention_params == attn == 41_951_232
    expert = 3 * 4096 * 14336                               # gate, up, down
    assert m.expert_params == expert == 176_160_768
    layer = attn + 4096 * 8 + 8 * expert                    # + router 4096 x 8
    assert m.layer_params == layer
    total = 32 * layer + 2 * 32000 * 4096                   # untied embedding and LM head
    assert m.total_params == total == 46_702_788_608        # "46.7B" (Mistral AI)
    active = 32 * (attn + 4096 * 8 + 2 * expert) + 2 * 32000 * 4096
    assert m.active_params == active                         # ~12.9B
    assert 12.8e9 < active < 13.0e9
    assert m.weight_bytes() == 2 * total


def test_qwen3_30b_a3b_parameters_by_hand():
    m = load_model("qwen3-30b-a3b")
    attn = 2048 * (32 + 2 * 4) * 128 + 32 * 128 * 2048 + 2 * 2048
    expert = 3 * 2048 * 768
    router = 2048 * 128
    emb = 2 * 151936 * 2048
    assert m.total_params == 48 * (attn + router + 128 * expert) + emb == 30_532_108_288     # "30.5B"
    assert m.active_params == 48 * (attn + router + 8 * expert) + emb == 3_353_018_368      # "3.3B activated"


def test_hf_configs_read_as_the_model_files(tmp_path):
    for cfg, name in ((MIXTRAL_HF, "mixtral-8x7b"), (QWEN3_MOE_HF, "qwen3-30b-a3b")):
        got = model_from_hf_config(_hf(tmp_path, cfg), name=name)
        want = load_model(name)
        assert got.moe == want.moe
        assert got.total_params == want.total_params
        assert got.context_length_tokens == want.context_length_tokens


def test_qwen3_moe_dense_layers_as_transformers_builds_them(tmp_path):
    # layer i is sparse when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    cfg = dict(QWEN3_MOE_HF, num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[1])
    m = model_from_hf_config(_hf(tmp_path, cfg))
    assert m.moe.dense_layers == (0, 1, 2, 4)
    assert m.num_moe_layers == 2
    dense = m.attention_params + 3 * 2048 * 6144
    assert m.total_layer_params == 2 * m.layer_params + 4 * dense


@pytest.mark.parametrize("cfg, needle", [
    ({"model_type": "deepseek_v3", "kv_lora_rank": 512, "n_routed_experts": 256}, "MLA"),
    (dict(MIXTRAL_HF, num_experts_per_tok=9), "num_experts_per_tok"),
    ({k: v for k, v in QWEN3_MOE_HF.items() if k != "moe_intermediate_size"}, "moe_intermediate_size"),
    (dict(MIXTRAL_HF, model_type="llama"), "num_local_experts"),
    (dict(QWEN3_MOE_HF, decoder_sparse_step=0), "decoder_sparse_step"),
])
def test_bad_moe_configs_are_one_line_errors(tmp_path, cfg, needle):
    with pytest.raises(DataError) as e:
        model_from_hf_config(_hf(tmp_path, cfg))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and "config.json" in msg


def test_bad_moe_table(tmp_path, monkeypatch):
    import sim.profiling.specs as specs

    monkeypatch.setattr(specs, "MODELS_DIR", tmp_path)
    text = (specs.PROFILES / "models" / "mixtral-8x7b.toml").read_text()
    (tmp_path / "bad.toml").write_text(text.replace("top_k = 2", "top_k = 9"))
    with pytest.raises(DataError, match=r"\[moe\]: field 'top_k' \(9\) must be <= 'num_experts' \(8\)"):
        specs.load_model("bad")
    (tmp_path / "bad2.toml").write_text(text.replace('router_dtype = "bf16"', 'router_dtype = "int4"'))
    with pytest.raises(DataError, match="router_dtype"):
        specs.load_model("bad2")


def test_memory_per_gpu_counts_every_resident_expert():
    from sim.profiling.specs import weights_gib_per_gpu

    m = load_model("mixtral-8x7b")
    attn, expert = 41_951_232, 176_160_768
    # TP-sharded experts (vLLM/SGLang default): attention and each expert split over TP 2, router replicated
    per_layer = attn / 2 + 4096 * 8 + 8 * expert / 2
    assert m.layer_params_per_gpu(2) == per_layer
    want = (32 * per_layer * 2 + 2 * 32000 * 4096 * 2 / 2) / GIB     # bf16; embedding + LM head over TP 2
    assert weights_gib_per_gpu(m, 2, 1) == pytest.approx(want, rel=1e-12)
    assert 43.4 < want < 43.6
    # expert parallelism: experts / (ep x moe_tp) whole experts per GPU, attention over its own TP
    assert m.layer_params_per_gpu(1, moe_tp=1, ep=2) == attn + 4096 * 8 + 4 * expert
    assert m.layer_params_per_gpu(2, moe_tp=1, ep=4) == attn / 2 + 4096 * 8 + 2 * expert
    with pytest.raises(DataError, match="ep 3"):
        m.layer_params_per_gpu(1, moe_tp=1, ep=3)


def test_expected_experts_by_hand_and_by_sampling():
    assert expected_experts(8, 2, 1) == 2.0                              # one token touches exactly k
    assert expected_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75 ** 2))   # 3.5
    assert expected_experts(128, 8, 16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert expected_experts(128, 8, 16) == pytest.approx(82.42, abs=0.01)
    assert expected_experts(8, 2, 10_000) == pytest.approx(8.0)
    assert expected_experts(8, 2, 0) == 0.0
    rng = np.random.default_rng(0)
    for e, k, t in ((8, 2, 3), (128, 8, 10)):
        draws = [len({int(x) for _ in range(t) for x in rng.choice(e, k, replace=False)}) for _ in range(3000)]
        assert np.mean(draws) == pytest.approx(expected_experts(e, k, t), rel=0.02)


def test_moe_roofline_reads_only_touched_experts():
    m = load_model("mixtral-8x7b")
    b = Bounds("h100", 989e12, 3.35e12)
    fl = Floors(b, m.layer_params, 4096, 32, 8, 128, 32000, 2, 1, moe=(8, 2, m.expert_params))
    fixed = (41_951_232 + 4096 * 8) * 2
    # one token: the fixed part and its 2 experts
    assert fl.weight_bytes(1) == fixed + 2 * 176_160_768 * 2
    assert fl.linear_s(1) == pytest.approx((fixed + 2 * 176_160_768 * 2) / 3.35e12)
    # two tokens: 3.5 experts expected
    assert fl.weight_bytes(2) == pytest.approx(fixed + 3.5 * 176_160_768 * 2)
    # compute bound: 2 FLOPs per active parameter per token
    assert fl.linear_flops_per_token == 2 * (m.layer_params - 6 * m.expert_params)
    assert fl.linear_s(100_000) == pytest.approx(100_000 * fl.linear_flops_per_token / 989e12)
    dense = Floors(b, m.layer_params, 4096, 32, 8, 128, 32000, 2, 1)
    assert dense.linear_s(1) == pytest.approx(m.layer_params * 2 / 3.35e12)
    assert fl.linear_s(1) < 0.55 * dense.linear_s(1)


# -- expert kernels from AIConfigurator's MoE tables and the TP-sharded profiles --------------------------------

aic_only = pytest.mark.skipif(__import__("importlib").util.find_spec("aiconfigurator_core") is None,
                              reason="aiconfigurator-core not installed (the optional extra pipesim[aic])")


def test_loglog_interpolation_by_hand():
    from sim.profiling.moe import interp_loglog_curve

    got = interp_loglog_curve(np.array([1, 4]), np.array([1.0, 16.0]), np.array([1, 2, 4, 8]))
    assert got == pytest.approx([1.0, 4.0, 16.0, 64.0])     # y = x^2 on a log-log line, past the end too


def test_vidur_builder_refuses_moe(tmp_path):
    from sim.profiling.build import build_profile
    from sim.latency.hardware import load_gpu, load_interconnect

    gpu = load_gpu("h100-sxm-80gb")
    with pytest.raises(DataError, match="mixture-of-experts"):
        build_profile(load_model("mixtral-8x7b"), gpu, load_interconnect(gpu.default_interconnect), 2, tmp_path / "p")


@aic_only
def test_moe_profile_reads_the_table_and_counts_every_expert(tmp_path):
    import pandas as pd

    from sim.latency.profiled import kv_capacity_tokens
    from sim.profiling.aic import AicData
    from sim.profiling.moe import build_moe_profile
    from sim.latency.hardware import load_gpu

    aic = AicData("h100_sxm")
    model, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm-80gb")
    prof = build_moe_profile(model, gpu, 2, tmp_path / "p", aic=aic)
    df = pd.read_parquet(aic.data / "moe" / "vllm" / aic.version / "moe_perf.parquet")
    rows = df[(df.kernel_source == "vllm_unquantizedfusedmoe_triton_tritonexperts") & (df.hidden_size == 4096)
              & (df.inter_size == 14336) & (df.topk == 2) & (df.num_experts == 8) & (df.moe_tp_size == 2)
              & (df.moe_ep_size == 1) & (df.distribution == "balanced")]
    lay = pd.read_csv(tmp_path / "p" / "layer_nonattn.csv", index_col="num_tokens")
    for t in (1, 256, 4096):               # token counts the MoE table measured: read as measured (median)
        assert lay.loc[t, "moe_experts"] == pytest.approx(rows[rows.num_tokens == t].latency.median(), rel=1e-4)
    parts = lay[["qkv_proj", "o_proj", "router", "moe_experts", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    assert lay["layer_nonattn_ms"].to_numpy() == pytest.approx(parts.to_numpy(), rel=1e-4)
    shape = prof.shape()
    assert (shape.moe_num_experts, shape.moe_top_k, shape.moe_expert_params) == (8, 2, 176_160_768)
    assert shape.layer_params == model.layer_params
    # KV pool per GPU (SGLang's rule as profiled.kv_capacity_tokens): every expert's TP shard is resident
    m_init = prof.meta["memory"]["m_init_gib"]
    weights = 32 * model.layer_params / 2 * 2 + 2 * 32000 * 4096 / 2 * 2
    cell = 4 * 128 * 32 * 2 * 2                       # 8 KV heads / TP 2, K and V, 32 layers, bf16
    want = int(((m_init - weights / GIB) - m_init * (1 - 0.9)) * GIB // cell)
    assert kv_capacity_tokens(prof, 1, 0.9) == want
    assert prof.meta["derivation"]["moe_checks"].startswith("expert kernel / roofline floor")


def test_cli_refuses_moe_on_vidur_data(tmp_path, capsys):
    from sim.cli import main as ppsim

    rc = ppsim(["profile", "build", "--model", "mixtral-8x7b", "--gpu", "a100-sxm-80gb", "--tp", "2",
                "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "mixture-of-experts" in err and "--data aic" in err and "\n" not in err
    assert not (tmp_path / "p").exists()


@aic_only
def test_a100_moe_profile_composes_vidur_dense_parts_with_the_chosen_expert_curve(tmp_path):
    """A100 (issue 44): the dense parts are Vidur's A100 built profile's, the router is Vidur's GEMM model at
    (experts, hidden), the experts are AIConfigurator's SGLang A100 Triton rows at TP 2 and Frontier's table
    (gating + shuffling + grouped GEMM) for Mixtral at TP 1, read as measured at their token counts."""
    import pandas as pd

    from sim.latency.hardware import load_gpu, load_interconnect
    from sim.profiling.build import build_profile
    from sim.profiling.kernels import KernelModel
    from sim.profiling.moe import FRONTIER_CSV, a100_moe_table, build_moe_profile_a100

    model, gpu = load_model("mixtral-8x7b"), load_gpu("a100-sxm-80gb")
    prof = build_moe_profile_a100(model, gpu, 2, tmp_path / "tp2")
    lay = pd.read_csv(tmp_path / "tp2" / "layer_nonattn.csv", index_col="num_tokens")
    df, _ = a100_moe_table()
    rows = df[(df.kernel_source == "sglang_fused_moe_triton") & (df.moe_dtype == "bfloat16") & (df.hidden_size == 4096)
              & (df.inter_size == 14336) & (df.topk == 2) & (df.num_experts == 8) & (df.moe_tp_size == 2)
              & (df.moe_ep_size == 1) & (df.distribution == "balanced")]
    for t in (1, 256, 4096):
        assert lay.loc[t, "moe_experts"] == pytest.approx(rows[rows.num_tokens == t].latency.median(), rel=1e-4)
    # the dense twin: Mistral-7B's attention shape with the expert FFN, from the same Vidur A100 data
    import dataclasses
    proxy = dataclasses.replace(model, moe=None, intermediate_size=14336)
    build_profile(proxy, gpu, load_interconnect(gpu.default_interconnect), 2, tmp_path / "dense")
    dense = pd.read_csv(tmp_path / "dense" / "layer_nonattn.csv", index_col="num_tokens")
    for col in ("qkv_proj", "o_proj", "rope", "rmsnorm_x2", "residual_add"):
        assert lay[col].to_numpy() == pytest.approx(dense[col].to_numpy(), rel=1e-4)
    assert lay["router"].to_numpy() == pytest.approx(KernelModel.load("a100").gemm_ms(8, 4096), rel=1e-4)
    parts = lay[["qkv_proj", "o_proj", "router", "moe_experts", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    assert lay["layer_nonattn_ms"].to_numpy() == pytest.approx(parts.to_numpy(), rel=1e-4)
    assert (tmp_path / "tp2" / "attention.csv").read_text() == (tmp_path / "dense" / "attention.csv").read_text()
    assert prof.shape().layer_params == model.layer_params and prof.meta["moe"]["moe_tp"] == 2
    # TP 1: Frontier's table (1 token: 0.019 + 0.019 + 0.496 ms in the reduced file; 1024: 0.034 + 0.115 + 3.599)
    build_moe_profile_a100(model, gpu, 1, tmp_path / "tp1")
    lay1 = pd.read_csv(tmp_path / "tp1" / "layer_nonattn.csv", index_col="num_tokens")
    assert lay1.loc[1, "moe_experts"] == pytest.approx(0.019 + 0.019 + 0.496)
    assert lay1.loc[1024, "moe_experts"] == pytest.approx(0.034 + 0.115 + 3.599)
    assert "Frontier" in FRONTIER_CSV.read_text().splitlines()[0]


def test_a100_moe_builder_refuses_other_gpus_and_dense_models(tmp_path):
    from sim.latency.hardware import load_gpu
    from sim.profiling.moe import build_moe_profile_a100

    with pytest.raises(DataError, match="--gpu 'h100-sxm-80gb'"):
        build_moe_profile_a100(load_model("mixtral-8x7b"), load_gpu("h100-sxm-80gb"), 2, tmp_path / "p")
    with pytest.raises(DataError, match="not a mixture-of-experts"):
        build_moe_profile_a100(load_model("mistral-7b"), load_gpu("a100-sxm-80gb"), 2, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_moe_validation_case_is_loaded_and_named_by_its_gpu():
    """M1 lives in experiments/validation/cases_moe.toml; the runner reads it after cases.toml and names the GPU
    of a profiles/moe/<gpu>/... profile (it took the path's third-last part, 'vllm', before)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "validation" / "run.py"
    spec = importlib.util.spec_from_file_location("validation_run_moe", path)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    cases = run.case_by_id(run.load_cases())
    assert "M1" in cases and "B1" in cases
    assert run.sim_gpu(cases["M1"]) == "A100-80GB SXM"
    assert run.sim_gpu(cases["B1"]) == "A100-80GB SXM"
    assert [c["id"] for c in run.load_cases(run.CASES_FILE)][-1] == "M1"
