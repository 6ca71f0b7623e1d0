"""Trace readers: Mooncake JSONL, BurstGPT CSV, ShareGPT JSON and a mapped plain CSV, each written
by hand from its public schema, read, replayed end to end with `ppsim run --trace`, and their
malformed lines turned into one-line errors naming file, line and field (exit 2)."""

from __future__ import annotations

import json
import math

import pytest

from sim.cli import main
from sim.core.errors import PipeSimError
from sim.workloads import build_workload
from sim.workloads.readers import detect_format
from sim.workloads.stats import describe_requests

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
name = "azure-conv-synth"
num_requests = 400
"""

MOONCAKE = [
    {"timestamp": 0, "input_length": 1225, "output_length": 40, "hash_ids": [0, 1, 2]},
    {"timestamp": 372, "input_length": 800, "output_length": 12, "hash_ids": [0, 3]},
    {"timestamp": 1500, "input_length": 300, "output_length": 9},
    {"timestamp": 2250, "input_length": 64, "output_length": 1},
]
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,Conversation log
131,ChatGPT,1360,297,1657,API log
140.5,ChatGPT,90,12,102,Conversation log
"""


@pytest.fixture
def fast_config(tmp_path):
    p = tmp_path / "fast.toml"
    p.write_text(FAST)
    return p


def mooncake(tmp_path, recs=MOONCAKE, name="trace.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return p


def built(path, **params):
    return build_workload({"kind": "trace", "file": str(path), "arrivals": "timestamps", **params}, seed=1)


def one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ppsim: error:"), err
    for n in needles:
        assert n in err, err
    return err


def test_mooncake_times_are_milliseconds(tmp_path):
    p = mooncake(tmp_path)
    assert detect_format(p) == "mooncake"
    reqs = built(p)
    assert [r.arrival_s for r in reqs] == [0.0, 0.372, 1.5, 2.25]
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(1225, 40), (800, 12), (300, 9), (64, 1)]
    # A JSONL trace in seconds says so explicitly.
    assert built(p, arrival_format="seconds")[1].arrival_s == 372.0


def test_mooncake_replays_end_to_end(tmp_path, capsys, fast_config):
    p = mooncake(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(fast_config), "--trace", str(p), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Mooncake JSONL (milliseconds timestamps)" in text and "hash_ids on 2 rows" in text
    assert "4 requests over 2.2 s" in text
    summary = json.loads((out / "summary.json").read_text())
    # Every row of the file, not the base config's num_requests = 400.
    assert summary["num_requests"] == summary["num_finished"] == 4
    assert summary["context"]["deployment"].startswith("TP1 x PP2")
    # --limit takes the first rows explicitly; more than the file is an error.
    assert main(["run", str(fast_config), "--trace", str(p), "--limit", "2", "--out", str(tmp_path / "r2")]) == 0
    assert json.loads((tmp_path / "r2" / "summary.json").read_text())["num_requests"] == 2
    capsys.readouterr()
    one_line_error(capsys, ["run", str(fast_config), "--trace", str(p), "--limit", "9", "--out", str(tmp_path / "r3")],
                   "'limit' is 9", "has 4 rows")
    one_line_error(capsys, ["run", str(fast_config), "--trace", str(p), "--set", "workload.num_requests=2",
                            "--out", str(tmp_path / "r4")], "--limit")


@pytest.mark.parametrize("bad,needle", [
    ("{not json", "line 3: not valid JSON"),
    (json.dumps({"timestamp": 1600, "input_length": 10}), "line 3: missing field 'output_length'"),
    (json.dumps({"timestamp": 1600, "input_length": 0, "output_length": 4}), "line 3: field 'input_length'"),
    (json.dumps({"timestamp": 1600, "input_length": 2.5, "output_length": 4}), "line 3: field 'input_length'"),
    (json.dumps({"timestamp": 100, "input_length": 5, "output_length": 4}), "line 3: field 'timestamp': out of order"),
    (json.dumps({"timestamp": "x", "input_length": 5, "output_length": 4}), "line 3: field 'timestamp'"),
    (json.dumps({"timestamp": 1600, "input_length": 5, "output_length": 4, "hash_ids": "ab"}), "line 3: field 'hash_ids'"),
])
def test_mooncake_malformed_line(tmp_path, capsys, fast_config, bad, needle):
    p = mooncake(tmp_path, MOONCAKE[:2] + [bad], name="bad.jsonl")
    one_line_error(capsys, ["run", str(fast_config), "--trace", str(p), "--out", str(tmp_path / "r")], str(p), needle)
    one_line_error(capsys, ["workload", "stats", str(p)], str(p), needle)


def test_burstgpt_filter_and_failed_rows(tmp_path, capsys, fast_config):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(BURSTGPT)
    assert detect_format(p) == "burstgpt"
    # A 0-token response is BurstGPT's failed request: an error naming the line, unless dropped on request.
    one_line_error(capsys, ["workload", "stats", str(p)], f"{p}: line 3: column 'Response tokens'", "drop_failed")
    reqs = built(p, filter={"Model": "ChatGPT", "Log Type": "Conversation log"}, drop_failed=True)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 472, 18), (135.5, 90, 12)]
    assert [r.output_tokens for r in built(p, filter={"Model": ["ChatGPT", "GPT-4"]}, drop_failed=True)] == [18, 276,
                                                                                                         297, 12]
    assert main(["workload", "stats", str(p), "--set", 'filter.Model="ChatGPT"', "--set", "drop_failed=true"]) == 0
    out = capsys.readouterr().out
    assert "filter Model=ChatGPT keeps 4" in out and "1 failed rows (0 tokens) dropped" in out
    assert "count            3" in out
    out_dir = tmp_path / "run"
    assert main(["run", str(fast_config), "--trace", str(p), "--set", "workload.drop_failed=true",
                 "--out", str(out_dir)]) == 0
    assert json.loads((out_dir / "summary.json").read_text())["num_finished"] == 4


