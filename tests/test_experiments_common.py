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
