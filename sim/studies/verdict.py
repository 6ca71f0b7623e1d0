"""Ranking a plan's candidates with seed noise in mind, and the verdict paragraph.

Pure functions over a plan table (one row per candidate deployment; see `sim.studies.plan`), so
they are tested on constructed tables.

Ranking, goodput mode (no `--rate`): by mean goodput over the paired seeds; a candidate whose
95% CI overlaps the best one's is *tied* with it; the tied group is ordered by cost per
million requests, then fewer GPUs, then goodput, and comes first.

Ranking, rate mode (`--rate R`): only candidates that meet the SLOs on every seed (sustained:
not saturated) are ranked, by the first that tells them apart of: fewest GPUs, then cost per hour
(GPUs x price; at R it orders `cost_per_million_at_rate` alike), then margin (the smallest relative
slack over the objectives, 1 - percentile / threshold, mean over seeds); a candidate of the best
one's GPUs and cost per hour whose margin CI overlaps the best one's is tied with it.

Cost columns, one basis each: `cost_per_hour` (GPUs x $/GPU-hour), `cost_per_million_at_rate`
(serving the demanded rate: the answer to present), `cost_per_million_at_goodput` (at the
candidate's own goodput: its efficiency at full load); in $ with a price, else GPU-hours.

Families: `replication` (more than one replica, whatever each replica's split), `hybrid
TPxPP` (one replica with TP > 1 and PP > 1), `PP`, `TP`, `single GPU`.
"""

from __future__ import annotations

import math

from sim.core.lazy import lazy

pd = lazy("pandas")

FAMILIES = ("replication", "hybrid TPxPP", "PP", "TP", "single GPU")


def family(replicas: int, tp: int, pp: int) -> str:
    if replicas > 1:
        return "replication"
    if tp > 1 and pp > 1:
        return "hybrid TPxPP"
    if pp > 1:
        return "PP"
    if tp > 1:
        return "TP"
    return "single GPU"


COST_AT_RATE = "cost_per_million_at_rate"
COST_AT_GOODPUT = "cost_per_million_at_goodput"


def cost_key(df: pd.DataFrame) -> str:
    """The cost per million requests a plan presents: at the demanded rate when the plan has one (what
    serving it costs), else at each candidate's goodput (goodput mode: efficiency at full load). Its unit is
    $ with --price-per-gpu-hour, else GPU-hours (the plan's `cost_unit`)."""
    if COST_AT_RATE in df and df[COST_AT_RATE].astype(float).notna().any():
        return COST_AT_RATE
    return COST_AT_GOODPUT


def _overlap(lo1: float, hi1: float, lo2: float, hi2: float) -> bool:
    return lo1 <= hi2 + 1e-12 and lo2 <= hi1 + 1e-12


