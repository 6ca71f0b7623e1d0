"""`ppsim`: the command line. Every error is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from sim.errors import PipeSimError

EPILOG_RUN = """examples:
  ppsim run experiments/configs/default.toml --out runs/default
  ppsim run experiments/configs/default.toml --set workload.rate_rps=6 --set parallel.pp=2 --out runs/pp2
  ppsim run experiments/configs/default.toml --set scheduler.chunk_size_tokens=512 --json --out runs/c512
  ppsim run experiments/configs/default.toml --slo ttft:p99:3000 --slo tpot:p95:150 --out runs/p99
  ppsim run experiments/configs/default.toml --timeline --window 20:21 --out runs/timeline
  ppsim run experiments/configs/default.toml --trace my_trace.jsonl --out runs/mine   # replay a file
  ppsim run experiments/configs/default.toml --trace BurstGPT_1.csv --limit 2000 --set workload.drop_failed=true --out runs/burst
--trace FILE replaces the config's workload by the file (format detected: Azure/BurstGPT/plain
CSV, Mooncake JSONL, ShareGPT JSON; see workloads/README.md) replayed at its recorded times, all
rows unless --limit N; --set workload.KEY=VALUE sets the trace's fields (rate_rps for Poisson).
An --out folder holding another run is refused unless --force, which clears it first.
"""

EPILOG_MAIN = """examples:
  ppsim run experiments/configs/default.toml --out runs/default
  ppsim report runs/default
  ppsim goodput experiments/configs/tp4.toml --jobs 2
  ppsim plan --model qwen2.5-32b --gpus 4 --workload azure-conv-synth
  ppsim reproduce fig9 --quick
  ppsim list
