"""A fake `SchedulerView` and helpers for the policy tests (no tests here): the policies only call view methods."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.engine.view import BatchInfo, ChunkedInfo, RunningInfo, WaitingInfo
from sim.policies import PolicyContext


def ctx(pp: int = 4, launch: int = 128, kv: int = 1_000_000, profile=None) -> PolicyContext:
    return PolicyContext(num_stages=pp, slo_ttft_s=2.0, slo_tpot_s=0.2, launch_chunk_tokens=launch,
                         kv_capacity_tokens=kv, startup_profile=profile)


def batch(slot: int, num_reqs: int = 0, mode: str = "decode", num_tokens: int | None = None,
          decode_ctx: int = 0, prefill_sq: int = 0, prefill_prefix: int = 0, num_decode: int | None = None,
          cut: bool = False) -> BatchInfo:
    nd = num_reqs if num_decode is None else num_decode
    return BatchInfo(slot, mode, num_reqs if num_tokens is None else num_tokens, nd, decode_ctx, prefill_sq,
                     prefill_prefix, num_reqs, num_reqs - int(cut), cut)


def running(ids) -> tuple[RunningInfo, ...]:
    return tuple(RunningInfo(i, 0.0, 0.0, 100, 1) for i in ids)


@dataclass
class FakeView:
    num_slots: int = 4
    slot: int = 0
    step: int = 0
    now_s: float = 10.0
    start_s: float = 0.0
    chunk_size: int = 512
    kv_capacity_tokens: int = 1_000_000
    kv_free_tokens: int = 1_000_000
    tpot_signal_s: float = 0.1
    rebalance_metrics: tuple | None = None
    ttft: list = field(default_factory=list)
    tpot: list = field(default_factory=list)
    batches: list | None = None
    waiting_reqs: list = field(default_factory=list)  # WaitingInfo
    chunked_req: ChunkedInfo | None = None
    arrivals: list = field(default_factory=list)  # (arrival_s, prompt tokens)
    running_reqs: tuple = ()
    pending_reqs: tuple = ()

    def last_batches(self):
        return tuple(self.batches) if self.batches is not None else (None,) * self.num_slots

    def ttft_samples(self, start: int = 0):
        return tuple(self.ttft[start:])

    def tpot_samples(self, start: int = 0):
        return tuple(self.tpot[start:])

    def waiting(self):
        return tuple(self.waiting_reqs)

    def waiting_columns(self):
        w = self.waiting_reqs
        return [x.arrival_s for x in w], [x.prefix_tokens for x in w], [x.remaining_tokens for x in w]

    def waiting_prompt_tokens(self):
        return sum(w.prompt_tokens for w in self.waiting_reqs)

    def chunked(self):
        return self.chunked_req

    def arrivals_since(self, t_s: float):
        return tuple(a for a in self.arrivals if a[0] >= t_s)

    def running(self):
        return self.running_reqs

    def num_running(self):
        return len(self.running_reqs)

    def num_pending(self):
        return len(self.pending_reqs)

    def running_ids(self):
        return tuple(r.req_id for r in self.running_reqs)

    def pending_ids(self):
        return tuple(r.req_id for r in self.pending_reqs)

    def pending(self):
        return self.pending_reqs


def waiting(rid: int, arrival_s: float, tokens: int, prefix: int = 0) -> WaitingInfo:
    return WaitingInfo(rid, arrival_s, tokens + prefix, prefix, tokens)


def apply_moves(moves, run_ids: list, pend_ids: list) -> tuple[list, list]:
    """The engine's `Scheduler._apply_move` on plain id lists."""
    run_ids, pend_ids = list(run_ids), list(pend_ids)
    for m in moves:
        if m.to_pending:
            run_ids.remove(m.req_id)
            pend_ids.insert(0, m.req_id) if m.at_head else pend_ids.append(m.req_id)
        else:
            pend_ids.remove(m.req_id)
            run_ids.insert(0, m.req_id) if m.at_head else run_ids.append(m.req_id)
    return run_ids, pend_ids
