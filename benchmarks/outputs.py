"""What writing a run's outputs costs, as a share of its simulation time.

The PP=4, 10,000-request point of `engine.py` (Qwen2.5-32B, azure-conv-synth lengths, 4 req/s),
simulated once, then each step `ppsim run` takes after the simulation, timed in the same process:
the frames and the summary, `requests` and `iterations` written as CSV (`sim/outputs/csvout.py`) and as
`.npz` (`ppsim run --format npz`, `sim/outputs/npzout.py`). Every step runs `--repeats` times and the
best time counts; the shares are of the best simulation time, measured in the same run.

Run: `python benchmarks/outputs.py [--requests N] [--repeats N]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from benchmarks.engine import _table
    from sim.core.config import config_from_table
    from sim.outputs.csvout import write_csv
    from sim.engine.run import run
    from sim.outputs.metrics import iterations_frame, requests_frame, summarize
    from sim.outputs.npzout import write_npz
    from sim.workloads import build_workload

    cfg = config_from_table(_table("PP=4", args.requests, 4.0))
    reqs = build_workload(cfg.workload, seed=cfg.seed)
    run(cfg, requests=reqs[:20])  # warm-up: lazy imports
    sim_s, res = best_of(args.repeats, lambda: run(cfg, requests=reqs))
    frames_s, (req, it) = best_of(args.repeats, lambda: (summarize(res), requests_frame(res), iterations_frame(res))[1:])
    out = Path(tempfile.mkdtemp(prefix="pipesim-outputs-"))
    rows = [("simulation", sim_s), ("frames + summary", frames_s)]
    write_s = {}  # (format, table) -> seconds
    for fmt, write in (("csv", write_csv), ("npz", write_npz)):
        for name, df in (("requests", req), ("iterations", it)):
            write_s[fmt, name], _ = best_of(args.repeats, lambda: write(df, out / f"{name}.{fmt}"))
            rows.append((f"{name}.{fmt} ({len(df):,} rows x {df.shape[1]} columns, "
                         f"{(out / f'{name}.{fmt}').stat().st_size / 1e6:.1f} MB)", write_s[fmt, name]))
    w = max(len(r[0]) for r in rows)
    print(f"PP=4, {args.requests:,} requests, {len(it):,} iterations; best of {args.repeats}")
    for label, t in rows:
        print(f"{label:<{w}}  {t:7.3f} s  {t / sim_s:6.1%} of the simulation")
    for fmt in ("csv", "npz"):
        lean = frames_s + write_s[fmt, "requests"]
        total = lean + write_s[fmt, "iterations"]
        print(f"outputs / simulation, --format {fmt}: {total / sim_s:.1%} (with --no-iterations: {lean / sim_s:.1%})")


if __name__ == "__main__":
    main()
