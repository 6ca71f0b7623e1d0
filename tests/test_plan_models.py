"""`ppsim plan` (issue 39): a candidate whose KV pool, as its engine sizes it, cannot hold the workload's longest
request is refused, not ranked; `--model` takes a profile folder and `--model-config` a config.json, their
missing TP degrees built into the cache; `--gpu` is required unless the model has a hand-built profile on the
default GPU, the same for `--gpus` and `--max-gpus`; `--max-gpus` takes the `--set`s that `--gpus` takes."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from sim.cli import main
from sim.core.config import REPO_ROOT
from sim.core.errors import ConfigError
from sim.core.slo import SLO
from sim.studies.plan import ENGINE_DEFAULT, deployment_table, family_dir, splits

# 3 requests of 12,000 prompt tokens and 16 output tokens: longer than SGLang's pool for Qwen2.5-32B on two
# A100-40GB (11,375 tokens), shorter than FastPP's (37,572) and the 16,384-token context
LONG = ["--workload", "prefill-heavy", "--set", "workload.input_range=[12000,12000]", "--set",
        "workload.output_range=[16,16]", "--set", "workload.num_requests=3", "--rate", "0.1", "--seeds", "1",
        "--quick", "--no-progress"]


def _sglang_tp2_table(context: int | None = None) -> dict:
    t = deployment_table({"name": "prefill-heavy"}, "profiles/a100-pcie-40gb/qwen2.5-32b/tp2", 1, 2, 1, "round-robin",
                         ENGINE_DEFAULT, SLO(ttft_ms=2000, tpot_ms=200), engine="sglang")
    if context:
        t["scheduler"]["context_length_tokens"] = context
    return t


def test_the_pool_refusal_at_its_boundary_by_hand():
    from sim.studies.plan import pool_refusal

    # the engine serves requests of at most pool - 1 tokens (SGLang's max_req_len = min(context - 1, pool - 1))
    why = pool_refusal(_sglang_tp2_table(), 12016, "t")
    kv = int(re.search(r"sizes its KV pool at (\d+) tokens per stage", why).group(1))
    assert kv == 11375 and f"requests of at most {kv - 1} tokens" in why and "longest request has 12016" in why
    assert pool_refusal(_sglang_tp2_table(), kv - 1, "t") == ""          # holds it: kv - 1 >= kv - 1
    assert pool_refusal(_sglang_tp2_table(), kv, "t") != ""              # one token more: cut by the pool
    # beyond the context, the context cuts it first (warned as truncation): only the part within it counts
    assert pool_refusal(_sglang_tp2_table(context=4096), 50_000, "t") == ""     # 4095 <= 11374
    why = pool_refusal(_sglang_tp2_table(context=16384), 50_000, "t")
    assert "16383 within the 16384-token context" in why
    # vLLM V1's pool counts whole 16-token blocks less its null block: Llama-3.1-70B at TP2 on H100s holds 21,584
    # tokens (issue 39's 4x TP2: 21,602 before the blocks, (21602 // 16 - 1) x 16 = 21584), where the plan's own
    # estimate of the split (FastPP's sizing at mem_fraction 0.9) is 32,386: a 21,584-token request is cut, at a
    # context of 32,768
    t = deployment_table({"name": "sharegpt"}, "profiles/built/h100-sxm-80gb/llama-3.1-70b/tp2", 1, 2, 1,
                         "round-robin", ENGINE_DEFAULT, SLO(ttft_ms=2000, tpot_ms=200), engine="vllm-v1")
    t["scheduler"]["context_length_tokens"] = 32768   # (issue 39's 32k prompts)
    assert "vllm-v1 sizes its KV pool at 21584 tokens" in pool_refusal(t, 21584, "t")
    assert pool_refusal(t, 21583, "t") == ""
    from sim.engine.schedulers.vllm_v1 import VllmV1Engine

    with pytest.MonkeyPatch.context() as mp:   # the pool before the blocks: the 21,602 tokens
        mp.setattr(VllmV1Engine, "pool_tokens", lambda self, kv, sc: kv)
        before = int(re.search(r"at (\d+) tokens", pool_refusal(t, 30000, "t")).group(1))
    assert before == 21602 and (before // 16 - 1) * 16 == 21584
    # FastPP's pool on the same GPUs holds it (its mem_fraction is the plan's 0.9)
    t = _sglang_tp2_table()
    t["scheduler"].pop("engine")
    t["scheduler"]["chunk_size_tokens"] = 2048
    assert pool_refusal(t, 12016, "t") == ""


def _csv(out):
    return pd.read_csv(out / "plan.csv")


def test_a_candidate_whose_engine_pool_is_too_small_is_refused_not_ranked(tmp_path, capsys):
    # issue 39: a 32k-prompt plan "met" its SLOs on a deployment whose pool held 21,602 tokens. SGLang's pool for
    # Qwen2.5-32B on 2 A100-40GB (its mem_fraction_static) holds 11,375 tokens: its 12,016-token requests were cut
    out = tmp_path / "p"
    assert main(["plan", "--model", "qwen2.5-32b", "--gpus", "2", "--engine", "fastpp,sglang", "--policies",
                 "static-2048", *LONG, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    df = _csv(out)
    refused = df[(df["engine"] == "sglang") & (df["policy"] == "default")]
    assert len(refused) == 2 and (refused["status"] == "dropped").all() and refused["rank"].isna().all()
    assert refused["reason"].str.contains("sglang sizes its KV pool at 11375 tokens per stage").all()
    assert "ppsim: warning: refused, not ranked: TP2xPP1 [sglang] default" in err
    assert json.loads((out / "plan.json").read_text())["kv_refused"]
    # what fits still runs: FastPP's and SGLang's static-2048 (a smaller step, a larger pool)
    assert set(df.loc[df["status"] == "ok", "engine"]) == {"fastpp", "sglang"}


def test_max_gpus_refuses_the_same_pools(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["plan", "--model", "qwen2.5-32b", "--gpu", "a100-pcie-40gb", "--max-gpus", "2", "--pp", "1,2",
                 "--tp", "1,2", "--engine", "fastpp,sglang", "--policies", "static-2048", *LONG,
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    df = _csv(out)
    refused = df[df["deployment"].str.contains(r"default \[sglang\]", regex=True)]
    assert len(refused) == 2 and (refused["status"] == "dropped").all()
    assert refused["reason"].str.contains("sglang sizes its KV pool at 11375").all()
    assert "refused, not ranked: TP1xPP2 [sglang] default" in err


# -- the default GPU ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [["--gpus", "2"], ["--max-gpus", "2"]])
def test_gpu_is_required_without_a_profile_on_the_default_gpu(tmp_path, capsys, mode):
    # --gpus planned Llama-3.1-8B on the paper's A100-40GB PCIe unasked; --max-gpus on an H100 unasked
    assert main(["plan", "--model", "llama-3.1-8b", *mode, "--rate", "1", "--no-progress",
                 "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--model llama-3.1-8b: no hand-built profile on the default GPU a100-pcie-40gb" in err
    assert "allowed: --gpu NAME" in err and "h100-sxm-80gb" in err and "qwen2.5-14b, qwen2.5-32b" in err


@pytest.mark.parametrize("mode", [["--gpus", "2"], ["--max-gpus", "2"]])
def test_the_default_gpu_is_the_same_in_both_modes_and_said(tmp_path, capsys, monkeypatch, mode):
    import sim.cli.plan as cli_plan

    def stop(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_plan, "run_plan", stop)
    main(["plan", "--model", "qwen2.5-14b", *mode, "--rate", "1", "--quick", "--no-progress",
          "--out", str(tmp_path / "p")])
    gpus = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# gpus:")]
    assert gpus and "a100-pcie-40gb" in gpus[0] and "h100" not in gpus[0]


def test_every_gpu_of_the_specs_is_a_gpu_to_plan_on():
    # h200-sxm has AIConfigurator-built profiles only (profiles/aic/): --gpu h200-sxm was "no such profile family"
    sp = splits(family_dir("h200-sxm"), "h200-sxm", "llama-3.1-8b", 1)
    assert sp[0].profile.startswith("profiles/aic/h200-sxm/") and not sp[0].reason
    with pytest.raises(ConfigError, match="--gpu 'tpu': no such profile family; allowed: a100-pcie-40gb, "):
        family_dir("tpu")


# -- one's own model -----------------------------------------------------------------------------------------------

HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
      "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}


@pytest.fixture
def own_model(tmp_path, monkeypatch):
    """A config.json and its TP1 profile on an A100-40GB PCIe (`ppsim profile build --out`), the cache in tmp."""
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "my-model").mkdir()
    cfg = tmp_path / "my-model" / "config.json"
    cfg.write_text(json.dumps(HF))
    assert main(["profile", "build", "--model-config", str(cfg), "--gpu", "a100-pcie-40gb", "--tp", "1",
                 "--out", str(tmp_path / "mine")]) == 0
    return cfg, tmp_path / "mine"


def test_own_model_at_tp2_is_built_into_the_cache_not_the_checkout(tmp_path, own_model):
    from sim.studies.plan import plan_model

    cfg, folder = own_model
    before = sorted(p for p in (REPO_ROOT / "profiles").rglob("my-model*"))
    # the folder alone: its TP1 profile; TP2 has no architecture to build from, and says how to give one
    m = plan_model(str(folder))
    assert (m.name, m.gpu, m.arch) == ("my-model", "a100-pcie-40gb", None)
    sp = {(s.replicas, s.tp, s.pp): s for s in splits(family_dir(m.gpu), "a100", m, 2)}
    assert sp[(1, 1, 2)].profile == str(folder.resolve()) and not sp[(1, 1, 2)].reason
    assert "has no TP2 profile, and no architecture to build one (give --model-config" in sp[(1, 2, 1)].reason
    # with its config.json: TP2 built into the cache, keyed by the config's content
    m = plan_model(str(folder), str(cfg))
    sp = {(s.replicas, s.tp, s.pp): s for s in splits(family_dir(m.gpu), "a100", m, 2)}
    tp2 = sp[(1, 2, 1)].profile
    assert tp2.startswith(str(tmp_path / "cache" / "profiles" / "a100-pcie-40gb" / "my-model-")) and tp2.endswith("tp2")
    assert not sp[(1, 2, 1)].reason and (REPO_ROOT / "profiles").rglob("my-model*") and \
        sorted((REPO_ROOT / "profiles").rglob("my-model*")) == before


def test_plan_a_model_config_end_to_end(tmp_path, capsys, own_model):
    cfg, _ = own_model
    argv = ["plan", "--model-config", str(cfg), "--gpus", "2", "--rate", "1", "--policies", "static-2048",
            "--set", "workload.num_requests=20", "--slo", "ttft:p90:1", "--seeds", "1", "--quick", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2   # no --gpu: it has no profile on the default GPU
    assert "no hand-built profile on the default GPU" in capsys.readouterr().err
    out = tmp_path / "p"
    assert main([*argv, "--gpu", "a100-pcie-40gb", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# model:        my-model (--model-config" in text
    df = _csv(out)
    assert set(zip(df["tp"], df["pp"], df["replicas"])) == {(1, 2, 1), (2, 1, 1), (1, 1, 2)}
    assert (df["status"] == "ok").all()   # (every split simulated; the 1 ms TTFT SLO keeps the run short)


def test_a_profile_folder_plans_on_its_own_gpu(tmp_path, capsys):
    # `--model <profile folder>` ended in KeyError: 'meets_slo'; later in "no profile in profiles/a100-pcie-40gb"
    out = tmp_path / "p"
    folder = "profiles/built/h100-sxm-80gb/llama-3.1-8b"
    assert main(["plan", "--model", folder, "--gpus", "1", "--rate", "1", "--policies", "static-2048",
                 "--set", "workload.num_requests=20", "--slo", "ttft:p90:1", "--seeds", "1", "--quick",
                 "--no-progress", "--out", str(out)]) == 0
    df = _csv(out)
    assert df["deployment"].str.startswith("h100-sxm-80gb: ").all() and (df["status"] == "ok").all()
    assert json.loads((out / "plan.json").read_text())["model"] == str(REPO_ROOT / folder)
    capsys.readouterr()
    assert main(["plan", "--model", folder, "--gpu", "a100-pcie-40gb", "--gpus", "1", "--rate", "1",
                 "--out", str(tmp_path / "q")]) == 2
    assert "its profiles are for GPU h100-sxm-80gb, not --gpu a100-pcie-40gb" in capsys.readouterr().err


# -- --max-gpus takes the --set of --gpus ------------------------------------------------------------------------

def test_max_gpus_takes_engine_sets(tmp_path, capsys, monkeypatch):
    from sim.studies.sweep import Runner

    seen = []
    real = Runner.run

    def spy(self, tables, *a, **k):
        seen.extend(tables)
        return real(self, tables, *a, **k)

    monkeypatch.setattr(Runner, "run", spy)
    base = ["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--max-gpus", "2", "--pp", "1", "--tp", "1",
            "--rate", "1", "--policies", "static-2048", "--set", "workload.num_requests=20", "--slo", "ttft:p90:1",
            "--seeds", "1", "--quick", "--no-progress"]
    assert main([*base, "--set", "scheduler.max_running_requests=8", "--out", str(tmp_path / "p")]) == 0
    assert seen and {"disaggregation" in t for t in seen} == {True, False}   # co-located and disaggregated runs
    assert all(t["scheduler"]["max_running_requests"] == 8 for t in seen)
    capsys.readouterr()
    for sets, msg in ((["scheduler.engine=sglang"], "scheduler.engine is what the plan chooses (--engine)"),
                      (["scheduler.max_running_requests=-3"], "plan --set (engine fastpp)"),
                      (["parallel.tp=2"], "parallel.tp is what the plan chooses")):
        assert main([*base, *[a for s in sets for a in ("--set", s)], "--out", str(tmp_path / "q")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and msg in err, err
