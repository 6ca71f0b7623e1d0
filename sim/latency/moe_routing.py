"""How an MoE layer's tokens spread over its experts under the routing distributions the measured tables use
(issue 44): balanced, and AIConfigurator's power laws.

AIConfigurator measures its MoE kernels at three routings (`distribution` of `moe_perf.parquet`): `balanced`
and `power_law_<alpha>` for alpha 1.01 and 1.2 (its default for Mixtral- and Qwen3-style models is 1.2,
`sdk/models/moe.py` `_power_law_alpha`). Its collector draws a power-law routing per measurement
(ai-dynamo/aiconfigurator `collector/helper.py` `_generate_power_law_distribution`):

1. one weight per expert from a power law on [xmin, xmax] by the inverse CDF,
   x = ((xmax^(1-a) - xmin^(1-a)) u + xmin^(1-a))^(1/(1-a)), u uniform on [0, 1) (`sample_power_law`), with
   [xmin, xmax] = [1, 0.8 T] when the T tokens' T k expert slots outnumber the E experts, else [0.01, 2];
2. the weights scaled to T k slots and rounded half to even;
3. the rounding's shortfall added one slot at a time to the largest experts in order, an excess taken one at
   a time from the smallest (from the largest when the smallest has none).

`touched_experts(E, k, T, distribution)` is the expected number of distinct experts T tokens reach: under
`balanced` the uniform expectation E (1 - (1 - k/E)^T) (`sim.latency.roofline.expected_experts`, real routers
being random, not round-robin), under a power law the mean over `DRAWS` draws of the collector's procedure with
a fixed seed (deterministic). Skewed routing reaches fewer experts at few tokens, so a roofline floor that
counts only the experts a batch reads must use the distribution the profile's table was measured at.

Stated assumption, not a fit: a run's routing is the distribution of its profile's expert table, the same at
every step and layer. With experts sharded by TP every rank holds a slice of every expert and does the same
work whatever the routing, so no rank is busier than another; skew acts only through the kernel's time at the
skewed per-expert loads, which the table measures.

With expert parallelism (ep ranks of E / ep whole experts each, vLLM's `determine_expert_map` "linear"
placement: rank r holds experts r E/ep .. (r+1) E/ep - 1) the ranks' loads differ and the layer lasts as long as
its busiest rank (every rank waits in the all-reduce that ends the layer). Stated assumption, not a fit: that
busiest rank is what the table measures. AIConfigurator's collector times EP rank 0 after swapping the
most-loaded rank's experts into rank 0 (`collector/helper.py` `_generate_power_law_distribution`, "Find EP rank
with max load and swap to rank 0"; `collector/vllm/collect_moe.py` builds rank 0's `determine_expert_map(ep, 0,
E)` and feeds it all T tokens), so its power-law EP rows are the busiest rank's time; under `balanced` every rank
gets T k / ep slots. `busiest_rank(E, k, T, ep, distribution)` gives that rank's expected slots and distinct
experts (the mean over the same `DRAWS` seeded draws), for the roofline floor of an EP profile.
"""

from __future__ import annotations

import math
from functools import lru_cache

from sim.core.errors import DataError
from sim.core.lazy import lazy

np = lazy("numpy")

DISTRIBUTIONS = ("balanced", "power_law_1.01", "power_law_1.2")
DRAWS = 64          # power-law draws averaged per (E, k, T): the mean's spread is a few % of E at most
SEED = 0


def power_law_alpha(distribution: str) -> float | None:
    """The exponent of a `power_law_<alpha>` distribution; None for `balanced`; a one-line DataError otherwise."""
    if distribution not in DISTRIBUTIONS:
        raise DataError(f"MoE routing distribution {distribution!r}: allowed: {', '.join(DISTRIBUTIONS)}")
    return None if distribution == "balanced" else float(distribution.removeprefix("power_law_"))


def sample_power_law(u: np.ndarray, alpha: float, xmin: float, xmax: float) -> np.ndarray:
    """The inverse CDF of the power law x^-alpha on [xmin, xmax] at uniform draws `u` (step 1 above)."""
    a = 1.0 - alpha
    return ((xmax ** a - xmin ** a) * u + xmin ** a) ** (1.0 / a)


