"""The engines' schedulers (sim/engine/schedulers/): their decisions step by step on small
hand-built cases, against what each engine's source does; the prefix cache's invariants; hit
rates against an offline count; every engine on every shipped workload; determinism."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import pytest

from sim.engine.prefix_cache import PrefixCache
from sim.engine.schedulers.sglang import SGLangScheduler
from sim.engine.schedulers.vllm_v0 import VllmV0Scheduler
from sim.engine.schedulers.vllm_v1 import VllmV1Scheduler
from sim.engine.state import DECODE, EXTEND, MIXED
from tests.conftest import make_req
from tests.fuzzing import invoke

REPO = Path(__file__).resolve().parents[1]
PROFILE = "profiles/built/a100-sxm-80gb/llama-3.1-8b/tp1"


def drive(sched, reqs, steps: int, pp: int = 1, dt: float = 0.01, check=None):
    """Run the scheduler as the lock-step pipeline does (no clock: `dt` a step); returns the
    micro-batches formed, in order."""
    pending = deque(sorted(reqs, key=lambda r: r.arrival_s))
    inflight: deque = deque([None] * pp, maxlen=pp)
    out = []
    for k in range(steps):
        now = k * dt
        while pending and pending[0].arrival_s <= now:
            sched.add_waiting(pending.popleft())
        mb = sched.form_batch(k % pp, now)
        inflight.appendleft(mb)
        out.append(mb)
        leaving = inflight[pp - 1]
        if leaving is not None:
            inflight[pp - 1] = None
            sched.process_result(leaving, now + dt)
        if check is not None:
            check(sched, [r for r in reqs if not r.finished and r.state == "running"])
    return out


def pieces(mb):
    return [(r.rid, new, prefix) for r, new, prefix in mb.prefill]


# ---------------------------------------------------------------- the prefix cache

def test_cache_match_insert_and_lru_eviction_of_unpinned_leaves():
    c = PrefixCache()
    new, path = c.insert([(1, 100), (2, 50)], 150, now=1.0)
    assert new == 150 and c.size == 150 and [n.cached for n in path] == [100, 50]
    c.insert([(1, 100), (3, 30)], 130, now=2.0)  # shares piece 1
    assert c.size == 180
    hit, p = c.match([(1, 100), (2, 50), (9, 10)], limit=10_000, now=3.0)
    assert hit == 150 and len(p) == 2
    assert c.match([(1, 100), (2, 50)], limit=149, now=3.0)[0] == 149  # capped (last token recomputed)
    c.lock(p)
    assert c.pinned == 150 and c.evictable == 30
    # only the unpinned leaf (piece 3) can go, however much is asked
    assert c.evict(1000) == 30 and c.size == 150
    c.unlock(p)
    assert c.evict(10) == 10 and c.size == 140  # the LRU leaf (piece 2, used at 3.0) loses its tail
    assert c.match([(1, 100), (2, 50)], 10_000, now=4.0)[0] == 140


def test_sglang_radix_cache_evicts_whole_leaves():
    # SGLang 0.5.23 radix_cache.py `RadixCache.evict`: each LRU leaf's whole value is freed and
    # the leaf deleted, however few tokens were asked for (vLLM's blocks go tail first: above)
    c = PrefixCache(whole_leaves=True)
    c.insert([(1, 100), (2, 50)], 150, now=1.0)
    c.insert([(1, 100), (3, 30)], 130, now=2.0)
    assert c.evict(10) == 50 and c.size == 130  # leaf 2 (LRU) goes whole
    assert c.match([(1, 100), (2, 50)], 10_000, now=3.0)[0] == 100
    assert c.evict(31) == 30 + 100  # leaf 3, then its parent, now a leaf
    s = SGLangScheduler(1, 1000, 256, 1024, prefix_cache=True)
    assert s.cache.whole_leaves


def test_cache_granularity_keeps_whole_blocks():
    c = PrefixCache(granularity=16)
    new, _ = c.insert([(1, 40)], 40, now=0.0)
    assert new == 32  # whole blocks only
    assert c.evict(1) == 16 and c.size == 16


# ---------------------------------------------------------------- vLLM V1

def test_vllm_v1_token_budget_running_first_then_waiting_chunked():
    # budget 1024, three 800-token prompts: 800, then 224 of the second (its partial prefill)
    s = VllmV1Scheduler(1, 100_000, 256, 1024, prefix_cache=False)
    reqs = [make_req(i, 800, output=5) for i in range(3)]
    mbs = drive(s, reqs, 3)
    assert pieces(mbs[0]) == [(0, 800, 0), (1, 224, 0)] and mbs[0].chunked is reqs[1]
    # step 2: request 0 decodes (running first), request 1's next 576, then 447 of request 2
    assert mbs[1].mode == MIXED and [r.rid for r in mbs[1].decodes] == [0]
    assert pieces(mbs[1]) == [(1, 576, 224), (2, 447, 0)]
    assert pieces(mbs[2])[0] == (2, 353, 447)


def test_vllm_v1_preempts_the_newest_by_recompute_and_admits_nothing_that_step():
    # a pool of 4 blocks (16 tokens each): two 16-token prompts (a block each) take their second
    # at the first decode and find none for their third (step 17)
    s = VllmV1Scheduler(1, 64, 256, 1024, prefix_cache=False)
    a, b, c = make_req(0, 16, output=30), make_req(1, 16, output=30), make_req(2, 4, output=2, arrival=0.005)
    seen = []

    def first_preemption(sched, live):
        if sched.retractions and not seen:
            seen.append((a.num_retractions, b.num_retractions, list(sched.waiting)))

    mbs = drive(s, [a, b, c], 20, check=first_preemption)
    ra, rb, waiting = seen[0]
    assert (ra, rb) == (0, 1) and waiting[0] is b  # the newest, to the head of the queue
    k = next(i for i, mb in enumerate(mbs) if mb is not None and b in mb.decodes) + 1
    # the step that preempted admitted nothing new
    assert all(r is not c for mb in mbs[k:k + 1] if mb is not None for r, *_ in mb.prefill)


def test_vllm_v1_prefix_hit_is_whole_blocks_and_never_the_last_token():
    s = VllmV1Scheduler(1, 100_000, 256, 2048, prefix_cache=True, block_size=16)
    a = make_req(0, 64, output=2)
    a.pieces = ((7, 64),)
    b = make_req(1, 64, output=2, arrival=0.05)
    b.pieces = ((7, 64),)
    mbs = drive(s, [a, b], 12)
    # b's 64 tokens are all cached, but the last must be computed: 63 -> 48 whole blocks hit
    admit_b = next(mb for mb in mbs if mb is not None and any(r is b for r, *_ in mb.prefill))
    assert pieces(admit_b) == [(1, 16, 48)] and b.cached_tokens == 48


def test_vllm_v1_caches_a_prompts_blocks_when_they_are_scheduled():
    # vLLM 0.10.1.1 kv_cache_manager.py `allocate_slots`: cache_blocks(request, num_computed +
    # num_new) right after allocating: in step 1 a's last 976 tokens are scheduled (running
    # first), which caches all 2000, then b looks up in the same schedule() and hits 1984 (the
    # last block recomputed), before a's prompt has produced a token (before: no hit at all)
    s = VllmV1Scheduler(1, 100_000, 256, 1024, prefix_cache=True, block_size=16)
    a, b = make_req(0, 2000, output=2), make_req(1, 2000, output=2, arrival=0.005)
    a.pieces = b.pieces = ((7, 2000),)
    mbs = drive(s, [a, b], 2)
    assert pieces(mbs[0]) == [(0, 1024, 0)]
    assert pieces(mbs[1]) == [(0, 976, 1024), (1, 16, 1984)] and b.cached_tokens == 1984


def test_vllm_v1_preempted_request_re_hits_the_blocks_that_survive():
    # vLLM keeps a preempted request's hashed blocks in the free queue (KVCacheManager.free);
    # its re-admission hits what was not reused. Pool 136 tokens = 8 whole blocks of 16: a and b
    # (32-token prompts, no prefix ids) take a block each whenever their last is full: 4 blocks
    # each at step 17; at step 33 both need a fifth and none is free, so b, the newest, is
    # preempted (counted in tokens, 136 - 2 x 64 = 8 would have lasted to step 37) with 33
    # outputs: its 64 computed tokens cached (prompt and output); a's growth evicts the output's
    # blocks (the LRU leaf), the prompt's 32 survive: b re-prefills 65 - 32 = 33 tokens, not 65.
    s = VllmV1Scheduler(1, 136, 256, 1024, prefix_cache=True)
    a, b = make_req(0, 32, output=60), make_req(1, 32, output=60)
    mbs = drive(s, [a, b], 62)
    again = [pieces(mb) for mb in mbs[1:] if mb is not None and mb.prefill]
    assert s.preemptions == 1 and again == [[(1, 33, 32)]]
    assert [round(t, 6) for t, _slot, rid, what in s.events if what == "preempt"] == [0.33]


# ---------------------------------------------------------------- SGLang 0.5.23

def test_sglang_prefill_first_running_decodes_stall_and_chunk_fills_the_budget():
    s = SGLangScheduler(1, 100_000, 256, 1000, prefix_cache=False)
    a = make_req(0, 300, output=20)
    b, c = make_req(1, 600, output=20, arrival=0.015), make_req(2, 600, output=20, arrival=0.015)
    mbs = drive(s, [a, b, c], 5)
    assert mbs[0].mode == EXTEND and pieces(mbs[0]) == [(0, 300, 0)]
    assert mbs[1].mode == DECODE  # nothing waiting yet
    # b and c arrived: an EXTEND batch of exactly 1000 tokens (c cut), a's decode waits
    assert mbs[2].mode == EXTEND and pieces(mbs[2]) == [(1, 600, 0), (2, 400, 0)] and not mbs[2].decodes
    assert mbs[3].mode == EXTEND and pieces(mbs[3]) == [(2, 200, 400)]  # the chunked request first


def test_sglang_admission_reserves_outputs_and_sticks_full():
    # pool 1000: a 500-token prompt reserving 400 outputs leaves 99: a second (100 + 400 + 1) is refused
    s = SGLangScheduler(1, 1000, 256, 4096, prefix_cache=False)
    a, b = make_req(0, 500, output=400), make_req(1, 100, output=400)
    mbs = drive(s, [a, b], 3)
    assert pieces(mbs[0]) == [(0, 500, 0)] and s.batch_is_full and list(s.waiting) == [b]
    assert mbs[1].mode == DECODE and mbs[2].mode == DECODE  # sticky until a request leaves


def test_sglang_pp_reserves_for_the_micro_batch_being_formed_only():
    # SGLang 0.5.23 scheduler.py `_get_new_batch_prefill_raw` builds the PrefillAdder with the
    # micro-batch's running batch (scheduler_pp_mixin.py `event_loop_pp`: running_mbs[mb_id]),
    # whose `batch_is_full` is that micro-batch's own. Pool 1000, PP 2: a (500 + 400 outputs)
    # runs in slot 0; b (100 + 300) in slot 1 reserves 401 of the 499 left, a's 399 uncounted.
    s = SGLangScheduler(2, 1000, 256, 4096, prefix_cache=False)
    a, b = make_req(0, 500, output=400), make_req(1, 100, output=300, arrival=0.025)
    c = make_req(2, 600, output=10, arrival=0.025)  # refused in slot 1: NO_TOKEN there only
    mbs = drive(s, [a, b, c], 4, pp=2)
    assert pieces(mbs[0]) == [(0, 500, 0)] and mbs[2].mode == DECODE
    # step 3 (slot 1): 499 free after a's prompt and first decode token; a's 399 left not counted
    assert mbs[3].mode == EXTEND and pieces(mbs[3]) == [(1, 100, 0)] and list(s.waiting) == [c]
    assert s.full == [False, True]  # slot 0's flag untouched by slot 1's NO_TOKEN


def test_sglang_empty_running_batch_replaced_by_the_prefill_batch_drops_batch_is_full():
    # ignore_eos off: a running request reserves its outputs x new_token_ratio (0.7), a new one
    # x 1. Step 0: a (400 + 300) admitted, b (50 + 300 + 1 = 351) refused (1000 - 701 = 299):
    # full. Step 1 (get_next_batch_to_run): the empty running batch becomes a's prefill batch,
    # flag False, so b is tried again: 351 < 1000 - 400 - 0.7 x 300 = 390, admitted, not after
    # a's 300 tokens.
    s = SGLangScheduler(1, 1000, 256, 4096, prefix_cache=False, ignore_eos=False)
    a, b = make_req(0, 400, output=300), make_req(1, 50, output=300)
    mbs = drive(s, [a, b], 2)
    assert pieces(mbs[0]) == [(0, 400, 0)]
    assert mbs[1].mode == EXTEND and pieces(mbs[1]) == [(1, 50, 0)]


def test_sglang_retracts_fewest_outputs_until_the_next_step_fits():
    s = SGLangScheduler(1, 10_000, 256, 4096, prefix_cache=False)
    a, b, c = make_req(0, 40, output=50), make_req(1, 60, output=50), make_req(2, 50, output=50, arrival=0.025)
    drive(s, [a, b], 4)  # a and b decode (3 tokens each so far)
    s.add_waiting(c)
    drive(s, [], 2)  # c joins with fewer outputs
    assert c.out_len < a.out_len == b.out_len
    s.kv_free = 2  # the next decode step (3 tokens) no longer fits
    mb = s.form_batch(0, 1.0)
    # retract c (fewest outputs) and stop: 2 requests fit; the ratio from the ones kept
    assert c.state == "waiting" and s.retractions == 1 and mb.decodes == [a, b]
    assert s.new_token_ratio == pytest.approx((a.out_len + b.out_len + 20 * 2) / (a.max_new + b.max_new + 1))
    s.kv_free = 0  # now not even one more token: b (longest prompt among equals) goes, a is kept
    s.process_result(mb, 1.1)
    s.kv_free = 1
    mb = s.form_batch(0, 1.2)
    assert b.state == "waiting" and mb.decodes == [a]


# ---------------------------------------------------------------- vLLM V0

def test_vllm_v0_prefill_only_steps_and_decodes_stall():
    s = VllmV0Scheduler(1, 100_000, 256, 4096)
    a, b = make_req(0, 100, output=10), make_req(1, 100, output=10, arrival=0.025)
    mbs = drive(s, [a, b], 5)
    assert mbs[0].mode == EXTEND and mbs[1].mode == DECODE and mbs[2].mode == DECODE
    assert mbs[3].mode == EXTEND and pieces(mbs[3]) == [(1, 100, 0)] and not mbs[3].decodes  # a stalls


def test_vllm_v0_decodes_eagerly_beyond_max_seq_len_to_capture():
    # vLLM 0.6.3 model_runner.py `_use_captured_graph`: max_decode_seq_len <= 8192, else eager
    s = VllmV0Scheduler(1, 100_000, 256, 32_768)
    s.capture_sizes = (1, 2, 4, 8)
    reqs = [make_req(i, 8185, output=20) for i in range(3)]
    mbs = drive(s, reqs, 12)
    decodes = [mb for mb in mbs if mb is not None and mb.mode == DECODE]
    # 3 rows padded to the graph of 4 while every sequence (8185 + outputs) is <= 8192
    longest = [max(r.prompt_len for r in mb.decodes) + k + 1 for k, mb in enumerate(decodes)]
    assert [mb.stats.pad_tokens for mb in decodes] == [1 if n <= 8192 else 0 for n in longest]
    assert decodes[0].stats.pad_tokens == 1 and decodes[-1].stats.pad_tokens == 0


def test_vllm_v0_whole_prompts_under_the_watermark():
    # 1000 blocks, a 1% watermark of 10: b's 494 blocks would leave 6 of the 500 a leaves free: LATER
    s = VllmV0Scheduler(1, 16_000, 256, 16_000)
    a, b = make_req(0, 8_000, output=3), make_req(1, 7_900, output=3)
    mbs = drive(s, [a, b], 2)
    assert pieces(mbs[0]) == [(0, 8_000, 0)] and list(s.waiting) == [b]
    # alone in the pool the same shortfall is NEVER (can_allocate: total - needed < watermark): ignored
    s = VllmV0Scheduler(1, 16_000, 256, 16_000)
    c = make_req(2, 15_900, output=3)
    mbs = drive(s, [c], 2)
    assert mbs[0] is None and not s.waiting and c.state == "ignored"


# ---------------------------------------------------------------- invariants

def _accounting(s, live):
    own = sum(r.kv_held for r in live)
    assert s.kv_free + own + (s.cache.size if s.cache else 0) == s.kv_capacity
    assert 0 <= s.kv_free <= s.kv_capacity
    if s.cache is not None:
        assert 0 <= s.cache.pinned <= s.cache.size
        for r in live:
            for n in r.cache_path or []:
                assert n.refs > 0 and n.cached > 0  # a block in use is never evicted


@pytest.mark.parametrize("cls", [SGLangScheduler, VllmV1Scheduler])
def test_no_kv_is_counted_twice_and_pinned_blocks_survive_pressure(cls):
    import random

    rng = random.Random(3)
    reqs = []
    for i in range(60):
        shared = rng.randrange(4)
        r = make_req(i, 200 + 16 * rng.randrange(10), output=rng.randrange(2, 40), arrival=0.02 * i)
        r.pieces = ((shared, 128), (1000 + i, r.prompt_len - 128))
        reqs.append(r)
    s = cls(1, 1500, 256, 512, on_kv_exhausted="retract")
    drive(s, reqs, 800, check=_accounting)
    assert all(r.finished for r in reqs)
    assert s.hit_tokens > 0 and s.evicted_tokens > 0  # both the hits and the pressure happened


# ---------------------------------------------------------------- whole runs

def _mooncake(path: Path, rows: list[tuple[int, list[int], int]]):
    """Rows (input_length, hash_ids, timestamp ms) as a Mooncake JSONL trace."""
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": ids}) + "\n"
                            for n, ids, t in rows))


def offline_hits(rows, limit_of) -> int:
    """Tokens of each row's longest prefix of ids seen (as a prefix) in an earlier row."""
    seen: set[tuple] = set()
    total = 0
    for n, ids, _t in rows:
        hit = 0
        for k in range(1, len(ids) + 1):
            if tuple(ids[:k]) in seen:
                hit = min(512 * k, n)
        total += min(hit, limit_of(n))
        for k in range(1, len(ids) + 1):
            seen.add(tuple(ids[:k]))
    return total


