"""The probe window of a tail objective (sim.studies.sweep.tail_requests, issue 39): a plan's probe holds
enough requests that, past the first quarter of the load, the SLO's highest percentile rests on at least
20 requests beyond it (5 with --quick); checked against the formula by hand."""

from __future__ import annotations

import pytest

from sim.core.slo import SLO
from sim.studies.sweep import TAIL_SAMPLES, WARMUP_SHARE, hold_tail, tail_requests


def test_the_rule_by_hand():
    assert (TAIL_SAMPLES, WARMUP_SHARE) == (20, 0.25)
    # n >= 20 / ((1 - p/100) x 0.75): P90 266.67 -> 267; P99 2666.67 -> 2667; P50 53.3 -> 54
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50)) == 267
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50, ttft_percentile=99)) == 2667
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50, ttft_percentile=50, tpot_percentile=50)) == 54
    # the highest percentile decides, the e2e one only when an e2e objective is set
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50, tpot_percentile=95)) == 534  # 20 / 0.0375 = 533.3
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50, e2e_percentile=99.9)) == 267
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50, e2e_ms=9000, e2e_percentile=99.9)) == 26667
    # --quick: 5 samples, P99 666.67 -> 667, P90 66.67 -> 67
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50, ttft_percentile=99), quick=True) == 667
    assert tail_requests(SLO(ttft_ms=1000, tpot_ms=50), quick=True) == 67
    # at the bound itself: 10 samples at P98 over 0.75 -> 20 / (0.02 x 0.75) = 1333.3 -> 1334
    assert tail_requests(SLO(ttft_ms=1, tpot_ms=1, ttft_percentile=98)) == 1334


def test_hold_tail_raises_only_short_probes():
    p99 = SLO(ttft_ms=2000, tpot_ms=200, ttft_percentile=99)
    wl = {"name": "azure-conv-synth", "num_requests": 400, "rate_rps": 4.0}
    note = hold_tail(wl, p99)
    assert wl["num_requests"] == 2667 and "2667 requests (were 400)" in note and "P99" in note
    assert hold_tail(wl, p99) == "" and wl["num_requests"] == 2667  # enough already: unchanged
    long = {"num_requests": 9000}
    assert hold_tail(long, p99) == "" and long["num_requests"] == 9000
    # sessions of 4 requests each: ceil(2667 / 4) = 667 sessions
    conv = {"kind": "conversation", "num_sessions": 50}
    hold_tail(conv, p99, per_unit=4.0)
    assert conv["num_sessions"] == 667
    # a table without a size (a trace replayed whole) is left alone
    trace = {"kind": "trace", "file": "x.csv"}
    assert hold_tail(trace, p99) == "" and "num_requests" not in trace


def test_percentile_out_of_range_is_refused():
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match="allowed 0 < p < 100"):
        tail_requests(SLO(ttft_ms=1, tpot_ms=1, ttft_percentile=100))


def test_a_size_the_user_set_is_kept_with_a_warning():
    p99 = SLO(ttft_ms=2000, tpot_ms=200, ttft_percentile=99)
    wl = {"num_requests": 40}
    note = hold_tail(wl, p99, quick=True, asked=True)
    assert wl["num_requests"] == 40
    assert note.startswith("workload.num_requests=40 kept as --set asks, below the 667")
