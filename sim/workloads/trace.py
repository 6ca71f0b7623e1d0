"""The `trace` workload kind: requests from a CSV of (arrival, prompt, output) rows.

The default columns are the Azure LLM inference 2023 trace's (TIMESTAMP, ContextTokens,
GeneratedTokens); any CSV works with `columns = {arrival = ..., prompt = ..., output = ...}`,
the arrival being a timestamp string, seconds or milliseconds (`arrival_format`). Other file
formats (Mooncake/AIPerf JSONL, BurstGPT CSV, ShareGPT JSON) are readers registered in
`trace_formats` by `sim.workloads.readers`, which also detects the format (`format = "auto"`).
Two modes, as the artifact:

- `arrivals = "poisson"`: the first `num_requests` rows in time order (all rows if absent) sent
  as Poisson arrivals at `rate_rps`; the recorded timestamps are ignored.
- `arrivals = "timestamps"`: replay. Rows within `window_minutes` of the trace start (offset by
  `window_start_minutes`; without a window, the first `num_requests` rows), thinned to
  k = max(1, floor(n * sample_ratio)) rows chosen uniformly at random in original order;
  request i arrives at (ts_i - ts_0) / timestamp_speedup (0.9 stretches the gaps by 1/0.9).

`swap = true` exchanges prompt and output lengths (the artifact's `--reverse`). Unlike the
artifact, which silently drops rows with prompt <= 0, a non-positive or non-integer length is an
error: both Azure traces have none, so any such row means a wrong file or wrong columns.
No row is dropped silently: `limit = N` (the CLI's `--limit`) takes the first N rows explicitly,
and a `num_requests` larger than the file is an error; rows a reader skips (ShareGPT items without
a reply, BurstGPT failed rows with `drop_failed`) are counted in `Trace.dropped`, which `ppsim run`
prints as warnings and writes to summary.json's `warnings`.
"""

from __future__ import annotations

from sim.core.lazy import lazy

import io
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError, DataError
from sim.core.registry import Registry
from sim.core.rng import stream
from sim.core.textio import read_text
from sim.workloads.base import (MAX_REQUEST_TOKENS, make_requests, poisson_arrivals, require, said_change,
                                workload_kinds)
from sim.workloads.fetch import cache_dir, download_for_file

DEFAULT_COLUMNS = {"arrival": "TIMESTAMP", "prompt": "ContextTokens", "output": "GeneratedTokens"}
ARRIVAL_FORMATS = ("auto", "timestamp", "seconds", "milliseconds")
KEYS = {
    "file", "columns", "arrival_format", "arrivals", "rate_rps", "num_requests", "window_minutes",
    "window_start_minutes", "sample_ratio", "timestamp_speedup", "swap", "format", "limit",
    "filter", "drop_failed", "chars_per_token",
}


@dataclass(frozen=True)
class Trace:
    """A parsed trace: arrival seconds since the first row, and the token lengths."""

    path: Path
    times_s: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    has_times: bool = True  # False: the file records no arrival times (ShareGPT): Poisson only
    source: str = ""  # format and any rows a reader skipped on request, for headers and stats
    pieces: tuple | None = None  # per row, the prompt's prefix identity (Mooncake hash_ids), or None
    # what the reader skipped or dropped of the file, one line each naming it (count and reason):
    # said as warnings by `ppsim run` and in summary.json (sim.workloads.base.said_change)
    dropped: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.times_s)


def resolve_trace_file(file: Any, where: str) -> Path:
    """A bare file name is looked up in the cache folder; anything with a folder part is a path."""
    if not isinstance(file, str) or not file:
        raise ConfigError(f"{where}: field 'file' must be a file name or path, got {file!r}")
    p = Path(file).expanduser()
    path = p if (p.is_absolute() or len(p.parts) > 1) else cache_dir() / p
    if path.is_file():
        return path
    d = download_for_file(p.name)
    if d is not None:
        raise DataError(
            f"{where}: trace file {path} not found; fetch it with `ppsim workload fetch {d.id}` "
            f"(cache folder: $PIPESIM_CACHE, default ~/.cache/pipesim)"
        )
    raise DataError(f"{where}: field 'file': trace file {path} not found")


def _bad_line(path: Path, mask: np.ndarray, col: str, raw: pd.Series, problem: str) -> DataError:
    i = int(np.flatnonzero(mask)[0])
    # Line 1 is the header; blank lines are kept as rows, so row i is line i + 2.
    return DataError(f"{path}: line {i + 2}: column {col!r}: {problem}, got {raw.iloc[i]!r}")


