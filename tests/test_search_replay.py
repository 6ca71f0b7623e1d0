"""benchmarks/search_replay.py: the plain hint of each hinted search, and the runs a replay counts
(hand counts on a few recorded searches)."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import search_replay  # noqa: E402


def rec(seed: int, scale: float, hint, goodput: float, scheme: str = "TP") -> dict:
    return {"exp": "fig12", "label": {"scheme": scheme, "seed": seed, "slo_scale": scale}, "hint": hint,
            "rates": list(range(1, 11)), "window_s": 0.0, "max_rate": 10.0, "tol": 0.05, "goodput": goodput,
            "runs": 0}


def test_plain_hints_are_the_first_seed_and_the_scaled_loosest_scale():
    recs = [rec(1, 1.0, None, 4.0), rec(1, 0.5, 2.2, 1.5), rec(2, 1.0, 4.0, 5.0), rec(2, 0.5, 1.9, 1.0),
            rec(1, 1.0, None, 8.0, scheme="PP_2048")]
    # seed 1 at scale 0.5: 4.0 x 0.5; seed 2 at 1.0: seed 1's 4.0; seed 2 at 0.5: seed 1's 1.5 there
    assert search_replay.plain_hints(recs) == {1: (2.0, "tighter SLO"), 2: (4.0, "other seeds"),
                                               3: (1.5, "other seeds")}


def test_a_replay_counts_the_rates_each_strategy_runs():
    r = rec(2, 1.0, 3.0, 5.0)
    # gallop 0.4 from 3.0: 3.0, 3.4, 4.2, 5.8 (fails), then 5.0, 5.4, 5.2, 5.1, 5.05 (tests/test_sweep.py)
    assert search_replay.replay(r, 3.0, 0.4) == 9
    # climb from 3: 3, 4 pass; 5, 6 (6 fails); the bracket [5, 6] takes 4 or 5 probes: 5.5, 5.25, 5.1,
    # 5.05 fail (20 cells: 10, 5, 2, 1)
    assert search_replay.replay(r, 3.0, None) == 4 + 4
    with pytest.raises(SystemExit, match="replayed to"):
        search_replay.replay({**r, "goodput": 5.0, "max_rate": 4.0}, 3.0, 0.4)
