"""The planner's probes and columns (`ppsim plan`, sim/studies/plan.py on top): the goodput search above the
demanded rate, the at-rate row of a candidate's seeds (margins, KV headroom, metric columns), the cost columns
and prices, and the labels and rule texts a plan prints. Imports only sim/studies/plan_candidates.py among the
planner's modules."""

from __future__ import annotations

import math

from sim.core.lazy import lazy
from sim.core.errors import ConfigError
from sim.core.slo import SLO
from sim.studies.sweep import Runner, Search, holds_on_seeds, mean_ci
from sim.studies.plan_candidates import MAX_PRICE

np = lazy("numpy")

GOODPUT_RESOLUTION = 1.1   # a goodput above the rate is bracketed to within 10% (the highest pass / lowest fail)


def goodputs_above(runner: Runner, tables: list[dict], rate: float, slo: SLO, desc: str = "plan: goodput",
                   seed_tables: list[list[dict]] | None = None) -> list[tuple[float, dict | None]]:
    """The goodput of each deployment (`tables`, each on its first seed and meeting the SLOs at `rate`),
    searched from `rate` upward: the rate doubled until a run misses the SLOs (never beyond the deployment's
    physical ceiling, `sim.studies.sweep.Search.ceiling_rps`), then geometric bisection until the highest
    passing rate is within 10% of the lowest failing one (`GOODPUT_RESOLUTION`); the runs of every deployment
    in one parallel batch per step, each holding its rate as long as the run at R spans (more requests at
    higher rates, as goodput searches do: `Search.window_s`), the failing ones stopped once certain to miss.
    A run passes by `slo.meets`, the test `--verify` applies (sim/studies/plan_verify.py).

    The highest passing rate of one seed sits on the SLO boundary (its long run fails about as often as it
    holds: experiments/plan_verify/README.md), so it is not yet the goodput: with `seed_tables` (each
    deployment's tables on its other paired seeds, at `rate`) the goodput is the highest rate of the ladder
    g, g / 1.1, g / 1.1^2, ... (g the highest pass; the search's own resolution) at which the rate counts by
    `sim.studies.sweep.holds_on_seeds`: every seed passes and the lower end of the 95% interval of their
    margins is >= 0; at `rate` itself it counts (the deployment met the SLOs there by the same rule), so the
    ladder ends there. Returns (goodput; the first seed's summary at it, a full run). The run at R is the
    table itself (cached); a table missing the SLOs there gets (0, None). Cost per million requests is
    taken at this goodput: at R it is GPUs / R, the same for every deployment of a GPU count."""
    searches = [Search({"key": i}, t, [rate], slo=slo) for i, t in enumerate(tables)]
    n = len(searches)
    lo, hi = [0.0] * n, [math.inf] * n
    at: list[dict | None] = [None] * n
    probes = [(i, float(rate)) for i in range(n)]
    while probes:
        res = runner.run([searches[i].at(r) for i, r in probes], desc=desc)
        for (i, r), out in zip(probes, res):
            if slo.meets(out):
                lo[i], at[i] = r, out
            else:
                hi[i] = r
        probes = []
        for i, s in enumerate(searches):
            if lo[i] <= 0:
                continue
            if math.isinf(hi[i]):
                r = round(min(2 * lo[i], s.ceiling_rps), 4)
            elif hi[i] / lo[i] > GOODPUT_RESOLUTION:
                r = round(math.sqrt(lo[i] * hi[i]), 4)
            else:
                continue
            if lo[i] < r < hi[i]:
                probes.append((i, r))
    if seed_tables:
        todo = [i for i in range(n) if lo[i] > rate and seed_tables[i]]
        groups = [[searches[i], *(Search({"key": i}, t, [rate], slo=slo) for t in seed_tables[i])] for i in todo]
        for i, (g, summ) in zip(todo, counted_rates(runner, groups, [lo[i] for i in todo], slo, float(rate),
                                                    f"{desc}: seeds")):
            lo[i], at[i] = g, summ[0]
    return [(lo[i], at[i]) for i in range(n)]


def counted_rates(runner: Runner, groups: list[list[Search]], starts: list[float], slo: SLO, floor: float,
                  desc: str, floor_counts: bool = True) -> list[tuple[float, list[dict]]]:
    """For each group of one deployment's searches, one per paired seed, the highest rate of the ladder
    start, start / 1.1, start / 1.1^2, ... (`GOODPUT_RESOLUTION`, the searches' own resolution) at which the
    rate counts, `sim.studies.sweep.holds_on_seeds`, with the group's runs there. The ladder ends at `floor`:
    with `floor_counts` the floor itself counts unchecked (the demanded rate, where the deployment met the
    SLOs by the same rule; only the first seed's run there is returned), else a group reaching it has no
    goodput (0, no runs). Every group's step runs in one parallel batch."""
    rates = list(starts)
    done: dict[int, tuple[float, list[dict]]] = {}
    todo = list(range(len(groups)))
    while todo:
        res = runner.run([s.at(rates[i]) for i in todo for s in groups[i]], desc=desc)
        k, nxt = 0, []
        for i in todo:
            summ = res[k:k + len(groups[i])]
            k += len(groups[i])
            if holds_on_seeds(slo, summ):
                done[i] = (rates[i], summ)
                continue
            down = round(rates[i] / GOODPUT_RESOLUTION, 4)
            if down > floor * (1 + 1e-9):
                rates[i] = down
                nxt.append(i)
            elif floor_counts:  # back at the demanded rate, which counts (see above): the first seed's run there
                done[i] = (floor, runner.run([groups[i][0].at(floor)], desc=desc))
            else:
                done[i] = (0.0, [])
        todo = nxt
    return [done[i] for i in range(len(groups))]