def _lengths(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    raw = df[col]
    num = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(num) | (num != np.round(num)) | (num <= 0) | (num > MAX_REQUEST_TOKENS)
    if bad.any():
        raise _bad_line(path, bad, col, raw, f"token length must be an integer in [1, {MAX_REQUEST_TOKENS}]")
    return num.astype(np.int64)


def _arrivals(path: Path, df: pd.DataFrame, col: str, fmt: str) -> np.ndarray:
    raw = df[col].str.strip()
    if fmt == "auto":
        fmt = "seconds" if pd.notna(pd.to_numeric(raw.iloc[0], errors="coerce")) else "timestamp"
    if fmt in ("seconds", "milliseconds"):
        secs = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(secs)
        if bad.any():
            raise _bad_line(path, bad, col, raw, f"arrival must be a number of {fmt}")
        times = (secs - secs[0]) / (1e3 if fmt == "milliseconds" else 1.0)
    else:
        # utc=True: zone-aware stamps (any offsets) become UTC; naive ones are taken as UTC.
        ts = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True).dt.tz_localize(None)
        bad = ts.isna().to_numpy()
        if bad.any():
            raise _bad_line(path, bad, col, raw, "unparseable timestamp")
        ns = ts.to_numpy().astype("datetime64[ns]").astype(np.int64)
        # Differences in integer nanoseconds first, so float seconds lose nothing.
        times = (ns - ns[0]) / 1e9
    back = np.diff(times) < 0
    if back.any():
        mask = np.concatenate([[False], back])
        raise _bad_line(path, mask, col, raw, "timestamps out of order (earlier than the row before)")
    return times


def read_csv_strings(p: Path) -> pd.DataFrame:
    """A CSV as strings, blank lines kept as rows (so row i is line i + 2); a file pandas cannot
    parse is a one-line DataError naming it."""
    text = read_text(p)  # compression sniffed, UTF-8 checked (sim/core/textio.py)
    if text and not text.endswith(("\n", "\r")) and "\n" in text.strip("\r\n"):
        # NOTE: a last line without its newline may be a row cut in the middle (a copy or a
        # download that stopped): refused rather than read as a shorter row.
        last = text.rsplit("\n", 1)[-1]
        if last.count(",") < text.split("\n", 1)[0].count(","):
            raise DataError(f"{p}: the last line ends mid-row ({last[:40]!r}: fewer fields than the header); "
                            f"the file looks cut")
    try:
        return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{p}: empty file (no header line)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DataError(f"{p}: {str(exc).strip().splitlines()[0]}") from None


