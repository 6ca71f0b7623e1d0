"""The second round of hostile inputs (issue 40), one test per problem: engines and their knobs,
conversations, clusters, disaggregated pools, profiles, run folders, concurrent commands,
signals and full disks. tests/test_fuzz.py covers the same surfaces at random."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fuzzing import invoke
from tests.test_hostile import DEFAULT, REPO, SMALL, one_line  # noqa: F401  (the first round's helpers)


# ---------------------------------------------------------------- 2. a KV pool smaller than one request

@pytest.mark.parametrize("engine", ["fastpp", "sglang", "vllm-v1"])
@pytest.mark.parametrize("kv", [1, 6])
def test_a_kv_pool_that_holds_no_request_is_refused(tmp_path, engine, kv):
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--engine", engine, "--set", f"scheduler.kv_tokens={kv}",
                           "--out", str(tmp_path / "o")])
    line = one_line(err)
    need = 32 if engine == "vllm-v1" else 7  # vLLM V1: two 16-token blocks, one of them the null block
    assert code == 2 and f"kv_tokens = {kv}" in line and f"KV pool of {kv} token" in line and f">= {need}," in line
    assert not (tmp_path / "o").exists()


def test_the_smallest_pool_runs_and_says_the_pool_truncated_the_prompts(tmp_path):
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--engine", "sglang", "--set", "scheduler.kv_tokens=7",
                           "--out", str(out)])
    assert code == 0, err
    assert "longer than the KV pool (7 tokens" in err
    import pandas as pd

    df = pd.read_csv(out / "requests.csv")
    assert df["truncated_prompt"].all() and (df["status"] == "finished").all()  # to 7 - 1 - 5 = 1 token


def test_no_larger_mem_fraction_is_suggested_at_one(tmp_path):
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", "parallel.pp=1", "--set", "scheduler.mem_fraction=1.0",
                           "--out", str(tmp_path / "o")])
    assert code == 2 and "mem_fraction = 1.0" in one_line(err) and "larger mem_fraction" not in err


# ---------------------------------------------------------------- 8. a table missing rows

@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("table", ["requests", "iterations"])
@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_table_cut_at_a_row_boundary_is_not_read_as_the_whole_run(tmp_path, fmt, table, command):
    import pandas as pd

    run = tmp_path / "run"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--format", fmt, "--out", str(run)])
    assert code == 0, err
    path = run / f"{table}.{fmt}"
    df = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
    cut = df.iloc[: len(df) - 3]  # a valid table, three rows short
    cut.to_csv(path, index=False) if fmt == "csv" else cut.to_parquet(path, index=False)
    argv = ["report", str(run)] if command == "report" else ["compare", str(run), str(run), "--out",
                                                            str(tmp_path / "cmp")]
    code, _, err = invoke(argv)
    line = one_line(err)
    assert code == 2 and str(path) in line and "summary.json counts" in line and "cut" in line


# ---------------------------------------------------------------- 12. concurrent commands into one --out

def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sim.cli", *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline, "the first command never took its lock"
        time.sleep(0.05)


@pytest.mark.parametrize("second", [["run", DEFAULT, *SMALL, "--force"],
                                    ["goodput", DEFAULT, *SMALL, "--rates", "1:2", "--no-progress"]])
def test_a_second_command_into_a_busy_out_is_refused_and_nothing_is_lost(tmp_path, second):
    out = tmp_path / "same"
    first = _start(["run", DEFAULT, "--set", "workload.num_requests=3000", "--out", str(out)])
    _wait_for(tmp_path / ".same.lock", first)
    code, _, err = invoke([*second, "--out", str(out)])
    assert code == 2 and "another ppsim command" in one_line(err) and str(first.pid) in err
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 3000  # the first run, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same"]  # its lock gone with it
    # and once it has ended, the folder is free again
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--force", "--out", str(out)])
    assert code == 0, err


def test_a_lock_left_by_a_killed_command_does_not_block_the_next(tmp_path):
    out = tmp_path / "same"
    (tmp_path / ".same.lock").write_text("999999\n")  # (a SIGKILLed holder: the file stays, its flock went)
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--out", str(out)])
    assert code == 0, err
    assert not (tmp_path / ".same.lock").exists()


# ---------------------------------------------------------------- 13. SIGTERM and SIGHUP clean up

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_leave_no_spill_and_no_staging_folder(tmp_path, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "run", DEFAULT, "--set", "workload.num_requests=60000",
                             "--no-iterations", "--out", str(tmp_path / "o")], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(tmp.iterdir()):  # the run has spilled its first block of iterations
        assert proc.poll() is None and time.time() < deadline, "no spill folder appeared"
        time.sleep(0.1)
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name]
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 128 + sig and "Traceback" not in err, err
    assert f"terminated by {signal.Signals(sig).name}" in err
    assert list(tmp.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]


def test_what_a_killed_process_left_is_swept_by_the_next_command(tmp_path, monkeypatch):
    import tempfile

    from sim.core import fsio

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID no process has now
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    spill = tmp / f"ppsim-iterations-{dead.pid}-abc"
    spill.mkdir()
    (spill / "iteration").write_bytes(b"x" * 100)
    alive = tmp / f"ppsim-iterations-{os.getppid()}-abc"  # a live process's: kept
    alive.mkdir()
    partial = tmp_path / f".o.partial-{dead.pid}"
    partial.mkdir()
    (partial / "summary.json").write_text("{}")
    old = tmp_path / f".o.old-{dead.pid}"
    old.mkdir()
    monkeypatch.setattr(fsio, "_SWEPT", set())
    code, _, err = invoke(["run", DEFAULT, "--set", "workload.num_requests=2000", "--no-iterations",
                           "--out", str(tmp_path / "o")])
    assert code == 0, err
    assert not spill.exists() and alive.exists() and not partial.exists() and not old.exists()


def test_a_worker_removes_its_spills_when_stopped(tmp_path):
    code = ("import os, signal, tempfile, time\n"
            f"tempfile.tempdir = {str(tmp_path)!r}\n"
            "from sim.core.fsio import temp_folder\n"
            "from sim.studies.sweep import _worker_init\n"
            "_worker_init(os.getppid())\n"
            "t = temp_folder('ppsim-iterations-')\n"
            "print(t.name, flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    name = proc.stdout.readline().strip()
    assert Path(name).is_dir()
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not Path(name).exists()


# ---------------------------------------------------------------- 14. a full disk

@pytest.fixture
def small_disk(tmp_path):
    """A 400 KiB tmpfs (root on Linux only; else skipped: the simulated test below runs anywhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_full_disk_is_a_one_line_error_naming_the_path_and_the_free_space(small_disk):
    out = small_disk / "o"
    assert invoke(["run", DEFAULT, *SMALL, "--no-iterations", "--out", str(out)])[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = invoke(["run", DEFAULT, "--set", "workload.num_requests=3000", "--out", str(out), "--force"])
    line = one_line(err)
    assert code == 2 and f"{out}/" in line and "no space left" in line and "free of" in line, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier run, as it was
    assert sorted(p.name for p in small_disk.iterdir()) == ["o"]  # no staging folder left
    # a full $TMPDIR, where a run without iterations.csv spills them
    env = {**os.environ, "TMPDIR": str(small_disk)}
    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", DEFAULT, "--set", "workload.num_requests=20000",
                           "--no-iterations", "--out", str(small_disk.parent / "o2")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and f"{small_disk} ($TMPDIR" in line and "free of" in line, proc.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["o"]


def test_a_write_that_finds_no_room_is_named_not_an_internal_error(tmp_path, monkeypatch):
    """ENOSPC simulated (a file whose writes fail after a few kB, as on a full disk) where no tmpfs can be made."""
    import builtins
    import errno

    import sim.outputs.csvout as csvout

    class Full:
        def __init__(self, fh):
            self.fh, self.n = fh, 0

        def write(self, data):
            self.n += len(data)
            if self.n > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.fh.write(data)

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(csvout, "open", lambda *a, **k: Full(builtins.open(*a, **k)), raising=False)
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, "--set", "workload.num_requests=200", "--out", str(out)])
    line = one_line(err)
    assert code == 2 and f"{out}/requests.csv: cannot be written: no space left" in line and "free of" in line
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 4. one engine's knobs given to another

