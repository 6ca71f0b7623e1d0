"""Guards that hold plug-in policies to the API's rules at run time (sim/policies/API.md).

A built-in policy is used as built; a plug-in's (its registry origin is not "built-in") is
wrapped so that a bad return value or an exception becomes a one-line `PluginError` naming the
plug-in and the rule it broke.
"""

from __future__ import annotations

from sim.core.errors import PluginError
from sim.core.registry import BUILT_IN, first_line


def build_chunk_policy(name: str, params: dict, context, where: str):
    """Build a chunk policy; a plug-in's is wrapped so that it keeps the API's rules."""
    from sim.policies.base import chunk_policies

    policy = chunk_policies.build(name, where=where, context=context, **params)
    origin = chunk_policies.origin(name)
    if origin == BUILT_IN:
        return policy
    return GuardedChunkPolicy(policy, f"chunk policy {name!r} ({origin})", context.context_length_tokens)


def build_rebalancer(name: str, params: dict, context, where: str):
    from sim.policies.base import rebalancers

    reb = rebalancers.build(name, where=where, context=context, **params)
    origin = rebalancers.origin(name)
    if origin == BUILT_IN:
        return reb
    return GuardedRebalancer(reb, f"rebalancer {name!r} ({origin})")


def _call(label: str, fn, method: str, *args):
    try:
        return fn(*args)
    except PluginError:
        raise
    except SystemExit as exc:  # would end ppsim with the plug-in's exit code and no outputs
        raise PluginError(f"{label} called sys.exit({exc.code!r}) in {method}(); rule: a policy returns "
                          f"its decision, it never exits") from None
    except Exception as exc:
        raise PluginError(f"{label} raised {type(exc).__name__} in {method}(): {first_line(exc)}") from exc


class GuardedChunkPolicy:
    """A plug-in chunk policy with its calls checked: a chunk must be an integer in
    [1, context length], `decide` must return a ChunkDecision or None, and an exception
    becomes a one-line PluginError naming the plug-in."""

    def __init__(self, inner, label: str, limit_tokens: int) -> None:
        self.inner = inner
        self.label = label
        self.limit_tokens = limit_tokens
        if callable(getattr(inner, "observe", None)):
            self.observe = self._observe  # the engine calls observe only when a policy has it

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _check(self, chunk, method: str) -> int:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= self.limit_tokens:
            raise PluginError(f"{self.label}: {method}() returned chunk {chunk!r}; rule: a chunk is an integer "
                              f"in [1, {self.limit_tokens}] (the context length)")
        return chunk

    def initial_chunk(self) -> int:
        return self._check(_call(self.label, self.inner.initial_chunk, "initial_chunk"), "initial_chunk")

    def decide(self, view):
        from sim.policies.base import ChunkDecision

        d = _call(self.label, self.inner.decide, "decide", view)
        if d is None:
            return None
        if not isinstance(d, ChunkDecision):
            raise PluginError(f"{self.label}: decide() returned {type(d).__name__}; rule: decide returns "
                              f"a sim.policies.ChunkDecision or None")
        self._check(d.chunk, "decide")
        return d

    def _observe(self, view, current, inflight, iteration_s) -> None:
        _call(self.label, self.inner.observe, "observe", view, current, inflight, iteration_s)


class GuardedRebalancer:
    """A plug-in rebalancer with its moves checked: each is a Move that pauses a request of
    the current slot's running batch or resumes a paused one."""

    def __init__(self, inner, label: str) -> None:
        self.inner = inner
        self.label = label

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def rebalance(self, view):
        from sim.policies.base import Move

        moves = _call(self.label, self.inner.rebalance, "rebalance", view)
        if moves is None:
            return []
        moves = list(moves) if isinstance(moves, (list, tuple)) else moves
        if not isinstance(moves, list):
            raise PluginError(f"{self.label}: rebalance() returned {type(moves).__name__}; rule: a list of Moves")
        running, pending = set(view.running_ids()), set(view.pending_ids())
        for m in moves:
            if not isinstance(m, Move):
                raise PluginError(f"{self.label}: rebalance() returned {type(m).__name__} in its list; "
                                  f"rule: a list of sim.policies.Move")
            src, dst = (running, pending) if m.to_pending else (pending, running)
            if m.req_id not in src:
                raise PluginError(f"{self.label}: rebalance() {'pauses' if m.to_pending else 'resumes'} request "
                                  f"{m.req_id}, which is not {'running in the current slot' if m.to_pending else 'paused'}; "
                                  f"rule: pause only running requests of the current slot, resume only paused ones")
            src.discard(m.req_id)
            dst.add(m.req_id)
        return moves
