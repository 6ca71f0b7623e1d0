"""plan.png: a capacity plan's candidates drawn on the basis its ranking used (`ppsim plan`).

Two panels. The top one places every candidate with numbers and draws the Pareto frontier of those that
meet the SLOs on that basis, so that the chosen deployment (rank 1) sits on the frontier it was chosen from:

- rate mode (`--rate R`; the ranking: meeting the SLOs at R on every seed, then fewest GPUs, then cost per
  hour, then margin; `sim.studies.verdict.rank`): y = output tokens/s per GPU at R (R x output tokens per
  request / GPUs: more for fewer GPUs), x = the SLO margin at R, % (1 - percentile / threshold, the
  smallest over the objectives; a failing candidate's is negative, -100% drawn for a failed run). Only
  simulated candidates meeting the SLOs form the frontier; those missing them are hollow, left of 0;
  screen estimates (the cluster plan's candidates not simulated in full, at their screen's margin) are
  crosses, never on it.
- goodput mode (no `--rate`; the ranking: highest goodput, CI ties by cost per million at goodput, then
  GPUs): y = output tokens/s per GPU at the candidate's goodput (mean over seeds), x = tokens/s per user,
  1000 / mean TPOT, at 80% of it (the operating point the plan simulates). Every candidate with a goodput
  meets the SLOs there and may be on the frontier.

A point is on the frontier when no other frontier candidate is at least as far right and higher, ties in y
settled by the ranking (`frontier`): the ranking orders candidates of equal y (equal GPUs and goodput) by
cost and margin, which y does not show. With one price the rank-1 candidate has the highest y, so it is on
the frontier; the legend says so, or why not (goodput mode with `--price-per-gpu-hour` differing by
interconnect: a CI tie settled by cost may pick a lower goodput).

Labels stay readable at any number of candidates: only the frontier points (the first `MAX_LABELS` by rank)
and the chosen one are named on the plot; the bottom panel lists the top `TOP` candidates by rank (margin at
the rate, or goodput with its CI); plan.csv has every row. A table without the columns a point needs (no
status, nothing simulated, no output tokens per request) still gives a complete PNG saying so.
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.core.lazy import lazy, lazy_pyplot

plt = lazy_pyplot()
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)
np = lazy("numpy")

MODE_COLORS = {"colocated": "tab:blue", "disaggregated": "tab:orange"}
NODE_MARKERS = {1: "o", 2: "s", 3: "^", 4: "D"}
ESTIMATE_MARKER = "x"
MARGIN_FLOOR = -1.0  # a failed or unfinished run's margin (-inf) is drawn at -100%
MAX_LABELS = 6       # frontier points named on the plot (by rank); the rest are in the bottom panel and plan.csv
TOP = 20             # candidates in the bottom panel


def _col(df: pd.DataFrame, name: str, default=math.nan) -> pd.Series:
    """A column as a Series, or `default` everywhere when the table lacks it."""
    return df[name] if name in df else pd.Series(default, index=df.index, dtype=object if isinstance(default, str)
                                                  else None)


def _float(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce").astype(float)


def plot_points(df: pd.DataFrame, mode: str, out_tokens: float | None, rate: float | None = None) -> pd.DataFrame:
    """The candidates placed on the ranking's basis (module docstring), one row each with `x`, `y`, `kind`
    ("simulated" or "estimated"), `meets` (may be on the frontier), `rank` (NaN: unranked) and `front`.
    Rows without a status, pruned or dropped, or lacking the numbers (no output tokens per request, no
    goodput, no margin) are left out."""
    cols = ["deployment", "x", "y", "kind", "meets", "rank", "front", "mode", "nodes", "gpus"]
    status = _col(df, "status", "")
    placeable = status.isin(["ok", "estimated"]) if mode == "rate" else status.eq("ok")
    if not out_tokens or not (out_tokens > 0) or not placeable.any():
        return pd.DataFrame({c: pd.Series(dtype=bool if c in ("meets", "front") else object if c in
                                          ("deployment", "kind", "mode") else float) for c in cols})
    d = df[placeable]
    gpus = _float(_col(d, "gpus"))
    if mode == "rate":
        r = rate if rate else _float(_col(d, "rate_rps"))
        est = _col(d, "status", "").eq("estimated")
        margin = _float(_col(d, "margin")).where(~est, _float(_col(d, "screen_margin")))
        x = 100.0 * margin.clip(lower=MARGIN_FLOOR)
        y = r * out_tokens / gpus
        meets = ~est & _col(d, "meets_slo", False).eq(True)
        kind = np.where(est, "estimated", "simulated")
    else:
        goodput = _float(_col(d, "goodput_rps"))
        x = 1000.0 / _float(_col(d, "mean_tpot_ms_at_80pct"))
        y = goodput * out_tokens / gpus
        meets = goodput > 0
        kind = np.full(len(d), "simulated")
    pts = pd.DataFrame({"deployment": _col(d, "deployment", "?").astype(str), "x": x, "y": y, "kind": kind,
                        "meets": meets.astype(bool), "rank": _float(_col(d, "rank")),
                        "mode": _col(d, "mode", "colocated").fillna("colocated"),
                        "nodes": _float(_col(d, "nodes", 1.0)).fillna(1.0), "gpus": gpus}, index=d.index)
    pts = pts[np.isfinite(pts["x"]) & np.isfinite(pts["y"])]
    pts["front"] = frontier(pts)
    return pts[cols]


def frontier(pts: pd.DataFrame) -> pd.Series:
    """Which of `pts` (columns x, y, meets, rank) lie on the Pareto frontier of those meeting the SLOs,
    maximising x and y: p is dominated by a q with x_q >= x_p and (y_q, -rank_q) > (y_p, -rank_p), i.e. a
    higher y, or the same y and a better rank (ties in y settled by the ranking; an unranked point ranks
    last)."""
    out = pd.Series(False, index=pts.index)
    m = pts[pts["meets"].astype(bool)]
    if not len(m):
        return out
    xs, ys = m["x"].to_numpy(float), m["y"].to_numpy(float)
    rk = m["rank"].to_numpy(float)
    rk = np.where(np.isfinite(rk), rk, np.inf)
    for i, idx in enumerate(m.index):
        better_y = (ys > ys[i]) | ((ys == ys[i]) & (rk < rk[i]))
        out[idx] = not np.any((xs >= xs[i]) & better_y)
    return out


def frontier_steps(front: pd.DataFrame) -> tuple[list[float], list[float]]:
    """The Pareto frontier of points maximising x and y as a staircase whose every corner some point attains
    (x ascending, y descending): from each point down to the next one's y, then across to it."""
    f = front.sort_values(["x", "y"], ascending=[True, False])
    xs, ys = [], []
    for x, y in zip(f["x"], f["y"]):
        if xs:
            xs.append(xs[-1])   # down from the previous point to this one's y: dominated by this point
            ys.append(y)
        xs.append(x)
        ys.append(y)
    return xs, ys


