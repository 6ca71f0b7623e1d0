"""vLLM's V1 scheduler (release 0.10.1.1), on PipeSim's lock-step pipeline.

Read from the release wheel (vllm-0.10.1.1, commit g1da94e673):
- `vllm/v1/core/sched/scheduler.py` `schedule()`: one token budget per step
  (`max_num_batched_tokens`); first the RUNNING requests in order, each its remaining tokens
  (a decode 1, a partial prefill the rest of its prompt, capped by `long_prefill_token_threshold`
  when > 0 and by the budget); an allocation failure preempts the last running request by
  recompute (its KV freed, `num_computed_tokens = 0`, to the FRONT of the waiting queue), until
  the allocation fits or the request preempts itself; then, only if nothing was preempted this
  step, the WAITING requests in FCFS order while budget remains and fewer than `max_num_seqs`
  run: prefix-cache hits cost no budget, the rest is cut to the budget (chunked prefill is
  always on), and the first request whose allocation fails stops admission;
- `vllm/v1/core/kv_cache_manager.py`, `block_pool.py`: prefix caching on by default, whole
  blocks of `block_size` tokens (16) only, a hit at most `num_tokens - 1` tokens (so a fully
  cached, block-aligned prompt recomputes its last block); freed blocks go to an LRU queue,
  tail blocks first, and stay hittable until reused; `allocate_slots` caches every block that
  the step's scheduled tokens fill (`cache_blocks(request, num_computed + num_new)`), so a
  prompt's full blocks are hittable from the step that schedules them, not from its first
  token; a preempted request's blocks (prompt and output alike, hashed as they filled) stay
  cached when freed, and its re-admission hits what survives (`_preempt`);
- `vllm/v1/engine/core.py` `step_with_batch_queue`: with pipeline parallelism `pp_size` batches
  are in flight and a request in flight is not scheduled again until its output is back (the
  next chunk of a partial prefill may be): PipeSim's lock-step slots, a request's decodes
  staying with the slot of its last prefill chunk (the "cohorts" the queue produces).
NOTEs below mark where this module simplifies. KV is whole blocks with the null block taken
(`pool_tokens`, `BlockScheduler`: allocations fit by free blocks, each request charged its
unfilled last block); a preemption victim is taken among the requests of the slot
being scheduled (one in flight in another slot holds KV the GPU is using); a partial prefill
that finds no room waits rather than preempting a newer request; `max_num_batched_tokens >=
max_num_seqs` (vLLM's own validation) lets every decode of a step fit the budget. Several
prompts may be partly prefilled at once (a `long_prefill_token_threshold` cut leaves the rest
of the budget to the next waiting request, as in vLLM); `max_num_partial_prefills` is V0's knob
(0.10.1.1's V1 refuses any value but 1) and is not modelled.
"""

from __future__ import annotations

from typing import Any

from sim.engine.hosttime import host_cost
from sim.engine.schedulers import EngineSettings, Hardware, pick_version, schedulers
from sim.engine.schedulers.cached import BlockScheduler
from sim.engine.schedulers.fastpp import Slot
from sim.engine.state import DECODE, EXTEND, MIXED, RUNNING, WAITING, MicroBatch, Req
from sim.workloads.base import output_piece, prompt_piece