def _rows():
    import random

    rng = random.Random(5)
    rows, t = [], 0
    for i in range(40):
        base = [0, 1, 2][: rng.randrange(1, 4)] if rng.random() < 0.7 else []
        k = rng.randrange(1, 4)
        ids = base + [100 + 10 * i + j for j in range(k)]
        n = 512 * (len(ids) - 1) + rng.randrange(1, 512)
        rows.append((n, ids, t))
        t += 2000  # 2 s apart: each finishes before the next arrives
    return rows


@pytest.mark.parametrize("engine, limit", [("sglang", lambda n: n - 1), ("vllm-v1", lambda n: (n - 1) // 16 * 16)])
def test_mooncake_hit_rate_equals_the_offline_reuse_when_the_cache_holds_it(tmp_path, engine, limit):
    rows = _rows()
    trace = tmp_path / "m.jsonl"
    _mooncake(trace, rows)
    out = tmp_path / engine
    code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--trace", str(trace),
                           "--set", f'latency.profile="{PROFILE}"', "--set", "parallel.pp=1",
                           "--set", f'scheduler.engine="{engine}"', "--set", "scheduler.chunk_size_tokens=2048",
                           "--out", str(out)])
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    prompts = sum(n for n, _i, _t in rows)
    assert summary["prefix_hit_rate"] == pytest.approx(offline_hits(rows, limit) / prompts, abs=1e-12)
    # a pool too small to keep them: eviction lowers the rate
    small = tmp_path / f"{engine}-small"
    code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--trace", str(trace),
                           "--set", f'latency.profile="{PROFILE}"', "--set", "parallel.pp=1",
                           "--set", f'scheduler.engine="{engine}"', "--set", "scheduler.kv_tokens=2600",
                           "--set", "scheduler.chunk_size_tokens=2048", "--out", str(small)])
    assert code == 0, err
    assert json.loads((small / "summary.json").read_text())["prefix_hit_rate"] < summary["prefix_hit_rate"]


