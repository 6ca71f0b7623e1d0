"""Reading a `ppsim run --out` folder back, defensively (`ppsim report`, `ppsim compare`).

A run folder may be damaged (a copy cut short, a table edited by hand) or foreign (another
tool's `requests.csv`). Every problem is a one-line `DataError` naming the file and what is
wrong: `summary.json` must be a complete JSON object; a table must have the columns PipeSim
writes (`REQUEST_COLUMNS`, `ITERATION_COLUMNS`) and must not end mid-row. `iterations` is
optional: a run made with `--no-iterations` has none, and the readers say what they skip.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.core.errors import DataError
from sim.core.lazy import lazy

pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

# The columns `ppsim report` and `ppsim compare` read (sim/outputs/metrics.py documents all).
REQUEST_COLUMNS = ("req_id", "status", "ttft_ms", "tpot_ms")
ITERATION_COLUMNS = ("start_s", "end_s", "mode", "iter_ms", "chunk_size", "kv_used_tokens", "num_waiting")
TABLE_SUFFIXES = (".csv", ".parquet", ".npz")


def read_summary(folder: Path) -> dict:
    path = folder / "summary.json"
    if not path.is_file():
        raise DataError(f"{folder}: not a run folder (no summary.json; write one with `ppsim run CONFIG --out {folder}`)")
    from sim.core.textio import read_text

    try:
        summary = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg}); the file looks cut or edited") from None
    if not isinstance(summary, dict):
        raise DataError(f"{path}: expected a JSON object (a run's summary), got {type(summary).__name__}")
    return summary


def read_run_table(folder: Path, name: str, required: tuple[str, ...], *, optional: bool = False):
    """Table `name` of the run folder (CSV, Parquet or the former .npz), checked; None when it
    is absent and `optional`."""
    from sim.outputs.tables import read_table

    csv = folder / f"{name}.csv"
    if csv.is_file() and not any((folder / f"{name}{s}").is_file() for s in TABLE_SUFFIXES[1:]):
        from sim.core.textio import read_text

        text = read_text(csv)
        if not text.strip():
            raise DataError(f"{csv}: empty file (no header line)")
        if not text.endswith("\n"):
            raise DataError(f"{csv}: the last line ends mid-row (no newline at the end); the file looks cut")
    try:
        df = read_table(folder, name)
    except (ValueError, pd.errors.ParserError) as exc:
        raise DataError(f"{csv}: not a readable table ({' '.join(str(exc).split())[:120]})") from None
    if df is None:
        if optional:
            return None
        raise DataError(f"{csv}: missing (nor {name}.parquet or .npz); is {folder} the --out folder of 'ppsim run'?")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(f"{folder}/{name}: not a ppsim run's {name} table (no column {', '.join(map(repr, missing))})")
    return df