def _nan_last(v) -> float:
    return math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def rank(df: pd.DataFrame, mode: str) -> pd.DataFrame:
    """The table in ranked order with `rank` (1.. for ranked candidates, else NaN) and
    `tied_with_best` columns. Unranked candidates (missed the SLOs, no goodput, pruned,
    dropped) follow, simulated ones first."""
    df = df.copy()
    # a plan in which nothing was simulated (every candidate dropped or pruned) has none of these yet
    need = (("goodput_rps", "goodput_ci_lo", "goodput_ci_hi", "cost_per_hour", COST_AT_GOODPUT) if mode == "goodput"
            else ("meets_slo", "margin", "margin_ci_lo", "margin_ci_hi", "goodput_rps", "cost_per_hour", COST_AT_RATE,
                  COST_AT_GOODPUT))
    for col in ("status", "reason", "gpus", *need):
        if col not in df:
            df[col] = False if col == "meets_slo" else "" if col in ("status", "reason") else math.nan
    df["rank"] = math.nan
    ck = cost_key(df)
    df["tied_with_best"] = False
    sim = df["status"] == "ok"
    if mode == "goodput":
        ok = sim & (df["goodput_rps"] > 0)
        elig = df[ok].sort_values("goodput_rps", ascending=False)
        if len(elig):
            best = elig.iloc[0]
            tied = elig.apply(lambda r: _overlap(r["goodput_ci_lo"], r["goodput_ci_hi"],
                                                 best["goodput_ci_lo"], best["goodput_ci_hi"]), axis=1)
            group = elig[tied].assign(_c=lambda d: d[ck].map(_nan_last),
                                      tied_with_best=True)
            group = group.sort_values(["_c", "gpus", "goodput_rps"], ascending=[True, True, False]).drop(columns="_c")
            elig = pd.concat([group, elig[~tied]])
        rest = df[~ok].assign(_s=lambda d: d["status"] != "ok").sort_values(["_s", "goodput_rps"],
                                                                             ascending=[True, False])
    else:
        ok = sim & df["meets_slo"].fillna(False).astype(bool)
        if "cost_per_hour" not in df:
            df["cost_per_hour"] = math.nan
        elig = df[ok].assign(_c=lambda d: d["cost_per_hour"].map(_nan_last))
        elig = elig.sort_values(["gpus", "_c", "margin"], ascending=[True, True, False])
        if len(elig):
            best = elig.iloc[0]
            tied = elig.apply(lambda r: r["gpus"] == best["gpus"] and (
                abs(r["_c"] - best["_c"]) < 1e-9 if math.isfinite(best["_c"]) else not math.isfinite(r["_c"])), axis=1)
            tied &= elig.apply(lambda r: _overlap(r["margin_ci_lo"], r["margin_ci_hi"],
                                                  best["margin_ci_lo"], best["margin_ci_hi"]), axis=1)
            group = elig[tied].assign(tied_with_best=True).sort_values(["margin"], ascending=[False])
            elig = pd.concat([group, elig[~tied]])
        elig = elig.drop(columns="_c")
        rest = df[~ok].assign(_s=lambda d: d["status"] != "ok").sort_values(["_s", "margin"],
                                                                             ascending=[True, False])
    out = pd.concat([elig, rest.drop(columns="_s")])
    out.loc[elig.index, "rank"] = range(1, len(elig) + 1)
    return out.reset_index(drop=True)


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _ci(m: float, lo: float, hi: float, unit: str, pct: bool = False) -> str:
    f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.2f}{unit}")
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo < 1e-12:
        return f(m)
    return f"{f(m)} (95% CI {f(lo)} to {f(hi)})"


def _money(v: float, unit: str) -> str:
    return f"${v:,.2f}" if unit == "$" else f"{v:,.1f} GPU-hours"


