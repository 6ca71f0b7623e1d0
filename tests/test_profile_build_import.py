"""`ppsim profile import-vidur` says what it adds: every [overhead] term with its value and status,
`--overhead key=value`, `--no-overheads`, user-supplied values marked as such."""

from __future__ import annotations

import tomllib

import pytest

from sim.cli import main as ppsim
from test_latency_cli import model_toml, tiny_mlp

TERMS = ("cpu_ms", "lm_head_ms", "embedding_ms", "sample_ms", "broadcast_us")


def fit_status(out) -> dict:
    meta = tomllib.loads((out / "meta.toml").read_text())
    return {f["param"]: (f["value"], f["status"]) for f in meta["fit"]}, meta["overhead"]


def test_every_term_is_printed_with_its_status(tmp_path, capsys):
    tiny_mlp(tmp_path)
    cfg = model_toml(tmp_path)
    cfg.write_text(cfg.read_text() + "[overhead]\nsample_ms = 0.5\n")
    assert ppsim(["profile", "import-vidur", str(tmp_path), "--model", str(cfg), "--out", str(tmp_path / "o"),
                  "--overhead", "cpu_ms=1.5"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("overhead ")}
    assert set(lines) == set(TERMS)
    assert "cpu_ms = 1.5" in lines["cpu_ms"] and lines["cpu_ms"].endswith("user-supplied (--overhead)")
    assert "sample_ms = 0.5" in lines["sample_ms"] and "user-supplied (" in lines["sample_ms"]
    assert lines["lm_head_ms"].endswith("default, not yet fitted")
    fits, overhead = fit_status(tmp_path / "o")
    assert fits["cpu_ms"] == (1.5, "user-supplied (--overhead)")
    from sim.profiling.provenance import profile_source_of

    assert profile_source_of(str(tmp_path / "o")).startswith("imported (ppsim profile import-vidur): Vidur profile")
    assert overhead["sample_ms"] == 0.5 and overhead["lm_head_ms"] == 1.0


def test_no_overheads_is_like_for_like_with_vidur(tmp_path, capsys):
    tiny_mlp(tmp_path)
    cfg = model_toml(tmp_path)
    assert ppsim(["profile", "import-vidur", str(tmp_path), "--model", str(cfg), "--out", str(tmp_path / "o"),
                  "--no-overheads", "--overhead", "broadcast_us=30"]) == 0
    out = capsys.readouterr().out
    assert out.count("off (--no-overheads") == 4 and "broadcast_us = 30" in out
    _, overhead = fit_status(tmp_path / "o")
    assert overhead == {"cpu_ms": 0, "lm_head_ms": 0, "embedding_ms": 0, "sample_ms": 0, "broadcast_us": 30.0}
    # The profile then simulates only the measured layers: stage 0 of PP=1 has no overhead term.
    from sim.latency.base import BatchStats
    from sim.latency.profiled import Profile, ProfiledLatencyModel

    lat = ProfiledLatencyModel(Profile.load(tmp_path / "o"), 1)
    assert lat.stage_time(BatchStats.prefill(64), 0).overhead_s == 0 and lat.iteration_overhead_s == 0


@pytest.mark.parametrize("flag, msg", [("cpu_ms", "expected key=value"), ("gpu_ms=1", "key one of cpu_ms"),
                                       ("cpu_ms=-1", "number >= 0"), ("cpu_ms=x", "number >= 0")])
def test_bad_overhead_flags(tmp_path, capsys, flag, msg):
    tiny_mlp(tmp_path)
    assert ppsim(["profile", "import-vidur", str(tmp_path), "--model", str(model_toml(tmp_path)), "--out",
                  str(tmp_path / "o"), "--overhead", flag]) == 2
    err = capsys.readouterr().err
    assert msg in err and "--overhead" in err and err.count("\n") == 1


def test_help_documents_the_overhead_table(capsys):
    assert ppsim(["profile", "import-vidur", "--help"]) == 0
    out = capsys.readouterr().out
    for term in (*TERMS, "[overhead]", "--no-overheads", "--overhead"):
        assert term in out
