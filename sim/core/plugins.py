"""Loading user plug-ins (chunk policies, rebalancers) from outside the package.

Three ways in, all ending in the plug-in kinds' registries (`sim.policies.base`):
- a `.py` file (`--plugin path/to/policy.py`, or `[plugins] modules = [...]` in a config,
  resolved against the config's folder), imported under a private module name;
- an importable module (`--plugin my_pkg.policies`);
- installed packages' entry points in the groups `pipesim.chunk_policies` and
  `pipesim.rebalancers` (`NAME = "pkg.module:Factory"`), loaded once per process.

The loader knows no plug-in kind itself: it fills whatever registries were created with an
entry-point `group` (`sim.core.registry.plugin_kinds`), so it sits below the layers that own
the kinds. The guards that hold built plug-ins to the API live with them (sim/policies/guards.py).

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

from sim.core import registry
from sim.core.errors import ConfigError, PipeSimError, PluginError
from sim.core.registry import first_line

RULE_LOAD = "rule: a plug-in is a .py file or a module importable from sys.path, and imports without error"

_loaded: dict[str, str] = {}  # file path or module name -> origin
_entry_points_done = False


def _registries() -> dict[str, Any]:
    """Entry-point group -> registry, for every plug-in kind created so far (the layers that
    own the kinds, e.g. sim.policies, create their registries with a `group`; the engine and
    the command line import them before loading plug-ins)."""
    return registry.plugin_kinds()


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
    except (Exception, SystemExit) as exc:  # a plug-in calling sys.exit() must not end ppsim silently
        for r, snap in zip(regs, snaps):
            r.restore(snap)
        if isinstance(exc, PipeSimError):
            raise
        if isinstance(exc, SystemExit):
            raise PluginError(f"plug-in {origin}: called sys.exit({exc.code!r}) while being imported; "
                              f"rule: a plug-in registers policies and returns, it never exits") from None
        if isinstance(exc, TypeError) and registry.COMPILED_HINT_WORDS in str(exc):
            raise PluginError(f"plug-in {origin}: failed to import: TypeError: {first_line(exc)}; "
                              f"{registry.COMPILED_HINT}") from None
        raise PluginError(f"plug-in {origin}: failed to import: {type(exc).__name__}: {first_line(exc)}; "
                          f"{RULE_LOAD}") from exc


def load_entry_points() -> None:
    """Register the factories that installed packages advertise in the plug-in kinds' groups."""
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
