"""Check the simulator against a real serving run (SGLang `bench_serving` JSONL results).

Format (one JSON object per line, as `bench_serving --output-file` appends them; only these
keys are read): `request_rate` (a number, or "inf"), and the per-request lists `ttfts`,
`tpots` and `e2es` (seconds, as bench_serving stores them; `--units ms` for files in
milliseconds). `tpots` may be shorter than the others (bench_serving omits one-token
outputs). `completed` (optional) is the number of successful requests; else len(ttfts).

For every line the named workload is simulated at the same rate with as many requests as
the real run completed, and the mean, P50, P90 and P99 of TTFT, TPOT and E2E are compared.
"""

from __future__ import annotations

from sim.lazy import lazy

import json
import math
from pathlib import Path

np = lazy("numpy")  # imported on first use (sim/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/lazy.py)

from sim.errors import DataError

STATS = (("mean", None), ("p50", 50), ("p90", 90), ("p99", 99))


def read_bench_log(path: str | Path, units: str = "s") -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: bench log not found")
    scale = {"s": 1e3, "ms": 1.0}.get(units)
    if scale is None:
        raise DataError(f"--units must be one of: s, ms; got {units!r}")
    runs = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object")
        rate = rec.get("request_rate")
        if rate in ("inf", "Infinity"):
            rate = math.inf
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise DataError(f"{path}:{lineno}: field 'request_rate' must be a positive number or \"inf\", got {rate!r}")
        lists = {}
        for key in ("ttfts", "tpots", "e2es"):
            vals = rec.get(key)
            if not isinstance(vals, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                raise DataError(f"{path}:{lineno}: field {key!r} must be a list of numbers")
            lists[key] = np.asarray(vals, dtype=float) * scale
        if len(lists["ttfts"]) == 0 or len(lists["e2es"]) != len(lists["ttfts"]):
            raise DataError(f"{path}:{lineno}: 'ttfts' and 'e2es' must be non-empty and of equal length")
        completed = rec.get("completed", len(lists["ttfts"]))
        runs.append({"line": lineno, "request_rate": float(rate), "completed": int(completed), **lists})
    if not runs:
        raise DataError(f"{path}: no results in the file")
    return runs


def _stat(values: np.ndarray, q) -> float:
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan
    return float(values.mean()) if q is None else float(np.percentile(values, q))


def compare(real: dict, sim_requests: pd.DataFrame) -> list[dict]:
    fin = sim_requests[sim_requests["status"] == "finished"]
    rows = []
    for metric, key in (("ttft", "ttfts"), ("tpot", "tpots"), ("e2e", "e2es")):
        sim_vals = fin[f"{metric}_ms"].to_numpy(dtype=float)
        for stat, q in STATS:
            r, s = _stat(real[key], q), _stat(sim_vals, q)
            err = (s - r) / r * 100 if r else math.nan
            rows.append({"request_rate": real["request_rate"], "metric": metric, "stat": stat,
                         "real_ms": r, "sim_ms": s, "error_pct": err})
    return rows


def validate(log_path, workload: str, config_path, overrides: list[str], units: str = "s") -> pd.DataFrame:
    from sim.config import load_config
    from sim.engine.run import run
    from sim.metrics import requests_frame

    runs = read_bench_log(log_path, units)
    rows = []
    for real in runs:
        sets = list(overrides) + [f'workload.name="{workload}"', f"workload.num_requests={real['completed']}"]
        sets.append(f"workload.rate_rps={'inf' if math.isinf(real['request_rate']) else real['request_rate']}")
        cfg = load_config(config_path, sets)
        rows += compare(real, requests_frame(run(cfg)))
    return pd.DataFrame(rows)
