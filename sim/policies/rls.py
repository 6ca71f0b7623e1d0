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


class RLS4:
    """`RLS` with four features, written out: the same floats from the same operations in the
    same order (sums from 0.0, left to right; `max`/`min` keep the first of equals), held as
    plain attributes so that the compiled module (sim/native.py) updates them without a list
    or a boxed float. ALP updates once per iteration; `tests/test_policies_rls.py` checks it
    against `RLS(4)` bit for bit."""

    def __init__(self, forget: float = FORGET, p0: float = P0, clip: float = CLIP) -> None:
        self.dim = 4
        self.forget, self.p0, self.clip = float(forget), float(p0), float(clip)
        self.reset()

    def reset(self) -> None:
        self.t0 = self.t1 = self.t2 = self.t3 = 0.0
        p0 = self.p0
        self.p00, self.p01, self.p02, self.p03 = p0, 0.0, 0.0, 0.0
        self.p10, self.p11, self.p12, self.p13 = 0.0, p0, 0.0, 0.0
        self.p20, self.p21, self.p22, self.p23 = 0.0, 0.0, p0, 0.0
        self.p30, self.p31, self.p32, self.p33 = 0.0, 0.0, 0.0, p0
        self.updates = 0

    @property
    def theta(self) -> list[float]:
        return [self.t0, self.t1, self.t2, self.t3]

    @theta.setter
    def theta(self, values: Sequence[float]) -> None:
        self.t0, self.t1, self.t2, self.t3 = (float(v) for v in values)

    @property
    def P(self) -> list[list[float]]:
        return [[self.p00, self.p01, self.p02, self.p03], [self.p10, self.p11, self.p12, self.p13],
                [self.p20, self.p21, self.p22, self.p23], [self.p30, self.p31, self.p32, self.p33]]

    def residual(self, x: Sequence[float]) -> float:
        x0, x1, x2, x3 = x
        return 0.0 + self.t0 * x0 + self.t1 * x1 + self.t2 * x2 + self.t3 * x3

    def update(self, y: float, base: float, x: Sequence[float]) -> None:
        x0, x1, x2, x3 = x
        pred = base + self.residual(x)
        err = y - pred
        clip = self.clip
        if clip > 0:
            denom = abs(pred)
            if 1e-9 > denom:
                denom = 1e-9
            if abs(err) / denom > clip:
                lim = clip * denom
                m = err if err < lim else lim  # min(lim, err)
                err = m if m > -lim else -lim  # max(-lim, m)
        p00, p01, p02, p03 = self.p00, self.p01, self.p02, self.p03
        p10, p11, p12, p13 = self.p10, self.p11, self.p12, self.p13
        p20, p21, p22, p23 = self.p20, self.p21, self.p22, self.p23
        p30, p31, p32, p33 = self.p30, self.p31, self.p32, self.p33
        px0 = 0.0 + p00 * x0 + p01 * x1 + p02 * x2 + p03 * x3  # P x
        px1 = 0.0 + p10 * x0 + p11 * x1 + p12 * x2 + p13 * x3
        px2 = 0.0 + p20 * x0 + p21 * x1 + p22 * x2 + p23 * x3
        px3 = 0.0 + p30 * x0 + p31 * x1 + p32 * x2 + p33 * x3
        xp0 = 0.0 + x0 * p00 + x1 * p10 + x2 * p20 + x3 * p30  # x'P
        xp1 = 0.0 + x0 * p01 + x1 * p11 + x2 * p21 + x3 * p31
        xp2 = 0.0 + x0 * p02 + x1 * p12 + x2 * p22 + x3 * p32
        xp3 = 0.0 + x0 * p03 + x1 * p13 + x2 * p23 + x3 * p33
        den = self.forget + (0.0 + x0 * px0 + x1 * px1 + x2 * px2 + x3 * px3)
        if 1e-12 > den:
            den = 1e-12
        g0, g1, g2, g3 = px0 / den, px1 / den, px2 / den, px3 / den
        self.t0 += g0 * err
        self.t1 += g1 * err
        self.t2 += g2 * err
        self.t3 += g3 * err
        lam = self.forget
        self.p00, self.p01 = (p00 - g0 * xp0) / lam, (p01 - g0 * xp1) / lam
        self.p02, self.p03 = (p02 - g0 * xp2) / lam, (p03 - g0 * xp3) / lam
        self.p10, self.p11 = (p10 - g1 * xp0) / lam, (p11 - g1 * xp1) / lam
        self.p12, self.p13 = (p12 - g1 * xp2) / lam, (p13 - g1 * xp3) / lam
        self.p20, self.p21 = (p20 - g2 * xp0) / lam, (p21 - g2 * xp1) / lam
        self.p22, self.p23 = (p22 - g2 * xp2) / lam, (p23 - g2 * xp3) / lam
        self.p30, self.p31 = (p30 - g3 * xp0) / lam, (p31 - g3 * xp1) / lam
        self.p32, self.p33 = (p32 - g3 * xp2) / lam, (p33 - g3 * xp3) / lam
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
        self.rls = RLS4(forget, p0, clip)

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
