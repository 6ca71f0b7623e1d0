"""NVIDIA genai-perf profile exports (`*_genai_perf.json`) as `ppsim validate` reads them.

genai-perf 0.0.16 (`genai_perf/export_data/json_exporter.py`, `JsonExporter`) writes one JSON object:
each metric as `{"unit": ..., "avg": ..., "p50": ..., "p90": ..., "p99": ..., ...}` and the run's
settings under `input_config` (`stimulus = {"concurrency": N}` under `perf_analyzer` in 0.0.16; a
flat `concurrency` / `request_rate` in earlier versions). The metric definitions
(`genai_perf/profile_data_parser/llm_profile_data_parser.py`, `_parse_requests`):

- `time_to_first_token` = first response - request sent (ms after scaling);
- `inter_token_latency` = (request latency - TTFT) / (output tokens - 1) per request: vLLM's and
  SGLang's TPOT, compared as PipeSim's `tpot`;
- `request_latency` = last response - request sent: E2E;
- `request_throughput`, `output_token_throughput`: over the measurement window.

The export has no per-request lengths, so a replay needs `--workload NAME`. Replayed: the
concurrency stimulus as a closed loop of N clients (`[workload] concurrency`,
sim/workloads/client.py). Refused, naming the setting: a request-rate stimulus (perf_analyzer's
constant-interval schedule by default) and session or fixed-schedule stimuli.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sim.core.errors import DataError

# genai-perf metric -> (PipeSim's metric, ms scale)
METRICS = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2e"}
STATS = (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"))
THROUGHPUTS = {"request_throughput": "request_throughput", "output_token_throughput": "output_throughput"}


def is_export(rec: Any) -> bool:
    """Whether a JSON object is a genai-perf export."""
    return (isinstance(rec, dict) and isinstance(rec.get("time_to_first_token"), dict)
            and "input_config" in rec)


def _find(tree: Any, key: str) -> Any:
    """The first value of `key` anywhere in nested dicts (the config layout changed between versions)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for v in tree.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def _stimulus(path: Path, cfg: dict) -> int:
    stim = _find(cfg, "stimulus")
    if isinstance(stim, dict) and stim:
        kind, value = next(iter(stim.items()))
    else:
        conc, rate = _find(cfg, "concurrency"), _find(cfg, "request_rate")
        kind, value = ("request_rate", rate) if rate else ("concurrency", conc)
    if kind != "concurrency":
        raise DataError(f"{path}: field 'input_config' stimulus {kind!r}: only a concurrency stimulus is replayed "
                        f"(perf_analyzer's request-rate and session schedules are not); allowed: concurrency")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DataError(f"{path}: field 'input_config' concurrency must be a positive integer, got {value!r}")
    return value


def _num(path: Path, name: str, stat: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise DataError(f"{path}: field '{name}.{stat}' must be a finite number >= 0, got {v!r}")
    return float(v)


def parse_export(path: Path, rec: dict) -> dict:
    """The export as `sim.studies.validate.parse_result` gives a benchmark result."""
    out: dict[str, Any] = {"line": 1, "request_rate": math.inf, "burstiness": 1.0, "client": "genai-perf",
                           "backend": None, "max_concurrency": None, "aggregates": {},
                           "concurrency": _stimulus(path, rec["input_config"])}
    for name, metric in METRICS.items():
        table = rec.get(name)
        if not isinstance(table, dict):
            continue
        for stat, key in STATS:
            if key in table:
                out["aggregates"][(metric, stat)] = _num(path, name, key, table[key])
    for name, key in THROUGHPUTS.items():
        table = rec.get(name)
        if isinstance(table, dict) and "avg" in table:
            out["aggregates"][(key, "value")] = _num(path, name, "avg", table["avg"])
    count = rec.get("request_count", {})
    n = count.get("avg") if isinstance(count, dict) else None
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n >= 1:
        raise DataError(f"{path}: field 'request_count.avg' must be a count >= 1, got {n!r}")
    out["completed"] = int(round(n))
    if not out["aggregates"]:
        raise DataError(f"{path}: no metric found (time_to_first_token, inter_token_latency, request_latency)")
    return out
