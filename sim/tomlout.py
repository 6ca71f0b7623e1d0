"""A minimal TOML writer for resolved configs (tables, arrays, strings, numbers, booleans)."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping


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
