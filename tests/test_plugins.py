"""User plug-ins: loading from a file, a module, an entry point and a config's [plugins]
table; every plug-in error is one line naming the plug-in and the rule (exit 2); plug-ins
load in worker processes from the point's config table."""

from __future__ import annotations

import multiprocessing
import textwrap

import pytest

from conftest import REPO
from sim.core import plugins
from sim.cli import main
from sim.core.config import config_from_table, load_config
from sim.engine.run import run
from sim.core.errors import PluginError
from sim.policies import API_VERSION, chunk_policies, rebalancers

SMALL_TOML = """\
seed = 1
[parallel]
pp = 2
[scheduler]
chunk_size_tokens = 256
kv_tokens = 50000
chunk_policy = {{ name = "{policy}" }}
[latency]
kind = "constant"
stage_ms = 10.0
[workload]
kind = "synthetic-uniform"
rate_rps = 5.0
num_requests = 20
input_range = [10, 600]
output_range = [2, 30]
"""

GOOD = """\
from sim.policies import ChunkDecision, chunk_policies

@chunk_policies.register("{name}")
class Halving:
    def __init__(self, context, floor=32):
        self.chunk, self.floor = context.launch_chunk_tokens, floor
    def initial_chunk(self):
        return self.chunk
    def decide(self, view):
        if view.step and view.step % 10 == 0:
            self.chunk = max(self.floor, self.chunk // 2)
            return ChunkDecision(self.chunk, "halve")
        return None
"""


@pytest.fixture(autouse=True)
def isolated_registries(monkeypatch):
    """Registrations and loaded plug-ins of a test do not leak into the next one."""
    snaps = [chunk_policies.snapshot(), rebalancers.snapshot()]
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setattr(plugins, "_entry_points_done", True)  # tests that need them reset this
    yield
    chunk_policies.restore(snaps[0])
    rebalancers.restore(snaps[1])


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def small_config(tmp_path, policy, extra=""):
    return write(tmp_path / "small.toml", SMALL_TOML.format(policy=policy) + extra)


def cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_api_version_is_published():
    assert isinstance(API_VERSION, int) and API_VERSION >= 1
    assert f"API_VERSION = {API_VERSION}" in (REPO / "sim/policies/API.md").read_text()


