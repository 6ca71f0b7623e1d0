"""The `trace` kind: statistics against the Azure 2023 conv trace, replay, and bad-trace errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.core.errors import ConfigError, DataError, PipeSimError
from sim.workloads import build_workload
from sim.workloads.stats import describe_requests, workload_stats

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
AZURE = SHARED / "azure-llm-inference-2023"
needs_trace = pytest.mark.skipif(
    not (AZURE / "AzureLLMInferenceTrace_conv.csv").is_file(),
    reason="../shared/data (the Azure 2023 trace copy) is absent",
)


@pytest.fixture
def azure_cache(monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(AZURE))


def stats_of(name, seed=1, as_built=False, **over):
    return workload_stats(describe_requests(name, over, seed=seed, as_built=as_built))


@needs_trace
def test_full_trace_statistics(azure_cache):
    s = stats_of("azure-conv")
    assert s["count"] == 19366
    assert s["prompt_mean"] == pytest.approx(1154.7, abs=0.05)
    assert s["output_mean"] == pytest.approx(211.1, abs=0.05)
    assert (s["prompt_p50"], s["prompt_p90"], s["prompt_p99"]) == (1020, 2734.5, 4142)
    assert (s["output_p50"], s["output_p90"], s["output_p99"]) == (129, 424, 601)
    assert s["duration_s"] == pytest.approx(3501.722, abs=1e-3)
    assert s["rate_rps"] == pytest.approx(5.53, abs=0.005)
    assert s["interarrival_cv"] == pytest.approx(1.094, abs=0.001)
    code = stats_of("azure-code")
    assert code["count"] == 8819 and code["prompt_mean"] == pytest.approx(2047.8, abs=0.05)


@needs_trace
def test_first_400_rows_as_poisson(azure_cache):
    reqs = build_workload({"name": "azure-conv"}, seed=1)
    assert len(reqs) == 400
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(927.6, abs=0.05)
    assert np.mean([r.output_tokens for r in reqs]) == pytest.approx(260.0, abs=0.05)
    # Timestamps are ignored: Poisson at rate_rps from t = 0; same seed same, other seed not.
    assert reqs[0].arrival_s == 0.0
    assert build_workload({"name": "azure-conv"}, seed=1) == reqs
    other = build_workload({"name": "azure-conv"}, seed=2)
    assert [r.arrival_s for r in other] != [r.arrival_s for r in reqs]
    assert [r.prompt_tokens for r in other] == [r.prompt_tokens for r in reqs]  # same rows
    faster = build_workload({"name": "azure-conv", "rate_rps": 8.0}, seed=1)
    assert faster[-1].arrival_s == pytest.approx(reqs[-1].arrival_s / 2)


@needs_trace
def test_fifteen_minute_window(azure_cache):
    s = stats_of("azure-conv", window_minutes=15)
    assert s["count"] == 4424
    assert s["prompt_mean"] == pytest.approx(1172.7, abs=0.05)
    assert s["duration_s"] == pytest.approx(899.882, abs=1e-3)


@needs_trace
def test_replay_with_speedup_lasts_one_over_speedup(azure_cache):
    replay = build_workload({"name": "azure-conv-replay"}, seed=1)
    plain = build_workload({"name": "azure-conv-replay", "timestamp_speedup": 1.0}, seed=1)
    assert len(replay) == len(plain) == 4424
    assert replay[-1].arrival_s == pytest.approx(plain[-1].arrival_s / 0.9)
    assert np.allclose([r.arrival_s * 0.9 for r in replay], [r.arrival_s for r in plain])
    assert len(replay) / replay[-1].arrival_s == pytest.approx(4.42, abs=0.01)


@needs_trace
def test_sample_ratio_keeps_floor_n_r_rows_in_order(azure_cache):
    full = build_workload({"name": "azure-conv-replay"}, seed=1)
    half = build_workload({"name": "azure-conv-replay", "sample_ratio": 0.3}, seed=1)
    assert len(half) == int(np.floor(4424 * 0.3))
    assert half[0].arrival_s == 0.0 and all(a.arrival_s <= b.arrival_s for a, b in zip(half, half[1:]))
    # Every kept row is a row of the window (times shifted to the first kept row).
    full_set = {(round(r.arrival_s, 6), r.prompt_tokens, r.output_tokens) for r in full}
    shift = next(r.arrival_s for r in full if (r.prompt_tokens, r.output_tokens) == (half[0].prompt_tokens,
                                                                                        half[0].output_tokens))
    assert all((round(r.arrival_s + shift, 6), r.prompt_tokens, r.output_tokens) in full_set for r in half[:50])
    other = build_workload({"name": "azure-conv-replay", "sample_ratio": 0.3}, seed=2)
    assert other != half
    tiny = build_workload({"name": "azure-conv-replay", "sample_ratio": 1e-9}, seed=1)
    assert len(tiny) == 1  # k = max(1, floor(n r))


@needs_trace
def test_swap(azure_cache):
    a = build_workload({"name": "azure-conv"}, seed=1)
    b = build_workload({"name": "azure-conv", "swap": True}, seed=1)
    assert [(r.output_tokens, r.prompt_tokens) for r in b] == [(r.prompt_tokens, r.output_tokens) for r in a]


def test_user_csv_with_own_columns_and_seconds(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("t,in,out\n10.0,5,6\n10.5,7,8\n12.0,9,10\n")
    table = {
        "kind": "trace", "file": str(f), "arrivals": "timestamps", "timestamp_speedup": 2.0,
        "columns": {"arrival": "t", "prompt": "in", "output": "out"},
    }
    reqs = build_workload(table, seed=0)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0, 5, 6), (0.25, 7, 8), (1.0, 9, 10)]
    reqs = build_workload({**table, "arrivals": "poisson", "rate_rps": 1.0, "num_requests": 2}, seed=0)
    assert [r.prompt_tokens for r in reqs] == [5, 7]


def test_missing_cached_trace_names_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path))
    with pytest.raises(DataError) as exc:
        build_workload({"name": "azure-conv"}, seed=0)
    msg = str(exc.value)
    assert "\n" not in msg and "ppsim workload fetch azure-conv-2023" in msg and "AzureLLMInferenceTrace_conv.csv" in msg


GOOD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
BAD_CSVS = {
    # name: (csv text, extra params, exception, substrings expected in the message)
    "zero prompt": (GOOD + "2023-11-16 18:15:51.0,0,5\n", {}, DataError, ["line 4", "'ContextTokens'", "'0'"]),
    "negative output": (GOOD + "2023-11-16 18:15:51.0,5,-3\n", {}, DataError, ["line 4", "GeneratedTokens"]),
    "fractional length": (GOOD + "2023-11-16 18:15:51.0,5.5,3\n", {}, DataError, ["line 4", "must be an integer in [1, "]),
    "text length": (GOOD + "2023-11-16 18:15:51.0,abc,3\n", {}, DataError, ["line 4", "'abc'"]),
    "blank length": (GOOD + "2023-11-16 18:15:51.0,,3\n", {}, DataError, ["line 4"]),
    "missing column": ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,374\n", {}, DataError,
                       ["line 1", "'GeneratedTokens'", "columns present"]),
    "bad timestamp": (GOOD + "yesterday noon,5,3\n", {}, DataError, ["line 4", "unparseable timestamp"]),
    "out of order": (GOOD + "2023-11-16 18:15:40.0,5,3\n", {}, DataError, ["line 4", "out of order"]),
    "bad seconds": ("t,ContextTokens,GeneratedTokens\n0.5,1,2\nsoon,1,2\n", {"columns": {"arrival": "t"}},
                    DataError, ["line 3", "seconds"]),
    "empty file": ("", {}, DataError, ["empty file"]),
    "header only": ("TIMESTAMP,ContextTokens,GeneratedTokens\n", {}, DataError, ["no data rows"]),
    "ragged row": (GOOD + "2023-11-16 18:15:51.0,5,3,9\n", {}, DataError, ["line 4"]),
    "empty window": (GOOD, {"arrivals": "timestamps", "window_minutes": 1, "window_start_minutes": 5},
                     DataError, ["empty window", "minute 5"]),
    "zero window": (GOOD, {"arrivals": "timestamps", "window_minutes": 0}, ConfigError, ["'window_minutes'"]),
    "ratio zero": (GOOD, {"arrivals": "timestamps", "sample_ratio": 0}, ConfigError, ["'sample_ratio'", "(0, 1]"]),
    "ratio above one": (GOOD, {"arrivals": "timestamps", "sample_ratio": 1.5}, ConfigError, ["(0, 1]"]),
    "zero rate": (GOOD, {"rate_rps": 0}, ConfigError, ["'rate_rps'", "> 0"]),
    "negative rate": (GOOD, {"rate_rps": -2.0}, ConfigError, ["'rate_rps'"]),
    "negative speedup": (GOOD, {"arrivals": "timestamps", "timestamp_speedup": -1}, ConfigError,
                         ["'timestamp_speedup'"]),
    "too many rows": (GOOD, {"num_requests": 5}, ConfigError, ["'num_requests'", "2 rows"]),
    "bad mode": (GOOD, {"arrivals": "replay"}, ConfigError, ["one of: poisson, timestamps"]),
    "typo field": (GOOD, {"timestamp_speed": 0.9}, ConfigError, ["unknown field 'timestamp_speed'"]),
    "bad format": (GOOD, {"arrival_format": "epoch"}, ConfigError, ["one of: auto, timestamp, seconds"]),
    "missing file": (None, {"file": "no/such/trace.csv"}, DataError, ["no/such/trace.csv", "not found"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CSVS))
def test_bad_trace_gives_one_line_error(case, tmp_path):
    text, extra, exc_type, needles = BAD_CSVS[case]
    f = tmp_path / "bad.csv"
    if text is not None:
        f.write_text(text)
    table = {"kind": "trace", "file": str(f), "rate_rps": 1.0, **extra}
    with pytest.raises(PipeSimError) as exc:
        build_workload(table, seed=0)
    assert isinstance(exc.value, exc_type)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    # Data problems name the CSV; config problems name where the field came from.
    assert ("bad.csv" in msg or "trace.csv" in msg) if exc_type is DataError else "config [workload]" in msg, msg
    for needle in needles:
        assert needle in msg, msg
