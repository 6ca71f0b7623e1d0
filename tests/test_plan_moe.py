"""ppsim plan over MoE layouts (issue 44): the candidates hold expert-parallel layouts (TP x EP x PP), their
memory per GPU is checked by hand, infeasible layouts are refused in one line, and a candidate's run config
carries the profile's [parallel] ep. Qwen3-235B-A22B on the H100 (profiles/moe/, profiles/build_moe.py)."""

from __future__ import annotations

import functools

import pytest

from sim.core.config import config_from_table
from sim.core.errors import ConfigError
from sim.core.slo import SLO
from sim.latency.hardware import load_gpu
from sim.profiling.specs import GIB, load_model, weights_gib_per_gpu
from sim.studies.cluster_plan import Shape
from sim.studies.plan_candidates import check_routing, deployment_table, family_dir, moe_layouts, splits
from sim.studies.plan_probes import label

MODEL = "qwen3-235b-a22b"
GPU = "h100-sxm-80gb"

# Qwen3-235B-A22B by hand (config.json: hidden 4096, 64 q / 4 KV heads of 128, 128 experts of FFN 1536, 94 layers,
# vocab 151936, untied LM head), BF16
ATTENTION = 4096 * (64 + 2 * 4) * 128 + 64 * 128 * 4096 + 2 * 4096   # QKV, O, two norms: 71,311,360
ROUTER = 4096 * 128                                                 # 524,288, replicated on every rank
EXPERT = 3 * 4096 * 1536                                            # gated MLP: 18,874,368
LAYER = ATTENTION + ROUTER + 128 * EXPERT                           # 2,487,754,752
EMBEDDING = 151936 * 4096                                           # 622,329,856 (and as many in the LM head)


@functools.lru_cache(maxsize=1)
def eight_gpus() -> dict:
    """The plan's candidates on 8 H100s, by (replicas, tp, ep, pp)."""
    return {(s.replicas, s.tp, s.ep, s.pp): s for s in splits(family_dir(GPU), GPU, MODEL, 8)}


def test_ep_memory_per_gpu_by_hand():
    m = load_model(MODEL)
    assert m.layer_params == LAYER
    # TP8-EP8 x PP1: attention / 8, the router whole, 128 / 8 = 16 whole experts per GPU (moe_tp 1)
    per_layer = ATTENTION / 8 + ROUTER + 16 * EXPERT                # 311,428,096
    want = (94 * per_layer + 2 * EMBEDDING / 8) * 2 / GIB          # embedding + LM head on the one stage
    assert abs(weights_gib_per_gpu(m, 8, 1, ep=8) - want) < 1e-9
    assert abs(want - 54.8173) < 1e-4                               # 58,859,646,976 B
    # the same bytes as experts sharded by TP (16 experts' worth, each split 8 ways)
    assert abs(weights_gib_per_gpu(m, 8, 1, ep=1) - want) < 1e-9