@pytest.mark.parametrize("engine, knob", [
    ("vllm-v0", "overlap=true"), ("vllm-v1", 'schedule_policy="lpm"'), ("vllm-v1", "max_prefill_tokens=4096"),
    ("vllm-v1", "ignore_eos=false"), ("sglang", "long_prefill_token_threshold=256"), ("sglang", "block_size_tokens=32"),
    ("fastpp", "block_size_tokens=32"), ("fastpp", "overlap=false"),
])
def test_a_knob_the_engine_does_not_read_is_refused(tmp_path, engine, knob):
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--engine", engine, "--set", f"scheduler.{knob}",
                           "--out", str(tmp_path / "o")])
    line = one_line(err)
    key = knob.split("=")[0]
    assert code == 2 and f"--set scheduler.{knob}" in line and f"{key} = " in line and f"engine {engine!r}" in line


def test_a_knob_at_its_default_and_a_runs_own_config_pass(tmp_path):
    out = tmp_path / "o"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--engine", "sglang", "--set", "scheduler.block_size_tokens=16",
                           "--out", str(out)])
    assert code == 0, err
    code, _, err = invoke(["run", str(out / "config.toml"), "--engine", "vllm-v1", "--out", str(tmp_path / "o2")])
    assert code == 0, err


def test_an_empty_engine_is_refused_not_replaced_by_the_configs(tmp_path):
    for cmd in (["run"], ["goodput"]):
        code, _, err = invoke([*cmd, DEFAULT, *SMALL, "--engine", "", "--out", str(tmp_path / "o")])
        assert code == 2 and "unknown scheduler engine ''" in one_line(err)


