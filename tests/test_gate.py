"""`ppsim gate`: the paired statistics on constructed numbers (hand-checked), the sides
(schemes and overlays), paired seeds, exit codes, and the CI example's command."""

from __future__ import annotations

import json
import math
import re
import shlex

import pytest

from conftest import REPO
from sim.core import plugins
from sim.cli import main
from sim.core.config import config_from_table, load_table
from sim.engine.run import run
from sim.studies.gate import compare, holds, overall, paired_t_ci, seeds_needed, verdict_of
from sim.cli.gate import parse_margin, side_table
from sim.policies import chunk_policies
from sim.workloads import build_workload

DEFAULT = REPO / "experiments/configs/default.toml"

SMALL_TOML = """\
seed = 1
[parallel]
pp = 2
[scheduler]
chunk_size_tokens = 256
kv_tokens = 50000
chunk_policy = { name = "static" }
[latency]
kind = "constant"
stage_ms = 10.0
[workload]
kind = "synthetic-uniform"
rate_rps = 20.0
num_requests = 60
input_range = [200, 1500]
output_range = [2, 30]
"""


@pytest.fixture(autouse=True)
def isolated_registries(monkeypatch):
    snap = chunk_policies.snapshot()
    monkeypatch.setattr(plugins, "_loaded", {})
    yield
    chunk_policies.restore(snap)


def cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- statistics (hand-checked)

def test_paired_t_interval_by_hand():
    # d = 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.302653 -> half width 4.302653 / sqrt(3) = 2.484138
    mean, lo, hi = paired_t_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert lo == pytest.approx(2 - 2.484138, abs=1e-6) and hi == pytest.approx(2 + 2.484138, abs=1e-6)
    assert paired_t_ci([5.0])[1:] == (-math.inf, math.inf)


def test_verdict_boundaries():
    assert verdict_of(0.01, 3, margin_abs=0.5) == "better"
    assert verdict_of(0.0, 3, margin_abs=0.5) == "no worse"      # a tie at 0 is not "better"
    assert verdict_of(-0.5, 0.2, margin_abs=0.5) == "no worse"   # at most the margin worse
    assert verdict_of(-0.51, 0.2, margin_abs=0.5) == "inconclusive"
    assert verdict_of(-2.0, -0.51, margin_abs=0.5) == "worse"
    assert verdict_of(-2.0, -0.4, margin_abs=0.5) == "inconclusive"  # worse, but maybe within the margin
    assert verdict_of(-2.0, -0.1, margin_abs=0.0) == "worse"
    assert holds("better", "better") and not holds("no worse", "better")
    assert holds("no worse", "no-worse") and holds("better", "no-worse") and not holds("inconclusive", "no-worse")


BASE = [10.0, 10.0, 10.0, 10.0]


@pytest.mark.parametrize("candidate, expect, verdict, ok", [
    ([12.0, 12.5, 11.5, 12.0], "better", "better", True),         # d = 2, 2.5, 1.5, 2: CI [1.35, 2.65]
    ([9.9, 10.1, 9.95, 10.05], "better", "no worse", False),      # CI [-0.145, 0.145], margin 0.5
    ([9.9, 10.1, 9.95, 10.05], "no-worse", "no worse", True),
    ([8.0, 8.2, 7.9, 8.1], "no-worse", "worse", False),           # d about -2: CI far below -0.5
    ([12.0, 7.0, 11.0, 8.0], "no-worse", "inconclusive", False),  # d = 2, -3, 1, -2: CI [-4.29, 3.29]
])
def test_the_four_verdicts(candidate, expect, verdict, ok):
    c = compare(BASE, candidate, higher_is_better=True, expect=expect, margin_frac=0.05)
    assert (c.verdict, c.holds, c.n) == (verdict, ok, 4)
    assert c.margin_abs == pytest.approx(0.5)
    assert c.baseline_mean == 10.0 and c.candidate_mean == pytest.approx(sum(candidate) / 4)


def test_lower_is_better_flips_the_sign():
    c = compare([100.0, 110.0, 90.0], [80.0, 91.0, 69.0], higher_is_better=False, expect="better")
    assert c.mean_improvement == pytest.approx(20.0) and c.verdict == "better" and c.holds
    c = compare([80.0, 91.0, 69.0], [100.0, 110.0, 90.0], higher_is_better=False, expect="better")
    assert c.verdict == "worse" and not c.holds


