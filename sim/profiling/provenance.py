"""Where a run's latency numbers come from, in one line (summary.json `profile_source`, report.md).

A built profile (`ppsim profile build`) says so and names its kernel data and whether attention was
fitted or scaled; an imported one (`import-vidur`) says so; a hand-built profile names its base hardware
and GPU; the constant model says it is one.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sim.core.errors import DataError
from sim.core.tomlio import read_toml


@lru_cache(maxsize=64)
def profile_source_of(path: str) -> str:
    """One line describing the profile directory at `path` (from its meta.toml)."""
    try:
        meta = read_toml(Path(path) / "meta.toml", DataError)
    except DataError:
        return f"profile {path} (meta.toml unreadable)"
    p = meta.get("profile", {})
    if p.get("source") == "built":
        return f"built from {p.get('data_source', 'a kernel model')}; {p.get('gpu', '?')}, {p.get('interconnect', '?')} ({path})"
    if p.get("source"):
        return f"{p['source']}: {p.get('base_hardware', 'measured tables')} on {p.get('gpu', '?')} ({path})"
    return f"hand-built: {p.get('base_hardware', 'measured tables')} on {p.get('gpu', '?')} ({path})"


def profile_source(cfg) -> str:
    """`profile_source` of a run config (RunConfig)."""
    lat = cfg.latency
    if lat.kind != "profile":
        return f"{lat.kind} latency model (no profile)"
    return profile_source_of(str(lat.profile_path()))
