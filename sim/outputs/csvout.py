"""A fast CSV writer for run outputs, byte for byte what `DataFrame.to_csv(index=False)` writes.

pandas formats and writes a CSV row by row; a run's `iterations.csv` has hundreds of thousands
of rows, so that used to cost more than the simulation. Here every column is formatted at once
(floats by `repr`, the shortest string that reads back to the same number, as pandas does;
NaN and None as empty fields; booleans as True/False) and rows are joined in C. Columns of
other kinds (dates, categories), frames without rows and single-column frames go to pandas.
Either way the file is written to a temporary sibling and renamed into place once complete
(sim/core/fsio.py), so a reader never sees half a table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def _quote(text: str) -> str:
    """csv.QUOTE_MINIMAL, as pandas writes strings: quoted when it holds a comma, a quote or a
    line break."""
    # (tested one by one: a generator over them cost most of a text column's time, a call a row)
    if "," in text or '"' in text or "\n" in text or "\r" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


def format_column(values: pd.Series) -> list[str] | None:
    """The column's fields as pandas writes them, or None for a kind this writer leaves to pandas."""
    kind = values.dtype.kind
    if kind == "f":
        arr = values.to_numpy()
        out = list(map(repr, arr.tolist()))
        nan = np.isnan(arr)
        if nan.any():
            for i in np.flatnonzero(nan).tolist():
                out[i] = ""
        return out
    if kind in "iu":
        return list(map(str, values.to_numpy().tolist()))
    if kind == "b":
        return ["True" if v else "False" for v in values.to_numpy().tolist()]
    if kind == "O" or isinstance(values.dtype, pd.StringDtype):
        out = []
        for v in values.tolist():
            if v is None or (isinstance(v, float) and v != v):
                out.append("")
            elif isinstance(v, str):
                out.append(_quote(v))
            elif isinstance(v, bool):
                out.append("True" if v else "False")
            elif isinstance(v, (int, float)):
                out.append(repr(v) if isinstance(v, float) else str(v))
            else:
                return None
        return out
    return None


def write_csv(df: pd.DataFrame, path: str | Path, block: int = 8192) -> None:
    """`df.to_csv(path, index=False)`, faster. Rows are formatted and written `block` at a time,
    so the text of a huge table is never held at once (a 10^6-row requests.csv would take
    about 1.5 GB as Python strings; a block of 8,192 rows about 15 MB). Atomic: see above."""
    from sim.core.fsio import atomic_path

    with atomic_path(path) as tmp:
        _write_csv(df, tmp, block)


def _write_csv(df: pd.DataFrame, path: Path, block: int) -> None:
    if len(df) == 0 or df.shape[1] < 2 or not df.columns.is_unique:
        df.to_csv(path, index=False)
        return
    columns = [df[name] for name in df.columns]
    # equal columns (every stage's start time) are formatted once: same[i] is the first equal one
    same = list(range(len(columns)))
    for i, values in enumerate(columns):
        if values.dtype.kind in "fiub":
            arr = values.to_numpy()
            for j in range(i):
                if same[j] == j and columns[j].dtype == values.dtype and np.array_equal(columns[j].to_numpy(), arr):
                    same[i] = j
                    break
    n = len(df)

    def formatted(a: int, b: int) -> list | None:
        cols: dict[int, list[str]] = {}
        for i, j in enumerate(same):
            if j not in cols:
                col = format_column(columns[j].iloc[a:b])
                if col is None:
                    return None
                cols[j] = col
        return [cols[j] for j in same]

    first = formatted(0, min(block, n))
    if first is None:
        df.to_csv(path, index=False)
        return
    header = ",".join(_quote(str(c)) for c in df.columns)
    with open(path, "w", newline="") as fh:
        fh.write(header + "\n")
        for a in range(0, n, block):
            cols = first if a == 0 else formatted(a, min(a + block, n))
            fh.write("\n".join(map(",".join, zip(*cols))))
            fh.write("\n")
