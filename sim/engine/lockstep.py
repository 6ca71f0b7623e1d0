"""One simulation for several SLOs, exactly.

Runs of one config that differ only in their SLO are the same simulation for as long as
nothing that reads the SLO acts differently. In a run the SLO is read by the chunk policy and
the rebalancer (built from it, through their `PolicyContext`), by the pipeline's initial TPOT
signal (half the SLO; only a rebalancer reads it), by the early-stop guard and by the summary.

So a run can carry *alternates*: for each extra SLO, its own chunk policy (and rebalancer),
called beside the real ones at every decision point on the view its own run would show them,
and its own early-stop guard, checked at the real guard's check points without stopping
anything. The first time an alternate's decision differs from the real one (the chunk it
leaves in force; with a rebalancer also the published TPOT signal and every move), it is
dropped. An alternate still standing at the end, whose guard never tripped, would have made
this very run: its summary is this run's, summarised with its SLO (`sim.studies.sweep`). Goodput
studies over SLO scales use this: at low rates the dynamic policies often never decide
differently across scales, and each scale's run would otherwise be simulated again.
"""

from __future__ import annotations

from sim.engine.view import SchedulerView


class Lockstep:
    """The alternates' shared state: which are still standing, and the TPOT signal each
    alternate's own pipeline would hold (the real one's starts at half of its own SLO)."""

    def __init__(self, initial_signals_s: list[float], rebalanced: bool) -> None:
        n = len(initial_signals_s)
        self.alive = [True] * n
        self.signal_s = list(initial_signals_s)  # the pipeline's tpot_signal_s in each alternate's run
        self.metric_signal_s: list[float | None] = [None] * n  # the signal in its published metrics
        self.rebalanced = rebalanced  # a rebalancer reads the signals: they must agree too

    def view_for(self, i: int, view: SchedulerView) -> SchedulerView:
        m = view.rebalance_metrics
        metrics = None if m is None else (self.metric_signal_s[i], m[1], m[2])
        return SchedulerView(view._sched, view.now_s, view.slot, view.step, view.start_s, self.signal_s[i], metrics)

    def standing(self) -> list[int]:
        return [i for i, a in enumerate(self.alive) if a]


class LockstepChunkPolicy:
    """The real chunk policy, with one alternate per extra SLO run beside it."""

    def __init__(self, primary, alternates: list, state: Lockstep) -> None:
        self.primary = primary
        self.alts = alternates
        self.state = state
        first = primary.initial_chunk()
        for i, alt in enumerate(alternates):
            if alt.initial_chunk() != first:
                state.alive[i] = False
        self.never_decides = all(getattr(p, "never_decides", False) for p in [primary, *alternates])
        # decide only every n-th step if every member does (else at every step, as the default)
        every = {getattr(p, "decides_every_steps", 1) for p in [primary, *alternates]}
        self.decides_every_steps = every.pop() if len(every) == 1 else 1
        if any(hasattr(p, "observe") for p in [primary, *alternates]):
            self.observe = self._observe

    def initial_chunk(self) -> int:
        return self.primary.initial_chunk()

    def decide(self, view):
        d = self.primary.decide(view)
        st = self.state
        for i in st.standing():
            a = self.alts[i].decide(st.view_for(i, view))
            if not self._same(d, a, view.chunk_size):
                st.alive[i] = False
            elif a is not None and a.tpot_signal_s is not None:
                st.signal_s[i] = a.tpot_signal_s
            if st.alive[i] and a is not None:
                st.metric_signal_s[i] = st.signal_s[i]
        return d

    def _same(self, d, a, current: int) -> bool:
        if not self.state.rebalanced:  # only the chunk in force matters
            return (current if d is None else d.chunk) == (current if a is None else a.chunk)
        if d is None or a is None:
            return d is None and a is None
        return d.chunk == a.chunk and d.tpot_signal_s == a.tpot_signal_s

    def _observe(self, view, current, inflight, iteration_s: float) -> None:
        if hasattr(self.primary, "observe"):
            self.primary.observe(view, current, inflight, iteration_s)
        st = self.state
        for i in st.standing():
            obs = getattr(self.alts[i], "observe", None)
            if obs is not None:
                obs(st.view_for(i, view), current, inflight, iteration_s)


class LockstepRebalancer:
    """The real rebalancer, with one alternate per extra SLO; an alternate whose moves differ
    is dropped."""

    def __init__(self, primary, alternates: list, state: Lockstep) -> None:
        self.primary = primary
        self.alts = alternates
        self.state = state

    def rebalance(self, view):
        moves = self.primary.rebalance(view)
        st = self.state
        for i in st.standing():
            if list(self.alts[i].rebalance(st.view_for(i, view))) != list(moves):
                st.alive[i] = False
        return moves


class LockstepGuard:
    """The real early-stop guard (or none) and each alternate's, checked at the same points;
    only the real one stops the run. `tripped[i]`: alternate i's run would have stopped."""

    def __init__(self, primary, alternates: list) -> None:
        self.primary = primary
        self.alts = alternates

    @property
    def reason(self) -> str:
        return self.primary.reason if self.primary is not None else ""

    @property
    def outcome(self) -> str:
        return self.primary.outcome if self.primary is not None else "stopped"

    def finished(self, req) -> None:
        if self.primary is not None:
            self.primary.finished(req)
        for g in self.alts:
            if g is not None:
                g.finished(req)

    def check(self, now: float) -> bool:
        for g in self.alts:
            if g is not None and not g.reason:
                g.check(now)
        return self.primary.check(now) if self.primary is not None else False

    @property
    def tripped(self) -> list[bool]:
        return [g is not None and bool(g.reason) for g in self.alts]
