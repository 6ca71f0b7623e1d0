"""vLLM's V0 scheduler (release 0.6.3.post1), for replaying older logs: chunked prefill off, and
on where vLLM turns it on by default (contexts above 32K).

Read from the release wheel (vllm-0.6.3.post1, `vllm/core/scheduler.py` `_schedule_default`,
`vllm/core/block_manager.py`):
- a step is either all prefills or all decodes, never both: when waiting prompts fit, the step
  runs their whole prompts (FCFS, up to `max_num_batched_tokens` = max(max_model_len, 2048)
  tokens and `max_num_seqs` = 256 sequences, stopping at the first that does not fit) and every
  running decode stalls for that step; otherwise it decodes every running request;
- a prompt is admitted only if its blocks leave the 1% watermark free (`watermark = 0.01` of
  the GPU blocks: `free - needed >= watermark`); prefix caching is off by default;
- when a decode step does not fit, the last running request (the newest) is preempted by
  recompute: its KV freed, back to the FRONT of the waiting queue, re-prefilled later as prompt
  plus the tokens it had generated.
- `worker/model_runner.py` `_use_captured_graph`: a decode batch replays a CUDA graph (padded
  to a captured size) only while its longest sequence is at most `max_seq_len_to_capture`
  (8192, `engine/arg_utils.py`); beyond that it runs eagerly, unpadded;
- `engine/arg_utils.py` `EngineArgs.create_engine_config`: with max_model_len > 32768
  (`use_long_context`) and `enable_chunked_prefill` unset, chunked prefill is turned on (on a
  GPU, without sliding window, speculative decoding, LoRA or multimodal inputs: the modelled
  case), and `config.py` `SchedulerConfig.__init__` then defaults `max_num_batched_tokens` to
  512 (`_verify_args`: >= max_num_seqs). `core/scheduler.py` `_schedule_chunked_prefill`
  (`VllmV0ChunkedScheduler`): one token budget, the running requests first (decodes, then the
  running prefills' next chunks), then new prompts FCFS cut to the rest of the budget, each
  admitted under `can_allocate`'s watermark (NEVER: ignored); the prompt limit is max_model_len.
  Decode and prefill share a step; only a decode-only step replays a CUDA graph
  (`_use_captured_graph`: `decode_only`), a mixed or prefill step runs eagerly. NOTE: V0
  allocates a prompt's blocks whole at admission (`_allocate_and_set_running`), PipeSim chunk
  by chunk (the watermark test is on the whole prompt, as vLLM's); and after a preemption V0
  still admits the waiting requests behind the victim that step, PipeSim none (V1's rule).
NOTE: KV is whole blocks (`pool_tokens`, `BlockScheduler`); pipeline parallelism in V0 runs one
scheduler per virtual engine with 1/pp of the blocks, which PipeSim does not model (pp = 1 only).
- `core/scheduler.py` `_schedule_prefills`: a waiting request longer than the prompt limit
  (`_get_prompt_limit`: min(max_model_len, max_num_batched_tokens)), or one whose whole sequence
  can never fit the pool (`core/block_manager_v2.py` `BlockSpaceManagerV2.can_allocate` ->
  `AllocStatus.NEVER`: more blocks than the pool less the watermark), is marked
  FINISHED_IGNORED and dropped from the queue: it finishes with the tokens it has (none for a
  new prompt; a recompute-preempted one keeps what it streamed), finish reason "length". Here
  its state is `ignored` (requests.csv status `ignored`, summary.json `num_ignored`), out of every
  latency and throughput metric. NOTE: vLLM's `benchmark_serving.py` would count such a request
  as a success (HTTP 200, a `[DONE]`), with TTFT 0 (no chunk has text) and no output tokens.
"""

from __future__ import annotations

from typing import Any, Final

from sim.core.errors import ConfigError
from sim.engine.schedulers import EngineSettings, Hardware, pick_version, schedulers
from sim.engine.schedulers.cached import BlockScheduler
from sim.engine.schedulers.vllm_v1 import VllmV1Scheduler
from sim.engine.state import DECODE, EXTEND, IGNORED, RUNNING, MicroBatch, Req

