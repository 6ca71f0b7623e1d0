"""Current SGLang's scheduler (release 0.5.23), on PipeSim's lock-step pipeline.

Read from the release wheel (sglang-0.5.23, python/sglang/srt/...):
- `managers/scheduler.py` `get_next_batch_to_run`: a step runs a prefill (EXTEND) batch when one
  can be formed, else a DECODE batch of the running requests; the running decodes do not join
  a prefill batch (`enable_mixed_chunk` is off by default), so they wait that step out;
- `managers/schedule_policy.py` `PrefillAdder` (the path taken with the radix cache on):
  `rem_total = free + evictable - sum over running of min(max_new - generated, 4096) x ratio`
  (ratio 1.0 for `ignore_eos` requests), a new request admitted iff
  `extend + min(max_new - generated, 4096) + 1 < rem_total`, reserving `extend + 1 + min(max_new,
  4096)` (no max_new while it is chunked); the batch fills `chunked_prefill_size` exactly, the
  last request cut, one chunked request at a time, continued first; `max_prefill_tokens` binds
  only without chunking; NO_TOKEN sets the sticky `batch_is_full` when someone can be served;
  the flag and the reservation are the micro-batch's: with PP each slot's running batch has
  its own (`_get_new_batch_prefill_raw` gets `running_mbs[mb_id]`), cleared when a request
  leaves it or when it is empty (then replaced by the prefill batch just run);
- `mem_cache/radix_cache.py`: a token-granular radix tree (page_size 1), prefix hits capped at
  input_len - 1, evictable leaves freed LRU on demand, each leaf whole (`RadixCache.evict`;
  sim/engine/schedulers/cached.py);
- `managers/schedule_batch.py` `retract_decode`: when a decode step does not fit, requests are
  retracted fewest-outputs first (ties: longest prompt first) until the next step fits, at
  least one kept; then `new_token_ratio = (sum generated + 20 n) / (sum max_new + 1)`;
  otherwise the ratio decays by (0.7 - 0.098) / 600 per decode step, reset only when fully idle;
- `schedule_policy` "fcfs" is the default (arrival order); "lpm" sorts the queue by longest
  cached prefix while it holds at most 128 requests (`WAITING_QUEUE_PREFIX_MATCH_MAX`);
- pipeline parallelism (`scheduler_pp_mixin.py`): pp micro-batches in flight, each with its own
  running batch capped at max_running_requests // pp; the chunked request moves through them
  (PipeSim's slots, as for FastPP).
The overlap scheduler and CUDA-graph padding are the pipeline's and the latency model's
(`EngineSettings.overlap`, `capture_sizes`); the prefill graphs' padding of an EXTEND step at
pp = 1 is here (`SGLangScheduler.pad_prefill`, `EngineSettings.prefill_capture_sizes`); the host time per step is the version's model
(sim/engine/hosttime.py: 0.53 ms a step + 5 us a request, hidden under the previous GPU step
with the overlap scheduler). Where this module departs from the source, a
NOTE says so.
"""

from __future__ import annotations

from typing import Any

from sim.engine.hosttime import host_cost
from sim.engine.schedulers import EngineSettings, Hardware, pad_to, pick_version, schedulers
from sim.engine.schedulers.cached import CachedScheduler
from sim.engine.schedulers.fastpp import (CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO,
                                          NEW_TOKEN_RATIO_DECAY, RETRACT_DECODE_STEPS)
from sim.engine.state import DECODE, EXTEND, RUNNING, MicroBatch, Req, lengths

VERSIONS = {"0.5": "SGLang 0.5.23"}  # `[scheduler] engine_version`: the release read
DEFAULT_VERSION = "0.5"
VERSION = VERSIONS[DEFAULT_VERSION]
LPM_QUEUE_MAX = 128  # schedule_policy.py WAITING_QUEUE_PREFIX_MATCH_MAX


