"""Shared experiment set-up: the paper's workloads and rate ranges, quick mode, the context
handed to every experiment, and the goodput-search helpers built on `sim.studies.sweep`."""

from __future__ import annotations

from sim.core.lazy import lazy

import copy
import math
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.core.schemes import STATIC_CHUNKS, scheme_table
from sim.studies.sweep import Runner, Search, goodput_searches, per_rate_rows

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"

# Rate sweeps as the artifact's README runs them (azure conv: 400 prompts, rates 1..10;
# cnn_r: 1000 prompts, 1..11); sharegpt and cnn use 1000 prompts over 1..11 too.
SWEEP_WORKLOADS = {
    "azure-conv": ({"name": "azure-conv", "num_requests": 400}, list(range(1, 11))),
    "sharegpt": ({"name": "sharegpt", "num_requests": 1000}, list(range(1, 12))),
    "cnn": ({"name": "cnn", "num_requests": 1000}, list(range(1, 12))),
    "cnn-reversed": ({"name": "cnn-reversed", "num_requests": 1000}, list(range(1, 12))),
}
QUICK_REQUESTS = 120
# Goodput searches extend past the sweep's range until a rate fails, up to the deployment's
# physical ceiling (sim/studies/inputs.py); with the arrival window held at the artifact's own
# (its requests over its top rate), a run at k times the top rate has k times the requests.
# Schemes per (model, workload, SLO scale, seed) whose goodput, found first, sets the others' hint
# in `goodput_study` (the others are hinted with the pilots' mean ratio to their reference).
PILOTS = 2
QUICK_RATES = [1, 3, 5, 7, 9, 11]


@dataclass
class Context:
    out_dir: Path
    quick: bool = False
    jobs: int = 1
    executor: str = "process"
    address: str | None = None
    progress: bool = True
    seeds: tuple[int, ...] = (1,)
    _runner: Runner | None = field(default=None, repr=False)

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = Runner(self.out_dir / "cache" / "points.jsonl", jobs=self.jobs,
                                  executor=self.executor, address=self.address, progress=self.progress)
        return self._runner

    @property
    def tol(self) -> float:
        return 0.25 if self.quick else 0.05

    def write(self, df: pd.DataFrame, name: str) -> Path:
        from sim.core.fsio import write_frame

        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / name
        write_frame(df, path, index=False, float_format="%.6g")
        return path

    def read(self, name: str) -> pd.DataFrame:
        return pd.read_csv(self.out_dir / name)


def sweep_workload(ctx: Context, name: str) -> tuple[dict, list[float]]:
    table, rates = SWEEP_WORKLOADS[name]
    table = copy.deepcopy(table)
    if ctx.quick:
        table["num_requests"] = min(table["num_requests"], QUICK_REQUESTS)
        rates = [r for r in QUICK_RATES if r <= max(rates)]
    return table, list(rates)


