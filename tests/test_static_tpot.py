"""How a static chunk's time enters the decode cycle (issue 46, point 1; experiments/notes/static_tpot.md).

A decode request emits one token per P lock-step iterations, so its TPOT is P x (host + the mean
iteration over its life): P [h + (1 - f) d + f c], f the share of its iterations holding a prefill
chunk in some stage. A run of n chunks entering consecutive slots holds n + P - 1 iterations, and every
decode slot pays (n + P - 1)(c - d) for it, whatever its slot. The host time h is paid once per
iteration with or without a chunk. Hand-calculated on a two-cost latency model (decode-only stage d,
any stage with prefill tokens c, host h per iteration), P = 4, chunk 64.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from sim.engine.pipeline import Pipeline
from sim.latency.base import StepTime
from sim.policies.static import StaticChunk

from conftest import make_req, make_sched

P, CHUNK, D_MS, C_MS = 4, 64, 10.0, 40.0
OUT = 21  # 20 inter-token gaps = 80 iterations of a decode request's life


class TwoCostLatency:
    """Every stage: c if the micro-batch holds prefill tokens, d if it holds only decodes, 0 if empty."""

    def __init__(self, h_ms: float) -> None:
        self.num_stages = P
        self.iteration_overhead_s = h_ms / 1e3

    def stage_time(self, st, stage: int) -> StepTime:
        busy = C_MS if st.prefill_tokens > 0 else (D_MS if st.num_decode > 0 else 0.0)
        return StepTime(busy / 1e3, 0.0, 0.0, 0.0)

    def stage_times(self, st):
        return (self.stage_time(st, 0).total_s,) * P


def simulate(reqs, h_ms):
    env = simpy.Environment()
    pipe = Pipeline(env, make_sched(pp=P, chunk=CHUNK), TwoCostLatency(h_ms), StaticChunk(CHUNK), reqs)
    env.run(until=pipe.proc)
    assert all(r.finished for r in reqs)
    return pipe


@pytest.mark.parametrize("prompt,n", [(64, 1), (192, 3)])
def test_a_run_of_n_chunks_adds_n_plus_p_minus_1_chunk_iterations_to_a_decode(prompt, n):
    # A (8-token prompt) prefills in iterations 0-3 (4 x 41 ms), first token at 164 ms, then decodes
    # in slot 0 at 11 ms an iteration. B arrives at 210 ms (during iteration 8, slot 0) and enters
    # slots 1.. from iteration 9 with no decode beside it: n chunks of 64 in iterations 9..9+n-1.
    a, b = make_req(0, 8, output=OUT, arrival=0.0), make_req(1, prompt, output=1, arrival=0.210)
    pipe = simulate([a, b], h_ms=1.0)
    it = pipe.iters
    assert [m for m in it["mode"][9:9 + n]] == ["extend"] * n
    dur = np.round(np.subtract(it["end_s"], it["start_s"]) * 1e3, 9)
    held = [k for k in range(4, 84) if dur[k] == pytest.approx(41.0)]
    assert held == list(range(9, 9 + n + P - 1))  # n + P - 1 iterations of h + c
    # A's 80 iterations: (80 - (n + 3)) x 11 + (n + 3) x 41 ms over 20 tokens
    assert a.first_token_s * 1e3 == pytest.approx(164.0)
    assert (a.finish_s - a.first_token_s) / 20 * 1e3 == pytest.approx(44.0 + (n + P - 1) * 30.0 / 20)
    # B's first token when its last chunk leaves stage 3: iteration 9 + n - 1 + 3, from 219 ms at 41 ms each
    assert (b.first_token_s - b.arrival_s) * 1e3 == pytest.approx(219.0 + (n + P - 1) * 41.0 - 210.0)


def test_a_chunk_beside_a_decode_loses_one_token_of_budget_and_costs_one_more_iteration():
    # B arrives during iteration 7 (slot 3) and enters slot 0 beside A's decode: 63 + 64 + 64 + 1 tokens,
    # 4 chunk micro-batches, 7 iterations of h + c for A: 44 + 7 x 30 / 20 = 54.5 ms
    a, b = make_req(0, 8, output=OUT, arrival=0.0), make_req(1, 192, output=1, arrival=0.200)
    pipe = simulate([a, b], h_ms=1.0)
    assert list(pipe.iters["prefill_tokens"][8:12]) == [63, 64, 64, 1]
    assert (a.finish_s - a.first_token_s) / 20 * 1e3 == pytest.approx(54.5)


@pytest.mark.parametrize("h_ms", [1.0, 3.0])
def test_p90_tpot_is_p_times_host_plus_the_lifes_mean_iteration(h_ms):
    """Four decoders, one per slot, and one 189-token prompt cut beside their decodes (63 tokens each:
    a decode takes one token of the budget) into 3 chunks: 6 chunk iterations for every decoder. The
    decoders also see the later ones' prefills (A0 sees A1-A3's in iterations 4-6, A1 two of them, ...).
    TPOT_j = P [h + (1 - f_j) d + f_j c], f_j = k_j / 80 with k = 9, 8, 7, 6; the chunks' share of it,
    P f_j (c - d), does not depend on h."""
    pre = h_ms + C_MS
    # A_j arrives before iteration j starts (iterations 0-6 hold prefills: h + c each)
    arrivals = [0.0, 0.001, pre * 1 / 1e3 + 0.001, pre * 2 / 1e3 + 0.001]
    decoders = [make_req(j, 8, output=OUT, arrival=t) for j, t in enumerate(arrivals)]
    # B arrives in the middle of iteration 8 (slot 0): iterations 0-6 cost h + c, iteration 7 h + d
    b_arrival = (7 * pre + 1.5 * (h_ms + D_MS)) / 1e3
    b = make_req(4, 3 * (CHUNK - 1), output=1, arrival=b_arrival)
    pipe = simulate(decoders + [b], h_ms)
    assert list(pipe.iters["slot"][9:12]) == [1, 2, 3]
    assert list(pipe.iters["prefill_tokens"][9:12]) == [63, 63, 63]
    k = np.array([9, 8, 7, 6])
    f = k / 80
    expect = P * (h_ms + (1 - f) * D_MS + f * C_MS)
    got = np.array([(r.finish_s - r.first_token_s) / (OUT - 1) * 1e3 for r in decoders])
    assert got == pytest.approx(expect)
    assert got - P * (h_ms + D_MS) == pytest.approx(P * f * (C_MS - D_MS))  # 1.5 ms per chunk iteration
    # numpy's default P90 of [53 + 4(h-1), +1.5, +3, +4.5]: 2.7 of the way = third + 0.7 x 1.5
    assert np.percentile(got, 90) == pytest.approx(4 * (h_ms + D_MS) + 1.5 * 6 + 1.5 * (2 + 0.7))