def _num(v) -> float:
    return math.nan if v is None else float(v)


def metric_columns(slo: SLO) -> list[str]:
    cols = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99")]
    return cols + [k for k in slo.keys() if k not in cols]


def seed_margin(summary: dict, slo: SLO) -> float:
    """One run's margin with the sign of its verdict (negative: it fails `slo.meets`): `slo.margin` (1 -
    percentile / threshold, the smallest over the objectives; a saturated run's at most its completion
    shortfall), and for a run failing on what that does not read, the smallest slack of its late arrivals'
    percentiles (`late_p<q>_<metric>_ms`, part of the criterion); -inf for a run that failed, stopped or did not
    finish, or fails with no slack to measure (saturated while completions kept pace: its queue grew)."""
    if summary.get("status") != "ok" or summary.get("num_finished") != summary.get("num_requests"):
        return -math.inf
    m = slo.margin(summary)
    if slo.meets(summary) or m < 0:
        return m
    late = [1 - _num(summary.get("late_" + k)) / ms for k, (_, _, ms) in zip(slo.keys(), slo.objectives())]
    late = [v for v in late if v < 0]
    return min(late) if late else -math.inf


def kv_headroom(summary: dict) -> float:
    """1 - the peak KV in use / the pool. In use: what the requests hold (their own tokens and the cached prefixes
    they pin), `kv_peak_active_tokens`; a prefix cache keeps freed tokens as evictable cache, which an
    allocation takes back, so `kv_peak_tokens` (free tokens only counted out) reads a full pool. A summary
    without the active peak (an older cached run) gives `kv_peak_tokens`'."""
    cap = summary.get("kv_capacity_tokens")
    if not cap:
        return math.nan
    peak = summary.get("kv_peak_active_tokens")
    return 1 - (peak if peak is not None else summary["kv_peak_tokens"]) / cap


def at_rate_row(summaries: list[dict], slo: SLO) -> dict:
    """One candidate at the user's load, over its seeds: seed means of the latency columns,
    attainment, the worst KV headroom (`kv_headroom`), the margin and the SLO verdict. The margin
    has the verdict's sign (`seed_margin`): meeting the SLOs on every seed, the mean over seeds and its 95% CI
    (refused all the same where that CI reaches below zero: then the margin is the CI's lower end, and
    `margin_seed_mean` keeps the mean); else the worst seed's (negative: by how much it misses), its CI bounds
    the same."""
    row = {c: float(np.nanmean([_num(s.get(c)) for s in summaries])) if any(s.get(c) is not None for s in summaries)
           else math.nan for c in metric_columns(slo)}
    row["slo_attainment"] = float(np.mean([_num(s.get("slo_attainment")) for s in summaries]))
    heads = [kv_headroom(s) for s in summaries if s.get("kv_capacity_tokens")]
    row["kv_headroom"] = min(heads) if heads else math.nan
    margins = [seed_margin(s, slo) for s in summaries]
    row["seeds_meeting"] = sum(slo.meets(s) for s in summaries)
    every_seed = row["seeds_meeting"] == len(summaries)
    if every_seed:
        row["margin"], row["margin_ci_lo"], row["margin_ci_hi"] = mean_ci(margins)
    else:
        row["margin"] = row["margin_ci_lo"] = row["margin_ci_hi"] = min(margins)
    # the rate counts only where every seed meets the SLOs and the margins' 95% interval does not reach
    # below zero (`sim.studies.sweep.holds_on_seeds`): a thin margin on three short runs is not a sustained one
    row["meets_slo"] = holds_on_seeds(slo, summaries)
    row["refused_thin_margin"] = bool(every_seed and not row["meets_slo"])
    row["margin_seed_mean"] = row["margin"]
    if row["refused_thin_margin"]:  # the margin the verdict read: the interval's lower end, below zero
        row["margin"] = row["margin_ci_lo"]
    row["run_status"] = ";".join(sorted({s.get("status") or "?" for s in summaries}))
    # what the runs cut of the requests (the context or the pool: sim/cli/run.py run_warnings), never silent
    row["truncated_prompts"] = max(int(s.get("num_truncated_prompts") or 0) for s in summaries)
    row["clipped_outputs"] = max(int(s.get("num_clipped_outputs") or 0) for s in summaries)
    return row


