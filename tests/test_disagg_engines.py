"""Disaggregated pools on SGLang's and vLLM V1's schedulers (sim/engine/disagg.py, sim/engine/schedulers/roles.py):
each engine's hand-off on small cases checked by hand (SGLang pre-allocates while the prefill runs and keeps a
reserve, vLLM allocates once the prefill has returned, with no reserve, while fewer than max_num_seqs run;
SGLang's chunk-by-chunk KV sends), the engines' own budgets, and the KV ledger after every event."""

from __future__ import annotations

import pytest

from sim.engine.disagg import DisaggRun
from sim.engine.schedulers.roles import (SGLangDecodeScheduler, SGLangPrefillScheduler, VllmV1DecodeScheduler,
                                         VllmV1PrefillScheduler)
from sim.outputs.metrics import requests_frame
from sim.workloads import RequestSpec

from test_disagg import ALPHA, KV_PER_TOKEN, NDR_BPS, audited_run, pools_whole, reqs, run_one, table


def on(engine: str, t: dict) -> dict:
    t["scheduler"]["engine"] = engine
    return t


def test_sglang_ships_a_chunked_prompt_chunk_by_chunk():
    # a 3,000-token prompt in chunks of 2,048 and 952: the first chunk's 2,048 tokens of KV (5.7 ms on the NIC)
    # leave while the second chunk computes (tens of ms), so only the last chunk's share is exposed after the
    # prefill: 23 us + 952 x 131,072 B / 47.0 GB/s = 2.677905 ms
    tail = ALPHA + 952 * KV_PER_TOKEN / NDR_BPS
    assert tail == pytest.approx(2.677905e-3, rel=1e-6)
    for engine in ("sglang", "fastpp"):
        res, df, _ = run_one(on(engine, table(kv_transfer="chunked", first_token="transfer")), reqs((3000, 20)))
        r = df.iloc[0]
        assert r["kv_ready_s"] - r["prefill_end_s"] == pytest.approx(tail, rel=1e-9)
        assert r["first_token_s"] == pytest.approx(r["kv_ready_s"], rel=1e-12)  # SGLang: token 1 as the KV lands
    # one chunk: nothing to overlap, the whole prompt after the prefill (as after_prefill: 2.811766 ms)
    res, df, _ = run_one(on("sglang", table(kv_transfer="chunked")), reqs((1000, 20)))
    r = df.iloc[0]
    assert r["kv_ready_s"] - r["prefill_end_s"] == pytest.approx(ALPHA + 1000 * KV_PER_TOKEN / NDR_BPS, rel=1e-9)


def test_the_pools_run_the_engines_schedulers_with_their_budgets():
    # chunk_size_tokens 0: each engine's default on an 80 GB H100 at TP1 (SGLang chunked_prefill_size 8192 for
    # < 160 GiB; vLLM max_num_batched_tokens 8192 on >= 70 GiB non-A100)
    for engine, classes in (("sglang", (SGLangPrefillScheduler, SGLangDecodeScheduler)),
                            ("vllm-v1", (VllmV1PrefillScheduler, VllmV1DecodeScheduler))):
        t = on(engine, table())
        t["scheduler"]["chunk_size_tokens"] = 0
        from sim.core.config import config_from_table
        from sim.engine.requests import RequestArrays

        dr = DisaggRun(config_from_table(t), RequestArrays.of(reqs((100, 5))))
        pre, dec = dr.instances["prefill"][0].sched, dr.instances["decode"][0].sched
        assert (type(pre), type(dec)) == classes
        assert pre.chunk_size == 8192 and pre.cache is None and dec.cache is None  # prefix caches off in pools
        assert dr.describe(dr.instances["prefill"] + dr.instances["decode"])["engine"] == engine


