"""A run's two large tables (requests, iterations) as files: CSV or Parquet, and the reader.

A CSV costs a float `repr` per value (sim/outputs/csvout.py is at that floor: ~0.8 us a value
here), so writing `iterations.csv` at 10,000 requests takes about as long as simulating them.
`ppsim run --format parquet` writes the same columns as Parquet through pyarrow: the exact
floats, no formatting, and the format pandas, polars, DuckDB and Spark read. Numeric columns are
written plain (no dictionary, no statistics, no compression), which makes pyarrow as cheap as
the NumPy `.npz` archives PipeSim wrote before (benchmarks/README.md, "Outputs"); text columns
(`mode`, `status`) are dictionary-encoded.

`read_table` reads a run folder's table from whichever of `<name>.parquet`, `<name>.npz` (runs
made with the former `--format npz`) and `<name>.csv` the run wrote, so `report` and `compare`
take all three.
"""

from __future__ import annotations

from pathlib import Path

from sim.core.errors import DataError
from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

FORMATS = ("csv", "parquet")  # `ppsim run --format`


def write_parquet(df, path: str | Path) -> None:
    """`df` as one Parquet file (see the module docstring for the encoding), written to a temporary
    sibling and renamed into place once complete (sim/core/fsio.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sim.core.fsio import atomic_path

    text = [str(c) for c in df.columns if df[c].dtype == object or str(df[c].dtype) in ("str", "string")]
    table = pa.Table.from_pandas(df, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, str(tmp), compression="NONE", use_dictionary=text or False, write_statistics=False)


def read_parquet(path: str | Path):
    return pd.read_parquet(path, engine="pyarrow")


def read_npz(path: str | Path):
    """A table written by the former `--format npz` (one array per column; text columns come
    back as Python strings)."""
    columns = {}
    with np.load(path, allow_pickle=False) as z:
        for name in z.files:
            values = z[name]  # (each z[name] reads the array from the archive again)
            columns[name] = values.astype(object) if values.dtype.kind == "U" else values
    return pd.DataFrame(columns)


def read_table(folder: str | Path, name: str):
    """Table `name` (e.g. "iterations") of a `ppsim run --out` folder, from `<name>.parquet`,
    `<name>.npz` or `<name>.csv`; None when the run wrote none of them."""
    folder = Path(folder)
    for suffix, reader in ((".parquet", read_parquet), (".npz", read_npz)):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            try:
                return reader(path)
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: not a readable {suffix} table ({' '.join(str(exc).split())})") from None
            except Exception as exc:  # pyarrow's own errors (ArrowInvalid is a ValueError; others are not)
                raise DataError(f"{path}: not a readable {suffix} table ({type(exc).__name__})") from None
    csv = folder / f"{name}.csv"
    if csv.is_file():
        return pd.read_csv(csv)
    return None
