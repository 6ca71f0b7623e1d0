"""The command line: outputs, determinism, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from sim.cli import main

from conftest import REPO

SMALL = [
    "--set", "workload.num_requests=40", "--set", "workload.rate_rps=4.0",
]


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_run_writes_outputs(tmp_path, capsys):
    code, out, err = run_cli(["run", str(REPO / "experiments/configs/default.toml"), *SMALL,
                              "--out", str(tmp_path)], capsys)
    assert code == 0, err
    for name in ("summary.json", "requests.csv", "iterations.csv", "config.toml"):
        assert (tmp_path / name).is_file()
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("p90_ttft_ms", "p90_tpot_ms", "p90_e2e_ms", "slo_attainment", "num_requests", "num_finished", "status"):
        assert key in summary
    assert summary["num_requests"] == summary["num_finished"] == 40
    req = pd.read_csv(tmp_path / "requests.csv")
    assert len(req) == 40 and (req["status"] == "finished").all()
    it = pd.read_csv(tmp_path / "iterations.csv")
    assert {"stage0_busy_ms", "stage3_idle_ms", "kv_used_tokens", "iter_ms"} <= set(it.columns)
    assert "p90_ttft_ms" in out


def test_same_seed_gives_byte_identical_outputs(tmp_path, capsys):
    dirs = []
    for i in range(2):
        d = tmp_path / f"r{i}"
        code, _, err = run_cli(["run", str(REPO / "experiments/configs/default.toml"), *SMALL, "--out", str(d)], capsys)
        assert code == 0, err
        dirs.append(d)
    for name in ("summary.json", "requests.csv", "iterations.csv", "config.toml"):
        assert (dirs[0] / name).read_bytes() == (dirs[1] / name).read_bytes(), name
    d = tmp_path / "other"
    run_cli(["run", str(REPO / "experiments/configs/default.toml"), *SMALL, "--set", "seed=2", "--out", str(d)], capsys)
    assert (d / "requests.csv").read_bytes() != (dirs[0] / "requests.csv").read_bytes()


BAD = [
    (["--set", "bogus=1"], "unknown key 'bogus'"),
    (["--set", "parallel.pp=0"], "pp must be an integer in [1, 256]"),
    (["--set", "parallel.pp=\"four\""], "pp must be an integer"),
    (["--set", "workload.rate_rps=-2"], "rate_rps"),
    (["--set", "scheduler.chunk_policy.name=\"nope\""], "unknown chunk policy 'nope'"),
    (["--set", "scheduler.surprise=3"], "unknown key 'surprise'"),
    (["--set", "latency.kind=\"magic\""], "kind must be one of"),
    (["--set", "workload.name=\"no-such-workload\""], "workload 'no-such-workload' not found"),
    (["--set", "latency.profile=\"profiles/none\""], "meta.toml missing"),
    (["--set", "slo.ttft_ms=-100"], "_ms must be a finite number in (0, "),
    (["--set", "slo.tpot_ms=0"], "_ms must be a finite number in (0, "),
    (["--set", "slo.stop_when_met=true"], "stop_when_met needs stop_when_violated = true"),
]


@pytest.mark.parametrize("extra,needle", BAD)
def test_bad_config_is_one_line_and_exit_2(tmp_path, capsys, extra, needle):
    code, out, err = run_cli(["run", str(REPO / "experiments/configs/default.toml"), *extra, "--out", str(tmp_path)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppsim: error:"), err
    assert needle in lines[0]


def test_bad_toml_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = [\n")
    code, _, err = run_cli(["run", str(bad), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and str(bad) in err and len(err.strip().splitlines()) == 1


def test_console_script_help_lists_examples():
    out = subprocess.run([sys.executable, "-m", "sim.cli", "run", "--help"], capture_output=True, text=True, check=True)
    assert "examples:" in out.stdout


@pytest.mark.parametrize("command", ["run", "list", "workload", "profile", "reproduce", "goodput", "validate",
                                     "report", "plan", "fidelity"])
def test_every_subcommand_help_lists_examples(command, capsys):
    with pytest.raises(SystemExit) as exc:
        from sim.cli import build_parser

        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_unknown_command_exits_2(capsys):
    assert main(["frobnicate"]) == 2


@pytest.mark.parametrize("argv,needle", [
    (["reproduce", "fig99"], "unknown experiment 'fig99'"),
    (["plan", "--slo-ttft-ms", "-5", "--no-progress"], "--slo-ttft-ms: must be a finite number in (0, "),
    (["goodput", str(REPO / "experiments/configs/default.toml"), "--rates", "0:3"], "need 0 < LO <= HI"),
])
def test_bad_command_arguments_are_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    code = main([*argv, "--out", str(tmp_path)] if argv[0] != "goodput" else argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_unknown_scheme_names_the_allowed_ones():
    from sim.core.errors import ConfigError
    from sim.core.schemes import scheme_table

    with pytest.raises(ConfigError, match="unknown scheme 'DCP_magic'; allowed: TP, PP_<c>"):
        scheme_table("DCP_magic", "qwen2.5-32b", {"name": "sharegpt"})


def test_malformed_user_trace_in_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    trace = tmp_path / "mine.csv"
    trace.write_text("t,in,out\n0.0,100,20\n0.5,-3,20\n")
    wl = tmp_path / "mine.toml"
    wl.write_text(f'kind = "trace"\nfile = "{trace}"\ncolumns = {{arrival = "t", prompt = "in", output = "out"}}\n'
                  'arrival_format = "seconds"\narrivals = "timestamps"\n')
    code = main(["run", str(REPO / "experiments/configs/default.toml"), "--set", f'workload.name="{wl}"',
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "mine.csv" in err and "line 3" in err, err
