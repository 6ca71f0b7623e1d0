"""`ppsim profile build`: specs as data, config.json parsing, built profiles, the library and the
built-vs-hand-built comparison."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO
from sim.cli import main as ppsim
from sim.core.errors import DataError
from sim.profiling.build import BUILT_DIR, build_profile, built_dir
from sim.profiling.library import built_profile_lines, check_weights, resolve_profile
from sim.latency.profiled import Profile, ProfiledLatencyModel
from sim.latency.hardware import gpu_names, interconnect_names, load_gpu, load_interconnect
from sim.profiling.specs import load_model, model_from_hf_config, model_names, weights_gib_per_gpu

HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
      "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}


def hf_config(tmp_path, name="my-model", **changes) -> str:
    cfg = {**HF, **changes}
    for k, v in changes.items():
        if v is None:
            del cfg[k]
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d / "config.json")


def one_line_error(capsys, argv) -> str:
    assert ppsim(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppsim: error: ") and err.count("\n") == 1, err
    return err


# -- specs ------------------------------------------------------------------------------------------------------

def test_shipped_specs_parse():
    assert {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b",
            "mistral-7b", "codellama-34b"} <= set(model_names())
    assert {"a100-pcie-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "a40-48gb"} <= set(gpu_names())
    assert {"pcie-p2p-disabled", "pcie-nvlink-pairs", "nvswitch"} <= set(interconnect_names())
    for m in model_names():
        load_model(m)
    for g in gpu_names():
        load_gpu(g)
    for ic in interconnect_names():
        load_interconnect(ic)


def test_layer_params_match_the_hand_built_profiles():
    # profiles/README.md: 487,605,248 (32B) and 275,268,608 (14B), QKV bias included.
    assert load_model("qwen2.5-32b").layer_params == 487_605_248
    assert load_model("qwen2.5-14b").layer_params == 275_268_608
    for m in ("qwen2.5-32b", "qwen2.5-14b"):
        meta = Profile.load(REPO / "profiles" / "a100-pcie-40gb" / m / "tp1").meta["model"]
        assert meta["embedding_params"] == load_model(m).embedding_params


def test_weights_by_hand_and_the_fit_error():
    # Llama-3.1-70B: 80 x 855,654,400 + 2 x 128256 x 8192 = 70,553,698,304 params, 141.1 GB in bf16.
    m = load_model("llama-3.1-70b")
    assert m.layer_params == 855_654_400
    assert weights_gib_per_gpu(m, 1, 1) * (1 << 30) == pytest.approx(70_553_698_304 * 2)
    with pytest.raises(DataError, match=r"weights need 141\.1 GB per GPU, have 41\.9"):
        check_weights("llama-3.1-70b", "a100-pcie-40gb", 1, 1)
    check_weights("llama-3.1-70b", "a100-pcie-40gb", 2, 2)      # 35.3 GB per GPU < 0.9 x 41.9


def test_hf_config_parses(tmp_path):
    m = model_from_hf_config(hf_config(tmp_path))
    assert (m.name, m.num_layers, m.hidden_size, m.num_q_heads, m.num_kv_heads, m.head_dim) == \
        ("my-model", 16, 2048, 32, 8, 64)
    assert not m.qkv_bias and m.gated_mlp
    q = model_from_hf_config(hf_config(tmp_path, "q", model_type="qwen2"))
    assert q.qkv_bias                      # Qwen2 has a QKV bias without a config key
    mha = model_from_hf_config(hf_config(tmp_path, "mha", num_key_value_heads=None))
    assert mha.num_kv_heads == 32          # absent -> as many KV heads as query heads


@pytest.mark.parametrize("change, field", [
    ({"num_local_experts": 8}, "num_local_experts"),
    ({"n_routed_experts": 64}, "n_routed_experts"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"intermediate_size": None}, "intermediate_size"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
])
def test_bad_config_json_is_one_line_exit_2(tmp_path, capsys, change, field):
    cfg = hf_config(tmp_path, **change)
    err = one_line_error(capsys, ["profile", "build", "--model-config", cfg, "--gpu", "h100-sxm-80gb", "--tp", "1",
                                  "--out", str(tmp_path / "out")])
    assert repr(field) in err


def test_not_json_is_one_line(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    err = one_line_error(capsys, ["profile", "build", "--model-config", str(p), "--gpu", "h100-sxm-80gb", "--tp",
                                  "1", "--out", str(tmp_path / "o")])
    assert "not valid JSON" in err


@pytest.mark.parametrize("argv, words", [
    (["--model", "qwen2.5-32b", "--gpu", "b200", "--tp", "1"], ["--gpu 'b200'", "a100-pcie-40gb"]),
    (["--model", "qwen2.5-7b", "--gpu", "a100-pcie-40gb", "--tp", "8"], ["--tp 8", "28 q / 4 kv", "allowed: 1, 2, 4"]),
    (["--model", "gpt-5", "--gpu", "a100-pcie-40gb", "--tp", "1"], ["--model 'gpt-5'", "qwen2.5-32b"]),
    (["--model", "mistral-7b", "--gpu", "a40-48gb", "--interconnect", "nvswitch", "--tp", "2"],
     ["'nvswitch'", "pcie-nvlink-pairs"]),
    (["--model", "mistral-7b", "--gpu", "a40-48gb", "--interconnect", "infiniband", "--tp", "2"],
     ["--interconnect 'infiniband'", "nvswitch"]),
])
def test_bad_build_arguments(tmp_path, capsys, argv, words):
    err = one_line_error(capsys, ["profile", "build", *argv, "--out", str(tmp_path / "o")])
    for w in words:
        assert w in err


# -- built profiles ----------------------------------------------------------------------------------------------

def test_build_from_config_json_then_run_pp2_on_h100(tmp_path, capsys):
    """The issue's 'done when': a hand-written config.json -> h100 TP2 profile -> ppsim run at PP=2."""
    cfg = hf_config(tmp_path)
    out = tmp_path / "prof"
    assert ppsim(["profile", "build", "--model-config", cfg, "--gpu", "h100-sxm-80gb", "--tp", "2",
                  "--out", str(out)]) == 0
    meta = Profile.load(out).meta
    assert meta["profile"]["source"] == "built" and meta["profile"]["attention"] == "scaled"
    assert meta["profile"]["model"] == "my-model" and meta["profile"]["tp"] == 2
    assert meta["comm"]["model"] == "alpha-beta" and not (out / "comm.csv").exists()
    assert any("vidur-profiles/compute/h100" in s for s in meta["profile"]["sources"])
    run_dir = tmp_path / "run"
    rc = ppsim(["run", "experiments/configs/default.toml", "--set", "parallel.pp=2", "--set", "parallel.tp=2",
                "--set", f"latency.profile={out}", "--set", "workload.num_requests=40", "--out", str(run_dir)])
    assert rc == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_finished"] == 40
    assert summary["profile_source"].startswith("built from Vidur measured kernels (h100 data)")
    assert "attention scaled" in summary["profile_source"]
    assert ppsim(["report", str(run_dir)]) == 0
    assert "attention scaled" in (run_dir / "report.md").read_text()


