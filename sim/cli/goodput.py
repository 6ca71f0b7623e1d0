"""`ppsim goodput`: the highest rate at which one config meets its SLOs (rate sweep + bisection)."""

from __future__ import annotations

import argparse

from sim.cli.common import SEEDS, TOL, jobs
from sim.core.errors import ConfigError

GOODPUT_EPILOG = """examples:
  ppsim goodput experiments/configs/default.toml
  ppsim goodput experiments/configs/tp4.toml --rates 1:6 --jobs 2
  ppsim goodput experiments/configs/default.toml --set scheduler.chunk_size_tokens=256 --seeds 3
  ppsim goodput experiments/configs/default.toml --rates 0.25:4 --slo ttft:p99:2000 --slo tpot:p90:150
  ppsim goodput experiments/configs/default.toml --concurrency 1:64
Goodput = the highest rate at which the percentiles the config's [slo] names (P90 TTFT and
P90 TPOT by default; --slo METRIC:pQ:MS) meet their thresholds. With --concurrency LO:HI, the
highest number of closed-loop clients ([workload] concurrency) that meets them instead.
"""



def add_commands(sub) -> None:
    p = sub.add_parser("goodput", help="find the goodput of one config (rate sweep + bisection)",
                       epilog=GOODPUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="run config (TOML); its workload's rate is swept")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--rates", default="1:10",
                   help="rates to sweep (req/s), LO:HI[:STEP] inclusive, fractions allowed (default 1:10)")
    p.add_argument("--concurrency", default=None, metavar="LO:HI",
                   help="sweep closed-loop clients instead of the rate: LO, 2 LO, ... HI, then bisection "
                        "(integers); reports the highest concurrency meeting the SLO")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="the serving engine's scheduler: fastpp (default), sglang, vllm-v1, vllm-v0 (same as --set scheduler.engine=...)")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC:pQ:MS",
                   help="an SLO at any percentile, e.g. ttft:p99:1000 (metrics: ttft, tpot, e2e); repeatable")
    p.add_argument("--tol", type=TOL, default=0.05, help="bisection tolerance in req/s (default 0.05)")
    p.add_argument("--seeds", type=SEEDS, default=1, help="replications (mean and 95%% CI)")
    p.add_argument("--jobs", type=jobs, default=1)
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None)
    p.add_argument("--out", default=None, help="folder for the per-rate CSV and the point cache")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_goodput)


def cmd_goodput(args) -> int:
    import pandas as pd

    from sim.core.config import config_from_table, load_table
    from sim.core.slo import slo_overrides
    from sim.studies.sweep import (
        Runner,
        Search,
        goodput_searches,
        mean_ci,
        parse_rates,
        per_rate_rows,
    )

    rates = parse_rates(args.rates)
    engine = [f'scheduler.engine="{args.engine}"'] if args.engine is not None else []  # ("": refused)
    base = load_table(args.config, args.set + engine + slo_overrides(args.slo))
    if not args.tol > 0:
        raise ConfigError(f"--tol must be > 0 (req/s), got {args.tol}")
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    from sim.core.plugins import add_to_table

    base = add_to_table(base, args.plugin)  # carried to the workers
    cfg = config_from_table(base, args.config)  # validates the config and the overrides
    from sim.cli.common import say_workload_changes

    say_workload_changes(cfg.workload, seed=cfg.seed)
    from sim.engine.schedulers import engine as engine_of

    engine_of(cfg.scheduler.engine)
    from sim.outputs.context import describe, format_header

    context = describe(cfg)
    if args.concurrency is not None:
        return _concurrency(args, base, cfg, context)
    context["rate"] = (f"swept: rates {rates[0]:g}-{rates[-1]:g} req/s ({len(rates)} points), then bisection to "
                       f"{args.tol:g} req/s (Poisson)")
    context["seed"] = f"{base.get('seed', 1)}" if args.seeds == 1 else f"1-{args.seeds}"
    print(format_header(context), flush=True)
    from sim.core import fsio

    out = fsio.claim(args.out, "goodput") if args.out else None  # a new folder, or an earlier goodput's
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
        fsio.write_frame(rows, out / "goodput_rates.csv", index=False)
    return 0


def _concurrency(args, base: dict, cfg, context: dict) -> int:
    """`--concurrency LO:HI`: the highest closed-loop client count meeting the SLO
    (sim/studies/concurrency.py), one search per seed."""
    import pandas as pd

    from sim.core import fsio
    from sim.outputs.context import format_header
    from sim.studies.concurrency import MIN_ROUNDS, parse_levels, rows, search
    from sim.studies.sweep import Runner, mean_ci

    lo, hi = parse_levels(args.concurrency)
    context["rate"] = (f"closed loop: concurrency swept {lo}, {2 * lo}, ... {hi}, then bisection (integers); "
                       f"at least {MIN_ROUNDS} requests per client")
    context["seed"] = f"{base.get('seed', 1)}" if args.seeds == 1 else f"1-{args.seeds}"
    print(format_header(context), flush=True)
    out = fsio.claim(args.out, "goodput") if args.out else None
    runner = Runner(out / "cache.jsonl" if out else None, jobs=args.jobs, executor=args.executor,
                    address=args.address, progress=not args.no_progress)
    found, table_rows = [], []
    for seed in range(1, args.seeds + 1):
        table = dict(base, seed=seed if args.seeds > 1 else base.get("seed", 1))
        best, s = search(runner, table, cfg.slo, lo, hi)
        found.append(best)
        table_rows += [{"seed": table["seed"], **r} for r in rows(s, list(cfg.slo.keys()))]
    frame = pd.DataFrame(table_rows)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    m, ci_lo, ci_hi = mean_ci([float(b) for b in found])
    note = " (even the lowest level fails)" if not any(found) else ""
    print(f"goodput: {m:.1f} concurrent clients with {cfg.slo.describe()}"
          + (f" (95% CI {ci_lo:.1f}-{ci_hi:.1f} over {args.seeds} seeds)" if args.seeds > 1 else "") + note)
    if out:
        fsio.write_frame(frame, out / "goodput_concurrency.csv", index=False)
    return 0