# The releases whose defaults are modelled (`[scheduler] engine_version`); the scheduler is the one
# read from 0.10.1.1 in each. What differs, from each wheel (vllm-X/...):
# - `config/scheduler.py` `SchedulerConfig.async_scheduling`: False in 0.10.1.1 and 0.11.0; None in
#   0.15.1, which `config/vllm.py` `VllmConfig.__post_init__` turns on for the mp/uni executors
#   (the default) unless speculative decoding forbids it: the CPU's scheduling of step k + 1 runs
#   under step k's GPU work (PipeSim: `EngineSettings.overlap`, the pipeline's host-time overlap);
# - CUDA-graph sizes: 0.10.1.1 / 0.11.0 `config/__init__.py` `_set_cudagraph_sizes`: [1, 2, 4] +
#   multiples of 8 up to min(2 max_num_seqs, 512); 0.15.1 `config/vllm.py` `_set_cudagraph_sizes`:
#   [1, 2, 4] + multiples of 8 below 256 + multiples of 16 from 256 up to min(2 max_num_seqs, 512,
#   max_num_batched_tokens);
# - the same in all three: `engine/arg_utils.py` max_num_batched_tokens 8192 / max_num_seqs 1024
#   (>= 70 GiB, not A100) else 2048 / 256 (`vllm serve`), `config/cache.py`
#   gpu_memory_utilization 0.9, prefix caching and chunked prefill on.
VERSIONS = {"0.10": "vLLM 0.10.1.1 (V1)", "0.11": "vLLM 0.11.0 (V1)", "0.15": "vLLM 0.15.1 (V1)"}
DEFAULT_VERSION = "0.10"
ASYNC_SCHEDULING = {"0.10": False, "0.11": False, "0.15": True}
VERSION = VERSIONS[DEFAULT_VERSION]


def capture_sizes(version: str, max_seqs: int, budget: int) -> tuple[int, ...]:
    """The decode CUDA-graph sizes of `version` (VERSIONS' comment), at most the token budget."""
    top = min(2 * max_seqs, 512)
    if version == "0.15":
        top = min(top, budget)
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    else:
        sizes = [1, 2, 4] + list(range(8, top + 1, 8))
    return tuple(s for s in sizes if s <= min(top, budget))


