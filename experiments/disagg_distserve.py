"""disagg_distserve: DistServe's toy example, goodput per GPU co-located against disaggregated (issue 34).

The published example (DistServe, OSDI'24; the Hao AI Lab blog's "Figure 6", hao-ai-lab/hao-ai-lab.github.io
`content/blogs/distserve/index.md`): a 13B model on A100-80GB, 512-token prompts and 64-token outputs,
Poisson arrivals, SLO P90 TTFT <= 0.4 s and P90 TPOT <= 0.04 s. Co-located on one GPU it meets both at
about 1.6 req/s; one prefill-only GPU handles about 5.6 req/s and one decode-only GPU about 10, so two
prefill GPUs and one decode GPU serve about 10 req/s: 3.3 req/s per GPU, "2x goodput" from disaggregating
alone. (The numbers are quoted in experiments/README.md, "disagg_distserve"; this module never reads them.)

Simulated here: Qwen2.5-14B on the hand-built A100-SXM-80GB profiles (the nearest measured model; no OPT-13B
profile), TP1 everywhere, fixed lengths 512 / 64, 400 requests (120 with --quick), the same seeds for every
setup; the SLO as published (both P90s, a sustainable rate: sim/core/slo.py). Setups: co-located on 1 GPU
(FastPP's scheduler, chunk 2048: a prompt is prefilled whole, mixed with the running decodes); disaggregated
1 prefill + 1 decode GPU and 2 prefill + 1 decode GPUs (DistServe's accounting: `first_token = "prefill"`,
KV over NVSwitch inside the node, `kv_transfer = "after_prefill"`, as its engine migrates blocks after the
context stage). For each: the goodput (sim/studies/sweep.py's search, to 0.05 req/s) and SLO attainment,
P90 TTFT and P90 TPOT over per-GPU rates. DistServe's own goodput counts a rate where 90% of requests meet
both SLOs together; here each P90 must meet its own threshold (and its late arrivals too).

Outputs: disagg_distserve.csv (setup, kind = goodput or curve, per-GPU rate, goodput, attainment, P90s,
mean over seeds with 95% CIs) and disagg_distserve.png.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, fold_seeds, savefig, statuses  # noqa: E402
from sim.studies.sweep import Search, goodput_searches, mean_ci  # noqa: E402

PROFILE = "profiles/a100-sxm-80gb-nvswitch/qwen2.5-14b/tp1"
SLO = {"ttft_ms": 400.0, "tpot_ms": 40.0}
SETUPS = {"co-located 1 GPU": (1, None), "disaggregated 1P1D": (2, (1, 1)), "disaggregated 2P1D": (3, (2, 1))}
PER_GPU_RATES = (0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0)


def table(setup: str, rate: float, n: int, seed: int, stop: bool = False) -> dict:
    gpus, pools = SETUPS[setup]
    t = {"seed": seed, "scheduler": {"chunk_size_tokens": 2048}, "latency": {"profile": PROFILE},
         "slo": {**SLO, "stop_when_violated": stop},
         "workload": {"kind": "synthetic-uniform", "rate_rps": float(rate), "num_requests": n,
                      "input_range": [512, 512], "output_range": [64, 64]}}
    if pools is not None:
        t["cluster"] = {"nodes": 1, "gpus_per_node": 8, "network": "ib-hdr"}
        t["disaggregation"] = {"kv_transfer": "after_prefill", "first_token": "prefill",
                               "prefill": {"tp": 1, "instances": pools[0]}, "decode": {"tp": 1, "instances": pools[1]}}
    return t


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    from sim.core.slo import SLO as SLOSpec

    n = 120 if ctx.quick else 400
    rates = PER_GPU_RATES[::2] if ctx.quick else PER_GPU_RATES
    tables, labels = [], []
    for setup, (gpus, _) in SETUPS.items():
        for r in rates:
            for seed in ctx.seeds:
                tables.append(table(setup, r * gpus, n, seed))
                labels.append((setup, r, seed))
    res = ctx.runner.run(tables, desc="disagg_distserve: curves")
    per = [{"setup": s, "per_gpu_rate_rps": r, "seed": seed, "slo_attainment": x["slo_attainment"],
            "p90_ttft_ms": x["p90_ttft_ms"], "p90_tpot_ms": x["p90_tpot_ms"], "status": x["status"]}
           for (s, r, seed), x in zip(labels, res)]
    rows = []
    for key, g in pd.DataFrame(per).groupby(["setup", "per_gpu_rate_rps"], sort=False):
        rows.append({"setup": key[0], "kind": "curve", "per_gpu_rate_rps": key[1],
                     **fold_seeds(g, ("slo_attainment", "p90_ttft_ms", "p90_tpot_ms"),
                                  ci={"slo_attainment": ("attainment_ci_lo", "attainment_ci_hi")}),
                     "num_seeds": len(g), "status": statuses(g)})
    slo = SLOSpec(**SLO)
    searches, keys = [], []
    for setup, (gpus, _) in SETUPS.items():
        for seed in ctx.seeds:
            base = table(setup, gpus * 1.0, n, seed, stop=True)
            searches.append(Search({"setup": setup, "seed": seed}, base, [gpus * r for r in rates], slo=slo))
            keys.append((setup, gpus))
    found = goodput_searches(ctx.runner, searches, tol=ctx.tol, desc="disagg_distserve: goodput", full_sweep=False)
    by: dict[str, list[float]] = {}
    for (setup, gpus), f in zip(keys, found):
        by.setdefault(setup, []).append(f["goodput_rps"] / gpus)
    for setup, vals in by.items():
        m, lo, hi = mean_ci(vals)
        rows.append({"setup": setup, "kind": "goodput", "goodput_per_gpu_rps": m, "goodput_ci_lo": lo,
                     "goodput_ci_hi": hi, "gpus": SETUPS[setup][0], "num_seeds": len(vals)})
    df = pd.DataFrame(rows)
    ctx.write(df, "disagg_distserve.csv")
    return {"disagg_distserve.csv": df}


def plot(ctx: Context) -> None:
    df = ctx.read("disagg_distserve.csv")
    curves, good = df[df["kind"] == "curve"], df[df["kind"] == "goodput"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for setup, marker in zip(SETUPS, ("o", "s", "^")):
        sub = curves[curves["setup"] == setup].sort_values("per_gpu_rate_rps")
        lo, hi = sub["attainment_ci_lo"].clip(0, 1), sub["attainment_ci_hi"].clip(0, 1)  # (a t-interval can leave [0, 1])
        axes[0].errorbar(sub["per_gpu_rate_rps"], sub["slo_attainment"] * 100,
                         yerr=[(sub["slo_attainment"] - lo).clip(lower=0) * 100, (hi - sub["slo_attainment"]).clip(lower=0) * 100],
                         marker=marker, capsize=3, label=setup)
        axes[1].plot(sub["per_gpu_rate_rps"], sub["p90_ttft_ms"], marker=marker, label=setup)
        axes[2].plot(sub["per_gpu_rate_rps"], sub["p90_tpot_ms"], marker=marker, label=setup)
    axes[0].axhline(90, color="k", lw=0.8, ls="--")
    axes[0].set_ylabel("SLO attainment (%)")
    axes[1].axhline(SLO["ttft_ms"], color="k", lw=0.8, ls="--")
    axes[1].set_ylabel("P90 TTFT (ms)")
    axes[1].set_yscale("log")
    axes[2].axhline(SLO["tpot_ms"], color="k", lw=0.8, ls="--")
    axes[2].set_ylabel("P90 TPOT (ms)")
    for ax in axes[:3]:
        ax.set_xlabel("request rate per GPU (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[3]
    ax.bar(good["setup"], good["goodput_per_gpu_rps"],
           yerr=[good["goodput_per_gpu_rps"] - good["goodput_ci_lo"], good["goodput_ci_hi"] - good["goodput_per_gpu_rps"]],
           capsize=4, color=["tab:blue", "tab:orange", "tab:green"][:len(good)])
    ax.set_ylabel("goodput per GPU (req/s)")
    ax.tick_params(axis="x", rotation=20, labelsize=7)
    fig.suptitle("DistServe's toy example, simulated: 14B on A100-80GB, 512 in / 64 out, P90 TTFT <= 0.4 s, "
                 "P90 TPOT <= 0.04 s", fontsize=10)
    fig.tight_layout()
    savefig(fig, ctx.out_dir / "disagg_distserve.png")
