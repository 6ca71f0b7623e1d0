"""Read-only views of the scheduler for policies (they never touch engine state).

Everything here is either a number or a freshly built tuple of small immutable records (named
tuples: a record costs one tuple, the engine makes one per micro-batch), so a policy cannot
change the simulation by accident. The fields follow what the artifact's
controllers and rebalancer read (fastpp-system-model.md sections 2-5).
"""

from __future__ import annotations

from typing import NamedTuple

from sim.engine.schedulers.fastpp import Scheduler
from sim.engine.state import MicroBatch


class BatchInfo(NamedTuple):
    """A micro-batch as the controllers see it (ALP's per-batch features, section 4.3).

    `num_tokens` N = prefill tokens + decodes; `decode_ctx` D = sum of decode contexts;
    `prefill_sq` S = sum of new_tokens^2; `prefill_prefix` X = sum of new_tokens * prefix;
    `num_reqs` counts every request of the batch, `num_reqs_own` excludes the slot's own
    request being chunked (the artifact's two ways of counting running requests).
    `holds_cut_chunk` (added for the policies): the batch carries a piece of a request whose
    prompt it cut, i.e. the artifact's per-slot `being_chunked_req[s]` pointer is set for
    this slot (it stays set, possibly stale, until the slot's next turn); ALP excludes that
    request from the slot's count and the rebalancer subtracts it for the other slots."""

    slot: int
    mode: str
    num_tokens: int
    num_decode: int
    decode_ctx: int
    prefill_sq: int
    prefill_prefix: int
    num_reqs: int
    num_reqs_own: int
    holds_cut_chunk: bool = False


_new_tuple = tuple.__new__


def batch_info(mb: MicroBatch, sched: Scheduler) -> BatchInfo:
    """The `BatchInfo` of micro-batch `mb` as the scheduler stands now."""
    # Everything but `num_reqs_own` is fixed once the batch is formed, and that one only
    # depends on whether the scheduler's chunked request is still this batch's own: both
    # variants are made once and kept on the batch (`mb.infos`; the records are immutable).
    infos = mb.infos
    if infos is None:
        st = mb.stats
        n = mb.num_reqs
        holds = mb.chunked is not None and any(p[0] is mb.chunked for p in mb.prefill)
        fields = (mb.slot, mb.mode, st.prefill_tokens + st.num_decode, st.num_decode, st.sum_decode_ctx, st.sum_c2,
                  st.sum_cp, n)
        # (made as the named tuple's own `_make` makes it: `tuple.__new__`, no Python frame)
        info = _new_tuple(BatchInfo, (*fields, n, holds))
        own = _new_tuple(BatchInfo, (*fields, n - 1, holds)) if holds else info
        infos = mb.infos = (info, own)
    chunked = sched.chunked
    if chunked is not None and mb.chunked is chunked and chunked.slot == mb.slot:
        return infos[1]
    return infos[0]


class WaitingInfo(NamedTuple):
    """A queued request: when it arrived, and the prefill tokens it still needs."""

    req_id: int
    arrival_s: float
    prompt_tokens: int
    prefix_tokens: int
    remaining_tokens: int


class ChunkedInfo(NamedTuple):
    """The one request being chunked: the slot of its latest chunk, its prefix and the
    prompt tokens not yet scheduled."""

    req_id: int
    slot: int
    arrival_s: float
    prefix_tokens: int
    remaining_tokens: int


class RunningInfo(NamedTuple):
    req_id: int
    arrival_s: float
    admit_s: float | None
    prompt_tokens: int
    output_tokens: int


