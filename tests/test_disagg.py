"""Disaggregated prefill/decode serving (sim/engine/disagg.py): the KV transfer against hand calculations
(after the prefill, layer-wise, PP on both sides, queued on a shared link), the decode side's
pre-allocation, who emits the first token, and that nothing is lost between the pools."""

from __future__ import annotations

import json
import re

import pytest

from sim.core.config import config_from_table
from sim.core.errors import ConfigError
from sim.engine.disagg import DisaggRun
from sim.engine.requests import RequestArrays
from sim.engine.run import run
from sim.outputs.metrics import requests_frame, summarize
from sim.workloads import RequestSpec, build_workload

L8 = "profiles/built/h100-sxm-80gb/llama-3.1-8b/tp1"
# Llama-3.1-8B: K and V x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B per token on one GPU
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2
ALPHA = 23.0e-6          # ib-ndr: NCCL Simple base 8.4 + network step 14.0 + link 0.6 us
NDR_BPS = 47.0e9         # ib-ndr: one NIC per GPU, 47.0 GB/s achievable


def table(prefill=None, decode=None, nodes=2, gpn=1, network="ib-ndr", n=40, rate=4.0, **dg) -> dict:
    return {"seed": 2, "scheduler": {"chunk_size_tokens": 2048, "context_length_tokens": 8192},
            "latency": {"profile": L8, "variance": False},
            "workload": {"name": "azure-conv-synth", "num_requests": n, "rate_rps": rate},
            "cluster": {"nodes": nodes, "gpus_per_node": gpn, "network": network},
            "disaggregation": {"prefill": prefill or {"tp": 1}, "decode": decode or {"tp": 1}, **dg}}


def reqs(*pairs, at=0.0):
    return [RequestSpec(i, at, p, o) for i, (p, o) in enumerate(pairs)]


def run_one(t, requests):
    res = run(config_from_table(t), requests)
    return res, requests_frame(res), summarize(res)


def test_kv_transfer_after_prefill_by_hand():
    # one 1000-token prompt, prefill on node 0, decode on node 1 (one GPU each): 131,072,000 B over the
    # GPU's NDR NIC: 23.0 us + 131,072,000 / 47.0e9 s = 2.811766 ms, nothing queued ahead of it
    res, df, s = run_one(table(), reqs((1000, 20)))
    t = ALPHA + 1000 * KV_PER_TOKEN / NDR_BPS
    assert t == pytest.approx(2.811766e-3, rel=1e-6)
    r = df.iloc[0]
    assert r["kv_transfer_ms"] == pytest.approx(t * 1e3, rel=1e-9)
    assert r["kv_wait_ms"] == 0 and r["kv_link_wait_ms"] == 0
    assert r["kv_ready_s"] == pytest.approx(r["prefill_end_s"] + t, rel=1e-12)
    assert r["kv_bytes"] == 131_072_000 and r["kv_tokens"] == 1000
    # vLLM/Dynamo accounting: token 1 comes from the decode side's first step after the KV arrived
    assert r["first_token_s"] > r["kv_ready_s"] and r["generated_tokens"] == 20 and r["status"] == "finished"
    assert s["mean_kv_transfer_ms"] == s["p99_kv_transfer_ms"] == pytest.approx(t * 1e3)
    assert s["num_kv_transfers"] == 1 and s["kv_bytes_total"] == 131_072_000 and s["mode"] == "disaggregated"
    # the two links it used (node 0 GPU 0 out, node 1 GPU 0 in) were busy 2.788766 ms each over the run
    d = 1000 * KV_PER_TOKEN / NDR_BPS
    assert s["kv_links_used"] == 2
    assert s["kv_link_utilisation_max"] == pytest.approx(d / s["duration_s"], rel=1e-9)
    assert s["kv_link_utilisation_mean"] == pytest.approx(d / s["duration_s"], rel=1e-9)