def test_more_seeds_estimate_by_hand():
    # d = 1, 3: mean 2, sd sqrt(2). N = 4: t(0.975, 3) sqrt(2) / 2 = 2.2504 >= 2;
    # N = 5: t(0.975, 4) sqrt(2) / sqrt(5) = 1.7560 < 2, so 5 seeds in all.
    assert seeds_needed([1.0, 3.0], boundary=0.0) == 5
    c = compare([10.0, 10.0], [11.0, 13.0], higher_is_better=True, expect="better")
    assert c.verdict == "inconclusive" and not c.holds  # CI [-10.7, 14.7] straddles 0 and -0.5
    assert c.more_seeds == 3 and "about 3 more seeds" in c.note and "would hold" in c.note
    # the inconclusive case above sits exactly on the no-worse boundary (mean -0.5 = -margin)
    c = compare(BASE, [12.0, 7.0, 11.0, 8.0], higher_is_better=True, expect="no-worse")
    assert c.more_seeds is None and "unlikely to decide" in c.note
    c = compare([10.0], [12.0], higher_is_better=True, expect="better")
    assert c.verdict == "inconclusive" and "at least 2 seeds" in c.note


def test_missing_values_are_dropped_pairwise():
    c = compare([10.0, None, 10.0, 10.0], [12.0, 12.0, float("nan"), 12.5], higher_is_better=True, expect="better")
    assert c.n == 2 and c.dropped == 2 and c.mean_improvement == pytest.approx(2.25)


def test_overall_is_the_worst_verdict():
    better = compare(BASE, [12.0, 12.5, 11.5, 12.0], True, "better")
    tie = compare(BASE, [9.9, 10.1, 9.95, 10.05], True, "better")
    assert overall([better, better], "better") == ("better", True)
    assert overall([better, tie], "better") == ("no worse", False)


# ---------------------------------------------------------------- sides and pairing

def test_scheme_sides_on_the_default_config():
    base = load_table(DEFAULT)
    base["scheduler"]["rebalancer"] = {"name": "delay-scheduling"}
    _, pp = side_table("PP_2048", base, "--baseline")
    assert pp["parallel"] == {"pp": 4, "tp": 1} and "rebalancer" not in pp["scheduler"]
    assert pp["scheduler"]["chunk_size_tokens"] == 2048 and pp["scheduler"]["chunk_policy"] == {"name": "static"}
    _, tp = side_table("TP", base, "--baseline")
    assert tp["parallel"] == {"pp": 1, "tp": 4} and tp["latency"]["profile"].endswith("qwen2.5-32b/tp4")
    _, ds = side_table("DCP_pred+DS", base, "--candidate")
    assert ds["scheduler"]["rebalancer"] == {"name": "delay-scheduling"}
    assert ds["scheduler"]["chunk_policy"] == {"name": "predictive"} and ds["scheduler"]["chunk_size_tokens"] == 128
    assert all(t["workload"] == base["workload"] and t["slo"] == base["slo"] for t in (pp, tp, ds))


def test_overlay_side(tmp_path):
    (tmp_path / "pol.py").write_text("from sim.policies import chunk_policies\n"
                                     "chunk_policies.register('ov-static')(chunk_policies.get('static'))\n")
    ov = tmp_path / "ov.toml"
    ov.write_text('label = "mine"\n[plugins]\nmodules = ["pol.py"]\n'
                  '[scheduler]\nchunk_policy = { name = "greedy", params = { signal_stat = "p90" } }\n')
    base = load_table(DEFAULT)
    base["scheduler"]["chunk_policy"] = {"name": "static", "params": {"chunk_size_tokens": 7}}
    base["plugins"] = {"modules": ["sim.studies.accuracy"]}  # as --plugin would add it
    label, t = side_table(str(ov), base, "--candidate")
    assert label == "mine"
    assert t["scheduler"]["chunk_policy"] == {"name": "greedy", "params": {"signal_stat": "p90"}}  # not merged
    assert t["plugins"]["modules"] == ["sim.studies.accuracy", str(tmp_path / "pol.py")]
    assert "ov-static" in chunk_policies.names()


