"""The frontend's share of a request (sim/latency/frontend.py), checked by hand on small cases.

The service time is fixed with the constant latency model (one iteration = 10 ms whatever the
batch), so every millisecond beyond the engine's steps is the frontend's, computed here from the
published constants written out again (not read from the module).
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.config import config_from_table
from sim.core.errors import ConfigError
from sim.engine.run import run
from sim.latency.frontend import COSTS, Frontend, costs_for
from sim.outputs.metrics import requests_frame, summarize

# the sources' numbers (module docstring): FastAPI ~15,000 requests/s and ~20,000 JSON chunks/s,
# HF tokenizers 1.93 MB/s at 4 bytes a token, DecodeStream 845,171 tokens/s, a ZMQ hop 0.15 ms
HTTP, CHUNK, TOK, DETOK, HOP = 1 / 15000, 1 / 20000, 4 / 1.93e6, 1 / 845171, 0.15e-3


def config(engine: str, frontend: dict | None = None, stage_ms: float = 10.0, **workload):
    table = {
        "seed": 1,
        "parallel": {"pp": 1, "tp": 1},
        "latency": {"kind": "constant", "stage_ms": stage_ms, "overhead_ms": 0.0},
        "scheduler": {"kv_tokens": 100000, "engine": engine},
        "workload": {"kind": "bench", "num_requests": 4, "input_len": 1000, "output_len": 10, **workload},
    }
    if frontend is not None:
        table["frontend"] = frontend
    return config_from_table(table, "test")


@pytest.mark.parametrize("engine, out_hops, passes", [("vllm-v1", 1, 1), ("sglang", 2, 2)])
def test_one_client_pays_the_way_in_and_the_way_out_by_hand(engine, out_hops, passes):
    # one closed-loop client, prompts of 1,000 tokens, 10 output tokens of 10 ms each
    pre = HTTP + 1000 * TOK + HOP  # received, tokenized, handed to the scheduler
    out1 = out_hops * HOP + passes * DETOK + CHUNK  # a one-token chunk back to the client
    result = run(config(engine, concurrency=1))
    s = summarize(result)
    df = requests_frame(result)
    assert s["mean_ttft_ms"] == pytest.approx((pre + 0.010 + out1) * 1e3, rel=1e-9)
    assert s["mean_e2el_ms"] == pytest.approx((pre + 0.100 + out1) * 1e3, rel=1e-9)
    assert (df["admit_s"] - df["arrival_s"]).to_numpy() == pytest.approx(pre, rel=1e-9)  # the scheduler's clock
    # the client sends the next request when it has read the last chunk
    assert np.diff(df["arrival_s"]) == pytest.approx(pre + 0.100 + out1, rel=1e-9)
    assert s["mean_itl_ms"] == pytest.approx(10.0)  # one token a chunk: the same delay on every token
    assert s["mean_tpot_ms"] == pytest.approx(10.0)


def test_the_tokenizer_is_one_fifo_server():
    # two requests sent together: the second waits for the first's tokenization
    fe = Frontend(costs_for("vllm-v1", "vLLM 0.11.0 (V1)"))
    got = fe.server_arrivals([0.0, 0.0, 1.0], [1000, 3000, 10])
    first = HTTP + 1000 * TOK
    assert got[0] == pytest.approx(first + HOP)
    assert got[1] == pytest.approx(first + 3000 * TOK + HOP)
    assert got[2] == pytest.approx(1.0 + HTTP + 10 * TOK + HOP)  # the tokenizer idle again by then
    # the closed loop's one-at-a-time form agrees
    one = Frontend(costs_for("vllm-v1", "vLLM 0.11.0 (V1)"))
    assert [one.server_arrival(t, p) for t, p in [(0.0, 1000), (0.0, 3000), (1.0, 10)]] == pytest.approx(got)


def test_cpu_speed_divides_every_cost():
    fast = Frontend(costs_for("sglang", "SGLang 0.5.23"), cpu_speed=2.0)
    assert fast.server_arrivals([0.0], [1000])[0] == pytest.approx((HTTP + 1000 * TOK + HOP) / 2)
    assert fast.chunk_s(3) == pytest.approx((2 * HOP + CHUNK + 3 * 2 * DETOK) / 2)


@pytest.mark.parametrize("itl, expected", [
    # chunks end at tokens 1, 5, 9, 10 (vLLM 0.15 / SGLang: the first at once, then every 4, then the rest)
    ("chunk", lambda d: [0.040 + d(4) - d(1), 0.040, 0.010 + d(1) - d(4)]),
    # SGLang's native client spreads each chunk's gap over its tokens
    ("token", lambda d: [(0.040 + d(4) - d(1)) / 4] * 4 + [0.010] * 4 + [0.010 + d(1) - d(4)]),
])
def test_stream_interval_chunks_and_the_clients_gaps_by_hand(itl, expected):
    def d(m):  # SGLang: two hops and two decode passes a token
        return 2 * HOP + CHUNK + 2 * m * DETOK

    result = run(config("sglang", {"stream_interval_tokens": 4, "itl": itl}, concurrency=1))
    gaps = result.requests[0].itls
    assert gaps == pytest.approx(expected(d), rel=1e-9)
    df = requests_frame(result)
    # the last chunk (token 10 alone) reaches the client d(1) after the engine's last token
    sent = df["arrival_s"][0]
    assert df["finish_s"][0] - sent == pytest.approx(HTTP + 1000 * TOK + HOP + 0.100 + d(1), rel=1e-9)
    assert df["max_itl_ms"][0] == pytest.approx(max(expected(d)) * 1e3, rel=1e-9)


def test_open_loop_keeps_the_send_times_and_the_scheduler_sees_them_later():
    base = run(config("vllm-v1", {"enabled": False}, rate_rps=2.0))
    on = run(config("vllm-v1", rate_rps=2.0))
    b, o = requests_frame(base), requests_frame(on)
    assert np.array_equal(b["arrival_s"], o["arrival_s"])  # the client's send times are the workload's
    assert (o["admit_s"] - b["admit_s"]).to_numpy() == pytest.approx(HTTP + 1000 * TOK + HOP, rel=1e-6)
    assert summarize(on)["frontend"].startswith("vllm-v1")


def test_off_switch_and_engines_without_one():
    off = summarize(run(config("sglang", {"enabled": False}, concurrency=1)))
    fastpp = summarize(run(config("fastpp", concurrency=1)))
    assert off["mean_ttft_ms"] == pytest.approx(10.0) and "frontend" not in off
    assert fastpp["mean_ttft_ms"] == pytest.approx(10.0) and "frontend" not in fastpp
    with pytest.raises(ConfigError, match=r"\[frontend\] enabled = true: no frontend is modelled for engine 'fastpp'"):
        run(config("fastpp", {"enabled": True}, concurrency=1))


TABLE_0_11 = {"parallel": {"pp": 1, "tp": 1}, "latency": {"kind": "constant", "stage_ms": 10.0},
              "scheduler": {"kv_tokens": 100000, "engine": "vllm-v1", "engine_version": "0.11"},
              "workload": {"kind": "bench", "num_requests": 2, "input_len": 10, "output_len": 2}}


def test_stream_interval_refused_where_the_release_has_none():
    with pytest.raises(ConfigError, match=r"stream_interval_tokens = 4: vllm-v1 vLLM 0.11.0 \(V1\) has no"):
        run(config_from_table({**TABLE_0_11, "frontend": {"stream_interval_tokens": 4}}, "test"))
    with pytest.raises(ConfigError, match=r"\[frontend\] itl must be one of: chunk, token"):
        config("vllm-v1", {"itl": "tokens"}, concurrency=1)


def test_every_vllm_v1_and_sglang_release_has_a_frontend():
    from sim.engine.schedulers.sglang import VERSIONS as SGLANG
    from sim.engine.schedulers.vllm_v1 import VERSIONS as VLLM_V1

    for engine, versions in (("vllm-v1", VLLM_V1), ("sglang", SGLANG)):
        for release in versions.values():
            assert (engine, release) in COSTS, (engine, release)