VERSIONS = {"0.6": "vLLM 0.6.3.post1 (V0, chunked prefill off)"}  # `[scheduler] engine_version`
CHUNKED_VERSIONS = {"0.6": "vLLM 0.6.3.post1 (V0, chunked prefill on: max_model_len > 32768)"}  # the run's label
DEFAULT_VERSION = "0.6"
VERSION = VERSIONS[DEFAULT_VERSION]
WATERMARK = 0.01  # block_manager watermark, a share of the GPU blocks
MAX_SEQ_LEN_TO_CAPTURE: Final = 8192  # engine/arg_utils.py EngineArgs.max_seq_len_to_capture
LONG_CONTEXT_TOKENS = 32768  # engine/arg_utils.py: above it chunked prefill is on by default
CHUNKED_BUDGET_TOKENS = 512  # config.py SchedulerConfig: max_num_batched_tokens with chunked prefill


def release_label(key: str, sc: Any) -> str:
    """The release and its mode, as the run header and summary.json name it."""
    return (CHUNKED_VERSIONS if sc.context_length_tokens > LONG_CONTEXT_TOKENS else VERSIONS)[key]


def runs_eagerly(mb: MicroBatch) -> bool:
    """model_runner.py `_use_captured_graph`: a decode-only batch replays a CUDA graph only while
    its longest sequence is at most max_seq_len_to_capture; otherwise the step runs eagerly."""
    if mb.mode != DECODE:
        return False
    for r in mb.decodes:  # (a loop that stops at the first: a generator and max() cost ~300 ns a request)
        if r.prompt_len + r.out_len > MAX_SEQ_LEN_TO_CAPTURE:
            return True
    return False


