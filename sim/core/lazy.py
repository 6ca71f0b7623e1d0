"""Modules imported on first use, so that `ppsim --help` and `ppsim list` start instantly.

pandas, matplotlib, scipy and numpy take a second or more to import together; the command
line imports every sub-command's module to build its parser. A module-level
`pd = lazy("pandas")` binds a stand-in that imports the real module the first time one of
its attributes is read (and is then as fast as the module: the attribute cache below).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


class LazyModule:
    """A stand-in for module `name`; `setup`, if given, runs once just before the import."""

    def __init__(self, name: str, setup: Callable[[], None] | None = None) -> None:
        self.__dict__["_name"] = name
        self.__dict__["_setup"] = setup
        self.__dict__["_module"] = None

    def _load(self):
        module = self.__dict__["_module"]
        if module is None:
            setup = self.__dict__["_setup"]
            if setup is not None:
                setup()
            module = importlib.import_module(self.__dict__["_name"])
            self.__dict__["_module"] = module
        return module

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._load(), attr)
        self.__dict__[attr] = value  # the next lookup is a plain attribute read
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_name']!r}>"


def lazy(name: str, setup: Callable[[], None] | None = None) -> Any:
    return LazyModule(name, setup)


def _agg_backend() -> None:
    import matplotlib

    matplotlib.use("Agg")


def lazy_pyplot() -> Any:
    """matplotlib.pyplot with the file-only Agg backend (no display needed)."""
    return LazyModule("matplotlib.pyplot", _agg_backend)
