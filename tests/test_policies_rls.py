"""ALP's predictor: RLS convergence, clipping, sample selection, and accuracy on a simulated run."""

from __future__ import annotations

import numpy as np
import pytest

from sim.policies.rls import RLS, RLS4, ALPPredictor, candidate_chunks
from test_policies_fakes import batch

TABLE = {c: 0.015 + 1.5e-5 * c for c in candidate_chunks()}


def test_rls_converges_on_synthetic_data():
    rng = np.random.default_rng(3)
    pred = ALPPredictor(dict(TABLE))
    theta = np.array([0.012, 0.004, 0.003, 0.05])  # on [D/1e5, S/2^20, X/2^21, 0.1]
    for _ in range(3000):
        c = int(rng.choice(candidate_chunks()))
        d, s, x = rng.uniform(0, 3e5), rng.uniform(0, c * c), rng.uniform(0, c * 4096)
        y = TABLE[c] + float(theta @ np.array(pred.features(d, s, x)))
        assert pred.update(y, c, d, s, x)
    assert pred.rls.theta == pytest.approx(list(theta), abs=1e-4)
    assert pred.predict(1024, 1e5, 2**20, 2**21) == pytest.approx(TABLE[1024] + theta.sum() - 0.9 * theta[3], abs=1e-5)


def test_error_is_clipped_to_40_percent():
    rls = RLS(1, forget=1.0, p0=1.0)
    rls.update(y=10.0, base=1.0, x=[1.0])  # error 9 clipped to 0.4; gain 1/2
    assert rls.theta == pytest.approx([0.2])
    rls = RLS(1, forget=1.0, p0=1.0, clip=0.0)  # clipping off
    rls.update(y=10.0, base=1.0, x=[1.0])
    assert rls.theta == pytest.approx([4.5])


@pytest.mark.parametrize("clip", [0.4, 0.0])
def test_the_written_out_four_feature_rls_is_the_generic_one_bit_for_bit(clip):
    """ALP's RLS4 against RLS(4): identical floats after every update (==, not approx), through
    clipped and unclipped errors, predictions near zero, zero features and a NaN sample."""
    def bits(v) -> bytes:  # NaN payloads and the sign of zero included
        return np.asarray(v, dtype=float).tobytes()

    rng = np.random.default_rng(7)
    ref, fast = RLS(4, clip=clip), RLS4(clip=clip)
    for i in range(2000):
        x = tuple(float(v) for v in rng.uniform(0, 3, 4) * (rng.random(4) < 0.8))
        base = float(rng.choice([0.0, 1e-12, rng.uniform(0.01, 0.2)]))
        y = float(rng.uniform(0, 0.5)) if i != 1500 else float("nan")
        if i == 1600:
            ref.reset(), fast.reset()
        assert bits(fast.residual(x)) == bits(ref.residual(x)), i
        ref.update(y, base, x)
        fast.update(y, base, x)
        assert bits(fast.theta) == bits(ref.theta) and bits(fast.P) == bits(ref.P), i
        assert fast.updates == ref.updates
    fast.theta = [1.0, 2.0, 3.0, 4.0]
    assert fast.theta == [1.0, 2.0, 3.0, 4.0] and fast.residual((1.0, 1.0, 1.0, 1.0)) == 10.0


def test_missing_table_means_no_prediction():
    pred = ALPPredictor.from_profile(lambda c: float("nan") if c > 1024 else 0.01)
    assert pred.table is None and pred.predict(128) is None and not pred.update(0.1, 128, 0, 0, 0)
    assert ALPPredictor.from_profile(lambda c: 0.01).predict(256) == pytest.approx(0.01)


def test_sample_selection_and_bucket_check():
    pred = ALPPredictor(dict(TABLE))
    assert pred.update_chunk(1) == 128 and pred.update_chunk(129) == 256 and pred.update_chunk(5000) == 2048
    dec = batch(1, 300, mode="decode", decode_ctx=10**6)  # 300 tokens -> bucket 384
    mix = batch(2, 20, mode="mixed", num_tokens=380, num_decode=19, prefill_sq=361**2)
    small = batch(3, 5, mode="extend", num_tokens=128, prefill_sq=128**2)
    # only decodes in flight: no sample
    assert pred.select_snapshot([dec, None]) is None
    # the heaviest bucket wins; tie (dec and mix both in 384) -> larger D + S + X before warm-up
    assert pred.select_snapshot([small, dec, mix]) is dec
    # the launched batch must be in the snapshot's 128-bucket
    assert pred.sample(current=mix, inflight=[mix, dec, small]) == (384, 10**6, 0, 0)
    assert pred.sample(current=small, inflight=[small, dec, mix]) is None
    assert pred.observe(mix, [mix, dec, small], 0.03) and pred.updates == 1
    assert not pred.observe(small, [small, dec, mix], 0.03)


def test_tie_break_uses_theta_after_warm_up():
    pred = ALPPredictor(dict(TABLE), warmup_updates=0)
    pred.rls.theta = [0.0, 1.0, 0.0, 0.0]  # only S matters now
    a = batch(0, 10, mode="decode", num_tokens=200, decode_ctx=10**7)
    b = batch(1, 3, mode="extend", num_tokens=200, prefill_sq=40_000)
    assert pred.select_snapshot([a, b]) is b


def test_alp_beats_the_offline_table_on_a_simulated_run():
    from sim.core.config import load_config
    from sim.studies.accuracy import accuracy_table, collect_samples

    cfg = load_config("experiments/configs/default.toml", [
        "scheduler.chunk_size_tokens=128", 'scheduler.chunk_policy={name="predictive"}',
        "workload.num_requests=120", "workload.rate_rps=4.0"])
    result, table, samples = collect_samples(cfg, noise_cv=0.05)
    assert result.status == "ok" and len(samples) > 200
    df = accuracy_table(samples, table, use_sklearn=False).set_index("predictor")
    assert list(df.index) == ["offline", "offline+prefix", "offline+prefix+prefill",
                              "offline+prefix+prefill+decode", "alp", "lstsq"]
    assert df.loc["alp", "mape_pct"] < df.loc["offline", "mape_pct"]
    assert (df["predict_us"] > 0).all()
