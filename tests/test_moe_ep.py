"""Expert parallelism inside one node (issue 44; sim/core/ep.py, sim/latency/moe_routing.py `busiest_rank`,
sim/profiling/moe.py at ep > 1): the layouts a config may ask for, the memory per GPU, the busiest rank's load,
one layer's combine all-reduce and the shipped EP profiles, each against a hand calculation."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.errors import ConfigError, DataError
from sim.latency.moe_routing import busiest_of, busiest_rank, touched_experts
from sim.profiling.specs import load_model

GIB = 1 << 30
EP_DIR = "profiles/moe/h100-sxm-80gb/vllm"
aic_only = pytest.mark.skipif(__import__("importlib").util.find_spec("aiconfigurator_core") is None,
                              reason="aiconfigurator-core not installed (the optional extra pipesim[aic])")


def _table(**parallel):
    return {"seed": 1, "parallel": {"tp": 2, **parallel}, "scheduler": {"engine": "vllm-v1"},
            "latency": {"profile": f"{EP_DIR}/mixtral-8x7b-bf16-kvbf16/tp2-ep2"},
            "workload": {"kind": "synthetic-uniform", "num_requests": 4, "rate_rps": 50.0,
                         "input_range": [50, 200], "output_range": [3, 10]}}


@pytest.mark.parametrize("parallel, needle", [
    ({"tp": 4, "ep": 2}, r"\[parallel\] ep = 2 with tp = 4: allowed: 1 \(experts sharded by TP\) or 4"),
    ({"ep": 4}, r"\[parallel\] ep = 4 with tp = 2"),
    ({"ep": 2, "attention_dp": 2}, r"\[parallel\] attention_dp = 2: data-parallel attention is not modelled"),
    ({"ep": 0}, r"\[parallel\] ep"),
])
def test_unmodelled_layouts_are_one_line_errors(parallel, needle):
    from sim.core.config import config_from_table

    with pytest.raises(ConfigError, match=needle) as e:
        config_from_table(_table(**parallel), "cfg.toml")
    assert "\n" not in str(e.value) and str(e.value).startswith("cfg.toml: ")


def test_ep_across_nodes_and_with_disaggregation_is_refused():
    from sim.core.ep import check_ep_placement

    with pytest.raises(ConfigError, match=r"ep = 8: expert parallelism across nodes is not modelled; allowed: at "
                                          r"most \[cluster\] gpus_per_node \(4\)"):
        check_ep_placement(8, {"nodes": 2, "gpus_per_node": 4, "network": "ib"}, False, "cfg.toml")
    check_ep_placement(8, {"nodes": 2, "gpus_per_node": 8, "network": "ib"}, False, "cfg.toml")
    with pytest.raises(ConfigError, match=r"\[parallel\] ep = 2 does not apply with \[disaggregation\]"):
        check_ep_placement(2, None, True, "cfg.toml")


def test_absent_ep_leaves_the_echoed_config_unchanged():
    from sim.core.config import config_from_table

    t = _table()
    t["latency"]["profile"] = f"{EP_DIR}/mixtral-8x7b-bf16-kvbf16/tp2"
    assert "ep" not in config_from_table(t, "cfg.toml").to_dict()["parallel"]
    assert config_from_table(_table(ep=2), "cfg.toml").to_dict()["parallel"]["ep"] == 2


def test_run_refuses_a_profile_of_another_layout():
    from sim.core.config import config_from_table
    from sim.engine.run import build_latency

    t = _table()          # ep absent = 1, an EP profile
    with pytest.raises(ConfigError, match=r"\[parallel\] ep = 1 but profile .*tp2-ep2 is for ep = 2"):
        build_latency(config_from_table(t, "cfg.toml"))
    t = _table(ep=2)
    t["latency"]["profile"] = f"{EP_DIR}/mixtral-8x7b-bf16-kvbf16/tp2"
    with pytest.raises(ConfigError, match=r"ep = 2 but profile .*tp2 is for ep = 1"):
        build_latency(config_from_table(t, "cfg.toml"))
    from sim.core.ep import check_profile_ep

    with pytest.raises(ConfigError, match="not a mixture-of-experts profile; allowed: 1"):
        check_profile_ep(2, {"model": {}}, "dense")


def test_memory_per_gpu_holds_experts_over_ep_whole():
    """Mixtral-8x7B at tp = ep = 2: each GPU holds attention / 2, the router, and 8 / 2 = 4 whole experts; the
    TP-sharded layout holds 8 halves: the same bytes but the replicated router's (the run counts the router over
    TP in both, 32768 x (1 - 1/2) parameters a layer, 1 MiB over 32 layers in BF16)."""
    from sim.latency.profiled import Profile, kv_capacity_tokens

    m = load_model("mixtral-8x7b")
    attn, expert, router = 41_951_232, 176_160_768, 4096 * 8
    ep_layer = m.layer_params_per_gpu(2, moe_tp=1, ep=2)
    assert ep_layer == attn / 2 + router + 4 * expert
    assert ep_layer - m.layer_params_per_gpu(2) == 0          # 4 whole experts = 8 halves
    assert m.layer_params / 2 - ep_layer == -router / 2        # the run's count: router over TP
    prof = Profile.load(f"{EP_DIR}/mixtral-8x7b-bf16-kvbf16/tp2-ep2")
    moe = prof.meta["moe"]
    assert (moe["moe_tp"], moe["ep"]) == (1, 2)
    m_init = prof.meta["memory"]["m_init_gib"]
    weights = 32 * m.layer_params / 2 * 2 + 2 * 32000 * 4096 / 2 * 2
    cell = 4 * 128 * 32 * 2 * 2                       # 8 KV heads / TP 2, K and V, 32 layers, bf16
    want = int(((m_init - weights / GIB) - m_init * (1 - 0.9)) * GIB // cell)
    assert kv_capacity_tokens(prof, 1, 0.9) == want
    twin = Profile.load(f"{EP_DIR}/mixtral-8x7b-bf16-kvbf16/tp2")
    assert kv_capacity_tokens(twin, 1, 0.9) == want  # same pool: the same weights per GPU


def test_busiest_rank_by_hand():
    # 8 experts over ep 2: ranks {0..3} {4..7}; slots 3 0 1 1 | 0 0 2 1 -> loads 5, 3: rank 0, 5 slots, 3 experts
    slots = np.array([3, 0, 1, 1, 0, 0, 2, 1])
    assert busiest_of(slots, 2) == (5, 3)
    # ep 4: loads 3, 2, 0, 3: the first of the equal largest (the collector's argmax), rank 0: 3 slots, 1 expert
    assert busiest_of(slots, 4) == (3, 1)
    assert busiest_of(slots, 1) == (8, 5)
    # balanced: every rank T k / ep slots and the uniform expectation's share of experts
    assert busiest_rank(8, 2, 4, 2, "balanced") == pytest.approx((4.0, 8 * (1 - 0.75 ** 4) / 2))
    # ep 1 is the whole layer under any routing
    s, t = busiest_rank(128, 8, 16, 1, "power_law_1.2")
    assert s == 128 and t == pytest.approx(touched_experts(128, 8, 16, "power_law_1.2"))
    # skew: the busiest rank carries more than its share and never more than all; at ep = E one expert
    s, t = busiest_rank(8, 2, 256, 2, "power_law_1.2")
    assert 256 < s <= 512 and t <= 4
    assert busiest_rank(8, 2, 256, 8, "power_law_1.2")[1] == 1.0
    with pytest.raises(DataError, match="ep 3: must divide the 8 experts"):
        busiest_rank(8, 2, 4, 3)


def test_ep_floor_reads_the_busiest_ranks_whole_experts():
    """The EP roofline floor at one token, Mixtral ep 2, balanced: 1 slot of 2 on the busiest rank (2 / 2), one
    whole expert's weights (8 (1 - 0.75) / 2 = 1 expert) over HBM bandwidth."""
    from sim.latency.hardware import load_gpu
    from sim.profiling.moe import expert_floor_ms

    m, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm-80gb")
    f = expert_floor_ms(m, np.array([1]), gpu, 2, gpu.peak_tflops("bf16"), 1, "balanced", ep=2)[0]
    assert f == pytest.approx(176_160_768 * 2 / (gpu.hbm_bw_gbps * 1e9) * 1e3)
    # the TP-sharded twin reads both touched experts' halves: 2 x expert / 2, the same bytes
    g = expert_floor_ms(m, np.array([1]), gpu, 2, gpu.peak_tflops("bf16"), 2, "balanced")[0]
    assert g == pytest.approx(f)


