"""A read-only view of the scheduler for policies (they never touch engine state)."""

from __future__ import annotations

from sim.engine.scheduler import Scheduler


class SchedulerView:
    """What a policy may read at a decision point. Attributes are snapshots or read-only
    accessors; policies must not mutate the objects they get from here."""

    __slots__ = ("_sched", "now_s", "slot", "step")

    def __init__(self, sched: Scheduler, now_s: float, slot: int, step: int) -> None:
        self._sched = sched
        self.now_s = now_s
        self.slot = slot
        self.step = step

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

    @property
    def num_waiting(self) -> int:
        return len(self._sched.waiting)

    def waiting_prompt_tokens(self) -> int:
        return sum(r.fill_len - r.prefix_len for r in self._sched.waiting)

    def running_counts(self) -> list[int]:
        """Requests in each slot's last micro-batch (0 if none), as the controllers count."""
        return [s.last.num_reqs if s.last is not None else 0 for s in self._sched.slots]