SHIPPED = sorted(p.stem for p in (REPO / "workloads").glob("*.toml"))


@pytest.mark.parametrize("engine", ["fastpp", "sglang", "vllm-v1", "vllm-v0"])
def test_every_engine_runs_every_shipped_workload(tmp_path, engine):
    from tests.conftest import SHARED_DATA

    import os

    os.environ.setdefault("PIPESIM_CACHE", str(SHARED_DATA / "azure-llm-inference-2023"))
    for name in SHIPPED:
        if name.startswith("azure-") and name != "azure-conv-synth" and not SHARED_DATA.is_dir():
            continue  # (the trace lives in ../shared/data)
        size = "num_sessions=6" if name == "chat-sessions" else "num_requests=8"
        if name == "azure-conv-replay":
            size = "window_minutes=0.1"
        code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set",
                               f'workload={{name="{name}", {size}}}', "--set", f'scheduler.engine="{engine}"', "--set", "parallel.pp=1",
                               "--set", f'latency.profile="{PROFILE}"', "--set", "scheduler.chunk_size_tokens=0",
                               "--no-iterations",
                               "--out", str(tmp_path / name)])
        assert code == 0, f"{engine} on {name}: {err}"


def test_same_seed_same_outputs(tmp_path):
    for k in (1, 2):
        code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set",
                               'workload={name="chat-sessions", num_sessions=20}', "--set", 'scheduler.engine="sglang"',
                               "--out", str(tmp_path / f"r{k}")])
        assert code == 0, err
    for f in ("summary.json", "requests.csv", "iterations.csv"):
        assert (tmp_path / "r1" / f).read_bytes() == (tmp_path / "r2" / f).read_bytes()