def test_vllm_allocates_on_the_decode_side_after_the_prefill_with_no_reserve():
    # decode pool of 2,600 tokens, two 1,000-token prompts. SGLang keeps 512 tokens per request in reserve: the
    # second waits for the first to finish (test_disagg.test_decode_preallocates_only_with_room). vLLM has no
    # reserve: 1,000 + 1,000 <= 2,600, both are allocated as their prefills return
    t = on("vllm-v1", table(decode={"tp": 1, "kv_tokens": 2600}))
    res, df, _ = run_one(t, reqs((1000, 20), (1000, 20)))
    assert res.status == "ok" and (df["kv_wait_ms"] == 0).all()
    assert df.iloc[1]["first_token_s"] < df.iloc[0]["finish_s"]
    t = on("sglang", table(decode={"tp": 1, "kv_tokens": 2600}))
    _, dfs, _ = run_one(t, reqs((1000, 20), (1000, 20)))
    assert dfs.iloc[1]["prefill_end_s"] + dfs.iloc[1]["kv_wait_ms"] / 1e3 == pytest.approx(dfs.iloc[0]["finish_s"])
    # vLLM's allocation is never before the prefill's end (the proxy sends the decode request then); SGLang's
    # pre-allocation is made while the prefill runs
    t = table(n=60, rate=20.0)
    dr, res = audited_run(on("vllm-v1", t))
    assert all(f.ready_s >= f.prefilled_s for f in dr.flows_checked())
    dr, res = audited_run(on("sglang", table(n=60, rate=20.0)))
    assert any(f.ready_s < f.prefilled_s for f in dr.flows_checked())


def test_vllm_admits_while_fewer_than_max_num_seqs_run():
    # max_num_seqs 1 on the decode instance. A request loading remote KV (WAITING_FOR_REMOTE_KVS) is not
    # running, so both are allocated as their prefills return (kv_wait 0); the second runs (its token 1) only
    # once the first has finished and left the running set
    t = on("vllm-v1", table(decode={"tp": 1, "max_running_requests": 1}))
    res, df, _ = run_one(t, reqs((1000, 20), (1000, 20)))
    a, b = df.iloc[0], df.iloc[1]
    assert res.status == "ok" and (df["kv_wait_ms"] == 0).all()
    assert b["kv_ready_s"] < a["finish_s"] < b["first_token_s"]
    # without the cap the second decodes beside the first
    _, df2, _ = run_one(on("vllm-v1", table()), reqs((1000, 20), (1000, 20)))
    assert df2.iloc[1]["first_token_s"] < df2.iloc[0]["finish_s"]


@pytest.mark.parametrize("engine", ["sglang", "vllm-v1"])
def test_nothing_is_lost_between_the_engines_pools(engine):
    # as test_disagg.test_nothing_is_lost_between_the_pools, on the engine's schedulers, with a decode pool small
    # enough that requests wait with their KV on the prefill side, and retraction/preemption on the decode side
    t = on(engine, table(prefill={"tp": 1, "instances": 2, "router": "least-loaded"},
                         decode={"tp": 2, "pp": 2, "instances": 2, "router": "least-loaded"}, nodes=3, gpn=4, n=120,
                         rate=12.0, kv_transfer="chunked"))
    t["latency"]["variance"] = True
    dr, res = audited_run(t)
    assert res.status == "ok" and dr.audited["checks"] > 1000
    df = requests_frame(res)
    assert len(df) == 120 and (df["status"] == "finished").all()
    assert (df["generated_tokens"] == df["max_new_tokens"]).all()
    pools_whole(dr)
    reqs_ = [RequestSpec(i, 0.01 * i, 1500, 400) for i in range(8)]
    t = on(engine, table(decode={"tp": 1, "kv_tokens": 5000}, decode_reserve_tokens=0))
    t["server"] = {"on_kv_exhausted": "retract"}
    dr, res = audited_run(t, reqs_)
    df = requests_frame(res)
    assert res.status == "ok" and (df["status"] == "finished").all()
    pools_whole(dr)
