"""Delay scheduling: the artifact's worked examples and the move orders (system model 5)."""

from __future__ import annotations

import pytest

from sim.core.errors import ConfigError
from sim.policies import rebalancers
from sim.policies.delay import DelayScheduling
from test_policies_fakes import FakeView, apply_moves, batch, ctx, running

NO_HEADROOM = (0.10, 0, 0.5)  # (tpot signal, waiting prompt tokens, kv free): E2E_FIRST
HEADROOM = (0.10, 2000, 0.5)
TPOT_TIGHT = (0.19, 0, 0.5)  # >= 0.9 * 0.2: TPOT_FIRST


def make(pp: int, **kw) -> DelayScheduling:
    return rebalancers.build("delay-scheduling", context=ctx(pp=pp), **kw)


def view(pp, run_ids, pend_ids, metrics, batches=None) -> FakeView:
    return FakeView(num_slots=pp, running_reqs=running(run_ids), pending_reqs=running(pend_ids),
                    rebalance_metrics=metrics, batches=batches)


def test_case1_grows_running_to_the_tier():
    """pp = 1, N = 150: 5 running, 145 paused, no headroom: th = 128, the batch grows to 128."""
    rb = make(1)
    run_ids, pend_ids = list(range(5)), list(range(100, 245))
    moves = rb.rebalance(view(1, run_ids, pend_ids, NO_HEADROOM))
    assert rb.last_case == "case1" and len(moves) == 123 and all(not m.to_pending for m in moves)
    new_run, new_pend = apply_moves(moves, run_ids, pend_ids)
    assert len(new_run) == 128 and new_pend == list(range(100, 122))
    # E2E_FIRST resumes the longest-paused (pending tail) and prepends them, in order
    assert new_run == list(range(122, 245)) + run_ids


def test_headroom_goes_to_case2_and_nothing_moves():
    """pp = 1, all 150 running, headroom: Case 2 with desired 150 and limit 256."""
    rb = make(1)
    assert rb.rebalance(view(1, range(150), [], HEADROOM)) == []
    assert rb.last_case == "case2"


def test_case2_preempts_above_the_limit():
    """pp = 2, N = 360 all running in this slot, no headroom: limit 256, 104 preempted."""
    rb = make(2)
    run_ids = list(range(360))
    moves = rb.rebalance(view(2, run_ids, [], NO_HEADROOM))
    assert rb.last_case == "case2" and len(moves) == 104 and all(m.to_pending for m in moves)
    new_run, new_pend = apply_moves(moves, run_ids, [])
    assert len(new_run) == 256
    assert new_pend == list(range(104))  # E2E_FIRST: the newest (running head), in order


def test_tpot_first_preempts_the_oldest_and_appends_on_resume():
    rb = make(2)
    run_ids = list(range(360))
    new_run, new_pend = apply_moves(rb.rebalance(view(2, run_ids, [], TPOT_TIGHT)), run_ids, [999])
    assert new_pend == list(range(256, 360)) + [999]  # the running tail (oldest) to the pending head
    assert new_run == list(range(256))
    # resume: the pending tail, appended to the running tail in order
    rb = make(1)
    moves = rb.rebalance(view(1, range(5), range(100, 245), TPOT_TIGHT))
    new_run, _ = apply_moves(moves, list(range(5)), list(range(100, 245)))
    assert new_run == list(range(5)) + list(range(122, 245))


def test_mode_override_and_local_signals():
    run_ids = list(range(360))
    moves = make(2, mode="tpot_first").rebalance(view(2, run_ids, [], NO_HEADROOM))
    assert apply_moves(moves, run_ids, [])[1][0] == 256
    moves = make(2, mode="e2e_first").rebalance(view(2, run_ids, [], TPOT_TIGHT))
    assert apply_moves(moves, run_ids, [])[1][0] == 0
    # no published metrics: the view's tpot signal (0.1 s with a static chunk) -> E2E_FIRST
    v = view(2, run_ids, [], None)
    assert apply_moves(make(2).rebalance(v), run_ids, [])[1][0] == 0


def test_request_count_uses_other_slots_and_cut_chunks():
    """pp = 2, current slot 0: 300 running here; slot 1's last batch has 100 requests, one of
    them a cut chunk: N = 300 + 99 = 399 -> Case 2 (>= 256 + 102.4), desired 199, limit 256."""
    rb = make(2)
    run_ids = list(range(300))
    moves = rb.rebalance(view(2, run_ids, [], NO_HEADROOM, batches=[batch(0, 280), batch(1, 100, cut=True)]))
    assert len(moves) == 44  # 300 - 256
    # N = 300 + 55 = 355 < 358.4: Case 1 band, target 256/2 = 128 per micro-batch
    moves = rb.rebalance(view(2, run_ids, [], NO_HEADROOM, batches=[None, batch(1, 56, cut=True)]))
    assert rb.last_case == "case1" and len(moves) == 172


def test_nothing_to_do_and_bad_params():
    assert make(4).rebalance(view(4, [], [], NO_HEADROOM)) == []
    with pytest.raises(ConfigError):
        make(4, mode="fastest")
    assert isinstance(make(4), DelayScheduling)
