"""Serving engines' schedulers, a plug-in kind: one module each, chosen by `[scheduler] engine`.

| engine | module | what it models (source read, version) |
|---|---|---|
| `fastpp` (default) | `fastpp.py` | the FastPP artifact's fork of SGLang 0.4.1, radix cache off |
| `sglang` | `sglang.py` | SGLang 0.5.23: prefill-first steps, radix cache, overlap scheduler |
| `vllm-v1` | `vllm_v1.py` | vLLM 0.10.1.1's V1 scheduler: one token budget, running first, prefix caching |
| `vllm-v0` | `vllm_v0.py` | vLLM 0.6.3's V0 scheduler: prefill-only steps; chunked prefill above 32K contexts |

An engine is an object with the `Engine` protocol: it resolves the config's engine defaults
for the hardware (`settings`), sizes the KV pool as the engine does (`pool`), and builds one
scheduler per replica (`build`). Every scheduler has the interface the lock-step pipeline
drives (sim/engine/pipeline.py): `add_waiting`, `form_batch`, `process_result`, `is_idle`,
and the state the policies' views read (sim/engine/view.py). The engines' knobs and their
defaults, with the source each comes from, are in sim/engine/schedulers/README.md.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Protocol

from sim.core.errors import ConfigError
from sim.core.registry import Registry


@dataclass(frozen=True)
class Hardware:
    """What an engine's defaults depend on: the GPU's memory and name, the deployment shape."""

    gpu_spec: str = ""  # e.g. "a100-pcie-40gb", "h100-sxm-80gb"; "" when the latency model has none
    gpu_mem_gib: float = 0.0
    tp: int = 1
    pp: int = 1


@dataclass(frozen=True)
class EngineSettings:
    """An engine's resolved settings for one run (the config's values, or the engine's defaults)."""

    engine: str
    token_budget: int  # tokens per step: FastPP's chunk, SGLang's chunked_prefill_size, vLLM's max_num_batched_tokens
    max_running: int  # 0: derived from the KV pool (`pool`)
    prefix_cache: bool
    cuda_graphs: bool
    overlap: bool
    capture_sizes: tuple[int, ...] = ()  # CUDA-graph batch sizes a small batch is padded to
    pad_total_tokens: bool = False  # vLLM V1 pads the step's total tokens; SGLang/V0 pad decode rows
    prefill_capture_sizes: tuple[int, ...] = ()  # token buckets a prefill step is padded to (SGLang 0.5.23, pp = 1)
    version: str = ""
    note: str = ""  # for the console header


class Engine(Protocol):
    name: str

    def settings(self, sc: Any, hw: Hardware) -> EngineSettings: ...

    def build(self, settings: EngineSettings, num_slots: int, kv_tokens: int, max_running: int,
              chunk_size: int, on_kv_exhausted: str, sc: Any) -> Any: ...


schedulers: Registry = Registry("scheduler engine", required=("settings", "build"), group="pipesim.schedulers")


def engine(name: str, where: str = "config [scheduler] engine") -> Engine:
    return schedulers.build(name, where=where)


def pick_version(name: str, versions: dict[str, str], default: str, asked: str) -> str:
    """The engine version a config asks for (`[scheduler] engine_version`; "" = `default`, the
    release the engine's module was read from), refused with the known list when not modelled."""
    key = asked or default
    if key not in versions:
        raise ConfigError(f"config [scheduler] engine_version = {asked!r} for engine {name!r} is not modelled; "
                          f"known: {', '.join(f'{k} ({v})' for k, v in versions.items())}")
    return key


def pad_to(sizes: tuple[int, ...], n: int) -> int:
    """The smallest captured size >= n (a CUDA graph is replayed at that size); n itself when
    n exceeds every captured size (the batch runs eagerly, unpadded)."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else n


# Importing the engine modules registers them (each registers its `Engine` at its end).
from sim.engine.schedulers import fastpp as _fastpp  # noqa: E402,F401
from sim.engine.schedulers import sglang as _sglang  # noqa: E402,F401
from sim.engine.schedulers import vllm_v1 as _vllm_v1  # noqa: E402,F401
from sim.engine.schedulers import vllm_v0 as _vllm_v0  # noqa: E402,F401
