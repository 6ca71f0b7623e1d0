"""The ground truth's variance and structure (fidelity issue): jitter and stall statistics,
common random numbers across schemes, decode waves, per-request CPU, the TP logits gather."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from sim.core.config import config_from_table
from sim.engine.run import run
from sim.latency import variance as variance_mod
from sim.latency.analysis import with_overrides
from sim.latency.base import BatchStats
from sim.latency.profiled import Profile, ProfiledLatencyModel
from sim.latency.variance import BLOCK, IterationNoise, VarianceParams, drift_multipliers, sample_factors
from sim.core.schemes import scheme_table

from conftest import REPO

P32 = REPO / "profiles" / "a100-pcie-40gb" / "qwen2.5-32b"


# -- jitter and stalls: the statistics match the parameters ---------------------------------------------------

def test_jitter_has_unit_mean_and_the_stated_cv():
    draws = sample_factors(VarianceParams(jitter_cv=0.05), num_stages=4, seed=7, n=40_000)
    f = draws[:, :4]
    assert f.mean() == pytest.approx(1.0, abs=0.002)
    assert f.std() / f.mean() == pytest.approx(0.05, rel=0.03)
    # lognormal: right-skewed, never negative
    assert f.min() > 0 and np.percentile(f, 99) - 1 > 1 - np.percentile(f, 1)
    # stages are independent streams
    assert abs(np.corrcoef(f[:, 0], f[:, 1])[0, 1]) < 0.02


def test_stalls_have_the_stated_probability_and_exponential_mean():
    p = VarianceParams(jitter_cv=0.0, stall_prob=0.05, stall_mean_ms=12.0)
    stall = sample_factors(p, num_stages=2, seed=3, n=100_000)[:, 2]
    hit = stall[stall > 0]
    assert len(hit) / len(stall) == pytest.approx(0.05, rel=0.05)
    assert hit.mean() == pytest.approx(12.0, rel=0.05)
    # the tail of an exponential: P(stall > 3 means | stall) = e^-3
    assert (hit > 36.0).mean() == pytest.approx(math.exp(-3), rel=0.2)
    assert p.mean_stall_ms() == pytest.approx(0.6)


def test_slowdowns_stretch_every_stage_by_one_factor_with_the_stated_statistics():
    """A slow iteration multiplies every stage by the same 1 + Exp(slow_mean), with probability slow_prob;
    its draws come from a stream of their own, so the jitter and stall draws are unchanged by it."""
    base = VarianceParams(jitter_cv=0.04, stall_prob=0.05, stall_mean_ms=8.0)
    slow = VarianceParams(jitter_cv=0.04, stall_prob=0.05, stall_mean_ms=8.0, slow_prob=0.1, slow_mean=0.3)
    assert slow.enabled and VarianceParams(slow_prob=0.1, slow_mean=0.3).enabled
    a = sample_factors(base, num_stages=3, seed=5, n=100_000)
    b = sample_factors(slow, num_stages=3, seed=5, n=100_000)
    assert np.array_equal(a[:, 3], b[:, 3])  # stalls untouched
    ratio = b[:, :3] / a[:, :3]
    # one factor per iteration, the same on every stage
    assert np.allclose(ratio[:, 0], ratio[:, 1]) and np.allclose(ratio[:, 0], ratio[:, 2])
    k = ratio[:, 0]
    hit = k[~np.isclose(k, 1.0)]
    assert len(hit) / len(k) == pytest.approx(0.1, rel=0.05)
    assert (hit - 1).mean() == pytest.approx(0.3, rel=0.05)
    # exponential tail: P(stretch > 3 means | slow) = e^-3
    assert ((hit - 1) > 0.9).mean() == pytest.approx(math.exp(-3), rel=0.2)


def test_drift_recursion_hand_calculation():
    """Three steps of the AR(1) log state by hand: sigma 0.1, correlation time 2 iterations
    (rho = e^-0.5 = 0.606531, innovation 0.1 * sqrt(1 - 0.367879) = 0.079506), draws z = (1, -2, 0.5):
    x0 = 0.1; x1 = 0.060653 - 0.159012 = -0.098359; x2 = 0.606531 * -0.098359 + 0.079506 * 0.5 =
    -0.059657 + 0.039753 = -0.019904; g = exp(x - sigma^2 / 2) = exp(x - 0.005)."""
    g, last = drift_multipliers(0.1, 2.0, np.array([1.0, -2.0, 0.5]))
    x = [0.1, -0.098359, -0.019904]
    assert g == pytest.approx([math.exp(v - 0.005) for v in x], abs=2e-6)
    assert last == pytest.approx(x[-1], abs=2e-6)
    # a block continues from the previous block's last state, exactly as one long recursion
    g2, _ = drift_multipliers(0.1, 2.0, np.array([0.5]), x_prev=-0.098359)
    assert g2[0] == pytest.approx(g[2], abs=2e-6)


def test_drift_is_stationary_with_unit_mean_the_stated_spread_and_persistence():
    """E[g] = 1, Var[log g] = sigma^2, lag-n autocorrelation of log g = rho^n = e^(-n / drift_iters);
    the same multiplier on every stage; its own stream (jitter and stall draws unchanged)."""
    base = VarianceParams(jitter_cv=0.02, stall_prob=0.05, stall_mean_ms=8.0)
    drift = VarianceParams(jitter_cv=0.02, stall_prob=0.05, stall_mean_ms=8.0, drift_sigma=0.1, drift_iters=20.0)
    assert drift.enabled and VarianceParams(drift_sigma=0.1, drift_iters=20.0).enabled
    assert not VarianceParams(drift_sigma=0.1).enabled  # no correlation time: off
    n = 3 * BLOCK + 100   # across block boundaries
    a = sample_factors(base, num_stages=3, seed=5, n=n)
    b = sample_factors(drift, num_stages=3, seed=5, n=n)
    assert np.array_equal(a[:, 3], b[:, 3])
    g = b[:, :3] / a[:, :3]
    assert np.allclose(g[:, 0], g[:, 1]) and np.allclose(g[:, 0], g[:, 2])
    x = np.log(g[:, 0])
    # about n / (2 * 20) independent stretches: loose bounds (standard errors about 3% of sigma)
    assert g[:, 0].mean() == pytest.approx(1.0, abs=0.01)
    assert x.std() == pytest.approx(0.1, rel=0.12)
    for lag in (1, 20):
        r = np.corrcoef(x[:-lag], x[lag:])[0, 1]
        assert r == pytest.approx(math.exp(-lag / 20.0), abs=0.06)


def test_drift_override_is_range_checked_and_reaches_the_model():
    from sim.core.errors import ConfigError

    prof = Profile.load(P32 / "tp1")
    for key, bad in (("drift_sigma", 0.2), ("drift_iters", 6000.0), ("drift_sigma", -0.01)):
        with pytest.raises(ConfigError, match=key):
            with_overrides(prof, **{key: bad})
    m = ProfiledLatencyModel(with_overrides(prof, drift_sigma=0.05, drift_iters=800.0), 4, seed=1)
    assert (m.variance.drift_sigma, m.variance.drift_iters) == (0.05, 800.0) and m.variance.drift_on


def test_zero_variance_is_exact():
    assert not VarianceParams().enabled
    f, stall = IterationNoise(VarianceParams(), 3, seed=1).next()
    assert list(f) == [1.0, 1.0, 1.0] and stall == 0.0  # (the factors: the block's row, a list)


def test_draws_are_a_function_of_seed_and_position_only():
    p = VarianceParams(jitter_cv=0.03, stall_prob=0.1, stall_mean_ms=5.0)
    a = sample_factors(p, 4, seed=11, n=5000)
    b = sample_factors(p, 4, seed=11, n=5000)
    c = sample_factors(p, 4, seed=12, n=5000)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # a startup session never shifts the run's draws: separate streams
    s = sample_factors(p, 4, seed=11, n=50, prefix="startup")
    assert not np.array_equal(s, a[:50])


# -- common random numbers across schemes ---------------------------------------------------------------------

def _record_draws(monkeypatch):
    seqs: dict[int, list] = {}
    orig = IterationNoise.next

    def spy(self):
        out = orig(self)
        seqs.setdefault(id(self), []).append(out)
        return out

    monkeypatch.setattr(variance_mod.IterationNoise, "next", spy)
    return seqs


def test_two_schemes_with_one_seed_see_identical_noise_per_position(monkeypatch):
    seqs = _record_draws(monkeypatch)
    wl = {"name": "azure-conv-synth", "num_requests": 60, "rate_rps": 4.0}
    runs = {}
    for scheme in ("PP_512", "DCP_pred"):  # DCP_pred also profiles at start-up (its own streams)
        seqs.clear()
        res = run(config_from_table(scheme_table(scheme, "qwen2.5-32b", wl, seed=5)))
        runs[scheme] = (res, dict(seqs))
    (ra, da), (rb, db) = runs["PP_512"], runs["DCP_pred"]
    run_a = max(da.values(), key=len)  # the pipeline's stream (the longest)
    run_b = max(db.values(), key=len)
    assert len(run_a) == len(ra.iterations["iteration"])  # one draw per iteration
    assert len(run_b) == len(rb.iterations["iteration"])
    n = min(len(run_a), len(run_b))
    assert n > 100 and run_a[:n] == run_b[:n]
    # the start-up session of DCP_pred drew from other streams
    assert len(db) == 2 and len(da) == 1


def test_variance_off_gives_the_deterministic_truth_and_exact_host_times():
    wl = {"name": "azure-conv-synth", "num_requests": 40, "rate_rps": 4.0}
    t = scheme_table("PP_512", "qwen2.5-32b", wl, seed=1)
    t.setdefault("latency", {})["variance"] = False
    res = run(config_from_table(t))
    m = ProfiledLatencyModel(Profile.load(P32 / "tp1"), 4, variance=False)
    it = res.iterations
    for mode, npf, ndec, host in zip(it["mode"], it["num_prefill"], it["num_decode"], res.host_s):
        want = m.broadcast_s if mode == "idle" else m.cpu_s + m.cpu_per_req_s * (npf + ndec) + m.broadcast_s
        assert host == pytest.approx(want, rel=1e-12)
    # with variance on, the same run differs (jitter) and some iterations stall
    t2 = copy.deepcopy(t)
    t2["latency"]["variance"] = True
    res2 = run(config_from_table(t2))
    assert res2.end_s != res.end_s


# -- structure: decode waves, per-request CPU, TP logits gather -------------------------------------------------

def _model(pp=4, tp=1, **overrides):
    prof = Profile.load(P32 / f"tp{tp}")
    return ProfiledLatencyModel(with_overrides(prof, **overrides), pp, variance=False)


def test_decode_waves_pad_a_fraction_of_the_work_to_full_waves():
    m0 = _model(decode_wave_fraction=0.0)
    m = _model(decode_wave_fraction=0.5)
    d = m.profile.attention["decode"]
    # 8 KV heads per GPU, 108 SMs: 13 requests fill 104 of 108 slots (one wave), 14 need two waves
    for n, waves in ((13, 1), (14, 2), (27, 2), (28, 3)):
        ctx = 1000
        pad = waves * 108 / 8
        want = m.s_mem * (d["a_ms"] + d["b_ctx"] * (0.5 * n * ctx + 0.5 * ctx * pad)) / 1e3
        assert m.attention_s(BatchStats.decode(n, ctx)) == pytest.approx(want, rel=1e-12)
        # never cheaper than the exactly linear model
        assert m.attention_s(BatchStats.decode(n, ctx)) >= m0.attention_s(BatchStats.decode(n, ctx))
    step = m.attention_s(BatchStats.decode(14, 1000)) - m.attention_s(BatchStats.decode(13, 1000))
    smooth = m.attention_s(BatchStats.decode(15, 1000)) - m.attention_s(BatchStats.decode(14, 1000))
    assert step > 3 * smooth


def test_host_cost_grows_with_requests_and_empty_turns_pay_only_the_broadcast():
    m = _model(cpu_ms=2.0, cpu_per_request_us=25.0)
    st = BatchStats(prefill_tokens=512, num_prefill=1, sum_c2=512 * 512, num_decode=40, sum_decode_ctx=40_000)
    assert m.overhead_s(st) == pytest.approx(2.0e-3 + 41 * 25e-6 + 30e-6)
    assert m.overhead_s(None) == pytest.approx(30e-6)


def test_tp_logits_gather_hand_calculation():
    m = _model(pp=1, tp=4)
    assert m.tp == 4
    n = 200
    want = m.ar_alpha_s + 0.75 * n * 152064 * 2 / m.ar_bw
    assert m.logits_gather_s(n) == pytest.approx(want, rel=1e-12)
    # at 16 GB/s and 200 sequences: about 2.9 ms, on the last stage only
    assert 1e-3 < want < 6e-3
    st = BatchStats.decode(n, 1000)
    assert m.stage_time(st, 0).comm_s == pytest.approx(2 * 64 * m.allreduce_s(n) + want)
    assert _model(pp=4, tp=1).logits_gather_s(n) == 0.0
