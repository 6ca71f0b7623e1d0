"""`ppsim validate` against small hand-made bench_serving files."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.errors import DataError
from sim.validate import read_bench_log


def write_log(path, recs):
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


def test_validate_prints_errors_per_metric(tmp_path, capsys):
    log = write_log(tmp_path / "b.jsonl", [{"request_rate": 4.0, "ttfts": [0.5, 0.6, 0.7, 0.9] * 5,
                                              "tpots": [0.1, 0.12] * 10, "e2es": [20.0, 30.0, 25.0, 28.0] * 5}])
    code = main(["validate", "--bench-log", str(log), "--workload", "azure-conv-synth", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == 12
    assert {r["metric"] for r in rows} == {"ttft", "tpot", "e2e"}
    assert {r["stat"] for r in rows} == {"mean", "p50", "p90", "p99"}
    ttft_mean = next(r for r in rows if r["metric"] == "ttft" and r["stat"] == "mean")
    assert ttft_mean["real_ms"] == pytest.approx(675.0)
    assert ttft_mean["error_pct"] == pytest.approx((ttft_mean["sim_ms"] - 675.0) / 675.0 * 100)


@pytest.mark.parametrize("line,needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"request_rate": -1, "ttfts": [1], "tpots": [], "e2es": [1]}), "request_rate"),
    (json.dumps({"request_rate": 1, "ttfts": "x", "tpots": [], "e2es": [1]}), "'ttfts'"),
    (json.dumps({"request_rate": 1, "ttfts": [1, 2], "tpots": [], "e2es": [1]}), "equal length"),
])
def test_bad_bench_logs(tmp_path, capsys, line, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(DataError, match=needle):
        read_bench_log(p)
    assert main(["validate", "--bench-log", str(p), "--workload", "sharegpt"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(p) in err
