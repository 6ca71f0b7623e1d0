"""`greedy`: FastPP's rule-based dynamic chunk controller (DCP_greedy).

fastpp-system-model.md sections 2 and 3 (dynamic_chunk_controller.py `decide_chunk_greedy`).
Also home of the machinery both controllers share (section 2): the drained signal window,
the KV watermark and the safety guard.
"""

from __future__ import annotations

from sim.core.lazy import lazy

import math

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError
from sim.policies.base import ChunkDecision, chunk_policies


class SignalWindow:
    """The controller's TTFT/TPOT signals (section 2.2): tumbling-window means of the samples
    produced since the previous drain, the previous value kept when a window is empty; both
    start at half the SLOs. The engine's sample logs are append-only, so draining is a cursor."""

    def __init__(self, slo_ttft_s: float, slo_tpot_s: float, stat: str = "mean") -> None:
        if stat not in ("mean", "p90"):
            raise ConfigError(f"signal_stat must be 'mean' or 'p90', got {stat!r}")
        self.ttft = 0.5 * slo_ttft_s
        self.tpot = 0.5 * slo_tpot_s
        self.stat = stat
        self._ttft_at = 0
        self._tpot_at = 0

    def _agg(self, xs) -> float:
        return float(np.mean(xs)) if self.stat == "mean" else float(np.percentile(xs, 90))

    def peek_ttft(self, view) -> tuple[float, ...]:
        return view.ttft_samples(self._ttft_at)

    def drain(self, view) -> tuple[int, int]:
        """Consume the new samples and update the signals; returns (#ttft, #tpot) consumed."""
        ttft = view.ttft_samples(self._ttft_at)
        tpot = view.tpot_samples(self._tpot_at)
        self._ttft_at += len(ttft)
        self._tpot_at += len(tpot)
        if ttft:
            self.ttft = self._agg(ttft)
        if tpot:
            self.tpot = self._agg(tpot)
        return len(ttft), len(tpot)