def test_paired_seeds_give_both_sides_the_same_arrivals_and_draws(tmp_path, capsys):
    """Seed i: both sides build the same requests; two sides with the same policy (a scheme
    and an overlay spelling it out) give identical results even with latency noise, so the
    gate sees an exact tie."""
    base = load_table(DEFAULT, ["workload.num_requests=60", "latency.noise_cv=0.1"])
    ov = tmp_path / "pp512.toml"
    ov.write_text('[scheduler]\nchunk_size_tokens = 512\nchunk_policy = { name = "static" }\n')
    sides = [side_table("PP_512", base, "--baseline")[1], side_table(str(ov), base, "--candidate")[1],
             side_table("DCP_greedy", base, "--candidate")[1]]
    for seed in (2, 3):
        reqs = [build_workload(dict(s, seed=seed)["workload"], seed=seed) for s in sides]
        assert reqs[0] == reqs[1] == reqs[2]
        r0, r1 = (run(config_from_table(dict(s, seed=seed))) for s in sides[:2])
        assert [q.first_token_s for q in r0.requests] == [q.first_token_s for q in r1.requests]
    assert [q.arrival_s for q in r0.requests] != [q.arrival_s for q in run(config_from_table(dict(sides[0], seed=4))).requests]
    code, out, err = cli(["gate", DEFAULT, "--set", "workload.num_requests=60", "--set", "latency.noise_cv=0.1",
                          "--baseline", "PP_512", "--candidate", ov, "--metric", "p90_ttft", "--expect", "no-worse",
                          "--seeds", "2", "--no-progress", "--out", tmp_path / "g"], capsys)
    assert code == 0, err
    res = json.loads((tmp_path / "g" / "gate.json").read_text())
    c = res["workloads"][0]["comparison"]
    assert c["mean_improvement"] == 0.0 and c["ci_low"] == 0.0 and c["verdict"] == "no worse"
    assert res["seed_list"] == [1, 2]


# ---------------------------------------------------------------- the command and its exit codes

def small(tmp_path):
    p = tmp_path / "small.toml"
    p.write_text(SMALL_TOML)
    return p


def test_gate_exit_codes_and_outputs(tmp_path, capsys):
    """With a constant stage time a bigger chunk only adds throughput: PP_1024 lowers the
    mean E2E of PP_64 on every seed."""
    args = ["gate", small(tmp_path), "--metric", "mean_e2e", "--seeds", "3", "--no-progress"]
    code, out, err = cli(args + ["--baseline", "PP_64", "--candidate", "PP_1024", "--out", tmp_path / "a"], capsys)
    assert code == 0, err
    assert "## PipeSim gate: PASS" in out and "| better |" in out
    res = json.loads((tmp_path / "a" / "gate.json").read_text())
    assert res["overall"] == {"verdict": "better", "holds": True} and res["higher_is_better"] is False
    b, c = res["workloads"][0]["baseline_values"], res["workloads"][0]["candidate_values"]
    assert len(b) == len(c) == 3 and all(x > y for x, y in zip(b, c))
    assert (tmp_path / "a" / "gate.md").read_text().startswith("## PipeSim gate: PASS")
    code, out, err = cli(args + ["--baseline", "PP_1024", "--candidate", "PP_64", "--out", tmp_path / "b"], capsys)
    assert code == 1 and "## PipeSim gate: FAIL" in out and "worse (expectation fails)" in out


def test_gate_with_several_workloads(tmp_path, capsys):
    code, out, err = cli(["gate", DEFAULT, "--set", "workload.num_requests=40", "--baseline", "PP_2048",
                          "--candidate", "PP_256", "--metric", "p90_tpot", "--expect", "no-worse", "--seeds", "2",
                          "--workload", "azure-conv-synth", "--workload", "decode-heavy", "--no-progress",
                          "--out", tmp_path], capsys)
    res = json.loads((tmp_path / "gate.json").read_text())
    assert [w["workload"] for w in res["workloads"]] == ["azure-conv-synth", "decode-heavy"]
    verdicts = [w["comparison"]["verdict"] for w in res["workloads"]]
    assert res["overall"]["verdict"] == min(verdicts, key=["worse", "inconclusive", "no worse", "better"].index)
    assert code == (0 if res["overall"]["holds"] else 1)
    assert out.count("| azure-conv-synth |") == 1 and out.count("| decode-heavy |") == 1


