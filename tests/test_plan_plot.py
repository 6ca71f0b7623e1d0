"""plan.png (sim/studies/plan_plot.py): points on the ranking's basis, the frontier the chosen one sits on, and
a complete PNG from any plan table (issue 39)."""

import math

import pandas as pd
import pytest

from sim.studies.plan_plot import bar_values, frontier, frontier_steps, plot_plan, plot_points
from sim.studies.verdict import rank


def _png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rate_points_frontier_and_the_chosen_one_by_hand():
    # 100 output tokens per request at 6 req/s: y = 600 / GPUs; x = margin in %
    rows = [
        {"deployment": "A", "status": "ok", "gpus": 4, "margin": 0.10, "margin_ci_lo": 0.05, "margin_ci_hi": 0.15,
         "meets_slo": True, "cost_per_hour": 4.0, "mean_tpot_ms": 30.0},            # (10, 150)
        {"deployment": "B", "status": "ok", "gpus": 4, "margin": 0.30, "margin_ci_lo": 0.29, "margin_ci_hi": 0.31,
         "meets_slo": True, "cost_per_hour": 4.0, "mean_tpot_ms": 40.0},            # (30, 150): chosen
        {"deployment": "C", "status": "ok", "gpus": 8, "margin": 0.50, "margin_ci_lo": 0.45, "margin_ci_hi": 0.55,
         "meets_slo": True, "cost_per_hour": 8.0, "mean_tpot_ms": 10.0},            # (50, 75): on the frontier
        {"deployment": "D", "status": "ok", "gpus": 8, "margin": 0.20, "margin_ci_lo": 0.1, "margin_ci_hi": 0.3,
         "meets_slo": True, "cost_per_hour": 8.0, "mean_tpot_ms": 10.0},            # (20, 75): dominated by B
        {"deployment": "E", "status": "ok", "gpus": 2, "margin": -0.25, "margin_ci_lo": -0.3, "margin_ci_hi": -0.2,
         "meets_slo": False, "cost_per_hour": 2.0, "mean_tpot_ms": 60.0},           # misses: (-25, 300), hollow
        {"deployment": "F", "status": "ok", "gpus": 2, "margin": -math.inf, "meets_slo": False,
         "cost_per_hour": 2.0},                                                     # failed: (-100, 300)
        {"deployment": "G", "status": "estimated", "gpus": 2, "screen_margin": 0.33, "meets_slo": math.nan,
         "cost_per_hour": 2.0},                                                     # screen: (33, 300), a cross
        {"deployment": "H", "status": "pruned", "gpus": 1, "reason": "overloaded"},
    ]
    df = rank(pd.DataFrame(rows), "rate")
    assert df.iloc[0]["deployment"] == "B"          # fewest GPUs meeting the SLOs, then margin
    pts = plot_points(df, "rate", 100.0, rate=6.0).set_index("deployment")
    assert "H" not in pts.index
    assert pts.loc["B", ["x", "y"]].tolist() == pytest.approx([30.0, 150.0])
    assert pts.loc["C", ["x", "y"]].tolist() == pytest.approx([50.0, 75.0])
    assert pts.loc["E", ["x", "y"]].tolist() == pytest.approx([-25.0, 300.0])
    assert pts.loc["F", "x"] == -100.0 and pts.loc["G", "x"] == pytest.approx(33.0)
    assert pts.loc["G", "kind"] == "estimated" and pts.loc["E", "kind"] == "simulated"
    # the frontier: B and C only (E, F miss; G is an estimate; A, D dominated); the chosen B is on it
    assert sorted(pts.index[pts["front"]]) == ["B", "C"]
    assert not pts.loc[["E", "F", "G"], "meets"].any()
    # the bars: margins in %, failing ones negative, the estimate at its screen margin
    bars = dict(zip(df["deployment"], bar_values(df, "rate")))
    assert bars["E"] == pytest.approx(-25.0) and bars["F"] == -100.0 and bars["G"] == pytest.approx(33.0)


def test_frontier_ties_in_y_go_to_the_better_rank():
    # equal y (same GPUs): the ranked-first point is on the frontier even at a lower x; a worse-ranked point at
    # the same y and x is not
    pts = pd.DataFrame({"x": [10.0, 20.0, 20.0, 5.0], "y": [100.0, 100.0, 100.0, 50.0],
                        "meets": [True, True, True, True], "rank": [1.0, 2.0, 3.0, math.nan]})
    assert frontier(pts).tolist() == [True, True, False, False]
    pts["meets"] = [False, True, True, True]
    assert frontier(pts).tolist() == [False, True, False, False]


