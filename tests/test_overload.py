"""Overload that answers: `[server] on_kv_exhausted`, the saturation fields, their display."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim.cli import main
from sim.engine.run import run
from sim.outputs.metrics import summarize
from sim.outputs.report import make_report
from sim.outputs.saturation import saturation

from conftest import REPO, make_config

# Found by a random search: pp = 3 and a pool of 3,000 tokens; admission does not reserve for the
# requests inside the other slots' in-flight micro-batches, so a prefill allocation fails.
PREFILL_OOM = dict(
    parallel={"pp": 3, "tp": 1}, scheduler={"chunk_size_tokens": 64, "kv_tokens": 3000},
    workload={"kind": "poisson", "rate_rps": 10.0, "num_requests": 20,
              "lengths": {"source": "pairs", "prompt_tokens": [10, 700, 10], "output_tokens": [2, 200, 200]}})
# A decode batch whose last request cannot get its KV slot after retraction.
DECODE_OOM = dict(
    parallel={"pp": 4, "tp": 1}, scheduler={"chunk_size_tokens": 512, "kv_tokens": 1500},
    workload={"kind": "poisson", "rate_rps": 1000.0, "num_requests": 30,
              "lengths": {"source": "pairs", "prompt_tokens": [10, 300, 700], "output_tokens": [200, 200, 400]}})


@pytest.mark.parametrize("table,what", [(PREFILL_OOM, "prefill batch"), (DECODE_OOM, "decode batch")])
def test_exit_fails_like_the_artifact_and_retract_keeps_serving(table, what):
    res = run(make_config(**table))
    assert res.status == "failed" and "KV allocation failed" in res.reason and what in res.reason
    assert run(make_config(server={"on_kv_exhausted": "exit"}, **table)).reason == res.reason  # the default
    res = run(make_config(server={"on_kv_exhausted": "retract"}, **table))
    s = summarize(res)
    assert res.status == "ok" and s["num_finished"] == s["num_requests"] == table["workload"]["num_requests"]
    assert s["num_kv_exhausted"] > 0 and s["num_retractions"] > 0
    assert all(r.out_len == r.max_new and r.kv_held == 0 for r in res.requests)


def test_bad_on_kv_exhausted_names_the_allowed_values():
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[server\] on_kv_exhausted must be one of: exit, retract; got 'die'"):
        make_config(server={"on_kv_exhausted": "die"})


def _frames(waiting: list[int], finish: list[float]):
    """Ten arrivals at t = 0..9; iteration k runs [k, k+1] and leaves `waiting[k]` queued."""
    req = pd.DataFrame({"arrival_s": [float(i) for i in range(10)], "finish_s": finish})
    it = pd.DataFrame({"start_s": [float(k) for k in range(len(waiting))],
                       "end_s": [float(k + 1) for k in range(len(waiting))], "num_waiting": waiting, "replica": 0})
    return req, it


def test_saturation_hand_case():
    # t0 = 0, t_e = 9; the queue is last empty after iteration 0 (t_s = 1.0) and next empty at the
    # start of iteration 12 (t_q = 12.0). Arrivals in (1, 9]: 8 > completions in (1, 9]: 3 (4, 6, 8),
    # and t_e - t_s = 8 >= 9/2: saturated. First completion 4.0 = t_a; completions in (4, 12]:
    # 6, 8, 10, 12 -> 4 / (12 - 4) = 0.5 req/s.
    waiting = [0, 1, 2, 3, 4, 5, 6, 7, 8, 3, 2, 1, 0, 0, 0]
    req, it = _frames(waiting, [4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0])
    # The measured span: warm-up = median e2e of the first quarter's arrivals (0, 1, 2 -> 4, 5, 6 s) = 5 s,
    # so t_m = max(0 + 9/2, 0 + 5) = 5; in (5, 9]: arrivals 6, 7, 8, 9 (1.0 req/s), completions 6, 8 (0.5 req/s).
    assert saturation(req, it, end_s=22.0) == {"saturated": True, "saturated_since_s": 1.0,
                                               "saturated_until_s": 12.0, "sustained_throughput_rps": 0.5,
                                               "offered_rate_rps": 1.0, "completion_rate_rps": 0.5}


def test_a_backlog_in_the_running_set_is_saturation_without_a_queue():
    # 100 arrivals at t = 0..99 (1 req/s), served at 0.5 req/s without ever queueing (a vLLM V1
    # batch that admits everything): finish_i = 2 i + 1. Warm-up: median e2e of arrivals <= 24.75
    # (i = 0..24: e2e = i + 1) = 13 s; t_m = max(49.5, 13) = 49.5; in (49.5, 99]: 50 arrivals, completions
    # 2i + 1 in (49.5, 99] -> i = 25..49: 25. Backlog 25 > max(5, 3 sqrt(50) = 21.2): saturated.
    arrival = [float(i) for i in range(100)]
    req = pd.DataFrame({"arrival_s": arrival, "finish_s": [2.0 * i + 1 for i in range(100)]})
    it = pd.DataFrame({"start_s": arrival, "end_s": [a + 1 for a in arrival], "num_waiting": 0, "replica": 0})
    s = saturation(req, it, end_s=200.0)
    assert s["saturated"] is True and s["saturated_since_s"] == 49.5
    assert s["offered_rate_rps"] == pytest.approx(50 / 49.5) and s["completion_rate_rps"] == pytest.approx(25 / 49.5)
    assert s["sustained_throughput_rps"] == s["completion_rate_rps"]
    # served at the arrival rate (finish_i = i + 3; in (49.5, 99]: i = 47..96): not saturated
    req["finish_s"] = [i + 3.0 for i in range(100)]
    s = saturation(req, it, end_s=200.0)
    assert s["saturated"] is False and s["sustained_throughput_rps"] is None
    assert s["offered_rate_rps"] == pytest.approx(50 / 49.5) and s["completion_rate_rps"] == pytest.approx(50 / 49.5)


def test_a_queue_that_empties_late_in_the_load_is_not_saturated():
    # the queue empties at iteration 7 (t_s = 8.0): 9 - 8 < 9/2
    waiting = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 1, 0, 0, 0, 0]
    req, it = _frames(waiting, [4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0])
    assert saturation(req, it, end_s=22.0)["saturated"] is False
    assert saturation(req, it, end_s=22.0)["sustained_throughput_rps"] is None


def test_sustained_throughput_is_the_service_rate_of_a_deterministic_server():
    # pp = 1, every iteration 100 ms, one 10-token prompt per batch (chunk 10), one output token:
    # one completion per 100 ms = 10 req/s, offered 20 req/s. Whatever the run length, the
    # sustained throughput is 10 req/s while the overall throughput depends on the drain.
    rates = []
    for n in (60, 200):
        cfg = make_config(parallel={"pp": 1, "tp": 1}, scheduler={"chunk_size_tokens": 10, "kv_tokens": 50_000},
                          latency={"kind": "constant", "stage_ms": 100.0},
                          workload={"kind": "poisson", "rate_rps": 20.0, "num_requests": n,
                                    "lengths": {"source": "pairs", "prompt_tokens": [10], "output_tokens": [1]}})
        s = summarize(run(cfg))
        assert s["saturated"] is True
        rates.append(s["sustained_throughput_rps"])
    assert rates == pytest.approx([10.0, 10.0], rel=1e-9)


def test_light_load_is_not_saturated():
    s = summarize(run(make_config()))
    assert s["saturated"] is False and s["sustained_throughput_rps"] is None


DETERMINISTIC_SERVER = """
seed = 1
[parallel]
pp = 1
[scheduler]
chunk_size_tokens = 10
kv_tokens = 50000
[latency]
kind = "constant"
stage_ms = 100.0
[workload]
kind = "poisson"
rate_rps = 20.0
num_requests = 60
lengths = { source = "pairs", prompt_tokens = [10], output_tokens = [1] }
"""


def test_run_prints_uneven_stage_layers_first(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(["run", str(REPO / "experiments/configs/default.toml"), "--set", "parallel.pp=3",
                 "--set", "workload.num_requests=20", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    # the artifact's split: floor(64 / 3) = 21 per stage, the last takes the rest
    assert summary["stage_layers"] == [21, 21, 22]
    body = [line for line in printed.splitlines() if not line.startswith("#")]  # after the context header
    assert body[0].split() == ["stage_layers", "[21,", "21,", "22]"]


def test_saturated_run_says_so_in_summary_and_report(tmp_path, capsys):
    cfg = tmp_path / "sat.toml"
    cfg.write_text(DETERMINISTIC_SERVER)
    out = tmp_path / "r"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["saturated"] is True and summary["sustained_throughput_rps"] == pytest.approx(10.0)
    assert "sustained_throughput_rps  10" in printed
    md, _png = make_report(out)
    assert md.read_text().splitlines()[2].startswith("> **SATURATED: the queue kept growing")
    assert "sustained throughput 10 req/s" in md.read_text()


def test_failed_run_is_the_first_thing_the_report_says(tmp_path):
    from sim.outputs.metrics import iterations_frame, requests_frame

    res = run(make_config(**PREFILL_OOM))
    out = tmp_path / "f"
    out.mkdir()
    requests_frame(res).to_csv(out / "requests.csv", index=False)
    iterations_frame(res).to_csv(out / "iterations.csv", index=False)
    summary = {k: v for k, v in summarize(res).items()}
    (out / "summary.json").write_text(json.dumps(summary, default=float))
    md, png = make_report(out)
    assert md.read_text().splitlines()[2].startswith("> **RUN FAILED: KV allocation failed")
    assert png.stat().st_size > 0


def test_stage_layers_rule():
    from sim.core.errors import ConfigError
    from sim.latency.profiled import stage_layers

    assert stage_layers(64, 3) == [21, 21, 22]
    assert stage_layers(64, 64) == [1] * 64
    assert stage_layers(4, 3) == [1, 1, 2]
    with pytest.raises(ConfigError, match=r"pp = 65 does not fit a model of 64 layers; allowed: 1\.\.64"):
        stage_layers(64, 65)


@pytest.mark.parametrize("rate,saturated", [(3.0, False), (30.0, True)])
def test_a_disaggregated_run_reports_its_completion_rate_and_saturation(tmp_path, rate, saturated):
    # 1 prefill + 1 decode TP4 instance of Llama-3.1-70B on H100 serve about 8 req/s of this load; on main
    # both runs said saturated false (a disaggregated run has no one queue to watch)
    out = tmp_path / "r"
    assert main(["run", str(REPO / "experiments/configs/disagg_70b.toml"), "--set", f"workload.rate_rps={rate}",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["saturated"] is saturated
    assert s["offered_rate_rps"] == pytest.approx(rate, rel=0.15)
    if saturated:
        assert s["completion_rate_rps"] < 0.5 * s["offered_rate_rps"]
        assert s["sustained_throughput_rps"] == s["completion_rate_rps"]
    else:
        assert s["completion_rate_rps"] == pytest.approx(s["offered_rate_rps"], rel=0.1)


def test_a_context_length_beyond_the_models_is_refused(tmp_path, capsys):
    # issue 40 item 3: 50,000-token prompts ran on Qwen2.5-32B (32,768) with context_length_tokens = 65536
    code = main(["run", str(REPO / "experiments/configs/default.toml"), "--set", "scheduler.context_length_tokens=65536",
                 "--set", "workload.num_requests=10", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "context_length_tokens = 65536 exceeds the model's context length 32768" in err and "allowed: <= 32768" in err
    assert main(["run", str(REPO / "experiments/configs/default.toml"), "--set", "scheduler.context_length_tokens=32768",
                 "--set", "workload.num_requests=10", "--out", str(tmp_path / "ok")]) == 0


def test_the_default_context_is_the_models_own_where_that_is_shorter():
    # a model of 8,192 tokens with the config's context left at its default (16,384): the engines default to
    # the model's own context, so the run does (max_req_len = context - 1 where the pool is larger)
    from sim.core.config import DEFAULT_CONTEXT_TOKENS, config_from_table
    from sim.engine.run import build_latency, pool_sizes

    t = {"latency": {"kind": "profile", "profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp4"},
         "parallel": {"tp": 4}, "workload": {"name": "sharegpt", "num_requests": 10}}
    cfg = config_from_table(t)
    assert cfg.scheduler.context_length_tokens == DEFAULT_CONTEXT_TOKENS
    latency = build_latency(cfg)
    kv, _, max_req_len, max_input = pool_sizes(cfg, latency)
    assert kv > DEFAULT_CONTEXT_TOKENS and max_req_len == DEFAULT_CONTEXT_TOKENS - 1  # 32,768 > 16,384: unchanged
    model = latency.profile.meta["model"]
    own = model["context_length_tokens"]
    try:  # (the profile object is cached per process: restored below)
        model["context_length_tokens"] = 8192
        kv, _, max_req_len, max_input = pool_sizes(cfg, latency)
        assert max_req_len == 8191 and max_input == 8186
        # a context set above the model's own is still refused
        with pytest.raises(Exception, match="exceeds the model's context length 8192"):
            pool_sizes(config_from_table({**t, "scheduler": {"context_length_tokens": 20000}}), latency)
    finally:
        model["context_length_tokens"] = own
