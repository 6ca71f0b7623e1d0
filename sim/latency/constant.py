"""A constant-time latency model for tests and queueing sanity checks.

Every non-empty micro-batch costs `stage_ms` on every stage, whatever its tokens; the
iteration overhead is `overhead_ms`. With one stage this makes the server an M/D/1 queue
when at most one request runs at a time.
"""

from __future__ import annotations

from sim.core.errors import ConfigError
from sim.latency.base import BatchStats, StepTime, latency_models


@latency_models.register("constant")
class ConstantLatencyModel:
    def __init__(self, num_stages: int, stage_ms: float, overhead_ms: float = 0.0) -> None:
        if stage_ms <= 0 or overhead_ms < 0:
            raise ConfigError("latency 'constant': stage_ms must be > 0 and overhead_ms >= 0")
        self.num_stages = num_stages
        self.stage_s = stage_ms / 1e3
        self.iteration_overhead_s = overhead_ms / 1e3

    def stage_time(self, stats: BatchStats, stage: int) -> StepTime:
        busy = self.stage_s if stats.num_tokens > 0 else 0.0
        return StepTime(busy, 0.0, 0.0, 0.0)

    def stage_times(self, stats: BatchStats) -> tuple[float, ...]:
        busy = self.stage_s if stats.num_tokens > 0 else 0.0
        return (busy,) * self.num_stages

    def kv_capacity_tokens(self, *_args, **_kwargs) -> int | None:
        return None
