"""`ppsim compare RUN_A RUN_B [...]`: two or more run folders side by side.

The table has one row per statistic (mean, P50, P90, P99 of TTFT, TPOT, ITL, E2E and
per-iteration latency, then throughputs, SLO attainment, bubble fraction), one column per run
as its summary.json recorded it, and for every run after the first its difference from the first
(absolute, and in % of the first). The plot overlays the runs' CDFs of TTFT, TPOT and E2E (the
finished requests of requests.csv) and per-iteration latency (the busy iterations of
iterations.csv), the same samples the summaries' percentiles come from. Context lines (what each
run simulated, from summary.json) that differ between the runs are printed first.
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.core.lazy import lazy
np = lazy("numpy")
pd = lazy("pandas")


DISTS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"), ("e2e", "E2E (ms)"),
         ("iter", "per-iteration latency (ms)"))
SCALARS = ("throughput_rps", "throughput_drain_rps", "request_throughput", "output_throughput", "request_goodput",
           "slo_attainment", "bubble_fraction", "num_finished", "num_requests")
STATS = ("mean", "p50", "p90", "p99")


def load_run(folder: str | Path) -> dict:
    """summary.json, requests.csv and iterations.csv of a `ppsim run --out` folder."""
    from sim.outputs.runfolder import TABLE_SUFFIXES, read_iterations, read_requests, read_summary

    path = Path(folder)
    run = {"name": path.name or str(path), "path": path, "summary": read_summary(path)}
    # (.csv, .parquet or .npz; the request table is optional here, but checked when present)
    has_requests = any((path / f"requests{s}").is_file() for s in TABLE_SUFFIXES)
    run["requests"] = read_requests(path, run["summary"]) if has_requests else pd.DataFrame()
    df = read_iterations(path, run["summary"])
    run["iterations"] = pd.DataFrame() if df is None else df
    return run


def _names(runs: list[dict]) -> list[str]:
    names = [r["name"] for r in runs]
    if len(set(names)) < len(names):  # same folder names under different parents: use the paths
        names = [str(r["path"]) for r in runs]
    return names


def compare_table(runs: list[dict]) -> pd.DataFrame:
    """One row per statistic, one column per run, then `<run> - <first>` and `<run> vs <first> %`."""
    names = _names(runs)
    rows = []
    for metric, _ in DISTS:
        for stat in STATS:
            rows.append((f"{metric}_ms", stat, [r["summary"].get(f"{stat}_{metric}_ms") for r in runs]))
    for key in SCALARS:
        rows.append((key, "value", [r["summary"].get(key) for r in runs]))
    table = []
    for metric, stat, vals in rows:
        vals = [math.nan if v is None else float(v) for v in vals]
        if all(math.isnan(v) for v in vals):
            continue  # e.g. ITL in runs written before it was recorded
        row = {"metric": metric, "stat": stat, **dict(zip(names, vals))}
        base = vals[0]
        for name, v in zip(names[1:], vals[1:]):
            row[f"{name} - {names[0]}"] = v - base
            row[f"{name} vs {names[0]} %"] = (v - base) / base * 100 if base else math.nan
        table.append(row)
    return pd.DataFrame(table)


def context_differences(runs: list[dict]) -> list[str]:
    """`key: A | B` lines for the context entries that differ between the runs."""
    ctxs = [r["summary"].get("context") or {} for r in runs]
    keys = list(dict.fromkeys(k for c in ctxs for k in c))
    return [f"{k}: " + " | ".join(str(c.get(k, "?")) for c in ctxs) for k in keys
            if len({str(c.get(k)) for c in ctxs}) > 1]


def _samples(run: dict, metric: str) -> np.ndarray:
    if metric == "iter":
        it = run["iterations"]
        if it.empty or "iter_ms" not in it:
            return np.zeros(0)
        return it.loc[it["mode"] != "idle", "iter_ms"].to_numpy(dtype=float)
    req = run["requests"]
    col = f"{metric}_ms"
    if req.empty or col not in req:
        return np.zeros(0)
    v = req.loc[req["status"] == "finished", col].to_numpy(dtype=float)
    return v[~np.isnan(v)]


def plot_cdfs(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dists = [(m, label) for m, label in DISTS if m != "itl"]  # ITL is per token: not in requests.csv
    fig, axes = plt.subplots(1, len(dists), figsize=(4.2 * len(dists), 3.6))
    for ax, (metric, label) in zip(axes, dists):
        for name, run in zip(_names(runs), runs):
            v = np.sort(_samples(run, metric))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    from sim.core.fsio import save_figure

    save_figure(fig, path, dpi=110)
    plt.close(fig)