def test_goodput_points_by_hand():
    rows = [{"deployment": "A", "status": "ok", "gpus": 4, "goodput_rps": 8.0, "goodput_ci_lo": 7.0,
             "goodput_ci_hi": 9.0, "mean_tpot_ms_at_80pct": 40.0, "cost_per_million_at_goodput": 1.0},
            {"deployment": "B", "status": "ok", "gpus": 4, "goodput_rps": 4.0, "goodput_ci_lo": 3.9,
             "goodput_ci_hi": 4.1, "mean_tpot_ms_at_80pct": 20.0, "cost_per_million_at_goodput": 2.0},
            {"deployment": "C", "status": "ok", "gpus": 4, "goodput_rps": 2.0, "goodput_ci_lo": 1.9,
             "goodput_ci_hi": 2.1, "mean_tpot_ms_at_80pct": 40.0, "cost_per_million_at_goodput": 4.0},
            {"deployment": "Z", "status": "ok", "gpus": 4, "goodput_rps": 0.0, "mean_tpot_ms_at_80pct": 5.0}]
    df = rank(pd.DataFrame(rows), "goodput")
    pts = plot_points(df, "goodput", 100.0).set_index("deployment")
    assert pts.loc["A", ["x", "y"]].tolist() == pytest.approx([25.0, 200.0])
    assert pts.loc["B", ["x", "y"]].tolist() == pytest.approx([50.0, 100.0])
    assert list(pts.index[pts["front"]]) == ["A", "B"] and not pts.loc["Z", "meets"]
    assert df.iloc[0]["deployment"] == "A"


def test_frontier_steps_corners_are_attained():
    f = pd.DataFrame({"x": [10.0, 20.0, 30.0], "y": [300.0, 200.0, 100.0]})
    xs, ys = frontier_steps(f)
    assert list(zip(xs, ys)) == [(10, 300), (10, 200), (20, 200), (20, 100), (30, 100)]


@pytest.mark.parametrize("case", ["empty", "no_status", "all_pruned", "estimated_only", "no_output_tokens"])
def test_any_plan_table_gives_a_png(tmp_path, case):
    """The tables that ended plotting in KeyError 'status' (issue 39): no rows, no status column, every
    candidate pruned, only screen estimates, no output tokens per request."""
    tables = {
        "empty": pd.DataFrame(),
        "no_status": pd.DataFrame([{"deployment": "a", "gpus": 4, "margin": 0.1}]),
        "all_pruned": rank(pd.DataFrame([{"deployment": "a", "status": "pruned", "reason": "overloaded", "gpus": 4},
                                         {"deployment": "b", "status": "dropped", "reason": "no profile",
                                          "gpus": 8}]), "rate"),
        "estimated_only": pd.DataFrame([{"deployment": "a", "status": "estimated", "gpus": 4, "screen_margin": 0.33,
                                         "meets_slo": math.nan, "rate_rps": 5.0}]),
        "no_output_tokens": rank(pd.DataFrame([{"deployment": "a", "status": "ok", "gpus": 4, "margin": 0.1,
                                                "meets_slo": True, "margin_ci_lo": 0.0, "margin_ci_hi": 0.2}]),
                                 "rate"),
    }
    for mode in ("rate", "goodput"):
        path = tmp_path / f"{mode}.png"
        plot_plan(tables[case], mode, "P90 TTFT <= 1000 ms", path, out_tokens=None if case == "no_output_tokens"
                  else 100.0, rate=5.0, rule="fewest GPUs")
        assert _png(path)


def test_a_hundred_candidates(tmp_path):
    """100 candidates: the plot names only the frontier (at most MAX_LABELS) and the chosen one."""
    import numpy as np

    from sim.studies import plan_plot

    rng = np.random.default_rng(1)
    rows = []
    for i in range(100):
        gpus = int(rng.choice([2, 4, 8, 16]))
        m = float(rng.uniform(-0.6, 0.6))
        rows.append({"deployment": f"pcie: {16 // gpus}x(TP{gpus}xPP1) least-loaded static-{i}", "status": "ok"
                     if i % 10 else "estimated", "gpus": gpus, "nodes": 1 + gpus // 16, "mode": "colocated" if i % 3
                     else "disaggregated", "margin": m, "margin_ci_lo": m - 0.05, "margin_ci_hi": m + 0.05,
                     "screen_margin": m, "meets_slo": m >= 0 if i % 10 else math.nan, "cost_per_hour": float(gpus)})
    df = rank(pd.DataFrame(rows), "rate")
    plot_plan(df, "rate", "P90 TTFT <= 1000 ms", tmp_path / "plan.png", out_tokens=200.0, rate=10.0)
    assert _png(tmp_path / "plan.png")
    pts = plot_points(df, "rate", 200.0, rate=10.0)
    named = plan_plot.point_labels(pts)
    assert int(pts["front"].sum()) >= 1 and 1 <= len(named) <= plan_plot.MAX_LABELS
    assert all(len(t) <= 4 for i, t in named.items() if not t.startswith("#1 "))  # "#12": short
    best = df[df["rank"] == 1].index[0]
    assert pts.loc[best, "front"] and named[best].startswith("#1 ")
    assert set(named) <= set(pts.index[pts["front"]])


