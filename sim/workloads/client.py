"""The benchmark client's loop: how many requests it keeps in flight, think time, timeouts.

These `[workload]` fields work with every kind; the kind gives the request list (lengths, and
for open-loop runs the send times) and the client decides when each request is really sent:

- `concurrency = N`: a closed loop of N clients (genai-perf `--concurrency`; vLLM `vllm bench
  serve --request-rate inf --max-concurrency N`; SGLang `bench_serving --request-rate inf
  --max-concurrency N`). Every request is ready at t = 0 and the list is consumed in order: a
  client sends the next unsent request as soon as its previous one has finished (and, with
  `think_time`, after a think time drawn for that request). The kind's arrival times are
  ignored.
- `max_concurrency = N`: the cap vLLM and SGLang put on an open-loop client: request i is
  ready at its arrival time (the kind's arrival process) and waits, first come first served,
  for one of N slots (`async with semaphore: ... request_func(...)`, `asyncio.Semaphore(
  max_concurrency)` in vLLM `vllm/benchmarks/serve.py` `benchmark` and SGLang
  `python/sglang/bench_serving.py` `benchmark`). The request's clock starts when it is sent
  (both clients set `st = time.perf_counter()` inside `request_func`), so the wait for a slot
  is not in its TTFT or E2E.
- `think_time = {distribution = "exponential" | "constant", mean_s = X}` (with `concurrency`
  only): the pause between a client's request finishing and its next one.
- `request_timeout_s = T`: the client gives up on a request T seconds after sending it (aiohttp
  `ClientTimeout(total=T)`; both clients default to 6 h, `AIOHTTP_TIMEOUT` / `BENCH_AIOHTTP_
  TIMEOUT_SECONDS`). A request not finished by then is failed (`success = False`: left out of
  every latency and throughput metric, counted in `failed`); its slot is freed. The server keeps
  computing it: PipeSim does not model the abort a disconnect triggers in both engines (vLLM
  0.11.0 `vllm/entrypoints/utils.py` `with_cancellation` cancels the handler, which aborts the
  request; SGLang 0.5.4 `srt/managers/tokenizer_manager.py` `_wait_one_response` calls
  `abort_request` once `request.is_disconnected()`), so a run with timeouts carries more load
  than the real server would after them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from sim.core.errors import ConfigError
from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

CLIENT_KEYS = ("concurrency", "max_concurrency", "think_time", "request_timeout_s")
THINK_DISTRIBUTIONS = ("exponential", "constant")
MAX_CLIENTS = 10**6


@dataclass(frozen=True)
class ClientSpec:
    """A run's client loop (see the module's docstring); None fields: not set."""

    concurrency: int | None = None  # closed loop of N clients
    max_concurrency: int | None = None  # cap on in-flight requests of an open-loop client
    think_distribution: str = "exponential"
    think_mean_s: float = 0.0
    request_timeout_s: float | None = None

    @property
    def slots(self) -> int | None:
        """How many requests may be in flight at once (None: no limit)."""
        return self.concurrency if self.concurrency is not None else self.max_concurrency

    @property
    def drives_arrivals(self) -> bool:
        """Whether send times depend on completions (the engine must run the client)."""
        return self.slots is not None

    def ready_s(self, arrival_s: "np.ndarray") -> "np.ndarray":
        """When each request is ready to be sent: t = 0 in a closed loop, else its arrival."""
        return np.zeros(len(arrival_s)) if self.concurrency is not None else np.asarray(arrival_s, dtype=float)

    def think_s(self, num: int, rng) -> "np.ndarray":
        """The think time after each request (by its row), drawn from the run's `think` stream."""
        if self.think_mean_s <= 0:
            return np.zeros(num)
        if self.think_distribution == "constant":
            return np.full(num, self.think_mean_s)
        return rng.exponential(self.think_mean_s, size=num)


def _positive_int(params: Mapping[str, Any], key: str, where: str) -> int | None:
    v = params.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_CLIENTS:
        raise ConfigError(f"{where}: field {key!r} must be an integer in [1, {MAX_CLIENTS}], got {v!r}")
    return v


def client_of(params: Mapping[str, Any], where: str = "config [workload]") -> ClientSpec | None:
    """The client fields of a (resolved) [workload] table, or None when it sets none."""
    if not any(k in params for k in CLIENT_KEYS):
        return None
    conc = _positive_int(params, "concurrency", where)
    cap = _positive_int(params, "max_concurrency", where)
    if conc is not None and cap is not None:
        raise ConfigError(f"{where}: fields 'concurrency' (a closed loop) and 'max_concurrency' (a cap on an "
                          f"open-loop client) exclude each other; allowed: one of them")
    think = params.get("think_time")
    dist, mean = "exponential", 0.0
    if think is not None:
        if conc is None:
            raise ConfigError(f"{where}: field 'think_time' needs 'concurrency' (a closed loop: a client thinks "
                              f"between its requests)")
        if not isinstance(think, dict) or set(think) - {"distribution", "mean_s"}:
            raise ConfigError(f"{where}: field 'think_time' must be a table {{distribution = "
                              f"{' | '.join(THINK_DISTRIBUTIONS)}, mean_s = X}}, got {think!r}")
        dist = think.get("distribution", "exponential")
        if dist not in THINK_DISTRIBUTIONS:
            raise ConfigError(f"{where}: field 'think_time.distribution' must be one of "
                              f"{', '.join(THINK_DISTRIBUTIONS)}; got {dist!r}")
        mean = think.get("mean_s", 0.0)
        if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not 0 <= mean < math.inf:
            raise ConfigError(f"{where}: field 'think_time.mean_s' must be a finite number >= 0, got {mean!r}")
    timeout = params.get("request_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < math.inf):
        raise ConfigError(f"{where}: field 'request_timeout_s' must be a finite number > 0, got {timeout!r}")
    return ClientSpec(conc, cap, dist, float(mean), None if timeout is None else float(timeout))
