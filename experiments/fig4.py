"""fig4: pipeline bubble time vs request rate for chunk 128 vs 2048, and the prefill
throughput (Qwen2.5-32B, PP=4, azure-code: the first rows of the code trace with Poisson
arrivals). Bubble = idle stage time per busy iteration, summed over stages."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, savefig  # noqa: E402
from sim.core.schemes import scheme_table  # noqa: E402
from sim.studies.sweep import with_rate  # noqa: E402

MODEL = "qwen2.5-32b"
CHUNKS = (128, 2048)
COLUMNS = ["model", "workload", "scheme", "chunk", "rate_rps", "bubble_ms_per_iter", "bubble_fraction",
           "total_bubble_s", "prefill_tokens_per_s", "p90_ttft_ms", "p90_tpot_ms", "p90_iter_ms", "status"]


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    n = 150 if ctx.quick else 1000
    rates = [1, 3, 5, 7] if ctx.quick else list(range(1, 11))
    tables, labels = [], []
    for chunk in CHUNKS:
        for rate in rates:
            t = scheme_table(f"PP_{chunk}", MODEL, {"name": "azure-code", "num_requests": n})
            tables.append(with_rate(t, rate))
            labels.append({"model": MODEL, "workload": "azure-code", "scheme": f"PP_{chunk}", "chunk": chunk,
                           "rate_rps": rate})
    res = ctx.runner.run(tables, desc="fig4")
    df = pd.DataFrame([{**lab, **r} for lab, r in zip(labels, res)])[COLUMNS]
    ctx.write(df, "fig4.csv")
    return {"fig4.csv": df}


def plot(ctx: Context) -> None:
    df = ctx.read("fig4.csv")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for scheme, g in df.groupby("scheme"):
        axes[0].plot(g["rate_rps"], g["bubble_ms_per_iter"], marker="o", label=scheme)
        axes[1].plot(g["rate_rps"], g["prefill_tokens_per_s"], marker="o", label=scheme)
    axes[0].set_ylabel("bubble per iteration (ms, all stages)")
    axes[1].set_ylabel("prefill throughput (tokens/s)")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
        ax.legend()
    axes[0].set_title("azure-code, PP=4")
    savefig(fig, ctx.out_dir / "fig4.png")