def test_one_combine_is_one_all_reduce_over_the_tp_group():
    """vLLM's EP at data-parallel size 1 has no dispatch and one all-reduce of the layer's output over the TP
    group (sim/core/ep.py): a step of T tokens pays 2 all-reduces a layer (attention's and the combine), each of
    T x hidden x 2 bytes, read from the profile's all-reduce table at num_workers = tp."""
    from sim.latency.base import BatchStats
    from sim.latency.profiled import Profile, ProfiledLatencyModel, comm_curve

    prof = Profile.load(f"{EP_DIR}/qwen3-30b-a3b-bf16-kvbf16/tp4-ep4")
    lat = ProfiledLatencyModel(prof, 1)
    t = 64
    size = t * 2048 * 2
    want = comm_curve(prof, "all_reduce", 4)(size) / 1e3
    assert lat.comm_model == "table"
    ar = lat.allreduce_s(t)
    assert ar == pytest.approx(lat._comm_floor(want, 2 * 3 / 4 * size)) and ar >= want
    st = BatchStats(num_decode=t, sum_decode_ctx=500 * t)
    # 48 layers; one stage, so no send, and the last stage's logits gather
    assert lat.stage_time(st, 0).comm_s == pytest.approx(2 * 48 * ar + lat.logits_gather_s(t))
    # the TP-sharded twin pays the same: EP at dp 1 changes the experts' time, not the collectives
    assert ProfiledLatencyModel(Profile.load(f"{EP_DIR}/qwen3-30b-a3b-bf16-kvbf16/tp4"), 1).allreduce_s(t) == ar


