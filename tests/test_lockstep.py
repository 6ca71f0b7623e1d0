"""One simulation for several SLOs (sim/engine/lockstep.py): a run stands for a sibling SLO
only when it is exactly that SLO's own run."""

from __future__ import annotations

import json

import pytest

from sim.engine.lockstep import Lockstep, LockstepChunkPolicy, LockstepGuard, LockstepRebalancer
from sim.policies.base import ChunkDecision, Move
from sim.core.schemes import scheme_table
from sim.studies.sweep import Runner, evaluate, evaluate_siblings, point_id

SCALES = (1.0, 0.8, 0.5, 0.3)


def siblings(scheme, rate, num=120, workload="azure-conv-synth", model="qwen2.5-32b"):
    out = []
    for sc in SCALES:
        t = scheme_table(scheme, model, {"name": workload, "num_requests": num, "rate_rps": rate}, seed=3,
                         slo_scale=sc)
        if sc != 1.0:
            t["slo"]["stop_when_violated"] = True
        out.append(t)
    return out


def same(a, b):
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_served(scheme, rate):
    tables = siblings(scheme, rate)
    sib = evaluate_siblings(tables)
    own = [evaluate(t) for t in tables]
    assert sib[0] is not None and same(sib[0], own[0])
    for s, o in zip(sib[1:], own[1:]):
        if s is not None:
            assert same(s, o)
    return sib, own


@pytest.mark.parametrize("scheme,rate", [("DCP_pred", 1.0), ("DCP_greedy", 6.0), ("DCP_pred+DS", 6.0)])
def test_a_served_sibling_is_exactly_its_own_run(scheme, rate):
    check_served(scheme, rate)


def test_low_load_is_shared_and_stopped_or_diverged_siblings_are_not():
    sib, own = check_served("DCP_pred", 1.0)
    # at 1 req/s no decision reads the SLO differently: every sibling that runs to its end is served
    assert [s is not None for s in sib] == [o["status"] != "stopped" for o in own]
    assert sum(s is not None for s in sib) >= 3
    sib, own = check_served("DCP_greedy", 6.0)
    # a sibling whose own run stops early cannot be stood for by a run that did not stop
    for s, o in zip(sib[1:], own[1:]):
        if o["status"] == "stopped":
            assert s is None
    assert any(s is None for s in sib)


def test_runner_groups_siblings_and_matches_separate_runs():
    tables = siblings("DCP_greedy", 6.0) + siblings("DCP_pred", 1.0)
    grouped = Runner(None, jobs=1, progress=False).run(tables)
    separate = [evaluate(t) for t in tables]
    assert all(same(a, b) for a, b in zip(grouped, separate))
    runner = Runner(None, jobs=1, progress=False)
    tasks = runner._tasks({point_id(t): t for t in tables})
    assert sorted(len(t) for t in tasks) == [4, 4]
    # the primary is the sibling that runs to the end (no early stop)
    assert all(tables[[point_id(x) for x in tables].index(t[0])]["slo"].get("stop_when_violated") is None
               for t in tasks)


# -- the wrappers, on fakes --

class Fake:
    def __init__(self, chunks, signal=0.1):
        self.chunks = list(chunks)
        self.signal = signal
        self.seen = []

    def initial_chunk(self):
        return 128

    def decide(self, view):
        self.seen.append(view.tpot_signal_s)
        c = self.chunks.pop(0)
        return None if c is None else ChunkDecision(c, "r", 0.0, self.signal)


class View:
    def __init__(self, chunk=128):
        self.chunk_size = chunk
        self._sched = None
        self.now_s, self.slot, self.step, self.start_s = 0.0, 0, 0, 0.0
        self.tpot_signal_s, self.rebalance_metrics = 0.05, None


def test_an_alternate_is_dropped_at_its_first_different_decision():
    st = Lockstep([0.02, 0.03], rebalanced=False)
    pol = LockstepChunkPolicy(Fake([None, 256, 256]), [Fake([128, 256, 512]), Fake([None, 256, 256])], st)
    for _ in range(3):
        pol.decide(View())
    # 128 == the chunk in force, so "no decision" and "keep 128" agree; 512 != 256 does not
    assert st.alive == [False, True]


