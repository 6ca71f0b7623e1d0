"""KV accounting with a prefix cache, shared by the engines that have one (sglang, vllm-v1).

The FastPP scheduler (fastpp.py) counts the KV pool in tokens: `kv_free`, and each request's
own tokens (`Req.kv_base` plus its open decode segment). With a prefix cache
(sim/engine/prefix_cache.py) some tokens belong to the cache instead, shared by every request
whose prompt starts with them, and the pool splits three ways, an invariant the tests check:

    kv_free + sum of running requests' own tokens + cache.size == kv_capacity

- Admission looks the request's pieces up (`lookup`): the hit is locked (pinned, never evicted
  while the request runs), counts as already computed (`prefix_len`) and costs neither prefill
  compute nor new KV.
- When its prefill completes, the prompt enters the cache (SGLang checkpoints the prompt after
  prefill; vLLM caches each full block when it is scheduled, a step earlier: the difference is
  one step's visibility to concurrent requests); the request's own copy of those tokens becomes
  the cache's (a duplicate of tokens another request cached meanwhile is freed).
- When it finishes, prompt and output (all but the last sampled token, whose KV was never
  computed) enter the cache and its locks are released: the tokens stay, evictable.
- A retracted or preempted request frees its own tokens and releases its locks; its cached
  prompt stays evictable, so its re-admission may hit it.
- An allocation that does not fit `kv_free` evicts (least recently used, unpinned leaves) first:
  evictable tokens count as available, as both engines count them.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from sim.engine.prefix_cache import PrefixCache
from sim.engine.schedulers.fastpp import Scheduler
from sim.engine.state import MicroBatch, Req
from sim.workloads.base import output_piece


class CachedScheduler(Scheduler):
    """The FastPP scheduler's KV pool with a prefix cache (module docstring). Engines subclass
    it and set `hit_granularity` (1 token, or vLLM's block) and their admission rules."""

    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit", prefix_cache: bool = True, granularity: int = 1) -> None:
        super().__init__(num_slots, kv_tokens, max_running_requests, chunk_size, on_kv_exhausted)
        self.cache: PrefixCache | None = PrefixCache(granularity) if prefix_cache else None
        self.granularity = granularity
        self.capture_sizes: tuple[int, ...] = ()  # CUDA-graph sizes (EngineSettings); () = eager
        self.pad_total = False  # vLLM V1 pads the step's tokens; SGLang and V0 a decode batch's rows
        self.hit_tokens = 0  # tokens found cached at first admissions (prefix_hit_rate's numerator)
        self.saved_tokens = 0  # prefill tokens skipped at every admission (re-admissions too)
        self.admitted_prompt_tokens = 0  # prompt tokens of first admissions (the rate's denominator)
        self.evicted_tokens = 0
        self.events: list[tuple[float, int, int, str]] = []  # (time_s, slot, req_id, what): the timeline's

    # ---------------------------------------------------------------- pool
    def available(self) -> int:
        """Tokens an allocation can get now: free, and cached ones no request pins."""
        return self.kv_free + (self.cache.evictable if self.cache is not None else 0)

    def kv_evictable(self) -> int:
        """Cached tokens no request pins: counted as used (`kv_free` excludes them), taken back by an
        allocation (`_make_room`)."""
        return self.cache.evictable if self.cache is not None else 0

    def available_with(self, path: Any) -> int:
        """`available()` once `path` (a hit about to be pinned) no longer counts as evictable:
        both engines test a new request's room with its own prefix locked."""
        free = self.available()
        if path:
            free -= sum(n.cached for n in path if n.refs == 0)
        return free

    def _make_room(self, tokens: int) -> None:
        cache = self.cache
        if cache is not None and tokens > self.kv_free:
            freed = cache.evict(tokens - self.kv_free)
            self.kv_free += freed
            self.evicted_tokens += freed

    def _alloc(self, req: Req, tokens: int, what: str, now_s: float) -> None:
        self._make_room(tokens)
        super()._alloc(req, tokens, what, now_s)

    def _alloc_decode(self, reqs: list[Req], what: str, now_s: float,
                      known: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
        self._make_room(len(reqs))
        return super()._alloc_decode(reqs, what, now_s, known)

    # ---------------------------------------------------------------- hits
    def hit_limit(self, req: Req) -> int:
        """The most tokens of `req`'s fill a hit may cover: SGLang and vLLM both compute at least
        the last token (its logits); vLLM also hits whole blocks only."""
        g = self.granularity
        return (req.fill_len - 1) // g * g

    def lookup(self, req: Req, now_s: float) -> tuple[int, Any]:
        """(cached tokens, path) of `req`'s longest cached prefix (0, None without a cache)."""
        cache = self.cache
        if cache is None or not req.pieces:
            return 0, None
        hit, path = cache.match(req.pieces, self.hit_limit(req), now_s)
        # whole granules only (vLLM's blocks): a piece partly evicted may end mid-block
        return hit - hit % self.granularity, path

    def admit_hit(self, req: Req, hit: int, path: Any, now_s: float = 0.0) -> None:
        """`req` is admitted with `hit` tokens cached: they are pinned and count as computed."""
        if hit:
            self.events.append((now_s, req.slot, req.rid, f"cache hit {hit} tokens"))
        first = req.admit_s is None
        if first:
            req.cached_tokens = hit
            self.hit_tokens += hit
            self.admitted_prompt_tokens += req.prompt_len
        self.saved_tokens += hit
        if hit and self.cache is not None:
            self.cache.lock(path)
            req.cache_path = path
            req.tree_tokens = hit
            req.prefix_len = hit

    # ---------------------------------------------------------------- the cache takes tokens over
    def _to_cache(self, req: Req, tokens: int, pieces: Any, now_s: float) -> None:
        """The first `tokens` tokens of `req` (along `pieces`) enter the cache: the request's own
        tokens among them become the cache's (duplicates of tokens already cached are freed)."""
        cache = self.cache
        assert cache is not None
        req.settle()
        new, path = cache.insert(pieces, tokens, now_s)
        # (a node another request cached further than `tokens` covers only this request's part)
        covered = min(sum(n.cached for n in path), tokens - tokens % self.granularity)
        moved = covered - req.tree_tokens  # own tokens now covered by the cache
        if moved > 0:
            req.kv_base -= moved
            self.kv_free += moved - new  # the duplicates
            if req.cache_path is not None:
                cache.unlock(req.cache_path)
            cache.lock(path)
            req.cache_path = path
            req.tree_tokens = covered

    def _emit(self, req: Req, now_s: float, slot: Any, j: int) -> None:
        first = req.first_token_s is None
        super()._emit(req, now_s, slot, j)
        if first and not req.finished and self.cache is not None and req.pieces:
            self._to_cache(req, req.prompt_len, req.pieces, now_s)

    def _free(self, req: Req) -> None:
        cache = self.cache
        if cache is not None and req.finished and req.pieces:
            # prompt and output, but the last sampled token (its KV was never computed)
            pieces = list(req.pieces)
            if sum(n for _p, n in pieces) >= req.prompt_len:
                pieces.append((output_piece(req.rid), req.out_len))
            self._to_cache(req, req.prompt_len + req.out_len - 1, pieces, now_s=req.finish_s or 0.0)
        super()._free(req)
        if cache is not None and req.cache_path is not None:
            cache.unlock(req.cache_path)
        req.cache_path = None
        req.tree_tokens = 0

    def pad(self, mb: MicroBatch | None) -> MicroBatch | None:
        """Set the CUDA-graph padding of `mb`: a batch no larger than the largest captured size
        replays the graph of the next captured size (vLLM V1's piecewise graphs: the step's
        tokens, mixed batches too; SGLang's and vLLM V0's: a decode-only batch's rows); a
        larger one runs eagerly, unpadded."""
        sizes = self.capture_sizes
        if mb is None or not sizes:
            return mb
        st = mb.stats
        if self.pad_total:
            n = st.prefill_tokens + st.num_decode
        elif mb.mode == "decode":
            n = st.num_decode
        else:
            return mb
        if n <= sizes[-1]:
            st.pad_tokens = sizes[bisect_left(sizes, n)] - n  # (pad_to, without a Python call)
        return mb

    def stall(self, slot: Any) -> None:
        """The slot's running requests sit this micro-batch out (a prefill-only step): its
        result time is no token of theirs. The slot marks it (`Slot.stalled`; the result's
        entry becomes one of `Slot.holes`) and their decode segments go on across it
        (state.Req): their next token's gap spans the stall, with no work per request here."""
        if slot.running:
            slot.stalled = True  # (its running list is unchanged: a sampled summary stays valid)

    def kv_accounted(self) -> int:
        """kv_free + the cache's tokens: with every running request's own tokens, the capacity."""
        return self.kv_free + (self.cache.size if self.cache is not None else 0)


class BlockScheduler(CachedScheduler):
    """vLLM's KV pool: whole blocks of `block_size` tokens (vLLM V1 `v1/core/block_pool.py`
    `BlockPool`, V0 `core/block_manager.py` `SelfAttnBlockSpaceManager`). A request holds
    ceil(tokens / block_size) blocks (its tokens: `Req.block_tokens`), so the unfilled tail of its last block is taken from the
    pool: an allocation fits when its new blocks fit the free ones, not its tokens
    (`kv_cache_manager.py` `allocate_slots`: `num_blocks_to_allocate > get_num_free_blocks()`),
    and preemption comes when the blocks run out. The pool keeps counting tokens (`kv_free`);
    the tails (`slack`, the sum over requests of (-tokens) mod block_size) are what the block
    view takes off it: free blocks = (available() - slack) // block_size. Hits and cached
    prompts are whole blocks (granularity = block_size), so the cache holds no tail."""

    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit", prefix_cache: bool = True, block_size: int = 16) -> None:
        super().__init__(num_slots, kv_tokens, max_running_requests, chunk_size, on_kv_exhausted, prefix_cache,
                         block_size)
        self.block = block_size
        self.slack = 0  # the requests' unfilled last-block tails, in tokens

    def _grow(self, req: Req, tokens: int) -> None:
        b = self.block
        old = req.block_tokens
        new = old + tokens
        req.block_tokens = new
        self.slack += (-new) % b - (-old) % b

    def free_blocks(self, path: Any = None) -> int:
        """Blocks an allocation can take now (free and evictable, `path` pinned first)."""
        return (self.available_with(path) - self.slack) // self.block

    def blocks_for(self, req: Req, tokens: int) -> int:
        """New blocks `tokens` more tokens of `req` need (get_num_blocks_to_allocate)."""
        b = self.block
        old = req.block_tokens
        return -(-(old + tokens) // b) - -(-old // b)

    def decode_blocks(self, reqs: list[Req]) -> int:
        """New blocks one more token each of `reqs` needs: one per request whose last block is full."""
        b = self.block
        n = 0
        for r in reqs:
            if r.block_tokens % b == 0:
                n += 1
        return n

    def _grow_decodes(self, reqs: list[Req], new_blocks: int) -> None:
        """`_grow(r, 1)` for each of `reqs`, `new_blocks` of which (`decode_blocks`) start a new block:
        a request whose last block was full leaves b - 1 tokens of its new one unfilled, each
        other one fills one more of its tail (the same `slack`, without a call per request)."""
        for r in reqs:
            r.block_tokens += 1
        self.slack += new_blocks * (self.block - 1) - (len(reqs) - new_blocks)

    def admit_hit(self, req: Req, hit: int, path: Any, now_s: float = 0.0) -> None:
        super().admit_hit(req, hit, path, now_s)
        if hit:
            self._grow(req, hit)  # whole blocks: no tail

    def _alloc(self, req: Req, tokens: int, what: str, now_s: float) -> None:
        super()._alloc(req, tokens, what, now_s)
        self._grow(req, tokens)

    def _alloc_decode(self, reqs: list[Req], what: str, now_s: float,
                      known: tuple[int, int, int] | None = None, new_blocks: int = -1) -> tuple[int, int, int]:
        """`new_blocks`: `decode_blocks(reqs)` when the caller has counted them (-1: counted here)."""
        out = super()._alloc_decode(reqs, what, now_s, known)
        self._grow_decodes(reqs, new_blocks if new_blocks >= 0 else self.decode_blocks(reqs))
        return out

    def _free(self, req: Req) -> None:
        super()._free(req)
        old = req.block_tokens
        req.block_tokens = 0
        self.slack -= (-old) % self.block
