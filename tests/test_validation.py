"""The validation suite (experiments/validation/): its runner's output and that the committed report
is regenerable. Two of the smallest cases (B7, B8: 10 requests each, vLLM result files on A100 and
H100) are run afresh and must give the committed report.csv's simulated values exactly (the
simulator is deterministic for a seed, compiled or pure); the data files must agree with the case
table and be what the runner's extraction writes."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO / "experiments" / "validation"
RUNNER = VALIDATION / "run.py"
SMALL = ("B7", "B8")


def _runner():
    spec = importlib.util.spec_from_file_location("validation_run", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _need_data():
    missing = [p for p in (VALIDATION / "data" / f"{c}.csv" for c in SMALL) if not p.is_file()]
    if missing:
        pytest.skip(f"validation data file(s) missing: {', '.join(str(p.relative_to(REPO)) for p in missing)} "
                    f"(re-derive with: python experiments/validation/run.py --extract ID=FILE)")


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_case_table_is_complete():
    run = _runner()
    cases = run.load_cases()
    assert len(cases) >= 10
    gpus = {run.sim_gpu(c) for c in cases}
    assert {"A100-80GB SXM", "H100-80GB SXM"} <= gpus
    assert {run.engine_family(c) for c in cases} >= {"SGLang", "vLLM"}
    for c in cases:
        for key in ("id", "title", "source", "real_engine", "server", "client", "gpu", "model", "tp", "differs",
                    "differs_short", "sim", "workload", "real"):
            assert key in c, (c.get("id"), key)
        assert (REPO / c["sim"]["profile"]).is_dir(), c["sim"]["profile"]
        assert c["real"], c["id"]


def test_data_files_agree_with_the_case_table_and_the_extraction():
    _need_data()
    run = _runner()
    cases = run.load_cases()
    assert run.check_data(cases) == []
    for case in cases:
        wl = case["workload"]
        if wl["source"] != "log" or not (VALIDATION / wl["file"]).is_file():
            continue
        path = VALIDATION / wl["file"]
        agg, ins, outs, source = run.read_log_data(path)
        assert source == case["source"]
        # the file is exactly what --extract writes from a result file with these fields
        record = dict(agg, input_lens=ins, output_lens=outs, ttfts=[0.0] * len(ins))
        assert run.extract_log(record, case["source"]) == path.read_text()


def test_two_small_cases_regenerate_the_committed_report(tmp_path):
    _need_data()
    committed = VALIDATION / "report.csv"
    if not committed.is_file():
        pytest.skip("experiments/validation/report.csv not generated yet (python experiments/validation/run.py)")
    cmd = [sys.executable, str(RUNNER), "--only", ",".join(SMALL), "--no-toggles", "--jobs", "1",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = _runner()
    fresh = _rows(tmp_path / "report.csv")
    assert list(fresh[0]) == list(run.COLUMNS)
    by_id = run.case_by_id(run.load_cases())
    for cid in SMALL:
        got = [r for r in fresh if r["case"] == cid]
        assert [r["metric"] for r in got] == list(by_id[cid]["real"])
        for r in got:
            assert r["real"] and r["simulated"] and r["error_pct"]
            real, sim = float(r["real"]), float(r["simulated"])
            assert abs(float(r["error_pct"]) - (sim - real) / real * 100) < 0.1
    old = {(r["case"], r["metric"]): r["simulated"] for r in _rows(committed) if r["case"] in SMALL}
    new = {(r["case"], r["metric"]): r["simulated"] for r in fresh}
    assert new == old, "the committed report.csv is stale: rerun python experiments/validation/run.py"
    md = (tmp_path / "report.md").read_text()
    assert "| B7 |" in md and "| B8 |" in md and "(a partial run: `--only`)" in md


def test_closed_loop_cases_run_their_clients():
    """The G cases (a published concurrency sweep) replay their closed loop: `concurrency` reaches
    the run's [workload], and a single client sends one request at a time."""
    from sim.core.config import config_from_table
    from sim.engine.run import run as simulate
    from sim.outputs.metrics import requests_frame

    runner = _runner()
    by_id = runner.case_by_id(runner.load_cases())
    table = runner.config_table(by_id["G1"], quick=True)
    assert table["workload"]["concurrency"] == 1
    assert not runner.in_full_load_study(by_id["G3"])  # a closed loop is not an offline burst
    table["workload"]["num_requests"] = 5
    df = requests_frame(simulate(config_from_table(table, "G1")))
    # one client: each request is sent when the previous one finishes
    assert (df["arrival_s"].to_numpy()[1:] == df["finish_s"].to_numpy()[:-1]).all()


