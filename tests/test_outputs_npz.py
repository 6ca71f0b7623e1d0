"""`ppsim run --format npz`: the requests and iterations tables as .npz archives hold exactly
the values of the CSVs (floats bit for bit), and the report and compare commands read either."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from sim.outputs.compare import load_run
from sim.outputs.npzout import read_npz, read_table, write_npz


def test_round_trip_keeps_values_dtypes_and_column_order(tmp_path):
    df = pd.DataFrame({"z": [0.1, -0.0, np.nan, np.inf, 1e-300], "a": np.arange(5, dtype=np.int64),
                       "mode": ["idle", "prefill", "decode", "mixed", ""], "b": [True, False, True, True, False]})
    write_npz(df, tmp_path / "t.npz")
    back = read_npz(tmp_path / "t.npz")
    assert list(back.columns) == ["z", "a", "mode", "b"]
    pd.testing.assert_frame_equal(back, df)
    assert np.signbit(back["z"][1])  # -0.0 survives


def test_a_column_of_mixed_objects_is_refused(tmp_path):
    with pytest.raises(TypeError, match="'o'"):
        write_npz(pd.DataFrame({"o": ["a", None]}), tmp_path / "t.npz")


def test_run_writes_npz_with_the_csv_values_and_report_and_compare_read_it(tmp_path):
    args = ["run", "experiments/configs/default.toml", "--set", "workload.num_requests=40"]
    assert main(args + ["--out", str(tmp_path / "csv")]) == 0
    assert main(args + ["--format", "npz", "--out", str(tmp_path / "npz")]) == 0
    for name in ("requests", "iterations"):
        assert not (tmp_path / "npz" / f"{name}.csv").exists()
        from_csv = pd.read_csv(tmp_path / "csv" / f"{name}.csv")
        from_npz = read_table(tmp_path / "npz", name)
        assert list(from_npz.columns) == list(from_csv.columns) and len(from_npz) == len(from_csv) > 0
        for col in from_csv.columns:
            a, b = from_csv[col].to_numpy(), from_npz[col].to_numpy()
            if a.dtype.kind == "f":
                assert np.array_equal(a, b.astype(float), equal_nan=True), col  # repr round-trips exactly
            else:
                assert [str(x) for x in a] == [str(x) for x in b], col
    assert (tmp_path / "npz" / "summary.json").read_bytes() == (tmp_path / "csv" / "summary.json").read_bytes()
    a, b = load_run(tmp_path / "csv"), load_run(tmp_path / "npz")
    assert len(a["iterations"]) == len(b["iterations"]) and len(a["requests"]) == len(b["requests"])
    assert main(["report", str(tmp_path / "npz")]) == 0
    assert (tmp_path / "npz" / "report.md").is_file()


def test_a_broken_npz_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    write_npz(pd.DataFrame({"req_id": [0], "status": ["finished"]}), tmp_path / "requests.npz")
    (tmp_path / "iterations.npz").write_bytes(b"not a zip")
    assert main(["report", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "iterations.npz" in err[0] and "not a readable" in err[0]