class SGLangScheduler(CachedScheduler):
    prefill_capture_sizes: tuple[int, ...] = ()  # EngineSettings.prefill_capture_sizes; () = prefill eager

    def pad_prefill(self, mb: MicroBatch) -> MicroBatch:
        """SGLang 0.5.23's prefill ("breakable") CUDA graphs: an EXTEND step's tokens replay the
        graph of the next captured token bucket (model_executor/runner/prefill_cuda_graph_runner.py
        `can_replay_locally`, `_pad_to_bucket`); it runs eagerly, unpadded, above the largest
        bucket (`max_num_tokens`) or where the bucket is over `_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`
        (2) times its tokens. No mixed prefill+decode step here (no mixed chunk), so
        `prefer_eager_mixed_prefill` never applies."""
        sizes = self.prefill_capture_sizes
        n = mb.stats.prefill_tokens
        if sizes and 0 < n <= sizes[-1] and pad_to(sizes, n) <= PREFILL_PADDING_FACTOR * n:
            mb.stats.pad_tokens = pad_to(sizes, n) - n
        return mb

    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit", prefix_cache: bool = True, max_prefill_tokens: int = 16384,
                 ignore_eos: bool = True, policy: str = "fcfs") -> None:
        super().__init__(num_slots, kv_tokens, max_running_requests, chunk_size, on_kv_exhausted, prefix_cache, 1)
        if self.cache is not None:
            self.cache.whole_leaves = True  # radix_cache.py RadixCache.evict: whole leaves
        self.max_prefill = max_prefill_tokens
        self.ignore_eos = ignore_eos
        self.policy = policy
        # pp_max_micro_batch_size: each micro-batch's running requests are capped at max // pp
        self.max_per_slot = max(max_running_requests // num_slots, 1)
        self.reset_ratio_on_empty_batch = False  # 0.5.23 resets the ratio only when fully idle
        # `batch_is_full` is a flag of each micro-batch's running batch (`running_mbs[mb_id]` in
        # scheduler_pp_mixin.py `event_loop_pp`), not of the scheduler: one slot's NO_TOKEN does
        # not stop another slot's admission. form_batch swaps the slot's flag in and out.
        self.full = [False] * num_slots

    def form_batch(self, slot_idx: int, now_s: float, rebalance: Any = None) -> MicroBatch | None:
        self.batch_is_full = self.full[slot_idx]
        mb = super().form_batch(slot_idx, now_s, rebalance)
        self.full[slot_idx] = self.batch_is_full
        return mb

    def _retire(self, slot: Any) -> None:
        empty = not slot.running
        last = slot.last
        super()._retire(slot)
        if empty and last is not None and last.mode != DECODE:
            # get_next_batch_to_run: an empty running batch is replaced by the prefill batch
            # just run (`running_batch = last_batch`), a new ScheduleBatch whose flag is False
            self.batch_is_full = False

    def _reserved(self, slot: Any) -> float:
        """The reserved future tokens of the running requests of the micro-batch being formed
        (`PrefillAdder.__init__` sums `_get_running_request_total_token_offset` over the
        `running_batch` it is given, under PP `running_mbs[mb_id]`): from the slot's emission
        summary when it is current (fastpp.Slot.summary), else a walk."""
        ratio = 1.0 if self.ignore_eos else self.new_token_ratio
        running = slot.running
        if not running:
            return 0.0
        if running is slot.sampled and slot.summary[3] <= CLIP_MAX_NEW_TOKENS:
            return slot.summary[2] * ratio  # (finished ones have no tokens left)
        total = 0
        for r in running:
            if not r.finished:
                left = r.max_new - r.out_len
                total += left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
        return total * ratio

    def _queue(self, now_s: float) -> Any:
        if self.policy != "lpm" or self.cache is None or len(self.waiting) > LPM_QUEUE_MAX:
            return self.waiting  # (read, not changed, while the batch is formed)
        # stable: ties keep arrival order
        return sorted(self.waiting, key=lambda r: -self.lookup(r, now_s)[0])

    def _prefill_batch(self, slot: Any, now_s: float) -> MicroBatch | None:
        chunked = self.chunked
        if slot.running:
            # get_next_batch_to_run filters the running batch every step, before the prefill
            # adder: a request that finished clears the flag this step, not after a decode step
            live = self._drop_finished(slot)
            if len(live) < len(slot.running):
                slot.running = live
        if not slot.running:
            # scheduler.py `_get_new_batch_prefill_raw`: an empty running batch has no request
            # left to leave, the only event that clears the flag elsewhere, so it is cleared here
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and chunked is None:
            return None
        running_bs = len(slot.running) if slot.running else 0
        if running_bs >= self.max_per_slot and chunked is None:
            self.batch_is_full = True
            return None
        offset = self._reserved(slot)
        rem_chunk = self.chunk_size
        rem_input = self.max_prefill
        pieces: list[tuple[Req, int, int]] = []
        new_chunked: Req | None = None
        if chunked is not None:
            # add_chunked_req: no admission test, the chunk takes what the budget leaves
            remaining = chunked.fill_len - chunked.prefix_len
            room = min(rem_chunk, int(self.available() - offset))
            new = max(0, min(remaining, room))
            if new > 0:
                pieces.append((chunked, new, chunked.prefix_len))
                rem_chunk -= new
                rem_input -= new
                offset += new + 1 + (0 if new < remaining else min(chunked.max_new, CLIP_MAX_NEW_TOKENS))
            new_chunked = chunked if new < remaining else None
        admitted: list[tuple[Req, int, int, Any]] = []
        if new_chunked is None and rem_chunk > 0 and not self.batch_is_full:
            for req in self._queue(now_s):
                if running_bs + len(admitted) >= self.max_per_slot:
                    self.batch_is_full = True
                    break
                hit, path = self.lookup(req, now_s)
                extend = req.fill_len - hit
                left = req.max_new - req.out_len
                total = extend + (left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) + 1
                rem_total = self.available_with(path) - offset
                if not total < rem_total:
                    # NO_TOKEN: full only if someone can be served (`len(adder.can_run_list) > 0
                    # or not running_batch.is_empty()`), else the next step tries again
                    self.batch_is_full = bool(pieces or admitted or slot.running)
                    break
                if extend > rem_chunk:
                    extend, cut = rem_chunk, True
                else:
                    cut = False
                admitted.append((req, extend, hit, path))
                # its prefix is locked now (add_one_req's inc_lock_ref): the next request's room
                # no longer counts it as evictable
                self.admit_hit(req, hit, path, now_s)
                offset += extend + 1 + (0 if cut else min(req.max_new, CLIP_MAX_NEW_TOKENS))
                rem_chunk -= extend
                rem_input -= extend
                if cut:
                    new_chunked = req
                    self.chunk_bound = True
                    break
                if self.available() - offset <= 0:
                    self.batch_is_full = True
                    break
                if rem_chunk <= 0 or rem_input <= 0:
                    self.chunk_bound = True
                    break
        if not pieces and not admitted:
            return None
        # Allocation: the continuing chunk, then the new requests (prepare_for_extend)
        if pieces:
            req, new, _prefix = pieces[0]
            self._alloc(req, new, "prefill", now_s)
            req.prefix_len += new
            req.num_chunks += 1
            req.slot = slot.index
        for req, extend, _hit, _path in admitted:
            self.waiting.remove(req)
            req.state = RUNNING
            req.slot = slot.index
            if req.admit_s is None:
                req.admit_s = now_s
            self.num_active += 1
            self._alloc(req, extend, "prefill", now_s)
            pieces.append((req, extend, req.prefix_len))
            req.prefix_len += extend
            req.num_chunks += 1
        self.chunked = new_chunked
        self.chunk_need = max(self.chunk_need, self.chunk_size - rem_chunk + 1)
        # the slot's running requests stay out of this batch (no mixed chunk): they decode in
        # the slot's next decode step
        self.stall(slot)
        return self.pad_prefill(MicroBatch(self.num_launched, slot.index, EXTEND, pieces, [], new_chunked,
                                           self.chunk_size, decode_ctx=0, decode_left=(0, 0)))

    def _decode_batch(self, slot: Any, now_s: float) -> MicroBatch | None:
        if slot.running is None:
            return None
        live, known = self._live(slot)  # (fastpp's: from the slot's emission summary when current)
        if not live:
            self.batch_is_full = False
            slot.running = None
            slot.cycle_start_s = None
            return None
        if len(live) < len(slot.running):
            self.batch_is_full = False
        if self.available() < len(live):
            live = self._retract_until_fits(live, now_s, slot.index)
            known = None
            self.batch_is_full = False
        else:
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        if self.available() < len(live):
            if self.retract_on_kv_exhausted:
                self.kv_exhausted_events += 1
                for req in live:
                    self._requeue(req)
                self.retractions += len(live)
                self.waiting.extend(live)
                slot.running = None
                slot.cycle_start_s = None
                return None
        known = self._alloc_decode(live, "decode", now_s, known)
        slot.running = live
        return self.pad(MicroBatch(self.num_launched, slot.index, DECODE, [], live, None, self.chunk_size,
                                   decode_ctx=known[0], decode_left=known[1:]))

    def _retract_until_fits(self, live: list[Req], now_s: float = 0.0, slot: int = 0) -> list[Req]:
        """retract_decode (0.5.23): fewest outputs first (ties: longest prompt first) until the
        next decode step fits, at least one request kept; retracted ones re-queue at the tail."""
        order = sorted(live, key=lambda r: (r.out_len, -r.prompt_len), reverse=True)
        retracted = []
        first = True
        while first or self.available() < len(order):
            if len(order) == 1:
                break
            first = False
            req = order.pop()
            self._requeue(req)
            retracted.append(req)
            self.events.append((now_s, slot, req.rid, "retract"))
        self.retractions += len(retracted)
        decoded = sum(r.out_len for r in order)
        max_new = sum(r.max_new for r in order)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / (max_new + 1))
        self.waiting.extend(retracted)
        keep = set(id(r) for r in order)
        return [r for r in live if id(r) in keep]


