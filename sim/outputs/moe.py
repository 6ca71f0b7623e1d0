"""What a mixture-of-experts run's iterations show of its routing (issue 44): per iteration, the routed token
slots (tokens x top-k) one MoE layer gives the mean expert-parallel rank and the busiest one, under the routing
the run's profile was measured at, so that imbalance is visible in iterations.csv (`ITERATION_COLUMNS`; the
ratio of their sums over a run is its imbalance). Not in summary.json: a run that writes no iterations.csv keeps
only the summary's iteration columns (sim/engine/records.py SUMMARY_COLUMNS), which hold no token counts.

- **Mean rank**: T k / ep slots for a step of T tokens (`[moe] top_k`, `ep`); with experts sharded by TP (ep 1)
  every rank runs every slot's share, so mean = busiest = T k.
- **Busiest rank**: `sim.latency.moe_routing.busiest_rank`, the expected slots of the rank with the most under
  the profile's routing (balanced: T k / ep; a power law: AIConfigurator's collector's draw, 64 seeded draws).
  It is the rank whose time the profile's expert curve already is (the table's power-law EP rows time the
  busiest rank), so these columns explain the step time; they do not change it. Computed at powers of two
  of T and interpolated linearly in log2 T between them (the ratio busiest / mean is smooth in T; one draw
  set per power of two keeps a run's outputs fast), exact at powers of two. Suspect at very few tokens: where
  T k rounds to no slot on any expert (T = 1 for 128 experts, top-8), moe_routing's draw gives the k slots to
  experts 0..k-1 (its fix-up in index order), all on rank 0: 7.3 of 8 slots on the busiest of 8 ranks at one
  token, while the table's 1-token Qwen3-235B EP rows are 0.60-0.76x the floor that implies
  (profiles/build_moe.py EP_NOT_BUILT), so the collector likely spreads them; not changed here.

Not recorded: per-rank tokens of data-parallel attention (not modelled: sim/core/ep.py), and the experts' share
of the step's time (a profile keeps the routed experts' curve inside `linear_ms`, not apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from sim.core.lazy import lazy

np = lazy("numpy")

ITERATION_COLUMNS = ("moe_mean_rank_slots", "moe_busiest_rank_slots")


@dataclass(frozen=True)
class MoeLayout:
    """An MoE profile's routing layout ([moe] of its meta.toml)."""

    num_experts: int
    top_k: int
    ep: int
    distribution: str


def moe_layout(result) -> MoeLayout | None:
    """The run's MoE layout from its profile's [moe], or None (a dense profile, or no profile at all)."""
    lat = result.config.latency
    if lat.kind != "profile":
        return None
    from sim.engine.run import load_profile_cached

    moe = load_profile_cached(lat.profile_path()).meta.get("moe") or {}
    if not moe:
        return None
    return MoeLayout(int(moe["num_experts"]), int(moe["top_k"]), int(moe.get("ep", 1)),
                     str(moe.get("distribution", "balanced")))


@lru_cache(maxsize=64)
def _ratios(layout: MoeLayout, top: int) -> tuple[float, ...]:
    """busiest / mean rank slots at T = 2^0 .. 2^top."""
    from sim.latency.moe_routing import busiest_rank

    mean = lambda t: t * layout.top_k / layout.ep  # noqa: E731
    return tuple(busiest_rank(layout.num_experts, layout.top_k, 2 ** i, layout.ep, layout.distribution)[0]
                 / mean(2 ** i) for i in range(top + 1))


def rank_slots(layout: MoeLayout, num_tokens) -> tuple["np.ndarray", "np.ndarray"]:
    """(mean rank's, busiest rank's) routed slots per MoE layer for steps of `num_tokens` tokens (0: 0, 0)."""
    t = np.asarray(num_tokens, dtype=float)
    mean = t * layout.top_k / layout.ep
    busy = t > 0
    if not busy.any():
        return mean, mean.copy()
    top = max(1, math.ceil(math.log2(float(t[busy].max()))))
    ratios = np.array(_ratios(layout, top))
    ratio = np.ones_like(t)
    ratio[busy] = np.interp(np.log2(t[busy]), np.arange(top + 1, dtype=float), ratios)
    return mean, mean * ratio


def iteration_columns(result, num_tokens) -> dict:
    """{column: values} to add to iterations.csv for an MoE run (`ITERATION_COLUMNS`), else {}."""
    layout = moe_layout(result)
    if layout is None:
        return {}
    mean, busiest = rank_slots(layout, num_tokens)
    return dict(zip(ITERATION_COLUMNS, (mean, busiest)))
