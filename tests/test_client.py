"""The benchmark client: closed loops, max_concurrency, think time, timeouts, arrivals, lengths.

Each case is small enough to compute by hand. The service time is fixed with the constant
latency model: one iteration = `stage_ms` (pp = 1, no overhead) whatever the batch, so a request
of `o` output tokens takes o iterations (its prefill gives the first token, then o - 1 decodes).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from sim.core.config import config_from_table
from sim.core.errors import ConfigError
from sim.core.rng import stream
from sim.engine.run import run
from sim.outputs.metrics import requests_frame, summarize
from sim.workloads import arrivals as arr
from sim.workloads import build_workload, workload_client
from sim.workloads.bench import random_lengths


def config(workload: dict, stage_ms: float = 10.0, **over):
    table = {
        "seed": 1,
        "parallel": {"pp": 1, "tp": 1},
        "latency": {"kind": "constant", "stage_ms": stage_ms, "overhead_ms": 0.0},
        "scheduler": {"kv_tokens": 100000},
        "workload": workload,
    }
    table.update(over)
    return config_from_table(table, "test")


def bench(**kw):
    return {"kind": "bench", "num_requests": 10, "input_len": 100, "output_len": 10, **kw}


def test_closed_loop_of_two_clients_gives_clients_over_service_time():
    # each request: 10 iterations of 10 ms = 100 ms; 2 clients -> 2 / 0.1 s = 20 requests/s,
    # 10 requests in 5 rounds: the last finishes at 0.5 s
    result = run(config(bench(concurrency=2)))
    s = summarize(result)
    assert s["completed"] == 10
    assert s["benchmark_duration_s"] == pytest.approx(0.5)
    assert s["request_throughput"] == pytest.approx(20.0)
    assert s["mean_e2el_ms"] == pytest.approx(100.0)
    df = requests_frame(result)
    assert np.allclose(df["arrival_s"], np.repeat([0.0, 0.1, 0.2, 0.3, 0.4], 2))
    assert s["mean_ttft_ms"] == pytest.approx(10.0)  # sent when a slot frees: no queueing in TTFT


def test_think_time_adds_to_each_clients_cycle():
    # cycle = 100 ms service + 50 ms think: sends at 0, 0.15, ..., 0.6; last finish at 0.7 s
    result = run(config(bench(concurrency=2, think_time={"distribution": "constant", "mean_s": 0.05})))
    s = summarize(result)
    assert s["benchmark_duration_s"] == pytest.approx(0.7)
    assert s["request_throughput"] == pytest.approx(10 / 0.7)
    assert np.allclose(requests_frame(result)["arrival_s"], np.repeat(np.arange(5) * 0.15, 2))


def test_exponential_think_time_is_drawn_from_its_stream():
    a = requests_frame(run(config(bench(concurrency=1, think_time={"mean_s": 0.2}))))
    b = requests_frame(run(config(bench(concurrency=1, think_time={"mean_s": 0.2}))))
    assert a["arrival_s"].tolist() == b["arrival_s"].tolist()  # deterministic
    think = stream(1, "think").exponential(0.2, size=10)
    # one client: request i + 1 is sent 100 ms + think_i after request i
    assert np.allclose(np.diff(a["arrival_s"]), 0.1 + think[:-1])


def test_max_concurrency_caps_an_open_loop_first_come_first_served():
    # constant arrivals every 10 ms, one slot, 100 ms a request: request i is sent at 0.1 i
    result = run(config(bench(arrivals="constant", rate_rps=100.0, max_concurrency=1)))
    df = requests_frame(result)
    assert np.allclose(df["arrival_s"], np.arange(10) * 0.1)
    assert np.allclose(df["ttft_ms"], 10.0)  # the wait for a slot is not in the TTFT (both clients)
    # rate inf with max_concurrency N is the closed loop of N clients
    closed = summarize(run(config(bench(concurrency=3))))
    capped = summarize(run(config(bench(max_concurrency=3))))
    assert closed["request_throughput"] == capped["request_throughput"]


def test_max_concurrency_not_binding_leaves_open_loop_send_times():
    # 10 ms apart, 100 ms each: at most 10 in flight, so a cap of 10 changes nothing
    open_loop = requests_frame(run(config(bench(arrivals="constant", rate_rps=100.0))))
    capped = requests_frame(run(config(bench(arrivals="constant", rate_rps=100.0, max_concurrency=10))))
    assert open_loop["arrival_s"].tolist() == capped["arrival_s"].tolist()
    assert open_loop["finish_s"].tolist() == capped["finish_s"].tolist()


def test_timeout_counts_the_slow_requests_as_failed():
    # both at t = 0 in one batch: 5 tokens take 50 ms, 20 tokens 200 ms; a 100 ms timeout fails
    # the second, which the server still finishes (no abort modelled)
    wl = {"kind": "poisson", "rate_rps": math.inf,
          "lengths": {"source": "pairs", "prompt_tokens": [100, 100], "output_tokens": [5, 20]},
          "request_timeout_s": 0.1}
    result = run(config(wl))
    df = requests_frame(result)
    assert df["status"].tolist() == ["finished", "timed_out"]
    s = summarize(result)
    assert (s["completed"], s["failed"], s["num_timed_out"]) == (1, 1, 1)
    from sim.cli.run import run_warnings

    assert any(w.startswith("1 request(s) timed out") for w in run_warnings(s))
    assert s["mean_e2el_ms"] == pytest.approx(50.0)  # the failed request is in no latency metric


def test_timeout_frees_a_closed_loop_clients_slot():
    # one client, 10-token requests (100 ms), timeout 60 ms: each is given up at 60 ms after it was
    # sent, and the next is sent then; every request fails
    result = run(config(bench(num_requests=3, concurrency=1, request_timeout_s=0.06)))
    df = requests_frame(result)
    assert np.allclose(df["arrival_s"], [0.0, 0.06, 0.12])
    assert (df["status"] == "timed_out").all()


def test_no_timeout_key_keeps_the_summary_keys():
    s = summarize(run(config(bench(concurrency=2))))
    assert "failed" not in s and "num_timed_out" not in s


def test_gamma_burstiness_one_has_poisson_statistics():
    rate, n = 4.0, 20000
    t = arr.gamma(n, rate, 1.0, stream(3, "arrivals"))
    assert t[-1] == pytest.approx(n / rate)  # vLLM rescales the last send to num / rate
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.03)  # exponential: CV 1
    assert stats.kstest(gaps * rate, "expon").pvalue > 0.01
    # burstiness 4: gamma of shape 4, CV 1/2
    gaps4 = np.diff(np.concatenate([[0.0], arr.gamma(n, rate, 4.0, stream(3, "arrivals"))]))
    assert np.std(gaps4) / np.mean(gaps4) == pytest.approx(0.5, abs=0.02)


def test_poisson_constant_and_staged_arrivals():
    t = arr.poisson(5, 2.0, stream(1, "arrivals"))
    assert t[0] == 0.0  # SGLang sends the first at once
    assert np.allclose(arr.constant(4, 2.0), [0.0, 0.5, 1.0, 1.5])
    assert np.all(arr.poisson(3, math.inf, None) == 0.0)
    st = arr.staged(None, [(20.0, 5.0), (200.0, 5.0)], stream(2, "arrivals"))
    first, second = int((st < 5.0).sum()), int(((st >= 5.0) & (st < 10.0)).sum())
    assert len(st) == first + second
    assert abs(first - 100) < 4 * math.sqrt(100) and abs(second - 1000) < 4 * math.sqrt(1000)
    assert len(arr.staged(7, [(20.0, 5.0), (200.0, 5.0)], stream(2, "arrivals"))) == 7


def test_random_range_ratio_vllm_and_sglang_bounds():
    rng = stream(1, "lengths")
    i, o = random_lengths(20000, 100, 10, 0.5, "vllm", rng)
    assert (i.min(), i.max(), o.min(), o.max()) == (50, 150, 5, 15)  # floor(I(1-r)) .. ceil(I(1+r))
    i, o = random_lengths(20000, 100, 10, 0.5, "sglang", rng)
    assert (i.min(), i.max(), o.min(), o.max()) == (50, 100, 5, 10)  # int(I r) .. I
    i, o = random_lengths(20000, 100, 10, 0.0, "sglang", rng)
    assert (i.min(), i.max(), o.min(), o.max()) == (1, 100, 0, 10)  # SGLang's default r = 0
    i, o = random_lengths(50, 100, 10, 0.0, "vllm", rng)
    assert set(i) == {100} and set(o) == {10}


def test_bench_kind_prefix_and_fixed_sharegpt_output():
    reqs = build_workload(bench(prefix_len=64, range_ratio=0.0), seed=1)
    assert {r.prompt_tokens for r in reqs} == {164}
    assert len({r.prefix[0] for r in reqs}) == 1  # one shared random prefix (vLLM's get_prefix)
    sg = build_workload({"kind": "bench", "dataset": "sharegpt", "num_requests": 50, "output_len": 7}, seed=1)
    assert {r.output_tokens for r in sg} == {7} and len({r.prompt_tokens for r in sg}) > 5


@pytest.mark.parametrize("extra, field", [
    ({"concurrency": 2, "max_concurrency": 2}, "max_concurrency"),
    ({"think_time": {"mean_s": 1.0}}, "think_time"),
    ({"concurrency": 0}, "concurrency"),
    ({"request_timeout_s": -1}, "request_timeout_s"),
    ({"concurrency": 2, "think_time": {"distribution": "pareto"}}, "think_time.distribution"),
])
def test_bad_client_fields_are_named(extra, field):
    with pytest.raises(ConfigError, match=field):
        workload_client(bench(**extra))


@pytest.mark.parametrize("extra, field", [
    ({"ignore_eos": False}, "ignore_eos"),
    ({"range_ratio": 1.0}, "range_ratio"),
    ({"range_ratio_definition": "tgi"}, "range_ratio_definition"),
    ({"arrivals": "staged"}, "stages"),
    ({"burstiness": 0.5}, "burstiness"),
    ({"prefix_len": 8, "range_ratio_definition": "sglang"}, "prefix_len"),
    ({"rate": 3}, "rate"),
])
def test_bad_bench_fields_are_named(extra, field):
    with pytest.raises(ConfigError, match=field):
        build_workload(bench(**extra), seed=1)


class _FakeRunner:
    """Passes every level up to `limit` clients; records what ran."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ran: list[int] = []

    def run(self, tables, desc=""):
        out = []
        for t in tables:
            n = t["workload"]["concurrency"]
            self.ran.append(n)
            out.append({"ok": n <= self.limit, "num_finished": 10, "duration_s": 1.0, "status": "ok"})
        return out


