"""`ppsim fidelity`: simulated results against the published calibration targets (sim/studies/fidelity.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.core.config import REPO_ROOT
from sim.core.errors import DataError
from sim.studies.fidelity import write_report

EPILOG = """examples:
  ppsim fidelity                                  # reads experiments/results, writes fidelity.md there
  ppsim fidelity --results results-quick --out /tmp/fidelity.md
"""



def add_commands(sub) -> None:
    p = sub.add_parser("fidelity", help="compare results with the published calibration targets", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=None, help="results folder (default experiments/results)")
    p.add_argument("--out", default=None, help="report path (default RESULTS/fidelity.md; another file only if new)")
    p.add_argument("--force", action="store_true", help="let --out replace an existing file")
    p.set_defaults(func=cmd_fidelity)



def cmd_fidelity(args) -> int:
    results = Path(args.results) if args.results else REPO_ROOT / "experiments" / "results"
    if not results.is_dir():
        raise DataError(f"--results {results}: not a folder; allowed: the --out folder of 'ppsim reproduce'")
    from sim.core import fsio

    out = fsio.check_new_file(args.out, args.force, "--out", owner_kinds=("results",)) if args.out else results / "fidelity.md"
    path = write_report(results, out)
    print(f"wrote {path}")
    return 0
