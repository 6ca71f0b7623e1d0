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
import math
from pathlib import Path

from sim.core.errors import ConfigError, DataError
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
    "drift_sigma": ("ground_truth", "drift_sigma"),
    "drift_iters": ("ground_truth", "drift_iters"),
}

DEFAULT_DECODE_CONTEXT = 1400


# The documented physical range of each numeric override (low, high), and where it is documented. A what-if
# run may move a parameter anywhere inside it, never outside: a value no real server can have (a NaN, a
# 1e300 scale) would only make the run meaningless (or endless). 0 is allowed for the ground truth's
# variance and per-request terms: it is their documented "off" value (absent = 0, profiles/FORMAT.md).
# The communication bandwidths are bounded by the link's per-direction bandwidth ([roofline] link_bw_gbps).
FIT_RANGES = "reference/latency-profiles.md sections 3 and 12, profiles/FORMAT.md ([ground_truth])"
OVERRIDE_RANGES: dict[str, tuple[float, float]] = {
    "s_mem": (1.0, 1.35),             # section 12 step 2 (80 -> 40GB bandwidth ratio 1.24-1.31, section 8)
    "s_comp": (1.0, 1.2),             # section 12 step 2 (same peak, 250 W cap, section 8)
    "cpu_ms": (1.0, 3.0),             # section 3 / section 9
    "p2p_alpha_us": (0.0, 30.0),      # section 3: 15-30 us on PCIe (13 us measured on NVSwitch)
    "p2p_bw_gbps": (0.0, math.inf),   # (0, link bandwidth]
    "allreduce_alpha_us": (0.0, 100.0),   # section 3: 59-100 us on PCIe (27-38 us measured on NVSwitch)
    "allreduce_busbw_gbps": (0.0, math.inf),  # (0, link bandwidth]
    "cpu_per_request_us": (0.0, 50.0),    # FORMAT.md: 5-50 us, 0 = off
    "decode_wave_fraction": (0.0, 1.0),
    "jitter_cv": (0.0, 0.08),         # FORMAT.md: 1-8%, 0 = off
    "stall_prob": (0.0, 0.10),        # FORMAT.md: 0-10%
    "slow_prob": (0.0, 0.15),         # FORMAT.md: 0-15%
    "slow_mean": (0.0, 0.60),         # FORMAT.md: 5-60%, 0 = off
    "stall_mean_ms": (0.0, 30.0),     # FORMAT.md: 2-30 ms, 0 = off
    "drift_sigma": (0.0, 0.10),       # FORMAT.md: 0-10% (log of the sustained clock, 1.1-1.41 GHz), 0 = off
    "drift_iters": (0.0, 5000.0),     # FORMAT.md: 0-5000 iterations (a thermal time constant of seconds)
}
OPEN_LOW = {"p2p_bw_gbps", "allreduce_busbw_gbps"}     # a bandwidth of 0 is no link at all


def check_override(profile: Profile, key: str, val):
    """`val` if it is a valid value of override `key` on `profile`, else a one-line ConfigError naming the key."""
    if key == "mode":
        if val not in ("grid", "bucket128"):
            raise ConfigError(f"[latency.overrides] mode must be 'grid' or 'bucket128', got {val!r}")
        return val
    lo, hi = OVERRIDE_RANGES[key]
    where = FIT_RANGES
    if key in OPEN_LOW:
        link = profile.meta.get("roofline", {}).get("link_bw_gbps")
        if link:
            hi, where = float(link), f"the link's per-direction bandwidth, {profile.path / 'meta.toml'} [roofline]"
    ok = not isinstance(val, bool) and isinstance(val, (int, float)) and math.isfinite(val)
    ok = ok and (val > lo if key in OPEN_LOW else val >= lo) and val <= hi
    if not ok:
        rng = f"{'(' if key in OPEN_LOW else '['}{lo:g}, {hi:g}]" if math.isfinite(hi) else f"> {lo:g}"
        raise ConfigError(f"[latency.overrides] {key} must be a finite number in {rng} ({where}), got {val!r}")
    return val


def with_overrides(profile: Profile, **overrides) -> Profile:
    """A copy of `profile` whose meta has the given values (keys of OVERRIDE_KEYS), each checked
    against its documented physical range (`OVERRIDE_RANGES`)."""
    meta = copy.deepcopy(profile.meta)
    for key, val in overrides.items():
        if key not in OVERRIDE_KEYS:
            raise DataError(f"unknown profile override {key!r}; allowed: {', '.join(OVERRIDE_KEYS)}")
        check_override(profile, key, val)
        sec, name = OVERRIDE_KEYS[key]
        meta.setdefault(sec, {})[name] = val
    return Profile(profile.path, meta, profile.grid, profile.layer_ms, profile.attention, profile.comm,
                   layer_raw=profile.layer_raw)


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
