"""Shared test factories (in the style of vLLM's create_scheduler / create_requests)."""

from __future__ import annotations

import os
from pathlib import Path

# The suite runs the Python sources of the engine (some tests patch its methods, which compiled
# classes refuse); tests/test_native.py checks the compiled build against them (sim/native.py).
os.environ["PIPESIM_PURE"] = "1"

import pytest

from sim.core.config import config_from_table
from sim.engine.schedulers.fastpp import Scheduler
from sim.engine.state import Req
from sim.latency.profiled import Profile

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
TINY_PROFILE = REPO / "tests" / "data" / "tiny-profile"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run slow full-size tests")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow full-size run; use --runslow (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# Every shipped profile (profiles/**, read-only in the suite) loaded once per session: the tests that walk
# all ~360 of them (`profile check --all`, the physical bounds, the plan's throughput bound) spent most of
# their time reloading the same files (~25 ms each). Profiles are read-only data that the simulator
# shares between runs too (sim/engine/run.py, load_profile_cached).
_SHIPPED_PROFILES: dict[Path, Profile] = {}
_LOAD = Profile.load.__func__  # (the loader itself, for the fixture's stand-in to call)


def load_shipped(path) -> Profile:
    """Profile.load of a shipped profile, memoised for the session."""
    key = Path(path).resolve()
    if key not in _SHIPPED_PROFILES:
        _SHIPPED_PROFILES[key] = _LOAD(Profile, path)
    return _SHIPPED_PROFILES[key]


@pytest.fixture
def shipped_profiles_loaded_once(monkeypatch):
    """Within the test, Profile.load of a path under profiles/ returns the session's copy (load_shipped);
    any other path (a test's own tmp copy, which it may damage) is loaded afresh."""
    shipped = (REPO / "profiles").resolve()

    def load(cls, path):
        return load_shipped(path) if shipped in Path(path).resolve().parents else _LOAD(cls, path)

    monkeypatch.setattr(Profile, "load", classmethod(load))


def make_req(rid: int, prompt: int, output: int = 10, arrival: float = 0.0, context: int = 16384) -> Req:
    return Req(rid, arrival, prompt, output, max_req_input_len=context - 6, max_req_len=context - 1)


def make_sched(pp: int = 1, kv: int = 100_000, chunk: int = 1024, max_running: int = 4097) -> Scheduler:
    return Scheduler(pp, kv, max_running, chunk)


def make_config(**sections) -> object:
    """A small run config; keyword arguments replace whole sections or top-level keys."""
    table = {
        "seed": 1,
        "parallel": {"pp": 2, "tp": 1},
        "scheduler": {"chunk_size_tokens": 256, "kv_tokens": 50_000},
        "latency": {"kind": "constant", "stage_ms": 10.0},
        "workload": {"kind": "synthetic-uniform", "rate_rps": 5.0, "num_requests": 20,
                     "input_range": [10, 600], "output_range": [2, 30]},
    }
    table.update(sections)
    return config_from_table(table)
