"""The client settings of a benchmark log, as `ppsim validate` replays them.

A vLLM result JSON (`vllm bench serve --save-result`, `vllm/benchmarks/serve.py` `main`, 0.11.0)
writes `request_rate` (a number or "inf"), `burstiness` and `max_concurrency` (None when unset),
and `ramp_up_strategy` / `ramp_up_start_rps` / `ramp_up_end_rps` only when a ramp-up ran. An
SGLang result line (`python/sglang/bench_serving.py` `benchmark`, 0.5.4) writes `request_rate`
("trace" with `--use-trace-timestamps`) and `max_concurrency`, and no `burstiness`.

Replayed: the arrival process each client draws (sim/workloads/arrivals.py: vLLM's gamma gaps,
rescaled so the last send is at n / rate; SGLang's Poisson with the first request at t = 0) and
`max_concurrency` as the first-come-first-served cap both clients put on in-flight requests
(sim/workloads/client.py), and a vLLM ramp-up (sim/workloads/arrivals.py `ramp`). Refused, with
the setting named: what PipeSim cannot reproduce (SGLang's trace timestamps, a ramp from 0).
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.core.errors import DataError
from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)


def refuse_unreproducible(path: Path, line: int, rec: dict) -> None:
    """A one-line refusal naming the client setting this replay cannot reproduce."""
    strategy = rec.get("ramp_up_strategy")
    if strategy is not None:
        start, end = rec.get("ramp_up_start_rps"), rec.get("ramp_up_end_rps")
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in (start, end))
        if strategy not in ("linear", "exponential") or not ok:
            raise DataError(f"{path}: line {line}: field 'ramp_up_strategy' = {strategy!r} with ramp_up_start_rps "
                            f"{start!r}, ramp_up_end_rps {end!r}: replayed only as 'linear' or 'exponential' from "
                            f"a start > 0 (vLLM's first gap would divide by a rate of 0)")
    if isinstance(rec.get("request_rate"), str) and rec["request_rate"].lower() == "trace":
        raise DataError(f"{path}: line {line}: field 'request_rate' = 'trace' (SGLang --use-trace-timestamps): "
                        f"the trace's timestamps are not in the log; allowed: a log with a numeric rate or inf "
                        f"(or replay the trace itself with `ppsim run --trace`)")


def max_concurrency(path: Path, line: int, rec: dict) -> int | None:
    """The log's `max_concurrency` (None: not set)."""
    v = rec.get("max_concurrency")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DataError(f"{path}: line {line}: field 'max_concurrency' must be a positive integer or null, got {v!r}")
    return v


def client_of(rec: dict) -> str:
    """Which client wrote the record: vLLM's writes `burstiness`, SGLang's does not."""
    return "vllm" if "burstiness" in rec else "sglang"


def ramp_of(rec: dict) -> tuple[str, float, float] | None:
    """A vLLM log's ramp-up (strategy, start rps, end rps), or None."""
    if rec.get("ramp_up_strategy") is None:
        return None
    return rec["ramp_up_strategy"], float(rec["ramp_up_start_rps"]), float(rec["ramp_up_end_rps"])


def log_arrivals(client: str, num: int, rate: float, burstiness: float, rng,
                 ramp: tuple[str, float, float] | None = None) -> "np.ndarray":
    """The send times the log's client would draw (before any max_concurrency wait)."""
    from sim.workloads import arrivals

    if ramp is not None:
        return arrivals.ramp(num, ramp[0], ramp[1], ramp[2], burstiness, rng)
    if client == "vllm":
        return arrivals.gamma(num, rate, burstiness, rng)
    return arrivals.poisson(num, rate, rng)


def describe(client: str, rate: float, burstiness: float, cap: int | None,
             ramp: tuple[str, float, float] | None = None) -> str:
    """The header's arrival line."""
    text = "inf (all at t=0)" if math.isinf(rate) else f"{rate:g} req/s"
    if ramp is not None:
        text = f"vLLM's {ramp[0]} ramp-up from {ramp[1]:g} to {ramp[2]:g} req/s (gamma gaps, burstiness {burstiness:g})"
        rate = math.inf  # (the ramp's line replaces the rate's)
    if ramp is None and client == "vllm" and not math.isinf(rate):
        text = (f"Poisson {text}" if burstiness == 1.0 else f"gamma gaps (burstiness {burstiness:g}) at {text}")
        text += ", vLLM's draw (rescaled to end at n / rate)"
    elif ramp is None and not math.isinf(rate):
        text = f"Poisson {text}"
    text += " from the run seed (the real run's own draws are not in the log)"
    if cap:
        text += f"; max_concurrency = {cap} (first come, first served, as the client's semaphore)"
    return text