def test_pp_in_both_pools_by_hand():
    # prefill TP1 x PP2 on node 0, decode TP1 x PP2 on node 1: stage s ships its 16 layers to stage s, both
    # pairs at once: 65,536,000 B each: 23.0 us + 65,536,000 / 47.0e9 = 1.417383 ms
    t = table(prefill={"tp": 1, "pp": 2}, decode={"tp": 1, "pp": 2}, gpn=2)
    res, df, s = run_one(t, reqs((1000, 20)))
    assert df.iloc[0]["kv_transfer_ms"] == pytest.approx((ALPHA + 500 * KV_PER_TOKEN / NDR_BPS) * 1e3, rel=1e-9)
    assert s["disaggregation"]["prefill"]["stage_layers"] == [16, 16]
    assert [i["stage_nodes"] for i in s["cluster"]["instances"]] == [[[0], [0]], [[1], [1]]]
    # PP2 -> PP1: the decode GPU receives all 32 layers from two senders: its NIC in is the bottleneck
    t = table(prefill={"tp": 1, "pp": 2}, decode={"tp": 1, "pp": 1}, gpn=2)
    res, df, s = run_one(t, reqs((1000, 20)))
    assert df.iloc[0]["kv_transfer_ms"] == pytest.approx((ALPHA + 1000 * KV_PER_TOKEN / NDR_BPS) * 1e3, rel=1e-9)
    assert res.status == "ok" and df.iloc[0]["generated_tokens"] == 20
    # the iteration table pads the one-stage decode instance with an empty second stage
    assert s["bubble_fraction"] < 1 and len(res.stage_busy[0]) == 2


def test_layerwise_exposes_only_the_last_layer():
    # streamed while the prefill computes (tens of ms here, >> the 2.79 ms the link needs): only the last of
    # 32 layers and alpha remain after the prefill's end: 23.0 us + 2.788766 ms / 32 = 0.110149 ms
    res, df, s = run_one(table(kv_transfer="layerwise"), reqs((1000, 20)))
    r = df.iloc[0]
    assert r["prefill_end_s"] - r["admit_s"] > 0.01
    assert r["kv_transfer_ms"] == pytest.approx((ALPHA + 1000 * KV_PER_TOKEN / NDR_BPS / 32) * 1e3, rel=1e-9)


def test_transfers_queue_on_a_shared_link():
    # two identical prompts arrive together, are prefilled in one batch and leave at the same time over the
    # same two NICs: the second waits for the first (T = 2.811766 ms), so it takes 2T
    res, df, s = run_one(table(), reqs((1000, 20), (1000, 20)))
    t = ALPHA + 1000 * KV_PER_TOKEN / NDR_BPS
    a, b = df.iloc[0], df.iloc[1]
    assert a["prefill_end_s"] == b["prefill_end_s"]
    assert a["kv_transfer_ms"] == pytest.approx(t * 1e3, rel=1e-9)
    assert b["kv_link_wait_ms"] == pytest.approx(t * 1e3, rel=1e-9)
    assert b["kv_transfer_ms"] == pytest.approx(2 * t * 1e3, rel=1e-9)
    # inside one node the same transfer goes over NVSwitch (H100 send_recv fit: 7.64 us + 358.02 GB/s)
    res, df, s = run_one(table(nodes=1, gpn=2), reqs((1000, 20)))
    assert df.iloc[0]["kv_transfer_ms"] == pytest.approx((7.64e-6 + 131_072_000 / 358.02e9) * 1e3, rel=1e-6)


def test_decode_preallocates_only_with_room():
    # decode pool of 2,600 tokens, 512 reserved per request: the first 1000-token prompt needs 1000 + 512 and
    # gets it; the second would leave 1600 - 512 x 1 = 1088 < 1512 and waits until the first has finished
    t = table(decode={"tp": 1, "kv_tokens": 2600})
    res, df, s = run_one(t, reqs((1000, 20), (1000, 20)))
    a, b = df.iloc[0], df.iloc[1]
    assert a["kv_wait_ms"] == 0
    assert b["prefill_end_s"] + b["kv_wait_ms"] / 1e3 == pytest.approx(a["finish_s"], rel=1e-12)
    assert b["first_token_s"] > a["finish_s"] and res.status == "ok"
    # a prompt that cannot fit even the empty pool fails the run with the reason, every request accounted
    t = table(decode={"tp": 1, "kv_tokens": 1200})
    res, df, s = run_one(t, reqs((1000, 20), (300, 5)))
    assert res.status == "failed"
    assert "request 0: its KV (1000 tokens) and the decode reserve (512 tokens) cannot fit decode instance 0's " \
           "empty pool of 1200 tokens" in res.reason
    assert len(df) == 2 and set(df["status"]) == {"failed"}