class VllmV1Scheduler(BlockScheduler):
    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit", prefix_cache: bool = True, block_size: int = 16,
                 long_prefill_threshold: int = 0) -> None:
        super().__init__(num_slots, kv_tokens, max_running_requests, chunk_size, on_kv_exhausted, prefix_cache,
                         block_size)
        self.threshold = long_prefill_threshold
        self.preemptions = 0
        self.reset_ratio_on_empty_batch = False  # (vLLM has no token ratio)
        self.partials: list[Req] = []  # running requests whose prompt is not all computed yet

    def _pieces(self, req: Req) -> Any:
        """The pieces naming `req`'s fill: its prompt's, and after a preemption its output's
        (the blocks it hashed as they filled; block hashes chain over prompt and output)."""
        pieces = req.pieces
        if pieces and req.fill_len > req.prompt_len and sum(n for _p, n in pieces) >= req.prompt_len:
            return tuple(pieces) + ((output_piece(req.rid), req.fill_len - req.prompt_len),)
        return pieces

    def lookup(self, req: Req, now_s: float) -> tuple[int, Any]:
        cache = self.cache
        if cache is None or not req.pieces:
            return 0, None
        hit, path = cache.match(self._pieces(req), self.hit_limit(req), now_s)
        return hit - hit % self.granularity, path

    def _cache_scheduled(self, req: Req, now_s: float) -> None:
        """allocate_slots -> cache_blocks: the prompt's blocks filled by the tokens scheduled so
        far become cached (hittable by the next request) as soon as they are scheduled."""
        if self.cache is not None and req.pieces and req.prefix_len >= self.granularity:
            done = min(req.prefix_len, req.fill_len)
            if done - done % self.granularity > req.tree_tokens:
                self._to_cache(req, done, self._pieces(req), now_s)

    def _preempt(self, req: Req, now_s: float = 0.0) -> None:
        """Recompute preemption: KV freed, back to the head of the waiting queue. The blocks it
        filled stay cached (`KVCacheManager.free` returns them to the free queue still hashed):
        its computed tokens (prompt and outputs but the last sampled one) enter the cache first,
        under a piece of its own when the workload gave its prompt none."""
        self.events.append((now_s, req.slot, req.rid, "preempt"))
        if self.cache is not None:
            if not req.pieces:
                req.pieces = ((prompt_piece(req.rid), req.prompt_len),)
            if req.prefix_len >= req.fill_len:  # its prompt (and earlier outputs) computed
                computed = req.prompt_len + max(req.out_len - 1, 0)
                pieces = (tuple(req.pieces) + ((output_piece(req.rid), req.out_len),)
                          if sum(n for _p, n in req.pieces) >= req.prompt_len else req.pieces)
            else:
                computed, pieces = req.prefix_len, self._pieces(req)
            if computed - computed % self.granularity > req.tree_tokens:
                self._to_cache(req, computed, pieces, now_s)
        self._requeue(req)
        self.waiting.appendleft(req)
        self.retractions += 1
        self.preemptions += 1

    def form_batch(self, slot_idx: int, now_s: float, rebalance=None) -> MicroBatch | None:
        slot = self.slots[slot_idx]
        self._retire(slot)
        budget = self.chunk_size
        decodes: list[Req] = []
        preempted = False
        # (1) the running requests of this slot: the decodes, in admission order
        known: tuple[int, int, int] | None = None  # the decodes' (context, tokens left, most left)
        if slot.running:
            # one walk: the live requests, the new blocks their tokens need (`decode_blocks`) and
            # the batch's decode sums (state.lengths)
            b = self.block
            queue: list[Req] = []
            need = ctx = total = top = 0
            for r in slot.running:
                if not r.finished:
                    queue.append(r)
                    if r.block_tokens % b == 0:
                        need += 1
                    out = r.out_len
                    ctx += r.prompt_len + out
                    left = r.max_new - out
                    total += left
                    if left > top:
                        top = left
            known = (ctx, total, top)
            # one token each; while they do not all fit, the last one is preempted (it may be
            # the request being scheduled itself, which then stops the loop in vLLM: the same set)
            while queue and need > self.free_blocks():
                victim = queue.pop()  # NOTE: among this slot's requests (module docstring)
                if victim.block_tokens % b == 0:
                    need -= 1
                self._preempt(victim, now_s)
                preempted = True
                known = None
            if queue:
                self._make_room(len(queue))
                self.kv_free -= len(queue)  # (each request's count settles when its token is back)
                self._grow_decodes(queue, need)  # its blocks: a new one when its last was full
            decodes = queue
            budget -= len(queue)
            slot.running = decodes if decodes else None
            slot.sampled = None
        prefill: list[tuple[Req, int, int]] = []
        partials: list[Req] = []  # the prompts still partly prefilled after this step
        # the running partial prefills, in admission order: their next chunks
        for req in self.partials:
            remaining = req.fill_len - req.prefix_len
            new = min(remaining, budget, self.threshold or remaining)
            if new <= 0 or self.blocks_for(req, new) > self.free_blocks():
                partials.append(req)  # it waits for room (vLLM would preempt a newer request)
                continue
            self._alloc(req, new, "prefill", now_s)
            prefill.append((req, new, req.prefix_len))
            req.prefix_len += new
            req.num_chunks += 1
            req.slot = slot_idx
            self._cache_scheduled(req, now_s)
            budget -= new
            if new < remaining:
                partials.append(req)
        # (2) the waiting requests, FCFS, only if nothing was preempted this step; a prompt cut by
        # `long_prefill_token_threshold` leaves the rest of the budget to the next one
        if not preempted:
            while self.waiting and budget > 0 and self.num_active < self.max_running:
                req = self.waiting[0]
                hit, path = self.lookup(req, now_s)
                remaining = req.fill_len - hit
                new = min(remaining, budget, self.threshold or remaining)
                verdict = self._admission(req, hit, path, new, now_s)
                if verdict == "ignored":
                    continue  # dropped from the queue (vLLM V0's FINISHED_IGNORED)
                if verdict == "later":
                    break  # head-of-line: admission stops at the first request that does not fit
                self.waiting.popleft()
                self.admit_hit(req, hit, path, now_s)
                req.state = RUNNING
                req.slot = slot_idx
                if req.admit_s is None:
                    req.admit_s = now_s
                self.num_active += 1
                self._alloc(req, new, "prefill", now_s)
                prefill.append((req, new, req.prefix_len))
                req.prefix_len += new
                req.num_chunks += 1
                self._cache_scheduled(req, now_s)
                budget -= new
                if new < remaining:
                    partials.append(req)
                    self.chunk_bound = True
        self.partials = partials
        self.chunked = partials[0] if partials else None
        # (the batch names its first cut piece; process_result drops every cut piece)
        new_chunked = next((p[0] for p in prefill if p[2] + p[1] < p[0].fill_len), None)
        slot.last = None
        if not prefill and not decodes:
            slot.running = None
            return None
        self.chunk_need = max(self.chunk_need, self.chunk_size - budget + 1)
        mode = MIXED if prefill and decodes else EXTEND if prefill else DECODE
        if mode != DECODE:
            slot.running = None  # the decodes are in flight with the prefill pieces
        if known is None or not decodes:
            known = None  # (summed by MicroBatch)
        mb = MicroBatch(self.num_launched, slot_idx, mode, prefill, decodes, new_chunked, self.chunk_size,
                        decode_ctx=known[0] if known is not None else None,
                        decode_left=known[1:] if known is not None else None)
        self.pad(mb)
        slot.last = mb
        self.num_launched += 1
        return mb

    def _admission(self, req: Req, hit: int, path: Any, new: int, now_s: float) -> str:
        """Whether the head of the waiting queue is admitted with `new` tokens this step: "admit",
        or "later" (its allocation fails: admission stops). vLLM V0's chunked prefill (vllm_v0.py)
        adds its watermark and "ignored"."""
        return "later" if self.blocks_for(req, new) > self.free_blocks(path) else "admit"

    def _hide_cuts(self, mb: MicroBatch) -> tuple[list[tuple[Req, int, int]], Req | None] | None:
        """With several partial prefills a step can cut more than one prompt; the scheduler
        core knows one (`mb.chunked`). The others are hidden from it while it reads the batch:
        a cut piece samples no token and does not join the slot's running list."""
        full = mb.prefill
        kept = [p for p in full if p[2] + p[1] >= p[0].fill_len]
        if len(full) - len(kept) < 2:
            return None
        chunked = mb.chunked
        mb.prefill = kept
        mb.chunked = None
        return full, chunked

    def process_result(self, mb: MicroBatch, now_s: float) -> None:
        hidden = self._hide_cuts(mb)
        super().process_result(mb, now_s)
        if hidden is not None:
            mb.prefill, mb.chunked = hidden

    def _retire(self, slot: Slot) -> None:
        last = slot.last
        hidden = self._hide_cuts(last) if last is not None and last.mode != DECODE else None
        super()._retire(slot)
        if hidden is not None and last is not None:
            last.prefill, last.chunked = hidden

    def is_idle(self) -> bool:
        return self.num_active == 0 and not self.waiting and not self.partials


