"""One gate for numbers: every number read from a config, a `--set`, a workload, a trace, a
bench log, a profile or a flag passes `number()` before it is used.

A number is refused when it is not a number (a bool, a string), not finite (NaN always; inf
unless the field documents inf as "unbounded"), not an integer where one is needed, or outside
the field's range. The error is one line naming where the value came from, the field and what
is allowed, e.g. `config.toml: [latency] noise_cv must be a finite number in [0, 5]; got inf`.
"""

from __future__ import annotations

import math
from typing import Any

from sim.core.errors import ConfigError, PipeSimError


def _fmt(x: float) -> str:
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e16):
        return f"{int(x):,}".replace(",", "_") if abs(x) >= 100_000 else str(int(x))
    return f"{x:g}"


def describe_range(lo: float | None, hi: float | None, *, integer: bool = False, lo_open: bool = False,
                   allow_inf: bool = False) -> str:
    kind = "an integer" if integer else "a finite number" if not allow_inf else "a number (inf: unbounded)"
    if lo is None and hi is None:
        return kind
    left = "(" if lo_open else "["
    return f"{kind} in {left}{_fmt(lo) if lo is not None else '-inf'}, {_fmt(hi) if hi is not None else 'inf'}]"


def number(value: Any, where: str, field: str, lo: float | None = None, hi: float | None = None, *,
           integer: bool = False, lo_open: bool = False, allow_inf: bool = False,
           error: type[PipeSimError] = ConfigError) -> Any:
    """`value` when it is a number within [lo, hi] (`lo_open`: (lo, hi]); else a one-line
    `error` naming `where` and `field`. `allow_inf`: +inf passes (a documented "unbounded")."""
    allowed = describe_range(lo, hi, integer=integer, lo_open=lo_open, allow_inf=allow_inf)
    prefix = f"{where}: " if where else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{prefix}{field} must be {allowed}; got {value!r}")
    if integer and not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        else:
            raise error(f"{prefix}{field} must be {allowed}; got {value!r}")
    if isinstance(value, float):
        if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
            raise error(f"{prefix}{field} must be {allowed}; got {value!r}")
        if math.isinf(value):
            return value
    if (lo is not None and (value <= lo if lo_open else value < lo)) or (hi is not None and value > hi):
        raise error(f"{prefix}{field} must be {allowed}; got {value!r}")
    return value


def finite_or_none(value: Any) -> bool:
    """Whether `value` is a finite real number (bools are not numbers here)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
