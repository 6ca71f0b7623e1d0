"""fig13: mean and P99 TTFT, TPOT and E2E for TP, PP_2048, DCP_greedy, DCP_pred, DCP_pred+DS on
synthetic prefill-heavy (5 req/s) and decode-heavy (14 req/s) loads (Qwen2.5-32B). Every value is
the mean over the context's paired seeds, with a 95% CI."""

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
    return {"fig13.csv": df}


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
