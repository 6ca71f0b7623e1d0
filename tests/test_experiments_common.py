"""The seed-folding helpers the figure experiments share (experiments/common.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.common import fold_seeds, statuses


def test_fold_seeds_means_and_named_cis_in_order():
    g = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [10, 10, 10], "status": ["ok", "stopped", "ok"]})
    row = fold_seeds(g, ("a", "b"), ci={"a": ("a_lo", "a_hi")})
    assert list(row) == ["a", "a_lo", "a_hi", "b"]
    # by hand: mean 2, sample sd 1, t(0.975, 2 dof) = 4.3027 -> half width 4.3027 / sqrt(3)
    half = 4.302652729911275 / math.sqrt(3)
    assert row["a"] == pytest.approx(2.0)
    assert (row["a_lo"], row["a_hi"]) == pytest.approx((2.0 - half, 2.0 + half))
    assert row["b"] == 10.0
    assert statuses(g) == "ok;stopped"


def test_fig13_length_ratios_by_hand():
    """TP's mean latency over a PP scheme's, per count and seed, then folded: two seeds at one count
    give ratios 2.0 and 4.0 (mean 3.0, min 2.0, max 4.0); the 'all' row folds every count and seed."""
    from experiments.fig13 import fold_ratios, ratio_rows

    means = pd.DataFrame([
        {"num_requests": 500, "seed": 1, "scheme": "TP", "ttft_ms": 100.0, "tpot_ms": 50.0, "e2e_ms": 900.0},
        {"num_requests": 500, "seed": 1, "scheme": "PP_2048", "ttft_ms": 50.0, "tpot_ms": 100.0, "e2e_ms": 900.0},
        {"num_requests": 500, "seed": 2, "scheme": "TP", "ttft_ms": 200.0, "tpot_ms": 50.0, "e2e_ms": 900.0},
        {"num_requests": 500, "seed": 2, "scheme": "PP_2048", "ttft_ms": 50.0, "tpot_ms": 25.0, "e2e_ms": 300.0},
        {"num_requests": 650, "seed": 1, "scheme": "TP", "ttft_ms": 30.0, "tpot_ms": 10.0, "e2e_ms": 10.0},
        {"num_requests": 650, "seed": 1, "scheme": "PP_2048", "ttft_ms": 30.0, "tpot_ms": 10.0, "e2e_ms": 10.0},
    ])
    ratios = ratio_rows(means)
    assert len(ratios) == 3 * 3  # three (count, seed) pairs, one PP scheme, three metrics
    folded = fold_ratios(ratios).set_index(["num_requests", "scheme", "metric"])
    ttft = folded.loc[("500", "PP_2048", "ttft")]
    assert (ttft["ratio"], ttft["min"], ttft["max"], ttft["num_runs"]) == (3.0, 2.0, 4.0, 2)
    assert folded.loc[("500", "PP_2048", "tpot"), "ratio"] == pytest.approx((0.5 + 2.0) / 2)
    everything = folded.loc[("all", "PP_2048", "ttft")]
    assert everything["ratio"] == pytest.approx((2.0 + 4.0 + 1.0) / 3)
    assert (everything["min"], everything["max"], everything["num_runs"]) == (1.0, 4.0, 3)