def json_lines(path, lines):
    """(line number, parsed value) of every non-blank line of a JSON-lines text; a line that is not
    JSON is a one-line DataError naming the file and the line."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {lineno}: not valid JSON ({exc.msg})") from None


@lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int, cols: tuple[str, str, str], fmt: str) -> Trace:
    p = Path(path)
    df = read_csv_strings(p)
    for role, col in zip(("arrival", "prompt", "output"), cols):
        if col not in df.columns:
            raise DataError(
                f"{p}: line 1: missing {role} column {col!r}; columns present: {', '.join(map(str, df.columns))} "
                "(formats: azure, burstgpt, mooncake, sharegpt, csv; map a CSV's columns with "
                "columns = {arrival, prompt, output}, CLI --set workload.columns.arrival=COL)"
            )
    if df.empty:
        raise DataError(f"{p}: no data rows")
    times = _arrivals(p, df, cols[0], fmt)
    if fmt == "auto":  # as _arrivals decides: a number means seconds
        fmt = "seconds" if pd.notna(pd.to_numeric(df[cols[0]].iloc[0].strip(), errors="coerce")) else "timestamp"
    trace = Trace(p, times, _lengths(p, df, cols[1]), _lengths(p, df, cols[2]),
                  source=f"CSV {cols[0]}/{cols[1]}/{cols[2]} ({fmt} arrivals)")
    for arr in (trace.times_s, trace.prompts, trace.outputs):
        arr.setflags(write=False)  # shared by the cache: nobody may modify it
    return trace


def read_trace(path: Path, columns: Mapping[str, str] | None = None, arrival_format: str = "auto") -> Trace:
    """Parse and validate a trace CSV (cached per file version and column choice)."""
    cols = {**DEFAULT_COLUMNS, **(columns or {})}
    st = os.stat(path)
    return _read_cached(str(path), st.st_mtime_ns, st.st_size, (cols["arrival"], cols["prompt"], cols["output"]),
                        arrival_format)


trace_formats: Registry = Registry("trace format")


@trace_formats.register("azure")
@trace_formats.register("csv")
def read_csv_format(path: Path, params: Mapping[str, Any], where: str) -> Trace:
    """Azure 2023/2024 CSV (the default columns) or any CSV with `columns` and `arrival_format`."""
    fmt = params.get("arrival_format", "auto")
    if fmt not in ARRIVAL_FORMATS:
        raise ConfigError(f"{where}: field 'arrival_format' must be one of: {', '.join(ARRIVAL_FORMATS)}; got {fmt!r}")
    return read_trace(path, _columns(params, where), fmt)


def _opt(params: Mapping[str, Any], key: str, typ, default, where: str):
    return require(params, key, typ, where, positive=True) if key in params else default


def _columns(params: Mapping[str, Any], where: str) -> dict[str, str]:
    cols = params.get("columns", {})
    if not isinstance(cols, dict) or not all(isinstance(v, str) and v for v in cols.values()):
        raise ConfigError(f"{where}: field 'columns' must be a table of column names, got {cols!r}")
    extra = sorted(set(cols) - set(DEFAULT_COLUMNS))
    if extra:
        raise ConfigError(f"{where}: field 'columns.{extra[0]}' unknown; allowed: arrival, prompt, output")
    return cols


def select_rows(trace: Trace, params: Mapping[str, Any], *, seed: int, where: str):
    """(arrival_s, prompts, outputs) of the workload `params` over `trace` (before swapping)."""
    return _select(trace, params, seed=seed, where=where)[:3]


def _select(trace: Trace, params: Mapping[str, Any], *, seed: int, where: str):
    """`select_rows` and the trace rows it took."""
    mode = params.get("arrivals", "poisson")
    num = _opt(params, "num_requests", int, None, where)
    limit = _opt(params, "limit", int, None, where)
    if limit is not None:
        if limit > len(trace):
            raise ConfigError(f"{where}: field 'limit' is {limit} but {trace.path} has {len(trace)} rows")
        trace = Trace(trace.path, trace.times_s[:limit], trace.prompts[:limit], trace.outputs[:limit],
                      trace.has_times, trace.source, None if trace.pieces is None else trace.pieces[:limit],
                      trace.dropped)
    if mode == "poisson":
        rate = require(params, "rate_rps", float, where, positive=True)
        if num is not None and num > len(trace):
            raise ConfigError(f"{where}: field 'num_requests' is {num} but {trace.path} has {len(trace)} rows")
        idx = np.arange(len(trace) if num is None else num)
        return poisson_arrivals(len(idx), rate, stream(seed, "arrivals")), trace.prompts[idx], trace.outputs[idx], idx
    if mode != "timestamps":
        raise ConfigError(f"{where}: field 'arrivals' must be one of: poisson, timestamps; got {mode!r}")
    if not trace.has_times:
        raise ConfigError(f"{where}: {trace.path} records no arrival times ({trace.source.split(';')[0]}); "
                          "give the workload field rate_rps to send its requests as Poisson arrivals")
    if num is not None and num > len(trace):
        raise ConfigError(f"{where}: field 'num_requests' is {num} but {trace.path} has {len(trace)} rows")
    speedup = _opt(params, "timestamp_speedup", float, 1.0, where)
    ratio = params.get("sample_ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"{where}: field 'sample_ratio' must be in (0, 1], got {ratio!r}")
    minutes = _opt(params, "window_minutes", float, None, where)
    start = params.get("window_start_minutes", 0.0)
    if isinstance(start, bool) or not isinstance(start, (int, float)) or start < 0:
        raise ConfigError(f"{where}: field 'window_start_minutes' must be a number >= 0, got {start!r}")
    if minutes is not None:
        lo, hi = 60.0 * start, 60.0 * (start + minutes)
        idx = np.flatnonzero((trace.times_s >= lo) & (trace.times_s <= hi))
        if idx.size == 0:
            raise DataError(
                f"{where}: empty window: no rows of {trace.path} between minute {start:g} and {start + minutes:g}"
                f" (the trace spans {trace.times_s[-1] / 60:.1f} minutes)"
            )
    else:
        # As the artifact: without a window, the first num_requests rows (all if not given).
        idx = np.arange(len(trace) if num is None else num)
    if ratio < 1:
        k = max(1, int(np.floor(len(idx) * ratio)))
        pick = stream(seed, "trace-sample").choice(len(idx), size=k, replace=False)
        idx = idx[np.sort(pick)]  # uniformly at random, in original order
    times = (trace.times_s[idx] - trace.times_s[idx[0]]) / speedup
    return times, trace.prompts[idx], trace.outputs[idx], idx


@workload_kinds.register("trace")
def build_trace(params: Mapping[str, Any], *, seed: int, where: str):
    extra = sorted(set(params) - KEYS)
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r} for kind 'trace'; allowed: {', '.join(sorted(KEYS))}")
    swap = params.get("swap", False)
    if not isinstance(swap, bool):
        raise ConfigError(f"{where}: field 'swap' must be true or false, got {swap!r}")
    path = resolve_trace_file(params.get("file"), where)
    fmt = params.get("format", "auto")
    trace = trace_formats.get(str(fmt), where=f"{where}: field 'format'")(path, params, where)
    times, prompts, outputs, idx = _select(trace, params, seed=seed, where=where)
    for line in trace.dropped:
        said_change(line)
    if swap:  # (a swapped prompt is another text: its prefix identity does not carry over)
        return make_requests(times, outputs, prompts)
    pieces = None if trace.pieces is None else [trace.pieces[i] for i in idx.tolist()]
    return make_requests(times, prompts, outputs, pieces)
