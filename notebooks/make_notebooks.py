"""Writes the notebooks of this folder (run it after editing the cells below).

Each notebook reads `experiments/results/` (or the folder in $PIPESIM_RESULTS, which the tests
point at quick results) and shows the figures with commentary. They never simulate.
"""

from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parent
LOAD = """import os
from pathlib import Path
import pandas as pd
import matplotlib.pyplot as plt
RESULTS = Path(os.environ.get("PIPESIM_RESULTS", Path.cwd().parent / "experiments" / "results"))
if not RESULTS.is_dir():
    RESULTS = Path("experiments/results")
print("reading", RESULTS)"""

NOTEBOOKS = {
    "goodput_comparison.ipynb": [
        ("md", "# Goodput: TP vs PP and the dynamic-chunk schemes\n\nGoodput is the highest request rate at which "
               "P90 TTFT <= 2 s and P90 TPOT <= 200 ms (`fig9`, Qwen2.5-32B on 4x A100-40GB PCIe). Every number "
               "here comes out of `ppsim reproduce fig9`; nothing is typed in."),
        ("code", LOAD),
        ("code", "good = pd.read_csv(RESULTS / 'fig9_goodput.csv')\n"
                 "good.pivot(index='scheme', columns='workload', values='goodput_rps').round(2)"),
        ("md", "PP with a tuned static chunk (`PP_static`) against TP: the ratio per workload."),
        ("code", "piv = good.pivot(index='workload', columns='scheme', values='goodput_rps')\n"
                 "(piv['PP_static'] / piv['TP']).round(2).rename('PP_static / TP')"),
        ("code", "ax = good.pivot(index='workload', columns='scheme', values='goodput_rps').plot.bar(figsize=(9, 3.5))\n"
                 "ax.set_ylabel('goodput (req/s)'); plt.show()"),
        ("md", "Per-rate P90 TTFT of every scheme on azure-conv (the curves behind the goodput bars)."),
        ("code", "rows = pd.read_csv(RESULTS / 'fig9.csv')\n"
                 "sub = rows[(rows.workload == 'azure-conv') & rows.integer_rate]\n"
                 "sub.pivot_table(index='rate_rps', columns='scheme', values='p90_ttft_ms').round(0)"),
    ],
    "iteration_latency.ipynb": [
        ("md", "# Per-iteration latency: static vs dynamic chunks (`fig11`)\n\nAn iteration is one lock-step step "
               "of the pipeline. Dynamic chunking shortens the slow iterations that a fixed chunk creates when "
               "prefill and decode mix."),
        ("code", LOAD),
        ("code", "pct = pd.read_csv(RESULTS / 'fig11.csv')\n"
                 "pct[['workload', 'scheme', 'rate_rps', 'p50_iter_ms', 'p90_iter_ms', 'p99_iter_ms']].round(1)"),
        ("code", "cdf = pd.read_csv(RESULTS / 'fig11_cdf.csv')\n"
                 "fig, axes = plt.subplots(1, cdf.workload.nunique(), figsize=(14, 3.2), squeeze=False)\n"
                 "for ax, (wl, g) in zip(axes[0], cdf.groupby('workload')):\n"
                 "    for scheme, s in g.groupby('scheme'):\n"
                 "        ax.plot(s['iter_ms'], s['quantile'], label=scheme)\n"
                 "    ax.set_title(wl); ax.set_xlabel('iteration (ms)'); ax.legend(fontsize=7)\n"
                 "plt.show()"),
    ],
    "trace_replay.ipynb": [
        ("md", "# Trace replay (`fig14`)\n\nThe first 15 minutes of the Azure conversation trace, at 0.9x the "
               "recorded rate. Attainment counts requests that meet both their TTFT and TPOT SLO."),
        ("code", LOAD),
        ("code", "att = pd.read_csv(RESULTS / 'fig14.csv')\n"
                 "att.pivot(index='scheme', columns='tpot_slo_ms', values='slo_attainment').round(3)"),
        ("code", "att[['scheme', 'tpot_slo_ms', 'finished_within_60s', 'p90_ttft_ms', 'p90_tpot_ms']].round(3)"),
        ("code", "cdf = pd.read_csv(RESULTS / 'fig14_cdf.csv')\n"
                 "base = cdf[cdf.tpot_slo_ms == 200]\n"
                 "fig, axes = plt.subplots(1, 3, figsize=(14, 3.2))\n"
                 "for ax, (metric, g) in zip(axes, base.groupby('metric')):\n"
                 "    for scheme, s in g.groupby('scheme'):\n"
                 "        ax.plot(s['value_ms'], s['quantile'], label=scheme)\n"
                 "    ax.set_xscale('log'); ax.set_title(metric); ax.legend(fontsize=6)\n"
                 "plt.show()"),
    ],
}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nb = nbf.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in cells]
        nbf.write(nb, HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
