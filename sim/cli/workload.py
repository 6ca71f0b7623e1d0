"""The `workload` command group: list, fetch, stats, plot.

`add_commands(subparsers)` plugs the group into the main `ppsim` parser; every
sub-command sets `func(args) -> int`. Handlers raise `PipeSimError` subclasses for bad input
and leave turning them into messages and exit code 2 to the caller (`main` here does the same,
for tests and `python -m sim.cli.workload`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

from sim.cli.common import int_in
from sim.core.errors import ConfigError, PipeSimError
from sim.workloads import available_workloads, load_workload_file
from sim.workloads.fetch import DOWNLOADS, cache_dir, download_for_file, fetch
from sim.workloads.stats import (
    describe_requests,
    format_stats,
    is_trace_file,
    trace_source,
    workload_stats,
)
from sim.workloads.trace import resolve_trace_file

RAW = argparse.RawDescriptionHelpFormatter
SELECTION_HELP = """\
For a trace workload the statistics describe the trace itself: all rows at their recorded
times, unless --set num_requests=N (first N rows) or --set window_minutes=M (a window; also
window_start_minutes, sample_ratio, timestamp_speedup) is given. --as-built describes exactly
the requests a run builds from the workload (its arrival mode, rate and --seed)."""


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """`key=value` pairs; values are TOML (numbers, true, [1, 2], "text"), else plain strings;
    dotted keys (`lengths.swap=true`) set nested fields."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {p!r} is already set to a value")
        node[parts[-1]] = value
    return out


def cmd_list(args: argparse.Namespace) -> int:
    for name in available_workloads():
        table = load_workload_file(name)
        status = "no download needed"
        if table.get("kind") == "trace":
            file = str(table.get("file", ""))
            d = download_for_file(Path(file).name)
            try:
                resolve_trace_file(file, name)
                status = "trace cached"
            except PipeSimError:
                status = f"trace missing: ppsim workload fetch {d.id}" if d else f"trace file {file} missing"
        print(f"{name:18s} {table.get('kind', '?'):17s} [{status}]\n    {table.get('description', '')}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    path = fetch(args.id, url=args.url, force=args.force)
    print(f"{args.id}: {path} (SHA-256 {DOWNLOADS[args.id].sha256[:12]}... ok)")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    sets = parse_set(args.set)
    reqs = describe_requests(args.name, sets, seed=args.seed, as_built=args.as_built)
    stats = workload_stats(reqs)
    source = trace_source(args.name, sets) if is_trace_file(args.name) else None
    if args.json:
        print(json.dumps({"source": source, **stats} if source else stats, indent=2))
    else:
        print((f"source           {source}\n" if source else "") + format_stats(stats))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")  # no display; PNGs only
    import matplotlib.pyplot as plt

    reqs = describe_requests(args.name, parse_set(args.set), seed=args.seed, as_built=args.as_built)
    from sim.core import fsio

    out = fsio.claim(args.out, "plots")
    stem = Path(args.name).stem if is_trace_file(args.name) or args.name.endswith(".toml") else args.name
    prompts = np.array([r.prompt_tokens for r in reqs])
    outputs = np.array([r.output_tokens for r in reqs])
    times = np.array([r.arrival_s for r in reqs])

    # Length distributions as in the paper's Fig. 8: histogram per side, mean marked.
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, vals, label in ((axes[0], prompts, "prompt (input) tokens"), (axes[1], outputs, "output tokens")):
        ax.hist(vals, bins=60, color="tab:blue", alpha=0.8)
        ax.axvline(vals.mean(), color="tab:red", ls="--", label=f"mean {vals.mean():.1f}")
        ax.set_xlabel(label)
        ax.set_ylabel("requests")
        ax.legend()
    fig.suptitle(f"{stem}: {len(reqs)} requests")
    fig.tight_layout()
    lengths_png = out / f"{stem}-lengths.png"
    fsio.save_figure(fig, lengths_png, dpi=120)
    plt.close(fig)

    # Arrival rate over time: counts in up to 100 equal bins (about 1 s or wider) spanning
    # exactly first to last arrival, so no partly empty bin at the end reads as a rate drop.
    span = max(float(times[-1] - times[0]), 1e-9)
    nbins = int(min(100, max(1, span)))
    width = span / nbins
    counts, edges = np.histogram(times, bins=np.linspace(times[0], times[0] + span, nbins + 1))
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.step(edges[:-1], counts / width, where="post")
    ax.axhline(len(times) / span, color="tab:red", ls="--", label=f"mean {len(times) / span:.2f} req/s")
    ax.set_xlabel("time since first arrival (s)")
    ax.set_ylabel(f"arrival rate (req/s, {width:.0f} s bins)")
    ax.legend()
    fig.tight_layout()
    arrivals_png = out / f"{stem}-arrivals.png"
    fsio.save_figure(fig, arrivals_png, dpi=120)
    plt.close(fig)
    print(f"wrote {lengths_png}\nwrote {arrivals_png}")
    return 0


def _selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a workload in workloads/ (see `ppsim workload list`), a workload TOML, or a "
                                "trace file (Azure/BurstGPT/plain CSV, Mooncake JSONL, ShareGPT JSON; "
                                "format detected, see workloads/README.md)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a workload field (repeatable)")
    p.add_argument("--as-built", action="store_true", help="describe the requests a run builds (trace workloads)")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=1, help="run seed for sampled lengths/arrivals (default 1)")