def test_concurrency_search_doubles_then_bisects(monkeypatch):
    from sim.outputs import metrics
    from sim.studies import concurrency

    monkeypatch.setattr(metrics, "meets_slo", lambda summary, slo: summary["ok"])
    runner = _FakeRunner(37)
    best, s = concurrency.search(runner, {"workload": {"num_requests": 10}}, None, 1, 128)
    # levels 1..128 doubling: 64 is the first to fail; bisection 48, 40, 36, 38, 37
    assert best == 37
    assert runner.ran == [1, 2, 4, 8, 16, 32, 64, 128, 48, 40, 36, 38, 37]
    assert concurrency.with_concurrency({"workload": {"num_requests": 10, "max_concurrency": 3}}, 5)["workload"] \
        == {"num_requests": 40, "concurrency": 5}  # at least MIN_ROUNDS = 8 requests per client
    assert concurrency.search(_FakeRunner(0), {"workload": {}}, None, 1, 4)[0] == 0
    with pytest.raises(ConfigError, match="--concurrency"):
        concurrency.parse_levels("8:4")


def test_goodput_concurrency_cli(tmp_path, capsys):
    import re

    import tomli_w

    from sim.cli import main
    from sim.outputs.metrics import meets_slo

    # max_running_requests = 10 bounds admission, so past some number of clients a request
    # waits a whole request (100 ms) for its first token and the 50 ms TTFT SLO fails
    table = {"seed": 1, "parallel": {"pp": 1, "tp": 1},
             "latency": {"kind": "constant", "stage_ms": 10.0, "overhead_ms": 0.0},
             "scheduler": {"kv_tokens": 100000, "max_running_requests": 10},
             "slo": {"ttft_ms": 50.0, "tpot_ms": 200.0},
             "workload": {"kind": "bench", "num_requests": 40, "input_len": 100, "output_len": 10}}
    path = tmp_path / "c.toml"
    path.write_bytes(tomli_w.dumps(table).encode())
    assert main(["goodput", str(path), "--concurrency", "1:32", "--no-progress"]) == 0
    found = int(float(re.search(r"goodput: ([0-9.]+) concurrent clients", capsys.readouterr().out).group(1)))

    def meets(n):
        cfg = config({**table["workload"], "num_requests": max(40, 8 * n), "concurrency": n},
                     scheduler=table["scheduler"], slo=table["slo"])
        return meets_slo(summarize(run(cfg)), cfg.slo)

    assert 1 <= found < 32 and meets(found) and not meets(found + 1)


