"""What was changed is said (issue 32): every prompt truncated, output clipped, row or conversation
skipped or dropped by a reader, turn not sent, and an empty timeline window gets one warning line
on stderr (`ppsim: warning: ...`, naming the file and the count) and the same line in
summary.json's `warnings`. One test per kind."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fuzzing import invoke

REPO = Path(__file__).resolve().parents[1]
DEFAULT = str(REPO / "experiments" / "configs" / "default.toml")
SMALL = ["--set", "workload.num_requests=10"]


def said(err: str, out: Path, *needles: str) -> str:
    """The one warning line holding every needle, also in summary.json's `warnings`."""
    lines = [ln.removeprefix("ppsim: warning: ") for ln in err.splitlines() if ln.startswith("ppsim: warning:")]
    hits = [ln for ln in lines if all(n in ln for n in needles)]
    assert len(hits) == 1, f"no single warning with {needles} on stderr:\n{err}"
    assert hits[0] in json.loads((out / "summary.json").read_text()).get("warnings", []), hits[0]
    return hits[0]


def silent(err: str, out: Path) -> None:
    assert "ppsim: warning:" not in err, err
    assert "warnings" not in json.loads((out / "summary.json").read_text())


def _run(tmp_path: Path, *argv: str) -> tuple[str, Path]:
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, *argv, "--no-iterations", "--out", str(out)])
    assert code == 0, err
    return err, out


def test_truncated_prompts_are_said(tmp_path):
    err, out = _run(tmp_path, *SMALL, "--set", "scheduler.context_length_tokens=600")
    n = json.loads((out / "summary.json").read_text())["num_truncated_prompts"]
    assert n > 0 and said(err, out, f"{n} prompt(s)", "truncated")


def test_clipped_outputs_are_said(tmp_path):
    # prompts that fit the context, outputs that do not: clipped, not truncated
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 100, "input_length": 300, "output_length": 20 + 300 * (i % 2)})
                             + "\n" for i in range(6)))
    err, out = _run(tmp_path, "--trace", str(trace), "--set", "scheduler.context_length_tokens=400")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_truncated_prompts"] == 0 and summary["num_clipped_outputs"] == 3
    said(err, out, "3 output(s)", "clipped")


def test_a_run_that_changed_nothing_says_nothing(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 100, "input_length": 30, "output_length": 5}) + "\n"
                             for i in range(6)))
    silent(*_run(tmp_path, "--trace", str(trace)))


def test_sharegpt_conversations_without_a_reply_are_said(tmp_path):
    data = [{"conversations": [{"from": "human", "value": "hello " * 20}, {"from": "gpt", "value": "hi " * 10}]}] * 4
    data += [{"conversations": [{"from": "human", "value": "unanswered"}]}, {"conversations": []}]
    trace = tmp_path / "share.json"
    trace.write_text(json.dumps(data))
    err, out = _run(tmp_path, "--trace", str(trace), "--set", "workload.rate_rps=2")
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 4
    said(err, out, str(trace), "2 conversation(s) of 6", "without a reply")


def test_burstgpt_failed_rows_dropped_are_said(tmp_path):
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{i},ChatGPT,{100 + i},{0 if i in (2, 5) else 20},{120 + i},Conversation log" for i in range(8)]
    trace = tmp_path / "burst.csv"
    trace.write_text("\n".join(rows) + "\n")
    err, out = _run(tmp_path, "--trace", str(trace), "--set", "workload.drop_failed=true")
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 6
    said(err, out, str(trace), "2 failed row(s) of 8", "dropped")


def _conversation_file(tmp_path: Path) -> Path:
    turn = [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 200}]  # 100 + 50 tokens
    data = [{"conversations": turn * 3},                          # 3 turns
            {"conversations": turn + [{"from": "human", "value": "left unanswered"}]},  # 1 turn + 1 message
            {"conversations": [{"from": "human", "value": "alone"}]}]                   # skipped
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(data))
    return path


def _conversation_run(tmp_path: Path, *extra: str) -> tuple[str, Path]:
    path = _conversation_file(tmp_path)
    return _run(tmp_path, "--set", f'workload={{kind = "conversation", file = "{path}", rate_rps = 1.0, '
                                   f'num_sessions = 3, think_time_s = 0.5{"".join(extra)}}}')


def test_conversation_files_skipped_and_unsent_messages_are_said(tmp_path):
    err, out = _conversation_run(tmp_path)
    path = str(tmp_path / "conv.json")
    said(err, out, path, "1 conversation(s) without a message and a reply skipped")
    said(err, out, path, "1 message(s) without a reply")
    said(err, out, path, "num_sessions = 3", "2 usable conversation(s)")
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 4


def test_conversation_turns_past_the_context_are_said(tmp_path):
    # turn k's prompt is the conversation so far: 100, 250, 400 tokens (+ 50 out): the third outgrows 400
    err, out = _conversation_run(tmp_path, ", max_context_tokens = 400")
    said(err, out, "1 turn(s) of 1 conversation(s) past max_context_tokens = 400")
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 3


def test_an_empty_timeline_window_is_said(tmp_path):
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--timeline", "--window", "5000:5001", "--out", str(out)])
    assert code == 0
    said(err, out, "--window 5000:5001", "no iteration")


# ------------------------------------------------ studies: the reader's lines once, before the runs

def _burst(tmp_path: Path) -> Path:
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{i},ChatGPT,{100 + i},{0 if i in (2, 5) else 20},{120 + i},Conversation log" for i in range(30)]
    trace = tmp_path / "burst.csv"
    trace.write_text("\n".join(rows) + "\n")
    return trace


def _said_once(err: str, *needles: str) -> None:
    hits = [ln for ln in err.splitlines() if ln.startswith("ppsim: warning:") and all(n in ln for n in needles)]
    assert len(hits) == 1, err


def test_goodput_and_gate_say_what_the_reader_changed_once(tmp_path):
    trace = _burst(tmp_path)
    wl = f'workload={{kind="trace", file="{trace}", drop_failed=true, rate_rps=1.0}}'
    code, _, err = invoke(["goodput", DEFAULT, "--set", wl, "--rates", "1:2", "--out", str(tmp_path / "g"),
                           "--no-progress"])
    assert code == 0, err
    _said_once(err, str(trace), "2 failed row(s) of 30", "dropped")
    code, _, err = invoke(["gate", DEFAULT, "--set", wl, "--baseline", "engine:fastpp", "--candidate",
                           "engine:vllm-v1", "--metric", "p90_ttft", "--expect", "no-worse", "--seeds", "2",
                           "--no-progress"])
    assert code in (0, 1), err  # (the verdict is not the point here)
    _said_once(err, str(trace), "2 failed row(s) of 30", "dropped")


def test_plan_says_what_the_reader_changed_and_keeps_it_in_plan_json(tmp_path):
    trace = _burst(tmp_path)
    out = tmp_path / "p"
    code, _, err = invoke(["plan", "--model", "qwen2.5-32b", "--gpus", "1", "--gpu", "a100-sxm-80gb", "--trace",
                           str(trace), "--set", "workload.drop_failed=true", "--quick", "--seeds", "1", "--out",
                           str(out), "--no-progress"])
    assert code == 0, err
    _said_once(err, str(trace), "2 failed row(s) of 30", "dropped")
    assert any("2 failed row(s) of 30" in w for w in json.loads((out / "plan.json").read_text())["workload_warnings"])