def goodput_study(ctx: Context, models, workloads, schemes, slo_scales=(1.0,), desc="goodput",
                  full_sweep: bool | str = True, extend: bool = True, stop_early: bool = False,
                  extra: dict | None = None):
    """Goodput searches for every (model, workload, scheme, slo scale, seed). `PP_static`
    expands to every static chunk; its best chunk is picked afterwards.

    `full_sweep`: True runs every rate of the sweep for every search (per-rate figures), False
    climbs the rates (or gallops from a hint) and stops at the first failure
    (`sim.studies.sweep.goodput_searches`), "first-seed" runs the full sweep for the first seed only (the
    one the per-rate plots show) and gallops from a hint for the others (same goodput when the
    outcome is monotone in the rate).

    Runs are shared between studies wherever they are the same simulation: a static scheme does
    not read the SLO, so its runs at every SLO scale are those at scale 1.0, and a run at scale
    1.0 without `extra` is the goodput figures' (fig9/fig10) run; the pass/fail verdict applies
    each search's own SLO to the shared summary. Runs off the sweep's rates (extension and
    bisection points, a hinted search's rates) stop as soon as their verdict is certain: their P90
    is certain to miss the search's SLO (status "stopped"), or the run is certain to meet it
    (status "met", `[slo] stop_when_met`), unless the full run is cached: a stopped run knows
    only its verdict on its own table's SLO, and only the verdict is needed there. `stop_early` makes every
    run stop so, at the sweep's rates too, for the searches no other study shares (dynamic
    schemes at a tighter SLO scale, or with `extra`).

    Returns (per-rate rows, goodput rows) as DataFrames."""
    first_seed = ctx.seeds[0]
    searches = []
    for model in models:
        for wl in workloads:
            wtable, rates = sweep_workload(ctx, wl)
            for scheme in schemes:
                expanded = [f"PP_{c}" for c in STATIC_CHUNKS] if scheme == "PP_static" else [scheme]
                for sch in expanded:
                    for scale in slo_scales:
                        for seed in ctx.seeds:
                            static = sch == "TP" or sch.startswith("PP_")
                            table = scheme_table(sch, model, wtable, seed=seed, slo_scale=1.0 if static else scale,
                                                 extra=extra)
                            # Off the sweep's rates (extension, bisection, a hinted search) a run
                            # stops as soon as its verdict is certain (a miss, or a pass), unless
                            # the full run is cached: the verdict is all a search needs there.
                            stopping = copy.deepcopy(table)
                            stopping["slo"].update(ttft_ms=2000.0 * scale, tpot_ms=200.0 * scale,
                                                   stop_when_violated=True, stop_when_met=True)
                            probe = stopping
                            if stop_early and not (extra is None and (static or scale == 1.0)):
                                table, probe = stopping, None  # nobody shares it: it stops at every rate
                            chunk = table["scheduler"]["chunk_size_tokens"] if static else "dynamic"
                            label = {"model": model, "workload": wl, "scheme": sch, "group": scheme,
                                     "chunk": chunk, "slo_scale": scale, "seed": seed}
                            full = full_sweep is True or (full_sweep == "first-seed" and seed == first_seed)
                            searches.append(Search(label, table, rates, 2000.0 * scale, 200.0 * scale,
                                                   full_sweep=full, probe_table=probe,
                                                   min_window_s=wtable["num_requests"] / max(rates)))
    top = max(max(s.rates) for s in searches)
    max_rate = math.inf if extend else top
    # Searches run in three phases, each later one starting near an earlier goodput
    # (`Search.hint_rps`; it gallops from there, `sim.studies.sweep._gallop`) instead of climbing from the
    # lowest rate: the same goodput when the outcome is monotone in the rate, without the low-rate
    # runs (the longest simulations: most iterations per request). 1: the first seed at the first
    # (loosest) SLO scale; 2: the first seed at the other scales, from phase 1's goodput; 3: the
    # other seeds, from the first seed's goodput at the same scale. Phases 2 and 3 first run
    # `PILOTS` schemes of each (model, workload, scale, seed) from the reference goodput itself
    # (times the scale ratio in phase 2), then the others from their reference times the pilots'
    # mean ratio of found to reference goodput: a seed's requests, or a tighter SLO, move every
    # scheme's goodput alike (median distance to the hint, in cells of 0.05 req/s: other seeds 11
    # plain, 7 as used, pilots included; tighter scales 33 and 18; benchmarks/search_replay.py).
    found: dict[int, dict] = {}

    def key(s: Search, **label) -> tuple:
        return tuple(sorted({**s.label, **label}.items()))

    def phase(idx: list[int], hint, what: str) -> dict:
        for i in idx:
            searches[i].hint_rps = hint(searches[i])
        if idx:
            found.update(zip(idx, goodput_searches(ctx.runner, [searches[i] for i in idx], tol=ctx.tol,
                                                   desc=f"{desc}{what}", max_rate=max_rate)))
        return {key(searches[i]): found[i]["goodput_rps"] for i in idx}

    def piloted(idx: list[int], ref, scale: Callable[[Search], float], what: str) -> dict:
        """Phase over `idx`: pilots from `ref(s)` (a goodput already found) x `scale(s)`, then the
        rest from `ref(s)` x the mean of their group's pilots' found / ref ratios."""
        def group(s: Search) -> tuple:
            return key(s, scheme=None, group=None, chunk=None)

        schemes: dict[tuple, list[str]] = {}  # each group's schemes in order, the first PILOTS piloting
        for i in idx:
            names = schemes.setdefault(group(searches[i]), [])
            if searches[i].label["scheme"] not in names:
                names.append(searches[i].label["scheme"])
        pilots = [i for i in idx if searches[i].label["scheme"] in schemes[group(searches[i])][:PILOTS]]
        by_group: dict[tuple, list[int]] = {}
        for i in pilots:
            by_group.setdefault(group(searches[i]), []).append(i)
        got = phase(pilots, lambda s: ref(s) * scale(s), f"{what} (pilots)")

        def hint(s: Search) -> float:
            ratios = [got[key(searches[i])] / ref(searches[i]) for i in by_group[group(s)] if ref(searches[i]) > 0]
            return ref(s) * (sum(ratios) / len(ratios) if ratios else scale(s))

        piloting = set(pilots)
        got.update(phase([i for i in idx if i not in piloting], hint, what))
        return got

    scale0 = slo_scales[0]
    seed1 = [i for i, s in enumerate(searches) if s.label["seed"] == first_seed]
    g1 = phase([i for i in seed1 if searches[i].label["slo_scale"] == scale0], lambda s: None, "")
    g1.update(piloted([i for i in seed1 if searches[i].label["slo_scale"] != scale0],
                      lambda s: g1[key(s, slo_scale=scale0)], lambda s: s.label["slo_scale"] / scale0,
                      ": tighter SLOs"))
    piloted([i for i in range(len(searches)) if i not in found], lambda s: g1[key(s, seed=first_seed)],
            lambda s: 1.0, f": seeds {', '.join(map(str, ctx.seeds[1:]))}")
    good = pd.DataFrame([found[i] for i in range(len(searches))])
    rows = pd.DataFrame(per_rate_rows(searches))
    return rows, good


