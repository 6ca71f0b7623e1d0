"""Plug-in protocols for the scheduler's policies.

Policies are timeless: the engine calls them at the artifact's points with a read-only view
of the scheduler state (`sim.engine.view.SchedulerView`) and applies what they return. They
never import simpy, never hold the environment, and never mutate engine state; any memory
they need (cursors into the sample logs, restore values, RLS state) is their own.

- `ChunkPolicy.decide(view)` runs at the top of every scheduler iteration, before the
  micro-batch is formed (the artifact's `decide_chunk_size`). It returns None when its
  cadence did not fire, else a `ChunkDecision` (the engine then also publishes the
  rebalancer's metrics, as the artifact's `sync_chunk_size` does).
- `ChunkPolicy.observe(view, current, inflight, iteration_s)` (optional) runs after every
  iteration that launched a micro-batch (the artifact's post-step hook), with the launched
  batch, the batches in flight at that iteration (one per stage, None where empty) and the
  iteration's wall time.
- `Rebalancer.rebalance(view)` runs for the current slot after its previous micro-batch is
  merged and before prefill admission; it returns the requests to pause or resume, in order.

Factories are called as `factory(context=PolicyContext, **params)`.

This module, `SchedulerView`'s public members (`sim/engine/view.py`) and the registries'
`register(name)` are the public plug-in API, documented in `API.md`; `API_VERSION` changes
whenever any of them changes in a way a plug-in could notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from sim.core.registry import Registry

# 1: the first published API (Protocols, PolicyContext with context_length_tokens, view fields).
API_VERSION = 1


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know at construction: the deployment and the SLOs, and a way to
    profile the server at start-up the way the artifact does (a black box: the wall time of
    one steady-state iteration where every stage holds a pure c-token prefill)."""

    num_stages: int
    slo_ttft_s: float
    slo_tpot_s: float
    launch_chunk_tokens: int
    kv_capacity_tokens: int
    startup_profile: Callable[[int], float] | None = None
    context_length_tokens: int = 16384  # a chunk must lie in [1, context_length_tokens]


@dataclass(frozen=True, slots=True)
class ChunkDecision:
    """A decision point of a chunk controller (its cadence fired)."""

    chunk: int  # the chunk size to use from the next micro-batch on
    reason: str
    ttft_signal_s: float | None = None  # the controller's current signals, published for
    tpot_signal_s: float | None = None  # the rebalancer as the artifact broadcasts them


class ChunkPolicy(Protocol):
    def initial_chunk(self) -> int:
        """The chunk size (tokens) at launch and after a reset."""

    def decide(self, view) -> ChunkDecision | None:
        """A decision when the policy's cadence fires, else None."""


@dataclass(frozen=True, slots=True)
class Move:
    """Pause (`to_pending=True`) or resume one request of the current slot."""

    req_id: int
    to_pending: bool
    at_head: bool  # insert at the head (True) or the tail of the destination list


class Rebalancer(Protocol):
    def rebalance(self, view) -> list[Move]:
        """Requests to move between the current slot's running batch and the pending list."""


chunk_policies: Registry = Registry("chunk policy", required=("initial_chunk", "decide"), group="pipesim.chunk_policies")
rebalancers: Registry = Registry("rebalancer", required=("rebalance",), group="pipesim.rebalancers")
