"""Runtime state of requests and micro-batches inside the simulated server."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any

from sim.latency.batchstats import BatchStats  # (compiled with this module: built without a Python frame)
from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

DECODE, EXTEND, MIXED = "decode", "extend", "mixed"

# Request lifecycle states (final ones: FINISHED, IGNORED, and at a horizon or failure the others).
# IGNORED: the engine finished it without running it to its end (vLLM 0.6.3's FINISHED_IGNORED,
# a prompt that can never fit: sim/engine/schedulers/vllm_v0.py).
WAITING, RUNNING, FINISHED, IGNORED = "waiting", "running", "finished", "ignored"


def lengths(reqs: list[Req], ctx: int = 0, total: int = 0, top: int = 0) -> tuple[int, int, int]:
    """(summed context, summed tokens left, most tokens left) of `reqs`, on top of the given ones:
    context = prompt + output so far, tokens left = max_new - output so far."""
    for r in reqs:
        out = r.out_len
        ctx += r.prompt_len + out
        left = r.max_new - out
        total += left
        if left > top:
            top = left
    return ctx, total, top


class Req:
    """One request as the server sees it (SGLang's `Req`, reduced to what timing needs).

    Token accounting: `fill_len` tokens (prompt + output generated before a retraction) must
    be prefilled; `prefix_len` of them are already in the KV cache; `kv_held` counts every
    KV slot the request holds (prefilled tokens + one per decode step).

    Decode segments: while a request decodes in one slot, it takes part in every micro-batch
    of that slot, so its tokens come at consecutive entries of the slot's result times
    (`Slot.times`). The token emission then only counts the token (`out_len`); the request
    remembers the slot's times and the index of its segment's first token (`seg_times`,
    `seg_idx`), and `settle` writes the segment's gaps and KV slots out when the segment ends
    (the request finishes, is paused or retracted, or the run ends). `kv_held` is exact at
    any time: the settled count (`kv_base`) plus the segment's tokens since its start.

    Stalls: a prefill-only step of the slot (SGLang's and vLLM V0's prefill-first steps) leaves
    the slot's running requests out, so its result time is no token of theirs. The slot lists
    such entries (`Slot.holes`, ascending; the request keeps the list as `seg_holes`) instead of
    ending every stalled request's segment: a segment's tokens are its entries but the holes
    after its first (a request that starts its segment at a hole, prefilled by that very step,
    has its first token there), and the gap across a hole spans the stall, as two segments did.
    """

    __slots__ = (
        "rid", "arrival_s", "prompt_len", "orig_prompt_len", "max_new", "orig_output_len",
        "out_len", "fill_len", "prefix_len", "slot", "state", "admit_s",
        "first_token_s", "finish_s", "num_chunks", "num_retractions", "truncated_prompt",
        "clipped_output", "finished", "replica", "last_token_s", "itls", "row", "kv_base", "seg_times", "seg_idx",
        "seg_holes", "keep_itls", "pieces", "cached_tokens", "tree_tokens", "cache_path", "block_tokens",
    )

    def __init__(self, rid: int, arrival_s: float, prompt_len: int, output_len: int,
                 max_req_input_len: int, max_req_len: int) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.orig_prompt_len = prompt_len
        self.orig_output_len = output_len
        # NOTE: the artifact truncates over-long prompts and clips max_new_tokens to the
        # context limit (scheduler.py handle_generate_request); both are recorded as flags.
        self.truncated_prompt = prompt_len > max_req_input_len
        self.prompt_len = min(prompt_len, max_req_input_len)
        self.max_new = max(1, min(output_len, max_req_len - self.prompt_len - 1))
        self.clipped_output = self.max_new < output_len
        self.out_len = 0
        self.fill_len = self.prompt_len
        self.prefix_len = 0
        self.kv_base = 0
        self.seg_times: array | None = None
        self.seg_idx = 0
        self.seg_holes: array | None = None  # the slot's stalled entries (`Slot.holes`): not its tokens
        self.slot = -1
        self.state = WAITING
        self.admit_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_chunks = 0
        self.num_retractions = 0
        self.finished = False
        self.replica = 0
        # Per-token inter-token latencies (s) as a streaming client sees them (vLLM's `itl`):
        # gaps between consecutive sampled tokens, one float64 per token after the first.
        self.last_token_s = 0.0
        self.itls = array("d")
        self.keep_itls = True  # False: a run that keeps no gaps (`run(itls=False)`): `settle` writes none
        self.row = -1  # its row in the run's RequestTable (sim/engine/requests.py); -1: none
        # Prefix caching (sim/engine/prefix_cache.py; engines with a cache only): the prompt's
        # content pieces, the tokens its first admission found cached, the tokens it now holds
        # through the cache (its locked path, `cache_path`) rather than as its own `kv_base`
        self.pieces: Any = None
        self.cached_tokens = 0
        self.tree_tokens = 0
        self.cache_path: Any = None
        # vLLM's block pool (sim/engine/schedulers/cached.py BlockScheduler): the tokens it holds in
        # the block view of the pool it runs in (its own and its cached prefix, counted as allocated)
        self.block_tokens = 0

    @property
    def kv_held(self) -> int:
        times = self.seg_times
        if times is None:
            return self.kv_base
        start = self.seg_idx
        n = len(times) - 1 - start
        holes = self.seg_holes
        if holes is not None and holes and holes[-1] > start:
            n -= len(holes) - bisect_right(holes, start)  # (stalls since its first token)
        return self.kv_base + n

    def settle(self, last: int | None = None) -> None:
        """End the decode segment: one gap (`itls`) and one KV slot for every token after its
        first, up to index `last` of the slot's times (default: the slot's latest result,
        which is this request's latest token while it is in the slot)."""
        times = self.seg_times
        if times is None:
            return
        if last is None:
            last = len(times) - 1
        start = self.seg_idx
        holes = self.seg_holes
        if holes is not None and holes and holes[-1] > start:
            lo = bisect_right(holes, start)
            hi = bisect_right(holes, last)
            if hi > lo:  # stalls inside the segment: its tokens skip them
                self._settle_around(times, start, last, holes, lo, hi)
                self.seg_times = None
                return
        if last > start:
            self.kv_base += last - start
            if self.keep_itls:
                # the same float subtractions as one gap per token (numpy's diff is elementwise):
                # a short segment (engines whose prefill steps stall the decodes end many) in a
                # plain loop, a long one with numpy
                if last - start <= 16:
                    itls = self.itls
                    for k in range(start, last):
                        itls.append(times[k + 1] - times[k])
                else:
                    view = np.frombuffer(times, dtype=np.float64, count=last - start + 1, offset=8 * start)
                    # (np.subtract of the shifted views is what np.diff computes, without its
                    # argument handling: ~5 us less a call, one call per finished request)
                    self.itls.frombytes(np.subtract(view[1:], view[:-1]).tobytes())
                    del view  # (the view pins the array's buffer: it must not outlive this call)
            self.last_token_s = times[last]
        self.seg_times = None

    def _settle_around(self, times: array, start: int, last: int, holes: array, lo: int, hi: int) -> None:
        """`settle` of a segment with stalls: its tokens are `times[start..last]` but the entries
        `holes[lo:hi]` (each inside (start, last]); a gap across a stall spans it, the same float
        subtraction as when the stall ended the segment and the next token started another."""
        if last - start <= 32:
            # (a plain loop over lists: reading the arrays item by item would box every index)
            seg: list[float] = times[start:last + 1].tolist()
            skip: list[int] = holes[lo:hi].tolist()
            gaps: list[float] = []
            prev = 0
            h = 0
            nxt = skip[0] - start
            for k in range(1, len(seg)):
                if k == nxt:
                    h += 1
                    nxt = skip[h] - start if h < len(skip) else -1
                    continue
                gaps.append(seg[k] - seg[prev])
                prev = k
            n = len(gaps)
            prev += start
            if self.keep_itls:
                self.itls.fromlist(gaps)
        else:
            # (views of the arrays pin their buffers: each is dropped as soon as it is copied)
            hole = np.zeros(last + 1 - start, dtype=bool)
            hole[np.frombuffer(holes, dtype=np.int64, count=hi - lo, offset=8 * lo) - start] = True
            view = np.frombuffer(times, dtype=np.float64, count=last + 1 - start, offset=8 * start)
            tok = view[np.logical_not(hole)]  # (a copy)
            del view
            n = len(tok) - 1
            prev = last
            while hole[prev - start]:  # (the last entry that is a token of its)
                prev -= 1
            if self.keep_itls and n > 0:
                self.itls.frombytes(np.subtract(tok[1:], tok[:-1]).tobytes())
        if n > 0:
            self.kv_base += n
            self.last_token_s = times[prev]

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.out_len

    def __repr__(self) -> str:
        return f"Req({self.rid}, p={self.prompt_len}, out={self.out_len}/{self.max_new}, slot={self.slot}, {self.state})"


class MicroBatch:
    """One micro-batch launched from a slot.

    `prefill` holds (request, new tokens, prefix tokens) pieces in batch order (a continuing
    chunk first, then new requests); `decodes` the slot's running requests (1 token each);
    `chunked` is the request whose prompt was cut by this micro-batch (it emits no token).
    """

    __slots__ = ("index", "slot", "mode", "prefill", "decodes", "chunked", "stats", "stage_s", "chunk_size",
                 "infos", "left_sum", "left_top", "after")

    def __init__(self, index: int, slot: int, mode: str, prefill: list[tuple[Req, int, int]], decodes: list[Req],
                 chunked: Req | None, chunk_size: int, decode_ctx: int | None = None,
                 decode_left: tuple[int, int] | None = None) -> None:
        self.index = index
        self.slot = slot
        self.mode = mode
        self.prefill = prefill
        self.decodes = decodes
        self.chunked = chunked
        self.chunk_size = chunk_size
        c2 = cp = tokens = 0
        for _req, new, prefix in prefill:
            tokens += new
            c2 += new * new
            cp += new * prefix
        # the decodes' summed context, and their summed and largest tokens left at launch (the
        # scheduler passes what it knows; else one walk)
        if decode_ctx is None or decode_left is None:
            ctx, lsum, ltop = lengths(decodes)
            decode_ctx = ctx if decode_ctx is None else decode_ctx
            decode_left = (lsum, ltop) if decode_left is None else decode_left
        self.stats = BatchStats(tokens, len(prefill), c2, cp, len(decodes), decode_ctx)
        self.left_sum, self.left_top = decode_left
        # what the token emission leaves of the decodes (the scheduler's Slot.summary)
        self.after: tuple[int, int, int, int] | None = None
        self.stage_s: tuple[float, ...] = ()
        # its policy descriptions (view.batch_info), made once: a batch in flight is described
        # to the predictive policy at every iteration it spends in the pipeline
        self.infos: tuple | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.prefill) + len(self.decodes)

    def requests(self) -> list[Req]:
        return [p[0] for p in self.prefill] + list(self.decodes)