def test_file_plugin_runs_with_ppsim_run_and_is_listed(tmp_path, capsys):
    (tmp_path / "outside").mkdir()
    plugin = write(tmp_path / "outside" / "halving.py", GOOD.format(name="halving"))
    cfg = small_config(tmp_path, "halving")
    code, out, err = cli(["run", cfg, "--plugin", plugin, "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    decisions = (tmp_path / "run" / "decisions.csv").read_text().splitlines()
    assert len(decisions) > 1 and all(line.endswith(",halve") for line in decisions[1:])
    assert str(plugin) in (tmp_path / "run" / "config.toml").read_text()  # the resolved config records it
    code, out, err = cli(["list", "--plugin", plugin], capsys)
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["halving"].endswith(f"(file {plugin})")
    assert lines["static"].endswith("(built-in)") and lines["delay-scheduling"].endswith("(built-in)")


def test_module_plugin(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    write(pkg / "__init__.py", "")
    write(pkg / "pol.py", GOOD.format(name="halving-mod"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.load_all(["mypkg.pol"]) == ["module mypkg.pol"]
    assert chunk_policies.origin("halving-mod") == "module mypkg.pol"
    assert plugins.load("mypkg.pol") == "module mypkg.pol"  # idempotent: no "taken" error
    r = run(load_config(small_config(tmp_path, "halving-mod")))
    assert r.status == "ok" and r.decisions


def test_entry_point_plugins(tmp_path, monkeypatch):
    """A tiny installed distribution (a dist-info folder on sys.path) advertises one policy
    by class and one rebalancer module that registers itself."""
    write(tmp_path / "ep_pol.py", GOOD.format(name="unused-name").replace("@chunk_policies.register", "#"))
    write(tmp_path / "ep_reb.py", """
from sim.policies import rebalancers

class NoMoves:
    def __init__(self, context):
        pass
    def rebalance(self, view):
        return []

rebalancers.register("ep-nomoves")(NoMoves)
""")
    dist = tmp_path / "pipesim_ep_demo-0.1.dist-info"
    dist.mkdir()
    write(dist / "METADATA", "Metadata-Version: 2.1\nName: pipesim-ep-demo\nVersion: 0.1\n")
    write(dist / "entry_points.txt", "[pipesim.chunk_policies]\nep-halving = ep_pol:Halving\n\n"
                                     "[pipesim.rebalancers]\nep-nomoves = ep_reb\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    plugins.load_all()
    assert chunk_policies.origin("ep-halving") == "entry point ep-halving = ep_pol:Halving (pipesim.chunk_policies)"
    assert rebalancers.origin("ep-nomoves") == "entry point ep-nomoves = ep_reb (pipesim.rebalancers)"
    table = _small_table("ep-halving")
    table["scheduler"]["rebalancer"] = {"name": "ep-nomoves"}
    r = run(config_from_table(table))
    assert r.status == "ok" and r.decisions


def _small_table(policy):
    import tomllib

    return tomllib.loads(SMALL_TOML.format(policy=policy))


def test_config_plugins_table_is_relative_to_the_config(tmp_path):
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf" / "pol.py", GOOD.format(name="halving-cfg"))
    cfg_path = write(tmp_path / "conf" / "run.toml",
                     SMALL_TOML.format(policy="halving-cfg") + '[plugins]\nmodules = ["pol.py"]\n')
    cfg = load_config(cfg_path)
    assert cfg.plugins.modules == (str(tmp_path / "conf" / "pol.py"),)
    assert run(cfg).decisions


def _evaluate_in_fresh_process(table):
    from sim.studies.sweep import evaluate

    return evaluate(table)


def test_plugins_load_in_fresh_worker_processes(tmp_path):
    """A spawned worker (as on Ray) knows nothing of the parent's plug-ins: it loads the list
    carried in the point's table."""
    plugin = write(tmp_path / "pol.py", GOOD.format(name="halving-worker"))
    table = plugins.add_to_table(_small_table("halving-worker"), [str(plugin)])
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        summary = pool.apply(_evaluate_in_fresh_process, (table,))
    assert summary["status"] == "ok" and summary["num_chunk_decisions"] > 0


def test_goodput_with_jobs_runs_a_plugin(tmp_path, capsys):
    plugin = write(tmp_path / "pol.py", GOOD.format(name="halving-jobs"))
    code, out, err = cli(["goodput", small_config(tmp_path, "halving-jobs"), "--plugin", plugin,
                          "--rates", "1:2", "--tol", "0.5", "--jobs", "2", "--no-progress"], capsys)
    assert code == 0, err
    assert "goodput:" in out


# ---------------------------------------------------------------- errors, one line each

def one_line_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppsim: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.mark.parametrize("body, needles", [
    ("raise RuntimeError('no GPU here')\n", ["failed to import", "RuntimeError: no GPU here"]),
    ("def broken(:\n", ["failed to import", "SyntaxError"]),
    ("import not_a_module_anywhere_xyz\n", ["failed to import", "No module named 'not_a_module_anywhere_xyz'"]),
])
def test_plugin_that_fails_to_import(tmp_path, capsys, body, needles):
    plugin = write(tmp_path / "bad.py", GOOD.format(name="will-be-undone") + body)
    code, out, err = cli(["run", small_config(tmp_path, "static"), "--plugin", plugin, "--out", tmp_path / "o"],
                         capsys)
    one_line_error(code, err, f"plug-in file {plugin}", *needles, "rule:")
    assert "will-be-undone" not in chunk_policies.names()  # a failed import registers nothing


def test_missing_plugin_file_and_module(tmp_path, capsys):
    cfg = small_config(tmp_path, "static")
    code, _, err = cli(["run", cfg, "--plugin", tmp_path / "nope.py", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, "nope.py", "not found")
    code, _, err = cli(["run", cfg, "--plugin", "no_such_pkg.policies", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, "module no_such_pkg.policies", "No module named 'no_such_pkg'")


def test_plugin_that_registers_a_taken_name(tmp_path, capsys):
    plugin = write(tmp_path / "dup.py", GOOD.format(name="static"))
    code, _, err = cli(["run", small_config(tmp_path, "static"), "--plugin", plugin, "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, f"file {plugin}", "'static' is already taken (by built-in)", "names are unique")


def test_plugin_class_that_lacks_a_method(tmp_path, capsys):
    plugin = write(tmp_path / "nodecide.py", GOOD.format(name="nodecide").replace("def decide", "def decid"))
    code, _, err = cli(["run", small_config(tmp_path, "nodecide"), "--plugin", plugin, "--out", tmp_path / "o"],
                       capsys)
    one_line_error(code, err, f"file {plugin}", "'nodecide' lacks method decide()", "initial_chunk(), decide()")


def test_plugin_factory_whose_object_lacks_a_method(tmp_path, capsys):
    plugin = write(tmp_path / "fn.py", """\
        from sim.policies import rebalancers

        class Empty:
            pass

        @rebalancers.register("empty-reb")
        def make(context):
            return Empty()
        """)
    cfg = small_config(tmp_path, "static", '\n')
    text = cfg.read_text().replace('chunk_policy = { name = "static" }',
                                   'chunk_policy = { name = "static" }\nrebalancer = { name = "empty-reb" }')
    cfg.write_text(text)
    code, _, err = cli(["run", cfg, "--plugin", plugin, "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, "rebalancer 'empty-reb'", f"file {plugin}", "lacks method rebalance()")


@pytest.mark.parametrize("change, needles", [
    ("return self.chunk\n    def decide", ["initial_chunk() returned chunk 0", "[1, 16384]"]),
    ("ChunkDecision(self.chunk, \"halve\")", ["decide() returned chunk 99999", "rule: a chunk is an integer in [1, 16384]"]),
    ("ChunkDecision(self.chunk, \"halve\")*", ["decide() returned tuple", "ChunkDecision or None"]),
])
def test_plugin_that_returns_a_bad_chunk(tmp_path, capsys, change, needles):
    src = GOOD.format(name="badchunk")
    if change.startswith("return self.chunk"):
        src = src.replace("        return self.chunk\n", "        return 0\n")
    elif change.endswith("*"):
        src = src.replace('return ChunkDecision(self.chunk, "halve")', "return (self.chunk, 'halve')")
    else:
        src = src.replace('ChunkDecision(self.chunk, "halve")', 'ChunkDecision(99999, "halve")')
    plugin = write(tmp_path / "badchunk.py", src)
    code, _, err = cli(["run", small_config(tmp_path, "badchunk"), "--plugin", plugin, "--out", tmp_path / "o"],
                       capsys)
    one_line_error(code, err, f"chunk policy 'badchunk' (file {plugin})", *needles)


def test_plugin_that_raises_during_a_run(tmp_path, capsys):
    src = GOOD.format(name="crashy").replace("self.chunk = max(", "1 / 0\n            self.chunk = max(")
    plugin = write(tmp_path / "crashy.py", src)
    cfg = small_config(tmp_path, "crashy")
    args = ["run", cfg, "--plugin", plugin, "--out", tmp_path / "o"]
    code, _, err = cli(args, capsys)
    one_line_error(code, err, f"chunk policy 'crashy' (file {plugin}) raised ZeroDivisionError in decide(): "
                              f"division by zero")
    code, _, err = cli(args + ["--debug"], capsys)  # the traceback, then the same line
    assert code == 2 and "Traceback" in err and "1 / 0" in err
    assert err.strip().splitlines()[-1].startswith("ppsim: error: chunk policy 'crashy'")


def test_rebalancer_plugin_with_a_bad_move(tmp_path):
    plugin = write(tmp_path / "reb.py", """\
        from sim.policies import Move, rebalancers

        @rebalancers.register("pause-ghost")
        class PauseGhost:
            def __init__(self, context):
                pass
            def rebalance(self, view):
                return [Move(req_id=10**6, to_pending=True, at_head=True)]
        """)
    table = plugins.add_to_table(_small_table("static"), [str(plugin)])
    table["scheduler"]["rebalancer"] = {"name": "pause-ghost"}
    with pytest.raises(PluginError, match=r"rebalancer 'pause-ghost' \(file .*\): rebalance\(\) pauses request "
                                          r"1000000, which is not running in the current slot; rule: "):
        run(config_from_table(table))


def test_bad_plugins_table_in_config(tmp_path, capsys):
    cfg = small_config(tmp_path, "static", '[plugins]\nmodules = "pol.py"\n')
    code, _, err = cli(["run", cfg, "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, str(cfg), "[plugins] modules must be an array")
    cfg = small_config(tmp_path, "static", '[plugins]\nmodules = ["no good"]\n')
    code, _, err = cli(["run", cfg, "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, "neither a .py file nor a module name")


def test_the_api_page_examples_run(tmp_path):
    """The worked examples of sim/policies/API.md, loaded as plug-in files, run end to end."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "sim/policies/API.md").read_text(), re.S)
    assert len(blocks) == 2
    files = [str(write(tmp_path / f"example{i}.py", b)) for i, b in enumerate(blocks)]
    plugins.load_all(files)
    table = plugins.add_to_table(_small_table("slo-step"), files)
    table["scheduler"].update(chunk_size_tokens=2048, rebalancer={"name": "cap-running", "params": {"max_running": 4}})
    table["slo"] = {"tpot_ms": 25.0}
    table["workload"].update(rate_rps=40.0, num_requests=120, input_range=[16, 900], output_range=[20, 60])
    r = run(config_from_table(table))
    assert r.status == "ok" and all(q.finished for q in r.requests)
    assert {d[4] for d in r.decisions} == {"tpot"} and any(d[3] < 2048 for d in r.decisions)
    assert {m[3] for m in r.moves} == {"pause", "resume"}


def test_plugin_engine_named_like_a_built_in_is_told_the_built_in_has_it(tmp_path):
    # issue 40 item 15: a plug-in subclassing a built-in engine imports that engine's module while
    # the plug-in loads; the built-in registered then was attributed to the plug-in, which was told
    # its name is "taken (by file <itself>)". A fresh interpreter, so that the import happens there.
    import os
    import subprocess
    import sys

    plugin = write(tmp_path / "myeng.py", textwrap.dedent("""
        from sim.engine.schedulers import schedulers
        from sim.engine.schedulers.sglang import SGLangEngine

        class Mine(SGLangEngine):
            pass

        schedulers.register("sglang")(Mine)
        """))
    env = dict(os.environ, PIPESIM_PURE="1")
    out = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(REPO / "experiments/configs/default.toml"),
                          "--plugin", str(plugin), "--out", str(tmp_path / "o")],
                         cwd=REPO, env=env, capture_output=True, text=True)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"file {plugin}" in err and "'sglang' is already taken (by built-in)" in err, err
