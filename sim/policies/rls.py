"""ALP's latency predictor: an offline per-chunk table plus an online RLS residual.

fastpp-system-model.md sections 4.1-4.4 (alp_scheduler.py, dynamic_chunk_controller.py):

- `T0(c)`: one start-up measurement per candidate chunk c (128..2048 step 128), the wall time of
  a steady-state iteration in which every stage holds a pure c-token prefill. Here it comes from
  `PolicyContext.startup_profile(c)` (the simulated start-up profiling on the ground truth). If
  any candidate is infeasible (nan) or missing, the artifact writes no table at all: every
  prediction is then unavailable and ALP never changes the chunk.
- `T_hat(c, x) = max(T0(c) + theta.x, 1e-9)` with x = [D/1e5, S/2^20, X/2^21, 0.1]
  (decode context sum, sum of new_tokens^2, sum of new_tokens*prefix, a bias feature).
- theta is learned online by exponentially weighted RLS on the residual y - T0(u):
  lambda = 0.9975, P0 = 1.25 I, theta0 = 0, the error clipped to +-40% of the prediction.
- Training samples (`observe`): only iterations with a prefill (extend or mixed) micro-batch in
  flight; the features come from the heaviest in-flight micro-batch (largest candidate bucket
  u(N), ties broken by D+S+X before 16 updates and by theta.x after); the sample is kept only
  if that snapshot's 128-bucket equals the launched batch's.

`RLS` is the generic estimator (any number of features) so that the accuracy study can ablate
features; `ALPPredictor` is the artifact's 4-feature instance. Plain-float arithmetic: a 4x4
update in pure Python is faster than numpy's call overhead at this size.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from operator import attrgetter, mul
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # (the engine's view records; typed so that the compiled module reads them by index)
    from sim.engine.view import BatchInfo

FORGET = 0.9975
P0 = 1.25
CLIP = 0.4
SCALES = (1e5, float(2**20), float(2**21))
BIAS = 0.1
WARMUP_UPDATES = 16
BUCKET = 128


def candidate_chunks(lo: int = 128, hi: int = 2048, step: int = 128) -> list[int]:
    return list(range(lo, hi + 1, step))


class RLS:
    """Exponentially weighted recursive least squares on a residual over a base prediction.

    `predict(base, x) = base + theta.x`; `update(y, base, x)` uses the error
    e = y - predict, clipped to +-clip*|predict| (clipped, not skipped), the gain
    k = P x / max(lambda + x'P x, 1e-12), then theta += k e and P = (P - k x'P) / lambda.
    """

    def __init__(self, dim: int, forget: float = FORGET, p0: float = P0, clip: float = CLIP) -> None:
        self.dim, self.forget, self.p0, self.clip = dim, forget, p0, clip
        self.reset()

    def reset(self) -> None:
        n = self.dim
        self.theta = [0.0] * n
        self.P = [[self.p0 if i == j else 0.0 for j in range(n)] for i in range(n)]
        self.updates = 0

    # (the sums below run over map(mul, ...): the same products summed in the same order as
    # the written-out generator expressions, without a Python frame per term)
    def residual(self, x: Sequence[float]) -> float:
        return sum(map(mul, self.theta, x))

    def update(self, y: float, base: float, x: Sequence[float]) -> None:
        n, P = self.dim, self.P
        pred = base + self.residual(x)
        err = y - pred
        if self.clip > 0:
            denom = max(abs(pred), 1e-9)
            if abs(err) / denom > self.clip:
                lim = self.clip * denom
                err = max(-lim, min(lim, err))
        px = [sum(map(mul, row, x)) for row in P]  # P x
        xp = [sum(map(mul, x, col)) for col in zip(*P)]  # x'P
        den = max(self.forget + sum(map(mul, x, px)), 1e-12)
        g = [v / den for v in px]
        for i in range(n):
            self.theta[i] += g[i] * err
        lam = self.forget
        self.P = [[(p - gi * xj) / lam for p, xj in zip(row, xp)] for row, gi in zip(P, g)]
        self.updates += 1


class ALPPredictor:
    """T0 table + 4-feature RLS residual, with the artifact's sample selection."""

    def __init__(self, table: dict[int, float] | None, candidates: Sequence[int] | None = None,
                 forget: float = FORGET, p0: float = P0, clip: float = CLIP,
                 scales: Sequence[float] = SCALES, bias: float = BIAS,
                 warmup_updates: int = WARMUP_UPDATES, bucket: int = BUCKET) -> None:
        self.candidates = sorted(candidates or candidate_chunks())
        self.table = table
        self.scales = tuple(float(s) for s in scales)
        self.bias = bias
        self.warmup_updates = warmup_updates
        self.bucket = bucket
        self.rls = RLS(4, forget, p0, clip)

    @classmethod
    def from_profile(cls, profile: Callable[[int], float] | None, candidates: Sequence[int] | None = None,
                     **kw) -> "ALPPredictor":
        """Profile every candidate; any infeasible one means no table (artifact 4.2)."""
        cands = sorted(candidates or candidate_chunks())
        table = None
        if profile is not None:
            vals = {c: profile(c) for c in cands}
            if all(v is not None and math.isfinite(v) and v > 0 for v in vals.values()):
                table = {c: max(float(v), 1e-9) for c, v in vals.items()}
        return cls(table, cands, **kw)

    # -- model --
    def features(self, decode_ctx: float, prefill_sq: float, prefill_prefix: float) -> tuple[float, ...]:
        s0, s1, s2 = self.scales
        return (decode_ctx / s0, prefill_sq / s1, prefill_prefix / s2, self.bias)

    def predict(self, chunk: int, decode_ctx: float = 0.0, prefill_sq: float = 0.0,
                prefill_prefix: float = 0.0) -> float | None:
        """Predicted iteration time (s) for `chunk`, or None when the table is missing."""
        if self.table is None or chunk not in self.table:
            return None
        x = self.features(decode_ctx, prefill_sq, prefill_prefix)
        return max(self.table[chunk] + self.rls.residual(x), 1e-9)

    def update(self, y: float, chunk: int, decode_ctx: float, prefill_sq: float, prefill_prefix: float) -> bool:
        if y <= 0 or self.table is None or self.table.get(chunk, 0.0) <= 0:
            return False
        self.rls.update(y, self.table[chunk], self.features(decode_ctx, prefill_sq, prefill_prefix))
        return True

    @property
    def updates(self) -> int:
        return self.rls.updates

    # -- sample selection (dynamic_chunk_controller.py, section 4.4) --
    def update_chunk(self, tokens: int) -> int:
        """u(N): the smallest candidate >= N, else the largest."""
        cands = self.candidates
        i = bisect_left(cands, tokens)
        return cands[i] if i < len(cands) else cands[-1]

    def _score(self, b: BatchInfo) -> float:
        if self.rls.updates < self.warmup_updates:
            return float(b.decode_ctx + b.prefill_sq + b.prefill_prefix)
        return self.rls.residual(self.features(b.decode_ctx, b.prefill_sq, b.prefill_prefix))

    def select_snapshot(self, batches: Sequence[BatchInfo | None]) -> BatchInfo | None:
        """The heaviest in-flight micro-batch, or None when none is a prefill (no sample)."""
        # (called every iteration: plain loops, the slot order only when there is a tie)
        live: list[BatchInfo] = []
        prefill = False
        for b in batches:
            if b is not None and b.num_tokens > 0:
                live.append(b)
                if b.mode != "decode":
                    prefill = True
        if not prefill:
            return None
        # u(N) grows with N, so the top bucket is that of the largest batch
        top = self.update_chunk(max(b.num_tokens for b in live))
        tied = [b for b in live if self.update_chunk(b.num_tokens) == top]
        if len(tied) == 1:
            return tied[0]
        tied.sort(key=attrgetter("slot"))
        return max(tied, key=self._score)  # NOTE: max keeps the first (lowest slot) on ties

    def sample(self, current: BatchInfo | None, inflight: Sequence[BatchInfo | None]) -> tuple | None:
        """(u, D, S, X) of the training sample this iteration would give, or None."""
        snap = self.select_snapshot(inflight)
        if snap is None or current is None:
            return None
        b = self.bucket
        if ((snap.num_tokens - 1) // b + 1) * b != ((current.num_tokens - 1) // b + 1) * b:
            return None
        return (self.update_chunk(snap.num_tokens), snap.decode_ctx, snap.prefill_sq, snap.prefill_prefix)

    def observe(self, current: BatchInfo | None, inflight: Sequence[BatchInfo | None], iteration_s: float) -> bool:
        """The post-step hook: one RLS update when the iteration yields a sample."""
        s = self.sample(current, inflight)
        if s is None or iteration_s <= 0:
            return False
        return self.update(iteration_s, *s)
