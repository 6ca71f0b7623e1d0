"""Lock-step timing, the golden 3-request / 2-stage scenario, and the M/D/1 sanity check."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from sim.engine.pipeline import Pipeline
from sim.engine.run import run
from sim.latency.base import BatchStats, StepTime
from sim.outputs.metrics import iterations_frame, requests_frame, summarize
from sim.policies.static import StaticChunk

from conftest import make_config, make_req, make_sched


class TokensLatency:
    """Stage s takes (s + 1) ms per 100 tokens, so stages differ and lock-step is visible."""

    def __init__(self, num_stages: int, overhead_ms: float = 1.0) -> None:
        self.num_stages = num_stages
        self.iteration_overhead_s = overhead_ms / 1e3

    def stage_time(self, st: BatchStats, stage: int) -> StepTime:
        return StepTime((stage + 1) * st.num_tokens / 100 / 1e3, 0.0, 0.0, 0.0)

    def stage_times(self, st: BatchStats):
        return tuple(self.stage_time(st, s).total_s for s in range(self.num_stages))


def simulate(reqs, pp=2, chunk=256, latency=None):
    sched = make_sched(pp=pp, chunk=chunk)
    env = simpy.Environment()
    latency = latency or TokensLatency(pp)
    pipe = Pipeline(env, sched, latency, StaticChunk(chunk), reqs)
    env.run(until=pipe.proc)
    return pipe


def test_lock_step_iteration_is_max_over_stages_of_inflight_microbatches():
    reqs = [make_req(0, 300, output=2, arrival=0.0), make_req(1, 50, output=2, arrival=0.0)]
    pipe = simulate(reqs, pp=2, chunk=256)
    it = pipe.iters
    # iteration 0: slot 0 runs 256 tokens of request 0 on stage 0 (2.56 ms) + 1 ms overhead
    # iteration 1: slot 1 continues request 0 (44 tokens) + request 1 (50) on stage 0 (0.94 ms),
    #              while stage 1 runs iteration 0's 256 tokens at 2 ms/100 tokens (5.12 ms)
    durations = np.round(np.subtract(it["end_s"], it["start_s"]) * 1e3, 6)
    assert durations[0] == pytest.approx(1 + 2.56)
    assert durations[1] == pytest.approx(1 + 5.12)
    busy = [tuple(round(b * 1e3, 6) for b in row) for row in pipe.stage_busy[:3]]
    assert busy[0] == (2.56, 0.0)
    assert busy[1] == (0.94, 5.12)
    assert busy[2][1] == pytest.approx(1.88)  # iteration 1's micro-batch on stage 1
    # start of each iteration is the end of the previous one: time never goes back
    assert all(a == b for a, b in zip(it["end_s"][:-1], it["start_s"][1:]))


def test_golden_three_requests_two_stages_event_order():
    reqs = [
        make_req(0, 200, output=3, arrival=0.0),
        make_req(1, 100, output=2, arrival=0.0005),
        make_req(2, 300, output=2, arrival=0.0),
    ]
    reqs.sort(key=lambda r: r.arrival_s)
    pipe = simulate(reqs, pp=2, chunk=256)
    it = pipe.iters
    log = list(zip(it["iteration"], it["slot"], it["mode"], it["num_tokens"], it["prefill_tokens"], it["num_decode"]))
    assert log == [
        (0, 0, "extend", 256, 256, 0),  # req 0 whole (200) + the first 56 of req 2 (cut)
        (1, 1, "extend", 256, 256, 0),  # req 2's chunk moves to slot 1 (244, done); req 1 cut at 12
        (2, 0, "mixed", 89, 88, 1),     # req 1's last 88 tokens move to slot 0, with req 0 decoding
        (3, 1, "decode", 1, 0, 1),      # req 2 decodes in slot 1
        (4, 0, "decode", 2, 0, 2),      # reqs 1 and 0 decode in slot 0
        (5, 1, "idle", 0, 0, 0),        # slot 1 is empty (req 2 finished) while slot 0 drains
    ]
    end = it["end_s"]
    assert end[:3] == pytest.approx([0.00356, 0.00968, 0.0158])  # 1 ms overhead + slowest stage
    firsts = {r.rid: r.first_token_s for r in reqs}
    ends = {r.rid: r.finish_s for r in reqs}
    assert firsts == {0: end[1], 2: end[2], 1: end[3]}
    assert ends == {2: end[4], 1: end[5], 0: end[5]}
    assert {r.rid: r.slot for r in reqs} == {0: 0, 1: 0, 2: 1}
    assert all(r.finished for r in reqs)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mean_wait_matches_md1(rho):
    """One stage, one request at a time, constant service D: an M/D/1 queue."""
    d_ms = 10.0
    lam = rho / (d_ms / 1e3)
    cfg = make_config(
        parallel={"pp": 1, "tp": 1},
        scheduler={"chunk_size_tokens": 256, "kv_tokens": 50_000, "max_running_requests": 1},
        latency={"kind": "constant", "stage_ms": d_ms},
        workload={"kind": "poisson", "rate_rps": lam, "num_requests": 40_000,
                  "lengths": {"source": "pairs", "prompt_tokens": [16], "output_tokens": [1]}},
    )
    res = run(cfg)
    df = requests_frame(res)
    assert (df["status"] == "finished").all()
    wait = (df["admit_s"] - df["arrival_s"]).to_numpy()
    theory = lam * (d_ms / 1e3) ** 2 / (2 * (1 - rho))
    se = wait.std() / np.sqrt(len(wait)) * 8  # batch-means-ish allowance for autocorrelation
    assert abs(wait.mean() - theory) < max(se, 0.05 * theory), (wait.mean(), theory)
    # TTFT = wait + one service time
    assert np.allclose(df["ttft_ms"].to_numpy(), wait * 1e3 + d_ms)


def test_idle_system_jumps_to_next_arrival_without_events():
    cfg = make_config(workload={"kind": "poisson", "rate_rps": 0.01, "num_requests": 3,
                                "lengths": {"source": "pairs", "prompt_tokens": [10], "output_tokens": [2]}})
    res = run(cfg)
    df = iterations_frame(res)
    # each request: 2 tokens at pp=2 -> first token after 2 iterations, second after 2 more
    assert len(df) == 3 * 4
    summary = summarize(res)
    assert summary["num_finished"] == 3


def test_tp_runs_one_batch_at_a_time():
    cfg = make_config(parallel={"pp": 1, "tp": 1})
    res = run(cfg)
    df = requests_frame(res)
    assert (df["status"] == "finished").all()
    it = iterations_frame(res)
    assert set(it["slot"]) == {0}
