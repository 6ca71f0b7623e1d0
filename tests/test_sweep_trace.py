"""benchmarks/sweep_trace.py: the breakdown adds each task's seconds to its round's label, its
status and its kind of run (a hand count on a three-task trace)."""

from __future__ import annotations

import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import sweep_trace  # noqa: E402


def test_report_adds_each_task_to_its_round_status_and_kind(tmp_path):
    tables = {
        "a": {"workload": {"name": "cnn"}, "scheduler": {"chunk_policy": {"name": "predictive"}},
              "slo": {"tpot_ms": 40.0}},
        "b": {"workload": {"name": "cnn"}, "scheduler": {}},
        "c": {"workload": {"name": "cnn"}, "scheduler": {}},
    }
    cache = tmp_path / "points.jsonl"
    cache.write_text("".join(json.dumps({"id": k, "table": t, "summary": {}}) + "\n" for k, t in tables.items()))
    log = tmp_path / "trace.jsonl"
    lines = [
        {"worker": 1, "t0": 10.0, "t1": 13.0, "pids": ["a"], "status": ["met"], "iters": [10]},
        {"worker": 2, "t0": 13.5, "t1": 14.5, "pids": ["b", "c"], "status": ["ok", "ok"], "iters": [5, 5]},
        {"desc": "fig12: bisect", "t0": 10.0, "t1": 13.2, "pids": ["a"]},
        {"desc": "fig12: sweep", "t0": 13.4, "t1": 14.6, "pids": ["b", "c"]},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = sweep_trace.report(log, cache)
    assert "2 simulation tasks, 4.0 worker-seconds; rounds spanned 4.6 s" in text
    assert "     3.0 s  75.0%  n=    1  fig12: bisect" in text
    assert "     1.0 s  25.0%  n=    1  fig12: sweep" in text
    assert "     3.0 s  75.0%  n=    1  fig12 / met" in text
    assert "     3.0 s  75.0%  n=    1  fig12 / cnn / predictive / tpot 40 ms" in text
    assert "     1.0 s  25.0%  n=    1  fig12 / cnn / static" in text
