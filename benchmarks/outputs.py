"""What writing a run's outputs costs, as a share of its simulation time.

The PP=4, 10,000-request point of `engine.py` (Qwen2.5-32B, azure-conv-synth lengths, 4 req/s),
simulated once, then each step `ppsim run` takes after the simulation, timed in the same process:
the frames and the summary, `requests` and `iterations` written as CSV (`sim/outputs/csvout.py`) and as
`.npz` (the former `--format npz`) and as Parquet (`ppsim run --format parquet`,
with pyarrow). Every step runs `--repeats` times and the
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


def _column(values):
    return values.astype(str) if values.dtype == object else values


def write_npz(df, path) -> None:
    """The former `--format npz` writer (one uncompressed NumPy array per column), kept here to
    measure Parquet against it."""
    import numpy as np

    arrays = {str(c): _column(df[c].to_numpy()) for c in df}
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


# The hand-written TOML writer PipeSim used before tomli-w (sim/core/tomlio.py at eb9b060), kept
# here to measure the library against it on a resolved run config.
import json  # noqa: E402
import math  # noqa: E402
from typing import Any, Mapping  # noqa: E402


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def old_dumps(table: Mapping[str, Any]) -> str:
    lines: list[str] = []

    def emit(tbl: Mapping[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in tbl.items() if not isinstance(v, Mapping)}
        subs = {k: v for k, v in tbl.items() if isinstance(v, Mapping)}
        if prefix and (scalars or not subs):
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_value(v)}")
        if scalars:
            lines.append("")
        for k, v in subs.items():
            emit(v, f"{prefix}.{_key(k)}" if prefix else _key(k))

    emit(table, "")
    return "\n".join(lines).rstrip() + "\n"


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
    from sim.outputs.tables import write_parquet
    from sim.workloads import build_workload

    cfg = config_from_table(_table("PP=4", args.requests, 4.0))
    reqs = build_workload(cfg.workload, seed=cfg.seed)
    run(cfg, requests=reqs[:20])  # warm-up: lazy imports
    sim_s, res = best_of(args.repeats, lambda: run(cfg, requests=reqs))
    frames_s, (req, it) = best_of(args.repeats, lambda: (summarize(res), requests_frame(res), iterations_frame(res))[1:])
    out = Path(tempfile.mkdtemp(prefix="pipesim-outputs-"))
    rows = [("simulation", sim_s), ("frames + summary", frames_s)]
    write_s = {}  # (format, table) -> seconds
    for fmt, write in (("csv", write_csv), ("npz", write_npz), ("parquet", write_parquet)):
        for name, df in (("requests", req), ("iterations", it)):
            write_s[fmt, name], _ = best_of(args.repeats, lambda: write(df, out / f"{name}.{fmt}"))
            rows.append((f"{name}.{fmt} ({len(df):,} rows x {df.shape[1]} columns, "
                         f"{(out / f'{name}.{fmt}').stat().st_size / 1e6:.1f} MB)", write_s[fmt, name]))
    import tomli_w

    table = cfg.to_dict()
    for label, dumps in (("config.toml, former hand writer (x1000)", old_dumps), ("config.toml, tomli-w (x1000)", tomli_w.dumps)):
        t, _ = best_of(args.repeats, lambda: [dumps(table) for _ in range(1000)])
        rows.append((label, t))
    w = max(len(r[0]) for r in rows)
    print(f"PP=4, {args.requests:,} requests, {len(it):,} iterations; best of {args.repeats}")
    for label, t in rows:
        print(f"{label:<{w}}  {t:7.3f} s  {t / sim_s:6.1%} of the simulation")
    for fmt in ("csv", "npz", "parquet"):
        lean = frames_s + write_s[fmt, "requests"]
        total = lean + write_s[fmt, "iterations"]
        print(f"outputs / simulation, --format {fmt}: {total / sim_s:.1%} (with --no-iterations: {lean / sim_s:.1%})")


if __name__ == "__main__":
    main()