def test_validate_simulates_the_engine_the_log_names(tmp_path):
    log = tmp_path / "vllm.json"
    log.write_text(json.dumps({"backend": "vllm", "request_rate": 2.0, "input_lens": [120, 300, 80],
                               "output_lens": [5, 4, 3], "ttfts": [0.05, 0.06, 0.04],
                               "itls": [[0.01] * 4, [0.01] * 3, [0.01] * 2], "errors": ["", "", ""]}))
    cfg = tmp_path / "c.toml"
    cfg.write_text((REPO / "experiments/configs/default.toml").read_text()
                   .replace("pp = 4", "pp = 1").replace("profiles/a100-pcie-40gb/qwen2.5-32b/tp1", PROFILE))
    code, out, err = invoke(["validate", "--bench-log", str(log), "--config", str(cfg)])
    assert code == 0, err + out
    assert "engine:" in out and "vllm-v1" in out and "chosen by the log's backend 'vllm'" in out
    code, out, err = invoke(["validate", "--bench-log", str(log), "--config", str(cfg), "--engine", "vllm-v0",
                             "--set", "scheduler.chunk_size_tokens=0"])  # (V0's own budget: no chunking)
    assert code == 0 and "vllm-v0" in out and "chosen by --engine" in out


def test_gate_takes_engines_as_its_axis(tmp_path):
    code, out, err = invoke(["gate", str(REPO / "experiments/configs/default.toml"), "--set", "parallel.pp=1",
                             "--set", f'latency.profile="{PROFILE}"', "--set", "workload.num_requests=40",
                             "--baseline", "engine:fastpp", "--candidate", "engine:vllm-v1", "--metric", "p90_ttft",
                             "--seeds", "2", "--out", str(tmp_path / "g"), "--no-progress"])
    assert code in (0, 1), err
    assert "engine:vllm-v1" in (tmp_path / "g" / "gate.md").read_text()
    code, _, err = invoke(["gate", str(REPO / "experiments/configs/default.toml"), "--baseline", "engine:nope",
                           "--candidate", "PP_512", "--metric", "p90_ttft", "--out", str(tmp_path / "g2")])
    assert code == 2 and "unknown scheduler engine 'nope'" in err


