"""summary.json's benchmark names match vLLM's `calculate_metrics` on the same requests.

`vllm_calculate_metrics` below restates vLLM's `benchmarks/benchmark_serving.py`
`calculate_metrics` (same loop, same numpy calls) over per-request client records
(success, ttft, latency, itl list, output_tokens, prompt_len), which are built here from
the simulated requests: both definitions see one set of requests.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import make_config

from sim.outputs.bench_metrics import bench_metrics
from sim.engine.run import run
from sim.outputs.metrics import requests_frame, summarize


def vllm_calculate_metrics(outputs, dur_s, goodput):
    itls, tpots, all_tpots, ttfts, e2els, out_lens = [], [], [], [], [], []
    completed = good = total_input = 0
    for o in outputs:
        if not o["success"]:
            out_lens.append(0)
            continue
        out_lens.append(o["output_tokens"])
        total_input += o["prompt_len"]
        tpot = 0
        if o["output_tokens"] > 1:
            tpot = (o["latency"] - o["ttft"]) / (o["output_tokens"] - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += o["itl"]
        ttfts.append(o["ttft"])
        e2els.append(o["latency"])
        completed += 1
    for ttft, tpot in zip(ttfts, all_tpots):
        good += goodput["ttft"] / 1000 >= ttft and goodput["tpot"] / 1000 >= tpot
    m = {"completed": completed, "request_throughput": completed / dur_s, "request_goodput": good / dur_s,
         "output_throughput": sum(out_lens) / dur_s, "total_token_throughput": (total_input + sum(out_lens)) / dur_s}
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        m[f"mean_{name}_ms"] = np.mean(vals or 0) * 1000
        m[f"median_{name}_ms"] = np.median(vals or 0) * 1000
        m[f"std_{name}_ms"] = np.std(vals or 0) * 1000
        for p in (90, 99):
            m[f"p{p}_{name}_ms"] = np.percentile(vals or 0, p) * 1000
    return m


def client_records(result):
    """What a streaming benchmark client would have recorded for each simulated request."""
    recs = []
    for r in result.requests:
        ok = r.finished
        recs.append({
            "success": ok, "prompt_len": r.orig_prompt_len, "output_tokens": r.out_len if ok else 0,
            "ttft": r.first_token_s - r.arrival_s if ok else 0.0,
            "latency": r.finish_s - r.arrival_s if ok else 0.0,
            "itl": list(r.itls) if ok else [],
        })
    return recs


@pytest.mark.parametrize("sections", [
    {},
    # A horizon leaves requests unfinished (not successful); tight SLOs make goodput < throughput.
    {"horizon_s": 3.0, "slo": {"ttft_ms": 25.0, "tpot_ms": 25.0}},
    # One-token outputs have no TPOT (skipped) but count TPOT 0 for goodput, as in vLLM.
    {"workload": {"kind": "synthetic-uniform", "rate_rps": 8.0, "num_requests": 30,
                  "input_range": [10, 300], "output_range": [1, 3]}},
])
def test_summary_matches_vllm_definitions(sections):
    result = run(make_config(**sections))
    summary = summarize(result)
    ref = vllm_calculate_metrics(client_records(result), summary["duration_s"],
                                 {"ttft": result.config.slo.ttft_ms, "tpot": result.config.slo.tpot_ms})
    assert ref["completed"] == summary["completed"] == summary["num_finished"] > 0
    for key, want in ref.items():
        assert summary[key] == pytest.approx(want, rel=1e-9, abs=1e-9), key
    if sections.get("slo"):
        assert summary["request_goodput"] < summary["request_throughput"]


def test_each_request_itls_sum_to_its_decode_time():
    result = run(make_config())
    for r in result.requests:
        assert len(r.itls) == r.out_len - 1
        assert sum(r.itls) == pytest.approx(r.finish_s - r.first_token_s, abs=1e-9)
    df = requests_frame(result)
    r0 = result.requests[0]
    assert df.loc[0, "max_itl_ms"] == pytest.approx(max(r0.itls) * 1e3)


def test_bench_metrics_by_hand():
    # Two finished requests and one waiting one; duration 10 s; SLOs TTFT 150 ms, TPOT 30 ms.
    df = pd.DataFrame({
        "status": ["finished", "finished", "waiting"],
        "prompt_tokens": [100, 300, 50], "generated_tokens": [3, 1, 0],
        "ttft_ms": [100.0, 200.0, math.nan], "tpot_ms": [25.0, math.nan, math.nan],
        "e2e_ms": [150.0, 200.0, math.nan],
    })
    itls = np.array([20.0, 30.0])  # request 0's two gaps; request 1 has one token, no gap
    m = bench_metrics(df, itls, 10.0, slo_ttft_ms=150.0, slo_tpot_ms=30.0)
    assert m["completed"] == 2
    assert m["request_throughput"] == pytest.approx(0.2)
    assert m["request_goodput"] == pytest.approx(0.1)  # request 1 misses TTFT (200 > 150)
    assert m["output_throughput"] == pytest.approx(0.4)  # (3 + 1) / 10
    assert m["total_token_throughput"] == pytest.approx(40.4)  # (400 + 4) / 10
    assert m["mean_ttft_ms"] == pytest.approx(150.0) and m["median_ttft_ms"] == pytest.approx(150.0)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 100)
    assert m["mean_tpot_ms"] == pytest.approx(25.0) and m["std_tpot_ms"] == 0.0
    assert m["mean_itl_ms"] == pytest.approx(25.0) and m["p90_itl_ms"] == pytest.approx(29.0)
    assert m["max_itl_ms"] == 30.0
    assert m["mean_e2el_ms"] == pytest.approx(175.0) == m["mean_e2e_latency_ms"]
    assert m["std_e2el_ms"] == pytest.approx(25.0)
    assert m["concurrency"] == pytest.approx(0.035)  # (0.15 + 0.2) s / 10 s