def point_labels(pts: pd.DataFrame) -> dict:
    """The points named on the plot, index -> "#rank deployment": the first `MAX_LABELS` frontier points by
    rank, and the chosen one (rank 1) wherever it is."""
    front = pts[pts["front"]].sort_values("rank").head(MAX_LABELS)
    named = {i: f"#{int(r)} {d}" if r == r else str(d) for i, r, d in zip(front.index, front["rank"],
                                                                          front["deployment"])}
    for i in pts.index[pts["rank"] == 1]:
        named.setdefault(i, f"#1 {pts.loc[i, 'deployment']}")
    return named


def bar_values(top: pd.DataFrame, mode: str) -> pd.Series:
    """The bottom panel's value per candidate: rate mode, the margin at the rate in % (a screen estimate's
    screen margin; -inf, a failed run, at -100%); goodput mode, the mean goodput (req/s)."""
    if mode == "rate":
        est = _col(top, "status", "").eq("estimated")
        marg = _float(_col(top, "margin")).where(~est, _float(_col(top, "screen_margin")))
        return 100.0 * marg.clip(lower=MARGIN_FLOOR)
    return _float(_col(top, "goodput_rps"))


def _wrap(text: str, width: int = 44) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _chosen_text(pts: pd.DataFrame, best: pd.DataFrame, rule: str | None) -> tuple[str, pd.DataFrame]:
    name = str(best.iloc[0].get("deployment", "?"))
    why = f" ({rule})" if rule else ""
    b = pts.loc[pts.index.intersection(best.index)]
    if not len(b):
        return f"chosen: {name}{why}; not drawn (no numbers to place it)", b
    if bool(b["front"].iloc[0]):
        return f"chosen: {name}{why}; on the frontier", b
    return (f"chosen: {name}{why}; off the frontier: the ranking's cost tie-break picked it over a higher goodput "
            f"per GPU", b)