def test_with_a_rebalancer_signals_and_moves_must_agree_too():
    st = Lockstep([0.02, 0.03], rebalanced=True)
    pol = LockstepChunkPolicy(Fake([256], signal=0.1), [Fake([256], signal=0.1), Fake([256], signal=0.2)], st)
    pol.decide(View())
    assert st.alive == [True, False]
    assert pol.alts[0].seen == [0.02]  # the alternate sees its own run's initial signal

    class Reb:
        def __init__(self, moves):
            self.moves = moves

        def rebalance(self, view):
            return self.moves

    st = Lockstep([0.02, 0.03], rebalanced=True)
    reb = LockstepRebalancer(Reb([Move(1, True, False)]), [Reb([Move(1, True, False)]), Reb([])], st)
    reb.rebalance(View())
    assert st.alive == [True, False]


def test_alternate_guards_are_checked_but_never_stop_the_run():
    class G:
        def __init__(self, trip):
            self.trip, self.reason, self.done = trip, "", 0

        def check(self, now):
            if self.trip:
                self.reason = "over"
            return bool(self.reason)

        def finished(self, req):
            self.done += 1

    g = LockstepGuard(None, [G(True), G(False), None])
    assert g.check(1.0) is False and g.reason == ""
    g.finished(object())
    assert g.tripped == [True, False, False]
    assert [a.done for a in g.alts[:2]] == [1, 1]


# -- chunk siblings: static-chunk runs that differ only in their chunk --

@pytest.mark.parametrize("workload,rate", [("azure-conv-synth", 1.0), ("azure-conv-synth", 8.0), ("sharegpt", 2.0)])
def test_a_served_chunk_sibling_is_exactly_its_own_run(workload, rate):
    tables = [scheme_table(f"PP_{c}", "qwen2.5-32b", {"name": workload, "num_requests": 150, "rate_rps": rate},
                           seed=2) for c in (2048, 1024, 512, 256, 128)]
    sib = evaluate_siblings(tables)
    own = [evaluate(t) for t in tables]
    for s, o in zip(sib, own):
        if s is not None:
            assert same(s, o)
    assert sib[0] is not None
    # a chunk below what some batch used is never served
    for s, c in zip(sib, (2048, 1024, 512, 256, 128)):
        if c <= 256 and workload == "azure-conv-synth":
            assert s is None


def test_chunk_siblings_at_low_load_are_served_and_grouped():
    tables = [scheme_table(f"PP_{c}", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 150, "rate_rps": 1.0},
                           seed=2) for c in (512, 1024, 2048)]
    runner = Runner(None, jobs=1, progress=False)
    tasks = runner._tasks({point_id(t): t for t in tables})
    assert len(tasks) == 1 and tasks[0][0] == point_id(tables[2])  # the largest chunk runs for real
    from sim.core.config import config_from_table
    from sim.engine.run import run

    ex = run(config_from_table(tables[2])).extras
    assert not ex["chunk_bound"] and 512 < ex["chunk_need"] <= 1024  # sharegpt prompts at 1 req/s
    sib = evaluate_siblings([tables[2], tables[1], tables[0]])
    assert [s is not None for s in sib] == [True, True, False]
    assert runner.run(tables) == [evaluate(t) for t in tables]


def test_with_replicas_no_slo_sibling_is_served():
    """Lock step runs one replica only: behind a router every SLO sibling runs on its own."""
    for scheme, workload in (("DCP_pred", "azure-conv-synth"), ("PP_2048", "sharegpt")):
        tables = siblings(scheme, 1.0, num=60, workload=workload)
        for t in tables:
            t["parallel"]["replicas"] = 2
        sib = evaluate_siblings(tables)
        assert sib[0] is not None and all(s is None for s in sib[1:])
        assert same(sib[0], evaluate(tables[0]))