def test_hand_built_run_says_so(tmp_path):
    from sim.core.config import load_config
    from sim.profiling.provenance import profile_source

    cfg = load_config(REPO / "experiments" / "configs" / "default.toml", [])
    assert profile_source(cfg).startswith("hand-built: A100-80GB (Vidur profile) on A100-40GB-PCIe")


def test_built_profile_composes_by_hand(tmp_path):
    """Stage time of a built profile = the kernel model's layer sum x layers, with the meta's scaling."""
    from sim.latency.base import BatchStats
    from sim.profiling.kernels import KernelModel

    m = load_model("mistral-7b")
    prof = build_profile(m, load_gpu("a100-sxm-80gb"), load_interconnect("nvswitch"), 1, tmp_path / "p")
    km = KernelModel.load("a100")
    layer = km.layer_table(m.kernel_arch, 1)
    lat = ProfiledLatencyModel(prof, 2)
    st = BatchStats.prefill(512)
    # grid lookup (512 is a grid point; running maximum), s = 1: 16 layers x (layer(512) + attention(512, 0))
    pre, _, _ = km.attention(m.kernel_arch, 1)
    att_ms = pre["a_ms"] + pre["b_c"] * 512 + pre["b_c2"] * 512 ** 2
    want = 16 * (float(layer["layer_nonattn_ms"].cummax().loc[512]) + att_ms)
    got = lat.stage_time(st, 0)
    assert (got.linear_s + got.attention_s) * 1e3 == pytest.approx(want, rel=2e-4)
    # LM head = GEMM model at vocab x hidden, 1 token
    assert prof.meta["overhead"]["lm_head_ms"] == pytest.approx(float(km.gemm_ms(32000, 4096)[0]), abs=1e-4)
    # NVSwitch fits from the a100 kernel file
    assert prof.meta["comm"]["p2p_bw_gbps"] == km.meta["comm"]["nvswitch"]["send_recv"]["bw_gbps"]


def test_built_profiles_carry_the_hand_built_ground_truth(tmp_path):
    """[ground_truth]: the calibrated Qwen2.5-32B A100 PCIe values, sm_count from the GPU TOML, marked as transferred."""
    hand = Profile.load(REPO / "profiles" / "a100-pcie-40gb" / "qwen2.5-32b" / "tp1").meta["ground_truth"]
    prof = build_profile(load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_interconnect("nvswitch"), 1,
                         tmp_path)
    gt = prof.meta["ground_truth"]
    assert {k: v for k, v in gt.items() if k not in ("sm_count", "source")} == \
        {k: v for k, v in hand.items() if k != "sm_count"}
    assert gt["sm_count"] == 132 and load_gpu("a40-48gb").sm_count == 84
    assert "transferred from the calibrated Qwen2.5-32B A100 PCIe profile" in gt["source"]
    assert "assumed for other models/GPUs" in gt["source"]
    assert prof.ground_truth()["slow_prob"] == hand["slow_prob"] > 0


