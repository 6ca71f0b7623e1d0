"""`ppsim compare`: percentiles of two or more runs side by side, with their CDFs (sim/outputs/compare.py)."""

from __future__ import annotations

import argparse

from sim.core.errors import ConfigError
from sim.core.lazy import lazy
from sim.outputs.compare import compare_table, context_differences, load_run, plot_cdfs

pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

EPILOG = """examples:
  ppsim compare runs/pp4 runs/tp4
  ppsim compare runs/pp4 runs/tp4 runs/dcp --out runs/compare-pp-tp
Writes OUT/compare.csv (the table) and OUT/compare.png (CDFs of TTFT, TPOT, E2E, per-iteration latency).
"""



def add_commands(sub) -> None:
    p = sub.add_parser("compare", help="compare two or more run folders: table of percentiles and CDF plots",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders written by `ppsim run --out` (two or more)")
    p.add_argument("--out", default="runs/compare", help="folder for compare.csv and compare.png (default runs/compare)")
    p.set_defaults(func=cmd_compare)



def cmd_compare(args) -> int:
    if len(args.runs) < 2:
        raise ConfigError("ppsim compare needs at least two run folders")
    runs = [load_run(r) for r in args.runs]
    diffs = context_differences(runs)
    if diffs:
        print("# runs differ in:\n" + "\n".join(f"#   {d}" for d in diffs))
    table = compare_table(runs)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    from sim.core import fsio

    out = fsio.claim(args.out, "compare")
    fsio.write_frame(table, out / "compare.csv", index=False, float_format="%.6g")
    plot_cdfs(runs, out / "compare.png")
    print(f"wrote {out}/compare.csv, {out}/compare.png")
    return 0
