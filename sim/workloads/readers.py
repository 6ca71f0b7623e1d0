"""Trace readers for the request-log formats of the ecosystem, detected by content and extension.

Each reader turns one file into a `Trace` (arrival seconds since the first row, prompt and output
token counts) and is registered by name in `trace_formats`; the `trace` workload kind picks one
with `format` (default `auto`). Schemas (also in workloads/README.md):

- `azure`, `csv` (in `sim.workloads.trace`): Azure LLM inference 2023/2024 CSV (TIMESTAMP,
  ContextTokens, GeneratedTokens) or any CSV with `columns = {arrival, prompt, output}` and
  `arrival_format` = timestamp | seconds | milliseconds.
- `mooncake`: JSONL, one object per line as Mooncake's traces and AIPerf's `mooncake_trace`
  input: `timestamp` (integer milliseconds since the trace start), `input_length`,
  `output_length`, optional `hash_ids` (prefix-cache block ids, one per 512 prompt tokens: the
  request's prompt pieces, which engines with a prefix cache reuse; sim/engine/prefix_cache.py).
  `arrival_format = "seconds"` for files in seconds.
- `burstgpt`: BurstGPT CSV: `Timestamp` (seconds since the trace start), `Model`,
  `Request tokens`, `Response tokens`, `Total tokens`, `Log Type`. `filter = {Model = "ChatGPT",
  "Log Type" = "Conversation log"}` keeps matching rows (a value or a list of values).
  BurstGPT logs failed requests with 0 response tokens: an error naming the line unless
  `drop_failed = true`, which skips them and says how many in the trace's source note and in a
  warning (`ppsim run`: stderr and summary.json's `warnings`).
- `sharegpt`: ShareGPT JSON, a list of `{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}`; one request per conversation, as vLLM's and SGLang's
  benchmarks sample it: the first turn is the prompt, the second the output. Lengths are a
  tokenizer-free ESTIMATE, ceil(characters / `chars_per_token`) with 4.0 characters per token by
  default, unless an item gives its own counts (`prompt_tokens`/`output_tokens` or
  `input_length`/`output_length`). Conversations with fewer than two turns are skipped and
  counted (a warning, as for BurstGPT's failed rows). The file has no arrival times: it replays only as Poisson arrivals at `rate_rps`.

Errors name the file, the line (JSON: the item) and the field, on one line.
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from sim.core.lazy import lazy
np = lazy("numpy")
pd = lazy("pandas")

from sim.core.errors import ConfigError, DataError
from sim.core.textio import read_text
from sim.workloads.trace import DEFAULT_COLUMNS, Trace, json_lines, read_csv_strings, trace_formats
from sim.workloads.base import MAX_REQUEST_TOKENS

BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
SHAREGPT_CHARS_PER_TOKEN = 4.0
# Token counts an item of a ShareGPT-style file may carry instead of text: (prompt, output).
GIVEN_COUNTS = (("prompt_tokens", "output_tokens"), ("input_length", "output_length"))
BENCH_KEYS = ("ttfts", "itls", "input_lens")


def _freeze(obj: Any):
    if isinstance(obj, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in obj.items()))
    if isinstance(obj, list):
        return tuple(_freeze(v) for v in obj)
    return obj


def _version(path: Path) -> tuple[str, int, int]:
    st = os.stat(path)
    return str(path), st.st_mtime_ns, st.st_size


def _positive_int(value: Any) -> bool:
    """A token count: an integer in [1, MAX_REQUEST_TOKENS] (a float like 12.0 counts)."""
    return ((isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())) \
        and 0 < value <= MAX_REQUEST_TOKENS


def _readonly(trace: Trace) -> Trace:
    for arr in (trace.times_s, trace.prompts, trace.outputs):
        arr.setflags(write=False)  # shared by the caches: nobody may modify it
    return trace


# --------------------------------------------------------------------------- mooncake
MOONCAKE_BLOCK_TOKENS = 512  # one hash id per 512 prompt tokens (Mooncake's trace README: block_size 512)


def _hash_pieces(ids: list, input_len: int) -> tuple:
    """A Mooncake row's prefix identity: one piece per hash id, 512 tokens each but the last
    (what is left of the prompt); ids beyond the prompt's length are ignored."""
    out = []
    left = input_len
    for h in ids:
        if left <= 0:
            break
        n = min(MOONCAKE_BLOCK_TOKENS, left)
        out.append((h, n))
        left -= n
    return tuple(out)