def test_cuda_graph_padding_by_hand():
    from sim.engine.schedulers import pad_to
    from sim.engine.state import MicroBatch

    assert pad_to((1, 2, 4, 8, 16), 13) == 16 and pad_to((1, 2, 4, 8, 16), 17) == 17  # eager beyond
    s = VllmV1Scheduler(1, 10_000, 256, 512, prefix_cache=False)
    s.capture_sizes, s.pad_total = (1, 2, 4, 8, 16), True
    reqs = [make_req(i, 10, 3) for i in range(3)]
    mb = s.pad(MicroBatch(0, 0, EXTEND, [(r, 4, 0) for r in reqs] + [(reqs[0], 1, 0)], [], None, 512))
    assert mb.stats.pad_tokens == 16 - 13  # vLLM V1 pads the step's tokens
    g = SGLangScheduler(1, 10_000, 256, 512, prefix_cache=False)
    g.capture_sizes = (1, 2, 4, 8, 12, 16)
    mb = g.pad(MicroBatch(0, 0, DECODE, [], reqs * 3, None, 512))
    assert mb.stats.pad_tokens == 12 - 9  # SGLang pads a decode batch's rows
    assert g.pad(MicroBatch(0, 0, EXTEND, [(reqs[0], 9, 0)], [], None, 512)).stats.pad_tokens == 0


def test_plan_takes_engines_as_one_more_axis(tmp_path):
    import pandas as pd

    code, out, err = invoke(["plan", "--model", "llama-3.1-8b", "--gpu", "profiles/built/a100-sxm-80gb", "--gpus", "1",
                             "--rate", "4", "--workload", "sharegpt", "--set", "workload.num_requests=40",
                             "--engine", "fastpp,vllm-v1", "--seeds", "1", "--quick", "--out", str(tmp_path / "p"),
                             "--no-progress"])
    assert code == 0, err
    df = pd.read_csv(tmp_path / "p" / "plan.csv")
    ok = df[df["status"] == "ok"]
    assert set(ok["engine"]) == {"fastpp", "vllm-v1"}
    assert not ((ok["engine"] == "vllm-v1") & (ok["policy"] == "predictive+DS")).any()  # no rebalancer there
    # vllm-v0 is planned too (its default only, PP 1): tests/test_plan_inputs.py


def test_sglang_locks_each_admitted_prefix_before_testing_the_next():
    # two cached prefixes, a pool with room for one prompt beyond them: the first request's hit is
    # locked when the second is tested, so the second may not count it as evictable
    s = SGLangScheduler(1, 1150, 256, 4096, prefix_cache=True)
    s.cache.insert([(1, 500)], 500, now=0.0)
    s.cache.insert([(2, 500)], 500, now=0.0)
    s.kv_free = 1150 - 1000
    a, b = make_req(0, 600, output=2), make_req(1, 600, output=2)
    a.pieces, b.pieces = ((1, 500), (10, 100)), ((2, 500), (11, 100))
    s.add_waiting(a)
    s.add_waiting(b)
    mb = s.form_batch(0, 0.0)
    assert [r for r, *_ in mb.prefill] == [a]  # b refused: a's 500 tokens are pinned now
    assert a.cached_tokens == 500 and s.cache.pinned == 500 and list(s.waiting) == [b]


