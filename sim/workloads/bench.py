"""The `bench` workload kind: requests as `vllm bench serve` and SGLang's `bench_serving` make them.

Lengths (`dataset`):

- `random`: `input_len`, `output_len`, `range_ratio` with the client's definition named by
  `range_ratio_definition` (the two clients differ):
  - `"vllm"` (`vllm/benchmarks/datasets.py`, `RandomDataset.get_sampling_params`, 0.11.0):
    input uniform on the integers [floor(I (1 - r)), ceil(I (1 + r))], output on
    [max(floor(O (1 - r)), 1), ceil(O (1 + r))], 0 <= r < 1; the prompt is a fixed random prefix
    of `prefix_len` tokens (`get_prefix`, the same for every request) followed by the sampled
    input (`generate_token_sequence`: total = prefix_len + input_len).
  - `"sglang"` (`python/sglang/bench_serving.py`, `sample_random_requests`, 0.5.4): input on
    [max(int(I r), 1), I], output on [int(O r), O], 0 <= r <= 1 (r = 1: exact lengths; SGLang's
    default r = 0 spreads lengths from 1 to the given length). A drawn output of 0 tokens
    becomes 1 (a server returns at least one token). No prefix.
  Both draw with numpy, vLLM with a Generator's `integers`, SGLang with the legacy
  `np.random.randint`; here both draw from the run's `lengths` stream, so the lengths have the
  client's distribution, not its exact values for a given `--seed`.
- `sharegpt`: the committed ShareGPT first-turn model (sim/workloads/lengths.py), with
  `output_len` fixing every output length (vLLM `--sharegpt-output-len`, SGLang
  `--sharegpt-output-len`).

`ignore_eos` (default true): every output ends at its target, as with the clients'
`--ignore-eos` / `ignore_eos = true`. Without it a real model may stop earlier, where PipeSim
cannot know; `ignore_eos = false` is refused (replay the output lengths a log recorded instead).

Arrivals (`arrivals`, sim/workloads/arrivals.py): `poisson` (SGLang's), `gamma` with
`burstiness` (vLLM's, rescaled to num / rate), `constant`, `staged` (`stages = [[rate, s], ...]`);
`ramp` (vLLM's `--ramp-up-strategy`: `ramp_strategy = "linear" | "exponential"`, `ramp_start_rps`,
`ramp_end_rps`, optional `burstiness`); `rate_rps` (default inf: every request ready at t = 0). The client loop (`concurrency`,
`max_concurrency`, `request_timeout_s`) is sim/workloads/client.py.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from sim.core.errors import ConfigError
from sim.core.lazy import lazy
from sim.core.rng import stream
from sim.workloads import arrivals as arr
from sim.workloads.base import MAX_REQUEST_TOKENS, RequestSpec, workload_kinds
from sim.workloads.lengths import sample_lengths

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

BENCH_KEYS = ("num_requests", "dataset", "input_len", "output_len", "range_ratio", "range_ratio_definition",
              "prefix_len", "ignore_eos", "arrivals", "rate_rps", "burstiness", "stages", "ramp_strategy",
              "ramp_start_rps", "ramp_end_rps")
DATASETS = ("random", "sharegpt")
DEFINITIONS = ("vllm", "sglang")
_BASE = 1 << 62  # piece ids in [2^62, 2^63): beyond a trace's hash ids, positive (outputs are negative)


def _piece_id(seed: int, *key: int) -> int:
    return _BASE | (hash((seed, -7, *key)) & (_BASE - 1))


def _int(params, key, default, where, lo=1, hi=MAX_REQUEST_TOKENS):
    v = params.get(key, default)
    if v is None:
        raise ConfigError(f"{where}: missing field {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{where}: field {key!r} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _float(params, key, default, where, lo, hi, *, hi_open=False, inf_ok=False):
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise ConfigError(f"{where}: field {key!r} must be a number, got {v!r}")
    if math.isinf(v) and inf_ok and v > 0:
        return float(v)
    if not (lo <= v < hi if hi_open else lo <= v <= hi) or math.isinf(v):
        rng_ = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
        raise ConfigError(f"{where}: field {key!r} must be in {rng_}, got {v!r}")
    return float(v)


def random_lengths(num: int, input_len: int, output_len: int, ratio: float, definition: str, rng):
    """(inputs, outputs) of the clients' random dataset (see the module's docstring)."""
    if definition == "vllm":
        in_lo, in_hi = math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio))
        out_lo, out_hi = max(math.floor(output_len * (1 - ratio)), 1), math.ceil(output_len * (1 + ratio))
    else:
        in_lo, in_hi = max(int(input_len * ratio), 1), input_len
        out_lo, out_hi = int(output_len * ratio), output_len
    inputs = rng.integers(in_lo, in_hi + 1, size=num)
    outputs = rng.integers(out_lo, out_hi + 1, size=num)
    return inputs, outputs


@workload_kinds.register("bench")
def build_bench(params: Mapping[str, Any], *, seed: int, where: str) -> list[RequestSpec]:
    extra = sorted(set(params) - set(BENCH_KEYS))
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r} for kind 'bench'; allowed: "
                          f"{', '.join(sorted(BENCH_KEYS))}, and the client's concurrency, max_concurrency, "
                          f"think_time, request_timeout_s")
    if params.get("ignore_eos", True) is not True:
        raise ConfigError(f"{where}: field 'ignore_eos' = {params['ignore_eos']!r}: PipeSim ends every output at "
                          f"its target length; allowed: true (replay a log's recorded output lengths instead)")
    process = params.get("arrivals", "poisson")
    if process not in arr.PROCESSES:
        raise ConfigError(f"{where}: field 'arrivals' must be one of {', '.join(arr.PROCESSES)}; got {process!r}")
    stages = arr.parse_stages(params.get("stages"), where) if process == "staged" else None
    if process != "staged" and "stages" in params:
        raise ConfigError(f"{where}: field 'stages' needs arrivals = 'staged', got arrivals = {process!r}")
    if process == "staged" and "rate_rps" in params:
        raise ConfigError(f"{where}: field 'rate_rps' with arrivals = 'staged': the stages give the rates")
    if process not in ("gamma", "ramp") and "burstiness" in params:
        raise ConfigError(f"{where}: field 'burstiness' needs arrivals = 'gamma' or 'ramp' (vLLM's --burstiness), "
                          f"got arrivals = {process!r}")
    ramp_spec = None
    ramp_keys = ("ramp_strategy", "ramp_start_rps", "ramp_end_rps")
    if process == "ramp":
        strategy = params.get("ramp_strategy", "linear")
        if strategy not in arr.RAMPS:
            raise ConfigError(f"{where}: field 'ramp_strategy' must be one of {', '.join(arr.RAMPS)}; got {strategy!r}")
        ramp_spec = (strategy, _float(params, "ramp_start_rps", None, where, 1e-9, 1e9),
                     _float(params, "ramp_end_rps", None, where, 1e-9, 1e9))
        if "rate_rps" in params:
            raise ConfigError(f"{where}: field 'rate_rps' with arrivals = 'ramp': ramp_start_rps and ramp_end_rps "
                              f"give the rates")
    elif any(k in params for k in ramp_keys):
        raise ConfigError(f"{where}: fields {', '.join(ramp_keys)} need arrivals = 'ramp', got arrivals = {process!r}")
    rate = _float(params, "rate_rps", math.inf, where, 1e-9, math.inf, inf_ok=True)
    burst = _float(params, "burstiness", 1.0, where, 1e-6, 1e6)
    num = params.get("num_requests")
    if num is not None or process != "staged":
        num = _int(params, "num_requests", num, where, 1, 10**8)
    dataset = params.get("dataset", "random")
    if dataset not in DATASETS:
        raise ConfigError(f"{where}: field 'dataset' must be one of {', '.join(DATASETS)}; got {dataset!r}")
    # a staged run without num_requests sends as many as its stages bring
    send_s = arr.draw(process, num, stream(seed, "arrivals"), rate_rps=rate, burstiness=burst, stages=stages,
                      ramp_spec=ramp_spec, where=where)
    n = len(send_s)
    if n == 0:
        raise ConfigError(f"{where}: the stages bring no request; allowed: longer stages or higher rates")
    rng = stream(seed, "lengths")
    prefix_len = 0
    if dataset == "random":
        for key in ("input_len", "output_len"):
            if key not in params:
                raise ConfigError(f"{where}: missing field {key!r} (dataset = 'random')")
        inp = _int(params, "input_len", None, where)
        out = _int(params, "output_len", None, where)
        definition = params.get("range_ratio_definition", "vllm")
        if definition not in DEFINITIONS:
            raise ConfigError(f"{where}: field 'range_ratio_definition' must be one of {', '.join(DEFINITIONS)}; "
                              f"got {definition!r}")
        ratio = _float(params, "range_ratio", 0.0, where, 0.0, 1.0, hi_open=definition == "vllm")
        prefix_len = _int(params, "prefix_len", 0, where, 0)
        if prefix_len and definition != "vllm":
            raise ConfigError(f"{where}: field 'prefix_len' is vLLM's --random-prefix-len; SGLang's random "
                              f"dataset has none; allowed: range_ratio_definition = 'vllm'")
        prompts, outputs = random_lengths(n, inp, out, ratio, definition, rng)
    else:
        for key in ("input_len", "range_ratio", "range_ratio_definition", "prefix_len"):
            if key in params:
                raise ConfigError(f"{where}: field {key!r} is for dataset = 'random'")
        prompts, outputs = sample_lengths({"source": "sharegpt"}, n, rng, where)
        if "output_len" in params:
            outputs = np.full(n, _int(params, "output_len", None, where))
    outputs = np.maximum(outputs, 1)
    specs = []
    for i in range(n):
        p = int(prompts[i]) + prefix_len
        pieces = ((_piece_id(seed, 0), prefix_len), (_piece_id(seed, 1, i), int(prompts[i]))) if prefix_len else None
        specs.append(RequestSpec(i, float(send_s[i]), p, int(outputs[i]), pieces))
    return specs
