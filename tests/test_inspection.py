"""Run inspection (timeline, report), capacity planning, and `ppsim list`."""

from __future__ import annotations

import json

import pandas as pd

from sim.cli import main

from conftest import REPO

DEFAULT = str(REPO / "experiments/configs/default.toml")
SMALL = ["--set", "workload.num_requests=30"]


def test_timeline_has_a_track_per_stage_and_a_slice_per_microbatch(tmp_path, capsys):
    assert main(["run", DEFAULT, *SMALL, "--timeline", "--window", "1:2", "--out", str(tmp_path)]) == 0
    trace = json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in trace if e.get("name") == "thread_name"}
    assert tracks == {"stage 0", "stage 1", "stage 2", "stage 3", "scheduler"}
    slices = [e for e in trace if e["ph"] == "X"]
    it = pd.read_csv(tmp_path / "iterations.csv")
    busy = it[[f"stage{s}_busy_ms" for s in range(4)]].to_numpy()
    assert len(slices) == int((busy > 0).sum())
    first = slices[0]
    assert {"tokens", "decode_requests", "chunk"} <= set(first["args"])
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def test_bad_window_is_one_line(tmp_path, capsys):
    assert main(["run", DEFAULT, *SMALL, "--timeline", "--window", "5", "--out", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_report_summarises_a_run(tmp_path, capsys):
    assert main(["run", DEFAULT, *SMALL, "--out", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "| ttft |" in md and "busy fraction" in md
    assert (tmp_path / "report.png").stat().st_size > 1000
    assert main(["report", str(tmp_path / "nope")]) == 2


def test_plan_bad_model_is_one_line(tmp_path, capsys):
    assert main(["plan", "--model", "gpt-5", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "qwen2.5-32b" in err


def test_list_shows_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for needle in ("a100-pcie-40gb/qwen2.5-32b/tp1", "azure-conv-synth", "static", "greedy", "fig9"):
        assert needle in out
