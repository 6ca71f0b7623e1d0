"""Workloads: named TOML definitions in `workloads/` turned into request lists.

`build_workload(table, seed=...)` resolves `name` (a file in `workloads/`), merges the
run config's overrides, and calls the registered builder of its `kind`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from sim.core.errors import ConfigError
from sim.core.limits import check_num_requests
from sim.core.tomlio import read_toml
from sim.workloads.base import (  # noqa: F401  (re-exported)
    _CHANGES,
    WORKLOADS_DIR,
    RequestSpec,
    make_requests,
    poisson_arrivals,
    workload_kinds,
)

# Importing the kind modules registers them.
from sim.workloads import kinds as _kinds  # noqa: F401,E402
from sim.workloads import bench as _bench  # noqa: F401,E402
from sim.workloads.client import CLIENT_KEYS, ClientSpec, client_of  # noqa: E402

META_KEYS = ("name", "kind", "description")
# The latest arrival a workload may have (seconds after the first): far beyond any trace (BurstGPT
# spans 121 days, 1e7 s), near enough for the float clock to keep sub-microsecond resolution.
MAX_ARRIVAL_S = 1e9


def workload_path(name: str) -> Path:
    return WORKLOADS_DIR / f"{name}.toml"


def available_workloads() -> list[str]:
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.toml"))


def load_workload_file(name: str) -> dict[str, Any]:
    """A named workload (`workloads/<name>.toml`) or, when `name` is a path to a TOML file,
    that file (a user's own workload definition, e.g. a trace with its own columns)."""
    path = Path(name) if name.endswith(".toml") else workload_path(name)
    if not path.is_file():
        raise ConfigError(
            f"field 'name': workload {name!r} not found in {WORKLOADS_DIR}; allowed: {', '.join(available_workloads())}, "
            "a workload .toml file, or (for `workload stats/plot` and `run --trace`) the path of a trace file"
        )
    table = read_toml(path, ConfigError)
    table.setdefault("name", name)
    return table


def resolve_workload(table: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Merge a run config's [workload] table over its named file; return (table, where)."""
    table = dict(table)
    if "name" in table and "kind" not in table:
        name = str(table["name"])
        base = load_workload_file(name)
        where = name if name.endswith(".toml") else str(workload_path(name))
        base.update({k: v for k, v in table.items() if k != "name"})
        return base, where
    if "kind" not in table:
        raise ConfigError("config [workload]: needs 'name' (a file in workloads/) or 'kind'")
    return table, "config [workload]"


def build_workload(table: Mapping[str, Any], *, seed: int) -> list[RequestSpec]:
    """Build the request list of a [workload] table (named or inline)."""
    merged, where = resolve_workload(table)
    check_num_requests(merged.get("num_requests"), where)
    kind = merged.get("kind")
    builder = workload_kinds.get(str(kind), where=f"{where}: field 'kind'")
    # the client's loop (concurrency, timeouts) is read by `workload_client`, not by the kind
    params = {k: v for k, v in merged.items() if k not in META_KEYS and k not in CLIENT_KEYS}
    try:
        requests = builder(params, seed=seed, where=where)
    except ConfigError as exc:
        raise _blame_merged(exc, table, where) from None
    last = requests[-1].arrival_s if requests else 0.0
    if not last <= MAX_ARRIVAL_S:  # (NaN too)
        # a rate so low (or timestamps so far apart) that the clock would lose its resolution:
        # t + a 10 ms iteration == t past ~1e14 s, and 1 / a subnormal rate is inf
        file = f" of {params['file']}" if isinstance(params.get("file"), str) else ""
        raise ConfigError(f"{where}: the requests{file} arrive over {last:.4g} s, beyond the {MAX_ARRIVAL_S:g} s "
                          f"(about 31 years) a run may span; check the field 'rate_rps', the trace's timestamps "
                          f"or 'timestamp_speedup'")
    return requests


def workload_client(table: Mapping[str, Any]) -> ClientSpec | None:
    """The client loop of a [workload] table (sim/workloads/client.py); None: open loop, no timeout."""
    merged, where = resolve_workload(table)
    return client_of(merged, where)


def _blame_merged(exc: ConfigError, table: Mapping[str, Any], where: str) -> ConfigError:
    """`exc` re-headed to the config's [workload] table when the unknown field it names came from
    there (merged over the named file, e.g. num_requests over a conversation workload), not from the
    shipped file it names."""
    import re

    text = str(exc)
    m = re.search(r"unknown field '([^']+)'", text)
    if m and "kind" not in table and m.group(1) in table and text.startswith(f"{where}: "):
        return ConfigError(f"config [workload] {m.group(1)} = {table[m.group(1)]!r} (merged over {where}): "
                           f"{text[len(where) + 2:]}")
    return exc


def build_workload_said(table: Mapping[str, Any], *, seed: int) -> tuple[list[RequestSpec], list[str]]:
    """`build_workload` and what its builder changed of its input, one line each naming the file:
    rows or conversations skipped or dropped (sim.workloads.base.said_change)."""
    token = _CHANGES.set([])
    try:
        requests = build_workload(table, seed=seed)
        return requests, list(_CHANGES.get() or [])
    finally:
        _CHANGES.reset(token)
