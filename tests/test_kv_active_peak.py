"""The peak KV the requests hold, beside the pool's peak (issue 39: every prefix-cache candidate of a plan was
warned "KV headroom 0%"). A prefix cache keeps a finished request's tokens as evictable cache, counted out of
`kv_free`, so the pool's peak (`kv_peak_tokens`) climbs towards the capacity while the requests need far less;
`kv_peak_active_tokens` leaves the evictable tokens out, as vLLM's kv_cache_usage and SGLang's token_usage do."""

import pytest

from conftest import make_config
from sim.engine.run import run
from sim.outputs.metrics import summarize


def _shared_prefix_run(engine: str):
    # three requests, 100 s apart on average (each served alone in a few ms), sharing a 100-token prefix:
    # own prompts 50, 300, 80 tokens, outputs 20, 10, 5 tokens; constant 1 ms stages
    sched = {"chunk_size_tokens": 2048, "kv_tokens": 100_000}
    if engine != "fastpp":
        sched["engine"] = engine
    cfg = make_config(parallel={"pp": 1, "tp": 1}, scheduler=sched, latency={"kind": "constant", "stage_ms": 1.0},
                      workload={"kind": "shared-prefix", "rate_rps": 0.01, "num_requests": 3, "prefix_tokens": 100,
                                "lengths": {"source": "pairs", "prompt_tokens": [50, 300, 80],
                                            "output_tokens": [20, 10, 5]}})
    return run(cfg)


@pytest.mark.parametrize("engine", ["sglang", "vllm-v1", "fastpp"])
def test_the_requests_peak_by_hand(engine):
    res = _shared_prefix_run(engine)
    assert res.status == "ok"
    # one at a time, a request holds its prompt and all but its last output token's KV at its last decode
    # step: max(100 + 50 + 19, 100 + 300 + 9, 100 + 80 + 4) = 409, whatever the cache keeps
    assert res.kv_peak_active_tokens == 409
    assert summarize(res)["kv_peak_active_tokens"] == 409
    if engine == "sglang":
        # the radix cache keeps every finished request (token granularity): 169 cached after the first, the
        # second hits the prefix and holds 300 + 9 more (478), the third 80 + 4 more: the pool's peak 562
        assert res.kv_peak_tokens == 562
    elif engine == "fastpp":
        assert res.kv_peak_tokens == 409          # no cache: the same peak
    else:
        assert res.kv_peak_tokens > 409           # vLLM's block cache keeps whole blocks


def test_a_plan_reads_the_requests_peak():
    from sim.core.slo import SLO
    from sim.studies.plan import _warnings, at_rate_row

    s = summarize(_shared_prefix_run("sglang"))
    s["kv_capacity_tokens"] = 580   # (a pool the cache fills: 562 of 580 is 3% headroom, 409 of 580 is 29%)
    row = at_rate_row([s], SLO(ttft_ms=1e6, tpot_ms=1e6))
    assert row["kv_headroom"] == pytest.approx(1 - 409 / 580)
    assert "KV headroom" not in _warnings({**row, "status": "ok", "num_seeds": 1}, "rate")
