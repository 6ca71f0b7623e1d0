"""TOML in and out: reading a file with one-line errors, and a minimal writer for resolved
configs and profile metadata (tables, arrays, strings, numbers, booleans)."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, Mapping

from sim.core.errors import PipeSimError


def read_toml(path: str | Path, error: type[PipeSimError], missing: str = "not found") -> dict[str, Any]:
    """Parse `path`; a missing file or invalid TOML raises `error` with one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {missing}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def dumps(table: Mapping[str, Any]) -> str:
    lines: list[str] = []

    def emit(tbl: Mapping[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in tbl.items() if not isinstance(v, Mapping)}
        subs = {k: v for k, v in tbl.items() if isinstance(v, Mapping)}
        if prefix and (scalars or not subs):
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{_key(k)} = {_value(v)}")
        if scalars:
            lines.append("")
        for k, v in subs.items():
            emit(v, f"{prefix}.{_key(k)}" if prefix else _key(k))

    emit(table, "")
    return "\n".join(lines).rstrip() + "\n"