@lru_cache(maxsize=8)
def _read_mooncake(path: str, _mtime: int, _size: int, unit: str) -> Trace:
    p = Path(path)
    times, prompts, outputs = [], [], []
    pieces: list = []
    hashed = 0
    scale = 1e-3 if unit == "milliseconds" else 1.0
    # (read whole: its compression is sniffed and its UTF-8 checked, sim/core/textio.py)
    for lineno, rec in json_lines(p, read_text(p).splitlines()):
        if not isinstance(rec, dict):
            raise DataError(f"{p}: line {lineno}: expected a JSON object, got {type(rec).__name__}")
        for key in MOONCAKE_FIELDS:
            if key not in rec:
                raise DataError(f"{p}: line {lineno}: missing field {key!r} (Mooncake JSONL needs "
                                f"{', '.join(MOONCAKE_FIELDS)})")
        ts = rec["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise DataError(f"{p}: line {lineno}: field 'timestamp' must be a number >= 0 ({unit}), got {ts!r}")
        if times and ts * scale < times[-1]:
            raise DataError(f"{p}: line {lineno}: field 'timestamp': out of order (earlier than the line before), "
                            f"got {ts!r}")
        for key in ("input_length", "output_length"):
            if not _positive_int(rec[key]):
                raise DataError(f"{p}: line {lineno}: field {key!r} must be an integer in [1, {MAX_REQUEST_TOKENS}], got {rec[key]!r}")
        ids = rec.get("hash_ids")
        row_pieces = None
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**62
                                                    for h in ids):
                raise DataError(f"{p}: line {lineno}: field 'hash_ids' must be a list of integers in [0, 2^62), "
                                f"got {ids!r:.80}")
            hashed += 1
            row_pieces = _hash_pieces(ids, int(rec["input_length"]))
        pieces.append(row_pieces)
        times.append(ts * scale)
        prompts.append(int(rec["input_length"]))
        outputs.append(int(rec["output_length"]))
    if not times:
        raise DataError(f"{p}: no requests in the file")
    t = np.asarray(times, dtype=float)
    note = f"Mooncake JSONL ({unit} timestamps)"
    if hashed:
        note += f"; hash_ids on {hashed} rows: prefix identities for the engines' prefix caches"
    return _readonly(Trace(p, t - t[0], np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64),
                           source=note, pieces=tuple(pieces) if hashed else None))


@trace_formats.register("mooncake")
def read_mooncake(path: Path, params: Mapping[str, Any], where: str) -> Trace:
    unit = params.get("arrival_format", "auto")
    if unit == "auto":
        unit = "milliseconds"
    if unit not in ("milliseconds", "seconds"):
        raise ConfigError(f"{where}: field 'arrival_format' for format 'mooncake' must be one of: "
                          f"milliseconds, seconds; got {unit!r}")
    return _read_mooncake(*_version(path), unit)


# --------------------------------------------------------------------------- burstgpt
def _burst_error(p: Path, df: pd.DataFrame, mask, col: str, problem: str, hint: str = "") -> DataError:
    label = df.index[np.flatnonzero(np.asarray(mask))[0]]
    # Line 1 is the header; original row labels survive filtering, so row label i is line i + 2.
    return DataError(f"{p}: line {label + 2}: column {col!r}: {problem}, got {df.at[label, col]!r}{hint}")


