"""Issue 43's remaining engine details: the host time per step modelled per engine version
(sim/engine/hosttime.py), vLLM's KV pool in blocks with V1's null block, vLLM 0.6.3's ignored
prompts, long-context chunked prefill and eager decode, SGLang's prefill graphs (their padding: tests/test_engines.py); each
checked by hand on a small case."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.fuzzing import invoke

REPO = Path(__file__).resolve().parents[1]
PROFILE = "profiles/built/a100-sxm-80gb/llama-3.1-8b/tp1"


def _iterations(tmp_path, engine: str, *sets: str):
    import pandas as pd

    out = tmp_path / "run"
    code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set", "parallel.pp=1",
                           "--set", f'latency.profile="{PROFILE}"', "--set", "latency.variance=false",
                           "--set", "workload.num_requests=40", "--engine", engine,
                           *[a for s in sets for a in ("--set", s)], "--out", str(out)])
    assert code == 0, err
    df = pd.read_csv(out / "iterations.csv")
    return df, df[df["mode"] != "idle"]


def _by_hand_ms(row) -> float:
    """vLLM V1's host time (hosttime.py): 0.5 ms a step, 20 us a request, 2 us a KV block
    (the prefill tokens' blocks, a decode's 1/16 of one)."""
    blocks = math.ceil(row["prefill_tokens"] / 16) + row["num_decode"] / 16
    return 0.5 + 0.020 * (row["num_prefill"] + row["num_decode"]) + 0.002 * blocks


def test_vllm_v1_host_time_is_the_versions_model_by_hand(tmp_path):
    _, busy = _iterations(tmp_path, "vllm-v1", 'scheduler.engine_version="0.10"')
    assert len(busy) > 20 and (busy["num_decode"] > 1).any()
    for _, row in busy.iterrows():
        assert row["host_ms"] == pytest.approx(_by_hand_ms(row), abs=1e-3), row.to_dict()


def test_vllm_v1_async_scheduling_hides_it_under_the_previous_step_down_to_its_floor(tmp_path):
    df, busy = _iterations(tmp_path, "vllm-v1", 'scheduler.engine_version="0.15"')
    prev_mode = df["mode"].shift(1, fill_value="idle")
    prev_gpu = df["stage0_busy_ms"].shift(1, fill_value=0.0)
    chained = busy[prev_mode[busy.index] != "idle"]
    fresh = busy[prev_mode[busy.index] == "idle"]
    assert len(chained) > 20 and len(fresh) >= 1
    for i, row in chained.iterrows():
        # what the previous GPU step does not cover, and never less than the launch gap (0.16 ms)
        assert row["host_ms"] == pytest.approx(max(0.16, _by_hand_ms(row) - prev_gpu[i]), abs=1e-3)
    for _, row in fresh.iterrows():  # after an idle turn nothing was hidden
        assert row["host_ms"] == pytest.approx(_by_hand_ms(row), abs=1e-3)


def test_engines_without_a_host_model_keep_the_profiles_host_cost(tmp_path):
    from sim.engine.hosttime import host_cost

    assert host_cost("vllm-v0", "0.6") is None and host_cost("fastpp", "fastpp") is None
    _, busy = _iterations(tmp_path, "vllm-v0", "scheduler.chunk_size_tokens=0")
    # the built profile: cpu_ms 2.0 + cpu_per_request_us 5 per request
    n = busy["num_prefill"] + busy["num_decode"]
    assert (busy["host_ms"] - (2.0 + 0.005 * n)).abs().max() < 1e-3


def test_sglang_host_time_is_the_versions_model_by_hand(tmp_path):
    """SGLang 0.5 (hosttime.py): 0.53 ms a step + 5 us a request, no per-block part; with the
    overlap off every step pays it all."""
    _, busy = _iterations(tmp_path, "sglang", "scheduler.overlap=false")
    assert len(busy) > 20 and (busy["num_decode"] > 1).any()
    for _, row in busy.iterrows():
        assert row["host_ms"] == pytest.approx(0.53 + 0.005 * (row["num_prefill"] + row["num_decode"]), abs=1e-3)


def test_sglang_overlap_scheduler_hides_it_all_under_the_previous_step(tmp_path):
    df, busy = _iterations(tmp_path, "sglang")  # overlap on (pp = 1)
    prev_mode = df["mode"].shift(1, fill_value="idle")
    prev_gpu = df["stage0_busy_ms"].shift(1, fill_value=0.0)
    chained = busy[prev_mode[busy.index] != "idle"]
    fresh = busy[prev_mode[busy.index] == "idle"]
    assert len(chained) > 20 and len(fresh) >= 1
    for i, row in chained.iterrows():  # no floor: exposed_ms 0
        by_hand = 0.53 + 0.005 * (row["num_prefill"] + row["num_decode"])
        assert row["host_ms"] == pytest.approx(max(0.0, by_hand - prev_gpu[i]), abs=1e-3)
    for _, row in fresh.iterrows():
        assert row["host_ms"] == pytest.approx(0.53 + 0.005 * (row["num_prefill"] + row["num_decode"]), abs=1e-3)


@pytest.mark.parametrize("engine, overlap_off", [("sglang", "scheduler.overlap=false"),
                                                 ("vllm-v1", 'scheduler.engine_version="0.10"')])
def test_host_time_profile_falls_back_to_the_profiles_host_cost(tmp_path, engine, overlap_off):
    _, busy = _iterations(tmp_path, engine, overlap_off, 'server.host_time="profile"')
    n = busy["num_prefill"] + busy["num_decode"]
    assert (busy["host_ms"] - (2.0 + 0.005 * n)).abs().max() < 1e-3


def test_a_constant_latency_model_charges_its_overhead_whatever_the_engine_models(tmp_path):
    import pandas as pd

    out = tmp_path / "run"
    code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set", "parallel.pp=1",
                           "--set", 'latency.kind="constant"', "--set", "latency.stage_ms=10",
                           "--set", "latency.overhead_ms=1.5", "--set", "scheduler.kv_tokens=20000",
                           "--set", "scheduler.overlap=false", "--set", "workload.num_requests=10",
                           "--engine", "sglang", "--out", str(out)])
    assert code == 0, err
    busy = pd.read_csv(out / "iterations.csv").query("mode != 'idle'")
    assert len(busy) > 5 and (busy["host_ms"] - 1.5).abs().max() < 1e-9


def test_a_bad_host_time_is_refused_in_one_line(tmp_path):
    from tests.test_hostile import one_line

    code, _, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--set",
                           'server.host_time="modeled"', "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and "[server] host_time must be one of: modelled, profile; got 'modeled'" in line
    assert not (tmp_path / "o").exists()


def test_vllm_pool_is_whole_blocks_with_v1s_null_block():
    from types import SimpleNamespace

    from sim.engine.schedulers.vllm_v0 import VllmV0Engine
    from sim.engine.schedulers.vllm_v1 import VllmV1Engine

    sc = SimpleNamespace(block_size_tokens=16)
    # 1000 tokens = 62 whole blocks; V1 gives block 0 to the null block (BlockPool.__init__)
    assert VllmV1Engine().pool_tokens(1000, sc) == 61 * 16
    assert VllmV0Engine().pool_tokens(1000, sc) == 62 * 16


def test_vllm_v1_preempts_when_blocks_run_out_not_tokens():
    from sim.engine.schedulers.vllm_v1 import VllmV1Scheduler
    from tests.test_engines import drive

    from tests.conftest import make_req

    # 4 blocks: two 20-token prompts hold 2 blocks each (the second 4/16 filled); an 8-token
    # prompt then finds 24 tokens free but no free block: it waits (head of line) until one is
    s = VllmV1Scheduler(1, 64, 256, 1024, prefix_cache=False)
    a, b, c = make_req(0, 20, output=3), make_req(1, 20, output=3), make_req(2, 8, output=1)
    mbs = drive(s, [a, b, c], 8)
    assert [r.rid for r, *_ in mbs[0].prefill] == [0, 1]  # counted in tokens, c (8 <= 24) would join
    first_c = next(k for k, mb in enumerate(mbs) if mb is not None and any(r is c for r, *_ in mb.prefill))
    assert first_c >= 3 and a.finish_s is not None


def test_vllm_v0_ignores_a_prompt_that_can_never_fit_by_hand():
    """vLLM 0.6.3 `_schedule_prefills` + `BlockSpaceManagerV2.can_allocate`: a pool of 100 blocks
    keeps a watermark of int(0.01 x 100) = 1 block, so a sequence of more than 99 blocks
    (> 1584 tokens) is NEVER: FINISHED_IGNORED, out of the queue, while the next one runs."""
    from sim.engine.schedulers.vllm_v0 import VllmV0Scheduler
    from tests.conftest import make_req
    from tests.test_engines import drive

    s = VllmV0Scheduler(1, 1600, 256, 2048)
    done = []
    s.on_finish = done.append
    a, b = make_req(0, 1585, output=5), make_req(1, 1584, output=3)  # 100 blocks; 99 blocks
    mbs = drive(s, [a, b], 6)
    assert a.state == "ignored" and a.finish_s == 0.0 and a.out_len == 0 and a.first_token_s is None
    assert [r.rid for r, *_ in mbs[0].prefill] == [1] and b.finished  # b, behind it, runs at once
    assert [r.rid for r in done] == [0, 1] and s.num_ignored == 1 and s.is_idle()


def test_vllm_v0_ignores_a_preempted_request_grown_past_the_pool():
    """A lone request outgrowing the pool preempts itself (recompute); re-queued as prompt +
    outputs, 1500 + 101 tokens need 101 blocks > 99: ignored with the 101 tokens it streamed."""
    from sim.engine.schedulers.vllm_v0 import VllmV0Scheduler
    from tests.conftest import make_req
    from tests.test_engines import drive

    s = VllmV0Scheduler(1, 1600, 256, 2048)
    d = make_req(3, 1500, output=300)
    drive(s, [d], 120)
    # prompt 1500 + 100 decode slots fill the 100 blocks; the 101st token finds no block
    assert d.state == "ignored" and d.num_retractions == 1 and d.out_len == 101 and d.fill_len == 1601
    assert s.kv_free == 1600 and s.num_active == 0 and s.is_idle()


def test_vllm_v0_run_with_never_fitting_prompts_completes_and_reports_them(tmp_path):
    """Before: the run stopped as stuck at the first prompt of over 1584 tokens."""
    import json

    import pandas as pd

    out = tmp_path / "run"
    code, stdout, err = invoke(["run", str(REPO / "experiments/configs/default.toml"), "--engine", "vllm-v0",
                                "--set", "parallel.pp=1", "--set", "scheduler.chunk_size_tokens=0", "--set",
                                "scheduler.kv_tokens=1600", "--set", "workload.num_requests=40", "--out", str(out)])
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    ignored = req[req["status"] == "ignored"]
    assert summary["status"] == "ok" and summary["num_ignored"] == len(ignored) > 0
    # every prompt was cut to 1594 tokens (the pool less 6): those over 1584 are ignored, the rest finish
    assert (ignored["prompt_tokens"].clip(upper=1594) > 1584).all() and (ignored["generated_tokens"] == 0).all()
    assert summary["num_finished"] + summary["num_ignored"] == 40 and summary["completed"] == summary["num_finished"]
    assert not ignored["meets_slo"].any() and "ignored by the engine" in stdout + err


def test_the_slo_guard_counts_an_ignored_request_against_every_objective():
    from sim.engine.pipeline import SLOGuard
    from tests.conftest import make_req

    r = make_req(0, 100, output=5)
    g = SLOGuard([r], ttft_s=1.0, tpot_s=0.1, e2e_s=2.0)
    r.state, r.finish_s = "ignored", 0.0  # (no first token: the finished-request path would fail on it)
    g.finished(r)
    assert g.bad_done == [1, 1, 1]