Every command's --help lists its own examples. Errors are one line and exit with code 2.
"""

PLUGIN_COMMANDS = (
    ("sim.workloads.cli", "add_workload_commands"),
    ("sim.latency.cli", "add_profile_commands"),
    ("sim.experiments_cli", "add_experiment_commands"),
    ("sim.report", "add_report_commands"),
    ("sim.plan", "add_plan_commands"),
    ("sim.fidelity", "add_fidelity_commands"),
    ("sim.compare", "add_compare_commands"),
    ("sim.gate_cli", "add_gate_commands"),
)

# Commands that take --plugin FILE_OR_MODULE (repeatable) and --debug.
SIMULATING_COMMANDS = ("run", "list", "goodput", "reproduce", "plan", "gate", "validate", "fidelity")

SUMMARY_KEYS = (
    "status", "num_requests", "num_finished", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms",
    "p90_tpot_ms", "p99_tpot_ms", "p90_e2e_ms", "p50_itl_ms", "p99_itl_ms", "slo_attainment", "meets_p90_slo",
    "throughput_rps", "throughput_drain_rps",
    "p50_iter_ms", "p90_iter_ms", "p99_iter_ms", "bubble_fraction", "kv_capacity_tokens", "kv_peak_tokens",
    "num_retractions", "duration_s", "saturated", "sustained_throughput_rps",
)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def _jsonable(obj):
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if hasattr(obj, "item"):
        return obj.item()
    return obj


def cmd_run(args) -> int:
    from sim import tomlio
    from sim.config import apply_overrides, config_from_table, load_table
    from sim.context import describe, format_header
    from sim.engine.run import run
    from sim.metrics import iterations_frame, requests_frame, summarize
    from sim.outdir import prepare_out
    from sim.plugins import add_to_table
    from sim.workloads import build_workload

    table = load_table(args.config)
    if args.trace:
        from sim.workloads.readers import trace_workload

        if any(o.strip().startswith("workload.num_requests") for o in args.set):
            raise PipeSimError("--trace replays every row of the file; take the first N with --limit N, "
                               "not --set workload.num_requests")
        table["workload"] = trace_workload(args.trace, limit=args.limit)
    elif args.limit is not None:
        raise PipeSimError("--limit applies to --trace FILE only")
    from sim.slo import slo_overrides

    table = apply_overrides(table, args.set + slo_overrides(args.slo))
    if args.trace and "rate_rps" in table["workload"]:
        # A rate given for a trace means Poisson arrivals over its rows (a ShareGPT file has no times).
        if not any(o.strip().startswith("workload.arrivals") for o in args.set):
            table["workload"]["arrivals"] = "poisson"
    cfg = config_from_table(add_to_table(table, args.plugin), args.config)
    out = Path(args.out)
    prepare_out(out, args.force)
    requests = build_workload(cfg.workload, seed=cfg.seed)
    context = describe(cfg, requests)
    if not args.json:
        print(format_header(context), flush=True)
    from sim.engine.requests import RequestArrays

    requests = RequestArrays.of(requests)  # typed arrays; the list of RequestSpec goes
    # without iterations.csv (or a timeline) only the summary's iteration columns are kept
    result = run(cfg, requests, keep_iterations=args.iterations or args.timeline)
    import gc

    # the finished pipelines (schedulers, their samples) are reference cycles with SimPy's
    # processes: free them before the summary's peak, not whenever the collector next runs
    gc.collect()
    summary = summarize(result)
    summary["context"] = context
    from sim.csvout import write_csv

    if args.format == "npz":
        from sim.npzout import write_npz as write_table
    else:
        write_table = write_csv
    write_table(requests_frame(result), out / f"requests.{args.format}")
    if args.iterations:
        write_table(iterations_frame(result), out / f"iterations.{args.format}")
    (out / "config.toml").write_text(tomlio.dumps(cfg.to_dict()))
    (out / "summary.json").write_text(json.dumps(_jsonable(summary), indent=2, sort_keys=True) + "\n")
    import pandas as pd

    pd.DataFrame(result.decisions, columns=["time_s", "slot", "old_chunk", "new_chunk", "reason"]).to_csv(
        out / "decisions.csv", index=False)
    pd.DataFrame(result.moves, columns=["time_s", "slot", "req_id", "action", "where"]).to_csv(
        out / "moves.csv", index=False)
    if args.timeline:
        from sim.timeline import write_timeline

        window = None
        if args.window:
            try:
                a, b = (float(x) for x in args.window.split(":"))
            except ValueError:
                raise PipeSimError(f"--window {args.window!r}: expected START:END in seconds, e.g. 10:11") from None
            if not b > a:
                raise PipeSimError(f"--window {args.window!r}: END must be after START")
            window = (a, b)
        write_timeline(result, out, window)
    if args.json:
        print(json.dumps(_jsonable(summary), indent=2, sort_keys=True))
    else:
        width = max(len(k) for k in SUMMARY_KEYS)
        if summary.get("stage_layers"):
            print(f"{'stage_layers':<{width}}  {summary['stage_layers']}")
        # the percentiles the SLO names (e.g. p95_ttft_ms) besides the P50/P90/P99 ones
        extra = [k for k in cfg.slo.keys() if k not in SUMMARY_KEYS]
        for k in (*SUMMARY_KEYS, *extra):
            print(f"{k:<{width}}  {_fmt(summary.get(k))}")
        print(f"{'slo':<{width}}  {summary['slo']}")
        if summary["reason"]:
            print(f"{'reason':<{width}}  {summary['reason']}")
        print(f"outputs written to {out}/")
    return 0 if result.status == "ok" else 1


def cmd_list(args) -> int:
    from sim.config import REPO_ROOT
    from sim.policies import chunk_policies, rebalancers
    from sim.workloads import available_workloads

    profiles = sorted(str(p.parent.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "profiles").glob("*/*/tp*/meta.toml"))
    print("profiles:\n  " + "\n  ".join(profiles or ["(none)"]))
    from sim.latency.library import built_profile_lines

    print("built profiles (ppsim profile build --all; any other model/GPU/TP is built on demand):\n  "
          + "\n  ".join(built_profile_lines() or ["(none)"]))
    print("workloads:\n  " + "\n  ".join(available_workloads() or ["(none)"]))
    from sim.workloads.trace import trace_formats

    print("trace file formats (ppsim run --trace FILE, ppsim workload stats FILE):\n  "
          + ", ".join(n for n in trace_formats.names() if n != "auto") + " (detected: format = auto)")
    width = max(len(n) for n in chunk_policies.names() + rebalancers.names())
    for title, reg in (("chunk policies", chunk_policies), ("rebalancers", rebalancers)):
        print(f"{title}:\n  " + "\n  ".join(f"{n:<{width}}  ({reg.origin(n)})" for n in reg.names()))
    from experiments import EXPERIMENT_IDS
    from sim.schemes import SCHEMES

    print("schemes:\n  " + "\n  ".join(SCHEMES))
    print("experiments (ppsim reproduce ID):\n  " + "\n  ".join(EXPERIMENT_IDS))
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (`ppsim ...: error: ...; see --help`), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _one_line(exc: BaseException) -> str:
    # Ray re-raises a worker's error as RayTaskError(OriginalType), whose text is a traceback.
    cause = getattr(exc, "cause", None)
    text = str(cause if isinstance(cause, PipeSimError) else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ppsim", description="PipeSim: simulate TP and pipeline-parallel LLM serving.",
        epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("run", help="simulate one config and write its outputs", epilog=EPILOG_RUN,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="run config (TOML), e.g. experiments/configs/default.toml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted path; value parsed as TOML); repeatable")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC:pQ:MS",
                   help="an SLO at any percentile, e.g. ttft:p99:1000 (metrics: ttft, tpot, e2e); repeatable")
    p.add_argument("--out", required=True, help="output folder (new or empty; --force replaces an earlier run)")
    p.add_argument("--force", action="store_true", help="clear an --out folder that holds another run")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="replay this trace file instead of the config's workload (format detected)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="with --trace: only the first N rows")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-iterations", dest="iterations", action="store_false",
                   help="do not write iterations.csv (one row per iteration: the largest output); "
                        "the summary still covers every iteration")
    from sim.npzout import FORMATS

    p.add_argument("--format", choices=FORMATS, default="csv",
                   help="requests and iterations tables as CSV (default) or as .npz (NumPy arrays, one per "
                        "column: no text formatting, several times cheaper to write; sim/npzout.py)")
    p.add_argument("--timeline", action="store_true",
                   help="also write timeline.json (Perfetto/Chrome trace) and timeline.png (Gantt chart)")
    p.add_argument("--window", default=None, metavar="START:END",
                   help="time window of the Gantt chart in seconds (default: 1 s around a busy point)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("list", help="show shipped profiles, workloads, policies, schemes and experiments",
                       epilog="examples:\n  ppsim list\n  ppsim list | grep qwen2.5-14b\n",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=cmd_list)
    # Sub-command groups that live with their modules register themselves here.
    import importlib

    for module, func in PLUGIN_COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        getattr(mod, func)(sub)
    from sim.plugins import add_arguments

    for name in SIMULATING_COMMANDS:
        if name in sub.choices:
            add_arguments(sub.choices[name])
    return parser


def _flag_of(args, filename: str) -> str:
    """'--out ' when `filename` is the --out folder or inside it (the flag to blame), else ''."""
    for key, value in vars(args).items():
        if isinstance(value, str) and value and key not in ("command", "func"):
            base = value.rstrip("/") or "/"
            if filename == value or filename == base or filename.startswith(base + "/"):
                return f"--{key.replace('_', '-')} " if key != "config" else "config "
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed a one-line usage error
        return int(exc.code or 0)
    try:
        if hasattr(args, "plugin"):
            from sim.plugins import load_all, normalize

            args.plugin = [normalize(p) for p in args.plugin]
            load_all(args.plugin)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left shows up here, not at exit
        return code
    except PipeSimError as exc:
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        from sim.config import attribute_to_override

        msg = attribute_to_override(_one_line(exc), getattr(args, "set", None) or [])
        print(f"ppsim: error: {' '.join(msg.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head -1`) left: stop quietly, as `cat` does (128 + SIGPIPE).
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass  # stdout is not a file descriptor (e.g. captured): nothing will flush it at exit
        return 141
    except OSError as exc:
        if exc.filename is None or os.environ.get("PPSIM_DEBUG"):
            return _internal_error(exc)
        print(f"ppsim: error: {_flag_of(args, str(exc.filename))}{exc.filename}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug: one line, exit 1
        return _internal_error(exc)


def _internal_error(exc: BaseException) -> int:
    """A bug: one line naming the exception and where it was raised, exit 1;
    PPSIM_DEBUG=1 re-raises it for the traceback."""
    if os.environ.get("PPSIM_DEBUG"):
        raise exc
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
    print(f"ppsim: internal error: {type(exc).__name__}: {' '.join(str(exc).split())}{where} "
          f"(a bug; rerun with PPSIM_DEBUG=1 for the traceback)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
