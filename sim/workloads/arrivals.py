"""Open-loop arrival processes as the benchmark clients draw them.

Each function returns the send times (seconds after the benchmark starts) of `num` requests,
in order, from one random stream; the request list is consumed in that order.

- `poisson` (SGLang `python/sglang/bench_serving.py`, `get_request`, 0.5.4): the first request
  at t = 0, then exponential gaps of mean 1/rate (`exponential(1.0 / request_rate)`
  after each yield). This is also PipeSim's historical `poisson_arrivals`.
- `gamma` (vLLM `vllm/benchmarks/serve.py`, `get_request`, 0.11.0): every request, the first
  one included, waits a gamma gap of shape `burstiness` and scale 1/(rate * burstiness) (mean
  1/rate; burstiness 1 is the exponential, < 1 burstier, > 1 more even); the cumulative delays
  are then rescaled so that the last one is exactly num / rate ("to close the 1-2% gap ... for
  stabilizing the throughput data from different random seeds").
- `constant`: request i at i / rate (genai-perf's `--request-rate-mode constant`; a gamma of
  infinite burstiness).
- `staged`: a list of (rate, duration) stages, as load-test tools ramp load: Poisson within
  each stage; at a stage's end the next stage's rate takes over (the exponential is memoryless,
  so restarting the gap at the boundary is exact). Requests stop when the stages end or the
  request list runs out, whichever is first.

- `ramp` (vLLM `get_request` with `--ramp-up-strategy`, `_get_current_request_rate`, 0.11.0):
  request i's rate is start + (end - start) p (`linear`) or start (end / start)^p (`exponential`),
  p = i / max(n - 1, 1); its gap is gamma of shape `burstiness` and mean 1 / rate_i; no rescaling
  (vLLM rescales only without a ramp).

A rate of `inf` sends everything at t = 0 (both clients' `--request-rate inf`).
"""

from __future__ import annotations

import math

from sim.core.errors import ConfigError
from sim.core.lazy import lazy
from sim.workloads.base import poisson_arrivals

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

PROCESSES = ("poisson", "gamma", "constant", "staged", "ramp")
RAMPS = ("linear", "exponential")


def poisson(num: int, rate_rps: float, rng) -> "np.ndarray":
    """SGLang's: first at 0, then exponential gaps: the form of the artifact's draw, which SGLang's client
    kept. The numbers come from the run's seeded stream, not the artifact's numpy re-seeded with 1 before
    every rate, so a seed does not give the artifact's send times (experiments/notes/static_tpot.md)."""
    return poisson_arrivals(num, rate_rps, rng)


def gamma(num: int, rate_rps: float, burstiness: float, rng) -> "np.ndarray":
    """vLLM's `get_request` without a ramp-up: gamma gaps before every request, rescaled so the
    last send is at num / rate."""
    if num <= 0:
        return np.zeros(0)
    if math.isinf(rate_rps):
        return np.zeros(num)
    theta = 1.0 / (rate_rps * burstiness)
    delays = np.cumsum(rng.gamma(shape=burstiness, scale=theta, size=num))
    if delays[-1] != 0:
        delays = delays * ((num / rate_rps) / delays[-1])
    return delays


def constant(num: int, rate_rps: float) -> "np.ndarray":
    if math.isinf(rate_rps):
        return np.zeros(max(num, 0))
    return np.arange(max(num, 0), dtype=float) / rate_rps


def staged(num: int | None, stages: list[tuple[float, float]], rng) -> "np.ndarray":
    """Poisson within each (rate_rps, duration_s) stage, in order; at most `num` requests."""
    out: list[float] = []
    t0 = 0.0
    limit = math.inf if num is None else num
    first = True
    for rate, dur in stages:
        end = t0 + dur
        t = t0
        while len(out) < limit:
            if first:  # the first request at t = 0, as the Poisson client sends it
                first = False
            else:
                t += rng.exponential(1.0 / rate)
            if t >= end:
                break
            out.append(t)
        t0 = end
    return np.asarray(out, dtype=float)


def ramp(num: int, strategy: str, start_rps: float, end_rps: float, burstiness: float, rng) -> "np.ndarray":
    """vLLM's ramp-up: per-request rates from start to end, gamma gaps, cumulative, not rescaled."""
    if num <= 0:
        return np.zeros(0)
    p = np.arange(num) / max(num - 1, 1)
    rates = start_rps + (end_rps - start_rps) * p if strategy == "linear" else start_rps * (end_rps / start_rps) ** p
    return np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness)))


def parse_stages(value, where: str) -> list[tuple[float, float]]:
    """`stages = [[rate_rps, duration_s], ...]`, each positive and finite."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: field 'stages' must be a non-empty list of [rate_rps, duration_s] pairs, "
                          f"got {value!r}")
    out = []
    for i, st in enumerate(value):
        ok = (isinstance(st, list) and len(st) == 2
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in st))
        if not ok or not (0 < st[0] < math.inf and 0 < st[1] < math.inf):
            raise ConfigError(f"{where}: field 'stages' item {i} must be [rate_rps > 0, duration_s > 0], "
                              f"both finite, got {st!r}")
        out.append((float(st[0]), float(st[1])))
    return out


def draw(process: str, num: int | None, rng, *, rate_rps: float = math.inf, burstiness: float = 1.0,
         stages: list[tuple[float, float]] | None = None, ramp_spec: tuple[str, float, float] | None = None,
         where: str = "") -> "np.ndarray":
    """The send times of one named process (see the module's docstring)."""
    if process == "poisson":
        return poisson(int(num or 0), rate_rps, rng)
    if process == "gamma":
        return gamma(int(num or 0), rate_rps, burstiness, rng)
    if process == "constant":
        return constant(int(num or 0), rate_rps)
    if process == "staged":
        return staged(num, stages or [], rng)
    if process == "ramp":
        strategy, start, end = ramp_spec or ("linear", rate_rps, rate_rps)
        return ramp(int(num or 0), strategy, start, end, burstiness, rng)
    raise ConfigError(f"{where}: field 'arrivals' must be one of {', '.join(PROCESSES)}; got {process!r}")
