"""The scheduler's host (CPU) time per step, modelled from what the step does, per engine version
(vLLM V1 and SGLang 0.5; the other engines keep the latency profile's host cost).

A serving engine's step is GPU work plus host work on the critical path: the scheduler walking
its queues, allocating KV blocks (and, with prefix caching, hashing them), preparing the step's
inputs, and reading the sampled tokens back. That host time grows with the step's requests and
blocks, and an engine that overlaps it with the GPU (vLLM's asynchronous scheduling, SGLang's
overlap scheduler) shows only what exceeds the previous step's GPU time (sim/engine/pipeline.py).

    host_ms = step_ms + per_request_us * requests / 1e3 + per_block_us * blocks / 1e3

- requests: the step's scheduled requests (prefill pieces and decodes);
- blocks: KV blocks the step allocates, ceil(prefill tokens / block) per prefill piece's worth of
  tokens plus one per `block_size` decodes on average (a decode opens a block every
  `block_size` tokens); each is taken from the free queue and, with prefix caching, hashed and
  entered in the cached-block table (vLLM V1 `block_pool.py` `get_new_blocks`,
  `cache_full_blocks`, `kv_cache_utils.py` `hash_block_tokens`).

With overlap, at least `exposed_ms` stays on the critical path (the launch of a step after the
previous one's tokens are known), however long the previous GPU step.

What the constants come from, per version (`HOST_COSTS`, each entry's `source`):
- vLLM V1 issue #10634 / PR #11133 (Dec 2024, V1 with AsyncLLM, Llama-2-7B, ShareGPT, batch
  256): 5-6 ms between two decode steps on the host, so about 20 us a request once a fixed part
  of 0.5 ms is taken off; with asynchronous scheduling (PR #11133) the gap fell to 150-170 us
  with CUDA graphs: `exposed_ms` 0.16.
- The fixed part (`step_ms` 0.5) is not published apart from the per-request one; it is an
  assumption, bounded by vLLM PR #17866 (V1, Llama-3.2-1B, one request at a time: TPOT 2.64 ms
  with the GPU step and all host work, a fast decode-input path saving 10% of it).
- `per_block_us` 2.0: vLLM 0.10.1.1's per-block work (hash_block_tokens' builtin hash of
  (parent, 16 token ids, None), a BlockHash, a free-queue pop, a cached-block insert) replicated
  in CPython and timed on the shared 2-core VM PipeSim is developed on: 7-9 us of CPU time a
  block on cores several times slower than a current server's; 2 us is taken.
- SGLang 0.5 (`managers/scheduler.py` `event_loop_overlap`, 0.5.23): per step the scheduler ingests
  requests, forms the batch (`get_next_batch_to_run`: the prefill adder's radix-cache match per
  waiting request, or the decode batch's filter and `prepare_for_decode`), prepares and launches
  it (`run_batch`), and processes the previous batch's tokens (`process_batch_result`: a Python
  walk over its requests, finish checks, the output to the detokenizer). The KV pool is token-
  granular (page_size 1): a step's slots come from one slice of the allocator's free list
  (`mem_cache/allocator/token.py` `TokenToKVPoolAllocator.alloc`), no per-block work
  (`per_block_us` 0). Constants:
  - per step and request together: SGLang PR #5608 (Apr 2025, ~0.4.5, Llama-3.1-8B TP4, a
    decode server at 16 running requests): the overlap loop took the decode log's throughput
    from 3053.86 to 3458.31 tok/s, 16 / 3053.86 - 16 / 3458.31 = 0.61 ms a step that the GPU no
    longer waits for, so `step_ms + 16 x per_request_us` = 0.61 ms;
  - `per_request_us` 5: the FastPP artifact's fork of SGLang 0.4.1 calibrated on its A100
    machine (profiles/README.md: `cpu_per_request_us` fitted to 5 us, its range's lower bound),
    so `step_ms` = 0.61 - 0.08 = 0.53 ms;
  - a check, not a fit: SGLang's v0.4 blog (Dec 2024) and PR #1738 (Llama-3.1-8B, 3,000 ShareGPT
    prompts at once) report about 1.1x throughput from the overlap, host time about 9% of a
    non-overlapped step; at 256 running requests this model gives 0.53 + 1.28 = 1.81 ms beside
    the 13.6 ms decode step of PipeSim's H100 Llama-3.1-8B profile: 12%, 1.13x;
  - overlap (`exposed_ms` 0): the blog's Nsight trace shows no GPU idle time between consecutive
    decode batches (Triton backend; a "minor gap" with FlashInfer), so nothing is kept exposed.
  The uncertainty is about 2x: PR #5608's server also polls its KV transfers each step (more
  host work than a colocated server), the per-request part is the lower bound of an older fork's
  fit on another CPU, and the fixed part of a non-overlapped step fitted on the FastPP machine
  was 1.17 ms (with its PP token broadcast).
NOTE: the frontend's per-request work (HTTP, tokenizing, detokenizing, streaming) is not counted
here (it runs in the API server process, not the engine's step loop); vLLM V0 and FastPP keep the
profile's host cost (`[overhead] cpu_ms` + `[ground_truth] cpu_per_request_us`), the calibration
of the 2024-era engines their validation cases ran (no per-version measurement was found to
replace it). `[server] host_time = "profile"` makes every engine keep the profile's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class HostCost:
    """One engine version's host time per step (module docstring)."""

    step_ms: float  # per step, whatever it runs
    per_request_us: float  # per scheduled request (prefill piece or decode)
    per_block_us: float  # per KV block the step allocates
    exposed_ms: float = 0.0  # with overlap: the part never hidden under the previous GPU step
    block_size_tokens: int = 16
    source: str = ""

    def blocks(self, st: Any) -> float:
        """KV blocks a step allocates: its prefill tokens' blocks, and its decodes' share of one
        block per `block_size_tokens` tokens."""
        b = self.block_size_tokens
        return -(-int(st.prefill_tokens) // b) + st.num_decode / b

    def host_s(self, st: Any) -> float:
        """Host time (s) of a step running `st` (a BatchStats)."""
        return (self.step_ms * 1e3 + self.per_request_us * float(st.num_prefill + st.num_decode)
                + self.per_block_us * self.blocks(st)) / 1e6

    def with_block_size(self, block_size_tokens: int) -> "HostCost":
        return replace(self, block_size_tokens=int(block_size_tokens))


_V1_SOURCE = ("vLLM issue #10634 / PR #11133 (V1, batch 256: 5-6 ms host gap a decode step; 150-170 us with "
              "async scheduling); step_ms assumed (PR #17866 bounds it); per_block_us timed (hosttime.py)")
_V1 = HostCost(step_ms=0.5, per_request_us=20.0, per_block_us=2.0, exposed_ms=0.16, source=_V1_SOURCE)

_SGLANG_SOURCE = ("SGLang PR #5608 (decode at 16 requests: 0.61 ms a step hidden by the overlap loop); "
                  "per_request_us the FastPP SGLang-0.4.1 fork's A100 fit (profiles/README.md); exposed_ms 0: "
                  "SGLang v0.4 blog (no GPU idle between overlapped decode batches)")
_SGLANG_05 = HostCost(step_ms=0.53, per_request_us=5.0, per_block_us=0.0, exposed_ms=0.0, block_size_tokens=1,
                      source=_SGLANG_SOURCE)

# (engine, version) -> its host cost; an engine version absent here keeps the profile's host cost.
HOST_COSTS: dict[tuple[str, str], HostCost] = {
    ("vllm-v1", "0.10"): _V1,
    ("vllm-v1", "0.11"): _V1,
    ("vllm-v1", "0.15"): _V1,
    ("sglang", "0.5"): _SGLANG_05,
}


def host_cost(engine: str, version: str) -> HostCost | None:
    """The host cost of `engine` at `version` (a key of its VERSIONS), or None: the profile's."""
    return HOST_COSTS.get((engine, version))
