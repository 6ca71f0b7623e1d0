"""Run-to-run variance of a real GPU server, as seeded random draws per lock-step iteration.

Four sources (`[ground_truth]` in meta.toml; the shipped A100 profiles turn on the jitter and the
slow iterations, the calibration holds the host stall at 0, see profiles/FORMAT.md):

- **Stage jitter.** Every stage's time in every iteration is multiplied by an independent
  lognormal factor with mean 1 and coefficient of variation `jitter_cv` (kernel-time variance:
  clocks under a power cap, memory and PCIe contention). sigma^2 = log(1 + cv^2), mu = -sigma^2/2.
- **Slow iterations.** With probability `slow_prob` every stage of the iteration is stretched by
  one factor 1 + Exp(mean `slow_mean`) (GPU clocks throttled under the power cap, a contended PCIe
  switch). This is the occasional slow iteration that gives real per-iteration latency its tail
  (a symmetric lognormal body alone cannot), and it scales with the iteration's work.
- **Clock drift.** A persistent multiplier g_k on every stage's time, the same for all stages: the
  GPUs' sustained clock under the 250 W power cap and the chassis' thermal state move slowly (a
  thermal time constant of seconds, many iterations), so consecutive iterations share it. Its log is
  a stationary Gaussian AR(1) process with standard deviation `drift_sigma` and correlation time
  `drift_iters` iterations: x_0 ~ N(0, sigma^2), x_k = rho x_{k-1} + sigma sqrt(1 - rho^2) z_k,
  rho = exp(-1 / drift_iters), g_k = exp(x_k - sigma^2 / 2), so E[g] = 1, Var[g] = exp(sigma^2) - 1
  and Corr(x_k, x_{k+n}) = rho^n. Unlike the jitter, a predictor that tracks its recent error (ALP's
  online RLS residual) can learn it; a table measured once at start-up cannot.
- **Host stalls.** With probability `stall_prob` per iteration the host adds a stall drawn from
  an exponential distribution with mean `stall_mean_ms` to the iteration's critical path
  (garbage collection, Python scheduler hiccups, the blocking `tolist()` sync waiting on a late
  rank): a fixed amount, whatever the iteration's size.

Common random numbers: each stage draws from its own named stream (`<prefix>-jitter-stage<s>`),
the stalls from `<prefix>-stall`, the slow iterations from `<prefix>-slowdown` and the clock drift
from `<prefix>-drift` (each drawn only when it is on, so every other draw is the same with or
without them), one draw per iteration
in iteration order, whether or not the stage has work. Two schemes run with the same seed
therefore see identical noise at the same iteration position. Start-up profiling uses
`prefix = "startup"`, so the policy's profiling never shifts the draws the run itself sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.core.lazy import lazy
np = lazy("numpy")

from sim.core.rng import stream

BLOCK = 4096  # draws are taken in blocks: fast, and still a fixed sequence per stream


@dataclass(frozen=True)
class VarianceParams:
    """Noise parameters; all zero means the deterministic (zero-variance) ground truth."""

    jitter_cv: float = 0.0
    stall_prob: float = 0.0
    stall_mean_ms: float = 0.0
    slow_prob: float = 0.0
    slow_mean: float = 0.0
    drift_sigma: float = 0.0   # standard deviation of the log of the persistent clock multiplier
    drift_iters: float = 0.0   # its correlation time, in iterations

    @property
    def drift_on(self) -> bool:
        return self.drift_sigma > 0 and self.drift_iters > 0

    @property
    def enabled(self) -> bool:
        return (self.jitter_cv > 0 or (self.stall_prob > 0 and self.stall_mean_ms > 0)
                or (self.slow_prob > 0 and self.slow_mean > 0) or self.drift_on)

    def mean_stall_ms(self) -> float:
        """Expected host stall per iteration (ms)."""
        return self.stall_prob * self.stall_mean_ms


class IterationNoise:
    """The per-iteration draws of one run (or of one start-up profiling session).

    Every stream is drawn `BLOCK` values at a time, all streams together (each stream gives
    exactly one value per iteration, so they stay aligned); a block is turned into a list of
    per-stage factor rows and a list of stalls, so an iteration costs two list indexes."""

    def __init__(self, params: VarianceParams, num_stages: int, seed: int, prefix: str = "latency") -> None:
        self.params = params
        self.num_stages = num_stages
        sigma = math.sqrt(math.log1p(params.jitter_cv ** 2)) if params.jitter_cv > 0 else 0.0
        self._mu, self._sigma = -sigma * sigma / 2, sigma
        self._stage_rngs = [stream(seed, f"{prefix}-jitter-stage{s}") for s in range(num_stages)] if sigma > 0 else []
        self._stall_rng = stream(seed, f"{prefix}-stall")
        self._slow_rng = stream(seed, f"{prefix}-slowdown") if params.slow_prob > 0 and params.slow_mean > 0 else None
        self._drift_rng = stream(seed, f"{prefix}-drift") if params.drift_on else None
        self._drift_x: float | None = None   # the drift's log state after the last iteration drawn
        self._factors: list[list[float]] = []  # the block's rows: one factor per stage
        self._stalls: list[float] = []
        self._i = 0

    def _refill(self) -> None:
        p = self.params
        if self._stage_rngs:
            factors = np.stack([g.lognormal(self._mu, self._sigma, size=BLOCK) for g in self._stage_rngs], axis=1)
        else:
            factors = np.ones((BLOCK, self.num_stages))
        # the uniform block is drawn before the exponential block, from the one stall stream
        u = self._stall_rng.random(size=BLOCK)
        e = self._stall_rng.exponential(1.0, size=BLOCK)
        stall = np.where(u < p.stall_prob, e * p.stall_mean_ms / 1e3, 0.0).tolist()
        if self._slow_rng is not None:
            # a slow iteration stretches every stage by the same factor (own stream: the
            # jitter and stall draws are the same with and without it); other rows are
            # multiplied by exactly 1.0, which leaves them as they are
            u = self._slow_rng.random(size=BLOCK)
            e = self._slow_rng.exponential(1.0, size=BLOCK)
            factors = factors * np.where(u < p.slow_prob, 1.0 + e * p.slow_mean, 1.0)[:, None]
        if self._drift_rng is not None:
            # one multiplier per iteration for every stage, the recursion continued from the last block
            g, self._drift_x = drift_multipliers(p.drift_sigma, p.drift_iters,
                                                 self._drift_rng.standard_normal(size=BLOCK), self._drift_x)
            factors = factors * g[:, None]
        self._factors = factors.tolist()
        self._stalls = stall
        self._i = 0

    def next(self) -> tuple[list[float], float]:
        """(factor per stage: its jitter times the iteration's slow-down stretch, if any; host stall
        in seconds) for the next iteration. The factor list is the block's own row: read, not changed."""
        i = self._i
        if i >= len(self._stalls):
            self._refill()
            i = 0
        self._i = i + 1
        return self._factors[i], self._stalls[i]