def test_sglang_lpm_serves_the_longest_cached_prefix_first():
    s = SGLangScheduler(1, 100_000, 256, 4096, prefix_cache=True, policy="lpm")
    s.cache.insert([(7, 300)], 300, now=0.0)
    s.kv_free -= 300
    a, b = make_req(0, 400, output=2), make_req(1, 400, output=2)
    a.pieces, b.pieces = ((8, 400),), ((7, 300), (9, 100))
    s.add_waiting(a)
    s.add_waiting(b)
    s.chunk_size = 150  # room for one: the policy decides which
    mb = s.form_batch(0, 0.0)
    assert pieces(mb)[0][0] == 1  # b (300 cached) before a (arrived first, nothing cached)
    t = SGLangScheduler(1, 100_000, 256, 150, prefix_cache=True, policy="fcfs")
    t.cache.insert([(7, 300)], 300, now=0.0)
    t.kv_free -= 300
    a2, b2 = make_req(0, 400, output=2), make_req(1, 400, output=2)
    a2.pieces, b2.pieces = a.pieces, b.pieces
    t.add_waiting(a2)
    t.add_waiting(b2)
    assert pieces(t.form_batch(0, 0.0))[0][0] == 0  # FCFS: arrival order


def test_vllm_v1_long_prefill_threshold_shares_the_budget_among_partial_prefills():
    s = VllmV1Scheduler(1, 100_000, 256, 1024, prefix_cache=False, long_prefill_threshold=256)
    reqs = [make_req(i, 1000, output=3) for i in range(5)]
    mbs = drive(s, reqs, 2)
    # every prompt gets at most 256 a step; four fit the budget of 1024
    assert pieces(mbs[0]) == [(0, 256, 0), (1, 256, 0), (2, 256, 0), (3, 256, 0)]
    assert pieces(mbs[1])[:4] == [(0, 256, 256), (1, 256, 256), (2, 256, 256), (3, 256, 256)]
    assert all(r.first_token_s is None for r in reqs)  # no partial chunk emits a token


def test_overlap_hides_host_time_up_to_the_gpu_step(tmp_path):
    out = {}
    for overlap in ("true", "false"):
        code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set", "parallel.pp=1",
                               "--set", f'latency.profile="{PROFILE}"', "--set", "workload.num_requests=60",
                               "--engine", "sglang", "--set", f"scheduler.overlap={overlap}", "--out",
                               str(tmp_path / overlap)])
        assert code == 0, err
        import pandas as pd

        out[overlap] = pd.read_csv(tmp_path / overlap / "iterations.csv")
    on, off = out["true"], out["false"]
    busy = lambda df: df[df["mode"] != "idle"]  # noqa: E731
    stage = busy(off)["stage0_busy_ms"]
    assert (busy(off)["host_ms"] > 0).all()
    # with overlap a step's host time is only what its GPU time does not cover
    assert (busy(on)["host_ms"] <= busy(off)["host_ms"].max()).all()
    assert busy(on)["host_ms"].mean() < busy(off)["host_ms"].mean() and stage.mean() > 0
    # it hides under the previous step's GPU time (event_loop_overlap): a step after an idle turn,
    # or the run's first, shows all of it, as the run without overlap does
    after_idle = on[(on["mode"] != "idle") & (on["mode"].shift(1, fill_value="idle") == "idle")]
    assert len(after_idle) and (after_idle["host_ms"] > 0).all()
    prev = on["stage0_busy_ms"].shift(1, fill_value=0.0)
    chained = busy(on)[(on["mode"].shift(1, fill_value="idle") != "idle")[busy(on).index]]
    assert (chained["host_ms"] <= (busy(off)["host_ms"].max() - prev[chained.index]).clip(lower=0) + 1e-9).all()


@pytest.mark.parametrize("engine", ["fastpp", "vllm-v1", "vllm-v0"])
def test_same_seed_same_outputs_every_engine(tmp_path, engine):
    for k in (1, 2):
        code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set", "parallel.pp=1",
                               "--set", f'latency.profile="{PROFILE}"', "--set",
                               'workload={name="shared-system-prompt", num_requests=80}', "--set",
                               "scheduler.chunk_size_tokens=0", "--engine", engine, "--out", str(tmp_path / f"r{k}")])
        assert code == 0, err
    for f in ("summary.json", "requests.csv", "iterations.csv"):
        assert (tmp_path / "r1" / f).read_bytes() == (tmp_path / "r2" / f).read_bytes()


# ---------------------------------------------------------------- engine versions

def test_engine_versions_take_their_releases_defaults_and_unknown_ones_are_refused():
    from types import SimpleNamespace

    from sim.core.errors import ConfigError
    from sim.engine.schedulers import Hardware
    from sim.engine.schedulers.vllm_v1 import VllmV1Engine

    def sc(version, overlap=None):
        return SimpleNamespace(engine_version=version, chunk_size_tokens=0, max_running_requests=0,
                               prefix_cache=None, cuda_graphs=None, overlap=overlap)

    h100 = Hardware("h100-sxm-80gb", 80.0, 1, 1)
    old, new = VllmV1Engine().settings(sc(""), h100), VllmV1Engine().settings(sc("0.15"), h100)
    # the same budget and max_num_seqs (arg_utils.py), 8192 and 1024 on an H100
    assert (old.token_budget, old.max_running, new.token_budget, new.max_running) == (8192, 1024, 8192, 1024)
    # async scheduling: off in 0.10.1.1 (SchedulerConfig), on by default in 0.15.1 (VllmConfig)
    assert old.version == "vLLM 0.10.1.1 (V1)" and not old.overlap and new.overlap
    assert not VllmV1Engine().settings(sc("0.15", overlap=False), h100).overlap
    # `vllm serve --async-scheduling` on 0.10/0.11 (SchedulerConfig.async_scheduling exists there, off by
    # default): `[scheduler] overlap = true` is accepted for vllm-v1 and reaches its settings
    from sim.core.config import config_from_table

    cfg = config_from_table({"scheduler": {"engine": "vllm-v1", "engine_version": "0.10", "overlap": True},
                             "workload": {"name": "sharegpt", "num_requests": 5, "rate_rps": 1.0}}, "test")
    assert VllmV1Engine().settings(cfg.scheduler, h100).overlap
    # graph sizes: multiples of 8 up to 512 (0.10); from 256 on multiples of 16 (0.15)
    assert old.capture_sizes[-3:] == (496, 504, 512) and new.capture_sizes[-3:] == (480, 496, 512)
    assert len(old.capture_sizes) == 3 + 64 and len(new.capture_sizes) == 3 + 31 + 17
    with pytest.raises(ConfigError, match=r"engine_version = '0.9'.*known: 0.10 .*0.11 .*0.15"):
        VllmV1Engine().settings(sc("0.9"), h100)


