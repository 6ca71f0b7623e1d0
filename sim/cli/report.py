"""`ppsim report`: a one-page summary of a run folder (sim/outputs/report.py)."""

from __future__ import annotations

import argparse

from sim.outputs.report import make_report

EPILOG = """examples:
  ppsim run experiments/configs/default.toml --out runs/default
  ppsim report runs/default          # writes runs/default/report.md and report.png
"""



def add_commands(sub) -> None:
    p = sub.add_parser("report", help="one-page summary of a run folder", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="the --out folder of 'ppsim run'")
    p.set_defaults(func=cmd_report)



def cmd_report(args) -> int:
    md, png = make_report(args.run_dir)
    print(f"wrote {md} and {png}")
    return 0
