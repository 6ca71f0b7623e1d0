"""The latency-model contract: how long one stage takes to run one micro-batch.

The engine summarises a micro-batch as `BatchStats` (the sums the attention and linear
terms need) and asks the model for per-stage times. A model returns the time of every stage
of the pipeline for that micro-batch (the lock-step engine combines the stages of different
micro-batches), split into linear, attention, communication and overhead seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.core.registry import Registry


class BatchStats:
    """Token-level summary of one micro-batch (what every latency term depends on).

    - `prefill_tokens`: new tokens of all prefill pieces (chunks and whole prompts);
    - `num_prefill`: number of prefill pieces;
    - `sum_c2`: sum over prefill pieces of new_tokens^2;
    - `sum_cp`: sum over prefill pieces of new_tokens * prefix_tokens;
    - `num_decode`: decode requests (one token each);
    - `sum_decode_ctx`: sum over decode requests of their context length (prompt + output);
    - `pad_tokens`: padding rows of a CUDA-graph replay (linear layers only; 0 when eager).
    """

    __slots__ = ("prefill_tokens", "num_prefill", "sum_c2", "sum_cp", "num_decode", "sum_decode_ctx", "pad_tokens")

    def __init__(
        self,
        prefill_tokens: int = 0,
        num_prefill: int = 0,
        sum_c2: int = 0,
        sum_cp: int = 0,
        num_decode: int = 0,
        sum_decode_ctx: int = 0,
    ) -> None:
        self.prefill_tokens = prefill_tokens
        self.num_prefill = num_prefill
        self.sum_c2 = sum_c2
        self.sum_cp = sum_cp
        self.num_decode = num_decode
        self.sum_decode_ctx = sum_decode_ctx
        # rows a CUDA graph pads the batch with (the engines' captured sizes): the linear layers
        # compute them, attention does not (sim/engine/schedulers/, EngineSettings.capture_sizes)
        self.pad_tokens = 0

    @property
    def num_tokens(self) -> int:
        """Tokens the linear layers see: prefill tokens + one per decode request."""
        return self.prefill_tokens + self.num_decode

    @classmethod
    def prefill(cls, chunk: int, prefix: int = 0) -> "BatchStats":
        return cls(chunk, 1, chunk * chunk, chunk * prefix, 0, 0)

    @classmethod
    def decode(cls, num: int, context: int) -> "BatchStats":
        return cls(0, 0, 0, 0, num, num * context)

    def key(self) -> tuple[int, ...]:
        return (self.prefill_tokens, self.num_prefill, self.sum_c2, self.sum_cp, self.num_decode, self.sum_decode_ctx)

    def __repr__(self) -> str:
        return "BatchStats(" + ", ".join(f"{k}={getattr(self, k)}" for k in self.__slots__) + ")"


@dataclass(frozen=True, slots=True)
class StepTime:
    """One stage's time for one micro-batch, in seconds."""

    linear_s: float
    attention_s: float
    comm_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.comm_s + self.overhead_s


class LatencyModel(Protocol):
    """Ground-truth timing of a (possibly TP-sharded) pipeline of `num_stages` stages.

    - `stage_time(stats, stage)`: the split time of `stage` (0-based) for one micro-batch;
      an empty micro-batch (no tokens) costs 0.
    - `stage_times(stats)`: totals for every stage, seconds (the engine's fast path).
    - `iteration_overhead_s`: time charged once per lock-step iteration on the critical
      path (scheduler CPU work, last-stage token broadcast).
    """

    num_stages: int
    iteration_overhead_s: float

    def stage_time(self, stats: BatchStats, stage: int) -> StepTime: ...

    def stage_times(self, stats: BatchStats) -> tuple[float, ...]: ...


latency_models: Registry = Registry("latency model")