def test_ep_profile_experts_are_the_tables_busiest_rank_rows():
    """At token counts the table measured, the EP profile's expert time is the median of AIConfigurator's
    (moe_tp 1, ep) rows: under power_law_1.2 the collector's rank 0 after the busiest rank is swapped into it."""
    import pandas as pd

    pytest.importorskip("aiconfigurator_core")
    from sim.profiling.aic import AicData

    aic = AicData("h100_sxm")
    df = pd.read_parquet(aic.data / "moe" / "vllm" / aic.version / "moe_perf.parquet")
    for dist, folder in (("balanced", "qwen3-30b-a3b-bf16-kvbf16"),
                         ("power_law_1.2", "qwen3-30b-a3b-bf16-kvbf16-power_law_1.2")):
        rows = df[(df.kernel_source == "vllm_unquantizedfusedmoe_triton_tritonexperts") & (df.hidden_size == 2048)
                  & (df.inter_size == 768) & (df.topk == 8) & (df.num_experts == 128) & (df.moe_tp_size == 1)
                  & (df.moe_ep_size == 4) & (df.distribution == dist)]
        lay = pd.read_csv(f"{EP_DIR}/{folder}/tp4-ep4/layer_nonattn.csv", index_col="num_tokens")
        meta = (__import__("pathlib").Path(EP_DIR) / folder / "tp4-ep4" / "meta.toml").read_text()
        assert "moe_tp 1, ep 4" in meta and "EP / TP-sharded layout" in meta
        # the shipped profiles keep the compact columns: the layer total less the parts the twin shares
        twin = pd.read_csv(f"{EP_DIR}/{folder}/tp4/layer_nonattn.csv", index_col="num_tokens")
        tp_rows = df[(df.kernel_source == "vllm_unquantizedfusedmoe_triton_tritonexperts") & (df.hidden_size == 2048)
                     & (df.inter_size == 768) & (df.topk == 8) & (df.num_experts == 128) & (df.moe_tp_size == 4)
                     & (df.moe_ep_size == 1) & (df.distribution == dist)]
        for t in (1, 256, 4096):
            ep_ms = rows[rows.num_tokens == t].latency.median()
            tp_ms = tp_rows[tp_rows.num_tokens == t].latency.median()
            diff = lay.loc[t, "layer_nonattn_ms"] - twin.loc[t, "layer_nonattn_ms"]
            assert diff == pytest.approx(ep_ms - tp_ms, abs=2e-4)


