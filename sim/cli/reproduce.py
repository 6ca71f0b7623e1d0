"""`ppsim reproduce`: regenerate the paper's figures from the simulator."""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

from sim.cli.common import SEEDS, jobs
from sim.core.errors import ConfigError

EPILOG = """examples:
  ppsim reproduce fig1 --quick                 # minutes; writes results-quick/
  ppsim reproduce fig9 --jobs 2                # full size; writes experiments/results/
  ppsim reproduce all --jobs 2
  ppsim reproduce fig9 --executor ray --address auto
  ppsim reproduce fig1 --plot-only             # redraw fig1.png from fig1.csv
Interrupted sweeps resume: finished points are cached under OUT/cache/.
"""



def add_commands(sub) -> None:
    from experiments import EXPERIMENT_IDS

    p = sub.add_parser("reproduce", help="regenerate a paper figure (or all) from simulation", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help=f"one of: {', '.join(EXPERIMENT_IDS)}, all")
    p.add_argument("--quick", action="store_true", help="fewer requests and rates (CI); writes results-quick/")
    p.add_argument("--jobs", type=jobs, default=1, help="parallel simulation processes (default 1)")
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    p.add_argument("--seeds", type=SEEDS, default=None,
                   help="paired seeds 1..N of every run and goodput search (default 3; 1 with --quick)")
    p.add_argument("--out", default=None, help="output folder (default experiments/results or results-quick)")
    p.add_argument("--plot-only", action="store_true", help="redraw the figures from existing CSVs")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args) -> int:
    from experiments import EXPERIMENT_IDS
    from experiments.common import REPO, RESULTS, Context

    ids = list(EXPERIMENT_IDS) if args.experiment == "all" else [args.experiment]
    for i in ids:
        if i not in EXPERIMENT_IDS:
            raise ConfigError(f"unknown experiment {i!r}; allowed: {', '.join(EXPERIMENT_IDS)}, all")
    if args.seeds is None:
        args.seeds = 1 if args.quick else 3
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    from sim.core import fsio

    # a new folder, or a results folder reproduce made (experiments/results/ is one: .pipesim)
    out = fsio.claim(Path(args.out) if args.out else (REPO / "results-quick" if args.quick else RESULTS), "results")
    ctx = Context(out_dir=out, quick=args.quick, jobs=args.jobs, executor=args.executor, address=args.address,
                  progress=not args.no_progress, seeds=tuple(range(1, args.seeds + 1)))
    total = time.perf_counter()
    try:
        for exp_id in ids:
            mod = importlib.import_module(f"experiments.{exp_id}")
            t0 = time.perf_counter()
            if not args.plot_only:
                mod.compute(ctx)
            mod.plot(ctx)
            print(f"{exp_id}: done in {time.perf_counter() - t0:.1f}s -> {out}/{exp_id}.csv, {exp_id}.png", flush=True)
    finally:
        if ctx._runner is not None:
            ctx._runner.close()
    print(f"all done in {time.perf_counter() - total:.1f}s")
    return 0
