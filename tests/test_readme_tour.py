"""Runs every command of the README's tour (the ```sh tour block) in quick mode."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from sim.cli import main

from conftest import REPO, SHARED_DATA

QUICK = {
    "run": ["--set", "workload.num_requests=40"],
    "goodput": ["--set", "workload.num_requests=40", "--no-progress", "--tol", "0.5"],
    # 2 seeds, not the default 3: CIs still computed; the seeds' runs were most of the tour's time
    "plan": ["--quick", "--set", "workload.num_requests=40", "--no-progress", "--seeds", "2"],
    "reproduce": ["--quick", "--no-progress"],
}


def tour_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```sh tour\n(.*?)```", text, re.S)
    assert block, "README has no ```sh tour block"
    cmds = []
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            cmds.append(line)
    return cmds


def test_tour_has_the_five_steps():
    verbs = [shlex.split(c)[1] for c in tour_commands()]
    for verb in ("run", "goodput", "plan", "reproduce"):
        assert verb in verbs


@pytest.mark.skipif(not (SHARED_DATA / "azure-llm-inference-2023").is_dir(), reason="needs ../shared/data (the Azure trace)")
def test_every_tour_command_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PIPESIM_CACHE", str(SHARED_DATA / "azure-llm-inference-2023"))
    for cmd in tour_commands():
        argv = shlex.split(cmd)
        assert argv[0] == "ppsim"
        argv = argv[1:]
        if argv[:2] == ["workload", "fetch"]:
            # no network in tests: fetch from the shared copy through a file:// URL
            monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "cache"))
            src = SHARED_DATA / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
            argv += ["--url", src.as_uri()]
        argv = [a.replace("runs/", f"{tmp_path}/runs/") for a in argv]
        argv += QUICK.get(argv[0], [])
        if argv[0] in ("reproduce", "plan") and "--out" not in argv:
            argv += ["--out", str(tmp_path / f"out-{argv[0]}")]
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{cmd}: exit {code}: {err[-500:]}"
    assert (tmp_path / "runs/pp4/report.md").is_file()
    assert (tmp_path / "runs/pp4/timeline.json").is_file()
    assert (tmp_path / "out-reproduce/fig1.png").is_file()
    assert os.environ["PIPESIM_CACHE"].endswith("cache")
