"""The lock-step pipeline in SimPy: a scheduler process and one process per stage.

Iteration k (decisions.md, "Engine timing"): the scheduler forms the micro-batch of slot
k mod P from the requests that arrived before the iteration started; the iteration overhead
(scheduler CPU time and the last stage's token broadcast, charged once, at its start) is
paid, then every stage s works on the micro-batch that entered stage 0 at iteration k - s.
The iteration ends when the slowest stage is done; then the micro-batch leaving the last
stage has its tokens sampled. The stages need no processes of their own: in lock-step nothing
can change a stage's work once the iteration has started, so the scheduler process computes
every stage's busy time at the start and waits for one event at the iteration's end. A slot is scheduled again
only after its previous micro-batch was sampled, so P micro-batches are in flight. When the
whole system is empty the clock jumps to the next arrival: no events while idle.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Any, ClassVar, Final, Generator

import simpy
from simpy.events import NORMAL

from sim.engine.schedulers.fastpp import INIT_NEW_TOKEN_RATIO, RunFailed, Scheduler
from sim.engine.records import IterationLog
from sim.engine.requests import RequestTable
from sim.engine.state import IGNORED, MicroBatch, Req
from sim.engine.view import SchedulerView, batch_info
from sim.core.lazy import lazy
from sim.core.slo import late_from_s, need_over, need_under

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

INF: Final = float("inf")


def _trigger_at(env: simpy.Environment, event: simpy.Event, when_s: float) -> None:
    """Trigger `event` at time `when_s` (not before now), as a timeout would, without allocating
    a Timeout: SimPy's Timeout sets these two fields and schedules, and `env.schedule` pushes
    this entry on the event queue (inlined: a Python call saved on every iteration)."""
    event._ok = True
    event._value = None
    heappush(env._queue, (when_s, NORMAL, next(env._eid), event))


class Inbox:
    """Requests on their way to one replica, in arrival order.

    With one replica the inbox holds the whole workload and is closed from the start: a list
    of `Req`s, or a `RequestTable` whose rows become `Req`s one at a time as the scheduler
    reaches them (`queue` then is the table's `LazyQueue`, so a long run never holds the
    requests that have not arrived yet); behind a router, the router pushes each request when
    it arrives and closes the inbox at the end.
    """

    def __init__(self, env: simpy.Environment, requests: list[Req] | RequestTable | None = None) -> None:
        self.env = env
        self.queue: Any = requests.queue() if isinstance(requests, RequestTable) else deque(requests or [])
        self.closed = requests is not None
        self._event: Any = None

    def push(self, req: Req) -> None:
        self.queue.append(req)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._event is not None and not self._event.triggered:
            self._event.succeed()

    def wait(self):
        self._event = self.env.event()
        return self._event

    def __len__(self) -> int:
        return len(self.queue)


class SLOGuard:
    """Trips when a percentile the SLO names (TTFT, TPOT, and E2E if set; P90 by default) over
    the whole run is certain to exceed its threshold.

    A request certainly misses its TTFT once it has waited longer than the SLO without a first
    token, its TPOT once (now - first token) / (output - 1) exceeds the SLO (TPOT only grows
    while it decodes), and its E2E once it has been in the system longer than the SLO.
    numpy's q-th percentile of n values exceeds x once n - floor((n - 1) q / 100) of them do
    (`sim.core.slo.need_over`).

    With `kv_tokens` (`[slo] stop_when_met`, a RequestTable) it also trips, outcome "met", once
    the run is certain to meet the SLO: every percentile, over all requests and over the late
    arrivals (sim.core.slo.meets), has enough finished requests within its threshold
    (`sim.core.slo.need_under`; counted with a relative margin of 1e-9, so that the interpolated
    percentile cannot round above it), every request has arrived, and the KV pool can hold every
    live request at its full length (so the rest of the run can neither exhaust it nor leave a
    request stuck, the two ways a run fails)."""

    CHECK_EVERY: ClassVar[int] = 128

    def __init__(self, requests: list[Req] | RequestTable, ttft_s: float, tpot_s: float,
                 ttft_percentile: float = 90.0, tpot_percentile: float = 90.0, e2e_s: float | None = None,
                 e2e_percentile: float = 90.0, kv_tokens: int | None = None) -> None:
        self.requests = requests
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self.e2e_s = e2e_s
        self.percentiles = (ttft_percentile, tpot_percentile, e2e_percentile)
        self.reason = ""
        n = len(requests)
        if isinstance(requests, RequestTable):
            m = int((requests.columns["max_new_tokens"] > 1).sum())
        else:
            m = sum(1 for r in requests if r.max_new > 1)
        self.need_ttft = need_over(n, ttft_percentile)
        self.need_tpot = need_over(m, tpot_percentile)
        self.need_e2e = need_over(n, e2e_percentile)
        # With a RequestTable, finished requests are gone from it: their (final) verdicts are
        # counted as they finish (`finished`), the live ones scanned, the rest read from arrays.
        self.bad_done = [0, 0, 0]  # finished requests over the TTFT, TPOT, E2E thresholds
        self.outcome = "stopped"  # the run's status once `reason` is set ("met": certain to meet)
        self.kv_tokens = kv_tokens if kv_tokens is not None else 0  # (read only by the met test)
        self.met_need: list[int] = []
        if kv_tokens is not None and isinstance(requests, RequestTable):
            self._init_met(requests, m)

    def _init_met(self, table: RequestTable, m: int) -> None:
        """What `meets` will count for the full run: all its requests arrive (no horizon), so
        the late ones are known now (the summary's rule over the whole arrival window)."""
        arrival = table.arrival_s
        n = len(arrival)
        self.late_from = INF
        if n >= 2:
            t0, t1 = float(arrival.min()), float(arrival.max())
            self.late_from = late_from_s(t0, t1)
        late = arrival >= self.late_from
        n_late = int(late.sum())
        m_late = int((late & (table.columns["max_new_tokens"] > 1)).sum())
        q_ttft, q_tpot, q_e2e = self.percentiles
        # (ttft, tpot, e2e) over all requests, then over the late ones
        self.met_need = [need_under(n, q_ttft), need_under(m, q_tpot), need_under(n, q_e2e) if self.e2e_s else 0,
                         need_under(n_late, q_ttft), need_under(m_late, q_tpot),
                         need_under(n_late, q_e2e) if self.e2e_s else 0]
        self.good_done = [0] * 6
        margin = 1 - 1e-9
        self.ok_ttft, self.ok_tpot = self.ttft_s * margin, self.tpot_s * margin
        self.ok_e2e = self.e2e_s * margin if self.e2e_s is not None else INF

    def finished(self, r: Any) -> None:
        """Count a request that just finished (it leaves the RequestTable; its times are set)."""
        bad = self.bad_done
        if r.state == IGNORED:
            # dropped by the engine (vLLM 0.6.3's FINISHED_IGNORED): it meets no objective
            bad[0] += 1
            bad[1] += r.max_new > 1
            bad[2] += self.e2e_s is not None
            return
        ttft = r.first_token_s - r.arrival_s
        tpot = (r.finish_s - r.first_token_s) / (r.max_new - 1) if r.max_new > 1 else None
        e2e = r.finish_s - r.arrival_s
        if ttft > self.ttft_s:
            bad[0] += 1
        if tpot is not None and tpot > self.tpot_s:
            bad[1] += 1
        if self.e2e_s is not None and e2e > self.e2e_s:
            bad[2] += 1
        if self.met_need:
            good = self.good_done
            late = r.arrival_s >= self.late_from
            if ttft <= self.ok_ttft:
                good[0] += 1
                good[3] += late
            if tpot is not None and tpot <= self.ok_tpot:
                good[1] += 1
                good[4] += late
            if e2e <= self.ok_e2e:
                good[2] += 1
                good[5] += late

    def check(self, now: float) -> bool:
        if self.reason:
            return True
        bad_ttft = bad_tpot = bad_e2e = 0
        e2e_s = self.e2e_s
        table = self.requests if isinstance(self.requests, RequestTable) else None
        for r in (table.live.values() if table is not None else self.requests):
            if r.arrival_s > now:
                break
            first = r.first_token_s
            if (now if first is None else first) - r.arrival_s > self.ttft_s:
                bad_ttft += 1
            if first is not None and r.max_new > 1:
                end = r.finish_s if r.finish_s is not None else now
                if (end - first) / (r.max_new - 1) > self.tpot_s:
                    bad_tpot += 1
            if e2e_s is not None and (now if r.finish_s is None else r.finish_s) - r.arrival_s > e2e_s:
                bad_e2e += 1
        if table is not None:
            bad_ttft += self.bad_done[0]
            bad_tpot += self.bad_done[1]
            bad_e2e += self.bad_done[2]
            # rows not made yet that have arrived: no token, so waiting since their arrival
            arrival = table.arrival_s
            lo = table.next_row
            hi = int(np.searchsorted(arrival, now, side="right"))
            if hi > lo:
                waited = now - arrival[lo:hi]
                bad_ttft += int(np.count_nonzero(waited > self.ttft_s))
                if e2e_s is not None:
                    bad_e2e += int(np.count_nonzero(waited > e2e_s))
        q_ttft, q_tpot, q_e2e = self.percentiles
        if bad_ttft >= self.need_ttft:
            self.reason = (f"stopped at t={now:.2f}s: P{q_ttft:g} TTFT is certain to exceed the SLO "
                           f"({bad_ttft} requests over it)")
        elif bad_tpot >= self.need_tpot:
            self.reason = (f"stopped at t={now:.2f}s: P{q_tpot:g} TPOT is certain to exceed the SLO "
                           f"({bad_tpot} requests over it)")
        elif e2e_s is not None and bad_e2e >= self.need_e2e:
            self.reason = (f"stopped at t={now:.2f}s: P{q_e2e:g} E2E is certain to exceed the SLO "
                           f"({bad_e2e} requests over it)")
        elif table is not None and self.met_need and self._certain_to_meet(table):
            self.outcome = "met"
            self.reason = (f"stopped at t={now:.2f}s: certain to meet the SLO ({self.good_done[0]} of "
                           f"{len(table)} requests finished within it)")
        return bool(self.reason)

    def _certain_to_meet(self, table: RequestTable) -> bool:
        if table.next_row < len(table) or any(g < need for g, need in zip(self.good_done, self.met_need)):
            return False
        return sum(r.prompt_len + r.max_new for r in table.live.values()) <= self.kv_tokens


class Pipeline:
    def __init__(self, env: simpy.Environment, sched: Scheduler, latency, chunk_policy,
                 requests: list[Req] | Inbox, horizon_s: float = 0.0, rebalancer=None,
                 slo_tpot_s: float = 0.2, guard=None, noise=None, alone: bool = False) -> None:
        self.env = env
        self.sched = sched
        self.latency = latency
        self.policy = chunk_policy
        self.rebalancer = rebalancer
        self.inbox = requests if isinstance(requests, Inbox) else Inbox(env, requests)
        self.horizon_s = horizon_s
        self.P = sched.num_slots
        self.status = "ok"
        self.reason = ""
        self.decisions: list[tuple] = []  # (time_s, slot, old, new, reason)
        self.move_log: list[tuple] = []  # (time_s, slot, req_id, action, where)
        # the controller's signals start at half the SLOs (scheduler.py:416-420)
        self.tpot_signal_s = 0.5 * slo_tpot_s
        self.rebalance_metrics: tuple | None = None
        self.start_s = self.inbox.queue[0].arrival_s if self.inbox.queue else 0.0
        self.step = 0
        self._observe = getattr(chunk_policy, "observe", None)
        self.guard = guard  # an SLOGuard, or a LockstepGuard standing for several (lockstep.py)
        # per-iteration variance draws (sim/latency/variance.py); None: a zero-variance truth
        self.noise = noise
        self._host_s = 0.0  # this iteration's host time (CPU, broadcast, stalls), recorded with it
        self.log = IterationLog(self.P)
        self.kv_peak = 0
        # the peak of what the requests hold: the pool less free and evictable tokens (a prefix cache keeps
        # freed tokens as evictable cache, so `kv_peak` reads a full pool); vLLM's kv_cache_usage and SGLang's
        # token_usage count usage so (module docstring of sim/engine/schedulers/cached.py)
        self.kv_peak_active = 0
        self.busy = [0.0] * self.P  # this iteration's busy time of each stage
        self.factors: list[float] = [1.0] * self.P  # this iteration's per-stage jitter (1.0: none)
        # the micro-batch in stage s at index s (a list, not a deque: indexed P times an iteration)
        self.inflight: list[MicroBatch | None] = [None] * self.P
        # alone: the only process on its clock, driven by `run_alone` instead of env.run()
        self.alone = alone
        self.proc: Any = None if alone else env.process(self._scheduler())

    def run_alone(self) -> None:
        """Run this pipeline as the only process on its clock: what `env.run()` does, without
        SimPy's dispatch of each event to its process. The loop waits for one event at a time
        and nothing else is scheduled, so popping that event and moving the clock to its time
        is all `env.step()` would do before resuming the loop (the same times, the same run)."""
        env = self.env
        queue = env._queue
        loop = self._scheduler()
        try:
            until = loop.send(None)
            while True:
                if until.__class__ is float:
                    # an iteration's end, handed over as a time (`_scheduler`): no event was made
                    if queue:
                        raise RuntimeError(f"a pipeline run alone found {len(queue)} scheduled events besides its own")
                    env._now = until
                else:
                    if len(queue) != 1:
                        raise RuntimeError(f"a pipeline run alone found {len(queue)} scheduled events instead of its own")
                    env._now = heappop(queue)[0]
                until = loop.send(None)
        except StopIteration:
            pass

    def _scheduler(self) -> Generator[Any, None, None]:
        env, sched, P = self.env, self.sched, self.P
        alone = self.alone  # driven by `run_alone`, which takes an iteration's end as a float
        queue: Any = self.inbox.queue
        # An inbox closed from the start holds the whole workload and changes only by this
        # loop's pops: the head's arrival is kept here (`next_s`) instead of being asked of the
        # queue every iteration (a table's LazyQueue answers in Python).
        fixed = self.inbox.closed
        next_s: float = queue[0].arrival_s if fixed and queue else INF
        inflight, busy = self.inflight, self.busy
        overhead_of = getattr(self.latency, "overhead_s", None)
        overhead: float = self.latency.iteration_overhead_s
        # the engine version's modelled host time (sim/engine/hosttime.py) instead of the profile's
        # (profiled latency only: a constant model's `overhead_ms` is the whole host time it is asked to charge)
        host_cost = getattr(sched, "host_cost", None) if overhead_of is not None else None
        host_floor: float = host_cost.exposed_ms / 1e3 if host_cost is not None else 0.0
        bcast_s: float = getattr(self.latency, "broadcast_s", 0.0)
        noise = self.noise
        horizon = self.horizon_s
        idle_turns = 0
        prev_gpu_s = 0.0  # the GPU time of the previous iteration (overlapped host work hides under it)
        k = 0
        # a policy that declares it never changes the chunk is not shown a view every iteration,
        # nor one that declares it decides only every n-th step at the others
        decide = None if getattr(self.policy, "never_decides", False) else self.policy.decide
        every = getattr(self.policy, "decides_every_steps", 1)
        stage_times = self.latency.stage_times
        while True:
            now: float = env._now  # (what SimPy's `now` property returns, read without its Python frame)
            if horizon and now >= horizon:
                break
            if self.guard is not None and (self.guard.reason or (k % SLOGuard.CHECK_EVERY == 0 and self.guard.check(now))):
                self.status, self.reason = self.guard.outcome, self.guard.reason
                break
            if fixed:
                while next_s <= now:
                    sched.add_waiting(queue.popleft())
                    next_s = queue[0].arrival_s if queue else INF
            else:
                while queue and queue[0].arrival_s <= now:
                    sched.add_waiting(queue.popleft())
            if sched.is_idle() and not any(inflight):
                # NOTE: the artifact's idle path resets the token-ratio estimate.
                sched.new_token_ratio = INIT_NEW_TOKEN_RATIO
                prev_gpu_s = 0.0
                if queue:
                    wake = queue[0].arrival_s
                    if horizon and wake > horizon:
                        yield env.timeout(horizon - now)
                        break
                    yield env.timeout(wake - now)
                elif self.inbox.closed:
                    break
                else:
                    yield self.inbox.wait()
                continue
            slot = k % P
            if decide is not None and self.step % every == 0:
                decision = decide(self._view(now, slot))
                if decision is not None:
                    self._apply_decision(decision, now, slot)
            kv_used = sched.kv_capacity - sched.kv_free  # (sched.kv_used(), inlined)
            kv_active = kv_used - sched.kv_evictable()
            try:
                mb = sched.form_batch(slot, now, self._rebalance_at(now) if self.rebalancer else None)
            except RunFailed as exc:
                self.status, self.reason = "failed", str(exc)
                break
            if mb is not None:
                mb.stage_s = stage_times(mb.stats)
                idle_turns = 0
            inflight.pop()  # (None: the last stage's micro-batch left at the previous iteration's end)
            inflight.insert(0, mb)
            if mb is None and not any(inflight):
                # NOTE: the artifact's idle path resets the token-ratio estimate (SGLang 0.5.23
                # resets it only when fully idle: above).
                if sched.reset_ratio_on_empty_batch:
                    sched.new_token_ratio = INIT_NEW_TOKEN_RATIO
                running = any(sl.running for sl in sched.slots)
                if not running and sched.chunked is None and (sched.waiting or sched.pending):
                    idle_turns += 1
                    if idle_turns > 2 * P:
                        self.status = "failed"
                        if sched.waiting:
                            r = sched.waiting[0]
                            self.reason = (f"stuck at t={now:.3f}s: request {r.rid} ({r.fill_len} prompt tokens) "
                                           f"cannot be admitted into a KV pool of {sched.kv_capacity} tokens")
                        else:
                            self.reason = (f"stuck at t={now:.3f}s: {len(sched.pending)} requests paused by the "
                                           f"rebalancer and nothing running")
                        break
            # NOTE: models without a per-batch host cost charge the constant overhead on every turn
            if host_cost is not None and mb is not None:
                host_s: float = host_cost.host_s(mb.stats) + bcast_s
            else:
                host_s = overhead if overhead_of is None else overhead_of(mb.stats if mb is not None else None)
            if sched.overlap_host and mb is not None:
                # SGLang's overlap scheduler, vLLM's async scheduling: the host work for this step
                # ran while the GPU computed the previous one (event_loop_overlap: launch batch k,
                # then process k - 1's result and schedule k + 1), so only what exceeds that step's
                # GPU time remains on the critical path; after an idle turn none of it is hidden
                host_s = max(host_floor, host_s - prev_gpu_s)
            if noise is not None:
                self.factors, stall_s = noise.next()
                host_s += stall_s
            self._host_s = host_s
            # the stages start once the host time is paid, each on the micro-batch that entered
            # stage 0 at iteration k - s; the iteration ends at the slowest one's finish (the same
            # floats, start + busy, as one timeout per stage started at the stages' start)
            factors = self.factors
            top = 0.0  # max(busy), kept as the builtin keeps it (the first of the largest): the
            # builtin's argument parsing cost more than the rest of this loop
            for s in range(P):
                m = inflight[s]
                b = m.stage_s[s] * factors[s] if m is not None else 0.0
                busy[s] = b
                if s == 0 or b > top:
                    top = b
            end = (now + (host_s if host_s > 0 else 0.0)) + top
            if alone:
                # run alone (`run_alone`): the end time itself is handed over and the clock set to
                # it, no SimPy event made, scheduled and popped per iteration (the same float)
                yield end
            else:
                done = env.event()
                _trigger_at(env, done, end)
                yield done
                end = env._now
            prev_gpu_s = top if mb is not None else 0.0  # (max(self.busy): unchanged since)
            self._record(k, slot, now, end, mb, kv_used, kv_active)
            if mb is not None:
                self.step += 1
                if self._observe is not None:
                    infos = [batch_info(m, sched) if m is not None else None for m in inflight]
                    self._observe(self._view(end, slot), infos[0], infos, end - now)
            out = inflight[P - 1]
            if out is not None:
                inflight[P - 1] = None  # it has left the pipeline
                sched.process_result(out, end)
            k += 1

    def _view(self, now: float, slot: int) -> SchedulerView:
        return SchedulerView(self.sched, now, slot, self.step, self.start_s, self.tpot_signal_s,
                             self.rebalance_metrics)

    def _apply_decision(self, decision, now: float, slot: int) -> None:
        sched = self.sched
        if decision.tpot_signal_s is not None:
            self.tpot_signal_s = decision.tpot_signal_s
        # NOTE: sync_chunk_size publishes (tpot, waiting prompt tokens, kv free) to every rank.
        self.rebalance_metrics = (self.tpot_signal_s, sched.waiting.prompt_tokens,
                                  sched.kv_free / sched.kv_capacity)
        if decision.chunk != sched.chunk_size:
            self.decisions.append((now, slot, sched.chunk_size, decision.chunk, decision.reason))
            sched.chunk_size = decision.chunk

    def _rebalance_at(self, now: float):
        def rebalance(slot: int):
            moves = self.rebalancer.rebalance(self._view(now, slot))
            for m in moves:
                self.move_log.append((now, slot, m.req_id, "pause" if m.to_pending else "resume",
                                      "head" if m.at_head else "tail"))
            return moves

        return rebalance

    @property
    def iters(self) -> dict:
        """Column name -> typed column of this pipeline's iterations (see records.py)."""
        return self.log.columns

    @property
    def stage_busy(self) -> Any:
        return self.log.stage_busy

    def _record(self, k: int, slot: int, start: float, end: float, mb: MicroBatch | None, kv_used: int,
                kv_active: int) -> None:
        sched = self.sched
        used = sched.kv_capacity - sched.kv_free
        if used > self.kv_peak or kv_used > self.kv_peak:
            self.kv_peak = max(self.kv_peak, used, kv_used)
        active = used - sched.kv_evictable()
        if active > self.kv_peak_active or kv_active > self.kv_peak_active:
            self.kv_peak_active = max(self.kv_peak_active, active, kv_active)
        if mb is None:
            self.log.record(k, slot, start, end, "idle", 0, 0, 0, 0, sched.chunk_size, used, len(sched.waiting),
                            sched.num_active, self._host_s, self.busy)
        else:
            st = mb.stats
            self.log.record(k, slot, start, end, mb.mode, st.prefill_tokens + st.num_decode, st.prefill_tokens,
                            st.num_prefill, st.num_decode, sched.chunk_size, used, len(sched.waiting),
                            sched.num_active, self._host_s, self.busy)
