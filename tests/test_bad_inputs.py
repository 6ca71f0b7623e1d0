"""A catalogue of bad inputs across every command: each is one line on stderr that names the file
or flag, the field and what is allowed; exit code 2 (1 for an internal error); no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from sim.cli import main

from conftest import REPO, TINY_PROFILE

D = str(REPO / "experiments/configs/default.toml")
TINY = ["--set", "workload.num_requests=5"]


def run_set(*sets):
    argv = ["run", D]
    for s in sets:
        argv += ["--set", s]
    return argv + ["--out", "{tmp}/out"]


# (id, argv with {tmp} for the test's folder, strings the one line must contain)
CASES = [
    # --set overrides: the error names the override, the field and what is allowed
    ("pp-over-layers", run_set("parallel.pp=65"), ["--set parallel.pp=65", "pp = 65", "allowed: 1..64"]),
    ("num-requests-exhausts-memory", run_set("workload.num_requests=100000000"),
     ["--set workload.num_requests=100000000", "num_requests", "allowed: 1.."]),
    ("negative-rate", run_set("workload.rate_rps=-2"), ["--set workload.rate_rps=-2", "rate_rps", "must be > 0"]),
    ("zero-pp", run_set("parallel.pp=0"), ["--set parallel.pp=0", "pp must be an integer in [1, 256]"]),
    ("tp-without-profile", run_set("parallel.tp=2"), ["--set parallel.tp=2", "tp = 2", "profile", "tp = 1"]),
    ("negative-seed", run_set("seed=-1"), ["--set seed=-1", "seed", "seed must be an integer in [0, "]),
    ("float-seed", run_set("seed=1.5"), ["--set seed=1.5", "seed must be an integer"]),
    ("negative-horizon", run_set("horizon_s=-1"), ["--set horizon_s=-1", "horizon_s must be a finite number in [0, "]),
    ("model-does-not-fit", run_set("scheduler.mem_fraction=0.1"),
     ["--set scheduler.mem_fraction=0.1", "mem_fraction", "allowed: a larger mem_fraction"]),
    ("mem-fraction-over-1", run_set("scheduler.mem_fraction=1.5"), ["--set scheduler.mem_fraction=1.5", "(0, 1]"]),
    ("bad-on-kv-exhausted", run_set('server.on_kv_exhausted="die"'),
     ["on_kv_exhausted", "one of: exit, retract", "'die'"]),
    ("bad-router", run_set('parallel.router="random"'), ["router", "one of: round-robin, least-loaded"]),
    ("unknown-rebalancer", run_set('scheduler.rebalancer.name="nope"'), ["rebalancer", "'nope'", "allowed: delay-scheduling"]),
    ("unknown-chunk-policy", run_set('scheduler.chunk_policy.name="nope"'), ["chunk policy 'nope'", "allowed: greedy"]),
    ("unknown-latency-kind", run_set('latency.kind="magic"'), ["kind", "one of: profile, constant", "'magic'"]),
    ("constant-zero-stage", run_set('latency.kind="constant"', "latency.stage_ms=0"),
     ["--set latency.stage_ms=0", "stage_ms must be a finite number in (0, "]),
    ("constant-without-pool", run_set('latency.kind="constant"'), ["kv_tokens must be set"]),
    ("override-without-equals", run_set("noequals"), ["--set 'noequals'", "expected key=value"]),
    ("override-into-a-value", run_set("seed.x=3"), ["--set 'seed.x=3'", "'seed' is not a table"]),
    ("section-replaced-by-value", run_set("parallel=3"), ["--set parallel=3", "[parallel] must be a table"]),
    ("zero-requests", run_set("workload.num_requests=0"), ["--set workload.num_requests=0", "positive integer"]),
    ("unknown-workload-kind", run_set('workload.kind="zz"'), ["kind", "'zz'", "allowed: bench, conversation, poisson"]),
    ("unknown-length-source", run_set('workload.lengths.source="bogus"'),
     ["lengths.source", "one of: pairs", "'bogus'"]),
    ("tiny-context", run_set("scheduler.context_length_tokens=2"), ["context_length_tokens must be an integer in [8, "]),
    ("unknown-key", run_set("bogus=1"), ["--set bogus=1", "unknown key 'bogus'", "allowed: seed"]),
    ("unknown-workload", run_set('workload.name="no-such"'), ["workload 'no-such' not found", "allowed: azure-code"]),
    ("missing-profile", run_set('latency.profile="profiles/none"'), ["profiles/none", "meta.toml missing"]),
    # config files, traces, profiles
    ("missing-config", ["run", "{tmp}/none.toml", "--out", "{tmp}/o"], ["none.toml", "config file not found"]),
    ("invalid-toml", ["run", "{tmp}/bad.toml", "--out", "{tmp}/o"], ["bad.toml", "invalid TOML"]),
    ("misspelled-section", ["run", "{tmp}/typo.toml", "--out", "{tmp}/o"], ["typo.toml", "unknown key 'srever'", "allowed:"]),
    ("trace-missing-column", ["run", D, "--set", 'workload.name="{tmp}/trace.toml"', "--out", "{tmp}/o"],
     ["trace.csv", "out"]),
    ("profile-bad-table", ["run", D, "--set", 'latency.profile="{tmp}/prof"', "--set", "parallel.pp=2",
                           "--out", "{tmp}/o"], ["layer_nonattn.csv", "num_tokens", "strictly increasing"]),
    ("profile-missing-section", ["profile", "show", "{tmp}/nomem"], ["meta.toml", "missing section [memory]"]),
    # output folders and flags
    ("out-under-a-file", ["run", D, *TINY, "--out", "{tmp}/afile/sub"], ["--out", "afile", "Not a directory"]),
    ("out-is-a-file", ["run", D, *TINY, "--out", "{tmp}/afile"], ["--out", "afile", "exists and is not a folder"]),
    ("window-reversed", ["run", D, *TINY, "--timeline", "--window", "3:1", "--out", "{tmp}/w"],
     ["--window '3:1'", "END must be after START"]),
    ("window-garbage", ["run", D, *TINY, "--timeline", "--window", "abc", "--out", "{tmp}/w"],
     ["--window 'abc'", "START:END"]),
    ("goodput-rates-garbage", ["goodput", D, "--rates", "x"], ["--rates 'x'", "LO:HI"]),
    ("goodput-rates-zero", ["goodput", D, "--rates", "0:3"], ["--rates '0:3'", "0 < LO <= HI"]),
    ("goodput-jobs-zero", ["goodput", D, "--jobs", "0"], ["--jobs: must be an integer in [1, 4096]"]),
    ("goodput-executor", ["goodput", D, "--executor", "spark"], ["--executor", "one of: process, ray", "'spark'"]),
    ("goodput-tol-negative", ["goodput", D, "--tol", "-1"], ["--tol: must be a finite number in (0, 10]"]),
    ("goodput-seeds-zero", ["goodput", D, "--seeds", "0"], ["--seeds: must be an integer in [1, 1000]"]),
    ("goodput-tol-not-a-number", ["goodput", D, "--tol", "abc"], ["argument --tol", "'abc'", "ppsim goodput --help"]),
    ("goodput-set-names-override", ["goodput", D, "--set", "parallel.replicas=0"],
     ["--set parallel.replicas=0", "replicas must be an integer in [1, 1024]"]),
    ("plan-unknown-model", ["plan", "--model", "nope", "--no-progress"], ["--model 'nope'", "allowed: qwen2.5-14b"]),
    ("plan-unknown-gpu", ["plan", "--gpu", "h100", "--no-progress"], ["--gpu 'h100'", "allowed: a100-pcie-40gb"]),
    ("plan-zero-gpus", ["plan", "--gpus", "0", "--no-progress"], ["--gpus", "must be an integer in [1, 256]"]),
    ("reproduce-unknown", ["reproduce", "fig99", "--out", "{tmp}/r"], ["unknown experiment 'fig99'", "allowed: fig1"]),
    ("reproduce-jobs", ["reproduce", "fig1", "--jobs", "-1", "--out", "{tmp}/r"], ["--jobs: must be an integer in [1, 4096]"]),
    ("workload-stats-unknown", ["workload", "stats", "nope"], ["workload 'nope' not found", "allowed: azure-code"]),
    ("workload-stats-override", ["workload", "stats", "azure-conv-synth", "--set", "rate_rps=0"],
     ["--set rate_rps=0", "rate_rps", "must be > 0"]),
    ("workload-fetch-unknown", ["workload", "fetch", "nope"], ["'nope'", "allowed: azure-code-2023"]),
    ("profile-show-missing", ["profile", "show", "profiles/none"], ["profiles/none", "meta.toml missing"]),
    ("profile-show-pp-zero", ["profile", "show", str(TINY_PROFILE), "--pp", "0"], ["argument --pp", "must be >= 1"]),
    ("profile-show-pp-over-layers", ["profile", "show", str(TINY_PROFILE), "--pp", "5"], ["pp = 5", "allowed: 1..4"]),
    ("report-not-a-run", ["report", "{tmp}"], ["not a run folder", "no summary.json", "ppsim run CONFIG --out"]),
    ("validate-missing-log", ["validate", "--bench-log", "{tmp}/none.jsonl", "--workload", "sharegpt"],
     ["none.jsonl", "bench log not found"]),
    ("validate-bad-units", ["validate", "--bench-log", "{tmp}/afile", "--workload", "sharegpt", "--units", "h"],
     ["--units", "one of: s, ms", "'h'"]),
    ("fidelity-missing-results", ["fidelity", "--results", "{tmp}/none"], ["--results", "none", "not a folder"]),
    ("unknown-command", ["frobnicate"], ["invalid choice: 'frobnicate'", "choose from"]),
    ("no-command", [], ["required: COMMAND"]),
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bad.toml").write_text("seed = [\n")
    (tmp_path / "typo.toml").write_text('[srever]\non_kv_exhausted = "retract"\n[workload]\nname = "sharegpt"\n')
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "trace.csv").write_text("t,in\n0.0,100\n")
    (tmp_path / "trace.toml").write_text(
        f'kind = "trace"\nfile = "{tmp_path / "trace.csv"}"\ncolumns = {{arrival = "t", prompt = "in", output = "out"}}\n'
        'arrival_format = "seconds"\narrivals = "timestamps"\n')
    prof = tmp_path / "prof"
    shutil.copytree(TINY_PROFILE, prof)
    (prof / "layer_nonattn.csv").write_text("num_tokens,layer_nonattn_ms\n128,1.0\n1,1.0\n")
    nomem = tmp_path / "nomem"
    shutil.copytree(TINY_PROFILE, nomem)
    meta = (nomem / "meta.toml").read_text()
    (nomem / "meta.toml").write_text(meta[: meta.index("[memory]")])
    return tmp_path


def test_the_catalogue_has_at_least_40_distinct_inputs():
    assert len({c[0] for c in CASES}) == len(CASES) >= 40
    assert {c[1][0] for c in CASES if c[1]} >= {"run", "goodput", "plan", "reproduce", "workload", "profile",
                                                 "report", "validate", "fidelity"}


@pytest.mark.parametrize("name,argv,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(name, argv, needles, files, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code = main([a.replace("{tmp}", str(files)) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, f"{name}: exit {code}: {err}"
    assert len(lines) == 1, f"{name}: {err}"
    assert "Traceback" not in err and lines[0].startswith("ppsim")
    for needle in needles:
        assert needle in lines[0], f"{name}: {needle!r} not in {lines[0]!r}"


def test_a_bug_is_one_line_and_exit_1(monkeypatch, capsys):
    import sim.cli.list as list_command

    def broken(_args):
        return {}["missing"]

    monkeypatch.setattr(list_command, "cmd_list", broken)
    code = main(["list"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith("ppsim: internal error: KeyError: 'missing' at test_bad_inputs.py:")
    assert "PPSIM_DEBUG=1" in err


class ClosedPipe:
    """A stdout whose reader has left: every write fails as it does on a closed pipe."""

    def write(self, _text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise ValueError("not a file")


@pytest.mark.parametrize("argv", [
    ["list"],
    ["run", D, *TINY, "--out", "{tmp}/p"],
    ["workload", "stats", "azure-conv-synth", "--set", "num_requests=50"],
    ["profile", "show", str(TINY_PROFILE)],
], ids=["list", "run", "workload-stats", "profile-show"])
def test_a_reader_that_leaves_early_is_not_an_error(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 141  # as `cat` ends on SIGPIPE (128 + 13), quietly
    assert capsys.readouterr().err == ""


def test_a_closed_pipe_in_a_real_process_prints_nothing():
    # the reader's end is closed before ppsim writes: the write and the final flush both fail
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "list"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert err == "" and proc.returncode == 141, err


def test_list_piped_into_head():
    out = subprocess.run(["bash", "-c", f"{sys.executable} -m sim.cli list | head -1; exit ${{PIPESTATUS[0]}}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.stdout == "profiles:\n" and out.stderr == "" and out.returncode in (0, 141)