def parse_prices(text: str | None, names: list[str]) -> dict[str, float]:
    """`2.0` (every GPU) or `pcie=1.6,nvlink=2.2` -> {interconnect: $/GPU-hour}."""
    if not text:
        return {}
    try:
        if "=" not in text:
            prices = dict.fromkeys(names, float(text))
        else:
            prices = {k.strip(): float(v) for k, v in (part.split("=", 1) for part in text.split(","))}
    except ValueError:
        raise ConfigError(f"--price-per-gpu-hour {text!r}: expected a number or NAME=PRICE,..., "
                          f"e.g. 2.0 or pcie=1.6,nvlink=2.2") from None
    for k in prices:
        if k not in names:
            raise ConfigError(f"--price-per-gpu-hour {text!r}: unknown name {k!r}; allowed: {', '.join(names)}")
    missing = [n for n in names if n not in prices]
    if missing:  # (one unit per column: $ for every row or GPU-hours for every row)
        raise ConfigError(f"--price-per-gpu-hour {text!r}: no price for {', '.join(missing)}; allowed: a price "
                          f"for each of {', '.join(names)}, or one number for all")
    if any(not (math.isfinite(v) and 0 < v <= MAX_PRICE) for v in prices.values()):
        raise ConfigError(f"--price-per-gpu-hour {text!r}: prices must be finite $ per GPU-hour in (0, {MAX_PRICE:g}]")
    return prices


def cost_per_million(price: float | None, gpus: int, rate_rps: float) -> float:
    """$ per million requests served at `rate_rps` on `gpus` GPUs at `price` $/GPU-hour."""
    if not price or not rate_rps > 0:
        return math.nan
    return price * gpus / 3600.0 / rate_rps * 1e6


def cost_columns(gpus: int, price: float | None, rate_rps: float | None, goodput_rps: float) -> dict:
    """A row's cost columns, one basis each (`price` None: GPU-hours, a price of 1): `cost_per_hour` (GPUs x
    price), `cost_per_million_at_rate` (serving the demanded rate: NaN without one) and
    `cost_per_million_at_goodput` (at the deployment's own goodput; NaN where none was found)."""
    price = price or 1.0
    return {"cost_per_hour": price * gpus,
            "cost_per_million_at_rate": cost_per_million(price, gpus, rate_rps) if rate_rps else math.nan,
            "cost_per_million_at_goodput": cost_per_million(price, gpus, goodput_rps)
            if math.isfinite(goodput_rps) and goodput_rps > 0 else math.nan}


def cost_unit(prices: dict) -> str:
    """What the cost columns count: $ with --price-per-gpu-hour, else GPU-hours."""
    return "$" if prices else "GPU-hours"


RULE_RATE = ("among those meeting the SLOs on every seed (sustained: not saturated; late arrivals too) with the 95% "
             "interval of their margins not below zero, fewest GPUs, then cost per hour (at the rate it orders "
             "cost_per_million_at_rate alike), then margin")
def refused_thinly(r) -> bool:
    """Whether a row (dict or pandas row) met the SLOs on every seed but was refused by the margin interval."""
    v = r.get("refused_thin_margin")
    return isinstance(v, (bool, np.bool_)) and bool(v)


THIN_MARGIN = ("meets the SLOs on every seed, but thinly: the margins' 95% interval reaches {margin_ci_lo:+.1%} "
               "(sim.studies.sweep.holds_on_seeds), so the rate does not count")
RULE_GOODPUT = ("highest goodput counted on every seed (sim.studies.sweep.holds_on_seeds; ties where the seeds' goodput "
                "CIs overlap: lower cost_per_million_at_goodput, then fewer GPUs)")
COST_NOTE = ("cost columns: cost_per_hour = GPUs x price; cost_per_million_at_rate = serving the demanded rate (the "
             "one to present); cost_per_million_at_goodput = at the candidate's own goodput (efficiency at full load)")


def layout_text(tp: int, pp: int, ep: int = 1) -> str:
    """TP4xPP2, or TP4-EP4xPP2 for an MoE model's expert-parallel layout (as its profile folder, tp4-ep4)."""
    return f"TP{tp}" + (f"-EP{ep}" if ep > 1 else "") + f"xPP{pp}"


def label(r: dict) -> str:
    ep = r.get("ep", 1)
    split = layout_text(r["tp"], r["pp"], int(ep) if isinstance(ep, (int, float)) and ep == ep else 1)
    if r["replicas"] > 1:
        split = f"{r['replicas']}x({split}) {r['router']}"
    engine = r.get("engine", "fastpp")
    return f"{r['interconnect']}: {split} {r['policy']}" + ("" if engine == "fastpp" else f" [{engine}]")