def add_commands(subparsers) -> None:
    """Add `workload {list,fetch,stats,plot}` to an argparse subparsers object."""
    wl = subparsers.add_parser(
        "workload", help="inspect workloads and fetch traces", formatter_class=RAW,
        description="Named workloads live in workloads/<name>.toml.",
        epilog="examples:\n  ppsim workload list\n  ppsim workload fetch azure-conv-2023\n"
               "  ppsim workload stats azure-conv --set num_requests=400\n"
               "  ppsim workload plot sharegpt --out plots/",
    )
    sub = wl.add_subparsers(dest="workload_command", metavar="{list,fetch,stats,plot}", required=True)

    p = sub.add_parser("list", help="list the named workloads", formatter_class=RAW,
                       epilog="examples:\n  ppsim workload list")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "fetch", help="download a trace into the cache", formatter_class=RAW,
        description=f"Download a trace into $PIPESIM_CACHE (now {cache_dir()}) and check its SHA-256.",
        epilog="examples:\n  ppsim workload fetch azure-conv-2023\n  ppsim workload fetch azure-code-2023\n"
               "  ppsim workload fetch azure-conv-2023 --url file:///mirror/AzureLLMInferenceTrace_conv.csv\n\n"
               f"ids: {', '.join(sorted(DOWNLOADS))}",
    )
    p.add_argument("id", help=f"download id: {', '.join(sorted(DOWNLOADS))}")
    p.add_argument("--url", help="download from this URL instead of upstream (hash still checked)")
    p.add_argument("--force", action="store_true", help="download even if a good copy is cached")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser(
        "stats", help="count, rate, inter-arrival CV and length percentiles", formatter_class=RAW,
        description=SELECTION_HELP,
        epilog="examples:\n  ppsim workload stats azure-conv            # the whole conv trace\n"
               "  ppsim workload stats azure-conv --set num_requests=400   # first 400 rows\n"
               "  ppsim workload stats azure-conv --set window_minutes=15  # first 15 minutes\n"
               "  ppsim workload stats azure-conv-replay --as-built --json\n"
               "  ppsim workload stats cnn --set num_requests=5000 --seed 3\n"
               "  ppsim workload stats my_trace.jsonl              # a Mooncake JSONL, ms timestamps\n"
               "  ppsim workload stats BurstGPT_1.csv --set 'filter.Model=\"ChatGPT\"' --set drop_failed=true\n"
               "  ppsim workload stats sharegpt.json --set rate_rps=4 --set num_requests=1000",
    )
    _selection_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "plot", help="PNG plots of length distributions and arrival rate", formatter_class=RAW,
        description=SELECTION_HELP + "\nWrites DIR/<name>-lengths.png and DIR/<name>-arrivals.png.",
        epilog="examples:\n  ppsim workload plot azure-conv --out plots/\n"
               "  ppsim workload plot cnn-reversed --out plots/ --set num_requests=5000",
    )
    _selection_args(p)
    p.add_argument("--out", required=True, help="output folder for the PNGs")
    p.set_defaults(func=cmd_plot)


def main(argv: list[str] | None = None) -> int:
    """A standalone `workload` CLI (the real entry point is the main `ppsim` command)."""
    parser = argparse.ArgumentParser(prog="ppsim")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except PipeSimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
