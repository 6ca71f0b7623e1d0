"""Reading a `ppsim run --out` folder back, defensively (`ppsim report`, `ppsim compare`).

A run folder may be damaged (a copy cut short, a table edited by hand) or foreign (another
tool's `requests.csv`). Every problem is a one-line `DataError` naming the file and what is
wrong: `summary.json` must be a complete JSON object; a table must have the columns PipeSim
writes (`REQUEST_COLUMNS`, `ITERATION_COLUMNS`) and must not end mid-row. `iterations` is
optional: a run made with `--no-iterations` has none, and the readers say what they skip.
The request and iteration tables must hold the rows `summary.json` counts (`read_requests`,
`read_iterations`): a valid table cut at a row boundary (or with rows added) is not read as the
whole run.
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


def read_requests(folder: Path, summary: dict):
    """The run's request table, checked against summary.json's counts: as many arrived requests
    (status other than not_arrived) as `num_requests` and as many finished ones as `num_finished`.
    A summary without the counts (written by hand, or by an old version) is not checked."""
    df = read_run_table(folder, "requests", REQUEST_COLUMNS)
    status = df["status"].astype(str)
    got = {"num_requests": int((status != "not_arrived").sum()), "num_finished": int((status == "finished").sum())}
    want = {k: summary.get(k) for k in got}
    if all(isinstance(v, int) and not isinstance(v, bool) for v in want.values()) and got != want:
        name = next((f"requests{s}" for s in TABLE_SUFFIXES if (folder / f"requests{s}").is_file()), "requests")
        raise DataError(f"{folder / name}: {got['num_requests']} requests ({got['num_finished']} finished) but "
                        f"summary.json counts {want['num_requests']} ({want['num_finished']} finished); the table "
                        f"looks cut or edited")
    return df


def read_iterations(folder: Path, summary: dict):
    """The run's iteration table (None without one: `--no-iterations`), with one row for each of
    summary.json's `num_iterations` when it says how many."""
    df = read_run_table(folder, "iterations", ITERATION_COLUMNS, optional=True)
    want = summary.get("num_iterations")
    if df is not None and isinstance(want, int) and not isinstance(want, bool) and len(df) != want:
        name = next((f"iterations{s}" for s in TABLE_SUFFIXES if (folder / f"iterations{s}").is_file()), "iterations")
        raise DataError(f"{folder / name}: {len(df)} iterations but summary.json counts {want}; the table looks cut "
                        f"or edited")
    return df
