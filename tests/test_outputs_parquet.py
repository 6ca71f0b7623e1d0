"""`ppsim run --format parquet`: the requests and iterations tables as Parquet hold exactly the
values of the CSVs (floats bit for bit), and the report and compare commands read CSV, Parquet
and the `.npz` tables of runs made with the former `--format npz`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.cli import main
from sim.outputs.compare import load_run
from sim.outputs.tables import read_npz, read_parquet, read_table, write_parquet


def _column(values):
    return values.astype(str) if values.dtype == object else values


def _old_npz(df, path):
    """What the former `--format npz` wrote: one uncompressed array per column."""
    np.savez(path, **{c: _column(df[c].to_numpy()) for c in df})


def test_round_trip_keeps_values_dtypes_and_column_order(tmp_path):
    df = pd.DataFrame({"z": [0.1, -0.0, np.nan, np.inf, 1e-300], "a": np.arange(5, dtype=np.int64),
                       "mode": ["idle", "prefill", "decode", "mixed", ""], "b": [True, False, True, True, False]})
    write_parquet(df, tmp_path / "t.parquet")
    back = read_parquet(tmp_path / "t.parquet")
    assert list(back.columns) == ["z", "a", "mode", "b"]
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    assert back["a"].dtype == np.int64 and back["b"].dtype == bool
    assert np.signbit(back["z"][1])  # -0.0 survives


def test_an_old_npz_table_is_still_read(tmp_path):
    df = pd.DataFrame({"z": [0.5, np.nan], "mode": ["idle", "decode"]})
    _old_npz(df, tmp_path / "t.npz")
    back = read_npz(tmp_path / "t.npz")
    pd.testing.assert_frame_equal(back, df, check_dtype=False)


def test_run_writes_parquet_with_the_csv_values_and_report_and_compare_read_it(tmp_path):
    args = ["run", "experiments/configs/default.toml", "--set", "workload.num_requests=40"]
    assert main(args + ["--out", str(tmp_path / "csv")]) == 0
    assert main(args + ["--format", "parquet", "--out", str(tmp_path / "pq")]) == 0
    for name in ("requests", "iterations"):
        assert not (tmp_path / "pq" / f"{name}.csv").exists()
        from_csv = pd.read_csv(tmp_path / "csv" / f"{name}.csv")
        from_pq = read_table(tmp_path / "pq", name)
        assert list(from_pq.columns) == list(from_csv.columns) and len(from_pq) == len(from_csv) > 0
        for col in from_csv.columns:
            a, b = from_csv[col].to_numpy(), from_pq[col].to_numpy()
            if a.dtype.kind == "f":
                assert np.array_equal(a, b.astype(float), equal_nan=True), col  # repr round-trips exactly
            else:
                assert [str(x) for x in a] == [str(x) for x in b], col
    assert (tmp_path / "pq" / "summary.json").read_bytes() == (tmp_path / "csv" / "summary.json").read_bytes()
    a, b = load_run(tmp_path / "csv"), load_run(tmp_path / "pq")
    assert len(a["iterations"]) == len(b["iterations"]) and len(a["requests"]) == len(b["requests"])
    assert main(["report", str(tmp_path / "pq")]) == 0
    assert (tmp_path / "pq" / "report.md").is_file()
    # a run folder of the former --format npz: the same tables, read by report and compare
    old = tmp_path / "npz"
    old.mkdir()
    for f in ("summary.json", "config.toml", "decisions.csv", "moves.csv"):
        (old / f).write_bytes((tmp_path / "csv" / f).read_bytes())
    for name in ("requests", "iterations"):
        _old_npz(pd.read_csv(tmp_path / "csv" / f"{name}.csv"), old / f"{name}.npz")
    assert len(load_run(old)["iterations"]) == len(a["iterations"])
    assert main(["report", str(old)]) == 0


def test_a_broken_table_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    write_parquet(pd.DataFrame({"req_id": [0], "status": ["finished"], "ttft_ms": [1.0], "tpot_ms": [1.0]}),
                  tmp_path / "requests.parquet")
    (tmp_path / "iterations.parquet").write_bytes(b"not parquet")
    assert main(["report", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "iterations.parquet" in err[0] and "not a readable" in err[0]
