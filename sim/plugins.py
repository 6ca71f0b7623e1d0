"""Loading user plug-ins (chunk policies, rebalancers) from outside the package, and the
guards that hold them to the plug-in API (`sim/policies/API.md`).

Three ways in, all ending in the registries of `sim.policies.base`:
- a `.py` file (`--plugin path/to/policy.py`, or `[plugins] modules = [...]` in a config,
  resolved against the config's folder), imported under a private module name;
- an importable module (`--plugin my_pkg.policies`);
- installed packages' entry points in the groups `pipesim.chunk_policies` and
  `pipesim.rebalancers` (`NAME = "pkg.module:Factory"`), loaded once per process.

Loading is idempotent per file/module, so a sweep's worker processes and Ray workers can
load the plug-in list carried in each point's config table (`run` does) without clashing
with what their parent already loaded. Every failure is a one-line `PluginError` naming the
plug-in and the rule it broke; plug-in code that raises during a run is reported the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from sim import registry
from sim.errors import ConfigError, PipeSimError, PluginError
from sim.registry import BUILT_IN, first_line

ENTRY_POINT_GROUPS = ("pipesim.chunk_policies", "pipesim.rebalancers")
RULE_LOAD = "rule: a plug-in is a .py file or a module importable from sys.path, and imports without error"

_loaded: dict[str, str] = {}  # file path or module name -> origin
_entry_points_done = False


def _registries() -> dict[str, Any]:
    from sim.policies import chunk_policies, rebalancers

    return {"pipesim.chunk_policies": chunk_policies, "pipesim.rebalancers": rebalancers}


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def normalize(spec: Any, base_dir: Path | None = None, where: str = "--plugin") -> str:
    """A file spec as an absolute path (relative to `base_dir`, default the working
    directory); a module name as is."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{where}: a plug-in must be a .py path or a module name, got {spec!r}")
    spec = spec.strip()
    if not is_file_spec(spec):
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", spec):
            raise ConfigError(f"{where}: {spec!r} is neither a .py file nor a module name (like my_pkg.policies)")
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    return str(path.resolve())


def resolve_table_paths(table: dict, base_dir: Path, where: str) -> dict:
    """Make the `[plugins] modules` file paths of a config table absolute (relative to the
    config file), so the table can travel to worker processes."""
    plugins = table.get("plugins")
    if not isinstance(plugins, dict) or "modules" not in plugins:
        return table
    mods = plugins["modules"]
    if not isinstance(mods, list):
        raise ConfigError(f"{where}: [plugins] modules must be an array of .py paths or module names, got {mods!r}")
    plugins["modules"] = [normalize(m, base_dir, f"{where}: [plugins] modules") for m in mods]
    return table


def add_to_table(table: dict, specs: Iterable[str]) -> dict:
    """Append `specs` (already normalized) to the table's `[plugins] modules`, once each."""
    specs = list(specs)
    if not specs:
        return table
    plugins = table.setdefault("plugins", {})
    if not isinstance(plugins, dict):
        raise ConfigError(f"config: [plugins] must be a table, got {plugins!r}")
    mods = list(plugins.get("modules", []))
    plugins["modules"] = mods + [s for s in specs if s not in mods]
    return table


def load_all(specs: Iterable[str] = ()) -> list[str]:
    """Load the installed entry points (once) and each plug-in of `specs`; returns their origins."""
    load_entry_points()
    return [load(s) for s in specs]


def load(spec: str) -> str:
    """Import one plug-in (a .py path or a module name) unless already loaded; its origin."""
    spec = normalize(spec)
    if spec in _loaded:
        return _loaded[spec]
    if is_file_spec(spec):
        origin = f"file {spec}"
        path = Path(spec)
        if not path.is_file():
            raise PluginError(f"plug-in {origin}: not found; {RULE_LOAD}")
        name = "pipesim_plugin_" + re.sub(r"\W", "_", path.stem) + "_" + hashlib.sha1(spec.encode()).hexdigest()[:8]

        def do_import():
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module  # dataclasses and pickling look the module up by name
            try:
                mod_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
    else:
        origin = f"module {spec}"

        def do_import():
            importlib.import_module(spec)

    _guarded_import(origin, do_import)
    _loaded[spec] = origin
    return origin


def _guarded_import(origin: str, do_import) -> None:
    """Run `do_import` attributing registrations to `origin`; on failure undo them and raise
    a one-line PluginError."""
    regs = list(_registries().values())
    snaps = [r.snapshot() for r in regs]
    try:
        with registry.loading(origin):
            do_import()
    except Exception as exc:
        for r, snap in zip(regs, snaps):
            r.restore(snap)
        if isinstance(exc, PipeSimError):
            raise
        raise PluginError(f"plug-in {origin}: failed to import: {type(exc).__name__}: {first_line(exc)}; "
                          f"{RULE_LOAD}") from exc


