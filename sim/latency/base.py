"""The latency-model contract: how long one stage takes to run one micro-batch.

The engine summarises a micro-batch as `BatchStats` (sim/latency/batchstats.py: the sums the attention and linear
terms need) and asks the model for per-stage times. A model returns the time of every stage
of the pipeline for that micro-batch (the lock-step engine combines the stages of different
micro-batches), split into linear, attention, communication and overhead seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.core.registry import Registry
from sim.latency.batchstats import BatchStats

__all__ = ["BatchStats", "StepTime", "LatencyModel", "latency_models"]


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