class SchedulerView:
    """What a policy may read at a decision point."""

    __slots__ = ("_sched", "now_s", "slot", "step", "start_s", "tpot_signal_s", "rebalance_metrics")

    def __init__(self, sched: Scheduler, now_s: float, slot: int, step: int, start_s: float = 0.0,
                 tpot_signal_s: float = 0.1, rebalance_metrics: tuple | None = None) -> None:
        self._sched = sched
        self.now_s = now_s
        self.slot = slot
        self.step = step  # iterations that launched a micro-batch so far (the artifact's step_count)
        self.start_s = start_s  # first arrival of the run
        self.tpot_signal_s = tpot_signal_s  # the chunk controller's latest published TPOT signal
        # (tpot_signal_s, waiting prompt tokens, kv free fraction) published at the controller's
        # last decision (None with a static chunk: the rebalancer then reads local values)
        self.rebalance_metrics = rebalance_metrics

    # -- sizes and memory --
    @property
    def num_slots(self) -> int:
        return self._sched.num_slots

    @property
    def chunk_size(self) -> int:
        return self._sched.chunk_size

    @property
    def kv_capacity_tokens(self) -> int:
        return self._sched.kv_capacity

    @property
    def kv_free_tokens(self) -> int:
        return self._sched.kv_free

    # -- queue --
    @property
    def num_waiting(self) -> int:
        return len(self._sched.waiting)

    def waiting(self) -> tuple[WaitingInfo, ...]:
        return tuple(WaitingInfo(r.rid, r.arrival_s, r.prompt_len, r.prefix_len, r.fill_len - r.prefix_len)
                     for r in self._sched.waiting)

    def waiting_columns(self) -> tuple[list[float], list[int], list[int]]:
        """The waiting queue in order as three lists (arrival_s, prefix_tokens, remaining_tokens):
        what `waiting()` holds without an object per request (the queue can be thousands long)."""
        waiting = self._sched.waiting  # (kept as columns beside the queue: scheduler.WaitingQueue)
        return list(waiting.arrival_s), list(waiting.prefix_tokens), list(waiting.remaining_tokens)

    def waiting_prompt_tokens(self) -> int:
        return self._sched.waiting.prompt_tokens

    def chunked(self) -> ChunkedInfo | None:
        r = self._sched.chunked
        if r is None:
            return None
        return ChunkedInfo(r.rid, r.slot, r.arrival_s, r.prefix_len, r.fill_len - r.prefix_len)

    def arrivals_since(self, t_s: float) -> tuple[tuple[float, int], ...]:
        """(arrival time, prompt tokens) of requests that arrived at or after `t_s`."""
        times, prompts = self._sched.arrived_s, self._sched.arrived_prompt
        i = len(times)
        while i and times[i - 1] >= t_s:
            i -= 1
        return tuple(zip(times[i:], prompts[i:]))

    # -- slots --
    def last_batches(self) -> tuple[BatchInfo | None, ...]:
        """Each slot's most recently launched micro-batch (None if the slot has none)."""
        sched = self._sched
        return tuple(batch_info(s.last, sched) if s.last is not None else None for s in sched.slots)

    def running(self) -> tuple[RunningInfo, ...]:
        """The current slot's running batch, head (newest) first."""
        run = self._sched.slots[self.slot].running or []
        return tuple(RunningInfo(r.rid, r.arrival_s, r.admit_s, r.prompt_len, r.out_len) for r in run)

    def num_running(self) -> int:
        """Size of the current slot's running batch (cheap)."""
        return len(self._sched.slots[self.slot].running or ())

    def num_pending(self) -> int:
        """How many requests the rebalancer has paused (cheap)."""
        return len(self._sched.pending)

    def running_ids(self) -> tuple[int, ...]:
        """Request ids of the current slot's running batch, head (newest) first (cheap)."""
        return tuple(r.rid for r in (self._sched.slots[self.slot].running or ()))

    def pending_ids(self) -> tuple[int, ...]:
        """Request ids of the paused requests, head first (cheap)."""
        return tuple(r.rid for r in self._sched.pending)

    def pending(self) -> tuple[RunningInfo, ...]:
        """Requests paused by the rebalancer, head first."""
        return tuple(RunningInfo(r.rid, r.arrival_s, r.admit_s, r.prompt_len, r.out_len) for r in self._sched.pending)

    def other_slots_chunking(self) -> int:
        """Slots other than the current one whose last batch holds the active chunked request."""
        r = self._sched.chunked
        return int(r is not None and r.slot != self.slot and self._sched.slots[r.slot].last is not None)

    # -- signals (append-only logs; policies keep their own cursors) --
    def ttft_samples(self, start: int = 0) -> tuple[float, ...]:
        return tuple(self._sched.ttft_samples[start:])

    def tpot_samples(self, start: int = 0) -> tuple[float, ...]:
        return tuple(self._sched.tpot_samples[start:])
