"""Where a sweep's time goes: runs `ppsim reproduce EXP ...` with every simulation timed in the
worker that runs it, then adds up the workers' seconds by search phase (the progress label of
the round: sweep, extend, floor, bisect, per study and seed phase), by run status (ok, met,
stopped, failed) and by (experiment, workload, chunk policy, SLO scale).

Run: `PIPESIM_CACHE=... python benchmarks/sweep_trace.py all --jobs 2 --out DIR` (DIR starts with
an empty cache unless `--keep-cache`), or `--report LOG --out DIR` to read an earlier trace again.
The log (default DIR/trace.jsonl) holds a line per simulation task (worker pid, start, end, point
ids, statuses, iterations) and a line per round (its label and point ids). The timing wrappers
are installed before the worker processes are forked, so they run in the workers (the default
process executor; not on Ray).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sim.studies.sweep as sweep  # noqa: E402

LOG = Path("trace.jsonl")


def _append(entry: dict) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _task(arg, t0: float, t1: float, out) -> None:
    tables = arg if isinstance(arg, list) else [arg]
    outs = out if isinstance(out, list) else [out]
    _append({"worker": os.getpid(), "t0": t0, "t1": t1, "pids": [sweep.point_id(t) for t in tables],
             "status": [o.get("status") if o else None for o in outs],
             "iters": [o.get("num_iterations") if o else None for o in outs]})


def install() -> None:
    """Wrap the sweep's evaluators (module functions, found by name in the workers) and
    `Runner.run` (in this process) with timing."""
    plain, siblings, run = sweep.evaluate, sweep.evaluate_siblings, sweep.Runner.run

    def evaluate(table):
        t0 = time.time()
        out = plain(table)
        _task(table, t0, time.time(), out)
        return out

    def evaluate_siblings(tables):
        t0 = time.time()
        out = siblings(tables)
        _task(tables, t0, time.time(), out)
        return out

    def run_round(self, tables, desc="points"):
        t0 = time.time()
        out = run(self, tables, desc)
        _append({"desc": desc, "t0": t0, "t1": time.time(), "pids": [sweep.point_id(t) for t in tables]})
        return out

    for fn, name in ((evaluate, "evaluate"), (evaluate_siblings, "evaluate_siblings")):
        fn.__module__, fn.__qualname__ = "sim.studies.sweep", name  # pickled by name into the workers
        setattr(sweep, name, fn)
    defaults = list(sweep.Runner.__init__.__defaults__)
    defaults[-1] = evaluate  # Runner(evaluate_fn=evaluate): the default evaluator, now timed
    sweep.Runner.__init__.__defaults__ = tuple(defaults)
    sweep.Runner.run = run_round


def report(log: Path, cache: Path) -> str:
    """The breakdown, as text."""
    entries = [json.loads(line) for line in open(log)]
    rounds = [e for e in entries if "desc" in e]
    tasks = [e for e in entries if "worker" in e]
    desc_of: dict[str, str] = {}
    for r in rounds:
        for p in r["pids"]:
            desc_of.setdefault(p, r["desc"])
    tables = {}
    for line in open(cache):
        point = json.loads(line)
        tables[point["id"]] = point["table"]
    by_phase, by_status, by_kind = collections.Counter(), collections.Counter(), collections.Counter()
    count = collections.Counter()
    for t in tasks:
        seconds = t["t1"] - t["t0"]
        phase = desc_of.get(t["pids"][0], "?")
        exp = phase.split(":")[0]
        table = tables.get(t["pids"][0], {})
        policy = table.get("scheduler", {}).get("chunk_policy", {}).get("name", "static")
        tpot = table.get("slo", {}).get("tpot_ms")
        kind = (exp, table.get("workload", {}).get("name", "?"), policy, f"tpot {tpot:g} ms" if tpot else "")
        by_phase[phase] += seconds
        by_status[(exp, t["status"][0])] += seconds
        by_kind[kind] += seconds
        count[phase] += 1
        count[(exp, t["status"][0])] += 1
        count[kind] += 1
    total = sum(by_phase.values())
    wall = max(r["t1"] for r in rounds) - min(r["t0"] for r in rounds) if rounds else 0.0
    lines = [f"{len(tasks)} simulation tasks, {total:.1f} worker-seconds; rounds spanned {wall:.1f} s"]
    for title, counter in (("by phase", by_phase), ("by status", by_status), ("by kind", by_kind)):
        lines.append(f"--- {title}")
        for key, seconds in counter.most_common(25):
            name = key if isinstance(key, str) else " / ".join(str(k) for k in key if k)
            lines.append(f"{seconds:8.1f} s {100 * seconds / total:5.1f}%  n={count[key]:5d}  {name}")
    return "\n".join(lines)


def main() -> int:
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiments", nargs="*", default=["all"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", default=None, help="trace file (default OUT/trace.jsonl)")
    ap.add_argument("--keep-cache", action="store_true", help="reuse OUT/cache (default: start empty)")
    ap.add_argument("--report", action="store_true", help="only print the breakdown of an existing trace")
    args = ap.parse_args()
    out = Path(args.out)
    LOG = Path(args.log) if args.log else out / "trace.jsonl"
    if not args.report:
        if not args.keep_cache:
            shutil.rmtree(out / "cache", ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        LOG.unlink(missing_ok=True)
        install()
        from sim.cli import main as ppsim

        code = ppsim(["reproduce", *args.experiments, "--jobs", str(args.jobs), "--out", str(out), "--no-progress"])
        if code:
            return code
    print(report(LOG, out / "cache" / "points.jsonl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
