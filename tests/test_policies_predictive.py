"""ALP's decision: throughput and TPOT bounds, fallbacks, watermark, projection (system model 4)."""

from __future__ import annotations

import math

import pytest

from sim.engine.view import ChunkedInfo
from sim.policies import chunk_policies
from sim.policies.predictive import PredictiveChunk
from test_policies_fakes import FakeView, batch, ctx, waiting


def linear(c: int) -> float:
    """A start-up table: 20 ms + 20 us per token (4 T <= 0.21 s holds up to c = 1625)."""
    return 0.020 + 2e-5 * c


def make(profile=linear, pp=4, **kw) -> PredictiveChunk:
    return PredictiveChunk(context=ctx(pp=pp, profile=profile), **kw)


def worked_view(**kw) -> FakeView:
    """5,000 tok/s of arrivals over the last 10 s; 5,000 stale prompt tokens whose mean wait
    is 0.5 s; one fresh request (0.1 s) that does not count as stale."""
    now = 20.0
    arrivals = [(now - 10 + 0.5 * i, 2500) for i in range(20)]  # 50,000 tokens in the window
    arrivals.insert(0, (now - 10.5, 99_999))  # outside the window
    wq = [waiting(1, now - 0.5, 2000), waiting(2, now - 0.5, 3000), waiting(3, now - 0.1, 700)]
    return FakeView(now_s=now, start_s=0.0, arrivals=arrivals, waiting_reqs=wq, **kw)


def test_worked_example_required_throughput():
    pol = make()
    view = worked_view()
    assert pol.arrival_rate(view) == pytest.approx(5000.0)
    d = pol.decide(view)
    assert pol.last_required_tok_s == pytest.approx(5000 + 5000 / 1.5)  # 8,333 tok/s
    # capacity c / T0(c): 128 -> 5,674; 256 -> 10,191 tok/s: the smallest feasible is 256
    assert (d.chunk, d.reason) == (256, "Optimal")


def test_arrival_window_is_short_at_start():
    pol = make()
    # system start = first arrival - 1.5 s; W' = min(10, 1.0 + 1.5) = 2.5 s
    view = FakeView(now_s=1.0, start_s=0.0, arrivals=[(0.0, 1000), (0.5, 1500)])
    assert pol.arrival_rate(view) == pytest.approx(2500 / 2.5)
    assert make(start_lead_s=0.5).arrival_rate(view) == pytest.approx(2500 / 1.5)


def test_fresh_epsilon_boundary_and_infinite_catch_up():
    pol = make()
    now = 10.0
    # wait exactly 0.5 s counts as stale (>=)
    backlog = [(0.5, 1000), (0.49, 5000)]
    assert pol.required_throughput(FakeView(now_s=now), backlog) == pytest.approx(1000 / 1.5)
    # mean stale wait 1.85 s: the budget 0.15 s <= SLO_TPOT, the catch-up term is infinite
    assert math.isinf(pol.required_throughput(FakeView(now_s=now), [(1.8, 10), (1.9, 10)]))
    assert pol.required_throughput(FakeView(now_s=now), []) == 0.0


def test_best_effort_is_largest_tpot_safe_chunk():
    pol = make()
    view = FakeView(now_s=10.0, waiting_reqs=[waiting(1, 8.05, 100)])  # wait 1.95 s: Req = inf
    d = pol.decide(view)
    assert (d.chunk, d.reason) == (1536, "Best_Effort")  # 4 * T0(1536) = 0.2029 <= 0.21 < 4 * T0(1664)
    # the pre-3c59fc8 TPOT coefficient 1.08 allows T <= 54 ms: 1664
    assert make(tpot_coef=1.08).decide(view).chunk == 1664


def test_fail_slo_exec_time_and_missing_table():
    view = FakeView(now_s=10.0, chunk_size=512, waiting_reqs=[waiting(1, 9.0, 100)])
    d = make(profile=lambda c: 0.06).decide(view)  # 4 x 60 ms > 210 ms even at 128
    assert (d.chunk, d.reason) == (128, "Fail_SLO_ExecTime")
    d = make(profile=lambda c: math.nan if c == 2048 else 0.01).decide(view)  # one infeasible: no table
    assert (d.chunk, d.reason) == (512, "no_prediction")
    d = make(profile=None).decide(view)
    assert (d.chunk, d.reason) == (512, "no_prediction")


