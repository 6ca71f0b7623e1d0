"""`ppsim validate` against hand-written benchmark results in SGLang's, vLLM's and the FastPP
fork's formats (field names from sglang python/sglang/bench_serving.py and vllm
benchmarks/benchmark_serving.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim.cli import main
from sim.core.config import load_config
from sim.engine.run import run
from sim.core.errors import DataError
from sim.outputs.metrics import summarize
from sim.studies.validate import log_requests, read_bench_log

FAST = """seed = 1
[parallel]
pp = 2
[scheduler]
chunk_size_tokens = 256
kv_tokens = 50000
[latency]
kind = "constant"
stage_ms = 10.0
[workload]
name = "sharegpt"
"""

INS = [120, 300, 80, 450, 200, 60, 90, 310]
OUTS = [5, 3, 8, 2, 6, 0, 4, 1]  # request 5 failed: 0 tokens and an error, as bench_serving logs it


def sglang_result(rate=4.0):
    """One line of `bench_serving --output-file F --output-details` (SGLang)."""
    ttfts = [0.10 + 0.01 * i for i in range(len(INS))]
    ttfts[5] = 0.0
    itls = [[0.020 + 0.001 * j for j in range(o - 1)] if o > 1 else [] for o in OUTS]
    return {
        "backend": "sglang", "dataset_name": "sharegpt", "request_rate": rate, "max_concurrency": None,
        "sharegpt_output_len": None, "random_input_len": 1024, "random_output_len": 1024, "random_range_ratio": 0.0,
        "duration": 3.2, "completed": 7, "total_input_tokens": 1610, "total_output_tokens": 29,
        "total_output_tokens_retokenized": 29, "request_throughput": 7 / 3.2, "input_throughput": 1610 / 3.2,
        "output_throughput": 29 / 3.2, "mean_e2e_latency_ms": 200.0, "median_e2e_latency_ms": 190.0,
        "std_e2e_latency_ms": 30.0, "p99_e2e_latency_ms": 260.0, "mean_ttft_ms": 130.0, "median_ttft_ms": 130.0,
        "std_ttft_ms": 20.0, "p99_ttft_ms": 170.0, "mean_tpot_ms": 21.0, "median_tpot_ms": 21.0, "std_tpot_ms": 1.0,
        "p99_tpot_ms": 23.0, "mean_itl_ms": 21.0, "median_itl_ms": 21.0, "std_itl_ms": 1.0, "p95_itl_ms": 24.0,
        "p99_itl_ms": 25.0, "concurrency": 0.5, "accept_length": None,
        "input_lens": INS, "output_lens": OUTS, "ttfts": ttfts, "itls": itls,
        "generated_texts": ["x" * o for o in OUTS], "errors": ["" if o else "Bad Request" for o in OUTS],
    }


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture
def fast_config(tmp_path):
    p = tmp_path / "fast.toml"
    p.write_text(FAST)
    return p


def test_sglang_log_replays_its_own_requests(tmp_path, capsys, fast_config):
    log = write_jsonl(tmp_path / "sglang_0101_8_sharegpt.jsonl", [sglang_result()])
    code = main(["validate", "--bench-log", str(log), "--config", str(fast_config), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    rows = json.loads(cap.out)
    by = {(r["metric"], r["stat"]): r for r in rows}
    assert {m for m, _ in by} == {"ttft", "tpot", "itl", "e2e", "request_throughput", "output_throughput"}
    # Real side, by hand over the 7 successful requests (the failed one is left out).
    ok = [i for i, o in enumerate(OUTS) if o]
    ttft = np.array([100 + 10 * i for i in ok], dtype=float)
    assert by[("ttft", "mean")]["real"] == pytest.approx(ttft.mean())
    assert by[("ttft", "p90")]["real"] == pytest.approx(np.percentile(ttft, 90))
    gaps = np.concatenate([[20 + j for j in range(OUTS[i] - 1)] for i in ok])
    assert by[("itl", "mean")]["real"] == pytest.approx(gaps.mean())
    e2e = np.array([100 + 10 * i + sum(20 + j for j in range(OUTS[i] - 1)) for i in ok], dtype=float)
    assert by[("e2e", "p50")]["real"] == pytest.approx(np.median(e2e))
    tpot = np.array([(e - t) / (OUTS[i] - 1) for i, e, t in zip(ok, e2e, ttft) if OUTS[i] > 1])
    assert by[("tpot", "mean")]["real"] == pytest.approx(tpot.mean())
    assert by[("request_throughput", "value")]["real"] == pytest.approx(7 / 3.2)
    # Simulated side: exactly the log's successful requests, at the log's rate.
    real = read_bench_log(log)[0]
    reqs = log_requests(real, seed=1)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(INS[i], OUTS[i]) for i in ok]
    # (replayed on the engine the log names, its API server included: sim/latency/frontend.py)
    summary = summarize(run(load_config(fast_config, ['scheduler.engine="sglang"']), reqs))
    assert by[("ttft", "p99")]["sim"] == pytest.approx(summary["p99_ttft_ms"])
    assert by[("itl", "mean")]["sim"] == pytest.approx(summary["mean_itl_ms"])
    r = by[("e2e", "mean")]
    assert r["error_pct"] == pytest.approx((r["sim"] - r["real"]) / r["real"] * 100)
    # The header says what was assumed (on stderr with --json).
    assert "7 successful requests" in cap.err and "1 failed request(s) left out" in cap.err
    assert "TP1 x PP2" in cap.err and "Poisson 4 req/s" in cap.err


def test_vllm_result_json(tmp_path, capsys, fast_config):
    rec = sglang_result()
    rec = {k: rec[k] for k in ("input_lens", "output_lens", "ttfts", "itls", "errors", "completed", "duration",
                               "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
                               "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms")}
    rec.update(request_rate="inf", burstiness=1.0, max_concurrency=None, backend="vllm", mean_e2el_ms=200.0,
               p99_e2el_ms=260.0)
    log = tmp_path / "vllm-infqps-Qwen2.5-32B-20250101-000000.json"
    log.write_text(json.dumps(rec, indent=2))  # vLLM writes one object, here pretty-printed
    assert main(["validate", "--bench-log", str(log), "--config", str(fast_config)]) == 0
    out = capsys.readouterr().out
    assert "inf (all at t=0)" in out and "itl" in out and "e2e" in out
    reqs = log_requests(read_bench_log(log)[0], seed=1)
    assert all(r.arrival_s == 0.0 for r in reqs)


def test_vllm_burstiness_gives_gamma_gaps(tmp_path):
    rec = dict(sglang_result(rate=2.0), burstiness=0.5)
    log = tmp_path / "v.json"
    log.write_text(json.dumps(rec))
    real = read_bench_log(log)[0]
    assert real["burstiness"] == 0.5
    times = [r.arrival_s for r in log_requests(real, seed=3)]
    # vLLM's get_request: a gamma gap before every request, the first too, rescaled to end at n / rate
    assert times[0] > 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] == pytest.approx(len(times) / 2.0)


def test_max_concurrency_and_a_ramp_up_are_replayed(tmp_path, capsys, fast_config):
    rec = dict(sglang_result(rate=4.0), max_concurrency=2)
    log = tmp_path / "c.jsonl"
    log.write_text(json.dumps(rec))
    assert main(["validate", "--bench-log", str(log), "--config", str(fast_config)]) == 0
    assert "max_concurrency = 2 (first come, first served" in capsys.readouterr().out
    ramp = tmp_path / "r.json"
    ramp.write_text(json.dumps(dict(rec, burstiness=1.0, ramp_up_strategy="linear", ramp_up_start_rps=1,
                                    ramp_up_end_rps=8)))
    assert main(["validate", "--bench-log", str(ramp), "--config", str(fast_config)]) == 0
    assert "linear ramp-up from 1 to 8 req/s" in capsys.readouterr().out
    ramp.write_text(json.dumps(dict(rec, burstiness=1.0, ramp_up_strategy="linear", ramp_up_start_rps=0,
                                    ramp_up_end_rps=8)))
    assert main(["validate", "--bench-log", str(ramp), "--config", str(fast_config)]) == 2
    err = capsys.readouterr().err
    assert "ramp_up_strategy" in err and len(err.strip().splitlines()) == 1


def test_fastpp_fork_lists_with_a_named_workload(tmp_path, capsys, fast_config):
    log = write_jsonl(tmp_path / "b.jsonl", [{"request_rate": 4.0, "ttfts": [0.5, 0.6, 0.7, 0.9] * 5,
                                               "tpots": [0.1, 0.12] * 10, "e2es": [20.0, 30.0, 25.0, 28.0] * 5}])
    code = main(["validate", "--bench-log", str(log), "--workload", "azure-conv-synth", "--config",
                 str(fast_config), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    rows = json.loads(cap.out)
    assert len(rows) == 12
    assert {r["metric"] for r in rows} == {"ttft", "tpot", "e2e"}
    assert {r["stat"] for r in rows} == {"mean", "p50", "p90", "p99"}
    ttft_mean = next(r for r in rows if r["metric"] == "ttft" and r["stat"] == "mean")
    assert ttft_mean["real"] == pytest.approx(675.0)
    assert ttft_mean["error_pct"] == pytest.approx((ttft_mean["sim"] - 675.0) / 675.0 * 100)
    assert "workload azure-conv-synth (--workload), 20 requests" in cap.err


def test_aggregates_only_need_a_workload(tmp_path, capsys, fast_config):
    rec = {k: v for k, v in sglang_result().items() if k not in ("input_lens", "output_lens", "ttfts", "itls")}
    log = write_jsonl(tmp_path / "agg.jsonl", [rec])
    assert main(["validate", "--bench-log", str(log), "--config", str(fast_config)]) == 2
    assert "--workload" in capsys.readouterr().err
    assert main(["validate", "--bench-log", str(log), "--config", str(fast_config), "--workload", "sharegpt",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    stats = {(r["metric"], r["stat"]) for r in rows}
    # Only what the log aggregates: mean/median/p99 (no p90), SGLang's e2e_latency names read as e2e.
    assert ("ttft", "p50") in stats and ("e2e", "p99") in stats and ("ttft", "p90") not in stats
    assert next(r for r in rows if r["metric"] == "e2e" and r["stat"] == "mean")["real"] == 200.0


def _bad(field, value):
    rec = sglang_result()
    rec[field] = value
    return rec


@pytest.mark.parametrize("second,needle", [
    ("{not json", "line 2: not valid JSON"),
    (json.dumps(_bad("request_rate", -1)), "line 2: field 'request_rate'"),
    (json.dumps(_bad("ttfts", "x")), "line 2: field 'ttfts'"),
    (json.dumps(_bad("itls", [1, 2])), "line 2: field 'itls'"),
    (json.dumps(_bad("output_lens", [1, 2])), "line 2: field 'output_lens'"),
    (json.dumps(_bad("input_lens", [1.5] * 8)), "line 2: field 'input_lens'"),
    (json.dumps({"request_rate": 1, "ttfts": [1, 2], "tpots": [], "e2es": [1]}), "line 2: 'ttfts', 'tpots'"),
])
def test_bad_bench_logs(tmp_path, capsys, second, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(sglang_result()) + "\n" + second + "\n")
    with pytest.raises(DataError, match=needle):
        read_bench_log(p)
    assert main(["validate", "--bench-log", str(p)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(p) in err and needle in err


def test_inf_rate_written_by_json_dumps(tmp_path):
    # SGLang's json.dumps writes float("inf") as Infinity, which Python reads back as inf.
    p = write_jsonl(tmp_path / "inf.jsonl", [sglang_result(rate=math.inf)])
    assert math.isinf(read_bench_log(p)[0]["request_rate"])


def test_genai_perf_export_replays_its_concurrency(tmp_path, capsys, fast_config):
    # genai-perf 0.0.16's layout: metric tables with unit/avg/pNN, the stimulus under input_config
    export = {"time_to_first_token": {"unit": "ms", "avg": 120.0, "p50": 110.0, "p90": 150.0, "p99": 200.0},
              "inter_token_latency": {"unit": "ms", "avg": 30.0, "p50": 29.0, "p90": 33.0, "p99": 40.0},
              "request_latency": {"unit": "ms", "avg": 6000.0, "p50": 5900.0, "p90": 7000.0, "p99": 9000.0},
              "request_throughput": {"unit": "per sec", "avg": 1.5},
              "output_token_throughput": {"unit": "tokens/sec", "avg": 300.0},
              "request_count": {"unit": "count", "avg": 40},
              "input_config": {"perf_analyzer": {"stimulus": {"concurrency": 4}}}}
    log = tmp_path / "profile_export_genai_perf.json"
    log.write_text(json.dumps(export))
    real = read_bench_log(log)[0]
    assert real["concurrency"] == 4 and real["completed"] == 40
    assert real["aggregates"][("tpot", "p90")] == 33.0  # genai-perf's ITL is the per-request TPOT
    code = main(["validate", "--bench-log", str(log), "--workload", "azure-conv-synth", "--config",
                 str(fast_config), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "a closed loop of 4 clients" in cap.err
    rows = json.loads(cap.out)
    assert {r["metric"] for r in rows} >= {"ttft", "tpot", "e2e", "request_throughput"}
    export["input_config"] = {"perf_analyzer": {"stimulus": {"request_rate": 2.0}}}
    log.write_text(json.dumps(export))
    assert main(["validate", "--bench-log", str(log), "--workload", "azure-conv-synth", "--config",
                 str(fast_config)]) == 2
    assert "request_rate" in capsys.readouterr().err


def test_the_log_names_the_engine_release_it_is_replayed_on(tmp_path, capsys):
    from sim.studies.validate import engine_for_log

    log = Path("run.json")
    real = {"line": 1, "backend": "vllm", "engine_version": "0.11.0"}
    assert engine_for_log(real, log, None)[:2] == ("vllm-v1", "0.11")
    # a vLLM 0.6 log runs on the V0 scheduler, not on V1
    assert engine_for_log(dict(real, engine_version="0.6.3.post1"), log, None)[:2] == ("vllm-v0", "0.6")
    assert engine_for_log(dict(real, backend="sglang", engine_version="v0.5.4"), log, None)[:2] == ("sglang", "0.5")
    assert engine_for_log(dict(real, engine_version=None), log, None)[:2] == ("vllm-v1", None)
    # a release not modelled is refused, naming it and the known ones
    rec = dict(sglang_result(), backend="vllm", engine_version="0.8.5")
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps(rec))
    assert main(["validate", "--bench-log", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "engine version '0.8.5' (vllm-v1) is not modelled" in err and "vllm-v1 0.15" in err and "vllm-v0 0.6" in err
