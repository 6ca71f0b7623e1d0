"""plan.png: a capacity plan's candidates drawn on the basis its ranking used (`ppsim plan`).

Two panels. The top one places every candidate with numbers and draws the Pareto frontier of those that
meet the SLOs on that basis, so that the chosen deployment (rank 1) sits on the frontier it was chosen from:

- rate mode (`--rate R`; the ranking: meeting the SLOs at R on every seed, then fewest GPUs, then cost per
  hour, then margin; `sim.studies.verdict.rank`): x = the SLO margin at R, % (1 - percentile / threshold,
  the smallest over the objectives; a failing candidate's is negative, -100% drawn for a failed run);
  y = output tokens/s per GPU at R (R x output tokens per request / GPUs: more for fewer GPUs; per $ of an
  hour with prices) where the candidates differ in GPUs or cost per hour (`--max-gpus`), else (`--gpus N`:
  the margin alone ranks them) tokens/s per user at R, 1000 / mean TPOT. Only simulated candidates
  meeting the SLOs form the frontier; those missing them are hollow, left of 0; screen estimates (the
  cluster plan's candidates not simulated in full, at their screen's margin) are crosses, never on it.
- goodput mode (no `--rate`; the ranking: highest goodput, CI ties by cost per million at goodput, then
  GPUs): y = output tokens/s per GPU at the candidate's goodput (mean over seeds), x = tokens/s per user,
  1000 / mean TPOT, at 80% of it (the operating point the plan simulates). Every candidate with a goodput
  meets the SLOs there and may be on the frontier.

A point is on the frontier when no other candidate meeting the SLOs is at least as far right and as high
and further along the axis the ranking orders first, ties there settled by the ranking (`frontier`). The
rank-1 candidate is first on that axis (fewest GPUs, or the largest margin, or the highest goodput), so it
is on the frontier; the legend says so, or why not (goodput mode with `--price-per-gpu-hour` differing by
interconnect: a CI tie settled by cost may pick a lower goodput).

Labels stay readable at any number of candidates: on the plot only the frontier points carry a label, their
rank (`#3`; the first `MAX_LABELS` by rank), and the chosen one its name; the bottom panel names the top
`TOP` candidates by rank and every labelled frontier point (margin at
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
MAX_LABELS = 12      # frontier points labelled on the plot with their rank (by rank); named in the bottom panel
TOP = 20             # candidates in the bottom panel
NEAR_PX = 14         # frontier points closer than this on screen share one label
LABEL_BOX = {"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75}  # readable over the lines


def _col(df: pd.DataFrame, name: str, default=math.nan) -> pd.Series:
    """A column as a Series, or `default` everywhere when the table lacks it."""
    return df[name] if name in df else pd.Series(default, index=df.index, dtype=object if isinstance(default, str)
                                                  else None)


def _float(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce").astype(float)


def plot_points(df: pd.DataFrame, mode: str, out_tokens: float | None, rate: float | None = None) -> pd.DataFrame:
    """The candidates placed on the ranking's basis (module docstring), one row each with `x`, `y`, `kind`
    ("simulated" or "estimated"), `meets` (may be on the frontier), `rank` (NaN: unranked) and `front`;
    `attrs` names the y axis (`y_label`) and the axis the ranking orders first (`primary`). Rows without a
    status, pruned or dropped, or lacking the numbers (no output tokens per request, no goodput, no margin)
    are left out."""
    cols = ["deployment", "x", "y", "kind", "meets", "rank", "front", "mode", "nodes", "gpus"]
    status = _col(df, "status", "")
    placeable = status.isin(["ok", "estimated"]) if mode == "rate" else status.eq("ok")
    if not placeable.any() or (mode == "goodput" and not (out_tokens and out_tokens > 0)):
        return pd.DataFrame({c: pd.Series(dtype=bool if c in ("meets", "front") else object if c in
                                          ("deployment", "kind", "mode") else float) for c in cols})
    d = df[placeable]
    gpus = _float(_col(d, "gpus"))
    load = f"{rate:g} req/s" if rate else "the rate"
    if mode == "rate":
        r = rate if rate else _float(_col(d, "rate_rps"))
        est = _col(d, "status", "").eq("estimated")
        margin = _float(_col(d, "margin")).where(~est, _float(_col(d, "screen_margin")))
        x = 100.0 * margin.clip(lower=MARGIN_FLOOR)
        cost = _float(_col(d, "cost_per_hour")).fillna(gpus)
        if cost.round(9).nunique() <= 1 or not (out_tokens and out_tokens > 0):
            # one tier of (GPUs, cost per hour), as in `--gpus N`: the ranking orders by margin alone, and y can
            # show the user's speed
            y, primary = 1000.0 / _float(_col(d, "mean_tpot_ms")), "x"
            y_label = f"tokens/s per user at {load} (1000 / mean TPOT)"
        else:
            # several tiers (`--max-gpus`): y orders them as the ranking does (fewer GPUs, then a lower cost per
            # hour: one price per plan, or GPUs equal): output tokens/s per GPU, or per $ of an hour with prices
            priced = not np.allclose(cost, gpus)
            y = r * out_tokens / cost * (3600.0 if priced else 1.0)
            primary = "y"
            y_label = f"output tokens per $ at {load}" if priced else f"output tokens/s per GPU at {load}"
        meets = ~est & _col(d, "meets_slo", False).eq(True)
        kind = np.where(est, "estimated", "simulated")
    else:
        goodput = _float(_col(d, "goodput_rps"))
        x = 1000.0 / _float(_col(d, "mean_tpot_ms_at_80pct"))
        y = goodput * out_tokens / gpus
        meets = goodput > 0
        kind = np.full(len(d), "simulated")
        primary, y_label = "y", "output tokens/s per GPU at its goodput"
    pts = pd.DataFrame({"deployment": _col(d, "deployment", "?").astype(str), "x": x, "y": y, "kind": kind,
                        "meets": meets.astype(bool), "rank": _float(_col(d, "rank")),
                        "mode": _col(d, "mode", "colocated").fillna("colocated"),
                        "nodes": _float(_col(d, "nodes", 1.0)).fillna(1.0), "gpus": gpus}, index=d.index)
    pts = pts[np.isfinite(pts["x"]) & np.isfinite(pts["y"])]
    pts["front"] = frontier(pts, primary)
    pts = pts[cols]
    pts.attrs = {"y_label": y_label, "primary": primary}
    return pts


def frontier(pts: pd.DataFrame, primary: str = "y") -> pd.Series:
    """Which of `pts` (columns x, y, meets, rank) lie on the Pareto frontier of those meeting the SLOs,
    maximising x and y: p is dominated by a q at least as far right and as high (x_q >= x_p, y_q >= y_p) that
    is further along the axis the ranking orders first (`primary`), or as far and ranked better: ties on
    that axis are the ranking's to settle (an unranked point ranks last). So the rank-1 point, first on the
    primary axis, is on it."""
    out = pd.Series(False, index=pts.index)
    m = pts[pts["meets"].astype(bool)]
    if not len(m):
        return out
    xs, ys = m["x"].to_numpy(float), m["y"].to_numpy(float)
    rk = m["rank"].to_numpy(float)
    rk = np.where(np.isfinite(rk), rk, np.inf)
    a = ys if primary == "y" else xs
    for i, idx in enumerate(m.index):
        first = (a > a[i]) | ((a == a[i]) & (rk < rk[i]))
        out[idx] = not np.any((xs >= xs[i]) & (ys >= ys[i]) & first)
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
    """The points labelled on the plot, index -> text: the first `MAX_LABELS` frontier points by rank with
    their rank ("#3": short, so that neighbours stay readable; the bottom panel names them), and the chosen
    one (rank 1), wherever it is, with its name too."""
    front = pts[pts["front"] & pts["rank"].notna()].sort_values("rank").head(MAX_LABELS)
    named = {i: f"#{int(r)}" for i, r in zip(front.index, front["rank"])}
    for i in pts.index[pts["rank"] == 1]:
        named[i] = f"#1 {pts.loc[i, 'deployment']}"
    return named


def _label(ax, pts: pd.DataFrame) -> None:
    """Write `point_labels` on the plot: ranks of points closer than `NEAR_PX` on screen share one label
    ("#19 #22"), so that none overlaps; the chosen one's name sits below its star."""
    if not len(pts):
        return
    ax.get_xlim(), ax.get_ylim()  # (the limits autoscaled to the points, so screen positions are final)
    mid = (pts["x"].min() + pts["x"].max()) / 2
    groups: list[tuple[np.ndarray, object, list[str]]] = []
    for idx, text in point_labels(pts).items():
        at = ax.transData.transform((pts.loc[idx, "x"], pts.loc[idx, "y"]))
        near = [g for g in groups if pts.loc[g[1], "rank"] != 1 and pts.loc[idx, "rank"] != 1
                and np.hypot(*(g[0] - at)) < NEAR_PX]
        if near:
            near[0][2].append(text)
        else:
            groups.append((at, idx, [text]))
    for _, idx, texts in groups:
        chosen, right = pts.loc[idx, "rank"] == 1, pts.loc[idx, "x"] > mid  # (right half: the text to the left)
        ax.annotate(" ".join(texts), (pts.loc[idx, "x"], pts.loc[idx, "y"]), xytext=(-9 if right else 9,
                    -13 if chosen else 3), textcoords="offset points", fontsize=7, ha="right" if right else "left",
                    color="red" if chosen else "k", bbox=LABEL_BOX)


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
    pts = plot_points(df, mode, out_tokens, rate)
    labelled = [i for i in point_labels(pts) if i not in shown.head(TOP).index]
    top = pd.concat([shown.head(TOP), shown.loc[shown.index.intersection(labelled)]])  # (every "#n" named below)
    y_label = pts.attrs.get("y_label", "output tokens/s per GPU")
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
    _label(ax, pts)
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
        at = " at its goodput" if mode == "goodput" else ""
        handles.append(Line2D([], [], ls="", marker="o", color="gray", label=f"filled: simulated, meets the SLOs{at}"))
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
        ax.set_ylabel(y_label)
        ax.axvline(0, color="k", lw=0.6, ls=":")
    else:
        ax.set_xlabel("tokens/s per user (1000 / mean TPOT at 80% of the goodput)")
        ax.set_ylabel(y_label)
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