@lru_cache(maxsize=8)
def _read_burstgpt(path: str, _mtime: int, _size: int, filters: tuple, drop_failed: bool) -> Trace:
    p = Path(path)
    df = read_csv_strings(p)
    for col in BURSTGPT_COLUMNS + tuple(c for c, _ in filters):
        if col not in df.columns:
            raise DataError(f"{p}: line 1: missing BurstGPT column {col!r}; columns present: {', '.join(df.columns)}")
    total = len(df)
    for col, wanted in filters:
        allowed = set(wanted) if isinstance(wanted, tuple) else {wanted}
        df = df[df[col].str.strip().isin(allowed)]
    notes = [f"BurstGPT CSV ({total} rows)"]
    if filters:
        notes.append("filter " + ", ".join(f"{c}={'|'.join(v) if isinstance(v, tuple) else v}" for c, v in filters)
                     + f" keeps {len(df)}")
    if df.empty:
        raise DataError(f"{p}: no rows left after the filter {dict(filters)}")
    nums = {}
    for col in BURSTGPT_COLUMNS:
        v = pd.to_numeric(df[col].str.strip(), errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(v) | (v < 0)
        if col != "Timestamp":
            bad |= (v != np.round(v)) | (v > MAX_REQUEST_TOKENS)
        if bad.any():
            what = "must be a number of seconds >= 0" if col == "Timestamp" else "must be an integer >= 0"
            raise _burst_error(p, df, bad, col, what)
        nums[col] = v
    failed = (nums["Response tokens"] == 0) | (nums["Request tokens"] == 0)
    dropped: tuple[str, ...] = ()
    if failed.any():
        if not drop_failed:
            col = "Response tokens" if (nums["Response tokens"] == 0).any() else "Request tokens"
            raise _burst_error(p, df, failed, col, "0 tokens (a failed request in BurstGPT)",
                               "; set the workload field drop_failed = true to skip such rows")
        notes.append(f"{int(failed.sum())} failed rows (0 tokens) dropped (drop_failed)")
        dropped = (f"{p}: {int(failed.sum())} failed row(s) of {len(failed)} (0 tokens) dropped "
                   f"(drop_failed = true)",)
        keep = ~failed
        df = df[keep]
        nums = {k: v[keep] for k, v in nums.items()}
    t = nums["Timestamp"]
    back = np.diff(t) < 0
    if back.any():
        raise _burst_error(p, df, np.concatenate([[False], back]), "Timestamp",
                           "out of order (earlier than the row before)")
    return _readonly(Trace(p, t - t[0], nums["Request tokens"].astype(np.int64),
                           nums["Response tokens"].astype(np.int64), source="; ".join(notes), dropped=dropped))


@trace_formats.register("burstgpt")
def read_burstgpt(path: Path, params: Mapping[str, Any], where: str) -> Trace:
    filt = params.get("filter", {})
    if not isinstance(filt, Mapping) or not all(
        isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(x, str) for x in v)) for v in filt.values()
    ):
        raise ConfigError(f"{where}: field 'filter' must be a table of column = value or [values], "
                          f"e.g. {{Model = \"ChatGPT\", \"Log Type\" = \"Conversation log\"}}; got {filt!r}")
    drop = params.get("drop_failed", False)
    if not isinstance(drop, bool):
        raise ConfigError(f"{where}: field 'drop_failed' must be true or false, got {drop!r}")
    return _read_burstgpt(*_version(path), _freeze(dict(filt)), drop)


# --------------------------------------------------------------------------- sharegpt
def _estimate(text: Any, chars_per_token: float) -> int:
    return max(1, math.ceil(len(text) / chars_per_token)) if isinstance(text, str) else 0