# ---------------------------------------------------------------- the engine's defaults

# arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes (0.5.23)
def decode_capture_sizes(max_bs: int) -> tuple[int, ...]:
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    sizes = [b for b in sizes if b <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return tuple(sizes)


# model_executor/runner/prefill_cuda_graph_runner.py _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR (0.5.23)
PREFILL_PADDING_FACTOR = 2


def prefill_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """arg_groups/cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes (0.5.23): the token
    buckets up to the prefill graphs' max_bs, which memory_hook.py sets to chunked_prefill_size
    (non-MLA models; MLA caps it at 8192 and Llama-2 at 4096, not modelled)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return tuple(s for s in sizes if s <= max_tokens)


def memory_defaults(gpu_mem_gib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max batch) by GPU memory
    (arg_groups/memory_hook.py handle_gpu_memory_settings, 0.5.23; thresholds in GiB)."""
    if gpu_mem_gib < 20:
        return 2048, 8
    if gpu_mem_gib < 35:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def mem_fraction_static(gpu_mem_gib: float, chunk: int, max_bs: int, tp: int, pp: int) -> float:
    """SGLang 0.5.23's mem_fraction_static (memory_hook.py): the GPU's memory less a reserve for
    activations (1.5 MB per token of max(chunk, 2048)), the distributed runtime, decode CUDA
    graphs (2 MB per captured batch size step) and prefill graphs (8 MB per token bucket)."""
    gpu_mb = gpu_mem_gib * 1024
    buckets = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
               + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, chunk + 1, 512)))
    reserved = 512 + max(chunk, 2048) * 1.5 + tp * pp / 8 * 1024 + max_bs * 2 + len([b for b in buckets if b <= chunk]) * 8
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)


