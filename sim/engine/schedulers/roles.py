"""The FastPP scheduler in the two roles of disaggregated serving (sim/engine/disagg.py).

In their own module, beside the scheduler they extend, because that scheduler may be compiled
(sim/native.py) and a compiled class is subclassed only by compiled classes: this module is
compiled with it.
"""

from __future__ import annotations

from typing import Any

from sim.engine.schedulers.fastpp import Scheduler
from sim.engine.state import RUNNING, Req
from sim.policies.base import Move


class PrefillScheduler(Scheduler):
    """FastPP's scheduler on a prefill instance; it tells `on_start` when a request's first chunk is
    scheduled (its requests are one-token shadows of the real ones)."""

    on_start: Any = None

    def form_batch(self, slot_idx: int, now_s: float, rebalance=None):
        mb = super().form_batch(slot_idx, now_s, rebalance)
        if mb is not None and self.on_start is not None:
            for req, _new, prefix in mb.prefill:
                if prefix == 0 and req.num_chunks == 1:
                    self.on_start(req, now_s)
        return mb


class DecodeScheduler(Scheduler):
    """FastPP's scheduler on a decode instance. Requests reach it only with their KV in its pool
    (`add_waiting` is their way in from the inbox): they are held in its paused list and join the
    running requests of the next slot it schedules (at most `max_running` per slot), as decodes."""

    def add_waiting(self, req: Req) -> None:
        self.pending.append(req)
        self.num_active += 1
        req.state = RUNNING
        self.arrived_s.append(req.arrival_s)
        self.arrived_prompt.append(req.prompt_len)

    def form_batch(self, slot_idx: int, now_s: float, rebalance=None):
        return super().form_batch(slot_idx, now_s, self._join if self.pending else rebalance)

    def _join(self, slot_idx: int) -> list[Move]:
        slot = self.slots[slot_idx]
        room = self.max_running - (len(slot.running) if slot.running else 0)
        return [Move(r.rid, False, False) for r in self.pending[:max(room, 0)]]
