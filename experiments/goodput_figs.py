"""Shared code of the goodput figures (fig1, fig9, fig10): per-rate P90 latencies and the
goodput of each scheme, from `experiments.common.goodput_study`."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, aggregate_goodput, best_static, goodput_study, savefig  # noqa: E402

RATE_COLUMNS = ["model", "workload", "scheme", "chunk", "rate_rps", "p90_ttft_ms", "p90_tpot_ms", "p90_e2e_ms",
                "slo_attainment", "seed", "integer_rate", "meets_slo", "status", "p50_ttft_ms", "p99_ttft_ms",
                "p50_tpot_ms", "p99_tpot_ms", "mean_e2e_ms", "p90_iter_ms", "throughput_rps", "num_requests",
                "num_finished"]
GOODPUT_COLUMNS = ["model", "workload", "scheme", "best_chunk", "tied_chunks", "goodput_rps", "goodput_ci_lo",
                   "goodput_ci_hi", "num_seeds", "flag"]


def compute(ctx: Context, exp_id: str, models, workloads, schemes) -> dict[str, pd.DataFrame]:
    # every rate of the first seed (the per-rate curves plotted); the other seeds gallop from the
    # first seed's goodput (pilot-corrected) to their bracket, which is all their goodput needs
    rows, good = goodput_study(ctx, models, workloads, schemes, desc=exp_id, full_sweep="first-seed")
    rows = rows[RATE_COLUMNS].sort_values(["model", "workload", "scheme", "seed", "rate_rps"])
    good = aggregate_goodput(best_static(good), ["model", "workload", "scheme"])[GOODPUT_COLUMNS]
    ctx.write(rows, f"{exp_id}.csv")
    ctx.write(good, f"{exp_id}_goodput.csv")
    return {f"{exp_id}.csv": rows, f"{exp_id}_goodput.csv": good}


def plot(ctx: Context, exp_id: str, schemes) -> None:
    rows = ctx.read(f"{exp_id}.csv")
    good = ctx.read(f"{exp_id}_goodput.csv")
    rows = rows[rows["integer_rate"] & (rows["seed"] == rows["seed"].min())]
    pairs = list(good[["model", "workload"]].drop_duplicates().itertuples(index=False))
    fig, axes = plt.subplots(len(pairs), 3, figsize=(15, 3.4 * len(pairs)), squeeze=False)
    for i, (model, wl) in enumerate(pairs):
        sub = rows[(rows["model"] == model) & (rows["workload"] == wl)]
        g = good[(good["model"] == model) & (good["workload"] == wl)]
        best = g.set_index("scheme")["best_chunk"].to_dict()
        shown = []
        for scheme in [s for s in g["scheme"] if s in schemes]:
            name = f"PP_{int(float(best[scheme]))}" if scheme == "PP_static" else scheme
            s = sub[sub["scheme"] == name]
            if len(s):
                shown.append((scheme, s))
        for ax, col, slo in ((axes[i, 0], "p90_ttft_ms", 2000), (axes[i, 1], "p90_tpot_ms", 200)):
            for scheme, s in shown:
                ax.plot(s["rate_rps"], s[col], marker="o", ms=3, label=scheme)
            ax.axhline(slo, color="k", ls="--", lw=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(col.replace("_", " "))
            ax.set_title(f"{model}, {wl}")
        axes[i, 0].legend(fontsize=7)
        ax = axes[i, 2]
        g = g[g["scheme"].isin(schemes) | g["scheme"].str.fullmatch(r"PP_\d+")]
        ax.bar(g["scheme"], g["goodput_rps"], yerr=[g["goodput_rps"] - g["goodput_ci_lo"],
                                                     g["goodput_ci_hi"] - g["goodput_rps"]], capsize=3)
        ax.set_ylabel("goodput (req/s)")
        ax.set_title(f"goodput, {wl}")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
    fig.tight_layout()
    savefig(fig, ctx.out_dir / f"{exp_id}.png")
