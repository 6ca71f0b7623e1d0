"""The fast CSV writer writes exactly what pandas' `to_csv(index=False)` writes, and
`ppsim run --no-iterations` skips iterations.csv without changing the other outputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.cli import main
from sim.outputs.csvout import write_csv


def _same_as_pandas(df: pd.DataFrame, tmp_path) -> None:
    df.to_csv(tmp_path / "pandas.csv", index=False)
    write_csv(df, tmp_path / "fast.csv")
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_tricky_values_match_pandas(tmp_path):
    df = pd.DataFrame({
        "f": [0.1, -0.0, 1e-7, 1e16, 123456789.123, math.nan, math.inf, 3.0],
        "i": np.array([0, -1, 2**40, 7, 8, 9, 10, 11], dtype=np.int64),
        "b": [True, False, True, True, False, False, True, False],
        "s": ["a", "b,c", 'say "hi"', "line\nbreak", "", "idle", "x", "y"],
        "o": [None, 1.5, None, 2.25, None, 3.0, 4.0, None],
        "mixed": ["a", 1, 2.5, None, True, "z", math.nan, "w"],
    })
    _same_as_pandas(df, tmp_path)


def test_random_floats_match_pandas(tmp_path):
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"a": rng.random(3000) * 10.0 ** rng.integers(-8, 12, 3000), "b": rng.integers(0, 10**9, 3000)})
    df.loc[::7, "a"] = np.nan
    _same_as_pandas(df, tmp_path)


def test_equal_columns_formatted_once_still_match(tmp_path):
    x = np.linspace(0, 1, 101)
    _same_as_pandas(pd.DataFrame({"s0": x, "s1": x.copy(), "n": np.arange(101)}), tmp_path)


def test_empty_and_single_column_frames_fall_back_to_pandas(tmp_path):
    _same_as_pandas(pd.DataFrame({"a": [], "b": []}), tmp_path)
    _same_as_pandas(pd.DataFrame({"a": ["", "x"]}), tmp_path)


def test_no_iterations_flag(tmp_path):
    args = ["run", "experiments/configs/default.toml", "--set", "workload.num_requests=40"]
    assert main(args + ["--out", str(tmp_path / "full")]) == 0
    assert main(args + ["--no-iterations", "--out", str(tmp_path / "lean")]) == 0
    assert (tmp_path / "full" / "iterations.csv").is_file()
    assert not (tmp_path / "lean" / "iterations.csv").exists()
    for name in ("requests.csv", "summary.json"):
        assert (tmp_path / "lean" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
