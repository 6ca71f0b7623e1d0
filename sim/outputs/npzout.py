"""Binary column files for a run's tables: `ppsim run --format npz`.

A CSV costs a float `repr` per value (sim/outputs/csvout.py is at that floor: ~0.8 us a value here), so
writing `iterations.csv` at 10,000 requests takes about half as long as simulating them. An
`.npz` archive (NumPy's zip of one `.npy` array per column, uncompressed) stores the same
columns as their bytes: no formatting, the exact floats, and a reader in every NumPy.

Layout: one array per column, named after it, in the table's column order; text columns
(`mode`, `status`) as fixed-width unicode. `read_table` reads a run folder's table from
whichever of `<name>.npz` and `<name>.csv` the run wrote, so the report and compare commands
take both.
"""

from __future__ import annotations

from pathlib import Path

from sim.core.errors import DataError
from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

FORMATS = ("csv", "npz")  # `ppsim run --format`


def write_npz(df, path: str | Path) -> None:
    """`df`'s columns as one uncompressed `.npz` archive (see the module docstring)."""
    arrays = {}
    for name in df.columns:
        values = df[name].to_numpy()
        if values.dtype == object:
            if not all(isinstance(v, str) for v in values):
                raise TypeError(f"column {name!r}: only text or numeric columns go to .npz")
            values = values.astype(str)
        arrays[str(name)] = values
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def read_npz(path: str | Path):
    """The DataFrame `write_npz` wrote (text columns come back as Python strings)."""
    columns = {}
    with np.load(path, allow_pickle=False) as z:
        for name in z.files:
            values = z[name]  # (each z[name] reads the array from the archive again)
            columns[name] = values.astype(object) if values.dtype.kind == "U" else values
    return pd.DataFrame(columns)


def read_table(folder: str | Path, name: str):
    """Table `name` (e.g. "iterations") of a `ppsim run --out` folder, from `<name>.npz` or
    `<name>.csv`; None when the run wrote neither."""
    folder = Path(folder)
    npz, csv = folder / f"{name}.npz", folder / f"{name}.csv"
    if npz.is_file():
        try:
            return read_npz(npz)
        except (OSError, ValueError) as exc:
            raise DataError(f"{npz}: not a readable .npz table ({exc})") from None
    if csv.is_file():
        return pd.read_csv(csv)
    return None
