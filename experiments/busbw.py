"""busbw: how the TP versus PP answer depends on the least certain parameter, the all-reduce bus
bandwidth of a PCIe box with P2P disabled (reference/latency-profiles.md section 7).

TP goodput on every 32B workload of fig9 at busBW 6, 12, the fitted value and 23.7 GB/s (the
band's ends: 23.7 GB/s is P2P-enabled PCIe, a hard upper bound), next to PP_static and DCP_pred,
which do not depend on it (PP=4 with TP=1 has no all-reduce); those come from fig9_goodput.csv in
the same results folder (run here if it is absent). Same seeds, paired, 95% CIs.
`fidelity.md` shows the table."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import REPO, Context, aggregate_goodput, best_static, goodput_study, savefig  # noqa: E402
from sim.core.tomlio import read_toml  # noqa: E402
from sim.core.errors import DataError  # noqa: E402

MODEL = "qwen2.5-32b"
WORKLOADS = ("azure-conv", "sharegpt", "cnn", "cnn-reversed")
BANDS = (6.0, 12.0, 23.7)
TP_PROFILE = REPO / "profiles" / "a100-pcie-40gb" / MODEL / "tp4" / "meta.toml"


def fitted_busbw() -> float:
    return float(read_toml(TP_PROFILE, DataError, "profile missing")["comm"]["allreduce_busbw_gbps"])


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    fit = fitted_busbw()
    bands = sorted(set(BANDS) | {fit})
    workloads = WORKLOADS[:2] if ctx.quick else WORKLOADS
    rows = []
    for bw in bands:
        # at the fitted bandwidth the runs are fig9's own TP runs (shared through the point cache)
        extra = None if bw == fit else {"latency": {"overrides": {"allreduce_busbw_gbps": bw}}}
        _, good = goodput_study(ctx, [MODEL], workloads, ["TP"], desc=f"busbw {bw:g}", full_sweep=False,
                                stop_early=True, extra=extra)
        agg = aggregate_goodput(best_static(good), ["model", "workload", "scheme"])
        for r in agg.itertuples():
            rows.append({"workload": r.workload, "scheme": "TP", "busbw_gbps": bw, "fitted": bw == fit,
                         "goodput_rps": r.goodput_rps, "goodput_ci_lo": r.goodput_ci_lo,
                         "goodput_ci_hi": r.goodput_ci_hi, "num_seeds": r.num_seeds, "flag": r.flag})
    path = ctx.out_dir / "fig9_goodput.csv"
    if path.is_file():
        pp = pd.read_csv(path)
        pp = pp[(pp["model"] == MODEL) & pp["workload"].isin(workloads) & pp["scheme"].isin(["PP_static", "DCP_pred"])]
    else:
        _, good = goodput_study(ctx, [MODEL], workloads, ["PP_static", "DCP_pred"], desc="busbw: PP")
        pp = aggregate_goodput(best_static(good), ["model", "workload", "scheme"])
        pp = pp[pp["scheme"].isin(["PP_static", "DCP_pred"])]
    for r in pp.itertuples():
        rows.append({"workload": r.workload, "scheme": r.scheme, "busbw_gbps": float("nan"), "fitted": False,
                     "goodput_rps": r.goodput_rps, "goodput_ci_lo": r.goodput_ci_lo,
                     "goodput_ci_hi": r.goodput_ci_hi, "num_seeds": r.num_seeds, "flag": r.flag})
    df = pd.DataFrame(rows)
    ctx.write(df, "busbw.csv")
    return {"busbw.csv": df}


def plot(ctx: Context) -> None:
    df = ctx.read("busbw.csv")
    wls = list(dict.fromkeys(df["workload"]))
    fig, axes = plt.subplots(1, len(wls), figsize=(4.2 * len(wls), 3.4), squeeze=False)
    for ax, wl in zip(axes[0], wls):
        sub = df[df["workload"] == wl]
        tp = sub[sub["scheme"] == "TP"].sort_values("busbw_gbps")
        ax.errorbar(tp["busbw_gbps"], tp["goodput_rps"], yerr=[tp["goodput_rps"] - tp["goodput_ci_lo"],
                    tp["goodput_ci_hi"] - tp["goodput_rps"]], marker="o", capsize=3, label="TP")
        for scheme, ls in (("PP_static", "--"), ("DCP_pred", ":")):
            r = sub[sub["scheme"] == scheme]
            if len(r):
                ax.axhline(float(r["goodput_rps"].iloc[0]), ls=ls, color="k", lw=1, label=scheme)
        ax.set_xlabel("all-reduce busBW (GB/s)")
        ax.set_ylabel("goodput (req/s)")
        ax.set_title(wl)
        ax.legend(fontsize=7)
    savefig(fig, ctx.out_dir / "busbw.png")