def plot_plan(df: pd.DataFrame, mode: str, slo: str, path: Path, out_tokens: float | None = None,
              rate: float | None = None, rule: str | None = None) -> None:
    """Write plan.png (module docstring): the candidates on the ranking's basis with the frontier and the
    chosen one, then the top `TOP` candidates by rank."""
    from matplotlib.lines import Line2D

    from sim.core.fsio import save_figure

    status = _col(df, "status", "")
    shown = df[status.isin(["ok", "estimated"])]
    top = shown.head(TOP)
    pts = plot_points(df, mode, out_tokens, rate)
    height = 0.32 * max(len(top), 4) + 0.6
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6.5 + height), gridspec_kw={"height_ratios": [6.5, height]})
    for (kind, meets, m, nodes), g in pts.groupby(["kind", "meets", "mode", "nodes"], sort=True):
        color = MODE_COLORS.get(m, "tab:gray")
        if kind == "estimated":
            ax.scatter(g["x"], g["y"], marker=ESTIMATE_MARKER, s=40, color=color, alpha=0.6, linewidths=1.0)
        else:
            ax.scatter(g["x"], g["y"], marker=NODE_MARKERS.get(int(nodes), "P"), s=46, edgecolors=color,
                       facecolors=color if meets else "none", linewidths=1.2)
    front = pts[pts["front"]]
    handles: list = []
    if len(front):
        fx, fy = frontier_steps(front)
        ax.plot(fx, fy, color="k", lw=1.0)
        handles.append(Line2D([], [], color="k", lw=1.0, label="Pareto frontier of the candidates meeting the SLOs"))
    mid = (pts["x"].min() + pts["x"].max()) / 2 if len(pts) else 0.0
    for i, (idx, text) in enumerate(point_labels(pts).items()):
        on, right = bool(pts.loc[idx, "front"]), pts.loc[idx, "x"] > mid  # (right half: the text to the left)
        ax.annotate(text, (pts.loc[idx, "x"], pts.loc[idx, "y"]), xytext=(-8 if right else 8, (6 + 9 * (i % 3))
                    if on else -12), textcoords="offset points", fontsize=7, ha="right" if right else "left",
                    color="k" if on else "red")
    ranked = _float(_col(df, "rank"))
    best = df[ranked == 1]
    if len(best):
        text, b = _chosen_text(pts, best, rule)
        ax.scatter(b["x"], b["y"], marker="*", s=320, facecolors="none", edgecolors="red", linewidths=1.6)
        handles.append(Line2D([], [], ls="", marker="*", markersize=14, markerfacecolor="none",
                              markeredgecolor="red", label=text))
    elif len(shown):
        handles.append(Line2D([], [], ls="", label="no candidate meets the SLOs: none chosen"))
    handles += [Line2D([], [], ls="", marker="o", color=c, label=m) for m, c in MODE_COLORS.items()
                if (pts["mode"] == m).any()]
    handles += [Line2D([], [], ls="", marker=mk, color="k", markerfacecolor="none",
                       label=f"{n} node{'s' if n > 1 else ''}") for n, mk in NODE_MARKERS.items()
                if ((pts["nodes"] == n) & (pts["kind"] == "simulated")).any()]
    sim_ = pts["kind"] == "simulated"
    if (sim_ & pts["meets"]).any():
        handles.append(Line2D([], [], ls="", marker="o", color="gray",
                              label="filled: simulated, meets the SLOs" + (" at its goodput" if mode == "goodput" else "")))
    if (sim_ & ~pts["meets"]).any():
        handles.append(Line2D([], [], ls="", marker="o", color="gray", markerfacecolor="none",
                              label="hollow: simulated, misses the SLOs (margin < 0)"))
    if (pts["kind"] == "estimated").any():
        handles.append(Line2D([], [], ls="", marker=ESTIMATE_MARKER, color="gray",
                              label="cross: estimated from its screen, not simulated in full (never on the frontier)"))
    if handles:
        ax.legend(handles, [_wrap(h.get_label()) for h in handles], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    load = f"{rate:g} req/s" if rate else "the rate"
    if mode == "rate":
        ax.set_xlabel(f"SLO margin at {load}, % (1 - percentile / threshold, smallest over the objectives; "
                      f"a failed run at {100 * MARGIN_FLOOR:.0f}%)")
        ax.set_ylabel(f"output tokens/s per GPU at {load}")
        ax.axvline(0, color="k", lw=0.6, ls=":")
    else:
        ax.set_xlabel("tokens/s per user (1000 / mean TPOT at 80% of the goodput)")
        ax.set_ylabel("output tokens/s per GPU at its goodput")
    ax.set_title(f"ppsim plan: candidates on the ranking's basis; {slo}", fontsize=10)
    ax.grid(alpha=0.3)
    if not len(pts):
        why = ("no output tokens per request" if not out_tokens else
               "no candidate simulated or estimated" if not len(shown) else "no candidate with numbers to place")
        ax.text(0.5, 0.5, why + " (plan.csv lists every candidate)", transform=ax.transAxes, ha="center")
    _bars(bx, top, mode, len(shown) - len(top), bool(status.isin(["pruned", "dropped"]).any()))
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _bars(bx, top: pd.DataFrame, mode: str, left: int, skipped: bool) -> None:
    """The top candidates by rank, one bar each, named in full."""
    y = np.arange(len(top))
    vals = bar_values(top, mode)
    if mode == "rate":
        est = _col(top, "status", "").eq("estimated")
        meets = _col(top, "meets_slo", False).eq(True) & ~est
        colors = ["lightgray" if e else "tab:green" if m else "tab:red" for m, e in zip(meets, est)]
        bx.barh(y, vals.fillna(0.0), color=colors)
        bx.axvline(0, color="k", lw=0.8)
        bx.set_xlabel("SLO margin at the rate, % (green: meets; red: misses, negative; grey: screen estimate)")
    else:
        v = vals.fillna(0.0)
        lo, hi = _float(_col(top, "goodput_ci_lo")).fillna(v), _float(_col(top, "goodput_ci_hi")).fillna(v)
        bx.barh(y, v, xerr=np.array([(v - lo).clip(lower=0), (hi - v).clip(lower=0)]), color="tab:blue")
        bx.set_xlabel("goodput (req/s), mean and 95% CI over seeds")
    labels = []
    for r in top.to_dict("records"):
        rk = r.get("rank")
        head = f"#{int(rk)} " if isinstance(rk, (int, float)) and rk == rk else ""
        g = r.get("gpus")
        tail = f" ({int(g)} GPUs)" if isinstance(g, (int, float)) and g == g else ""
        labels.append(f"{head}{r.get('deployment', '?')}{tail}")
    bx.set_yticks(y, labels, fontsize=8)
    bx.invert_yaxis()
    more = f" ({left} more, and the pruned and dropped ones, in plan.csv)" if left > 0 or skipped else ""
    bx.set_title(f"top {len(top)} candidates{more}" if len(top) else "no candidate simulated" + more, fontsize=10)