def test_vllm_v0_turns_chunked_prefill_on_above_32k_contexts():
    # arg_utils.py create_engine_config (max_model_len > 32768) and config.py SchedulerConfig (512)
    from types import SimpleNamespace

    from sim.core.errors import ConfigError
    from sim.engine.schedulers import Hardware
    from sim.engine.schedulers.vllm_v0 import VllmV0ChunkedScheduler, VllmV0Engine

    def sc(ctx, chunk=0):
        return SimpleNamespace(engine_version="", chunk_size_tokens=chunk, max_running_requests=0, prefix_cache=None,
                               cuda_graphs=None, overlap=None, context_length_tokens=ctx, block_size_tokens=16)

    hw = Hardware("a100-sxm-80gb", 80.0, 1, 1)
    off, on = VllmV0Engine().settings(sc(32768), hw), VllmV0Engine().settings(sc(32769), hw)
    assert off.token_budget == 32768 and off.note.startswith("chunked prefill off")
    assert on.token_budget == 512 and on.note.startswith("chunked prefill on") and on.max_running == 256
    assert type(VllmV0Engine().build(on, 1, 100_000, 256, 512, "exit", sc(32769))) is VllmV0ChunkedScheduler
    assert type(VllmV0Engine().build(off, 1, 100_000, 256, 32768, "exit", sc(32768))) is VllmV0Scheduler
    # the run header and summary.json name the mode (sim/outputs/context.py describe_engine)
    from sim.outputs.context import describe_engine

    run = SimpleNamespace(engine="vllm-v0", engine_version="", prefix_cache=None, context_length_tokens=65536)
    assert describe_engine(run) == "vllm-v0 (" + on.version + "); prefix cache off" and "chunked prefill on" in on.version
    assert "chunked prefill off" in off.version
    with pytest.raises(ConfigError, match="chunk_size_tokens = 100 .* must be >= max_running_requests"):
        VllmV0Engine().settings(sc(65536, chunk=100), hw)  # SchedulerConfig._verify_args


def test_vllm_v0_chunked_prefill_steps_by_hand():
    # _schedule_chunked_prefill, budget 512: running first (decodes, then running prefills), then
    # new prompts cut to the rest; only decode-only steps replay a CUDA graph (_use_captured_graph)
    from sim.engine.schedulers.vllm_v0 import VllmV0ChunkedScheduler

    s = VllmV0ChunkedScheduler(1, 100_000, 256, 512)
    s.capture_sizes = (1, 2, 4, 8)
    a = make_req(0, 1000, output=4, context=65536)
    b = make_req(1, 300, output=4, arrival=0.005, context=65536)
    c = make_req(2, 10, output=4, arrival=0.005, context=65536)
    mbs = drive(s, [a, b, c], 6)
    assert mbs[0].mode == EXTEND and pieces(mbs[0]) == [(0, 512, 0)]
    # 488 of a's rest, then b's 24 (512 - 488); c waits (the budget is spent)
    assert pieces(mbs[1]) == [(0, 488, 512), (1, 24, 0)] and c.admit_s == pytest.approx(0.02)
    # a decodes (1 token), b's 276, c's 10: a mixed step, run eagerly (no padding)
    assert mbs[2].mode == MIXED and [r.rid for r in mbs[2].decodes] == [0]
    assert pieces(mbs[2]) == [(1, 276, 24), (2, 10, 0)] and mbs[2].stats.pad_tokens == 0
    # three decode rows replay the graph of 4
    assert mbs[3].mode == DECODE and len(mbs[3].decodes) == 3 and mbs[3].stats.pad_tokens == 1


def test_vllm_v0_chunked_decodes_eagerly_beyond_max_seq_len_to_capture():
    # the same rule as without chunked prefill: a decode-only step whose longest sequence passes 8192
    from sim.engine.schedulers.vllm_v0 import VllmV0ChunkedScheduler

    s = VllmV0ChunkedScheduler(1, 100_000, 256, 32_768)  # a budget that takes the three prompts at once
    s.capture_sizes = (1, 2, 4, 8)
    seen = []  # (the longest sequence when the step is formed, its padding)
    form = s.form_batch

    def form_batch(slot, now):
        mb = form(slot, now)
        if mb is not None and mb.mode == DECODE:
            seen.append((max(r.prompt_len + r.out_len for r in mb.decodes), mb.stats.pad_tokens))
        return mb

    s.form_batch = form_batch
    drive(s, [make_req(i, 8189, output=8, context=65536) for i in range(3)], 10)
    # three rows replay the graph of 4 while 8189 + out_len <= 8192, then run eagerly
    assert seen == [(8190, 1), (8191, 1), (8192, 1), (8193, 0), (8194, 0), (8195, 0), (8196, 0)]