def test_first_token_from_the_prefill_side():
    # DistServe/Splitwise accounting: TTFT ends with the prefill; the transfer lands in the first gap
    res, df, s = run_one(table(first_token="prefill"), reqs((1000, 20), (500, 1)))
    r = df.iloc[0]
    assert r["first_token_s"] == pytest.approx(r["prefill_end_s"])
    assert r["max_itl_ms"] >= r["kv_transfer_ms"]
    # a one-token output is done at the prefill instance: no transfer
    one = df.iloc[1]
    assert one["status"] == "finished" and one["finish_s"] == one["prefill_end_s"] and one["kv_tokens"] == 500
    assert one["kv_transfer_ms"] != one["kv_transfer_ms"]   # NaN
    assert s["num_kv_transfers"] == 1


def test_first_token_at_the_transfer_as_sglang_streams_it():
    # SGLang 0.5.23 disaggregation/decode.py: token 1 (sampled by the prefill server) is streamed by a
    # prebuilt batch, no forward pass, when the KV lands; token 2 from the next decode step
    res, df, s = run_one(table(first_token="transfer"), reqs((1000, 20), (500, 1)))
    r = df.iloc[0]
    assert r["first_token_s"] == pytest.approx(r["kv_ready_s"], rel=1e-12)
    assert r["generated_tokens"] == 20 and r["status"] == "finished"
    # the same request with token 1 from the decode side's first step comes one step later
    _, dfd, _ = run_one(table(), reqs((1000, 20), (500, 1)))
    assert dfd.iloc[0]["first_token_s"] > r["first_token_s"]
    one = df.iloc[1]  # a one-token output ends as its KV lands
    assert one["status"] == "finished" and one["finish_s"] == pytest.approx(one["kv_ready_s"])
    assert s["num_kv_transfers"] == 2
    audited_run(table(first_token="transfer", n=60, rate=20.0))


def audited_run(t, requests=None):
    """A run whose KV ledger is checked after every event of the simulation (DisaggRun.audit)."""
    cfg = config_from_table(t)
    arrays = RequestArrays.of(requests if requests is not None else build_workload(cfg.workload, seed=cfg.seed))
    dr = DisaggRun(cfg, arrays, audit=True)
    return dr, dr.run()


def pools_whole(dr):
    for inst in dr.instances["prefill"] + dr.instances["decode"]:
        assert inst.sched.kv_free == inst.sched.kv_capacity and inst.held == 0 and inst.in_flight == 0
        assert inst.routed == 0 and not inst.queue


def test_nothing_is_lost_between_the_pools():
    # two prefill instances (TP1) and two decode instances (TP2 x PP2) on 3 nodes, a loaded mixed workload,
    # least-loaded routers: after every event of the simulation each instance's pool adds up to its capacity
    # with each request's KV owned by one side only (DisaggRun.audit), every request finishes, and every pool
    # is whole again at the end
    t = table(prefill={"tp": 1, "instances": 2, "router": "least-loaded"},
              decode={"tp": 2, "pp": 2, "instances": 2, "router": "least-loaded"}, nodes=3, gpn=4, n=150, rate=12.0)
    t["latency"]["variance"] = True
    dr, res = audited_run(t)
    assert res.status == "ok"
    # checked at least once per iteration of every instance (an iteration is one event), over 6,000 of them
    iterations = len(res.iterations["start_s"])
    assert iterations > 6_000 and dr.audited["checks"] >= iterations
    flows = dr.flows_checked()
    assert len(flows) == 150
    for f in flows:
        assert f.landed_s >= f.prefilled_s >= f.start_s and f.landed_s >= f.ready_s
    pools_whole(dr)
    df = requests_frame(res)
    assert len(df) == 150 and (df["status"] == "finished").all()
    assert (df["generated_tokens"] == df["max_new_tokens"]).all()
    assert set(df["prefill_instance"]) == {0, 1} and set(df["decode_instance"]) == {0, 1}
    assert (df["replica"] == df["decode_instance"]).all()