def watermark_chunk(counts, rule: str = "artifact", step: int = 128) -> int:
    """The chunk under KV pressure (section 2.3).

    artifact: 128*(floor((min_s count_s + 64)/128) + 1), the smallest multiple of 128 above
    min + 64; paper: the smallest multiple of `step` above the largest per-slot count."""
    counts = list(counts) or [0]
    if rule == "artifact":
        return ((min(counts) + 64) // 128 + 1) * 128
    if rule == "paper":
        return (max(counts) // step + 1) * step
    raise ConfigError(f"watermark_rule must be 'artifact' or 'paper', got {rule!r}")


def safety_guard(chunk: int, batches, counts) -> tuple[int, bool]:
    """Section 2.4: if the chunk is <= any slot's last-batch size, take
    128*(floor(max_s count_s/128) + 1) (may exceed the 2048 maximum). Returns (chunk, fired)."""
    if any(b is not None and chunk <= b.num_reqs for b in batches):
        return (max(counts, default=0) // 128 + 1) * 128, True
    return chunk, False


def check_positive(name: str, value, integer: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if integer:
        ok = ok and isinstance(value, int)
    if not ok:
        raise ConfigError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")


@chunk_policies.register("greedy")
class GreedyChunk:
    """Greedy DCP: every pp batch-steps, move the chunk by one step on the TTFT/TPOT signals.

    Rules, first match (c = current chunk, R = restore memory, P = kv_free < kv_free_threshold
    with kv_free = (free - sum_s |last_batch[s]|) / capacity):
      1. P: watermark chunk ("watermark");
      2. R set: c' = R ("restore");
      3. tpot > 1.08 SLO_TPOT ("tpot_high") or ttft < 0.1 SLO_TTFT ("ttft_low"): c - 128, >= 128;
      4. ttft > 0.3 SLO_TTFT and tpot < 0.85 SLO_TPOT ("ttft_high"): c + 128, <= 2048;
      5. else keep ("hold").
    Then the safety guard ("+safety_guard"), then the restore memory update. A decision needs
    at least one new TTFT sample; without one nothing is drained ("no_ttft").

    Params (artifact defaults): step_tokens 128, min_chunk_tokens 128, max_chunk_tokens 2048,
    tpot_violation_ratio 1.08, ttft_low_ratio 0.1, ttft_high_ratio 0.3, tpot_safe_ratio 0.85,
    kv_free_threshold 0.10. Options (paper variants): watermark_rule "artifact" | "paper"
    (smallest step multiple above the largest per-slot count), signal_stat "mean" | "p90",
    decide_every_steps (default: pp).
    """

    def __init__(self, context, step_tokens: int = 128, min_chunk_tokens: int = 128,
                 max_chunk_tokens: int = 2048, tpot_violation_ratio: float = 1.08,
                 ttft_low_ratio: float = 0.1, ttft_high_ratio: float = 0.3, tpot_safe_ratio: float = 0.85,
                 kv_free_threshold: float = 0.10, watermark_rule: str = "artifact",
                 signal_stat: str = "mean", decide_every_steps: int | None = None) -> None:
        for n in ("step_tokens", "min_chunk_tokens", "max_chunk_tokens"):
            check_positive(n, locals()[n], integer=True)
        for n in ("tpot_violation_ratio", "ttft_low_ratio", "ttft_high_ratio", "tpot_safe_ratio"):
            check_positive(n, locals()[n])
        watermark_chunk([0], watermark_rule)  # validates the name
        self.ctx = context
        self.step, self.lo, self.hi = step_tokens, min_chunk_tokens, max_chunk_tokens
        self.r_viol, self.r_low, self.r_high, self.r_safe = (tpot_violation_ratio, ttft_low_ratio,
                                                              ttft_high_ratio, tpot_safe_ratio)
        self.kv_th = kv_free_threshold
        self.watermark_rule = watermark_rule
        self.every = decide_every_steps or context.num_stages
        check_positive("decide_every_steps", self.every, integer=True)
        self.signals = SignalWindow(context.slo_ttft_s, context.slo_tpot_s, signal_stat)
        self.restore: int | None = None

    def initial_chunk(self) -> int:
        return self.ctx.launch_chunk_tokens

    @property
    def decides_every_steps(self) -> int:
        """`decide` returns None unless view.step is a multiple of this: the engine need not
        build a view for it at the other steps."""
        return self.every

    def decide(self, view) -> ChunkDecision | None:
        if view.step % self.every != 0:
            return None
        sig, c = self.signals, view.chunk_size
        if not sig.peek_ttft(view):
            # NOTE: the artifact puts the drained TPOT samples back: we simply do not drain.
            return ChunkDecision(c, "no_ttft", sig.ttft, sig.tpot)
        sig.drain(view)
        batches = view.last_batches()
        counts = [b.num_reqs if b is not None else 0 for b in batches]
        kv_free = (view.kv_free_tokens - sum(counts)) / view.kv_capacity_tokens
        slo_ttft, slo_tpot = self.ctx.slo_ttft_s, self.ctx.slo_tpot_s
        restore, pressure = self.restore, kv_free < self.kv_th
        if pressure:
            new, reason = watermark_chunk(counts, self.watermark_rule, self.step), "watermark"
        elif restore is not None:
            new, reason = restore, "restore"
        elif sig.tpot > slo_tpot * self.r_viol or sig.ttft < slo_ttft * self.r_low:
            new = max(c - self.step, self.lo)
            reason = "tpot_high" if sig.tpot > slo_tpot * self.r_viol else "ttft_low"
        elif sig.ttft > slo_ttft * self.r_high and sig.tpot < slo_tpot * self.r_safe:
            new, reason = min(c + self.step, self.hi), "ttft_high"
        else:
            new, reason = c, "hold"
        new, fired = safety_guard(new, batches, counts)
        if fired:
            reason += "+safety_guard"
        if pressure:
            if restore is None and new < c:
                self.restore = c
            elif restore is not None and new >= restore:
                self.restore = None
        elif restore is not None and new == restore:
            self.restore = None
        return ChunkDecision(new, reason, sig.ttft, sig.tpot)