def test_cadence_and_empty_check_does_not_drain():
    pol = make()
    view = FakeView(step=4, chunk_size=512, ttft=[1.5], tpot=[0.3])
    assert pol.decide(view) is None  # every 2 * pp = 8 steps
    view.step = 8
    d = pol.decide(view)  # nothing waiting, nothing chunked
    assert (d.chunk, d.reason) == (512, "idle")
    assert pol.signals.tpot == pytest.approx(0.1)  # stale: not drained
    view.waiting_reqs = [waiting(1, 9.9, 100)]
    pol.decide(view)
    assert pol.signals.tpot == pytest.approx(0.3) and pol.signals.ttft == pytest.approx(1.5)
    assert make(decide_every_steps=1).decide(FakeView(step=3, waiting_reqs=[waiting(1, 9.9, 100)])) is not None


def test_watermark_counts_exclude_the_cut_request():
    pol = make()
    # slot 0 holds 64 requests, one of them the cut chunk: r_0 = 63 -> 128*((63+64)//128 + 1) = 128
    batches = [batch(0, 64, mode="mixed", cut=True), batch(1, 200), batch(2, 200), batch(3, 200)]
    view = FakeView(chunk_size=1024, kv_free_tokens=5_000, kv_capacity_tokens=100_000, batches=batches,
                    waiting_reqs=[waiting(1, 9.0, 100)])
    d = pol.decide(view)
    # watermark 128, then the safety guard: 128 <= 200 -> 128*(200//128 + 1) = 256
    assert (d.chunk, d.reason) == (256, "watermark+safety_guard")


def queue(view):
    _arrivals, prefixes, remaining = view.waiting_columns()
    return list(zip(prefixes, remaining))


def test_queue_head_keeps_the_requests_the_projection_can_reach():
    """pp = 2, largest candidate 2048: the stages take at most 4096 tokens from the queue."""
    pol = make(pp=2)
    assert max(pol.candidates) == 2048
    prefixes, remaining = [0, 5, 0, 0, 0], [1000, 3000, 96, 1, 700]
    assert pol.queue_head(prefixes, remaining) == [(0, 1000), (5, 3000), (0, 96)]  # 4,096 reached
    assert pol.queue_head(prefixes[:2], remaining[:2]) == [(0, 1000), (5, 3000)]
    assert pol.queue_head([], []) == []
    # the projection over the head is the projection over the whole queue, at every candidate
    view = FakeView(num_slots=2, waiting_reqs=[waiting(i, 9.0, r, p) for i, (p, r) in enumerate(zip(prefixes, remaining))])
    whole, head = queue(view), pol.queue_head(prefixes, remaining)
    for c in pol.candidates:
        assert pol.projection(view, view.last_batches(), None, head)(c) == \
            pol.projection(view, view.last_batches(), None, whole)(c)


def test_projection_of_candidate_features():
    """pp = 2, current slot 0, the chunked request's latest chunk in slot 1 (prefix 256, 1000
    left), slot 0's last batch has 10 decodes (context 5,000), one waiting 300-token prompt."""
    chunked = ChunkedInfo(7, 1, 0.0, 256, 1000)
    batches = [batch(0, 10, decode_ctx=5000), None]
    view = FakeView(num_slots=2, slot=0, chunked_req=chunked, batches=batches, waiting_reqs=[waiting(1, 9.0, 300)])
    feats = make(pp=2).projection(view, batches, chunked, queue(view))(512)
    # artifact: both stage 0 (its previous slot holds the chunk) and stage 1 (its own) take the chunk
    assert feats == pytest.approx((2500, (502**2 + 512**2) / 2, (502 * 256 + 512 * 256) / 2))
    feats = make(pp=2, chunked_first_stage_only=True).projection(view, batches, chunked, queue(view))(512)
    assert feats == pytest.approx((2500, (502**2 + 300**2) / 2, 502 * 256 / 2))


def test_projection_shares_the_queue_cursor():
    """pp = 2, no chunked request: a 700-token prompt is split over both stages at chunk 512."""
    pol = make(pp=2)
    view = FakeView(num_slots=2, waiting_reqs=[waiting(1, 9.0, 700), waiting(2, 9.0, 100)])
    feats = pol.projection(view, view.last_batches(), None, queue(view))(512)
    assert feats == pytest.approx((0, (512**2 + 188**2 + 100**2) / 2, 188 * 512 / 2))


def test_registered():
    pol = chunk_policies.build("predictive", context=ctx(pp=4, profile=linear))
    assert pol.every == 8 and pol.initial_chunk() == 128
    assert pol.predictor.table[2048] == pytest.approx(linear(2048))
