"""Sweeps that survive faults: cut or corrupt cache lines, shared cache folders, SIGKILL and
restart, and the same results from local processes and Ray."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from sim.studies.sweep import Runner, point_id

from conftest import REPO


def fake_evaluate(table):
    """A deterministic stand-in for a run, with a long summary (lines larger than a pipe buffer)."""
    r = table["workload"]["rate_rps"]
    return {"status": "ok", "rate": r, "p90_ttft_ms": r * 123.456789, "pad": "x" * 9000}


def tables(n):
    return [{"workload": {"rate_rps": float(r)}} for r in range(1, n + 1)]


class Counting:
    def __init__(self):
        self.calls = []

    def __call__(self, table):
        self.calls.append(table["workload"]["rate_rps"])
        return fake_evaluate(table)


def test_cut_last_line_is_recomputed_and_the_next_append_starts_a_fresh_line(tmp_path):
    cache = tmp_path / "c.jsonl"
    first = Runner(cache, progress=False, evaluate_fn=fake_evaluate).run(tables(4))
    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) - 50])  # killed while writing point 4
    ev = Counting()
    runner = Runner(cache, progress=False, evaluate_fn=ev)
    assert runner.run(tables(4)) == first
    assert ev.calls == [4.0]
    # the cut line stays, alone on its line; point 4 is whole on the next one
    lines = cache.read_bytes().split(b"\n")
    assert len(lines) == 6 and lines[-1] == b""
    assert json.loads(lines[4])["summary"]["rate"] == 4.0
    ev2 = Counting()
    again = Runner(cache, progress=False, evaluate_fn=ev2)
    assert again.run(tables(4)) == first and ev2.calls == [] and again.num_bad_lines == 1


@pytest.mark.parametrize("corrupt", [
    lambda rec: rec["summary"].update(p90_ttft_ms=1.0),      # a changed number: valid JSON
    lambda rec: rec["table"]["workload"].update(rate_rps=9.0),  # the table no longer matches its id
    lambda rec: rec.pop("summary"),                           # a missing field
])
def test_corrupt_line_is_detected_and_recomputed(tmp_path, corrupt):
    cache = tmp_path / "c.jsonl"
    first = Runner(cache, progress=False, evaluate_fn=fake_evaluate).run(tables(3))
    lines = cache.read_text().splitlines()
    rec = json.loads(lines[1])
    corrupt(rec)
    lines[1] = json.dumps(rec, sort_keys=True)
    cache.write_text("\n".join(lines) + "\n")
    ev = Counting()
    runner = Runner(cache, progress=False, evaluate_fn=ev)
    assert runner.run(tables(3)) == first
    assert ev.calls == [2.0] and runner.num_bad_lines == 1


def test_garbage_bytes_and_blank_lines_are_skipped(tmp_path):
    cache = tmp_path / "c.jsonl"
    cache.write_bytes(b"\x00\xff garbage\n\n{\"id\": 3}\n[1, 2]\n")
    ev = Counting()
    out = Runner(cache, progress=False, evaluate_fn=ev).run(tables(2))
    assert ev.calls == [1.0, 2.0] and [o["rate"] for o in out] == [1.0, 2.0]


def test_lines_without_their_inputs_digest_are_run_again(tmp_path):
    # Lines written before the key covered the inputs' contents cannot say which profile or
    # trace they read: they are not served (the point runs again and is stored with its inputs).
    cache = tmp_path / "c.jsonl"
    t = tables(1)[0]
    cache.write_text(json.dumps({"id": point_id(t), "table": t, "summary": {"status": "ok", "rate": -1.0}}) + "\n")
    ev = Counting()
    out = Runner(cache, progress=False, evaluate_fn=ev).run([t])
    assert ev.calls == [1.0] and out[0]["rate"] == 1.0
    ev2 = Counting()
    assert Runner(cache, progress=False, evaluate_fn=ev2).run([t]) == out and ev2.calls == []


def test_an_input_edited_in_place_is_simulated_again(tmp_path):
    # The same config table, a workload file edited at the same path: a new point.
    wl = tmp_path / "mine.toml"
    wl.write_text('kind = "synthetic-uniform"\nnum_requests = 5\nrate_rps = 1.0\ninput_range = [10, 20]\n'
                  'output_range = [2, 3]\n')
    t = {**tables(1)[0], "workload": {"name": str(wl), "rate_rps": 1.0}}
    cache = tmp_path / "c.jsonl"
    ev = Counting()
    Runner(cache, progress=False, evaluate_fn=ev).run([t])
    Runner(cache, progress=False, evaluate_fn=ev).run([t])
    assert len(ev.calls) == 1  # unchanged: served from the cache
    wl.write_text(wl.read_text().replace("[10, 20]", "[10, 40]"))
    Runner(cache, progress=False, evaluate_fn=ev).run([t])
    assert len(ev.calls) == 2


def _sweep_into(cache, offset, n, barrier):
    barrier.wait()
    Runner(cache, progress=False, evaluate_fn=fake_evaluate).run(
        [{"workload": {"rate_rps": float(r)}, "who": offset} for r in range(n)])


def test_two_sweeps_sharing_a_cache_do_not_corrupt_it(tmp_path):
    cache = tmp_path / "shared.jsonl"
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_sweep_into, args=(cache, k, 150, barrier)) for k in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = cache.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 301
    runner = Runner(cache, progress=False, evaluate_fn=fake_evaluate)
    assert runner.num_bad_lines == 0 and len(runner.cache) == 300


def test_a_point_finished_by_another_sweep_is_not_run_again(tmp_path):
    cache = tmp_path / "c.jsonl"
    ev = Counting()
    mine = Runner(cache, progress=False, evaluate_fn=ev)  # opened before the other sweep wrote
    Runner(cache, progress=False, evaluate_fn=fake_evaluate).run(tables(2))
    mine.run(tables(3))
    assert ev.calls == [3.0]


GOODPUT_CONFIG = """
seed = 1
[parallel]
pp = 2
[scheduler]
chunk_size_tokens = 256
kv_tokens = 20000
[latency]
kind = "constant"
stage_ms = 10.0
[slo]
ttft_ms = 300.0
tpot_ms = 40.0
[workload]
kind = "synthetic-uniform"
rate_rps = 1.0
num_requests = 150
input_range = [10, 600]
output_range = [2, 60]
"""


def _goodput(cfg, out, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "sim.cli", "goodput", str(cfg), "--rates", "1:12", "--tol", "0.05",
                             "--jobs", "1", "--no-progress", "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.mark.slow
def test_sigkill_mid_sweep_and_restart_gives_byte_identical_results(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(GOODPUT_CONFIG)
    ref = _goodput(cfg, tmp_path / "ref")
    ref_out, ref_err = ref.communicate(timeout=600)
    assert ref.returncode == 0, ref_err
    ref_lines = (tmp_path / "ref" / "cache.jsonl").read_text().splitlines()
    assert len(ref_lines) > 8
    out = tmp_path / "killed"
    proc = _goodput(cfg, out)
    deadline = time.time() + 300
    while time.time() < deadline:
        cache = out / "cache.jsonl"
        if cache.is_file() and cache.read_text().count("\n") >= len(ref_lines) // 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    done_before = (out / "cache.jsonl").read_text().count("\n")
    assert 0 < done_before < len(ref_lines)
    assert not (out / "goodput_rates.csv").exists()
    again = _goodput(cfg, out)
    again_out, again_err = again.communicate(timeout=600)
    assert again.returncode == 0, again_err
    assert again_out == ref_out
    assert (out / "goodput_rates.csv").read_bytes() == (tmp_path / "ref" / "goodput_rates.csv").read_bytes()
    # the completed points were reused: the cache holds each point once
    ids = [json.loads(x)["id"] for x in (out / "cache.jsonl").read_text().splitlines() if x.strip()]
    assert len(ids) == len(set(ids)) == len(ref_lines)


def small_table(rate, seed):
    return {"seed": seed, "parallel": {"pp": 2, "tp": 1}, "scheduler": {"chunk_size_tokens": 256, "kv_tokens": 50_000},
            "latency": {"kind": "profile", "profile": str(REPO / "tests/data/tiny-profile"), "noise_cv": 0.2},
            "workload": {"kind": "synthetic-uniform", "rate_rps": rate, "num_requests": 30,
                         "input_range": [10, 600], "output_range": [2, 30]}}


@pytest.mark.slow
def test_local_processes_and_ray_give_identical_results_for_the_same_seeds(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install '.[ray]')")
    # noisy latency: every point draws from its own seeded streams, wherever it runs
    points = [small_table(r, s) for s in (1, 2, 3) for r in (2.0, 20.0)]
    local = Runner(tmp_path / "local.jsonl", jobs=2, progress=False).run(points)
    try:
        remote = Runner(tmp_path / "ray.jsonl", jobs=2, executor="ray", progress=False).run(points)
    finally:
        ray.shutdown()
    assert remote == local
    assert len({json.dumps(x, sort_keys=True) for x in local}) == len(points)  # the seeds matter

    def lines(name):
        return sorted((tmp_path / name).read_text().splitlines())

    assert lines("local.jsonl") == lines("ray.jsonl")