def test_vllm_v0_chunked_admission_keeps_the_watermark_on_the_whole_prompt():
    # 1000 blocks, watermark 10: a 7,900-token prompt (494 blocks) with 500 free waits (LATER) though
    # its first 512-token chunk would fit; alone in the pool a 15,900-token one is NEVER: ignored
    from sim.engine.schedulers.vllm_v0 import VllmV0ChunkedScheduler

    s = VllmV0ChunkedScheduler(1, 16_000, 256, 512)
    s.kv_free -= 8_000  # 500 blocks held by a running request's prompt
    b = make_req(1, 7_900, output=3, context=65536)
    mbs = drive(s, [b], 1)
    assert mbs[0] is None and list(s.waiting) == [b]
    s = VllmV0ChunkedScheduler(1, 16_000, 256, 512)
    c = make_req(2, 15_900, output=3, context=65536)
    mbs = drive(s, [c], 1)
    assert mbs[0] is None and not s.waiting and c.state == "ignored" and s.num_ignored == 1


def test_sglang_prefill_steps_are_never_padded_decode_steps_are():
    # PipeSim's SGLang pads decode rows to its captured sizes only (the 0.5.23 prefill graphs,
    # schedulers/README.md, are not modelled): its EXTEND steps run at their own token count
    s = SGLangScheduler(1, 100_000, 256, 512, prefix_cache=False)
    s.capture_sizes = (1, 2, 4, 8)
    mbs = drive(s, [make_req(i, 5, output=3) for i in range(3)], 3)
    assert mbs[0].mode == EXTEND and mbs[0].stats.prefill_tokens == 15 and mbs[0].stats.pad_tokens == 0
    assert mbs[1].mode == DECODE and len(mbs[1].decodes) == 3 and mbs[1].stats.pad_tokens == 1


def test_sglang_prefill_graph_pads_a_prefill_step_by_hand():
    # SGLang 0.5.23: generate_prefill_cuda_graph_batch_sizes(chunked_prefill_size) buckets; an EXTEND
    # step of T tokens replays the next bucket, eager above the largest or past 2x padding
    from types import SimpleNamespace

    from sim.engine.schedulers import Hardware
    from sim.engine.schedulers.sglang import SGLangEngine, prefill_capture_sizes

    sizes = prefill_capture_sizes(2048)
    assert sizes[:9] == (4, 8, 12, 16, 20, 24, 28, 32, 48) and sizes[-2:] == (1792, 2048) and len(sizes) == 8 + 14 + 8 + 8 + 4
    assert prefill_capture_sizes(5120)[-3:] == (4096, 4608, 5120)
    s = SGLangScheduler(1, 100_000, 256, 2048, prefix_cache=False)
    s.prefill_capture_sizes = sizes
    a, b = make_req(0, 300, output=20), make_req(1, 1, output=20, arrival=0.015)
    mbs = [mb for mb in drive(s, [a, b], 40) if mb is not None]
    first = mbs[0]
    assert first.mode == EXTEND and first.stats.prefill_tokens == 300 and first.stats.pad_tokens == 320 - 300
    one = next(mb for mb in mbs if mb.mode == EXTEND and pieces(mb) == [(1, 1, 0)])
    assert one.stats.pad_tokens == 0  # bucket 4 > 2 x 1 token: eager
    assert all(mb.stats.pad_tokens == 0 for mb in mbs if mb.mode == DECODE)  # decode graphs unset here
    sc = SimpleNamespace(chunk_size_tokens=None, cuda_graphs=None, overlap=None, prefix_cache=None, engine_version=None,
                         max_running_requests=0, schedule_policy="fcfs")
    one_stage = SGLangEngine().settings(sc, Hardware("a100-sxm-80gb", 80.0, 1, 1))
    assert one_stage.prefill_capture_sizes == prefill_capture_sizes(8192) and one_stage.token_budget == 8192
    assert SGLangEngine().settings(sc, Hardware("a100-sxm-80gb", 80.0, 1, 2)).prefill_capture_sizes == ()  # PP: off
    assert SGLangEngine().settings(SimpleNamespace(**{**vars(sc), "cuda_graphs": False}),
                                   Hardware("a100-sxm-80gb", 80.0, 1, 1)).prefill_capture_sizes == ()


def test_sglang_stalled_decode_keeps_its_segment_and_its_gap_spans_the_stall():
    # a decodes tokens 2-3; b's prefill-only step (result at 0.04) stalls it; a's token 4 comes
    # at 0.05: its gap is 0.02, and a's KV held counts no slot for the stalled step
    s = SGLangScheduler(1, 100_000, 256, 1000, prefix_cache=False)
    a, b = make_req(0, 300, output=6), make_req(1, 100, output=2, arrival=0.025)
    seen = []

    def check(sched, running):
        if len(sched.slots[0].times) == 4:  # (just after the stalled step's result)
            seen.append((a.out_len, a.seg_times is not None, list(sched.slots[0].holes), a.kv_held, sched.kv_used()))

    mbs = drive(s, [a, b], 7, check=check)
    assert mbs[3].mode == EXTEND and not mbs[3].decodes
    # (no settle at the stall: the slot marks the entry, a's segment goes on across it)
    assert seen == [(3, True, [3], 302, 302 + 100)]
    assert a.finished and list(a.itls) == pytest.approx([0.01, 0.01, 0.02, 0.01, 0.01])
    assert s.kv_used() == 0
