"""A tiny name -> plug-in registry, one per plug-in kind (chunk policies, rebalancers, ...)."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from sim.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a string name to a factory; `build(name, **params)` makes the plug-in."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._factories[name] = factory
            return factory

        return deco

    def names(self) -> list[str]:
        return sorted(self._factories)

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
        try:
            return factory(**params)
        except TypeError as exc:
            loc = f"{where}: " if where else ""
            raise ConfigError(f"{loc}bad parameters for {self.kind} {name!r}: {exc}") from None
