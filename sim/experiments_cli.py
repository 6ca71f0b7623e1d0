"""`ppsim reproduce`: regenerate the paper's figures from the simulator."""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

from sim.errors import ConfigError

EPILOG = """examples:
  ppsim reproduce fig1 --quick                 # minutes; writes results-quick/
  ppsim reproduce fig9 --jobs 2                # full size; writes experiments/results/
  ppsim reproduce all --jobs 2
  ppsim reproduce fig9 --executor ray --address auto
  ppsim reproduce fig1 --plot-only             # redraw fig1.png from fig1.csv
Interrupted sweeps resume: finished points are cached under OUT/cache/.
"""


def add_experiment_commands(sub) -> None:
    from experiments import EXPERIMENT_IDS

    p = sub.add_parser("reproduce", help="regenerate a paper figure (or all) from simulation", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help=f"one of: {', '.join(EXPERIMENT_IDS)}, all")
    p.add_argument("--quick", action="store_true", help="fewer requests and rates (CI); writes results-quick/")
    p.add_argument("--jobs", type=int, default=1, help="parallel simulation processes (default 1)")
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    p.add_argument("--seeds", type=int, default=1, help="replications of each goodput search (default 1)")
    p.add_argument("--out", default=None, help="output folder (default experiments/results or results-quick)")
    p.add_argument("--plot-only", action="store_true", help="redraw the figures from existing CSVs")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("goodput", help="find the goodput of one config (rate sweep + bisection)",
                       epilog=GOODPUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="run config (TOML); its workload's rate is swept")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--rates", default="1:10", help="integer rates to sweep, LO:HI inclusive (default 1:10)")
    p.add_argument("--tol", type=float, default=0.05, help="bisection tolerance in req/s (default 0.05)")
    p.add_argument("--seeds", type=int, default=1, help="replications (mean and 95%% CI)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None)
    p.add_argument("--out", default=None, help="folder for the per-rate CSV and the point cache")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_goodput)

    p = sub.add_parser("validate", help="compare the simulator with a real bench_serving run",
                       epilog=VALIDATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench-log", required=True, help="bench_serving JSONL result file")
    p.add_argument("--workload", required=True, help="workload the real run used (a name in workloads/)")
    p.add_argument("--config", default=None, help="run config of the deployment (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--units", default="s", help="units of the lists in the log: s (default) or ms")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON records")
    p.set_defaults(func=cmd_validate)


VALIDATE_EPILOG = """examples:
  ppsim validate --bench-log sglang_results.jsonl --workload azure-conv
  ppsim validate --bench-log run.jsonl --workload sharegpt --set scheduler.chunk_size_tokens=512
Format: one JSON object per line with request_rate and the lists ttfts, tpots, e2es (seconds;
--units ms for milliseconds), as SGLang's bench_serving writes them. See sim/validate.py.
"""


GOODPUT_EPILOG = """examples:
  ppsim goodput experiments/configs/default.toml
  ppsim goodput experiments/configs/tp4.toml --rates 1:6 --jobs 2
  ppsim goodput experiments/configs/default.toml --set scheduler.chunk_size_tokens=256 --seeds 3
Goodput = the highest rate at which P90 TTFT and P90 TPOT meet the config's [slo].
"""


def cmd_goodput(args) -> int:
    import pandas as pd

    from sim.config import config_from_table, load_table
    from sim.sweep import Runner, Search, goodput_searches, mean_ci, per_rate_rows

    try:
        lo, hi = (int(x) for x in args.rates.split(":"))
    except ValueError:
        raise ConfigError(f"--rates {args.rates!r}: expected LO:HI integers, e.g. 1:10") from None
    if not 0 < lo <= hi:
        raise ConfigError(f"--rates {args.rates!r}: need 0 < LO <= HI")
    from sim.plugins import add_to_table

    base = add_to_table(load_table(args.config, args.set), args.plugin)  # carried to the workers
    cfg = config_from_table(base, args.config)  # validates the config and the overrides
    out = Path(args.out) if args.out else None
    runner = Runner(out / "cache.jsonl" if out else None, jobs=args.jobs, executor=args.executor,
                    address=args.address, progress=not args.no_progress)
    searches = []
    for seed in range(1, args.seeds + 1):
        table = dict(base, seed=seed if args.seeds > 1 else base.get("seed", 1))
        searches.append(Search({"seed": table["seed"]}, table, list(range(lo, hi + 1)), cfg.slo.ttft_ms, cfg.slo.tpot_ms))
    res = goodput_searches(runner, searches, tol=args.tol)
    rows = pd.DataFrame(per_rate_rows(searches))
    cols = ["seed", "rate_rps", "meets_slo", "p90_ttft_ms", "p90_tpot_ms", "slo_attainment", "status"]
    print(rows[rows["integer_rate"]][cols].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    m, ci_lo, ci_hi = mean_ci([r["goodput_rps"] for r in res])
    flags = sorted(set(r["flag"] for r in res if r["flag"]))
    print(f"goodput: {m:.2f} req/s" + (f" (95% CI {ci_lo:.2f}-{ci_hi:.2f} over {args.seeds} seeds)" if args.seeds > 1 else "")
          + (f" [{'; '.join(flags)}]" if flags else ""))
    if out:
        rows.to_csv(out / "goodput_rates.csv", index=False)
    return 0


def cmd_validate(args) -> int:
    import json

    from experiments.common import REPO
    from sim.validate import validate

    config = args.config or str(REPO / "experiments" / "configs" / "default.toml")
    df = validate(args.bench_log, args.workload, config, args.set, args.units)
    if args.json:
        print(json.dumps(df.to_dict(orient="records"), indent=1))
    else:
        print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0


def cmd_reproduce(args) -> int:
    from experiments import EXPERIMENT_IDS
    from experiments.common import REPO, RESULTS, Context

    ids = list(EXPERIMENT_IDS) if args.experiment == "all" else [args.experiment]
    for i in ids:
        if i not in EXPERIMENT_IDS:
            raise ConfigError(f"unknown experiment {i!r}; allowed: {', '.join(EXPERIMENT_IDS)}, all")
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    out = Path(args.out) if args.out else (REPO / "results-quick" if args.quick else RESULTS)
    ctx = Context(out_dir=out, quick=args.quick, jobs=args.jobs, executor=args.executor, address=args.address,
                  progress=not args.no_progress, seeds=tuple(range(1, args.seeds + 1)))
    total = time.perf_counter()
    for exp_id in ids:
        mod = importlib.import_module(f"experiments.{exp_id}")
        t0 = time.perf_counter()
        if not args.plot_only:
            mod.compute(ctx)
        mod.plot(ctx)
        print(f"{exp_id}: done in {time.perf_counter() - t0:.1f}s -> {out}/{exp_id}.csv, {exp_id}.png", flush=True)
    print(f"all done in {time.perf_counter() - total:.1f}s")
    return 0
