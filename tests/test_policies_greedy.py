"""The greedy controller's rules, watermark, restore memory and safety guard (system model 2-3)."""

from __future__ import annotations

import pytest

from sim.core.errors import ConfigError
from sim.policies import chunk_policies
from sim.policies.greedy import GreedyChunk, safety_guard, watermark_chunk
from test_policies_fakes import FakeView, batch, ctx


def make(**kw) -> GreedyChunk:
    return GreedyChunk(context=ctx(pp=4), **kw)


@pytest.mark.parametrize("chunk, ttft, tpot, new, reason", [
    (512, 0.5, 0.22, 384, "tpot_high"),      # tpot > 1.08 * 0.2 = 0.216
    (512, 0.5, 0.216, 512, "hold"),           # not strictly above
    (512, 0.1, 0.10, 384, "ttft_low"),        # ttft < 0.1 * 2.0 = 0.2
    (512, 0.7, 0.16, 640, "ttft_high"),       # ttft > 0.6 and tpot < 0.17
    (512, 0.7, 0.17, 512, "hold"),            # tpot not below 0.85 * 0.2
    (512, 0.6, 0.10, 512, "hold"),            # ttft not above 0.6
    (512, 0.7, 0.25, 384, "tpot_high"),       # the decrease rule wins over the increase rule
    (128, 0.5, 0.30, 128, "tpot_high"),       # floor 128
    (2048, 1.5, 0.10, 2048, "ttft_high"),     # ceiling 2048
])
def test_rule_table(chunk, ttft, tpot, new, reason):
    pol = make()
    d = pol.decide(FakeView(chunk_size=chunk, ttft=[ttft], tpot=[tpot]))
    assert (d.chunk, d.reason) == (new, reason)
    assert (d.ttft_signal_s, d.tpot_signal_s) == (pytest.approx(ttft), pytest.approx(tpot))


def test_cadence_every_pp_steps_and_initial_chunk():
    pol = make()
    assert pol.initial_chunk() == 128
    assert pol.decide(FakeView(step=3, ttft=[1.0])) is None
    assert pol.decide(FakeView(step=8, ttft=[1.0])) is not None
    assert chunk_policies.build("greedy", context=ctx(pp=2)).every == 2


def test_window_means_and_no_ttft_keeps_tpot_samples():
    pol = make()
    view = FakeView(chunk_size=512, tpot=[0.30, 0.10])
    d = pol.decide(view)  # no TTFT sample: no change, nothing drained
    assert (d.chunk, d.reason, d.tpot_signal_s) == (512, "no_ttft", pytest.approx(0.1))  # initial 0.5 SLO
    view.ttft += [0.4, 0.6]
    view.tpot += [0.26]
    d = pol.decide(view)
    assert pol.signals.ttft == pytest.approx(0.5)
    assert pol.signals.tpot == pytest.approx((0.30 + 0.10 + 0.26) / 3)  # the kept samples count
    assert d.reason == "tpot_high"
    view.ttft += [0.7]  # no new TPOT sample: the previous mean is kept
    pol.decide(view)
    assert pol.signals.ttft == pytest.approx(0.7) and pol.signals.tpot == pytest.approx(0.22)


def test_p90_signal_option():
    pol = make(signal_stat="p90")
    pol.decide(FakeView(ttft=[0.1] * 9 + [1.1], tpot=[0.1]))
    assert pol.signals.ttft == pytest.approx(0.2)


@pytest.mark.parametrize("m, chunk", [(0, 128), (63, 128), (64, 256), (191, 256), (192, 384)])
def test_watermark_rule_examples(m, chunk):
    assert watermark_chunk([m, 1000]) == chunk
    assert watermark_chunk([m], "paper") == (m // 128 + 1) * 128


_VIEW = {}


def pressured(counts, chunk, free=1000, ttft=0.5, key=None):
    """The same view object across calls of one test (the sample logs are append-only)."""
    view = _VIEW.setdefault(key, FakeView(kv_capacity_tokens=100_000))
    view.chunk_size, view.kv_free_tokens = chunk, free
    view.ttft.append(ttft)
    view.tpot.append(0.1)
    view.batches = [batch(s, n) for s, n in enumerate(counts)]
    return view


def test_watermark_then_restore():
    pol = make()
    # kv_free = (9_000 - 434) / 100_000 < 0.10: min count 64 -> 128*((64+64)//128 + 1) = 256
    d = pol.decide(pressured([70, 200, 100, 64], 1024, free=9_000, key="r1"))
    assert (d.chunk, d.reason) == (256, "watermark") and pol.restore == 1024
    # pressure persists with a smaller chunk: the restore value stays
    d = pol.decide(pressured([70, 200, 100, 64], 256, free=9_000, key="r1"))
    assert (d.chunk, pol.restore) == (256, 1024)
    # pressure gone: the pre-pressure chunk comes back in one step, then the rules resume
    d = pol.decide(pressured([70, 200, 100, 64], 256, free=60_000, key="r1"))
    assert (d.chunk, d.reason, pol.restore) == (1024, "restore", None)
    d = pol.decide(pressured([70, 200, 100, 64], 1024, free=60_000, ttft=0.1, key="r1"))
    assert (d.chunk, d.reason) == (896, "ttft_low")


def test_restore_dropped_when_watermark_reaches_it():
    pol = make()
    pol.decide(pressured([70, 70, 70, 70], 512, free=5_000, key="r2"))
    assert pol.restore == 512
    # min count 500 -> 128*((500+64)//128 + 1) = 640 >= 512: the memory is dropped
    d = pol.decide(pressured([500, 500, 500, 500], 256, free=5_000, key="r2"))
    assert (d.chunk, pol.restore) == (640, None)


def test_kv_free_subtracts_one_token_per_running_request():
    pol = make()
    # free 10_400 of 100_000 is above 10%, but minus 4 x 110 requests it is below
    d = pol.decide(pressured([110, 110, 110, 110], 1024, free=10_400, key="r3"))
    assert d.reason == "watermark" and d.chunk == 256


def test_safety_guard():
    pol = make()
    # tpot rule gives 384, but a slot's last batch holds 400 requests: 128*(400//128 + 1) = 512
    view = FakeView(chunk_size=512, ttft=[0.5], tpot=[0.3], batches=[batch(0, 400), batch(1, 10), None, None])
    d = pol.decide(view)
    assert (d.chunk, d.reason) == (512, "tpot_high+safety_guard")
    # it may exceed the 2048 maximum
    assert safety_guard(2048, [batch(0, 2100)], [2100]) == (2176, True)
    assert safety_guard(512, [batch(0, 511), None], [511]) == (512, False)


def test_bad_params_are_config_errors():
    with pytest.raises(ConfigError):
        chunk_policies.build("greedy", context=ctx(), watermark_rule="nope")
    with pytest.raises(ConfigError):
        chunk_policies.build("greedy", context=ctx(), step_tokens=0)
    with pytest.raises(ConfigError):
        chunk_policies.build("greedy", context=ctx(), no_such=1)