def load_entry_points() -> None:
    """Register the factories that installed packages advertise in ENTRY_POINT_GROUPS."""
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True
    for group, reg in _registries().items():
        for ep in metadata.entry_points(group=group):
            origin = f"entry point {ep.name} = {ep.value} ({group})"
            def do_import(ep=ep, reg=reg):
                obj = ep.load()
                if not inspect.ismodule(obj):
                    reg.register(ep.name)(obj)

            _guarded_import(origin, do_import)


def sources() -> list[tuple[str, str, str]]:
    """(kind, name, origin) of every registered chunk policy and rebalancer."""
    return [(reg.kind, name, reg.origin(name)) for reg in _registries().values() for name in reg.names()]


# ---------------------------------------------------------------- guards at run time

def build_chunk_policy(name: str, params: dict, context, where: str):
    """Build a chunk policy; a plug-in's is wrapped so that it keeps the API's rules."""
    from sim.policies import chunk_policies

    policy = chunk_policies.build(name, where=where, context=context, **params)
    origin = chunk_policies.origin(name)
    if origin == BUILT_IN:
        return policy
    return GuardedChunkPolicy(policy, f"chunk policy {name!r} ({origin})", context.context_length_tokens)


def build_rebalancer(name: str, params: dict, context, where: str):
    from sim.policies import rebalancers

    reb = rebalancers.build(name, where=where, context=context, **params)
    origin = rebalancers.origin(name)
    if origin == BUILT_IN:
        return reb
    return GuardedRebalancer(reb, f"rebalancer {name!r} ({origin})")


def _call(label: str, fn, method: str, *args):
    try:
        return fn(*args)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(f"{label} raised {type(exc).__name__} in {method}(): {first_line(exc)}") from exc


class GuardedChunkPolicy:
    """A plug-in chunk policy with its calls checked: a chunk must be an integer in
    [1, context length], `decide` must return a ChunkDecision or None, and an exception
    becomes a one-line PluginError naming the plug-in."""

    def __init__(self, inner, label: str, limit_tokens: int) -> None:
        self.inner = inner
        self.label = label
        self.limit_tokens = limit_tokens
        if callable(getattr(inner, "observe", None)):
            self.observe = self._observe  # the engine calls observe only when a policy has it

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _check(self, chunk, method: str) -> int:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= self.limit_tokens:
            raise PluginError(f"{self.label}: {method}() returned chunk {chunk!r}; rule: a chunk is an integer "
                              f"in [1, {self.limit_tokens}] (the context length)")
        return chunk

    def initial_chunk(self) -> int:
        return self._check(_call(self.label, self.inner.initial_chunk, "initial_chunk"), "initial_chunk")

    def decide(self, view):
        from sim.policies.base import ChunkDecision

        d = _call(self.label, self.inner.decide, "decide", view)
        if d is None:
            return None
        if not isinstance(d, ChunkDecision):
            raise PluginError(f"{self.label}: decide() returned {type(d).__name__}; rule: decide returns "
                              f"a sim.policies.ChunkDecision or None")
        self._check(d.chunk, "decide")
        return d

    def _observe(self, view, current, inflight, iteration_s) -> None:
        _call(self.label, self.inner.observe, "observe", view, current, inflight, iteration_s)


class GuardedRebalancer:
    """A plug-in rebalancer with its moves checked: each is a Move that pauses a request of
    the current slot's running batch or resumes a paused one."""

    def __init__(self, inner, label: str) -> None:
        self.inner = inner
        self.label = label

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def rebalance(self, view):
        from sim.policies.base import Move

        moves = _call(self.label, self.inner.rebalance, "rebalance", view)
        if moves is None:
            return []
        moves = list(moves) if isinstance(moves, (list, tuple)) else moves
        if not isinstance(moves, list):
            raise PluginError(f"{self.label}: rebalance() returned {type(moves).__name__}; rule: a list of Moves")
        running, pending = set(view.running_ids()), set(view.pending_ids())
        for m in moves:
            if not isinstance(m, Move):
                raise PluginError(f"{self.label}: rebalance() returned {type(m).__name__} in its list; "
                                  f"rule: a list of sim.policies.Move")
            src, dst = (running, pending) if m.to_pending else (pending, running)
            if m.req_id not in src:
                raise PluginError(f"{self.label}: rebalance() {'pauses' if m.to_pending else 'resumes'} request "
                                  f"{m.req_id}, which is not {'running in the current slot' if m.to_pending else 'paused'}; "
                                  f"rule: pause only running requests of the current slot, resume only paused ones")
            src.discard(m.req_id)
            dst.add(m.req_id)
        return moves


def add_arguments(parser) -> None:
    """--plugin and --debug, on every command that runs simulations."""
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="load chunk policies / rebalancers from a .py file or an importable module "
                             "(repeatable; see sim/policies/API.md)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