def drift_multipliers(sigma: float, iters: float, z: Any, x_prev: float | None = None) -> tuple[Any, float | None]:
    """(g, last x): g_k = exp(x_k - sigma^2/2) for standard normal draws z (one per iteration), with
    x_0 = sigma z_0 when there is no previous state (the stationary start), else x_k = rho x_{k-1} +
    sigma sqrt(1 - rho^2) z_k, rho = exp(-1 / iters); the last x continues the process in the next block."""
    rho = math.exp(-1.0 / iters)
    innov = sigma * math.sqrt(1.0 - rho * rho)
    x = np.empty(len(z))
    prev = x_prev
    for k, zk in enumerate(z.tolist()):
        prev = sigma * zk if prev is None else rho * prev + innov * zk
        x[k] = prev
    return np.exp(x - sigma * sigma / 2), prev


def sample_factors(params: VarianceParams, num_stages: int, seed: int, n: int, prefix: str = "latency") -> Any:
    """n iterations of draws as a numpy array of shape (n, num_stages + 1): the stage factors (jitter,
    slow-down and clock drift together), then the stall in ms (for tests and for the calibration report)."""
    noise = IterationNoise(params, num_stages, seed, prefix)
    out = np.empty((n, num_stages + 1))
    for i in range(n):
        f, stall = noise.next()
        out[i, :num_stages] = f
        out[i, num_stages] = stall * 1e3
    return out