def activation_reserve_tokens(settings: EngineSettings, latency: Any, tp: int, pp: int) -> int:
    """KV tokens vLLM does not get because its profiling run's peak activations take the memory
    (`gpu_worker.determine_available_memory`: available = utilisation x total - (weights + peak
    activations + non-torch memory)). The peak is estimated from the model's shapes for one
    step of `max_num_batched_tokens` tokens: per token the MLP's gate/up output, its activation
    output and four hidden-size buffers (2 x (3 x intermediate / tp + 4 x hidden) bytes in
    BF16), plus the sampler's FP32 logits of `min(tokens, max_num_seqs)` rows. NOTE: vLLM's
    non-torch memory (CUDA context, NCCL and cuBLAS workspaces, a few hundred MB in its logs) is
    not counted, nor what PipeSim's memory model already leaves outside the pool (profiled.py)."""
    profile = getattr(latency, "profile", None)
    if profile is None:
        return 0
    shape = profile.shape()
    if not shape.intermediate_size:
        return 0
    tokens = settings.token_budget
    act = tokens * 2 * (3 * shape.intermediate_size / tp + 4 * shape.hidden_size)
    logits = min(tokens, settings.max_running) * shape.vocab_size * 4
    layers = -(-shape.num_layers // pp)  # the busiest stage's layers
    cell = max(1, shape.num_kv_heads // tp) * shape.head_dim * layers * 2 * shape.kv_bytes
    return int((act + logits) // cell)


class VllmV1Engine:
    name = "vllm-v1"
    versions = VERSIONS  # `[scheduler] engine_version` keys -> the release
    kv_reduce = "min"  # the KV pool with PP: the smallest stage's (all-reduce MIN over ranks)

    def kv_reserved_tokens(self, settings: EngineSettings, latency: Any, hw: Hardware) -> int:
        return activation_reserve_tokens(settings, latency, hw.tp, hw.pp)

    def pool_tokens(self, kv_tokens: int, sc: Any) -> int:
        """The tokens requests can hold: whole blocks (`num_gpu_blocks`), less the null block
        (`block_pool.py` `BlockPool.__init__`: `null_block = free_block_queue.popleft()`, block 0,
        never given to a request)."""
        return (kv_tokens // sc.block_size_tokens - 1) * sc.block_size_tokens

    def settings(self, sc: Any, hw: Hardware) -> EngineSettings:
        version = pick_version(self.name, VERSIONS, DEFAULT_VERSION, sc.engine_version)
        # EngineArgs._set_default_args_v1 (vllm serve, the OpenAI API server's usage context)
        big = hw.gpu_mem_gib >= 70 and "a100" not in hw.gpu_spec
        budget = sc.chunk_size_tokens or (8192 if big else 2048)
        max_seqs = sc.max_running_requests or min(1024 if big else 256, budget)
        cache = True if sc.prefix_cache is None else bool(sc.prefix_cache)
        graphs = sc.cuda_graphs if sc.cuda_graphs is not None else True
        # VllmConfig._set_cudagraph_sizes (`capture_sizes`); piecewise graphs pad the step's total tokens
        sizes = capture_sizes(version, max_seqs, budget) if graphs else ()
        overlap = ASYNC_SCHEDULING[version] if sc.overlap is None else bool(sc.overlap)
        return EngineSettings(engine="vllm-v1", token_budget=budget, max_running=max_seqs, prefix_cache=cache,
                              cuda_graphs=graphs, overlap=overlap, capture_sizes=sizes, pad_total_tokens=True,
                              version=VERSIONS[version],
                              note=f"max_num_batched_tokens {budget}, max_num_seqs {max_seqs}, prefix caching "
                                   f"{'on' if cache else 'off'}, async scheduling {'on' if overlap else 'off'}")

    def build(self, settings: EngineSettings, num_slots: int, kv_tokens: int, max_running: int, chunk_size: int,
              on_kv_exhausted: str, sc: Any) -> VllmV1Scheduler:
        sched = VllmV1Scheduler(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted, settings.prefix_cache,
                                sc.block_size_tokens, sc.long_prefill_token_threshold)
        sched.capture_sizes = settings.capture_sizes
        sched.pad_total = True
        sched.overlap_host = settings.overlap  # async scheduling: host time under the GPU step
        key = next((k for k, v in VERSIONS.items() if v == settings.version), DEFAULT_VERSION)
        cost = host_cost(self.name, key)  # the version's host time per step (sim/engine/hosttime.py)
        sched.host_cost = cost.with_block_size(sc.block_size_tokens) if cost is not None else None
        return sched


schedulers.register("vllm-v1")(VllmV1Engine)

__all__ = ["WAITING", "VllmV1Engine", "VllmV1Scheduler"]
