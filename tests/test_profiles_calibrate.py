"""profiles/calibrate.py: targets file, objective, tie-breaking, search, fits -> builder."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
_spec = importlib.util.spec_from_file_location("calibrate", PROFILES / "calibrate.py")
calibrate = importlib.util.module_from_spec(_spec)
sys.modules["calibrate"] = calibrate
_spec.loader.exec_module(calibrate)

_bspec = importlib.util.spec_from_file_location("build_a100_c", PROFILES / "build_a100.py")
build_a100 = importlib.util.module_from_spec(_bspec)
_bspec.loader.exec_module(build_a100)

TINY_TARGETS = {"iteration": [{"name": "a", "value": 50.0, "use": "fit"}, {"name": "b", "value": 20.0, "use": "fit"},
                              {"name": "c", "value": 10.0, "use": "check"}]}


def test_targets_file_holds_section3_numbers():
    t = tomllib.loads((PROFILES / "calibration_targets.toml").read_text())
    fit = {x["name"]: x["value"] for x in t["iteration"] if x["use"] == "fit"}
    assert fit == {"azure-conv PP_static(512) P90": 51.68, "azure-conv PP_static(512) P99": 65.34,
                   "cnn-reversed PP_static(256) P90": 28.94}
    assert t["micro_benchmarks"]["decode_128_over_96"] == 1.05
    assert t["micro_benchmarks"]["decode_160_over_128"] == 1.31
    assert t["bubble"]["ms"] == 627.0
    assert {(g["workload"], g["scheme"]): g["value"] for g in t["goodput"]}[("azure-conv", "TP")] == 3.48


def test_simulator_never_reads_the_targets():
    """Only the calibration and the fidelity command may read the targets, never the simulator itself."""
    for path in (REPO / "sim").rglob("*.py"):
        if "fidelity" in path.name:
            continue
        assert "calibration_targets" not in path.read_text(), path


def test_objective_tiny_case():
    vals = {"a": 55.0, "b": 18.0, "c": 99.0}           # +10%, -10%; "c" is a check, not fitted
    assert calibrate.objective(vals, TINY_TARGETS) == pytest.approx(0.01 + 0.01)
    assert calibrate.objective({"a": 50.0, "b": 20.0, "c": 0.0}, TINY_TARGETS) == 0.0


def test_ties_go_to_the_defaults():
    cache = {(1.0, 1.0, 0.5): (0.010, {}), (1.25, 1.1, 2.0): (0.010 + 1e-7, {}), (1.3, 1.2, 4.0): (0.5, {})}
    k, obj = calibrate.pick_best(cache)
    assert k == (1.25, 1.1, 2.0)
    cache[(1.0, 1.0, 0.5)] = (0.001, {})
    assert calibrate.pick_best(cache)[0] == (1.0, 1.0, 0.5)


def test_search_finds_a_known_optimum_with_a_fake_simulator():
    """A smooth fake response: the search must land on its optimum (s_mem 1.15, s_comp 1.05, cpu 1.5)."""
    targets = {"iteration": [{"name": "x", "value": 1.0, "use": "fit"}, {"name": "y", "value": 1.0, "use": "fit"},
                             {"name": "z", "value": 1.0, "use": "fit"}]}

    def fake(points):
        return [{"x": 1 + (p["s_mem"] - 1.15), "y": 1 + (p["s_comp"] - 1.05), "z": 1 + (p["cpu_ms"] - 1.5) / 10}
                for p in points]

    res = calibrate.search(targets, [1], 1, False, "grid", log=lambda *_: None, evaluate=fake)
    assert res["best"] == pytest.approx({"s_mem": 1.15, "s_comp": 1.05, "cpu_ms": 1.5})
    assert res["objective"] == pytest.approx(0.0, abs=1e-12)
    assert "grid search" in res["method"]


def test_step1_picks_the_smaller_worst_case_error():
    targets = tomllib.loads((PROFILES / "calibration_targets.toml").read_text())
    s1 = calibrate.step1(targets)
    assert s1["mode"] == min(s1["worst"], key=s1["worst"].get)
    assert set(s1["ratios"]) == {"grid", "bucket128"}


def test_simulate_targets_tiny_run(monkeypatch):
    """One short engine run through the calibration's simulation function (cnn-reversed, 60 requests)."""
    targets = tomllib.loads((PROFILES / "calibration_targets.toml").read_text())
    entry = dict(next(t for t in targets["iteration"] if t["workload"] == "cnn-reversed"), num_requests=60)
    vals = calibrate.simulate_targets(targets, {"s_mem": 1.0, "s_comp": 1.0, "cpu_ms": 1.0}, [1], [entry])
    hi = calibrate.simulate_targets(targets, {"s_mem": 1.3, "s_comp": 1.2, "cpu_ms": 3.0}, [1], [entry])
    assert 5 < vals[entry["name"]] < hi[entry["name"]] < 100


def test_fits_file_drives_the_builder(tmp_path):
    fits = tmp_path / "fits.toml"
    fits.write_text('[lookup]\nmode = "bucket128"\nstatus = "selected"\n\n'
                    '[[fit]]\nparam = "s_mem"\nvalue = 1.15\nstatus = "fitted"\ntarget = "t"\nachieved = "a"\n'
                    'residual = "r"\nseeds = 3\nsimulator_commit = "abc"\nmethod = "m"\n')
    f = build_a100.load_fits(fits)
    text = build_a100.render_meta(build_a100.PCIE, "qwen2.5-14b", 1, [], {"x": "y"}, None, f)
    meta = tomllib.loads(text)
    assert meta["lookup"]["mode"] == "bucket128" and meta["scaling"]["s_mem"] == 1.15
    fit = {x["param"]: x for x in meta["fit"]}
    assert fit["s_mem"]["seeds"] == 3 and fit["s_mem"]["simulator_commit"] == "abc"
    assert "experiments issue" in fit["allreduce_busbw_gbps"]["status"]
    assert fit["s_comp"]["value"] == 1.1          # not in the fits file: default


def test_committed_profiles_carry_the_committed_fits():
    fits_path = PROFILES / "fits.toml"
    if not fits_path.is_file():
        pytest.skip("profiles/fits.toml not written yet (run profiles/calibrate.py)")
    fits = tomllib.loads(fits_path.read_text())
    for meta_path in (PROFILES / "a100-pcie-40gb").glob("*/tp*/meta.toml"):
        meta = tomllib.loads(meta_path.read_text())
        assert meta["lookup"]["mode"] == fits["lookup"]["mode"]
        for f in fits["fit"]:
            sec = {"s_mem": "scaling", "s_comp": "scaling", "cpu_ms": "overhead"}[f["param"]]
            assert meta[sec][f["param"]] == f["value"], (meta_path, f["param"])
