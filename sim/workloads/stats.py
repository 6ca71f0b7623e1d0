"""Summary statistics of a request list, and which requests `workload stats/plot` describe.

What a trace workload's statistics describe: by default the trace itself, all rows at their
recorded times (so `azure-conv` reports the whole conv trace, 19,366 requests over 3,502 s,
whatever its file's Poisson settings). `--set num_requests=N` limits that to the first N rows,
`--set window_minutes=M` (and `window_start_minutes`, `sample_ratio`, `timestamp_speedup`) to a
window. `--as-built` instead describes exactly the request list a run builds from the
workload (its arrival mode, Poisson rate, seed). Other kinds are always described as built.
"""

from __future__ import annotations

from pathlib import Path
from sim.core.lazy import lazy

from typing import Any, Mapping, Sequence

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError
from sim.workloads import load_workload_file, workload_kinds, workload_path
from sim.workloads.base import RequestSpec

STAT_KEYS = (
    "count", "duration_s", "rate_rps", "interarrival_cv",
    "prompt_mean", "prompt_p50", "prompt_p90", "prompt_p99",
    "output_mean", "output_p50", "output_p90", "output_p99",
)
# Trace-file parameters kept when describing the trace itself (everything else is the run's).
TRACE_SOURCE_KEYS = ("file", "columns", "arrival_format", "swap", "format", "filter", "drop_failed", "chars_per_token")


def workload_stats(requests: Sequence[RequestSpec]) -> dict[str, float]:
    """count, duration (first to last arrival), mean rate (count / duration, as the shared data
    README computes it), inter-arrival CV (std / mean of the gaps), and length moments.
    Percentiles use numpy's default linear interpolation."""
    if not requests:
        raise ConfigError("workload has no requests")
    t = np.array([r.arrival_s for r in requests])
    out: dict[str, float] = {"count": len(requests)}
    duration = float(t[-1] - t[0])
    gaps = np.diff(t)
    out["duration_s"] = duration
    out["rate_rps"] = len(t) / duration if duration > 0 else float("inf")
    out["interarrival_cv"] = float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else float("nan")
    for name, vals in (("prompt", [r.prompt_tokens for r in requests]), ("output", [r.output_tokens for r in requests])):
        v = np.asarray(vals, dtype=float)
        out[f"{name}_mean"] = float(v.mean())
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = float(np.percentile(v, q))
    return out


def format_stats(stats: Mapping[str, float]) -> str:
    lines = []
    for key in STAT_KEYS:
        v = stats[key]
        lines.append(f"{key:16s} {v:d}" if isinstance(v, int) else f"{key:16s} {v:.3f}")
    return "\n".join(lines)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def is_trace_file(name: str) -> bool:
    """A `workload stats/plot` argument naming a trace file rather than a workload definition."""
    return not name.endswith(".toml") and Path(name).expanduser().is_file()


def trace_source(name: str, overrides: Mapping[str, Any]) -> str:
    """The detected format of a trace file and any rows its reader skipped, for the stats header."""
    from sim.workloads.trace import trace_formats

    params = {"format": "auto", **overrides}
    path = Path(name).expanduser()
    return f"{path}: " + trace_formats.get(str(params["format"]))(path, params, name).source


def describe_requests(name: str, overrides: Mapping[str, Any], *, seed: int, as_built: bool) -> list[RequestSpec]:
    """The requests `workload stats/plot NAME` describe (see the module docstring)."""
    if is_trace_file(name):
        table: dict[str, Any] = {"kind": "trace", "file": str(Path(name).resolve()), "format": "auto"}
        where = name
    else:
        table = load_workload_file(name)
        where = str(workload_path(name))
    kind = str(table.get("kind"))
    params = {k: v for k, v in table.items() if k not in ("name", "kind", "description")}
    if kind == "trace" and not as_built:
        params = {k: v for k, v in params.items() if k in TRACE_SOURCE_KEYS}
        # A file without arrival times (ShareGPT) is described at a Poisson rate if one is given.
        params["arrivals"] = "poisson" if "rate_rps" in overrides else "timestamps"
    params = _deep_merge(params, overrides)
    builder = workload_kinds.get(kind, where=f"{where}: field 'kind'")
    return builder(params, seed=seed, where=where)
