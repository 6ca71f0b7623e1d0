"""A fast CSV writer for run outputs, byte for byte what `DataFrame.to_csv(index=False)` writes.

pandas formats and writes a CSV row by row; a run's `iterations.csv` has hundreds of thousands
of rows, so that used to cost more than the simulation. Here every column is formatted at once
(floats by `repr`, the shortest string that reads back to the same number, as pandas does;
NaN and None as empty fields; booleans as True/False) and rows are joined in C. Columns of
other kinds (dates, categories), frames without rows and single-column frames go to pandas.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

_NEEDS_QUOTES = (",", '"', "\n", "\r")


def _quote(text: str) -> str:
    """csv.QUOTE_MINIMAL, as pandas writes strings."""
    if any(c in text for c in _NEEDS_QUOTES):
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


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """`df.to_csv(path, index=False)`, faster."""
    if len(df) == 0 or df.shape[1] < 2 or not df.columns.is_unique:
        df.to_csv(path, index=False)
        return
    cols = []
    done: dict[tuple, list[str]] = {}  # equal columns (every stage's start time) are formatted once
    for name in df.columns:
        values = df[name]
        key = (values.dtype.str, values.to_numpy().tobytes()) if values.dtype.kind in "fiub" else None
        col = done.get(key) if key is not None else None
        if col is None:
            col = format_column(values)
            if col is None:
                df.to_csv(path, index=False)
                return
            if key is not None:
                done[key] = col
        cols.append(col)
    header = ",".join(_quote(str(c)) for c in df.columns)
    with open(path, "w", newline="") as fh:
        fh.write(header + "\n")
        # rows in blocks, so the joined text of a huge table is never held at once
        n, block = len(df), 65536
        for a in range(0, n, block):
            rows = zip(*(c[a:a + block] for c in cols))
            fh.write("\n".join(map(",".join, rows)))
            fh.write("\n")
