"""Compact iteration records (sim/engine/records.py) read back exactly what was recorded, and
the engine's speed-ups changed no number: a hand-checked latency sum and the memory test."""

from __future__ import annotations

import pytest

from sim.engine.records import COLUMNS, IterationLog
from sim.engine.schedulers.fastpp import PrefillAdder, Scheduler
from sim.engine.state import Req
from sim.latency.base import BatchStats
from sim.latency.profiled import Profile, ProfiledLatencyModel


def _row(k: int, mode: str) -> tuple:
    return (k, k % 2, 0.5 * k, 0.5 * k + 0.25, mode, 10 + k, k, 1, 9, 512, 1000 + k, 3, 7, 0.002 + k * 1e-6)


def test_log_reads_back_rows_across_blocks_and_merges_replicas():
    logs = []
    for rep, n in ((0, IterationLog.BLOCK + 3), (1, 5)):
        log = IterationLog(2)
        for k in range(n):
            log.record(*_row(k, "decode" if k % 3 else "idle"), [0.1 * k, 0.2 * k])
        assert len(log) == n
        logs.append(log)
    merged = IterationLog.merge(logs, 2)
    cols, busy = merged.columns, merged.stage_busy
    n0 = IterationLog.BLOCK + 3
    assert len(busy) == len(cols["iteration"]) == n0 + 5
    assert list(cols["replica"][n0 - 1:n0 + 1]) == [0, 1]
    row = n0 + 4  # replica 1, k = 4
    assert tuple(cols[c][row] for c in COLUMNS) == _row(4, "decode")
    assert busy[row] == (0.1 * 4, 0.2 * 4) and busy[-1] == busy[row]
    assert busy[:2] == [(0.0, 0.0), (0.1, 0.2)]
    assert cols["mode"][0] == "idle" and list(cols["mode"])[1] == "decode"
    assert busy.to_numpy().shape == (n0 + 5, 2)


def test_stage_times_equal_the_sum_of_stage_time_parts():
    """The cached fast path is bit for bit the protocol's StepTime total, stage by stage."""
    prof = Profile.load("profiles/a100-pcie-40gb/qwen2.5-32b/tp1")
    m = ProfiledLatencyModel(prof, 4)
    for st in (BatchStats(300, 2, 300 * 300 - 2 * 150 * 150, 150 * 40, 12, 12 * 1500), BatchStats.decode(64, 900),
               BatchStats.prefill(512, 1024), BatchStats()):
        assert m.stage_times(st) == tuple(m.stage_time(st, s).total_s for s in range(4))


def _req(rid: int, prompt: int, out: int, done: int) -> Req:
    r = Req(rid, 0.0, prompt, out, 10_000, 20_000)
    r.out_len = done
    return r


@pytest.mark.parametrize("cur_rem, expect", [(71, True), (70, False), (1000, True)])
def test_memory_test_by_hand(cur_rem, expect):
    """Two running requests (tokens left 5 and 20, a 0 margin at one slot; contexts 100 and 50)
    and a new request (prompt 40, 10 tokens left): sorted by tokens left, (5, 100), (10, 40),
    (20, 50); with rem = cur_rem - 40 the walk needs rem + freed_i - steps_i * (n - i) > 0:
    i=0: rem - 10*3, i=1: rem + 100 - 20*2, i=2: rem + 140 - 20*1; the first binds: rem > 30."""
    sched = Scheduler(1, 10_000, 64, 4096)
    sched.slots[0].running = [_req(1, 95, 10, 5), _req(2, 30, 40, 20)]
    adder = PrefillAdder(sched, 0)
    adder.cur_rem = cur_rem
    assert adder._passes_memory_test(_req(3, 40, 10, 0)) is expect


def test_trigger_at_fires_like_a_timeout():
    """The pipeline's inlined schedule (`_trigger_at`) puts an event on SimPy's queue exactly
    where `env.timeout` would: same time, and ties in creation order."""
    import simpy

    from sim.engine.pipeline import _trigger_at

    env = simpy.Environment(initial_time=0.1)
    fired = []
    for i, delay in enumerate((0.1, 0.1, 0.3, 0.0, 0.2)):
        if i % 2:
            ev = env.event()
            _trigger_at(env, ev, env.now + delay)
        else:
            ev = env.timeout(delay)
        ev.callbacks.append(lambda e, i=i: fired.append((i, env.now, e.value)))
    env.run()
    assert fired == [(3, 0.1, None), (0, 0.1 + 0.1, None), (1, 0.1 + 0.1, None), (4, 0.1 + 0.2, None),
                     (2, 0.1 + 0.3, None)]


def test_a_pipeline_run_alone_is_the_run_on_simpys_dispatch():
    """`Pipeline.run_alone` (one replica: no other process on the clock; each iteration's end
    handed over as a time, no SimPy event) gives the run that `env.run()` dispatching the same
    pipeline's events gives, iteration for iteration."""
    import simpy

    from sim.core.config import config_from_table
    from sim.engine import run as engine_run
    from sim.engine.pipeline import Pipeline

    t = {"seed": 3, "scheduler": {"chunk_size_tokens": 512},
         "latency": {"kind": "profile", "profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp4"},
         "parallel": {"pp": 4, "tp": 4}, "workload": {"name": "sharegpt", "num_requests": 120, "rate_rps": 6.0}}
    alone = engine_run.run(config_from_table(t))
    real = Pipeline.run_alone
    try:
        def on_simpy(self):  # what run_alone replaces: a process dispatched by env.run()
            self.alone = False  # (its loop then waits on SimPy events, not handing over end times)
            proc = self.env.process(self._scheduler())
            self.env.run(until=proc)
        Pipeline.run_alone = on_simpy
        dispatched = engine_run.run(config_from_table(t))
    finally:
        Pipeline.run_alone = real
    assert alone.end_s == dispatched.end_s
    assert alone.iterations["end_s"] == dispatched.iterations["end_s"]
    assert [r.finish_s for r in alone.requests] == [r.finish_s for r in dispatched.requests]
    assert simpy  # (the module the dispatch comes from)
