"""`ppsim run`: simulate one config and write its outputs (summary, tables, timeline)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from sim.cli.common import int_in, warn
from sim.core.errors import PipeSimError
from sim.core.fsio import Staged

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

SUMMARY_KEYS = (
    "status", "num_requests", "num_finished", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms",
    "p90_tpot_ms", "p99_tpot_ms", "p90_e2e_ms", "p50_itl_ms", "p99_itl_ms", "slo_attainment", "meets_p90_slo",
    "throughput_rps", "throughput_drain_rps",
    "p50_iter_ms", "p90_iter_ms", "p99_iter_ms", "bubble_fraction", "kv_capacity_tokens", "kv_peak_tokens",
    "num_retractions", "duration_s", "offered_rate_rps", "completion_rate_rps", "saturated",
    "sustained_throughput_rps",
)


CLUSTER_KEYS = ("mode", "gpus", "nodes_used", "mean_kv_transfer_ms", "p99_kv_transfer_ms", "mean_kv_wait_ms",
                "kv_link_utilisation_max")


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
    from sim.core.config import apply_overrides, config_from_table, load_table
    from sim.core.plugins import add_to_table

    table = load_table(args.config)
    if args.trace:
        from sim.workloads.readers import trace_workload

        if any(o.strip().startswith("workload.num_requests") for o in args.set):
            raise PipeSimError("--trace replays every row of the file; take the first N with --limit N, "
                               "not --set workload.num_requests")
        table["workload"] = trace_workload(args.trace, limit=args.limit)
    elif args.limit is not None:
        raise PipeSimError("--limit applies to --trace FILE only")
    from sim.core.slo import slo_overrides

    engine = [f'scheduler.engine="{args.engine}"'] if args.engine is not None else []  # ("": refused)
    table = apply_overrides(table, args.set + engine + slo_overrides(args.slo))
    if args.trace and "rate_rps" in table["workload"]:
        # A rate given for a trace means Poisson arrivals over its rows (a ShareGPT file has no times).
        if not any(o.strip().startswith("workload.arrivals") for o in args.set):
            table["workload"]["arrivals"] = "poisson"
    cfg = config_from_table(add_to_table(table, args.plugin), args.config)
    from sim.engine.schedulers import engine

    engine(cfg.scheduler.engine)  # an unknown engine is refused before anything is printed
    window = _parse_window(args.window) if args.window else None
    out = Path(args.out)
    # the new run is written beside --out and swapped in only once complete: a refused or
    # failed run leaves an earlier run in --out as it was (sim/core/fsio.py)
    with Staged(out, args.force) as staged:
        code, summary = _simulate_into(staged.path, cfg, args, window)
        staged.commit()
    if args.json:
        print(json.dumps(_jsonable(summary), indent=2, sort_keys=True))
    else:
        _print_summary(summary, cfg, out)
    return code


def _parse_window(text: str) -> tuple[float, float]:
    from sim.core.checks import number

    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise PipeSimError(f"--window {text!r}: expected START:END in seconds, e.g. 10:11") from None
    number(a, "", f"--window {text!r}: START", 0, 1e9)
    number(b, "", f"--window {text!r}: END", 0, 1e9)
    if not b > a:
        raise PipeSimError(f"--window {text!r}: END must be after START")
    return a, b


def run_warnings(summary: dict, cfg=None) -> list[str]:
    """What the run changed of the requests it was given, said in words (also in summary.json)."""
    out = []
    # the request limit is the context length or, when smaller, the KV pool (sim/engine/run.py pool_sizes)
    limit = "the context length"
    kv = summary.get("kv_capacity_tokens")
    if cfg is not None and cfg.disaggregation is None and isinstance(kv, int) \
            and kv < cfg.scheduler.context_length_tokens:
        limit = f"the KV pool ({kv} tokens, smaller than the context length)"
    n = summary.get("num_truncated_prompts") or 0
    if n:
        out.append(f"{n} prompt(s) longer than {limit} were truncated (requests.csv: truncated_prompt)")
    n = summary.get("num_clipped_outputs") or 0
    if n:
        out.append(f"{n} output(s) were clipped to fit {limit} (requests.csv: clipped_output)")
    n = summary.get("num_timed_out") or 0
    if n:
        out.append(f"{n} request(s) timed out at the client ([workload] request_timeout_s): counted as failed, left "
                   f"out of every latency and throughput (requests.csv: status timed_out)")
    n = summary.get("num_ignored") or 0
    if n:
        out.append(f"{n} request(s) were ignored by the engine (a prompt that can never fit its KV pool, vLLM 0.6.3's "
                   f"FINISHED_IGNORED): left out of every latency and throughput (requests.csv: status ignored)")
    out += list(summary.get("placement_warnings") or [])  # TP groups spanning nodes (sim/engine/cluster.py)
    return out


def _simulate_into(out: Path, cfg, args, window) -> tuple[int, dict]:
    from sim.core import fsio, tomlio
    from sim.engine.run import run
    from sim.outputs.context import describe, format_header
    from sim.outputs.metrics import iterations_frame, requests_frame, summarize
    from sim.workloads import build_workload_said

    # `changed`: what the workload's reader skipped or dropped of its file (rows, conversations)
    requests, changed = build_workload_said(cfg.workload, seed=cfg.seed)
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
    warnings = changed + run_warnings(summary, cfg)
    from sim.outputs.csvout import write_csv

    if args.format == "parquet":
        from sim.outputs.tables import write_parquet as write_table
    else:
        write_table = write_csv
    write_table(requests_frame(result), out / f"requests.{args.format}")
    if args.iterations:
        write_table(iterations_frame(result), out / f"iterations.{args.format}")
    fsio.write_text(out / "config.toml", tomlio.dumps(cfg.to_dict()))
    import pandas as pd

    fsio.write_frame(pd.DataFrame(result.decisions, columns=["time_s", "slot", "old_chunk", "new_chunk", "reason"]),
                     out / "decisions.csv", index=False)
    fsio.write_frame(pd.DataFrame(result.moves, columns=["time_s", "slot", "req_id", "action", "where"]),
                     out / "moves.csv", index=False)
    if args.timeline:
        from sim.outputs.timeline import iterations_in, write_timeline

        if window is not None and iterations_in(result, window) == 0:
            warnings.append(f"--window {args.window}: no iteration runs in it (the run spans "
                            f"0-{summary.get('duration_s', 0):.4g} s); timeline.png is empty")
        write_timeline(result, out, window)
    if warnings:
        summary["warnings"] = warnings
    for w in warnings:
        warn(w)
    fsio.write_text(out / "summary.json", json.dumps(_jsonable(summary), indent=2, sort_keys=True) + "\n")
    return (0 if result.status == "ok" else 1), summary


def _print_summary(summary: dict, cfg, out: Path) -> None:
    width = max(len(k) for k in SUMMARY_KEYS)
    if summary.get("stage_layers"):
        print(f"{'stage_layers':<{width}}  {summary['stage_layers']}")
    # the percentiles the SLO names (e.g. p95_ttft_ms) besides the P50/P90/P99 ones
    extra = [k for k in cfg.slo.keys() if k not in SUMMARY_KEYS]
    for k in (*SUMMARY_KEYS, *extra):
        print(f"{k:<{width}}  {_fmt(summary.get(k))}")
    for k in CLUSTER_KEYS:  # multi-node and disaggregated runs only (sim/outputs/cluster.py)
        if k in summary:
            print(f"{k:<{width}}  {_fmt(summary.get(k))}")
    print(f"{'slo':<{width}}  {summary['slo']}")
    if summary["reason"]:
        print(f"{'reason':<{width}}  {summary['reason']}")
    print(f"outputs written to {out}/")


def add_commands(sub) -> None:
    p = sub.add_parser("run", help="simulate one config and write its outputs", epilog=EPILOG_RUN,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="run config (TOML), e.g. experiments/configs/default.toml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted path; value parsed as TOML); repeatable")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="the serving engine's scheduler: fastpp (default), sglang, vllm-v1, vllm-v0 (same as --set scheduler.engine=...)")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC:pQ:MS",
                   help="an SLO at any percentile, e.g. ttft:p99:1000 (metrics: ttft, tpot, e2e); repeatable")
    p.add_argument("--out", required=True, help="output folder (new or empty; --force replaces an earlier run)")
    p.add_argument("--force", action="store_true", help="clear an --out folder that holds another run")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="replay this trace file instead of the config's workload (format detected)")
    p.add_argument("--limit", type=int_in(1, 1 << 40), default=None, metavar="N", help="with --trace: only the first N rows")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-iterations", dest="iterations", action="store_false",
                   help="do not write iterations.csv (one row per iteration: the largest output); "
                        "the summary still covers every iteration")
    from sim.outputs.tables import FORMATS

    p.add_argument("--format", choices=FORMATS, default="csv",
                   help="requests and iterations tables as CSV (default) or Parquet (pyarrow: no text "
                        "formatting, many times cheaper to write; sim/outputs/tables.py)")
    p.add_argument("--timeline", action="store_true",
                   help="also write timeline.json (Perfetto/Chrome trace) and timeline.png (Gantt chart)")
    p.add_argument("--window", default=None, metavar="START:END",
                   help="time window of the Gantt chart in seconds (default: 1 s around a busy point)")
    p.set_defaults(func=cmd_run)