# ---------------------------------------------------------------- 5. heterogeneous disaggregated pools

DISAGG = str(REPO / "experiments" / "configs" / "disagg_70b.toml")


@pytest.mark.parametrize("profile, differ", [("profiles/built/h100-sxm-80gb/qwen2.5-72b/tp4", "differ in model"),
                                             ("profiles/built/a100-sxm-80gb/llama-3.1-70b/tp4", "differ in GPU")])
def test_pools_of_another_model_or_gpu_are_refused(tmp_path, profile, differ):
    code, _, err = invoke(["run", DISAGG, *SMALL, "--set", f'disaggregation.decode.profile="{profile}"',
                           "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and differ in line and profile in line and "llama-3.1-70b/tp4" in line


# ---------------------------------------------------------------- 6. cluster NICs and network files

def test_more_nics_per_gpu_than_the_network_describes_is_refused(tmp_path):
    sets = ["--set", 'cluster={nodes = 4, gpus_per_node = 8, network = "ib-ndr", nics_per_node = 1024}']
    code, _, err = invoke(["run", DISAGG, *SMALL, *sets, "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and "nics_per_node = 1024" in line and "allowed: 1 to 8" in line
    sets = ["--set", 'cluster={nodes = 1, gpus_per_node = 8, network = "ib-ndr", nics_per_node = 8}']
    code, _, err = invoke(["run", DISAGG, *SMALL, *sets, "--out", str(tmp_path / "o")])
    assert code == 0, err


@pytest.mark.parametrize("key, value", [("nic_achievable_gbps", 1e-300), ("nic_line_rate_gbit_s", 1e300),
                                        ("link_latency_us", 1e9), ("nics_per_node", 10**6),
                                        ("nic_achievable_gbps", 1.0)])
def test_network_file_numbers_are_bounded_above_and_below(key, value):
    import tomllib

    from sim.core.errors import DataError
    from sim.latency.cluster import NETWORKS_DIR, network_from_table

    table = tomllib.loads((NETWORKS_DIR / "ib-ndr.toml").read_text())
    network_from_table("ib-ndr", table, "ib-ndr.toml")  # (as shipped: fine)
    table["network"][key] = value
    with pytest.raises(DataError, match=f"ib-ndr.toml \\[network\\]: field '{key}'"):
        network_from_table("ib-ndr", table, "ib-ndr.toml")


# ---------------------------------------------------------------- 7. a profile's [model], HF configs, MHA

TINY = REPO / "tests" / "data" / "tiny-profile"


@pytest.mark.parametrize("old, new, needle", [
    ("num_kv_heads = 2", "num_kv_heads = 8", "'num_kv_heads' (8) must divide 'num_q_heads' (4)"),
    ("num_kv_heads = 2", "num_kv_heads = 3", "'num_kv_heads' (3) must divide 'num_q_heads' (4)"),
    ("dtype_bytes = 2", "dtype_bytes = 3", "'dtype_bytes' must be 1, 2 or 4, got 3"),
])
def test_a_profiles_model_table_is_checked_as_a_model_file_is(tmp_path, old, new, needle):
    import shutil

    prof = tmp_path / "prof"
    shutil.copytree(TINY, prof)
    text = (prof / "meta.toml").read_text()
    assert old in text
    (prof / "meta.toml").write_text(text.replace(old, new))
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", f'latency.profile="{prof}"', "--set", "parallel.pp=1",
                           "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and needle in line and str(prof / "meta.toml") in line


def _hf_config(tmp_path, **over) -> Path:
    cfg = {"model_type": "llama", "hidden_act": "silu", "num_hidden_layers": 32, "hidden_size": 4096,
           "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "max_position_embeddings": 4096, "torch_dtype": "float16", **over}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("over, needle", [
    ({"num_key_value_heads": 0}, "'num_key_value_heads' must be an integer >= 1, got 0"),
    ({"hidden_size": 1}, "'hidden_size' (1) must be a multiple of 'num_attention_heads' (32)"),
])
def test_hugging_face_configs_are_not_misread(tmp_path, over, needle):
    code, _, err = invoke(["profile", "build", "--model-config", str(_hf_config(tmp_path, **over)), "--gpu",
                           "a100-sxm-80gb", "--tp", "1", "--out", str(tmp_path / "p")])
    assert code == 2 and needle in one_line(err) and not (tmp_path / "p").exists()


def test_a_build_that_fails_its_physics_check_is_refused_not_written(tmp_path):
    path = _hf_config(tmp_path, num_key_value_heads=32)  # multi-head attention
    code, _, err = invoke(["profile", "build", "--model-config", str(path), "--gpu", "a100-sxm-80gb", "--tp", "1",
                           "--out", str(tmp_path / "p")])
    line = one_line(err)
    assert code == 2 and "fails the physics check" in line and "multi-head attention" in line
    assert not (tmp_path / "p").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


# ---------------------------------------------------------------- 11. a conversation workload's size

def test_a_conversation_workload_too_large_for_memory_is_refused_at_once(tmp_path):
    t0 = time.time()
    code, _, err = invoke(["run", DEFAULT, "--set", 'workload={name="chat-sessions", num_sessions=1000000, '
                                                    'turns_mean=1000}', "--out", str(tmp_path / "o")], timeout_s=20)
    line = one_line(err)
    assert code == 2 and "num_sessions = 1000000 x turns_mean = 1000" in line and "memory" in line
    assert time.time() - t0 < 20


# ---------------------------------------------------------------- 15. errors that blame the right thing

def test_a_field_the_config_merged_into_a_workload_is_blamed_on_the_config(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[latency]\nprofile = "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"\n'
                   '[workload]\nname = "chat-sessions"\nnum_requests = 400\n')
    code, _, err = invoke(["run", str(cfg), "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and line.startswith("ppsim: error: config [workload] num_requests = 400 (merged over ")


# ---------------------------------------------------------------- 9. validate: context and backends

def _bench_log(tmp_path, **over) -> Path:
    from tests.test_validate import sglang_result

    rec = {**sglang_result(), **over}
    log = tmp_path / "bench.jsonl"
    log.write_text(json.dumps(rec) + "\n")
    return log


def _fast_config(tmp_path, context: int = 16384) -> Path:
    from tests.test_validate import FAST

    cfg = tmp_path / "fast.toml"
    cfg.write_text(FAST.replace("[scheduler]\n", f"[scheduler]\ncontext_length_tokens = {context}\n"))
    return cfg


def test_validate_gives_the_log_a_context_that_holds_its_requests_and_says_so(tmp_path):
    log = _bench_log(tmp_path)  # prompts up to 450 tokens, which the real server served
    code, out, err = invoke(["validate", "--bench-log", str(log), "--config", str(_fast_config(tmp_path, 200))])
    assert code == 0, err
    assert "context_length_tokens raised from 200 to 459" in out + err
    assert "truncated" not in out + err


def test_validate_says_what_a_set_context_truncated(tmp_path):
    log = _bench_log(tmp_path)
    code, out, err = invoke(["validate", "--bench-log", str(log), "--config", str(_fast_config(tmp_path)),
                             "--set", "scheduler.context_length_tokens=200"])
    assert code == 0, err
    assert "prompt(s) truncated" in out + err


def test_validate_refuses_a_backend_pipesim_does_not_model(tmp_path):
    log = _bench_log(tmp_path, backend="tgi")
    code, _, err = invoke(["validate", "--bench-log", str(log), "--config", str(_fast_config(tmp_path))])
    line = one_line(err)
    assert code == 2 and "backend 'tgi' is not one PipeSim models" in line and "--engine" in line
    code, _, err = invoke(["validate", "--bench-log", str(log), "--config", str(_fast_config(tmp_path)),
                           "--engine", "sglang"])
    assert code == 0, err


def test_a_chunk_policy_on_vllm_v0_is_refused_naming_it(tmp_path):
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", "parallel.pp=1", "--engine", "vllm-v0", "--set",
                           "scheduler.chunk_size_tokens=0", "--set", 'scheduler.chunk_policy={name="predictive"}',
                           "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and "chunk_policy 'predictive' with engine 'vllm-v0'" in line and "KV pool" not in line


def test_a_missing_profile_is_named_not_a_meta_toml_inside_it(tmp_path):
    missing = tmp_path / "nope"
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", f'latency.profile="{missing}"', "--out",
                           str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and f"profile {missing}: no such folder" in line and "meta.toml (" not in line
    assert f"overriding {missing}/meta.toml" not in line


PLUGIN_ENGINE = '''
from dataclasses import replace
from sim.engine.schedulers import schedulers
from sim.engine.schedulers.fastpp import FastPPEngine


@schedulers.register("NAME")
class Mine(FastPPEngine):
    name = "NAME"

    def settings(self, sc, hw):
        return replace(super().settings(sc, hw), token_budget=BUDGET, engine="NAME")
'''


@pytest.mark.parametrize("budget, sets, needle", [
    (-5, ["--set", "scheduler.mem_fraction=0.9"], "token_budget must be an integer in [1,"),
    (512, [], "mem_fraction: engine 'mine512' has no default"),
])
def test_a_plugin_engines_settings_are_checked_not_a_crash(tmp_path, budget, sets, needle):
    name = f"mine{abs(budget)}"  # (one name per case: the registry outlives a case in this process)
    plugin = tmp_path / "mine.py"
    plugin.write_text(PLUGIN_ENGINE.replace("BUDGET", str(budget)).replace("NAME", name))
    code, _, err = invoke(["run", DEFAULT, *SMALL, *sets, "--plugin", str(plugin), "--engine", name,
                           "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and needle in line and "internal error" not in line
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--set", "scheduler.mem_fraction=0.9", "--plugin", str(plugin),
                           "--engine", name, "--out", str(tmp_path / "o2")])
    assert code == (2 if budget < 0 else 0), err


def test_a_plugin_that_cannot_subclass_a_compiled_engine_is_told_of_pipesim_pure(tmp_path):
    plugin = tmp_path / "sub.py"  # what mypyc raises when Python code subclasses a compiled class
    plugin.write_text("raise TypeError('interpreted classes cannot inherit from compiled')\n")
    code, _, err = invoke(["run", DEFAULT, *SMALL, "--plugin", str(plugin), "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and "PIPESIM_PURE=1" in line and str(plugin) in line


def test_gate_switched_to_a_conversation_workload_runs_and_says_what_it_left(tmp_path):
    code, _, err = invoke(["gate", DEFAULT, "--baseline", "engine:fastpp", "--candidate", "engine:sglang",
                           "--metric", "attainment", "--workload", "chat-sessions", "--seeds", "1", "--set",
                           'workload.rate_rps=4.0', "--no-progress", "--out", str(tmp_path / "g")])
    assert code in (0, 1), err
    assert "--workload chat-sessions: a conversation workload" in err and "num_requests" in err
