"""Every scheme end to end on azure-conv at 4 req/s, and the accuracy table's shape."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import REPO, SHARED_DATA
from sim.config import load_config
from sim.engine.run import run

TRACE_DIR = SHARED_DATA / "azure-llm-inference-2023"
SCHEMES = {
    "PP_512": ["scheduler.chunk_size_tokens=512", 'scheduler.chunk_policy={name="static"}'],
    "DCP_greedy": ["scheduler.chunk_size_tokens=128", 'scheduler.chunk_policy={name="greedy"}'],
    "DCP_pred": ["scheduler.chunk_size_tokens=128", 'scheduler.chunk_policy={name="predictive"}'],
    "DCP_pred+DS": ["scheduler.chunk_size_tokens=128", 'scheduler.chunk_policy={name="predictive"}',
                    'scheduler.rebalancer={name="delay-scheduling"}'],
}


@pytest.fixture(scope="module")
def results(monkeypatch_module):
    if not (TRACE_DIR / "AzureLLMInferenceTrace_conv.csv").is_file():
        pytest.skip(f"azure-conv trace not found in {TRACE_DIR}")
    monkeypatch_module.setenv("PIPESIM_CACHE", str(TRACE_DIR))
    out = {}
    for name, overrides in SCHEMES.items():
        cfg = load_config(REPO / "experiments/configs/default.toml",
                          overrides + ['workload.name="azure-conv"', "workload.rate_rps=4.0"])
        out[name] = run(cfg)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def p90_iter_ms(result) -> float:
    it = result.iterations
    dur = np.asarray(it["end_s"]) - np.asarray(it["start_s"])
    busy = np.asarray([m != "idle" for m in it["mode"]])
    return float(np.percentile(dur[busy], 90) * 1e3)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_scheme_finishes_every_request(results, name):
    r = results[name]
    assert r.status == "ok", r.reason
    assert all(q.finished for q in r.requests) and len(r.requests) == 400


def test_decisions_are_logged_with_reasons(results):
    assert results["PP_512"].decisions == []
    greedy = {d[4].split("+")[0] for d in results["DCP_greedy"].decisions}
    assert greedy and greedy <= {"watermark", "restore", "tpot_high", "ttft_low", "ttft_high", "hold"}
    pred = {d[4].split("+")[0] for d in results["DCP_pred"].decisions}
    assert pred and pred <= {"watermark", "Optimal", "Best_Effort", "Fail_SLO_ExecTime"}
    for t, slot, old, new, _reason in results["DCP_pred"].decisions:
        assert old != new and 128 <= new and new % 128 == 0


def test_dynamic_chunking_lowers_p90_iteration_latency(results):
    static = p90_iter_ms(results["PP_512"])
    for name in ("DCP_greedy", "DCP_pred", "DCP_pred+DS"):
        assert p90_iter_ms(results[name]) < static, (name, p90_iter_ms(results[name]), static)


def test_accuracy_table_columns():
    from sim.policies.accuracy import predictor_accuracy

    cfg = load_config(REPO / "experiments/configs/default.toml", [
        "scheduler.chunk_size_tokens=128", 'scheduler.chunk_policy={name="predictive"}',
        "workload.num_requests=80"])
    df = predictor_accuracy(cfg, noise_cv=0.05, use_sklearn=False)
    assert list(df.columns) == ["predictor", "mape_pct", "predict_us"]
    assert df["predictor"].iloc[0] == "offline" and "alp" in set(df["predictor"])
    assert np.isfinite(df["mape_pct"]).all() and df.attrs["status"] == "ok"


def test_rebalancer_moves_under_decode_pressure():
    """Synthetic decode-heavy load on pp = 2 puts several hundred requests in flight: delay
    scheduling pauses and resumes requests, and every request still finishes."""
    cfg = load_config(REPO / "experiments/configs/default.toml", [
        "parallel.pp=2", "scheduler.kv_tokens=400000", "scheduler.chunk_size_tokens=128",
        'scheduler.chunk_policy={name="predictive"}',
        'scheduler.rebalancer={name="delay-scheduling"}',
        'workload={kind="synthetic-uniform", rate_rps=40.0, num_requests=600, input_range=[16, 64], '
        'output_range=[100, 300]}'])
    r = run(cfg)
    assert r.status == "ok", r.reason
    assert all(q.finished for q in r.requests)
    actions = {m[3] for m in r.moves}
    assert actions == {"pause", "resume"}, actions