@lru_cache(maxsize=4)
def _read_sharegpt(path: str, _mtime: int, _size: int, chars_per_token: float) -> Trace:
    p = Path(path)
    try:
        data = json.loads(read_text(p))
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, list):
        raise DataError(f"{p}: expected a JSON list of conversations, got {type(data).__name__}")
    prompts, outputs = [], []
    skipped = estimated = 0
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise DataError(f"{p}: item {i}: expected an object, got {type(item).__name__}")
        given = next((pair for pair in GIVEN_COUNTS if pair[0] in item), None)
        if given is not None:
            for key in given:
                if not _positive_int(item.get(key)):
                    raise DataError(f"{p}: item {i}: field {key!r} must be an integer in [1, {MAX_REQUEST_TOKENS}], got {item.get(key)!r}")
            prompts.append(int(item[given[0]]))
            outputs.append(int(item[given[1]]))
            continue
        conv = item.get("conversations")
        if not isinstance(conv, list):
            raise DataError(f"{p}: item {i}: field 'conversations' must be a list of turns "
                            f"(or give {GIVEN_COUNTS[0][0]}/{GIVEN_COUNTS[0][1]}), got {conv!r:.60}")
        if len(conv) < 2:
            skipped += 1
            continue
        for j in (0, 1):
            if not isinstance(conv[j], dict) or not isinstance(conv[j].get("value"), str):
                raise DataError(f"{p}: item {i}: field 'conversations[{j}].value' must be a string")
        pr, out = _estimate(conv[0]["value"], chars_per_token), _estimate(conv[1]["value"], chars_per_token)
        if not pr or not out:
            skipped += 1
            continue
        prompts.append(pr)
        outputs.append(out)
        estimated += 1
    if not prompts:
        raise DataError(f"{p}: no conversation with a prompt and a reply")
    note = f"ShareGPT JSON ({len(data)} items, no arrival times)"
    if estimated:
        note += f"; {estimated} lengths ESTIMATED without a tokenizer as ceil(chars / {chars_per_token:g})"
    if skipped:
        note += f"; {skipped} conversations without a reply skipped"
    n = len(prompts)
    dropped = (f"{p}: {skipped} conversation(s) of {len(data)} without a reply skipped",) if skipped else ()
    return _readonly(Trace(p, np.zeros(n), np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64),
                           has_times=False, source=note, dropped=dropped))


@trace_formats.register("sharegpt")
def read_sharegpt(path: Path, params: Mapping[str, Any], where: str) -> Trace:
    cpt = params.get("chars_per_token", SHAREGPT_CHARS_PER_TOKEN)
    if isinstance(cpt, bool) or not isinstance(cpt, (int, float)) or not cpt > 0:
        raise ConfigError(f"{where}: field 'chars_per_token' must be a number > 0, got {cpt!r}")
    return _read_sharegpt(*_version(path), float(cpt))


# --------------------------------------------------------------------------- detection
def _first_line(path: Path) -> str:
    for line in read_text(path).splitlines():
        if line.strip():
            return line.strip()
    raise DataError(f"{path}: empty file")


def detect_format(path: Path, params: Mapping[str, Any] | None = None) -> str:
    """The reader for `path`: by extension, then by the first line (CSV header or JSON keys)."""
    params = params or {}
    if "columns" in params:
        return "csv"
    head = _first_line(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl" or (suffix != ".json" and head.startswith("{")):
        try:
            rec = json.loads(head)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and any(k in rec for k in BENCH_KEYS):
            raise DataError(f"{path}: this is a benchmark result (has {', '.join(k for k in BENCH_KEYS if k in rec)}), "
                            "not a trace; compare with it using `ppsim validate --bench-log FILE`")
        return "mooncake"
    if suffix == ".json" or head.startswith("["):
        if head.startswith("{"):
            raise DataError(f"{path}: a JSON object, not a trace; a bench_serving result goes to "
                            "`ppsim validate --bench-log FILE`, a ShareGPT file is a JSON list")
        return "sharegpt"
    cols = {c.strip().strip('"') for c in head.split(",")}
    if set(BURSTGPT_COLUMNS) <= cols:
        return "burstgpt"
    # Azure's columns are the CSV reader's defaults; any other CSV fails there with the columns
    # it lacks and the ones present (map them with `columns`).
    return "azure" if set(DEFAULT_COLUMNS.values()) <= cols else "csv"


@trace_formats.register("auto")
def read_auto(path: Path, params: Mapping[str, Any], where: str) -> Trace:
    return trace_formats.get(detect_format(path, params))(path, params, where)


def trace_workload(file: str, *, limit: int | None = None, fmt: str = "auto") -> dict[str, Any]:
    """The [workload] table of `--trace FILE`: the file replayed at its recorded times (all rows,
    or the first `limit` explicitly)."""
    path = Path(file).expanduser()
    if not path.is_file():
        raise DataError(f"--trace {file}: file not found")
    if limit is not None and limit <= 0:
        raise ConfigError(f"--limit must be a positive integer, got {limit}")
    table: dict[str, Any] = {"kind": "trace", "file": str(path.resolve()), "format": fmt, "arrivals": "timestamps"}
    if limit is not None:
        table["limit"] = limit
    return table
