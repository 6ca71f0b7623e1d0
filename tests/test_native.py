"""The compiled engine (sim/native.py): used only when fresh, and byte-identical to the sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

from sim import native
from sim.core import tomlio
from sim.core.schemes import scheme_table

from conftest import REPO


def _fake_build(folder, digests=None):
    """A build folder with empty stand-ins for the compiled files (never imported here)."""
    for module in native.FILES:
        f = folder.joinpath(*module.split("."))
        f = f.with_name(f.name + EXTENSION_SUFFIXES[0])
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    native.write_manifest(folder, digests or native.source_digests())


def test_a_build_of_the_current_sources_is_fresh(tmp_path):
    _fake_build(tmp_path)
    files = native.fresh_build(tmp_path)
    assert files is not None and set(files) == set(native.FILES)


def test_an_edited_source_makes_the_build_stale(tmp_path):
    digests = native.source_digests()
    digests["sim.engine.schedulers.fastpp"] = "0" * 64  # built from another version of the source
    _fake_build(tmp_path, digests)
    assert native.fresh_build(tmp_path) is None


def test_a_missing_compiled_file_or_manifest_means_no_build(tmp_path):
    assert native.fresh_build(tmp_path) is None  # nothing built
    _fake_build(tmp_path)
    f = native.compiled_file("sim.engine.pipeline", tmp_path)
    f.unlink()
    assert native.fresh_build(tmp_path) is None
    _fake_build(tmp_path)
    (tmp_path / native.MANIFEST).write_text("sim.engine.state\n")  # (a line without its hash)
    assert native.fresh_build(tmp_path) is None


def test_the_suite_runs_the_python_sources():
    import sim.engine.schedulers.fastpp as sched_mod

    assert os.environ["PIPESIM_PURE"] == "1"
    assert sched_mod.__file__.endswith("fastpp.py") and not native.active()


# Varied runs that need no trace file: static and dynamic chunks, delay scheduling, TP, both
# models, an early stop, and retraction on a tiny KV pool.
CASES = {
    "pp512_synth": ("PP_512", "qwen2.5-32b", {"name": "azure-conv-synth", "num_requests": 300, "rate_rps": 6.0}, None),
    "predds_sharegpt": ("DCP_pred+DS", "qwen2.5-14b", {"name": "sharegpt", "num_requests": 300, "rate_rps": 6.0}, None),
    "greedy_cnnrev": ("DCP_greedy", "qwen2.5-32b", {"name": "cnn-reversed", "num_requests": 200, "rate_rps": 3.0}, None),
    "tp_sharegpt": ("TP", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 300, "rate_rps": 8.0}, None),
    "pred_stopped": ("DCP_pred", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 400, "rate_rps": 30.0},
                     {"slo": {"ttft_ms": 300.0, "stop_when_violated": True}}),
    "pp512_retract": ("PP_512", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 200, "rate_rps": 8.0},
                      {"scheduler": {"kv_tokens": 6000}, "server": {"on_kv_exhausted": "retract"}}),
    "greedy_two_replicas": ("DCP_greedy", "qwen2.5-14b", {"name": "sharegpt", "num_requests": 300, "rate_rps": 12.0},
                            {"parallel": {"replicas": 2, "router": "least-loaded"}}),
    # the other engines' schedulers (compiled with FastPP's, whose class they extend)
    "sglang_shared_prefix": ("PP_512", "qwen2.5-32b", {"name": "shared-system-prompt", "num_requests": 200,
                                                       "rate_rps": 6.0}, {"scheduler": {"engine": "sglang"}}),
    "vllm_v1_chat": ("PP_512", "qwen2.5-14b", {"name": "chat-sessions", "num_sessions": 40},
                     {"scheduler": {"engine": "vllm-v1"}}),
    "vllm_v0_tp": ("TP", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 200, "rate_rps": 6.0},
                   {"scheduler": {"engine": "vllm-v0", "chunk_size_tokens": 0}}),
    # disaggregated pools (their schedulers extend FastPP's too)
    "disagg_1p1d": ("TP", "qwen2.5-14b", {"name": "sharegpt", "num_requests": 150, "rate_rps": 4.0},
                    {"latency": {"profile": "profiles/a100-pcie-40gb/qwen2.5-14b/tp2"},
                     "cluster": {"nodes": 1, "gpus_per_node": 4, "network": "ib-ndr"},
                     "disaggregation": {"prefill": {"instances": 1, "tp": 2}, "decode": {"instances": 1, "tp": 2}}}),
}

# Every case in one fresh process per build (the sources, then the compiled modules): a process
# start and the imports cost about a second of CPU, as much as a case's run
_RUN = """
import json, sys
from sim import native
from sim.cli import main
codes = {name: main(["run", cfg, "--out", out, "--force"]) for name, (cfg, out) in json.loads(sys.argv[1]).items()}
print("CODES", json.dumps(codes))
print("ACTIVE", native.active())
"""


def _run(cases: dict, pure: bool) -> bool:
    """`ppsim run` of every case (name -> (config, out)) in a fresh process; returns whether the compiled
    modules were in use."""
    env = {**os.environ, "PIPESIM_PURE": "1" if pure else "0"}
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps({k: list(map(str, v)) for k, v in cases.items()})],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    codes = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("CODES "))[6:])
    assert set(codes) == set(cases) and all(c in (0, 1) for c in codes.values()), codes  # (1: stopped by its SLO)
    return "ACTIVE True" in proc.stdout


@pytest.fixture(scope="module")
def both_builds(tmp_path_factory):
    """Each case run by the sources and by the compiled modules: name -> (pure folder, compiled folder)."""
    root = tmp_path_factory.mktemp("native")
    for case, (scheme, model, workload, extra) in CASES.items():
        table = scheme_table(scheme, model, workload, seed=1, extra=extra)
        if "disaggregation" in table:
            table.pop("parallel")  # (the pools say theirs)
        (root / f"{case}.toml").write_text(tomlio.dumps(table))
    assert not _run({c: (root / f"{c}.toml", root / "pure" / c) for c in CASES}, pure=True)
    assert _run({c: (root / f"{c}.toml", root / "compiled" / c) for c in CASES}, pure=False)  # compiled in use
    return {c: (root / "pure" / c, root / "compiled" / c) for c in CASES}


@pytest.mark.skipif(native.fresh_build() is None, reason="no fresh compiled build: run `make native`")
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_compiled_engine_gives_the_same_bytes(case, both_builds):
    pure, compiled = both_builds[case]
    names = sorted(p.name for p in pure.iterdir())
    assert names == sorted(p.name for p in compiled.iterdir())
    assert {"requests.csv", "iterations.csv", "summary.json"} <= set(names)
    for name in names:
        assert (pure / name).read_bytes() == (compiled / name).read_bytes(), name


_SIBLINGS = """
import json, sys
from sim import native
from sim.core.schemes import scheme_table
from sim.studies.sweep import evaluate_siblings
wl = {"name": "sharegpt", "num_requests": 150, "rate_rps": 3.0}
groups = [[scheme_table("DCP_pred+DS", "qwen2.5-32b", wl, seed=1, slo_scale=s) for s in (1.0, 0.8, 0.5)],
          [scheme_table(f"PP_{c}", "qwen2.5-32b", wl, seed=1) for c in (1024, 512, 256)]]