@pytest.mark.parametrize("kv_transfer", ["after_prefill", "layerwise"])
def test_a_full_decode_pool_keeps_the_kv_on_the_prefill_side(kv_transfer):
    # decode pool of 5,000 tokens, 512 reserved per request, 1,500-token prompts: two fit (5,000 - 1,500 - 512
    # = 2,988 >= 2,012 for the second; 2,000 - 1,024 < 2,012 for a third), so of 30 prompts arriving within a
    # second, most finish their prefill long before the decode side has room (200 tokens to decode each) and
    # wait with their KV held by the prefill instance; the ledger balances after every event all the same
    reqs_ = [RequestSpec(i, 0.03 * i, 1500, 200) for i in range(30)]
    t = table(decode={"tp": 1, "kv_tokens": 5000}, kv_transfer=kv_transfer)
    dr, res = audited_run(t, reqs_)
    assert res.status == "ok"
    seen = dr.audited
    assert seen["most_waiting_on_prefill"] >= 10 and len(seen["waited_on_prefill"]) >= 20
    df = requests_frame(res)
    assert (df["kv_wait_ms"] > 100).sum() >= 20 and (df["status"] == "finished").all()
    # while they wait, the prefill instance's pool is short of exactly their prompts (the audit's ledger);
    # the decode instance never holds more than two
    assert dr.instances["decode"][0].pipe.kv_peak <= 2 * (1500 + 200)
    pools_whole(dr)


def test_retraction_on_the_decode_side_keeps_the_ledger():
    # no decode reserve: three 1,500-token prompts fill 4,500 of 5,000 tokens and run out while decoding;
    # "retract" requeues one, re-prefilled on its decode instance (its KV counted there throughout)
    reqs_ = [RequestSpec(i, 0.01 * i, 1500, 400) for i in range(8)]
    t = table(decode={"tp": 1, "kv_tokens": 5000}, decode_reserve_tokens=0)
    t["server"] = {"on_kv_exhausted": "retract"}
    dr, res = audited_run(t, reqs_)
    assert res.status == "ok"
    df = requests_frame(res)
    assert df["num_retractions"].sum() >= 1 and (df["status"] == "finished").all()
    pools_whole(dr)


def test_the_audit_catches_a_prefill_copy_freed_too_early(monkeypatch):
    # a planted bug: the prefill instance frees the prompt's KV when its prefill ends, before the decode side
    # holds it (and the hand-off frees nothing more): the audit fails at the first such instant
    from sim.engine import disagg

    early = set()

    def free_early(self, shadow):
        flow = self.flows[id(shadow)]
        orig_prefilled(self, shadow)
        self.instances["prefill"][flow.p].sched.kv_free += flow.tokens   # freed now ...
        early.add(id(flow))

    def land(self, flow):
        orig_land(self, flow)
        if id(flow) in early:   # ... so the landing's own free leaves the totals right at the end
            self.instances["prefill"][flow.p].sched.kv_free -= flow.tokens

    orig_prefilled, orig_land = disagg.DisaggRun._prefilled, disagg.DisaggRun._land
    monkeypatch.setattr(disagg.DisaggRun, "_prefilled", free_early)
    monkeypatch.setattr(disagg.DisaggRun, "_land", land)
    reqs_ = [RequestSpec(i, 0.03 * i, 1500, 200) for i in range(6)]
    t = table(decode={"tp": 1, "kv_tokens": 5000})
    # without the audit the run ends with every pool whole: only a check during the run sees the bug
    cfg = config_from_table(t)
    dr = DisaggRun(cfg, RequestArrays.of(reqs_))
    assert dr.run().status == "ok"
    assert all(i.sched.kv_free == i.sched.kv_capacity for i in dr.instances["prefill"] + dr.instances["decode"])
    with pytest.raises(disagg.KVLedgerError, match=r"prefill 0: \d+ free \+ \d+ of its requests \+ 1500 owned "
                                                   r"finished prefills \+ 0 decode slots in flight") as exc:
        audited_run(t, reqs_)
    total, pool = map(int, re.search(r"= (\d+) != its pool of (\d+) tokens", str(exc.value)).groups())
    assert total - pool == 1500   # the one prompt freed early, counted free and owned at once


