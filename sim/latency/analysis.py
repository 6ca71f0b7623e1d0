"""Reading a profile the way the experiments and the calibration need it.

- `load_model(profile_dir, pp, **overrides)`: a `ProfiledLatencyModel` with meta values replaced
  (e.g. `s_mem=1.1, cpu_ms=1.5, mode="bucket128", p2p_bw_gbps=8`), without touching the files.
- `split_ms(model, stats, stage)`: linear / attention / communication / overhead / total of one
  stage for one micro-batch, ms. `overhead_ms` includes the per-iteration overhead (CPU + token
  broadcast), so `total_ms` is what one lock-step iteration costs when that stage is the slowest.
- `micro_benchmarks(model)`: the three step-shape ratios of paper-targets section 3.
- `bubble_ms(model)`: the pipeline bubble of a 2048-token prefill followed by a 128-token one.
"""

from __future__ import annotations

import copy
from pathlib import Path

from sim.core.errors import DataError
from sim.latency.base import BatchStats
from sim.latency.profiled import Profile, ProfiledLatencyModel

# meta.toml [section] of every overridable key
OVERRIDE_KEYS = {
    "mode": ("lookup", "mode"),
    "s_mem": ("scaling", "s_mem"),
    "s_comp": ("scaling", "s_comp"),
    "cpu_ms": ("overhead", "cpu_ms"),
    "p2p_alpha_us": ("comm", "p2p_alpha_us"),
    "p2p_bw_gbps": ("comm", "p2p_bw_gbps"),
    "allreduce_alpha_us": ("comm", "allreduce_alpha_us"),
    "allreduce_busbw_gbps": ("comm", "allreduce_busbw_gbps"),
    "cpu_per_request_us": ("ground_truth", "cpu_per_request_us"),
    "decode_wave_fraction": ("ground_truth", "decode_wave_fraction"),
    "jitter_cv": ("ground_truth", "jitter_cv"),
    "stall_prob": ("ground_truth", "stall_prob"),
    "slow_prob": ("ground_truth", "slow_prob"),
    "slow_mean": ("ground_truth", "slow_mean"),
    "stall_mean_ms": ("ground_truth", "stall_mean_ms"),
}

DEFAULT_DECODE_CONTEXT = 1400


def with_overrides(profile: Profile, **overrides) -> Profile:
    """A copy of `profile` whose meta has the given values (keys of OVERRIDE_KEYS)."""
    meta = copy.deepcopy(profile.meta)
    for key, val in overrides.items():
        if key not in OVERRIDE_KEYS:
            raise DataError(f"unknown profile override {key!r}; allowed: {', '.join(OVERRIDE_KEYS)}")
        sec, name = OVERRIDE_KEYS[key]
        meta.setdefault(sec, {})[name] = val
    return Profile(profile.path, meta, profile.grid, profile.layer_ms, profile.attention, profile.comm)


def load_model(profile: str | Path | Profile, pp: int, **overrides) -> ProfiledLatencyModel:
    if pp < 1:
        raise DataError(f"--pp must be >= 1, got {pp}")
    prof = profile if isinstance(profile, Profile) else Profile.load(profile)
    if overrides:
        prof = with_overrides(prof, **overrides)
    # the deterministic part of the truth: micro-benchmarks and tables show expected times
    return ProfiledLatencyModel(prof, pp, variance=False)


def default_stage(pp: int) -> int:
    """The stage `profile show` reports: stage 1 (a middle stage: no embedding, no LM head) when pp > 1."""
    return 0 if pp == 1 else 1


def split_ms(model: ProfiledLatencyModel, stats: BatchStats, stage: int | None = None) -> dict:
    stage = default_stage(model.num_stages) if stage is None else stage
    if not 0 <= stage < model.num_stages:
        raise DataError(f"--stage must be in 0..{model.num_stages - 1}, got {stage}")
    st = model.stage_time(stats, stage)
    host = getattr(model, "overhead_s", None)
    overhead = st.overhead_s + (host(stats) if host else model.iteration_overhead_s)
    return {
        "tokens": stats.num_tokens,
        "linear_ms": st.linear_s * 1e3,
        "attention_ms": st.attention_s * 1e3,
        "comm_ms": st.comm_s * 1e3,
        "overhead_ms": overhead * 1e3,
        "total_ms": (st.linear_s + st.attention_s + st.comm_s + overhead) * 1e3,
    }


def prefill_ms(model, tokens: int, stage: int | None = None) -> float:
    return split_ms(model, BatchStats.prefill(tokens), stage)["total_ms"]


def decode_ms(model, num: int, context: int = DEFAULT_DECODE_CONTEXT, stage: int | None = None) -> float:
    return split_ms(model, BatchStats.decode(num, context), stage)["total_ms"]


def micro_benchmarks(model, context: int = DEFAULT_DECODE_CONTEXT, stage: int | None = None) -> dict:
    """Step-shape ratios (iteration time of one stage, overhead included):
    prefill 129 / 256 tokens, decode 128 / 96 requests and 160 / 128 requests at `context` each."""
    d96, d128, d160 = (decode_ms(model, n, context, stage) for n in (96, 128, 160))
    return {
        "prefill_129_over_256": prefill_ms(model, 129, stage) / prefill_ms(model, 256, stage),
        "decode_128_over_96": d128 / d96,
        "decode_160_over_128": d160 / d128,
    }


def bubble_ms(model, big: int = 2048, small: int = 128) -> dict:
    """Bubble of a `big`-token prefill (micro-batch A) followed by a `small`-token one (B) in the
    lock-step pipeline. While A is in stage s+1, B is in stage s and that stage idles for
    T_A(s+1) - T_B(s); the bubble is the sum over s = 0..P-2 (every stage B passes while A is ahead).
    `alt_ms` also counts a P-th wait of T_A - T_B (B queued behind A at the pipeline entry), the
    other reading of 'summed over stages'. Stage GPU times only (the CPU overhead is common to both)."""
    P = model.num_stages
    ta = [t * 1e3 for t in model.stage_times(BatchStats.prefill(big))]
    tb = [t * 1e3 for t in model.stage_times(BatchStats.prefill(small))]
    waits = [max(0.0, ta[s + 1] - tb[s]) for s in range(P - 1)]
    mid = default_stage(P)
    return {"bubble_ms": sum(waits), "alt_ms": sum(waits) + max(0.0, ta[mid] - tb[mid]),
            "stage_big_ms": ta[mid], "stage_small_ms": tb[mid], "waits_ms": waits}