@pytest.mark.parametrize("row,needle", [
    ("150,ChatGPT,abc,12,102,Conversation log", "line 7: column 'Request tokens'"),
    ("150,ChatGPT,12.5,12,102,Conversation log", "line 7: column 'Request tokens'"),
    ("later,ChatGPT,10,12,102,Conversation log", "line 7: column 'Timestamp'"),
    ("100,ChatGPT,10,12,102,Conversation log", "line 7: column 'Timestamp': out of order"),
])
def test_burstgpt_malformed_line(tmp_path, capsys, fast_config, row, needle):
    p = tmp_path / "burst.csv"
    p.write_text(BURSTGPT + row + "\n")
    one_line_error(capsys, ["run", str(fast_config), "--trace", str(p), "--set", "workload.drop_failed=true",
                            "--out", str(tmp_path / "r")], str(p), needle)


def test_sharegpt_estimated_lengths_and_given_counts(tmp_path, capsys):
    p = tmp_path / "sharegpt.json"
    p.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "x" * 41}, {"from": "gpt", "value": "y" * 8}]},
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
        {"id": "c", "prompt_tokens": 100, "output_tokens": 20},
    ]))
    assert detect_format(p) == "sharegpt"
    reqs = build_workload({"kind": "trace", "file": str(p), "rate_rps": 2.0}, seed=1)
    # ceil(41 / 4) = 11 and ceil(8 / 4) = 2; item b has no reply (skipped, counted); item c as given.
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(11, 2), (100, 20)]
    reqs = build_workload({"kind": "trace", "file": str(p), "rate_rps": 2.0, "chars_per_token": 2}, seed=1)
    assert reqs[0].prompt_tokens == math.ceil(41 / 2)
    one_line_error(capsys, ["workload", "stats", str(p)], "records no arrival times", "rate_rps")
    assert main(["workload", "stats", str(p), "--set", "rate_rps=4"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATED without a tokenizer" in out and "1 conversations without a reply skipped" in out
    p.write_text('[{"id": "a", "conversations": 5}]')
    one_line_error(capsys, ["workload", "stats", str(p), "--set", "rate_rps=4"], "item 0: field 'conversations'")


def test_plain_csv_with_mapped_columns_in_milliseconds(tmp_path, capsys):
    p = tmp_path / "mine.csv"
    p.write_text("t_ms,in,out\n1000,10,5\n1250,20,6\n3000,30,7\n")
    one_line_error(capsys, ["workload", "stats", str(p)], "line 1: missing arrival column 'TIMESTAMP'", "columns")
    reqs = built(p, columns={"arrival": "t_ms", "prompt": "in", "output": "out"}, arrival_format="milliseconds")
    assert [r.arrival_s for r in reqs] == [0.0, 0.25, 2.0]
    assert main(["workload", "stats", str(p), "--set", "columns.arrival=t_ms", "--set", "columns.prompt=in",
                 "--set", "columns.output=out", "--set", "arrival_format=milliseconds", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["count"] == 3 and stats["duration_s"] == pytest.approx(2.0) and stats["rate_rps"] == 1.5


def test_replay_never_drops_rows_silently(tmp_path):
    p = mooncake(tmp_path)
    with pytest.raises(PipeSimError, match="'num_requests' is 9"):
        built(p, num_requests=9)
    assert len(built(p, num_requests=3)) == 3  # fewer is an explicit selection of a workload file


def test_benchmark_result_is_not_a_trace(tmp_path):
    p = tmp_path / "sglang.jsonl"
    p.write_text(json.dumps({"request_rate": 4, "ttfts": [0.1], "itls": [[]]}) + "\n")
    with pytest.raises(PipeSimError, match="ppsim validate"):
        detect_format(p)


def test_stats_of_a_file_name_the_file_and_describe_it(tmp_path):
    p = mooncake(tmp_path)
    reqs = describe_requests(str(p), {}, seed=1, as_built=False)
    assert len(reqs) == 4
