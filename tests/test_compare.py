"""`ppsim compare`, the context header of every run, and `--out`/`--force`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_config

from sim.cli import main
from sim.outputs.compare import compare_table, load_run
from sim.outputs.context import describe, format_header
from sim.workloads import build_workload

FAST = """seed = 1
[parallel]
pp = {pp}
[scheduler]
chunk_size_tokens = 256
kv_tokens = 50000
[latency]
kind = "constant"
stage_ms = {stage}
[workload]
kind = "synthetic-uniform"
rate_rps = 5.0
num_requests = 20
input_range = [10, 300]
output_range = [2, 20]
"""


def config(tmp_path, pp=2, stage=10.0):
    p = tmp_path / f"c{pp}_{stage}.toml"
    p.write_text(FAST.format(pp=pp, stage=stage))
    return p


def test_compare_two_runs(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(config(tmp_path)), "--out", str(a)]) == 0
    assert main(["run", str(config(tmp_path, pp=1, stage=20.0)), "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "runs differ in:" in out and "TP1 x PP2" in out and "TP1 x PP1" in out
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    row = table[(table["metric"] == "ttft_ms") & (table["stat"] == "p90")].iloc[0]
    assert row["a"] == pytest.approx(sa["p90_ttft_ms"], rel=1e-5)
    assert row["b - a"] == pytest.approx(sb["p90_ttft_ms"] - sa["p90_ttft_ms"], rel=1e-5)
    assert row["b vs a %"] == pytest.approx((sb["p90_ttft_ms"] / sa["p90_ttft_ms"] - 1) * 100, rel=1e-5)
    assert {"iter_ms", "itl_ms", "e2e_ms", "tpot_ms", "request_throughput"} <= set(table["metric"])
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0


def test_compare_table_by_hand(tmp_path):
    runs = [{"name": n, "path": tmp_path / n, "summary": s} for n, s in
            (("x", {"mean_ttft_ms": 100.0, "p90_ttft_ms": 200.0}), ("y", {"mean_ttft_ms": 150.0, "p90_ttft_ms": 100.0}))]
    t = compare_table(runs).set_index(["metric", "stat"])
    assert t.loc[("ttft_ms", "mean"), "y - x"] == 50.0 and t.loc[("ttft_ms", "mean"), "y vs x %"] == 50.0
    assert t.loc[("ttft_ms", "p90"), "y vs x %"] == -50.0
    assert ("tpot_ms", "mean") not in t.index  # absent from both summaries: no row


def test_compare_errors(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    assert "at least two" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a run folder" in err
    with pytest.raises(Exception, match="not a run folder"):
        load_run(tmp_path)


def test_out_folder_of_another_run_needs_force(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = config(tmp_path)
    assert main(["run", str(cfg), "--timeline", "--out", str(out)]) == 0
    assert (out / "timeline.json").is_file()
    capsys.readouterr()
    assert main(["run", str(cfg), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["run", str(cfg), "--out", str(out), "--force"]) == 0
    assert not (out / "timeline.json").exists()  # the stale file of the earlier run is gone
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["run", str(cfg), "--out", str(other), "--force"]) == 2
    assert "notes.txt" in capsys.readouterr().err and (other / "notes.txt").exists()


def test_context_header_names_what_was_simulated():
    cfg = make_config()
    reqs = build_workload(cfg.workload, seed=cfg.seed)
    ctx = describe(cfg, reqs)
    assert ctx["deployment"] == "TP1 x PP2 x 1 replica = 2 GPUs"
    assert ctx["chunk policy"] == "static (chunk 256 tokens)"
    assert ctx["workload"].startswith("inline (synthetic-uniform")
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    assert ctx["rate"] == (f"Poisson 5.0 req/s; 20 requests over {span:.1f} s ({20 / span:.3g} req/s offered: "
                           "count / span, as `workload stats`)")
    assert ctx["seed"] == "1" and ctx["slo"] == "TTFT 2000 ms, TPOT 200 ms"
    text = format_header(ctx)
    assert all(line.startswith("# ") for line in text.splitlines())
    prof = describe(make_config(latency={"kind": "profile", "profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"},
                                scheduler={"chunk_size_tokens": 512}))
    assert prof["model"] == "qwen2.5-32b" and prof["gpu"] == "A100-40GB-PCIe"
    import tomllib

    from conftest import REPO

    meta = tomllib.loads((REPO / "profiles/a100-pcie-40gb/qwen2.5-32b/tp1/meta.toml").read_text())
    assert f"{meta['comm']['allreduce_busbw_gbps']:g} GB/s" in prof["interconnect"] and "fitted:" in prof["profile"]


def test_throughput_over_the_arrival_window_and_with_the_drain(tmp_path):
    out = tmp_path / "r"
    assert main(["run", str(config(tmp_path)), "--out", str(out), "--json"]) == 0
    s = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    window = req["arrival_s"].max() - req["arrival_s"].min()
    assert s["arrival_window_s"] == pytest.approx(window)
    assert s["throughput_rps"] == pytest.approx(20 / window)
    assert s["throughput_drain_rps"] == pytest.approx(20 / s["duration_s"]) == s["request_throughput"]
    assert s["throughput_drain_rps"] < s["throughput_rps"]
