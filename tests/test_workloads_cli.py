"""The `workload` command group: list, fetch, stats (--json keys), plot, errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from sim.cli.workload import add_commands, main, parse_set

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
AZURE = SHARED / "azure-llm-inference-2023"
needs_trace = pytest.mark.skipif(not AZURE.is_dir(), reason="../shared/data (the Azure 2023 trace copy) is absent")
KEYS = [
    "count", "duration_s", "rate_rps", "interarrival_cv", "prompt_mean", "prompt_p50", "prompt_p90",
    "prompt_p99", "output_mean", "output_p50", "output_p90", "output_p99",
]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@needs_trace
def test_stats_json_whole_trace_and_row_limit(capsys, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(AZURE))
    rc, out, _ = run(capsys, "workload", "stats", "azure-conv", "--json")
    s = json.loads(out)
    assert rc == 0 and list(s) == KEYS
    assert s["count"] == 19366 and s["prompt_mean"] == pytest.approx(1154.7, abs=0.05)
    rc, out, _ = run(capsys, "workload", "stats", "azure-conv", "--json", "--set", "num_requests=400")
    s = json.loads(out)
    assert s["count"] == 400 and s["output_mean"] == pytest.approx(260.0, abs=0.05)
    assert s["rate_rps"] == pytest.approx(3.762, abs=0.001)
    rc, out, _ = run(capsys, "workload", "stats", "azure-conv-replay", "--as-built", "--json")
    s = json.loads(out)
    assert s["count"] == 4424 and s["rate_rps"] == pytest.approx(4.42, abs=0.01)


def test_stats_table_and_overrides(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    rc, out, _ = run(capsys, "workload", "stats", "cnn", "--set", "num_requests=50", "--set", "lengths.swap=true")
    assert rc == 0
    rows = dict(line.split() for line in out.splitlines())
    assert list(rows) == KEYS and rows["count"] == "50"
    assert float(rows["prompt_mean"]) < 200  # swapped: prompts are highlights


def test_list_shows_every_workload_and_trace_status(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    rc, out, _ = run(capsys, "workload", "list")
    assert rc == 0
    for name in ("azure-conv", "azure-conv-synth", "sharegpt", "cnn-reversed", "decode-heavy", "azure-conv-replay"):
        assert name in out
    assert "trace missing: ppsim workload fetch azure-conv-2023" in out


@needs_trace
def test_fetch_command(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    url = (AZURE / "AzureLLMInferenceTrace_code.csv").as_uri()
    rc, out, _ = run(capsys, "workload", "fetch", "azure-code-2023", "--url", url)
    assert rc == 0 and (tmp_path / "AzureLLMInferenceTrace_code.csv").is_file()
    rc, _, err = run(capsys, "workload", "fetch", "azure-conv-2023", "--url", url)
    assert rc == 2 and err.count("\n") == 1 and "SHA-256 mismatch" in err


def test_plot_writes_pngs(capsys, tmp_path):
    rc, out, _ = run(capsys, "workload", "plot", "prefill-heavy", "--out", str(tmp_path / "plots"),
                     "--set", "num_requests=200")
    assert rc == 0
    for suffix in ("lengths", "arrivals"):
        png = tmp_path / "plots" / f"prefill-heavy-{suffix}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["workload", "stats", "nope"], "allowed: azure-code"),
        (["workload", "stats", "cnn", "--set", "rate_rps=0"], "'rate_rps'"),
        (["workload", "stats", "cnn", "--set", "oops"], "expected key=value"),
        (["workload", "fetch", "nope"], "unknown download id"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, needle):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1 and needle in err


def test_missing_trace_message(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    rc, _, err = run(capsys, "workload", "stats", "azure-conv")
    assert rc == 2 and "ppsim workload fetch azure-conv-2023" in err and err.count("\n") == 1


def test_plugs_into_an_outside_parser_with_examples():
    parser = argparse.ArgumentParser(prog="ppsim")
    sub = parser.add_subparsers(dest="command")
    add_commands(sub)
    args = parser.parse_args(["workload", "stats", "cnn", "--json", "--seed", "3"])
    assert callable(args.func) and args.json and args.seed == 3
    wl = sub.choices["workload"]
    for name, action in wl._subparsers._group_actions[0].choices.items():
        assert "examples:" in action.format_help(), name


def test_parse_set():
    assert parse_set(["a=1", "b=x", "c=[1, 2]", "d.e=true", "d.f=0.5", 'g="s p"']) == {
        "a": 1, "b": "x", "c": [1, 2], "d": {"e": True, "f": 0.5}, "g": "s p",
    }
    with pytest.raises(ConfigError):
        parse_set(["a=1", "a.b=2"])