@aic_only
def test_ep_builder_refuses_other_layouts(tmp_path):
    from sim.latency.hardware import load_gpu
    from sim.profiling.aic import AicData
    from sim.profiling.moe import build_moe_profile

    with pytest.raises(DataError, match=r"--ep 2: allowed: 1 or the TP degree \(4\)"):
        build_moe_profile(load_model("mixtral-8x7b"), load_gpu("h100-sxm-80gb"), 4, tmp_path / "p",
                          aic=AicData("h100_sxm"), ep=2)


@pytest.mark.parametrize("folder", ["mixtral-8x7b-bf16-kvbf16/tp2-ep2",
                                    "qwen3-30b-a3b-bf16-kvbf16-power_law_1.2/tp4-ep4"])
def test_ep_profiles_run_under_the_engine(folder):
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import request_columns

    tp = int(folder.split("-ep")[1])
    t = _table(tp=tp, ep=tp)
    t["latency"]["profile"] = f"{EP_DIR}/{folder}"
    res = run(config_from_table(t, "test"), keep_iterations=False)
    assert res.status == "ok" and len(request_columns(res)["status"]) == 4


def test_slowest_rank_sets_the_ep_floor_under_skew():
    """Mixtral ep 2, power_law_1.2, 4096 tokens (compute bound): the floor is the busiest rank's slots s x 2 x
    expert parameters over the BF16 peak, s / (T k / ep) times the mean rank's, which the TP-sharded layout's
    floor equals (T k slots each split over 2 GPUs)."""
    from sim.latency.hardware import load_gpu
    from sim.profiling.moe import expert_floor_ms

    m, gpu = load_model("mixtral-8x7b"), load_gpu("h100-sxm-80gb")
    peak = gpu.peak_tflops("bf16")
    s, _ = busiest_rank(8, 2, 4096, 2, "power_law_1.2")
    ep = expert_floor_ms(m, np.array([4096]), gpu, 2, peak, 1, "power_law_1.2", ep=2)[0]
    assert ep == pytest.approx(2 * s * 176_160_768 / (peak * 1e12) * 1e3)
    tp = expert_floor_ms(m, np.array([4096]), gpu, 2, peak, 2, "power_law_1.2")[0]
    assert ep / tp == pytest.approx(s / (4096 * 2 / 2)) and s > 4096
    # deterministic: the same seeded draws every call
    assert busiest_rank(8, 2, 4096, 2, "power_law_1.2") == (s, _)


@aic_only
def test_cli_ep_flag_refuses_unmodelled_layouts(tmp_path, capsys):
    from sim.cli import main as ppsim

    rc = ppsim(["profile", "build", "--data", "aic", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm-80gb",
                "--tp", "4", "--ep", "2", "--out", str(tmp_path / "p")])
    assert rc == 2 and "--ep 2: allowed: 1 or the TP degree (4)" in capsys.readouterr().err
    rc = ppsim(["profile", "build", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb", "--tp", "2", "--ep", "2",
                "--out", str(tmp_path / "q")])
    assert rc == 2 and "allowed: with --data aic" in capsys.readouterr().err


def test_the_runs_context_names_the_ep_layout():
    from sim.core.config import config_from_table
    from sim.outputs.context import describe

    assert describe(config_from_table(_table(ep=2), "cfg.toml"))["deployment"].startswith(
        "TP2 (EP2: experts split whole over the TP group) x PP1 x 1 replica = 2 GPUs")
    t = _table()
    t["latency"]["profile"] = f"{EP_DIR}/mixtral-8x7b-bf16-kvbf16/tp2"
    assert describe(config_from_table(t, "cfg.toml"))["deployment"].startswith("TP2 x PP1 x 1 replica = 2 GPUs")