def verdict(ranked: pd.DataFrame, mode: str, slo_text: str, rate_rps: float | None = None,
            unit_of: str = "GPU-hours", load_text: str | None = None) -> str:
    """One paragraph from a ranked table (`rank` output): which family wins, by how much, with
    the CI; differences inside the CIs are called ties, never "0% lower". `load_text`: the load of a
    rate-mode ranking in other units ("64 concurrent clients": each row's cost per million requests is
    then at its own `achieved_rps`, sim/studies/concurrency_plan.py)."""
    top = ranked[ranked["rank"] == 1]
    ck = cost_key(ranked)
    n_sim = int((ranked["status"] == "ok").sum())
    n_out = int((ranked["status"] != "ok").sum())
    if mode == "rate":
        head = f"At {load_text or f'{rate_rps:g} req/s'} with {slo_text}, {int(ranked['rank'].notna().sum())} of {n_sim} simulated deployments meet the SLOs on every seed"
    else:
        head = f"With {slo_text}, {int(ranked['rank'].notna().sum())} of {n_sim} simulated deployments reach a goodput above 0"
    head += f" ({n_out} pruned or dropped before simulating)." if n_out else "."
    if top.empty:
        return head + " None qualifies: relax the SLOs, lower the load or add GPUs."
    best = top.iloc[0]
    fam = best["family"]
    tied = ranked[ranked["tied_with_best"] & (ranked["rank"] > 1)]
    key, unit = ("goodput_rps", " req/s") if mode == "goodput" else ("margin", "")

    def describe(r) -> str:
        if mode == "goodput":
            return f"{r['deployment']} at {_ci(r['goodput_rps'], r['goodput_ci_lo'], r['goodput_ci_hi'], unit)}"
        cost = float(r[ck]) if ck in r else math.nan
        c = "" if not math.isfinite(cost) else f", {_money(cost, unit_of)} per million requests at the rate"
        got = r.get("achieved_rps")
        if c and load_text and isinstance(got, float) and math.isfinite(got):
            c = f", {_money(cost, unit_of)} per million requests at the {got:.3g} req/s it serves at {load_text}"
        g, cg = r.get("goodput_rps"), r.get(COST_AT_GOODPUT)
        if c and isinstance(g, float) and math.isfinite(g) and isinstance(cg, float) and math.isfinite(cg):
            m = r.get("goodput_clients")
            c += (f" ({_money(cg, unit_of)} at the most clients it holds, {m:.0f}, counted on every seed, "
                  f"serving {g:.3g} req/s on the first seed)"
                  if load_text and m is not None and math.isfinite(float(m))  # sim.studies.concurrency_plan
                  else f" ({_money(cg, unit_of)} at its goodput {g:.3g} req/s, first seed)")  # plan.goodputs_above
        return f"{r['deployment']} with margin {_ci(r['margin'], r['margin_ci_lo'], r['margin_ci_hi'], '', True)}{c}"

    text = [head, f"Best: {describe(best)} ({fam})."]
    # the best candidate of every other family, and whether the winner's lead is outside the CIs
    others = ranked[ranked["rank"].notna() & (ranked["family"] != fam)]
    tied_fams = sorted(set(tied["family"]) - {fam})
    if others.empty:
        text.append(f"{_cap(fam)} wins: no other family qualifies.")
    else:
        runner = others.iloc[0]
        lo_key, hi_key = ("goodput_ci_lo", "goodput_ci_hi") if mode == "goodput" else ("margin_ci_lo", "margin_ci_hi")
        inside = bool(runner["tied_with_best"]) or _overlap(best[lo_key], best[hi_key], runner[lo_key], runner[hi_key])
        if mode == "goodput":
            gap = best[key] - runner[key]
            rel = gap / runner[key] if runner[key] > 0 else math.inf
            better = f"{gap:.2f} req/s ({rel:.0%}) more" if math.isfinite(rel) else f"{gap:.2f} req/s more"
        else:
            better = f"{100 * (best[key] - runner[key]):.1f} points more margin"
            if best["gpus"] != runner["gpus"]:
                better = "fewer GPUs"
            elif _nan_last(best.get("cost_per_hour")) != _nan_last(runner.get("cost_per_hour")):
                better = "a lower cost per hour"
        one_seed = min(int(best.get("num_seeds", 2) or 2), int(runner.get("num_seeds", 2) or 2)) < 2
        if one_seed and not (mode == "goodput" and round(best[key] - runner[key], 2) == 0):
            text.append(f"{_cap(fam)} leads: {better} than the best {runner['family']} deployment, "
                        f"{describe(runner)}; with one seed there is no CI, so rerun with --seeds 3 before "
                        f"trusting the gap.")
        elif inside or (mode == "goodput" and round(best[key] - runner[key], 2) == 0):
            text.append(f"No family wins outright: the best {runner['family']} deployment, {describe(runner)}, "
                        f"is within the seed noise of the best ({fam}), a tie.")
        else:
            text.append(f"{_cap(fam)} wins: {better} than the best {runner['family']} deployment, "
                        f"{describe(runner)}; the 95% CIs do not overlap.")
    if len(tied):
        text.append(f"{len(tied)} more deployment(s) are tied with the best"
                    + (f" (including {', '.join(tied_fams)})" if tied_fams else "") +
                    ("; ties go to the lower cost, then fewer GPUs." if mode == "goodput" else "."))
    return " ".join(text)
