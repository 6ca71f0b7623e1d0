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
    p.add_argument("--seeds", type=int, default=None,
                   help="paired seeds 1..N of every run and goodput search (default 3; 1 with --quick)")
    p.add_argument("--out", default=None, help="output folder (default experiments/results or results-quick)")
    p.add_argument("--plot-only", action="store_true", help="redraw the figures from existing CSVs")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("goodput", help="find the goodput of one config (rate sweep + bisection)",
                       epilog=GOODPUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="run config (TOML); its workload's rate is swept")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--rates", default="1:10",
                   help="rates to sweep (req/s), LO:HI[:STEP] inclusive, fractions allowed (default 1:10)")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC:pQ:MS",
                   help="an SLO at any percentile, e.g. ttft:p99:1000 (metrics: ttft, tpot, e2e); repeatable")
    p.add_argument("--tol", type=float, default=0.05, help="bisection tolerance in req/s (default 0.05)")
    p.add_argument("--seeds", type=int, default=1, help="replications (mean and 95%% CI)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None)
    p.add_argument("--out", default=None, help="folder for the per-rate CSV and the point cache")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_goodput)

    p = sub.add_parser("validate", help="compare the simulator with a real SGLang/vLLM benchmark result",
                       epilog=VALIDATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench-log", required=True,
                   help="SGLang bench_serving JSONL or vLLM benchmark_serving / vllm bench serve JSON result")
    p.add_argument("--workload", default=None,
                   help="simulate this workload instead of the log's own requests (needed when the log has no "
                        "input_lens/output_lens)")
    p.add_argument("--config", default=None, help="run config of the deployment (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--units", default="s", help="units of the lists in the log: s (default) or ms")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON records")
    p.set_defaults(func=cmd_validate)


VALIDATE_EPILOG = """examples:
  ppsim validate --bench-log sglang_0101_1000_sharegpt.jsonl       # bench_serving --output-details
  ppsim validate --bench-log vllm-4.0qps-Qwen2.5-32B.json --config experiments/configs/tp4.toml
  ppsim validate --bench-log run.jsonl --workload sharegpt --set scheduler.chunk_size_tokens=512
Reads SGLang bench_serving JSONL (one result per line) and vLLM benchmark_serving / vllm bench serve
JSON: request_rate, the per-request lists input_lens, output_lens, ttfts, itls, errors (seconds),
and the aggregates (mean/median/p99_ttft_ms, ...). The log's own successful requests are replayed
at its rate on the --config deployment (default: experiments/configs/default.toml), whose header
is printed; mean/P50/P90/P99 of TTFT, TPOT, ITL and E2E and the throughputs are compared.
The FastPP fork's ttfts/tpots/e2es lists (--units ms for ms) need --workload. See sim/validate.py.
"""


GOODPUT_EPILOG = """examples:
  ppsim goodput experiments/configs/default.toml
  ppsim goodput experiments/configs/tp4.toml --rates 1:6 --jobs 2
  ppsim goodput experiments/configs/default.toml --set scheduler.chunk_size_tokens=256 --seeds 3
  ppsim goodput experiments/configs/default.toml --rates 0.25:4 --slo ttft:p99:2000 --slo tpot:p90:150
Goodput = the highest rate at which the percentiles the config's [slo] names (P90 TTFT and
P90 TPOT by default; --slo METRIC:pQ:MS) meet their thresholds.
"""


def cmd_goodput(args) -> int:
    import pandas as pd

    from sim.config import config_from_table, load_table
    from sim.sweep import Runner, Search, goodput_searches, mean_ci, per_rate_rows

    from sim.slo import slo_overrides
    from sim.sweep import parse_rates

    rates = parse_rates(args.rates)
    base = load_table(args.config, args.set + slo_overrides(args.slo))
    if not args.tol > 0:
        raise ConfigError(f"--tol must be > 0 (req/s), got {args.tol}")
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    from sim.plugins import add_to_table

    base = add_to_table(base, args.plugin)  # carried to the workers
    cfg = config_from_table(base, args.config)  # validates the config and the overrides
    from sim.context import describe, format_header

    context = describe(cfg)
    context["rate"] = (f"swept: rates {rates[0]:g}-{rates[-1]:g} req/s ({len(rates)} points), then bisection to "
                       f"{args.tol:g} req/s (Poisson)")
    context["seed"] = f"{base.get('seed', 1)}" if args.seeds == 1 else f"1-{args.seeds}"
    print(format_header(context), flush=True)
    out = Path(args.out) if args.out else None
    runner = Runner(out / "cache.jsonl" if out else None, jobs=args.jobs, executor=args.executor,
                    address=args.address, progress=not args.no_progress)
    searches = []
    for seed in range(1, args.seeds + 1):
        table = dict(base, seed=seed if args.seeds > 1 else base.get("seed", 1))
        searches.append(Search({"seed": table["seed"]}, table, list(rates), slo=cfg.slo))
    res = goodput_searches(runner, searches, tol=args.tol)
    rows = pd.DataFrame(per_rate_rows(searches))
    cols = ["seed", "rate_rps", "meets_slo", *cfg.slo.keys(), "slo_attainment", "status"]
    print(rows[rows["integer_rate"]][cols].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    m, ci_lo, ci_hi = mean_ci([r["goodput_rps"] for r in res])
    flags = sorted(set(r["flag"] for r in res if r["flag"]))
    print(f"goodput: {m:.2f} req/s with {cfg.slo.describe()}" + (f" (95% CI {ci_lo:.2f}-{ci_hi:.2f} over {args.seeds} seeds)" if args.seeds > 1 else "")
          + (f" [{'; '.join(flags)}]" if flags else ""))
    if out:
        rows.to_csv(out / "goodput_rates.csv", index=False)
    return 0


def cmd_validate(args) -> int:
    import json

    from experiments.common import REPO
    from sim.validate import validate

    import sys

    config = args.config or str(REPO / "experiments" / "configs" / "default.toml")
    # The headers say what was simulated; with --json they go to stderr, stdout stays JSON.
    echo = (lambda text: print(text, file=sys.stderr)) if args.json else print
    df = validate(args.bench_log, args.workload, config, args.set, args.units, echo=echo)
    if args.json:
        records = df.astype(object).where(df.notna(), None).to_dict(orient="records")  # NaN -> null
        print(json.dumps(records, indent=1))
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
    if args.seeds is None:
        args.seeds = 1 if args.quick else 3
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    out = Path(args.out) if args.out else (REPO / "results-quick" if args.quick else RESULTS)
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
