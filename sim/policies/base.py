"""Plug-in protocols for the scheduler's policies.

Policies are timeless: the engine calls them at the artifact's points with a read-only view
of the scheduler state (`sim.engine.view.SchedulerView`) and applies what they return. They
never import simpy, never hold the environment, and never mutate engine state.

- `ChunkPolicy.decide(view)` runs at the top of every scheduler iteration, before the
  micro-batch is formed (as the artifact's `decide_chunk_size`); it returns the new chunk
  size in tokens, or None to keep the current one. A policy keeps its own cadence.
- `Rebalancer.rebalance(view)` runs for the current slot after its previous micro-batch is
  merged and before prefill admission; it returns the requests to pause or resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.registry import Registry


class ChunkPolicy(Protocol):
    def initial_chunk(self) -> int:
        """The chunk size (tokens) at launch and after a reset."""

    def decide(self, view) -> int | None:
        """New chunk size for the next micro-batch, or None to keep the current one."""


@dataclass(frozen=True, slots=True)
class Move:
    """Pause (`to_pending=True`) or resume one request of the current slot."""

    req_id: int
    to_pending: bool
    at_head: bool  # where it is inserted in the destination list


class Rebalancer(Protocol):
    def rebalance(self, view) -> list[Move]:
        """Requests to move between the current slot's running batch and the pending list."""


chunk_policies: Registry = Registry("chunk policy")
rebalancers: Registry = Registry("rebalancer")