@pytest.mark.parametrize("extra, needles", [
    (["--baseline", "PP_64", "--candidate", "PP_1024", "--margin", "five"], ["--margin 'five'"]),
    (["--baseline", "PP_64", "--candidate", "PP_1024", "--seeds", "0"], ["--seeds: must be an integer in [1, 1000]"]),
    (["--baseline", "XP_64", "--candidate", "PP_1024"], ["--baseline 'XP_64'", "allowed: TP, PP_<c>"]),
    (["--baseline", "PP_64", "--candidate", "nope.toml"], ["--candidate: overlay file not found"]),
    (["--baseline", "TP", "--candidate", "PP_64"], ["--baseline 'TP'", "not a shipped profile"]),
    (["--baseline", "PP_64", "--candidate", "PP_1024", "--rates", "3"], ["--rates '3'"]),
])
def test_gate_bad_input_exits_2(tmp_path, capsys, extra, needles):
    code, out, err = cli(["gate", small(tmp_path), "--metric", "goodput", "--no-progress",
                          "--out", tmp_path / "o", *extra], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)


def test_gate_overlay_may_not_change_what_is_paired(tmp_path, capsys):
    ov = tmp_path / "ov.toml"
    ov.write_text('seed = 3\n[workload]\nrate_rps = 9.0\n')
    code, _, err = cli(["gate", small(tmp_path), "--metric", "mean_e2e", "--baseline", "PP_64", "--candidate", ov,
                        "--out", tmp_path / "o"], capsys)
    assert code == 2 and "may not set seed, workload (the gate pairs seeds" in err
    code, _, err = cli(["gate", small(tmp_path), "--metric", "latency", "--baseline", "PP_64",
                        "--candidate", "PP_64"], capsys)
    assert code == 2 and "invalid choice: 'latency'" in err  # argparse names the allowed metrics
    assert parse_margin("5%") == pytest.approx(0.05) and parse_margin("0.1") == pytest.approx(0.1)


# ---------------------------------------------------------------- the CI example

def example_gate_command() -> list[str]:
    """The `ppsim gate` line of examples/ci/pipesim-gate.yml, with POLICY_DIR = examples/ci."""
    text = (REPO / "examples/ci/pipesim-gate.yml").read_text()
    line = next(ln.strip() for ln in text.splitlines() if ln.strip().startswith("ppsim gate "))
    return shlex.split(line.replace("$POLICY_DIR", str(REPO / "examples/ci")))[1:]


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return args[:i + 1] + [value] + args[i + 2:]


def test_ci_example_gate_command(tmp_path, capsys):
    """The example's exact command, smaller (3 seeds of 100 requests) to keep `make test` fast."""
    args = example_gate_command()
    assert args[:2] == ["gate", str(REPO / "examples/ci/gate.toml")] and "--plugin" in args
    args = _set_flag(_set_flag(args, "--seeds", "3"), "--out", str(tmp_path)) + ["--set", "workload.num_requests=100"]
    code, out, err = cli(args, capsys)
    assert code == 0, (out, err)
    res = json.loads((tmp_path / "gate.json").read_text())
    assert res["candidate"] == "tpot-guard" and res["overall"]["verdict"] == "better"


@pytest.mark.slow
def test_ci_example_gate_full_size_and_swapped(tmp_path, capsys):
    """The done-when of issue 16: exit 0 for the plug-in policy, 1 with the sides swapped."""
    args = _set_flag(example_gate_command(), "--out", str(tmp_path / "a"))
    code, out, err = cli(args, capsys)
    assert code == 0, (out, err)
    b, c = args.index("--baseline"), args.index("--candidate")
    swapped = list(args)
    swapped[b + 1], swapped[c + 1] = args[c + 1], args[b + 1]
    code, out, err = cli(_set_flag(swapped, "--out", str(tmp_path / "b")), capsys)
    assert code == 1 and re.search(r"\| worse", out), out


@pytest.mark.slow
def test_gate_on_ray_loads_the_plugin_on_the_workers(tmp_path, capsys):
    """Ray workers are fresh processes: they import the plug-in named in each point's table."""
    pytest.importorskip("ray")
    plugin = tmp_path / "big_first.py"
    plugin.write_text("from sim.policies import chunk_policies\n"
                      "chunk_policies.register('ray-static')(chunk_policies.get('static'))\n")
    ov = tmp_path / "ov.toml"
    ov.write_text('[scheduler]\nchunk_policy = { name = "ray-static", params = { chunk_size_tokens = 1024 } }\n')
    code, out, err = cli(["gate", small(tmp_path), "--plugin", plugin, "--baseline", "PP_64", "--candidate", ov,
                          "--metric", "mean_e2e", "--seeds", "3", "--executor", "ray", "--jobs", "2",
                          "--no-progress", "--out", tmp_path / "o"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "gate.json").read_text())["overall"]["verdict"] == "better"