def best_static(good: pd.DataFrame) -> pd.DataFrame:
    """Add PP_static rows per (model, workload, slo scale): the PP_<c> of the PP_static group whose
    goodput has the highest mean over seeds (ties to the smaller chunk), one row per seed, so the
    seeds stay paired with the other schemes. `tied_chunks` lists every chunk whose 95% CI
    overlaps the best one's (the best included): those are statistically indistinguishable.
    Each PP_<c> row is kept once."""
    from sim.studies.sweep import mean_ci

    keys = ["model", "workload", "slo_scale"]
    out = []
    for _, g in good.groupby(keys, sort=False):
        own = g[g["group"] != "PP_static"]
        st = g[g["group"] == "PP_static"]
        for _, row in own.iterrows():
            out.append({**row.to_dict(), "best_chunk": row["chunk"], "tied_chunks": ""})
        for _, row in st[~st["scheme"].isin(set(own["scheme"]))].iterrows():
            out.append({**row.to_dict(), "best_chunk": row["chunk"], "tied_chunks": ""})
        if len(st):
            cis = {int(c): mean_ci(x["goodput_rps"].tolist()) for c, x in st.groupby("chunk")}
            best = max(sorted(cis), key=lambda c: cis[c][0])
            lo_best, hi_best = cis[best][1], cis[best][2]
            tied = [c for c in sorted(cis) if c == best or (cis[c][2] >= lo_best and cis[c][1] <= hi_best)]
            for _, row in st[st["chunk"] == best].iterrows():
                out.append({**row.to_dict(), "scheme": "PP_static", "best_chunk": best,
                            "tied_chunks": " ".join(str(c) for c in tied)})
    return pd.DataFrame(out)


def fold_seeds(g: pd.DataFrame, cols, ci: dict | None = None) -> dict:
    """The mean over the seeds (rows of `g`) of each column in `cols`, in order, each followed,
    for a column `ci` names, by its 95% CI under the two names given there (`sim.studies.sweep.mean_ci`)."""
    from sim.studies.sweep import mean_ci

    ci = ci or {}
    row = {}
    for col in cols:
        m, lo, hi = mean_ci(g[col].astype(float).tolist())
        row[col] = m
        if col in ci:
            row[ci[col][0]], row[ci[col][1]] = lo, hi
    return row


def statuses(g: pd.DataFrame) -> str:
    """The seeds' run statuses, each once (e.g. "ok;stopped")."""
    return ";".join(sorted(set(g["status"])))


def aggregate_goodput(good: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean and 95% CI of goodput over seeds."""
    from sim.studies.sweep import mean_ci

    rows = []
    for k, g in good.groupby(keys, sort=False):
        m, lo, hi = mean_ci(g["goodput_rps"].tolist())
        tied = g["tied_chunks"].dropna().astype(str) if "tied_chunks" in g else pd.Series(dtype=str)
        rows.append({**dict(zip(keys, k if isinstance(k, tuple) else (k,))), "goodput_rps": m,
                     "goodput_ci_lo": lo, "goodput_ci_hi": hi, "num_seeds": len(g),
                     "best_chunk": g["best_chunk"].mode().iloc[0] if "best_chunk" in g else None,
                     "tied_chunks": tied.iloc[0] if len(tied) else "",
                     "flag": ";".join(sorted(set(f for f in g["flag"] if isinstance(f, str) and f)))})
    return pd.DataFrame(rows)


def savefig(fig, path: Path) -> Path:
    from sim.core.fsio import save_figure

    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