def slots_per_expert(weights: np.ndarray, tokens: int, top_k: int) -> np.ndarray:
    """Integer slots per expert summing to tokens x top_k from one draw of expert weights (steps 2 and 3)."""
    target = tokens * top_k
    n = np.rint(weights / weights.sum() * target).astype(np.int64)
    delta = target - int(n.sum())
    if delta:
        order = np.argsort(-n, kind="stable")      # largest first
        if delta > 0:
            for i in range(delta):
                n[order[i % len(order)]] += 1
        else:
            for i in range(-delta):
                j = order[-(i % len(order)) - 1]
                if n[j] > 0:
                    n[j] -= 1
                else:
                    n[int(np.argmax(n))] -= 1
    return n


def power_law_slots(tokens: int, num_experts: int, top_k: int, alpha: float, u: np.ndarray) -> np.ndarray:
    """One draw of the collector's power-law routing: slots per expert, from uniform draws `u` (one per expert)."""
    if tokens * top_k > num_experts:
        w = sample_power_law(u, alpha, 1.0, tokens * 0.8)
    else:
        w = sample_power_law(u, alpha, 0.01, 2.0)
    return slots_per_expert(w, tokens, top_k)


@lru_cache(maxsize=65536)
def _power_law_touched(num_experts: int, top_k: int, tokens: int, alpha: float) -> float:
    rng = np.random.default_rng(SEED)
    u = rng.random((DRAWS, num_experts))
    return float(np.mean([np.count_nonzero(power_law_slots(tokens, num_experts, top_k, alpha, row)) for row in u]))


def touched_experts(num_experts: int, top_k: int, tokens: float, distribution: str = "balanced") -> float:
    """Expected distinct experts `tokens` tokens reach under `distribution` (module docstring)."""
    from sim.latency.roofline import expected_experts   # here: roofline imports this module

    alpha = power_law_alpha(distribution)
    if alpha is None or tokens <= 0:
        return expected_experts(num_experts, top_k, tokens)
    return _power_law_touched(num_experts, top_k, int(math.ceil(tokens)), alpha)


@lru_cache(maxsize=65536)
def _power_law_busiest(num_experts: int, top_k: int, tokens: int, ep: int, alpha: float) -> tuple[float, float]:
    rng = np.random.default_rng(SEED)
    u = rng.random((DRAWS, num_experts))
    draws = [busiest_of(power_law_slots(tokens, num_experts, top_k, alpha, row), ep) for row in u]
    return float(np.mean([d[0] for d in draws])), float(np.mean([d[1] for d in draws]))


def busiest_of(slots: np.ndarray, ep: int) -> tuple[int, int]:
    """(slots, distinct experts) of the rank with the most slots when `slots` (per expert) are split over `ep`
    ranks of len(slots) / ep consecutive experts; the first such rank on ties (the collector's argmax)."""
    per_rank = np.asarray(slots).reshape(ep, len(slots) // ep)
    busiest = per_rank[int(np.argmax(per_rank.sum(axis=1)))]
    return int(busiest.sum()), int(np.count_nonzero(busiest))


def busiest_rank(num_experts: int, top_k: int, tokens: float, ep: int,
                 distribution: str = "balanced") -> tuple[float, float]:
    """(expected slots, expected distinct experts) of the busiest of `ep` expert-parallel ranks when `tokens`
    tokens are routed under `distribution` (module docstring); ep = 1 is the whole layer."""
    if ep < 1 or num_experts % ep:
        raise DataError(f"ep {ep}: must divide the {num_experts} experts")
    alpha = power_law_alpha(distribution)
    if tokens <= 0:
        return 0.0, 0.0
    if alpha is None:
        return tokens * top_k / ep, touched_experts(num_experts, top_k, tokens) / ep
    return _power_law_busiest(num_experts, top_k, int(math.ceil(tokens)), ep, alpha)
