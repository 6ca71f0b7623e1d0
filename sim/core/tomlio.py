"""TOML in and out: reading a file with one-line errors (tomllib), and writing resolved configs
and profile metadata (tomli-w)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Mapping

from sim.core.errors import PipeSimError


def read_toml(path: str | Path, error: type[PipeSimError], missing: str = "not found") -> dict[str, Any]:
    """Parse `path`; a missing file or invalid TOML raises `error` with one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {missing}")
    from sim.core.textio import read_text

    try:
        return tomllib.loads(read_text(path, error))
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None


def dumps(table: Mapping[str, Any]) -> str:
    """`table` as TOML text (tomli-w: sub-tables as [sections], floats exactly, inf as inf)."""
    import tomli_w

    return tomli_w.dumps(table)
