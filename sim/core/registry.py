"""A tiny name -> plug-in registry, one per plug-in kind (chunk policies, rebalancers, ...).

Each name remembers where it came from (`origin`): "built-in" for PipeSim's own modules, or
the plug-in being loaded by `sim.core.plugins` ("file /abs/path.py", "module pkg.mod",
"entry point NAME = pkg.mod:obj"), so errors and `ppsim list` can name it.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Generic, Iterator, TypeVar

from sim.core.errors import ConfigError, PluginError

T = TypeVar("T")

BUILT_IN = "built-in"
_loading: list[str] = []  # origins of the plug-ins being imported right now (innermost last)
_kinds: dict[str, "Registry"] = {}  # entry-point group -> registry of that plug-in kind


def plugin_kinds() -> dict[str, "Registry"]:
    """Entry-point group -> registry, for every registry created with a `group`."""
    return dict(_kinds)


@contextlib.contextmanager
def loading(origin: str) -> Iterator[None]:
    """Attribute every registration made inside the block to `origin`."""
    _loading.append(origin)
    try:
        yield
    finally:
        _loading.pop()


def origin_of(factory: Callable) -> str:
    module = getattr(factory, "__module__", "") or ""
    # PipeSim's own modules are built-in even when a plug-in's import is what loads them (a plug-in
    # subclassing a built-in engine imports its module): else a plug-in registering a built-in's
    # name would be told the name is taken by itself
    if module == "sim" or module.startswith("sim."):
        return BUILT_IN
    if _loading:
        return _loading[-1]
    return f"module {module}"


# mypyc's TypeError when Python code subclasses a compiled class (sim/native.py): a plug-in that
# extends a built-in engine's scheduler runs on the Python sources
COMPILED_HINT_WORDS = "compiled"
COMPILED_HINT = ("PipeSim's engine is compiled here (make native), and a compiled class cannot be subclassed by "
                 "a plug-in; run with PIPESIM_PURE=1 to use the Python sources, which can")


class Registry(Generic[T]):
    """Maps a string name to a factory; `build(name, **params)` makes the plug-in.

    `required` lists the methods every plug-in of this kind must have: a class registered
    without one is refused at registration, any other factory when it builds the object."""

    def __init__(self, kind: str, required: tuple[str, ...] = (), group: str | None = None) -> None:
        self.kind = kind
        self.required = required
        self._factories: dict[str, Callable[..., T]] = {}
        self._origins: dict[str, str] = {}
        if group is not None:  # a kind users extend: sim.core.plugins loads its entry points and files
            _kinds[group] = self

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            origin = origin_of(factory)
            if not isinstance(name, str) or not name:
                raise PluginError(f"{origin}: {self.kind} names must be non-empty strings, got {name!r}")
            if name in self._factories:
                if self._factories[name] is factory:
                    return factory  # the same object again (e.g. an entry point naming a self-registered class)
                raise PluginError(f"{origin}: {self.kind} name {name!r} is already taken (by {self._origins[name]}); "
                                  f"rule: names are unique, register under another name")
            if inspect.isclass(factory):
                self._check_methods(factory, name, origin)
            self._factories[name] = factory
            self._origins[name] = origin
            return factory

        return deco

    def _check_methods(self, obj, name: str, origin: str) -> None:
        missing = [m for m in self.required if not callable(getattr(obj, m, None))]
        if missing:
            raise PluginError(f"{origin}: {self.kind} {name!r} lacks method {', '.join(missing)}(); "
                              f"rule: a {self.kind} implements {', '.join(m + '()' for m in self.required)}")

    def names(self) -> list[str]:
        return sorted(self._factories)

    def origin(self, name: str) -> str:
        return self._origins[name]

    def get(self, name: str, where: str = "") -> Callable[..., T]:
        try:
            return self._factories[name]
        except KeyError:
            loc = f"{where}: " if where else ""
            raise ConfigError(
                f"{loc}unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}"
            ) from None

    def build(self, name: str, where: str = "", **params) -> T:
        factory = self.get(name, where)
        origin = self._origins[name]
        try:
            obj = factory(**params)
        except TypeError as exc:
            loc = f"{where}: " if where else ""
            if origin != BUILT_IN and COMPILED_HINT_WORDS in str(exc):
                raise PluginError(f"{self.kind} {name!r} ({origin}): {first_line(exc)}; {COMPILED_HINT}") from None
            raise ConfigError(f"{loc}bad parameters for {self.kind} {name!r}: {exc}") from None
        except SystemExit as exc:
            raise PluginError(f"{self.kind} {name!r} ({origin}) called sys.exit({exc.code!r}) when built; "
                              f"rule: a plug-in never exits") from None
        except Exception as exc:
            if origin == BUILT_IN or isinstance(exc, (ConfigError, PluginError)):
                raise
            raise PluginError(f"{self.kind} {name!r} ({origin}) raised {type(exc).__name__} when built: "
                              f"{first_line(exc)}") from exc
        self._check_methods(obj, name, origin)
        return obj

    # For tests: undo registrations made since a snapshot.
    def snapshot(self) -> tuple[dict, dict]:
        return dict(self._factories), dict(self._origins)

    def restore(self, snap: tuple[dict, dict]) -> None:
        self._factories, self._origins = dict(snap[0]), dict(snap[1])


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
