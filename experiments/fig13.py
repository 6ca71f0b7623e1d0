"""fig13: mean and P99 TTFT, TPOT and E2E for TP, PP_2048, DCP_greedy, DCP_pred, DCP_pred+DS on
synthetic prefill-heavy (5 req/s) and decode-heavy (14 req/s) loads (Qwen2.5-32B). Every value is
the mean over the context's paired seeds, with a 95% CI.

fig13_length: the decode-heavy TP-to-PP ratios over the run's length. Once the KV pool is full,
TTFT is the wait for memory, which grows with the number of requests; the paper does not state
its count, so the ratio is reported with its spread over request counts and seeds, not as one
number (experiments/README.md)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, fold_seeds, savefig, statuses  # noqa: E402
from sim.core.schemes import scheme_table  # noqa: E402

MODEL = "qwen2.5-32b"
CASES = (("prefill-heavy", 5.0), ("decode-heavy", 14.0))
SCHEMES = ("TP", "PP_2048", "DCP_greedy", "DCP_pred", "DCP_pred+DS")
LENGTH_COUNTS = (500, 650, 750, 1000, 2000)
QUICK_LENGTH_COUNTS = (100, 200)
METRICS = ("ttft", "tpot", "e2e")


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    n = 200 if ctx.quick else 1000
    tables, labels = [], []
    for case, rate in CASES:
        for scheme in SCHEMES:
            for seed in ctx.seeds:  # paired seeds: the same arrivals and noise for every scheme
                tables.append(scheme_table(scheme, MODEL, {"name": case, "rate_rps": rate, "num_requests": n},
                                           seed=seed))
                labels.append((case, scheme, seed))
    res = ctx.runner.run(tables, desc="fig13")
    per_seed = []
    for (case, scheme, seed), r in zip(labels, res):
        for metric in ("ttft", "tpot", "e2e"):
            for stat in ("mean", "p99"):
                per_seed.append({"case": case, "scheme": scheme, "metric": metric, "stat": stat, "seed": seed,
                                 "value_ms": r[f"{stat}_{metric}_ms"], "status": r["status"]})
    rows = []
    for key, g in pd.DataFrame(per_seed).groupby(["case", "scheme", "metric", "stat"], sort=False):
        rows.append({**dict(zip(("case", "scheme", "metric", "stat"), key)),
                     **fold_seeds(g, ("value_ms",), ci={"value_ms": ("ci_lo_ms", "ci_hi_ms")}),
                     "num_seeds": len(g), "status": statuses(g)})
    df = pd.DataFrame(rows)
    ctx.write(df, "fig13.csv")
    length = length_ratios(ctx)
    ctx.write(length, "fig13_length.csv")
    return {"fig13.csv": df, "fig13_length.csv": length}


def ratio_rows(means: pd.DataFrame) -> pd.DataFrame:
    """TP's mean latency over each PP scheme's, per (num_requests, seed, scheme, metric): `means` has one
    row per (num_requests, seed, scheme) with `{metric}_ms` columns; a ratio above 1 means PP is faster."""
    rows = []
    for (count, seed), g in means.groupby(["num_requests", "seed"], sort=True):
        tp = g[g["scheme"] == "TP"].iloc[0]
        for _, r in g[g["scheme"] != "TP"].iterrows():
            for metric in METRICS:
                rows.append({"num_requests": count, "seed": seed, "scheme": r["scheme"], "metric": metric,
                             "ratio": tp[f"{metric}_ms"] / r[f"{metric}_ms"]})
    return pd.DataFrame(rows)


def fold_ratios(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per (num_requests, scheme, metric): the seeds' mean ratio with its 95% CI, min and max; then per
    (scheme, metric) one row with num_requests "all" over every count and seed."""
    rows = []
    for (count, scheme, metric), g in ratios.groupby(["num_requests", "scheme", "metric"], sort=False):
        rows.append({"num_requests": str(count), "scheme": scheme, "metric": metric,
                     **fold_seeds(g, ("ratio",), ci={"ratio": ("ci_lo", "ci_hi")}),
                     "min": g["ratio"].min(), "max": g["ratio"].max(), "num_runs": len(g)})
    for (scheme, metric), g in ratios.groupby(["scheme", "metric"], sort=False):
        rows.append({"num_requests": "all", "scheme": scheme, "metric": metric,
                     **fold_seeds(g, ("ratio",), ci={"ratio": ("ci_lo", "ci_hi")}),
                     "min": g["ratio"].min(), "max": g["ratio"].max(), "num_runs": len(g)})
    return pd.DataFrame(rows)


def length_ratios(ctx: Context) -> pd.DataFrame:
    """The decode-heavy case at each request count and seed, every scheme: TP's mean TTFT, TPOT and E2E
    over each PP scheme's, folded over seeds (and over everything in the "all" rows)."""
    counts = QUICK_LENGTH_COUNTS if ctx.quick else LENGTH_COUNTS
    case, rate = CASES[1]
    tables, labels = [], []
    for count in counts:
        for scheme in SCHEMES:
            for seed in ctx.seeds:
                tables.append(scheme_table(scheme, MODEL, {"name": case, "rate_rps": rate, "num_requests": count},
                                           seed=seed))
                labels.append((count, scheme, seed))
    res = ctx.runner.run(tables, desc="fig13 lengths")
    means = pd.DataFrame([{"num_requests": count, "scheme": scheme, "seed": seed,
                           **{f"{m}_ms": r[f"mean_{m}_ms"] for m in METRICS}}
                          for (count, scheme, seed), r in zip(labels, res)])
    return fold_ratios(ratio_rows(means))


def plot(ctx: Context) -> None:
    df = ctx.read("fig13.csv")
    fig, axes = plt.subplots(2, 3, figsize=(14, 6.5))
    for i, (case, _) in enumerate(CASES):
        for j, metric in enumerate(("ttft", "tpot", "e2e")):
            ax = axes[i, j]
            sub = df[(df["case"] == case) & (df["metric"] == metric)]
            piv = sub.pivot(index="scheme", columns="stat", values="value_ms").reindex(
                [s for s in SCHEMES if s in set(sub["scheme"])])
            piv.plot.bar(ax=ax, rot=30, fontsize=7)
            ax.set_ylabel(f"{metric} (ms)")
            ax.set_title(f"{case}: {metric}")
    savefig(fig, ctx.out_dir / "fig13.png")
    plot_length(ctx)


def plot_length(ctx: Context) -> None:
    df = ctx.read("fig13_length.csv")
    df = df[df["num_requests"].astype(str) != "all"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, metric in zip(axes, METRICS):
        for scheme in SCHEMES[1:]:
            sub = df[(df["scheme"] == scheme) & (df["metric"] == metric)]
            x = sub["num_requests"].astype(int)
            ax.errorbar(x, sub["ratio"], yerr=[sub["ratio"] - sub["ci_lo"], sub["ci_hi"] - sub["ratio"]],
                        marker="o", capsize=3, label=scheme)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("requests in the run")
        ax.set_ylabel(f"TP / scheme, mean {metric}")
        ax.set_title(f"decode-heavy: {metric}")
    axes[0].legend(fontsize=7)
    savefig(fig, ctx.out_dir / "fig13_length.png")