def test_ground_truth_keys_are_copied_not_listed(tmp_path, monkeypatch):
    import sim.profiling.build as b

    src = tmp_path / "profiles" / b.GROUND_TRUTH_PROFILE
    src.parent.mkdir(parents=True)
    src.write_text("[ground_truth]\njitter_cv = 0.05\nsome_new_key = 0.3\nsm_count = 108\n")
    monkeypatch.setattr(b, "PROFILES", tmp_path / "profiles")
    gt = b.ground_truth_section(load_gpu("a40-48gb"))
    assert gt["some_new_key"] == 0.3 and gt["jitter_cv"] == 0.05 and gt["sm_count"] == 84


def test_pcie_builds_share_the_calibration():
    import tomllib

    meta = Profile.load(BUILT_DIR / "a100-pcie-40gb" / "qwen2.5-32b" / "tp4").meta
    fits = {f["param"]: f["value"] for f in tomllib.loads((REPO / "profiles" / "fits.toml").read_text())["fit"]}
    tp_fit = tomllib.loads((REPO / "profiles" / "fits_tp.toml").read_text())["fit"][0]
    assert meta["scaling"]["s_mem"] == fits["s_mem"] and meta["overhead"]["cpu_ms"] == fits["cpu_ms"]
    assert meta["comm"]["allreduce_busbw_gbps"] == tp_fit["value"]


@pytest.mark.parametrize("gpu, model, tp", [("a100-pcie-40gb", "qwen2.5-32b", 8), ("a40-48gb", "llama-3.1-8b", 2),
                                            ("h100-sxm-80gb", "qwen2.5-7b", 4)])
def test_shipped_library_is_up_to_date(tmp_path, gpu, model, tp):
    g = load_gpu(gpu)
    ic = load_interconnect(g.default_interconnect)
    build_profile(load_model(model), g, ic, tp, tmp_path, compact=True)
    shipped = built_dir(BUILT_DIR, g, ic.name, model, tp)
    for f in ("layer_nonattn.csv", "attention.csv", "meta.toml"):
        assert (tmp_path / f).read_text() == (shipped / f).read_text(), f"rerun: ppsim profile build --all ({f})"


def test_ppsim_list_shows_built_profiles(capsys):
    assert ppsim(["list"]) == 0
    out = capsys.readouterr().out
    assert "profiles/built/h100-sxm-80gb/llama-3.1-70b/tp{1,2,4,8} (attention scaled)" in out
    assert any("qwen2.5-7b/tp{1,2,4}" in line for line in built_profile_lines())


def test_resolve_profile_order(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    hand = resolve_profile("qwen2.5-32b", "a100-pcie-40gb", 2, None)
    assert hand == REPO / "profiles" / "a100-pcie-40gb" / "qwen2.5-32b" / "tp2"
    assert resolve_profile("qwen2.5-32b", "a100-pcie-40gb", 8, "pcie-p2p-disabled") == \
        BUILT_DIR / "a100-pcie-40gb" / "qwen2.5-32b" / "tp8"
    cached = resolve_profile("mistral-7b", "h100-sxm-80gb", 2, "pcie-nvlink-pairs")
    assert cached == tmp_path / "profiles" / "h100-sxm-80gb-pcie-nvlink-pairs" / "mistral-7b" / "tp2"
    assert Profile.load(cached).meta["profile"]["source"] == "built"
    with pytest.raises(DataError, match="allowed: 1, 2, 4"):
        resolve_profile("qwen2.5-7b", "h100-sxm-80gb", 8, None)


def test_tp8_on_nvlink_pairs_is_marked_extrapolated(tmp_path):
    prof = build_profile(load_model("llama-3.1-70b"), load_gpu("a40-48gb"), load_interconnect("pcie-nvlink-pairs"),
                         8, tmp_path)
    comm = prof.meta["derivation"]["comm"]
    assert "borrowed from the a100 fit" in comm and "4-GPU all-reduce fit" in comm and "extrapolated" in comm


# -- consistency with the hand-built profiles ----------------------------------------------------------------------

def test_built_matches_hand_built_within_tolerance(tmp_path):
    sys.path.insert(0, str(REPO / "profiles"))
    try:
        from compare_built import TOLERANCE, compare
    finally:
        sys.path.pop(0)
    df = compare(tmp_path)
    assert len(df) == 6 * (len([t for t in Profile.load(REPO / "profiles/a100-pcie-40gb/qwen2.5-32b/tp1").grid
                                if t <= 2048]) + 3 * 256)
    worst = df.loc[df["rel_err"].abs().idxmax()]
    assert abs(worst["rel_err"]) <= TOLERANCE, worst.to_dict()
