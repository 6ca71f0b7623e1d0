"""fig12: goodput vs SLO scale (1.0, 0.8, 0.6, 0.4, 0.2) for TP, PP_2048, DCP_greedy, DCP_pred
and DCP_pred+DS (Qwen2.5-32B and 14B; azure-conv and cnn-reversed). The scale multiplies both
SLOs, in the goodput criterion and in the dynamic policies' targets."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, aggregate_goodput, best_static, goodput_study, savefig  # noqa: E402

MODELS = ("qwen2.5-32b", "qwen2.5-14b")
WORKLOADS = ("azure-conv", "cnn-reversed")
SCHEMES = ("TP", "PP_2048", "DCP_greedy", "DCP_pred", "DCP_pred+DS")
SCALES = (1.0, 0.8, 0.6, 0.4, 0.2)


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    scales = (1.0, 0.6, 0.2) if ctx.quick else SCALES
    models = MODELS[:1] if ctx.quick else MODELS
    # Only the goodput is plotted: gallop from the nearest known goodput to a bracket, past the
    # sweep's range when it still passes there (up to the deployment's physical ceiling,
    # sim/studies/inputs.py), so that no goodput is the sweep's top rate. Runs stop as soon as
    # their P90 is certain to miss the SLO (status "stopped").
    _, good = goodput_study(ctx, models, WORKLOADS, SCHEMES, slo_scales=scales, desc="fig12", full_sweep=False,
                            stop_early=True)
    df = aggregate_goodput(best_static(good), ["model", "workload", "scheme", "slo_scale"])
    df = df[["model", "workload", "scheme", "slo_scale", "goodput_rps", "goodput_ci_lo", "goodput_ci_hi",
             "num_seeds", "flag"]]
    ctx.write(df, "fig12.csv")
    return {"fig12.csv": df}


def plot(ctx: Context) -> None:
    df = ctx.read("fig12.csv")
    pairs = list(df[["model", "workload"]].drop_duplicates().itertuples(index=False))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 3.6), squeeze=False)
    for ax, (model, wl) in zip(axes[0], pairs):
        sub = df[(df["model"] == model) & (df["workload"] == wl)]
        for scheme, g in sub.groupby("scheme", sort=False):
            ax.plot(g["slo_scale"], g["goodput_rps"], marker="o", label=scheme)
        ax.invert_xaxis()
        ax.set_xlabel("SLO scale")
        ax.set_ylabel("goodput (req/s)")
        ax.set_title(f"{model}, {wl}")
        ax.legend(fontsize=7)
    savefig(fig, ctx.out_dir / "fig12.png")
