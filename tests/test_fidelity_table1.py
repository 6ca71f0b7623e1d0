"""Table 1 as a calibration target (issue 46): `ppsim fidelity` reads table1.csv and holds a predictor's
MAPE to its tolerance in percentage points, not to the 10% ratio of the other targets."""

from __future__ import annotations

import tomllib

import pandas as pd

from sim.studies import fidelity

from conftest import REPO


def test_targets_file_lists_table1_with_the_issue_tolerances():
    t = tomllib.loads((REPO / "profiles" / "calibration_targets.toml").read_text())
    rows = {e["predictor"]: (e["value"], e["tolerance_points"]) for e in t["table1"]}
    assert rows == {"offline": (15.85, 3.0), "alp": (3.4, 1.5)}


def test_table1_rows_hold_within_their_points(tmp_path):
    # hand case: offline 13.0 is 2.85 points below 15.85 (inside 3: holds, though 18% off in ratio);
    # alp 4.95 is 1.55 points above 3.4 (outside 1.5: a miss)
    pd.DataFrame({"predictor": ["offline", "alp", "lstsq"], "mape_pct": [13.0, 4.95, 1.0],
                  "predict_us": [0.3, 1.9, 2.0]}).to_csv(tmp_path / "table1.csv", index=False)
    rows = {r["target"]: r for r in fidelity.collect(tmp_path) if r["group"].startswith("latency-predictor")}
    off, alp = rows["offline table only MAPE (%)"], rows["every ALP feature MAPE (%)"]
    assert off["simulated"] == 13.0 and off["holds"] and abs(off["ratio"] - 13.0 / 15.85) < 1e-12
    assert alp["simulated"] == 4.95 and not alp["holds"]
    assert fidelity.table1_holds(4.9, 3.4, 1.5) and not fidelity.table1_holds(None, 3.4, 1.5)


def test_table1_not_run_is_reported_as_such(tmp_path):
    rows = [r for r in fidelity.collect(tmp_path) if r["group"].startswith("latency-predictor")]
    assert len(rows) == 2 and all(r["simulated"] is None and not r["holds"] for r in rows)
