"""One test per class of hostile input of issue 32: lost data, hangs, internal errors, silently
wrong answers, and the rest. The fuzz suite (tests/test_fuzz.py) covers the same ground at
random; these are the examples the issue names, each pinned down."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fuzzing import invoke

REPO = Path(__file__).resolve().parents[1]
DEFAULT = str(REPO / "experiments" / "configs" / "default.toml")
SMALL = ["--set", "workload.num_requests=10"]


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("ppsim: warning:")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- lost data

def test_a_refused_forced_run_leaves_the_earlier_run_as_it_was(tmp_path):
    out = tmp_path / "run"
    assert invoke(["run", DEFAULT, *SMALL, "--out", str(out)])[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", "parallel.pp=65", "--out", str(out), "--force"])
    assert code == 2 and "pp" in one_line(err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    # and a forced run that succeeds does replace it
    assert invoke(["run", DEFAULT, "--set", "workload.num_requests=12", "--out", str(out), "--force"])[0] == 0
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 12


def test_single_output_files_are_never_replaced_without_force(tmp_path):
    precious = tmp_path / "README.md"
    precious.write_text("mine\n")
    code, _, err = invoke(["fidelity", "--out", str(precious)])
    assert code == 2 and "--force" in one_line(err) and precious.read_text() == "mine\n"
    code, _, err = invoke(["plan", "--gpus", "1", "--rate", "1", "--json", str(precious), "--out",
                           str(tmp_path / "plan"), "--no-progress"])
    assert code == 2 and "--json" in one_line(err) and precious.read_text() == "mine\n"


@pytest.mark.parametrize("argv", [
    ["run", DEFAULT, *SMALL, "--out", "{repo}"],
    ["run", DEFAULT, *SMALL, "--out", "{repo}", "--force"],
    ["goodput", DEFAULT, *SMALL, "--rates", "1:2", "--out", "{repo}"],
    ["compare", "{run}", "{run}", "--out", "{repo}"],
    ["compare", "{run}", "{run}", "--out", "{run}"],  # another kind's folder
    ["goodput", DEFAULT, *SMALL, "--rates", "1:2", "--out", "{run}"],
])
def test_out_refuses_the_project_root_and_other_kinds_of_folder(tmp_path, argv):
    run = tmp_path / "run"
    assert invoke(["run", DEFAULT, *SMALL, "--out", str(run)])[0] == 0
    repo_files = sorted(p.name for p in REPO.iterdir())
    argv = [a.replace("{repo}", str(REPO)).replace("{run}", str(run)) for a in argv]
    code, _, err = invoke(argv)
    assert code == 2 and "--out" in one_line(err)
    assert sorted(p.name for p in REPO.iterdir()) == repo_files


def test_a_closed_pipe_costs_no_file(tmp_path):
    out = tmp_path / "gp"
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "goodput", DEFAULT, *SMALL, "--rates", "1:3",
                             "--tol", "1", "--out", str(out), "--no-progress"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and "Traceback" not in err, err
    assert (out / "goodput_rates.csv").is_file()


# ---------------------------------------------------------------- hangs

@pytest.mark.parametrize("override", ["latency.overrides={s_mem=nan}", "latency.noise_cv=inf",
                                      "latency.overrides={s_comp=1e300}"])
def test_non_finite_numbers_are_refused_not_run(override):
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", override, "--out", "/nonexistent/x"], timeout_s=20)
    assert code == 2 and f"--set {override}" in one_line(err)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead
        return fh.read().split()[2] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc to see the workers")
def test_workers_end_with_their_parent_even_after_sigkill(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "goodput", DEFAULT, "--rates", "1:8", "--jobs", "2",
                             "--out", str(tmp_path / "gp"), "--no-progress"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    deadline = time.time() + 60
    while time.time() < deadline and len(workers) < 2:
        time.sleep(0.2)
        workers = _children(proc.pid)
    assert workers, "no worker started"
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers)


def test_a_second_ctrl_c_prints_no_traceback(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "goodput", DEFAULT, "--rates", "1:30", "--seeds", "3",
                             "--jobs", "2", "--out", str(tmp_path / "gp"), "--no-progress"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(_children(proc.pid)) < 2:
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group, twice
    time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130 and "Traceback" not in err, err


# ---------------------------------------------------------------- internal errors

def test_files_that_are_not_utf8_are_one_line_errors(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(Path(DEFAULT).read_bytes().replace(b"PP=4", b"PP\xe9"))
    code, _, err = invoke(["run", str(cfg), "--out", str(tmp_path / "o")])
    assert code == 2 and "not UTF-8" in one_line(err) and str(cfg) in err
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'{"timestamp": 0, "input_length": 5, "output_length": 3}\n\xff\n')
    code, _, err = invoke(["run", DEFAULT, "--trace", str(trace), "--out", str(tmp_path / "o")])
    assert code == 2 and "not UTF-8" in one_line(err)
    log = tmp_path / "b.json"
    log.write_bytes(b"\xff\xfe{}")
    code, _, err = invoke(["validate", "--bench-log", str(log)])
    assert code == 2 and "not UTF-8" in one_line(err)


@pytest.mark.parametrize("damage", ["cut-summary", "foreign-requests", "cut-table", "empty-summary"])
def test_report_on_a_damaged_run_folder_is_one_line(tmp_path, damage):
    run = tmp_path / "run"
    assert invoke(["run", DEFAULT, *SMALL, "--out", str(run)])[0] == 0
    if damage == "cut-summary":
        text = (run / "summary.json").read_text()
        (run / "summary.json").write_text(text[: len(text) // 2])
    elif damage == "foreign-requests":
        (run / "requests.csv").write_text("name,age\nann,3\n")
    elif damage == "cut-table":
        text = (run / "requests.csv").read_text()
        (run / "requests.csv").write_text(text[: len(text) - 7])
    else:
        (run / "summary.json").write_text("")
    code, _, err = invoke(["report", str(run)])
    assert code == 2 and str(run) in one_line(err)


def test_workload_stats_with_a_negative_seed_and_a_million_replicas(tmp_path):
    code, _, err = invoke(["workload", "stats", "sharegpt", "--seed", "-1"])
    assert code == 2 and "--seed" in one_line(err)
    t0 = time.time()
    code, _, err = invoke(["run", DEFAULT, "--set", "parallel.replicas=1000000", "--out", str(tmp_path / "o")])
    assert code == 2 and "replicas" in one_line(err) and time.time() - t0 < 10


TINY = REPO / "tests" / "data" / "tiny-profile"


@pytest.mark.parametrize("file, old, new, needle", [
    ("meta.toml", "[profile]\n", "profile = \"ms\"\n[old_profile]\n", "[profile] must be a table"),  # a crash in the header
    ("meta.toml", "sources = []", "sources = 3.5", "'sources' must be a list of strings"),
    ("meta.toml", "m_init_gib = 0.5", "m_init_gib = 1e300", "'m_init_gib' must be a finite number in (0, 1e+06]"),
    ("layer_nonattn.csv", "2048,12.0", "2048,1e300", "'layer_nonattn_ms' must hold positive numbers"),
    ("attention.csv", "1e-5", "x", "'b_ctx' must hold non-negative numbers"),
])
def test_profile_values_out_of_range_or_of_the_wrong_type_are_one_line_errors(tmp_path, file, old, new, needle):
    prof = tmp_path / "prof"
    shutil.copytree(TINY, prof)
    text = (prof / file).read_text()
    assert old in text
    (prof / file).write_text(text.replace(old, new))
    for argv in (["run", DEFAULT, "--set", f'latency.profile="{prof}"', "--set", "parallel.pp=1", *SMALL,
                  "--out", str(tmp_path / "o")], ["profile", "check", str(prof)]):
        code, _, err = invoke(argv)
        assert code == 2 and needle in one_line(err) and str(prof / file) in err, err
    assert not (tmp_path / "o").exists()


def test_a_damaged_gzip_file_is_a_one_line_error(tmp_path):
    data = bytearray(gzip.compress(b'{"timestamp": 0, "input_length": 5, "output_length": 3}\n' * 50))
    data[10] ^= 0x5A  # (the deflate stream's first byte: zlib's own error, not the CRC check's)
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(bytes(data))
    code, _, err = invoke(["run", DEFAULT, "--trace", str(trace), "--out", str(tmp_path / "o")])
    assert code == 2 and f"{trace}: a damaged or cut gzip file" in one_line(err)


def test_a_rate_so_low_the_clock_would_lose_it_is_refused():
    for rate in ("2.2250738585e-313", "1e-300"):  # 1 / rate: inf, and arrivals past 1e300 s
        code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", f"workload.rate_rps={rate}", "--out", "/nonexistent/x"])
        assert code == 2 and one_line(err).startswith(f"ppsim: error: --set workload.rate_rps={rate}: ")


def test_a_control_character_in_a_set_value_keeps_the_error_on_one_line():
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", 'latency.profile="\r"', "--out", "/nonexistent/x"])
    assert code == 2 and one_line(err).startswith("ppsim: error: --set latency.profile=")


# ---------------------------------------------------------------- silently wrong

def test_a_points_result_does_not_depend_on_the_sweeps_other_rates(tmp_path):
    rows = {}
    for top in (2, 5):
        out = tmp_path / f"gp{top}"
        code, _, err = invoke(["goodput", DEFAULT, *SMALL, "--rates", f"1:{top}", "--tol", "1", "--out", str(out),
                               "--no-progress"])
        assert code == 0, err
        import pandas as pd

        df = pd.read_csv(out / "goodput_rates.csv")
        rows[top] = df.set_index("rate_rps")
    for rate in (1.0, 2.0):
        assert rows[2].loc[rate].equals(rows[5].loc[rate])


@pytest.mark.parametrize("override, needle", [
    ("slo.ttft_ms=nan", "ttft_ms"), ("horizon_s=inf", "horizon_s"), ("workload.rate=6", "unknown field 'rate'"),
    ("scheduler.chunk_size_tokens=100000000", "chunk_size_tokens"), ("slo.tpot_ms=inf", "tpot_ms"),
])
def test_numbers_and_keys_a_run_would_have_ignored_or_misread_are_refused(override, needle):
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", override, "--out", "/nonexistent/x"])
    assert code == 2 and needle in one_line(err) and f"--set {override}" in err


def test_truncation_and_clipping_are_said_on_stderr_and_in_the_summary(tmp_path):
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", "scheduler.context_length_tokens=600", "--out", str(out)])
    assert code == 0 and "ppsim: warning:" in err and "truncated" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_truncated_prompts"] > 0 and any("truncated" in w for w in summary["warnings"])


def test_bench_logs_with_negative_ttfts_or_extra_gaps_are_refused(tmp_path):
    base = {"request_rate": 1.0, "input_lens": [100, 200], "output_lens": [3, 2], "errors": ["", ""]}
    for bad, needle in (({"ttfts": [0.1, -0.2], "itls": [[0.01, 0.01], [0.01]]}, "ttfts"),
                        ({"ttfts": [0.1, 0.2], "itls": [[0.01, 0.01, 0.01], [0.01]]}, "itls")):
        log = tmp_path / "b.json"
        log.write_text(json.dumps({**base, **bad}))
        code, _, err = invoke(["validate", "--bench-log", str(log)])
        assert code == 2 and needle in one_line(err)


def test_a_plugin_calling_sys_exit_is_an_error_naming_it(tmp_path):
    plugin = tmp_path / "quitter.py"
    plugin.write_text("import sys\nsys.exit(0)\n")
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--plugin", str(plugin), "--out", str(tmp_path / "o")])
    assert code == 2 and "quitter.py" in one_line(err) and "sys.exit" in err
    assert not (tmp_path / "o").exists()


def test_an_empty_timeline_window_is_warned(tmp_path):
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--timeline", "--window", "5000:5001", "--out", str(out)])
    assert code == 0 and "--window 5000:5001: no iteration" in err
    assert any("--window" in w for w in json.loads((out / "summary.json").read_text())["warnings"])


def test_tol_inf_is_refused():
    code, _, err = invoke(["goodput", DEFAULT, "--tol", "inf"])
    assert code == 2 and "--tol" in one_line(err)


# ---------------------------------------------------------------- other

def test_report_reads_a_run_made_without_iterations(tmp_path):
    out = tmp_path / "o"
    assert invoke(["run", DEFAULT, *SMALL, "--no-iterations", "--out", str(out)])[0] == 0
    code, _, err = invoke(["report", str(out)])
    assert code == 0, err
    assert "--no-iterations" in (out / "report.md").read_text()


def test_a_gzip_jsonl_trace_is_read_as_jsonl(tmp_path):
    trace = tmp_path / "t.jsonl.gz"
    rows = "".join(json.dumps({"timestamp": i * 100, "input_length": 50 + i, "output_length": 5}) + "\n"
                   for i in range(8))
    trace.write_bytes(gzip.compress(rows.encode()))
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, "--trace", str(trace), "--out", str(out)])
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 8


def test_an_invalid_override_is_blamed_on_the_set_not_the_shipped_file():
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", "latency.overrides={s_mem=-3}", "--out", "/nonexistent/x"])
    assert code == 2 and one_line(err).startswith("ppsim: error: --set latency.overrides={s_mem=-3}")


def test_jobs_beyond_the_cores_are_capped_with_a_warning():
    from sim.cli.common import jobs

    n = len(os.sched_getaffinity(0))
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert jobs("1000") == n
    assert f"--jobs 1000 capped at this machine's {n} cores" in err.getvalue()


@pytest.mark.parametrize("out, needle", [("profiles/a100-pcie-40gb/qwen2.5-32b/tp1", "did not build"),
                                         (".", "project's root"),
                                         ("profiles/built/h100-sxm-80gb/llama-3.1-8b/tp1", "--force")])
def test_profile_build_never_overwrites_a_shipped_profile_or_the_project(out, needle, monkeypatch):
    monkeypatch.chdir(REPO)
    before = {p: p.read_bytes() for p in (REPO / out).glob("*") if p.is_file()}
    code, _, err = invoke(["profile", "build", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--tp", "1",
                           "--out", out])
    assert code == 2 and needle in one_line(err)
    assert {p: p.read_bytes() for p in (REPO / out).glob("*") if p.is_file()} == before
