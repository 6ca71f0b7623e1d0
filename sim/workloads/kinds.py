"""Workload kinds: how arrivals and lengths are generated.

- `poisson`: Poisson arrivals at `rate_rps` over `num_requests` (prompt, output) pairs taken
  from a length source (`lengths`, see `sim.workloads.lengths`): explicit pairs, a committed
  fitted quantile table, the ShareGPT model, or clipped lognormals.
- `trace`: rows of a trace CSV, Poisson or timestamp replay (see `sim.workloads.trace`).
- `synthetic-uniform`: Poisson arrivals, prompt and output lengths uniform in given ranges.
"""

from __future__ import annotations

from sim.core.lazy import lazy

from typing import Any, Mapping

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError
from sim.core.rng import stream
from sim.workloads.base import MAX_REQUEST_TOKENS, make_requests, poisson_arrivals, require, workload_kinds
from sim.workloads.lengths import sample_lengths

# Importing the modules registers the `trace` kind (it lives in its own module for its size)
# and its file formats (sim.workloads.readers).
from sim.workloads import trace as _trace  # noqa: F401,E402
from sim.workloads import readers as _readers  # noqa: F401,E402
from sim.workloads import conversations as _conversations  # noqa: F401,E402


POISSON_KEYS = ("rate_rps", "num_requests", "lengths")
UNIFORM_KEYS = ("rate_rps", "num_requests", "input_range", "output_range")


def check_keys(params: Mapping[str, Any], allowed: tuple[str, ...], kind: str, where: str) -> None:
    """Unknown fields are refused (a typo like `rate=6` must not run at the old rate)."""
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r} for kind {kind!r}; allowed: {', '.join(sorted(allowed))}")


@workload_kinds.register("poisson")
def build_poisson(params: Mapping[str, Any], *, seed: int, where: str):
    """Poisson arrivals at `rate_rps` over lengths from a source (see `sim.workloads.lengths`).
    `lengths.source = "pairs"` takes the lists in order (cycling if `num_requests` is larger),
    as the artifact reuses a fixed request set; the sampled sources need `num_requests`."""
    check_keys(params, POISSON_KEYS, "poisson", where)
    rate = require(params, "rate_rps", float, where, positive=True)
    num = params.get("num_requests")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num <= 0):
        raise ConfigError(f"{where}: field 'num_requests' must be a positive integer, got {num!r}")
    prompts, outputs = sample_lengths(params.get("lengths", {}), num, stream(seed, "lengths"), where)
    arrivals = poisson_arrivals(len(prompts), rate, stream(seed, "arrivals"))
    return make_requests(arrivals, prompts, outputs)


@workload_kinds.register("synthetic-uniform")
def build_uniform(params: Mapping[str, Any], *, seed: int, where: str):
    """Input and output lengths uniform (inclusive) in [lo, hi], Poisson arrivals."""
    check_keys(params, UNIFORM_KEYS, "synthetic-uniform", where)
    rate = require(params, "rate_rps", float, where, positive=True)
    num = require(params, "num_requests", int, where, positive=True)
    ranges = {}
    for key in ("input_range", "output_range"):
        rng_ = params.get(key)
        if (
            not isinstance(rng_, list)
            or len(rng_) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in rng_)
            or not 0 < rng_[0] <= rng_[1] <= MAX_REQUEST_TOKENS
        ):
            raise ConfigError(f"{where}: field {key!r} must be [lo, hi] with 0 < lo <= hi <= {MAX_REQUEST_TOKENS}, got {rng_!r}")
        ranges[key] = rng_
    lengths_rng = stream(seed, "lengths")
    prompts = lengths_rng.integers(ranges["input_range"][0], ranges["input_range"][1] + 1, size=num)
    outputs = lengths_rng.integers(ranges["output_range"][0], ranges["output_range"][1] + 1, size=num)
    arrivals = poisson_arrivals(num, rate, stream(seed, "arrivals"))
    return make_requests(arrivals, prompts, outputs)