def test_inferencemax_cases_draw_the_clients_lengths():
    """The J cases replay InferenceMAX's client (kimbochen/bench_serving `sample_random_requests` with
    --random-range-ratio 0.8): every request's input and output uniform on the integers [int(1024 x 0.8),
    1024] = [819, 1024], so the closed loop's clients do not stay in lock-step; the mean output the implied
    E2E uses is (819 + 1024) / 2 = 921.5 (by hand)."""
    import numpy as np

    from sim.core.config import config_from_table
    from sim.workloads import build_workload

    runner = _runner()
    case = runner.case_by_id(runner.load_cases())["J2"]
    table = runner.config_table(case)
    wl = table["workload"]
    assert (wl["kind"], wl["range_ratio"], wl["range_ratio_definition"], wl["concurrency"]) == ("bench", 0.8, "sglang", 8)
    reqs = build_workload(config_from_table(table, "J2").workload, seed=1)
    ins = np.array([r.prompt_tokens for r in reqs])
    outs = np.array([r.output_tokens for r in reqs])
    assert len(reqs) == 80 and ins.min() >= 819 and ins.max() <= 1024 and outs.min() >= 819 and outs.max() <= 1024
    assert len(set(outs[:8].tolist())) > 1  # the first round's clients finish at different steps
    assert runner.mean_output_tokens(case["workload"]) == 921.5
    assert runner.mean_output_tokens({"source": "fixed", "output": 100}) == 100.0


def test_current_engine_cases_name_version_gpu_and_source():
    """Issue 43: at least 15 current-engine cases (vLLM >= 0.10, SGLang >= 0.4.6, 2025-2026), each naming the
    version that ran, its GPU, model, workload and source; the refused measurements each say why."""
    run = _runner()
    cases = run.load_cases()
    current = [c for c in cases if c.get("current_engine")]
    assert len(current) >= 15 + 9  # the 9 of issue 31 (E1, E3, E4, G1-G6) and at least 15 new
    for c in current:
        assert c["ran_version"] and c["source"] and c["gpu"] and c["model"], c["id"]
        assert c["ran_version"].split()[0] in ("vLLM", "SGLang"), c["id"]
        wl = c["workload"]
        assert wl["source"] in ("fixed", "uniform", "sharegpt", "log", "random") and wl.get("num_requests"), c["id"]
        if "silicon_row" in c:  # the sample's own: a version and a known PipeSim engine version
            assert c["sim"]["scheduler"]["engine_version"] in ("0.5", "0.10"), c["id"]
    refused = run.load_refused()
    assert refused and all(r["reason"] and int(r["rows"]) > 0 for r in refused)


def test_silicon_cases_are_the_sample_rows_verbatim():
    """The H and J cases are what silicon_cases.py writes from AIConfigurator's silicon sample, and
    check_data notices a number that is not the row's."""
    run = _runner()
    if run.silicon_rows() is None:
        pytest.skip("aiconfigurator-core not installed (the aic extra): no silicon sample to check against")
    spec = importlib.util.spec_from_file_location("silicon_cases", VALIDATION / "silicon_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.blocks().strip() in (VALIDATION / "cases.toml").read_text()
    cases = [c for c in run.load_cases() if "silicon_row" in c]
    assert run.check_data(cases) == []
    bad = dict(cases[0], real=dict(cases[0]["real"], mean_tpot_ms=cases[0]["real"]["mean_tpot_ms"] * 1.01))
    assert any("mean_tpot_ms" in p for p in run.check_data([bad]))


def test_goal_statistics_by_hand():
    """The current-engine summary: share within 15%, count beyond 50%, median |error| (hand-computed)."""
    run = _runner()
    n, within, beyond, mabs = run.goal_stats([-10.0, 15.0, 20.0, -60.0, 51.0])
    assert (n, within, beyond, mabs) == (5, 0.4, 2, 20.0)
    rows = [{"case": "X1", "ran_version": "vLLM 0.11", "scored": "yes", "error_pct": e, "metric": "mean_ttft_ms",
             "sim_gpu": "H100-80GB SXM"} for e in ("+5.0", "-14.9", "+16.0", "+70.0")]
    cases = [{"id": "X1", "sim": {"engine": "vllm-v1", "scheduler": {"engine_version": "0.11"}}}]
    md = "\n".join(run.current_engine_section(cases, rows, []))
    assert "4 compared numbers: 50% within 15%" in md and "1 beyond 50%" in md and "not met" in md
    assert "X1 mean TTFT +70.0%" in md