class SGLangEngine:
    name = "sglang"
    versions = VERSIONS  # `[scheduler] engine_version` keys -> the release
    kv_reduce = "min"  # the KV pool with PP: the smallest stage's (all-reduce MIN over ranks)

    def settings(self, sc: Any, hw: Hardware) -> EngineSettings:
        version = pick_version(self.name, VERSIONS, DEFAULT_VERSION, sc.engine_version)
        chunk, max_bs = memory_defaults(hw.gpu_mem_gib or 80.0, hw.tp)
        overlap = hw.pp == 1 if sc.overlap is None else bool(sc.overlap)  # PP turns overlap off
        cache = True if sc.prefix_cache is None else bool(sc.prefix_cache)
        graphs = sc.cuda_graphs if sc.cuda_graphs is not None else True
        budget = sc.chunk_size_tokens or chunk
        # prefill graphs: on by default on CUDA (cuda_graph_config.py default_prefill_backend), off
        # with PP (cuda_graph_hook.py apply_cuda_graph_compatibility)
        prefill_sizes = prefill_capture_sizes(budget) if graphs and hw.pp == 1 else ()
        return EngineSettings(
            engine="sglang", token_budget=budget, max_running=sc.max_running_requests,
            prefix_cache=cache, cuda_graphs=graphs, overlap=overlap,
            capture_sizes=decode_capture_sizes(max_bs) if graphs else (), pad_total_tokens=False,
            prefill_capture_sizes=prefill_sizes, version=VERSIONS[version],
            note=f"radix cache {'on' if cache else 'off'}, {sc.schedule_policy}, overlap {'on' if overlap else 'off'}")

    def mem_fraction(self, settings: EngineSettings, hw: Hardware) -> float:
        max_bs = settings.capture_sizes[-1] if settings.capture_sizes else 0
        return mem_fraction_static(hw.gpu_mem_gib or 80.0, settings.token_budget, max_bs, hw.tp, hw.pp)

    def build(self, settings: EngineSettings, num_slots: int, kv_tokens: int, max_running: int, chunk_size: int,
              on_kv_exhausted: str, sc: Any) -> SGLangScheduler:
        sched = SGLangScheduler(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted,
                                settings.prefix_cache, sc.max_prefill_tokens, sc.ignore_eos, sc.schedule_policy)
        sched.overlap_host = settings.overlap
        sched.capture_sizes = settings.capture_sizes
        sched.prefill_capture_sizes = settings.prefill_capture_sizes
        key = next((k for k, v in VERSIONS.items() if v == settings.version), DEFAULT_VERSION)
        sched.host_cost = host_cost(self.name, key)  # the version's host time per step (sim/engine/hosttime.py)
        return sched


schedulers.register("sglang")(SGLangEngine)

__all__ = ["SGLangScheduler", "SGLangEngine", "INIT_NEW_TOKEN_RATIO", "lengths"]
