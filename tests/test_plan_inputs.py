"""`ppsim plan`'s inputs (issue 39): the engine overrides `run` accepts, every engine with its own knobs,
truncation said and recorded, pools too small refused, models given as a folder or a config file."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim.cli import main
from sim.studies.plan import (ENGINE_POLICIES, POLICIES, deployment_table, engine_overrides, plan_overrides,
                              policies_for)
from sim.core.slo import SLO

NO_RUN = ["--rate", "100000", "--seeds", "1", "--quick", "--no-progress"]  # every candidate pruned: nothing runs


def _one_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], err


def test_plan_takes_the_engine_overrides_run_takes():
    wl, eng = plan_overrides(["workload.num_requests=40", "workload.columns.arrival=t",
                              "scheduler.max_running_requests=64", "scheduler.schedule_policy=\"lpm\""])
    assert wl == {"num_requests": 40, "columns": {"arrival": "t"}}
    assert eng == ("scheduler.max_running_requests=64", 'scheduler.schedule_policy="lpm"')
    # an SGLang knob goes to SGLang's runs only when the plan has SGLang; every engine gets the shared ones
    assert engine_overrides(eng, "fastpp", ["fastpp", "sglang"]) == ("scheduler.max_running_requests=64",)
    assert engine_overrides(eng, "sglang", ["fastpp", "sglang"]) == eng
    t = deployment_table({"name": "sharegpt"}, "p", 1, 1, 1, "round-robin", "static-512", SLO(ttft_ms=1.0),
                         overrides=eng)
    assert t["scheduler"]["max_running_requests"] == 64 and t["scheduler"]["chunk_size_tokens"] == 512
    for bad, msg in (("parallel.pp=2", "parallel.pp is what the plan chooses"),
                     ("scheduler.engine=\"sglang\"", "--engine"), ("plugins.modules=[]", "'plugins' is no section")):
        with pytest.raises(Exception, match=msg):
            plan_overrides([bad])


@pytest.mark.parametrize("argv, needles", [
    # validated as `ppsim run` validates it, before anything runs, blamed on the --set
    (["--set", "scheduler.max_running_requests=-1"], ["--set scheduler.max_running_requests=-1", "max_running_requests"]),
    (["--set", "scheduler.schedule_policy=\"lpm\""], ["schedule_policy", "engine 'sglang' only"]),
    (["--set", "scheduler.context_length_tokens=999999"], ["context_length_tokens", "exceeds the model's context"]),
    (["--set", "parallel.tp=2"], ["--set 'parallel.tp=2'", "what the plan chooses"]),
])
def test_plan_refuses_bad_engine_overrides_in_one_line(tmp_path, capsys, argv, needles):
    assert main(["plan", "--model", "qwen2.5-14b", "--gpus", "1", "--rate", "1", "--no-progress",
                 "--out", str(tmp_path / "p"), *argv]) == 2
    _one_line(capsys.readouterr().err, *needles)


def test_every_engine_is_planned_with_its_own_knobs():
    assert policies_for({"engine": "fastpp"}) == list(POLICIES)
    for eng in ("sglang", "vllm-v1", "vllm-v0"):
        got = policies_for({"engine": eng})
        assert got == list(ENGINE_POLICIES[eng]) and not {"greedy", "predictive", "predictive+DS"} & set(got)
    # the paper's policies elsewhere only when asked, labelled; never the rebalancer's
    assert policies_for({"engine": "vllm-v1"}, ("predictive", "predictive+DS", "static-512")) == \
        ["default", "static-512", "what-if:predictive"]
    assert policies_for({"engine": "vllm-v0"}, ("predictive",)) == ["default"]
    assert policies_for({"engine": "fastpp"}, ("greedy",)) == ["greedy"]


def test_plan_takes_every_engine_and_drops_what_one_cannot_run(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["plan", "--model", "qwen2.5-14b", "--gpus", "2", "--engine", "fastpp,sglang,vllm-v1,vllm-v0",
                 *NO_RUN, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vllm-v0: default" in text and "sglang: default, static-512, static-2048" in text
    df = pd.read_csv(out / "plan.csv")
    assert set(df["engine"]) == {"fastpp", "sglang", "vllm-v1", "vllm-v0"}
    v0 = df[(df["engine"] == "vllm-v0") & (df["pp"] > 1)]
    assert len(v0) and (v0["status"] == "dropped").all() and v0["reason"].str.contains("pp = 1 only").all()


def test_truncation_is_warned_and_recorded(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["plan", "--model", "qwen2.5-14b", "--gpus", "1", "--rate", "0.5", "--seeds", "1", "--quick",
                 "--set", "workload.num_requests=20", "--set", "scheduler.context_length_tokens=256",
                 "--policies", "static-512", "--no-progress", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    doc = json.loads((out / "plan.json").read_text())
    assert doc["truncation"] and doc["truncation"][0]["context_length_tokens"] == 256
    assert doc["truncation"][0]["truncated_prompts"] + doc["truncation"][0]["clipped_outputs"] > 0
    assert "cut requests to their context or KV pool" in err