def never_fits(total_blocks: int, watermark_blocks: int, block: int, req: Req) -> bool:
    """`BlockSpaceManagerV2.can_allocate` returns NEVER (block_manager_v2.py, 0.6.3): its whole
    sequence (prompt, and after a preemption the tokens it had generated) needs more blocks
    than the pool less the watermark, `num_total_gpu_blocks - num_required_blocks <
    watermark_blocks`, however empty the pool."""
    return total_blocks - -(-req.fill_len // block) < watermark_blocks


def ignore(sched: Any, req: Req, now_s: float) -> None:
    """FINISHED_IGNORED (`_schedule_prefills`): out of the waiting queue, finished with the
    tokens it has (none for a new prompt), finish reason "length"; the client gets its
    final chunk then (`llm_engine.py` `_process_model_outputs` returns the ignored groups'
    outputs with the step's). A preempted request holds no KV (freed at its preemption)."""
    sched.waiting.popleft()
    sched.events.append((now_s, req.slot, req.rid, "ignored"))
    req.state = IGNORED
    req.finish_s = now_s
    sched.num_ignored += 1
    if sched.on_finish is not None:
        sched.on_finish(req)


class VllmV0ChunkedScheduler(VllmV1Scheduler):
    """`_schedule_chunked_prefill` (module docstring): V1's token-budget step without prefix
    caching, with V0's admission (`_admission`) and V0's CUDA graphs (`pad`)."""

    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit", block_size: int = 16) -> None:
        super().__init__(num_slots, kv_tokens, max_running_requests, chunk_size, on_kv_exhausted, False, block_size)
        self.total_blocks = kv_tokens // block_size
        self.watermark_blocks = int(WATERMARK * self.total_blocks)
        self.num_ignored = 0

    def _admission(self, req: Req, hit: int, path: Any, new: int, now_s: float) -> str:
        # `_schedule_prefills(enable_chunking=True)`: can_allocate on the whole sequence (NEVER:
        # ignored; LATER: stop), then the chunk's own blocks
        if never_fits(self.total_blocks, self.watermark_blocks, self.block, req):
            ignore(self, req, now_s)
            return "ignored"
        if self.free_blocks(path) - self.blocks_for(req, req.fill_len - hit) < self.watermark_blocks:
            return "later"
        return super()._admission(req, hit, path, new, now_s)

    def pad(self, mb: MicroBatch | None) -> MicroBatch | None:
        if mb is not None and runs_eagerly(mb):
            return mb  # (a mixed or prefill step is never padded: pad_total is off)
        return super().pad(mb)


class VllmV0Scheduler(BlockScheduler):
    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit", prefix_cache: bool = False, block_size: int = 16) -> None:
        super().__init__(num_slots, kv_tokens, max_running_requests, chunk_size, on_kv_exhausted, prefix_cache,
                         block_size)
        self.total_blocks = kv_tokens // block_size
        self.watermark_blocks = int(WATERMARK * self.total_blocks)
        # `_get_prompt_limit` (chunked prefill off): min(max_model_len, max_num_batched_tokens);
        # PipeSim's prompts are cut to the context already (sim/engine/requests.py), so the budget
        # is the only term left (`settings` keeps it >= the context length: it never binds there)
        self.prompt_limit = chunk_size
        self.num_ignored = 0  # requests finished as FINISHED_IGNORED (`_ignore`)
        self.preemptions = 0
        self.reset_ratio_on_empty_batch = False

    def form_batch(self, slot_idx: int, now_s: float, rebalance=None) -> MicroBatch | None:
        slot = self.slots[slot_idx]
        self._retire(slot)
        mb = self._prefills(slot, now_s)
        if mb is None:
            mb = self._decodes(slot, now_s)
        slot.last = mb
        if mb is not None:
            self.num_launched += 1
            if runs_eagerly(mb):
                return mb
        return self.pad(mb)

    def _prefills(self, slot: Any, now_s: float) -> MicroBatch | None:
        # scheduler.py `_schedule_prefills`, its order of tests: the prompt limit, then
        # `can_allocate` (NEVER: ignored; LATER: stop), then the budget (tokens, sequences)
        budget = self.chunk_size
        pieces: list[tuple[Req, int, int]] = []
        while self.waiting:
            req = self.waiting[0]
            hit, path = self.lookup(req, now_s)
            need = req.fill_len - hit
            if need > self.prompt_limit or never_fits(self.total_blocks, self.watermark_blocks, self.block, req):
                ignore(self, req, now_s)
                continue
            if self.free_blocks(path) - self.blocks_for(req, need) < self.watermark_blocks:
                break  # AllocStatus.LATER
            if need > budget or self.num_active >= self.max_running:
                break  # budget.can_schedule
            self.waiting.popleft()
            self.admit_hit(req, hit, path, now_s)
            req.state = RUNNING
            req.slot = slot.index
            if req.admit_s is None:
                req.admit_s = now_s
            self.num_active += 1
            self._alloc(req, need, "prefill", now_s)
            pieces.append((req, need, req.prefix_len))
            req.prefix_len += need
            req.num_chunks += 1
            budget -= need
        if not pieces:
            return None
        self.stall(slot)  # the running decodes wait this prefill step out
        return MicroBatch(self.num_launched, slot.index, EXTEND, pieces, [], None, self.chunk_size,
                          decode_ctx=0, decode_left=(0, 0))

    def _decodes(self, slot: Any, now_s: float) -> MicroBatch | None:
        if not slot.running:
            slot.running = None
            return None
        queue = [r for r in slot.running if not r.finished]
        need = self.decode_blocks(queue)  # (kept as the queue shrinks: a victim's own block leaves)
        while queue and self.free_blocks() < need:  # can_append_slots
            victim = queue.pop()  # the newest running request, by recompute
            if victim.block_tokens % self.block == 0:
                need -= 1
            self.events.append((now_s, slot.index, victim.rid, "preempt"))
            self._requeue(victim)
            self.waiting.appendleft(victim)
            self.retractions += 1
            self.preemptions += 1
        if not queue:
            slot.running = None
            slot.cycle_start_s = None
            return None
        known = self._alloc_decode(queue, "decode", now_s, None, need)
        slot.running = queue
        slot.sampled = None
        return MicroBatch(self.num_launched, slot.index, DECODE, [], queue, None, self.chunk_size,
                          decode_ctx=known[0], decode_left=known[1:])


class VllmV0Engine:
    name = "vllm-v0"
    versions = VERSIONS  # `[scheduler] engine_version` keys -> the release
    kv_reduce = "min"  # the KV pool with PP: the smallest stage's (all-reduce MIN over ranks)

    def kv_reserved_tokens(self, settings: EngineSettings, latency: Any, hw: Hardware) -> int:
        # worker.determine_num_available_blocks (0.6.3): the same profiling run's peak
        from sim.engine.schedulers.vllm_v1 import activation_reserve_tokens

        return activation_reserve_tokens(settings, latency, hw.tp, hw.pp)

    def pool_tokens(self, kv_tokens: int, sc: Any) -> int:
        """Whole blocks (`worker.determine_num_available_blocks`), and no null block: V0's stands only
        for blocks outside a sliding window (`core/block/block_table.py` `allocate_or_get_null_block`
        via `_get_all_token_ids` of a windowed table), which the modelled models have not."""
        return kv_tokens // sc.block_size_tokens * sc.block_size_tokens

    def settings(self, sc: Any, hw: Hardware) -> EngineSettings:
        version = pick_version(self.name, VERSIONS, DEFAULT_VERSION, sc.engine_version)
        if hw.pp > 1:
            raise ConfigError(f"config [scheduler] engine = 'vllm-v0' with [parallel] pp = {hw.pp}: V0's pipeline "
                              f"parallelism (one scheduler per virtual engine) is not modelled; allowed: pp = 1")
        if sc.prefix_cache:
            raise ConfigError("config [scheduler] prefix_cache = true with engine 'vllm-v0': V0's automatic prefix "
                              "caching is not modelled (it is off by default in V0); allowed: false")
        max_seqs = sc.max_running_requests or 256
        graphs = sc.cuda_graphs if sc.cuda_graphs is not None else True
        # worker/model_runner.py: decode-only batches padded to [1, 2, 4] + multiples of 8 up to 256
        sizes = tuple([1, 2, 4] + list(range(8, 257, 8))) if graphs else ()
        if sc.context_length_tokens > LONG_CONTEXT_TOKENS:
            # arg_utils.py create_engine_config: chunked prefill on; config.py SchedulerConfig: 512
            budget = sc.chunk_size_tokens or CHUNKED_BUDGET_TOKENS
            if budget < max_seqs:  # SchedulerConfig._verify_args refuses to start
                raise ConfigError(f"config [scheduler] chunk_size_tokens = {budget} with engine 'vllm-v0' and "
                                  f"chunked prefill (context_length_tokens > {LONG_CONTEXT_TOKENS}): the budget "
                                  f"(max_num_batched_tokens) must be >= max_running_requests (max_num_seqs, "
                                  f"{max_seqs}); allowed: 0 (the default, {CHUNKED_BUDGET_TOKENS}) or >= {max_seqs}")
            return EngineSettings(engine="vllm-v0", token_budget=budget, max_running=max_seqs, prefix_cache=False,
                                  cuda_graphs=graphs, overlap=False, capture_sizes=sizes, pad_total_tokens=False,
                                  version=release_label(version, sc),
                                  note=f"chunked prefill on (max_model_len > {LONG_CONTEXT_TOKENS}), "
                                       f"max_num_batched_tokens {budget}, max_num_seqs {max_seqs}")
        # SchedulerConfig (0.6.3): without chunked prefill, max(max_model_len, 2048)
        budget = sc.chunk_size_tokens or max(sc.context_length_tokens, 2048)
        if budget < sc.context_length_tokens:
            # vLLM refuses to start so (SchedulerConfig._verify_args): a prompt could never run
            raise ConfigError(f"config [scheduler] chunk_size_tokens = {budget} with engine 'vllm-v0': without chunked "
                              f"prefill the budget (max_num_batched_tokens) must be >= the context length "
                              f"({sc.context_length_tokens}); allowed: 0 (the default) or >= {sc.context_length_tokens}")
        return EngineSettings(engine="vllm-v0", token_budget=budget, max_running=max_seqs, prefix_cache=False,
                              cuda_graphs=graphs, overlap=False, capture_sizes=sizes, pad_total_tokens=False,
                              version=VERSIONS[version], note=f"chunked prefill off, max_num_batched_tokens {budget}, "
                                                    f"max_num_seqs {max_seqs}")

    def build(self, settings: EngineSettings, num_slots: int, kv_tokens: int, max_running: int, chunk_size: int,
              on_kv_exhausted: str, sc: Any) -> VllmV0Scheduler | VllmV0ChunkedScheduler:
        if sc.context_length_tokens > LONG_CONTEXT_TOKENS:  # chunked prefill on (settings)
            chunked = VllmV0ChunkedScheduler(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted,
                                             sc.block_size_tokens)
            chunked.capture_sizes = settings.capture_sizes
            return chunked
        sched = VllmV0Scheduler(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted, False,
                                sc.block_size_tokens)
        sched.capture_sizes = settings.capture_sizes
        return sched


schedulers.register("vllm-v0")(VllmV0Engine)