def _summary(p90_ttft, p90_tpot, late_ttft=None, saturated=False, status="ok", finished=100, offered=10.0,
             done=10.0):
    return {"status": status, "num_requests": 100, "num_finished": finished, "p90_ttft_ms": p90_ttft,
            "p90_tpot_ms": p90_tpot, "late_p90_ttft_ms": late_ttft, "late_p90_tpot_ms": None,
            "saturated": saturated, "offered_rate_rps": offered, "completion_rate_rps": done,
            "slo_attainment": 1.0, "kv_capacity_tokens": 1000, "kv_peak_tokens": 1000, "kv_peak_active_tokens": 600}


def test_margins_have_the_verdicts_sign_by_hand():
    """A failing candidate's margin is negative (issue 39: plan.png showed failing candidates at positive
    margins): late arrivals over the threshold, saturation with completions keeping pace, a failing seed."""
    from sim.core.slo import SLO
    from sim.studies.plan import at_rate_row, seed_margin
    from sim.studies.sweep import sustained

    slo = sustained(SLO(ttft_ms=1000, tpot_ms=50))
    ok = _summary(800.0, 40.0, late_ttft=900.0)
    assert seed_margin(ok, slo) == pytest.approx(0.1)              # min(1 - 800/1000, 1 - 40/50, 1 - 900/1000)
    late = _summary(800.0, 40.0, late_ttft=1250.0)                  # the late quarter misses: 1 - 1250/1000
    assert not slo.meets(late) and slo.margin(late) == pytest.approx(-0.25)   # (the margin reads late arrivals)
    assert seed_margin(late, slo) == pytest.approx(-0.25)
    sat = _summary(500.0, 25.0, saturated=True, offered=10.0, done=8.0)   # completion shortfall 8/10 - 1
    assert seed_margin(sat, slo) == pytest.approx(-0.2)
    kept_pace = _summary(500.0, 25.0, saturated=True, offered=10.0, done=10.0)  # its queue grew
    assert seed_margin(kept_pace, slo) == -math.inf
    assert seed_margin(_summary(500.0, 25.0, finished=99), slo) == -math.inf
    # every seed meets, with a 95% interval above zero: the mean (0.10, 0.12, 0.14 -> 0.12; lower end
    # 0.12 - 4.303 x 0.02 / sqrt 3 = 0.070); one fails: the worst seed's, negative
    close = [ok, _summary(800.0, 40.0, late_ttft=880.0), _summary(800.0, 40.0, late_ttft=860.0)]
    row = at_rate_row(close, slo)
    assert row["meets_slo"] and row["margin"] == pytest.approx(0.12)
    assert row["margin_ci_lo"] == pytest.approx(0.12 - 4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
    row = at_rate_row([ok, _summary(600.0, 30.0), late], slo)
    assert not row["meets_slo"] and row["margin"] == row["margin_ci_lo"] == pytest.approx(-0.25)
    # KV headroom reads the peak the requests hold (600 of 1000), not the pool with its evictable cache
    assert row["kv_headroom"] == pytest.approx(0.4)


def test_one_gpu_count_puts_the_users_speed_on_y_by_hand():
    """`--gpus N`: every candidate has N GPUs and one cost per hour, so the margin alone ranks them; y shows
    tokens/s per user (1000 / mean TPOT at R) and the frontier is taken with x (the margin) first."""
    rows = [{"deployment": "A", "status": "ok", "gpus": 4, "cost_per_hour": 4.0, "margin": 0.5, "margin_ci_lo": 0.45,
             "margin_ci_hi": 0.55, "meets_slo": True, "mean_tpot_ms": 50.0},       # (50, 20): chosen
            {"deployment": "B", "status": "ok", "gpus": 4, "cost_per_hour": 4.0, "margin": 0.2, "margin_ci_lo": 0.15,
             "margin_ci_hi": 0.25, "meets_slo": True, "mean_tpot_ms": 20.0},       # (20, 50): faster per user
            {"deployment": "C", "status": "ok", "gpus": 4, "cost_per_hour": 4.0, "margin": 0.1, "margin_ci_lo": 0.05,
             "margin_ci_hi": 0.15, "meets_slo": True, "mean_tpot_ms": 40.0},       # (10, 25): dominated by B
            {"deployment": "D", "status": "ok", "gpus": 4, "cost_per_hour": 4.0, "margin": -0.3, "meets_slo": False,
             "mean_tpot_ms": 10.0}]                                                 # (-30, 100): misses
    df = rank(pd.DataFrame(rows), "rate")
    pts = plot_points(df, "rate", 100.0, rate=2.0).set_index("deployment")
    assert pts.attrs["primary"] == "x" and "per user" in pts.attrs["y_label"]
    assert pts.loc["A", ["x", "y"]].tolist() == pytest.approx([50.0, 20.0])
    assert pts.loc["B", ["x", "y"]].tolist() == pytest.approx([20.0, 50.0])
    assert sorted(pts.index[pts["front"]]) == ["A", "B"] and df.iloc[0]["deployment"] == "A"
    # equal margins: the ranking settles the tie on the primary axis
    tie = pd.DataFrame({"x": [30.0, 30.0], "y": [10.0, 40.0], "meets": [True, True], "rank": [1.0, 2.0]})
    assert frontier(tie, "x").tolist() == [True, True] and frontier(tie, "y").tolist() == [False, True]