def test_timeline_and_cli(tmp_path):
    from sim.core import tomlio
    import subprocess
    import sys
    from conftest import REPO

    cfg = tmp_path / "d.toml"
    cfg.write_text(tomlio.dumps(table(n=20, rate=8.0)))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(cfg), "--timeline", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "disaggregated: prefill 1 x TP1 x PP1, decode 1 x TP1 x PP1 = 2 GPUs" in proc.stdout
    assert "mean_kv_transfer_ms" in proc.stdout
    trace = json.loads((out / "timeline.json").read_text())["traceEvents"]
    names = {e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    assert {"prefill 0", "decode 0", "KV transfers"} <= names
    assert sum(e.get("cat") == "kv" and e["ph"] == "b" for e in trace) == 20
    summ = json.loads((out / "summary.json").read_text())
    assert summ["num_kv_transfers"] == 20 and "p99_kv_transfer_ms" in summ and "kv_link_utilisation_max" in summ


@pytest.mark.parametrize("over, match", [
    ({"cluster": None}, r"c.toml: \[disaggregation\] needs a \[cluster\] table"),
    ({"parallel": {"tp": 2}}, r"\[parallel\] pp, tp and replicas do not apply with \[disaggregation\]"),
    ({"kv_transfer": "rdma"}, r"kv_transfer must be one of: after_prefill, layerwise, chunked; got 'rdma'"),
    ({"first_token": "client"}, r"first_token must be one of: decode, prefill, transfer; got 'client'"),
    ({"prefill": {"tp": 1, "router": "random"}}, r"\[disaggregation.prefill\] router must be one of: round-robin"),
    ({"decode": {"tp": 0}}, r"\[disaggregation.decode\] tp must be an integer in \[1, 64\]; got 0"),
    ({"decode": {"tp": 1, "gpus": 2}}, r"\[disaggregation.decode\] unknown key 'gpus'; allowed: instances, tp"),
    ({"decode_reserve_tokens": -1}, r"decode_reserve_tokens must be an integer in \[0, 1_048_576\]; got -1"),
    ({"prefill": {"tp": 1, "chunk_policy": {"nme": "static"}}}, r"chunk_policy must be a table"),
])
def test_bad_disaggregation_configs_fail_on_load(over, match):
    t = table()
    for k, v in over.items():
        if k in ("cluster", "parallel"):
            if v is None:
                del t[k]
            else:
                t[k] = v
        else:
            t["disaggregation"][k] = v
    with pytest.raises(ConfigError, match=match) as exc:
        config_from_table(t, "c.toml")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("over, match", [
    ({"scheduler": {"engine": "vllm-v0"}}, r"engine = 'vllm-v0': not modelled with \[disaggregation\] \(vLLM "
                                           r"0.6.3.post1, vllm-v0, has no disaggregated prefill.*allowed: engine = "
                                           r"'fastpp', 'sglang', 'vllm-v1'"),
    ({"scheduler": {"engine": "sglang", "prefix_cache": True}}, r"prefix caches in disaggregated pools are not "
                                                                r"modelled; allowed: prefix_cache = false"),
    ({"decode": {"tp": 3}}, r"\[disaggregation.decode\] profile: .*tp3 does not exist \(tp = 3\)"),
    ({"nodes": 1}, r"the deployment needs 2 GPUs .* but the cluster has 1"),
])
def test_disaggregation_errors_when_the_run_starts(over, match):
    t = table()
    if "scheduler" in over:
        t["scheduler"].update(over["scheduler"])
    if "decode" in over:
        t["disaggregation"]["decode"] = over["decode"]
    if "nodes" in over:
        t["cluster"]["nodes"] = over["nodes"]
    with pytest.raises(ConfigError, match=match) as exc:
        run(config_from_table(t), reqs((100, 5)))
    assert "\n" not in str(exc.value)


def test_closed_loop_clients_with_disaggregated_pools():
    # one closed-loop client: each 1000/20 request runs alone, so each takes the one-request run's E2E
    # (its KV transfer checked by hand above), and the next is sent when it finishes
    _, one, _ = run_one(table(), reqs((1000, 20)))
    e2e = float(one["e2e_ms"].iloc[0]) / 1e3
    t = table()
    t["workload"] = {"kind": "bench", "num_requests": 4, "input_len": 1000, "output_len": 20, "concurrency": 1}
    res = run(config_from_table(t))
    df, s = requests_frame(res), summarize(res)
    assert s["completed"] == 4 and s["num_kv_transfers"] == 4
    assert df["e2e_ms"].to_numpy() == pytest.approx(e2e * 1e3, rel=1e-9)
    assert df["arrival_s"].to_numpy() == pytest.approx([0.0, e2e, 2 * e2e, 3 * e2e], rel=1e-9)
    assert s["request_throughput"] == pytest.approx(1 / e2e, rel=1e-9)
    # two clients on one prefill and one decode instance: never more than two requests in the server
    t["workload"]["concurrency"] = 2
    df2 = requests_frame(run(config_from_table(t)))
    starts, ends = df2["arrival_s"].to_numpy(), df2["finish_s"].to_numpy()
    assert all(((starts <= x) & (ends > x)).sum() <= 2 for x in starts)
    assert (df2["status"] == "finished").all()