for g in groups[0]:
    g["slo"]["stop_when_violated"] = True
print(json.dumps([evaluate_siblings(g) for g in groups], sort_keys=True))
print("ACTIVE", native.active())
"""


@pytest.mark.skipif(native.fresh_build() is None, reason="no fresh compiled build: run `make native`")
def test_the_compiled_engine_gives_the_same_lockstep_summaries():
    """Runs in lock step (sim/engine/lockstep.py: several SLOs, or several static chunks, one
    simulation) pass their own guard and policies through the compiled pipeline."""
    outs = {}
    for pure in (True, False):
        proc = subprocess.run([sys.executable, "-c", _SIBLINGS], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PIPESIM_PURE": "1" if pure else "0"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.strip().splitlines()
        assert lines[-1] == f"ACTIVE {not pure}"
        outs[pure] = lines[-2]
    assert outs[True] == outs[False]
    served = [[s is not None for s in group] for group in json.loads(outs[True])]
    assert served[0][0] and served[1][0]  # (each group's primary run was simulated)


def test_the_build_command_checks_its_arguments(capsys):
    from sim import native_build

    assert native_build.main(["--bogus"]) == 2
    assert "usage: python -m sim.native_build" in capsys.readouterr().err
    assert native_build.main(["--status"]) == 0
    assert "build" in capsys.readouterr().out
