"""Which kernel data a run or plan by GPU name takes (sim.profiling.library.choose_profile): the engine's era
on a GPU both sources cover (AIConfigurator's for vllm-v1 and sglang, Vidur's for fastpp and vllm-v0), the
explicit override, the fallback to Vidur where the AIC library lacks the shape, and the one-line errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from sim.core.errors import ConfigError, DataError
from sim.profiling.library import ENGINE_KERNEL_DATA, choose_profile, engine_profile

REPO = Path(__file__).resolve().parents[1]
H100 = "h100-sxm-80gb"
VIDUR_70B = REPO / "profiles" / "built" / H100 / "llama-3.1-70b" / "tp4"
AIC_70B = REPO / "profiles" / "aic" / H100 / "vllm" / "llama-3.1-70b-bf16-kvbf16" / "tp4"


@pytest.mark.parametrize("engine, path, source", [("vllm-v1", AIC_70B, "aic"), ("sglang", AIC_70B, "aic"),
                                                  ("fastpp", VIDUR_70B, "vidur"), ("vllm-v0", VIDUR_70B, "vidur"),
                                                  (None, VIDUR_70B, "vidur")])
def test_the_engines_era_picks_the_source_on_the_h100(engine, path, source):
    c = choose_profile("llama-3.1-70b", H100, 4, engine=engine)
    assert (c.path, c.kernel_data, c.note) == (path, source, "")


def test_an_explicit_source_wins_over_the_era():
    assert choose_profile("llama-3.1-70b", H100, 4, engine="vllm-v1", kernel_data="vidur").path == VIDUR_70B
    assert choose_profile("llama-3.1-70b", H100, 4, engine="fastpp", kernel_data="aic").path == AIC_70B
    # FP8 is AIC's alone: a 2024 engine in FP8 takes it, an explicit Vidur is refused
    fp8 = choose_profile("llama-3.1-70b", H100, 4, engine="fastpp", weight_dtype="fp8", kv_dtype="fp8")
    assert fp8.path == AIC_70B.parent.parent / "llama-3.1-70b-fp8-kvfp8" / "tp4"
    with pytest.raises(ConfigError, match=r"^--kernel-data 'vidur': Vidur's kernel data is BF16 only.*allowed"):
        choose_profile("llama-3.1-70b", H100, 4, kernel_data="vidur", weight_dtype="fp8", where="--kernel-data")


def test_a_shape_the_aic_library_lacks_falls_back_to_vidur_and_says_so():
    # Llama-3.1-405B in BF16 is not in the AIC H100 library (810 GB of weights on 8 x 80 GB)
    c = choose_profile("llama-3.1-405b", H100, 8, engine="vllm-v1")
    assert c.kernel_data == "vidur" and c.path == REPO / "profiles" / "built" / H100 / "llama-3.1-405b" / "tp8"
    assert "no llama-3.1-405b-bf16-kvbf16 profile on h100-sxm-80gb" in c.note and "\n" not in c.note
    # a GPU AIC has no profiles of at all: Vidur's, no note (nothing the user could have expected)
    a100 = choose_profile("llama-3.1-8b", "a100-sxm-80gb", 1, engine="sglang")
    assert a100.kernel_data == "vidur" and a100.note == ""
    # a non-default interconnect: AIC measured one NVSwitch node
    assert choose_profile("mistral-7b", H100, 2, "pcie-nvlink-pairs", engine="vllm-v1").kernel_data == "vidur"


def test_a_tp_the_aic_library_lacks_for_a_model_it_has_is_named(tmp_path, monkeypatch):
    from sim.profiling import library

    have = tmp_path / H100 / "vllm" / "llama-3.1-8b-bf16-kvbf16" / "tp1"
    have.mkdir(parents=True)
    (have / "meta.toml").write_text("")
    monkeypatch.setattr(library, "AIC_DIR", tmp_path)
    assert choose_profile("llama-3.1-8b", H100, 1, engine="vllm-v1").path == have
    c = choose_profile("llama-3.1-8b", H100, 2, engine="vllm-v1")
    assert c.kernel_data == "vidur" and "no llama-3.1-8b-bf16-kvbf16 TP2 profile on h100-sxm-80gb" in c.note


def test_bad_or_impossible_sources_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"^--kernel-data 'cuda': allowed: vidur, aic$"):
        choose_profile("llama-3.1-70b", H100, 4, kernel_data="cuda", where="--kernel-data")
    with pytest.raises(ConfigError, match=r"^kernel_data 'vidur': Vidur measured no h200-sxm; allowed: aic$"):
        choose_profile("llama-3.1-70b", "h200-sxm", 4, kernel_data="vidur")
    with pytest.raises(DataError, match=r"^kernel_data 'aic': AIConfigurator's library has no a100-sxm-80gb"):
        choose_profile("llama-3.1-8b", "a100-sxm-80gb", 1, kernel_data="aic")
    with pytest.raises(ConfigError, match=r"^weight dtype 'fp4': allowed: bf16, fp8$"):
        choose_profile("llama-3.1-8b", H100, 1, weight_dtype="fp4")


def test_every_built_in_engine_has_an_era():
    from sim.core.config import ENGINES

    assert set(ENGINE_KERNEL_DATA) == set(ENGINES)


def test_engine_profile_keeps_the_familys_spelling_where_vidur_is_chosen():
    built = "profiles/built/h100-sxm-80gb/llama-3.1-70b/tp4"
    assert engine_profile(built, "fastpp") == (built, "")
    assert engine_profile(built, "vllm-v1") == ("profiles/aic/h100-sxm-80gb/vllm/llama-3.1-70b-bf16-kvbf16/tp4", "")
    hand = "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"  # a hand-built family: A100, Vidur's alone
    assert engine_profile(hand, "sglang") == (hand, "")
    with pytest.raises(ConfigError, match=r"^--kernel-data 'aic': /tmp/mine/tp1 is not a library profile"):
        engine_profile("/tmp/mine/tp1", "sglang", "aic")


def test_a_plan_by_gpu_name_gives_each_engine_its_eras_profile(tmp_path):
    # every candidate pruned (rate far past every bound): no simulation, only the resolution
    from sim.cli import main

    def profiles(*extra):
        out = tmp_path / "-".join(("p",) + extra)
        assert main(["plan", "--model", "llama-3.1-8b", "--gpu", H100, "--gpus", "2", "--quick", "--rate", "100000",
                     "--engine", "fastpp,vllm-v1", "--seeds", "1", "--no-progress", "--out", str(out), *extra]) == 0
        df = pd.read_csv(out / "plan.csv")
        return {e: set(df.loc[df["engine"] == e, "profile"]) for e in ("fastpp", "vllm-v1")}

    got = profiles()
    assert all(p.startswith("profiles/built/h100-sxm-80gb/llama-3.1-8b/") for p in got["fastpp"])
    assert all(p.startswith("profiles/aic/h100-sxm-80gb/vllm/llama-3.1-8b-bf16-kvbf16/") for p in got["vllm-v1"])
    forced = profiles("--kernel-data", "vidur")
    assert forced["vllm-v1"] == got["fastpp"]


def test_validation_cases_take_the_data_of_the_era_that_ran():
    spec = importlib.util.spec_from_file_location("validation_run", REPO / "experiments" / "validation" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    by_id = run.case_by_id(run.load_cases())
    a5 = by_id["A5"]["sim"]  # SGLang 0.3.0 (2024) replayed on PipeSim's sglang 0.5.23 scheduler
    assert a5["profile"] == "profiles/built/h100-sxm-80gb/llama-3.1-70b/tp4" and a5["data"] == "Vidur BF16"
    assert "2024" in a5["data_why"] and "would default to aic" in a5["data_why"]
    j1 = by_id["J1"]["sim"]  # vLLM 0.10.2 (InferenceMAX) in FP8 on the H100
    assert j1["data"] == "AIC FP8" and j1["data_why"] == "the default for vllm-v1"
    g1 = by_id["G1"]["sim"]  # vLLM 0.20.1 on an A100 40GB: no AIC profile
    assert g1["data"] == "Vidur BF16" and "lacks (a100-pcie-40gb)" in g1["data_why"]


def test_a_plans_fallback_is_one_warning_on_stderr(tmp_path, capsys, monkeypatch):
    # vllm-v1 on Llama-3.1-405B in BF16 on H100s: no AIC profile at any TP, Vidur's instead, said once
    import json

    from sim.cli import main

    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "cache"))  # TP1-TP4 are built there (not shipped)

    out = tmp_path / "p"
    assert main(["plan", "--model", "llama-3.1-405b", "--gpu", H100, "--gpus", "8", "--quick", "--rate", "100000",
                 "--engine", "vllm-v1", "--seeds", "1", "--no-progress", "--out", str(out)]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "AIConfigurator" in ln]
    assert len(err) == 1 and err[0].startswith("ppsim: warning: vllm-v1 takes AIConfigurator's kernel data")
    assert "no llama-3.1-405b-bf16-kvbf16 profile on h100-sxm-80gb" in err[0] and err[0].endswith("Vidur's data instead")
    assert json.loads((out / "plan.json").read_text())["kernel_data_notes"] == [err[0].removeprefix("ppsim: warning: ")]


def test_a_users_own_model_keeps_its_vidur_built_profile(monkeypatch, tmp_path):
    """plan --model-config builds a model with no model file into the cache: engine_profile must not look
    for its architecture (it ended the plan in 'no profile and no architecture'); a current engine is told
    why it runs on Vidur's data, and an explicit 'aic' is refused."""
    from sim.profiling import library

    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    for root in (library.cache_root(), library.BUILT_DIR):
        path = str(root / H100 / "my-model-0123abcd" / "tp2")
        if library._library_key(Path(path)) is None:
            continue
        assert engine_profile(path, "fastpp") == (path, "")
        p, note = engine_profile(path, "vllm-v1")
        assert p == path and "Vidur-built (from its config.json)" in note
        with pytest.raises(ConfigError, match="no model file"):
            engine_profile(path, "vllm-v1", "aic")
        break
    else:
        pytest.fail("no library root recognised")