def test_run_header_says_the_client_loop():
    from sim.outputs.context import describe_workload

    _, rate = describe_workload(bench(concurrency=8, think_time={"mean_s": 2.0}, request_timeout_s=30))
    assert rate.startswith("closed loop of 8 clients, think time exponential mean 2 s") and "timeout 30 s" in rate
    _, rate = describe_workload(bench(arrivals="gamma", rate_rps=4.0, burstiness=0.5, max_concurrency=3))
    assert rate.startswith("gamma 4.0 req/s, burstiness 0.5; at most 3 in flight")


def test_vllm_ramp_up_rates_by_hand():
    # linear 2 -> 6 req/s over 3 requests: rates 2, 4, 6; burstiness 1e6 makes every gap its mean
    t = arr.ramp(3, "linear", 2.0, 6.0, 1e6, stream(1, "arrivals"))
    assert np.allclose(t, np.cumsum([1 / 2, 1 / 4, 1 / 6]), rtol=1e-2)
    # exponential 1 -> 9: rates 1, 3, 9
    t = arr.ramp(3, "exponential", 1.0, 9.0, 1e6, stream(1, "arrivals"))
    assert np.allclose(t, np.cumsum([1.0, 1 / 3, 1 / 9]), rtol=1e-2)
    reqs = build_workload(bench(arrivals="ramp", ramp_strategy="linear", ramp_start_rps=1.0, ramp_end_rps=5.0),
                          seed=1)
    assert len(reqs) == 10 and reqs[0].arrival_s > 0.0
    with pytest.raises(ConfigError, match="ramp_strategy"):
        build_workload(bench(arrivals="ramp", ramp_strategy="step", ramp_start_rps=1.0, ramp_end_rps=5.0), seed=1)


def test_rate_sweep_of_a_closed_loop_is_refused():
    from sim.studies.sweep import with_rate

    with pytest.raises(ConfigError, match="concurrency"):
        with_rate({"workload": {"name": "sharegpt", "concurrency": 4}}, 2.0)
    assert with_rate({"workload": {"name": "sharegpt", "max_concurrency": 4}}, 2.0)["workload"]["rate_rps"] == 2.0


def test_closed_loop_behind_a_router():
    # 2 replicas, 6 clients, 100 ms a request, nothing queues: 6 / 0.1 s = 60 requests/s
    cfg = config(bench(num_requests=48, concurrency=6), parallel={"pp": 1, "tp": 1, "replicas": 2,
                                                                  "router": "round-robin"})
    s = summarize(run(cfg))
    assert s["completed"] == 48 and s["request_throughput"] == pytest.approx(60.0)