def test_candidates_hold_ep_layouts_with_their_kv_pool_by_hand():
    assert moe_layouts(MODEL, 8) == [1, 8] and moe_layouts(MODEL, 1) == [1]
    assert moe_layouts("llama-3.1-70b", 8) == [1]           # a dense model: no EP axis
    got = eight_gpus()
    ep8 = got[(1, 8, 8, 1)]
    assert ep8.reason == "" and ep8.profile.endswith("qwen3-235b-a22b-bf16-kvbf16/tp8-ep8")
    assert got[(1, 4, 4, 2)].reason == "" and got[(1, 8, 1, 1)].reason == ""
    # KV pool per GPU, as SGLang sizes it at mem_fraction 0.9 on the H100's M_init 78.5 GiB: the profile counts
    # the layer's parameters / TP (the router too: 0.02% of the layer), one KV head per GPU (4 heads over 8, replicated)
    weights = (94 * LAYER / 8 + 2 * EMBEDDING / 8) * 2             # 58,773,401,600 B = 54.74 GiB
    cell = 1 * 128 * 94 * 2 * 2                                     # K and V, BF16: 48,128 B per token
    assert ep8.kv_tokens == int(((78.5 - weights / GIB) - 78.5 * 0.1) * GIB // cell)
    assert 354_000 < ep8.kv_tokens < 356_000


def test_infeasible_layouts_refused_in_one_line():
    got = eight_gpus()
    why = got[(2, 4, 4, 1)].reason                  # 2 replicas of TP4-EP4: 235 GB over 4 GPUs each
    assert why.startswith("does not fit: qwen3-235b-a22b on h100-sxm-80gb at TP=4 x PP=1 (EP=4): weights need "
                          "117.6 GB per GPU") and "\n" not in why
    # no TP1 profile is built (the weights fit no 8 GPUs at TP 1): the weights say so, not the missing file
    assert got[(1, 1, 1, 8)].reason.startswith("does not fit: qwen3-235b-a22b on h100-sxm-80gb at TP=1 x PP=8")
    # an EP layout the library lacks (profiles/build_moe.py EP_NOT_BUILT): named with what exists
    why = got[(1, 2, 2, 4)].reason
    assert why.startswith("no profile: no TP2 EP2 profile of qwen3-235b-a22b") and "tp8-ep8" in why


def test_ep_candidate_runs_with_its_profile_layout():
    s = eight_gpus()[(1, 8, 8, 1)]
    slo = SLO(ttft_ms=2000, tpot_ms=200)
    t = deployment_table({"name": "azure-conv-synth", "num_requests": 4}, s.profile, 1, 8, 1, "round-robin",
                         "static-512", slo)
    assert t["parallel"]["ep"] == 8
    assert config_from_table(t, "test").parallel.ep == 8
    dense = deployment_table({"name": "azure-conv-synth"}, "profiles/a100-pcie-40gb/qwen2.5-32b/tp2", 1, 2, 1,
                             "round-robin", "static-512", slo)
    assert "ep" not in dense["parallel"]                  # unchanged tables: the same cache keys as before
    assert label({"tp": 8, "pp": 1, "ep": 8, "replicas": 1, "router": "single", "interconnect": GPU,
                  "policy": "static-512"}) == f"{GPU}: TP8-EP8xPP1 static-512"
    assert Shape(4, 2, s.profile, 1, 4).text() == "TP4-EP4xPP2"


def test_moe_routing_picks_the_skewed_profiles_and_is_refused_for_a_dense_model():
    got = {(s.replicas, s.tp, s.ep, s.pp): s for s in splits(family_dir(GPU), GPU, MODEL, 8,
                                                              routing="power_law_1.2")}
    assert got[(1, 2, 2, 4)].profile.endswith("qwen3-235b-a22b-bf16-kvbf16-power_law_1.2/tp2-ep2")
    assert got[(1, 8, 1, 1)].profile.endswith("-power_law_1.2/tp8")
    assert got[(1, 8, 8, 1)].reason.startswith("no profile: no TP8 EP8 profile of qwen3-235b-a22b (power_law_1.2")
    check_routing(MODEL, "power_law_1.2")
    with pytest.raises(ConfigError, match=r"^--moe-routing power_law_1.2: qwen2.5-32b is not a mixture-of-experts "
                                          r"model; allowed: balanced$"):
        check_routing("qwen2.5-32b", "power_law_1.2")


def test_vllm_v0_has_no_expert_parallelism():
    t = deployment_table({"name": "azure-conv-synth", "num_requests": 4}, eight_gpus()[(1, 8, 8, 1)].profile, 1, 8,
                         1, "round-robin", "default", SLO(ttft_ms=2000, tpot_ms=200), engine="vllm-v0")
    with pytest.raises(ConfigError, match=r"^test: \[parallel\] ep = 8 with engine vllm-v0: vLLM 0\.6\.3 has no "
                                          r"expert parallelism .*PR #14305\); allowed: 1$"):
        config_from_table(t, "test")
    t["scheduler"]["engine"] = "vllm-v1"
    assert config_from_table(t, "test").parallel.ep == 8


def test_max_gpus_shapes_hold_ep_layouts():
    from sim.studies.cluster_plan import shapes_of

    ok, dropped = shapes_of(family_dir(GPU), MODEL, 16, 8, (1, 2))
    have = {(s.tp, s.ep, s.pp) for s in ok}
    assert {(8, 8, 1), (8, 1, 1), (4, 4, 2), (4, 1, 2), (8, 8, 2)} <= have
    assert all(s.text() == f"TP{s.tp}" + (f"-EP{s.ep}" if s.ep > 1 else "") + f"xPP{s.pp}" for s in ok)
    why = {r["deployment"]: r["reason"] for r in dropped}
    assert why["instance TP4-EP4xPP1"].startswith("does not fit: qwen3-235b-a22b on h100-sxm-80gb at TP=4 x PP=1 "
                                                  "(EP=4): weights need 117.6 GB per GPU")
