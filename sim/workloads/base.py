"""The workload contract: a fully materialised, time-ordered list of requests.

A workload is built once, before the run, so every policy compared under the same seed sees
identical arrivals (common random numbers). Each workload *kind* is a builder registered by
name; a named workload is a TOML file in the repository's `workloads/` folder that picks a
kind and its parameters, and a run config may override any of those parameters.
"""

from __future__ import annotations

from sim.core.lazy import lazy

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError
from sim.core.registry import Registry


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the client sends it: arrival time and token lengths."""

    req_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # the prompt's identity for prefix caching: (piece id, tokens) pairs in order, e.g. a
    # Mooncake trace's hash_ids or a conversation's earlier turns (sim/engine/prefix_cache.py)
    prefix: tuple | None = None


class WorkloadBuilder(Protocol):
    """Builds the requests of one workload kind.

    `params` is the merged parameter table (workload file + run-config overrides) without
    the `kind`/`name`/`description` keys; `seed` is the run seed (use `sim.core.rng.stream`);
    `where` names the source for error messages (file path or 'config [workload]').
    Returns requests sorted by arrival time, with req_id 0..n-1 in that order.
    """

    def __call__(self, params: Mapping[str, Any], *, seed: int, where: str) -> list[RequestSpec]: ...


# The longest prompt or output a request may carry (tokens): far beyond any model's context (a
# prompt longer than the run's context is truncated and said so), small enough for the engine's
# 32-bit token columns. A trace row beyond it is refused as a data error.
MAX_REQUEST_TOKENS = 2**31 - 1

def output_piece(rid: int) -> int:
    """The piece id of request `rid`'s output: a conversation's next turn names its reply so
    (sim/workloads/conversations.py), and the engines' prefix caches cache the output under it
    (sim/engine/schedulers/cached.py); negative, so it never meets a trace's hash ids."""
    return -(rid + 1)


def prompt_piece(rid: int) -> int:
    """A piece id for request `rid`'s prompt when its workload names none: vLLM V1 hashes every
    request's blocks, so a preempted request re-hits its own (sim/engine/schedulers/vllm_v1.py);
    below every output piece (`output_piece`, ids down to -2**31), so it never meets one."""
    return -(2**32) - rid


workload_kinds: Registry[Callable[..., list[RequestSpec]]] = Registry("workload kind")

# What the builder of the workload being built changed of its input (rows or conversations it
# skipped, dropped or cut), one line each naming the file: `ppsim run` prints every line as a
# warning on stderr and writes it to summary.json's `warnings` (sim.workloads.build_workload_said).
_CHANGES: ContextVar[list | None] = ContextVar("workload_changes", default=None)


def said_change(text: str) -> None:
    """Record one change a builder made to its input (see `_CHANGES`); outside
    `build_workload_said` nobody listens, and the line goes nowhere."""
    changes = _CHANGES.get()
    if changes is not None and text not in changes:
        changes.append(text)

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKLOADS_DIR = REPO_ROOT / "workloads"


def poisson_arrivals(num: int, rate_rps: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times as the artifact's benchmark sends them: first at t=0, then exponential
    gaps with mean 1/rate (no clipping). rate = inf sends everything at t=0."""
    if num <= 0:
        return np.zeros(0)
    if np.isinf(rate_rps):
        return np.zeros(num)
    gaps = rng.exponential(1.0 / rate_rps, size=num - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def make_requests(arrivals_s, prompts, outputs, prefixes=None) -> list[RequestSpec]:
    """Zip arrays into RequestSpecs ordered by arrival (stable, so ties keep input order);
    `prefixes`, aligned with the inputs, gives each request's prefix identity."""
    order = np.argsort(np.asarray(arrivals_s, dtype=float), kind="stable")
    arr = np.asarray(arrivals_s, dtype=float)[order]
    pr = np.asarray(prompts)[order]
    out = np.asarray(outputs)[order]
    if prefixes is None:
        return [RequestSpec(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arr, pr, out))]
    pre = [prefixes[k] for k in order.tolist()]
    return [RequestSpec(i, float(a), int(p), int(o), x) for i, (a, p, o, x) in enumerate(zip(arr, pr, out, pre))]


def require(params: Mapping[str, Any], key: str, typ, where: str, *, positive: bool = False):
    """Fetch a required parameter with a type check and a one-line error."""
    if key not in params:
        raise ConfigError(f"{where}: missing field {key!r}")
    val = params[key]
    ok_types = (int, float) if typ is float else (typ,)
    if isinstance(val, bool) or not isinstance(val, ok_types):
        raise ConfigError(f"{where}: field {key!r} must be {typ.__name__}, got {val!r}")
    if positive and not val > 0:
        raise ConfigError(f"{where}: field {key!r} must be > 0, got {val!r}")
    if typ is float and val != val:  # NaN compares false with everything
        raise ConfigError(f"{where}: field {key!r} must be a number, got nan")
    if typ is float and val == float("inf") and key != "rate_rps":  # inf is a documented rate only (all at t=0)
        raise ConfigError(f"{where}: field {key!r} must be finite, got inf")
    return typ(val) if typ is float else val
