"""The frontend's share of a request: the API server's time between the client and the scheduler.

No engine step contains it. On the way in, the server receives the HTTP request, validates it,
tokenizes the prompt and hands it to the scheduler's process; on the way out, each output chunk
crosses back from the scheduler's process, is detokenized and written to the client as one
server-sent event. The model (inputs: prompt tokens, engine and its version, the CPU's speed):

    request in:  the server receives it at send + http_request_s; the tokenizer is one FIFO
                 server (start_i = max(received_i, end_{i-1}), end_i = start_i + prompt_i x
                 tokenize_s_per_token); the scheduler sees it at end_i + ipc_in_hops x ipc_hop_s
    chunk out:   a chunk of m tokens reaches the client ipc_out_hops x ipc_hop_s + m x
                 detok_passes x detok_s_per_token + stream_chunk_s after the engine emitted its
                 last token

Every cost is divided by `cpu_speed` (1.0: the reference CPUs the constants were measured on).

Why a FIFO tokenizer: vLLM 0.11's API server tokenizes on one thread
(`vllm/entrypoints/openai/serving_engine.py`, `ThreadPoolExecutor(max_workers=1)` behind
`AsyncMicrobatchTokenizer`); SGLang 0.5.4's `TokenizerManager._tokenize_texts`
(`srt/managers/tokenizer_manager.py`) calls the tokenizer inside the server's event loop. Either
way one prompt is tokenized at a time, in arrival order.

Why these hops: vLLM V1 sends the request to the EngineCore process over one ZMQ socket and reads
its outputs back over one (`vllm/v1/engine/async_llm.py` `output_handler`, which detokenizes with
the tokenizers library's `DecodeStream`, `vllm/v1/engine/detokenizer.py`
`FastIncrementalDetokenizer`): one hop each way, one decode pass a token. SGLang's scheduler sends
token ids to the DetokenizerManager process, which sends text to the TokenizerManager
(`srt/managers/detokenizer_manager.py` `handle_batch_token_id_out`, two `batch_decode` calls a
step: the surrounding and the read text): two hops out, two decode passes a token.

Streaming chunks (`stream_interval`): the first token is sent at once, then a chunk whenever
`stream_interval` tokens are unsent, and the rest at the finish (vLLM 0.15.1
`vllm/v1/engine/output_processor.py` `RequestState.make_request_output`; SGLang 0.5.4
`scheduler_output_processor_mixin.py`: output when `len(output_ids) % stream_interval == 1`,
and 0.5.23's `output_streamer.py`, the same chunks): chunks end at tokens 1, 1 + k, 1 + 2k, ...
and the last. Default 1 everywhere (vLLM 0.15.1 `SchedulerConfig.stream_interval = 1`; SGLang
`ServerArgs.stream_interval = 1`); vLLM 0.10 and 0.11 have no such setting (every step's token is
sent).

The clients record one gap a chunk (vLLM `vllm bench serve`,
`vllm/benchmarks/lib/endpoint_request_func.py`: `output.itl.append(timestamp -
most_recent_timestamp)`; SGLang `bench_serving`'s OpenAI backends alike), or, SGLang
`bench_serving --backend sglang` (`async_request_sglang_generate`), the chunk's gap divided over
its tokens (`adjust_itl`, one entry a token): `itl = "chunk" | "token"`.

Sources of the constants (reference CPUs; each is a published measurement, none fitted here):

- tokenize_s_per_token = 2.07 us: huggingface/tokenizers PR #1582 (2024-07-31), the Llama-3.1
  tokenizer on one thread, ten short documents: 1.93 MB/s; at 4 bytes a token (Charles Xu,
  "3.3x Faster HuggingFace Tokenizers for Single Sequence", charlesxu.io/parallel-tokenizer,
  2025: 4 MB ~ 1M tokens in 1.1 s, i.e. 1.1 us a token on his CPU, the faster bound).
- detok_s_per_token = 1.18 us: sgl-project/sglang PR #9427 (2025-08), the tokenizers
  `DecodeStream` on one thread: 845,171 tokens/s.
- ipc_hop_s = 0.15 ms: uw-syfi/vibesys PR #421 (2026), SGLang's TokenizerManager-to-scheduler
  pickle/IPC hop measured at 0.1-0.2 ms.
- http_request_s = 67 us and stream_chunk_s = 50 us: FastAPI on uvicorn serves about 15,000-
  20,000 JSON requests a second on one worker (TechEmpower-style figures collected at
  cyyeh.github.io/skills-playground/examples/system-explorer/fastapi/performance.html): a request
  at the slow end, a streamed JSON chunk at the fast end.

Uncertain: each constant within about 2x (the two tokenizer measurements differ by 1.9x); chat
templates, the API server's contention under many concurrent streams (vLLM's output handler
walks every request of a step in turn), and the engine process's wake-up after idle are not in
it. At a 1,000-token prompt it adds about 2.3 ms (vLLM V1) or 2.4 ms (SGLang) before the first
schedule and 0.2-0.4 ms a chunk; the 13-25 ms by which real vLLM V1 first tokens exceed the
engine's steps (issue 41) are mostly not explained by it.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.lazy import lazy

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

ITL_MODES = ("chunk", "token")

HTTP_REQUEST_S = 1 / 15_000
STREAM_CHUNK_S = 1 / 20_000
TOKENIZE_S_PER_TOKEN = 4 / 1.93e6  # 4 bytes a token at 1.93 MB/s
DETOK_S_PER_TOKEN = 1 / 845_171
IPC_HOP_S = 0.15e-3


@dataclass(frozen=True)
class FrontendCosts:
    """One engine's API-server path (see the module's docstring), at the reference CPU."""

    http_request_s: float
    tokenize_s_per_token: float
    ipc_in_hops: int
    ipc_out_hops: int
    ipc_hop_s: float
    detok_passes: int
    detok_s_per_token: float
    stream_chunk_s: float
    stream_interval_settable: bool  # whether the release has a stream_interval setting


_VLLM_V1 = dict(http_request_s=HTTP_REQUEST_S, tokenize_s_per_token=TOKENIZE_S_PER_TOKEN, ipc_in_hops=1,
                ipc_out_hops=1, ipc_hop_s=IPC_HOP_S, detok_passes=1, detok_s_per_token=DETOK_S_PER_TOKEN,
                stream_chunk_s=STREAM_CHUNK_S)
_SGLANG = dict(_VLLM_V1, ipc_out_hops=2, detok_passes=2)

# (engine, release as the engine's settings name it) -> its frontend; engines and releases not
# here have none modelled (off): FastPP (the paper's runs) and vLLM 0.6 (V0 detokenizes inside
# the engine's step, which the step's host time holds)
COSTS: dict[tuple[str, str], FrontendCosts] = {
    ("vllm-v1", "vLLM 0.10.1.1 (V1)"): FrontendCosts(**_VLLM_V1, stream_interval_settable=False),
    ("vllm-v1", "vLLM 0.11.0 (V1)"): FrontendCosts(**_VLLM_V1, stream_interval_settable=False),
    ("vllm-v1", "vLLM 0.15.1 (V1)"): FrontendCosts(**_VLLM_V1, stream_interval_settable=True),
    ("sglang", "SGLang 0.5.23"): FrontendCosts(**_SGLANG, stream_interval_settable=True),
}


def costs_for(engine: str, version: str) -> FrontendCosts | None:
    return COSTS.get((engine, version))


class Frontend:
    """A run's frontend: when the scheduler sees each request, when the client sees each chunk."""

    def __init__(self, costs: FrontendCosts, cpu_speed: float = 1.0, stream_interval: int = 1,
                 itl: str = "chunk", name: str = "") -> None:
        self.name = name
        self.cpu_speed = cpu_speed
        s = 1.0 / cpu_speed
        self.receive_s = costs.http_request_s * s
        self.tokenize_s_per_token = costs.tokenize_s_per_token * s
        self.handoff_s = costs.ipc_in_hops * costs.ipc_hop_s * s
        self.chunk_fixed_s = (costs.ipc_out_hops * costs.ipc_hop_s + costs.stream_chunk_s) * s
        self.chunk_per_token_s = costs.detok_passes * costs.detok_s_per_token * s
        self.stream_interval = stream_interval
        self.itl_per_token = itl == "token"
        self._tokenizer_free_s = -math.inf  # closed loops: the FIFO tokenizer's state

    def describe(self) -> str:
        return (f"{self.name} API server: {self.receive_s * 1e3:.3f} ms to receive, "
                f"{self.tokenize_s_per_token * 1e6:.2f} us/token to tokenize (one at a time), "
                f"{self.handoff_s * 1e3:.2f} ms to the scheduler; a chunk back {self.chunk_fixed_s * 1e3:.3f} ms + "
                f"{self.chunk_per_token_s * 1e6:.2f} us/token; stream_interval {self.stream_interval}, "
                f"ITL per {'token' if self.itl_per_token else 'chunk'}, cpu_speed {self.cpu_speed:g}")

    # -- the way in -------------------------------------------------------------------------------
    def server_arrivals(self, sent_s, prompt_tokens) -> "np.ndarray":
        """When the scheduler sees each request, for send times in order (an open loop):
        end_i = max(received_i, end_{i-1}) + tok_i, as one running maximum (end_i = C_i +
        max_{j<=i}(received_j - C_{j-1}), C the cumulative tokenize time)."""
        sent = np.asarray(sent_s, dtype=float)
        tok = np.asarray(prompt_tokens, dtype=float) * self.tokenize_s_per_token
        c = np.cumsum(tok)
        start = np.maximum.accumulate(sent + self.receive_s - (c - tok))
        return c + start + self.handoff_s

    def server_arrival(self, sent_s: float, prompt_tokens: int) -> float:
        """One request of a closed loop, sent now (sends come in order)."""
        start = max(sent_s + self.receive_s, self._tokenizer_free_s)
        self._tokenizer_free_s = start + prompt_tokens * self.tokenize_s_per_token
        return self._tokenizer_free_s + self.handoff_s

    # -- the way out ------------------------------------------------------------------------------
    def chunk_s(self, tokens: int) -> float:
        """From the engine's last token of a chunk of `tokens` to the client's receipt of it."""
        return self.chunk_fixed_s + tokens * self.chunk_per_token_s

    def last_chunk_tokens(self, out_len: int) -> int:
        """Tokens in the last chunk of an output of `out_len` (chunks end at 1, 1 + k, ..., n)."""
        if out_len <= 1:
            return 1
        rest = (out_len - 1) % self.stream_interval
        return rest if rest else self.stream_interval

    def chunks(self, out_len: int) -> list[int]:
        """The last token (1-based) of each chunk."""
        ends = list(range(1, out_len + 1, self.stream_interval))
        if ends[-1] != out_len:
            ends.append(out_len)
        return ends

    def client_view(self, first_token_s: float, finish_s: float, out_len: int, gaps):
        """(first chunk seen, last chunk seen, the client's recorded gaps) of a request whose
        engine emitted token 1 at `first_token_s`, the last at `finish_s`, with per-token
        `gaps` (seconds; None: not kept)."""
        first = first_token_s + self.chunk_s(1)
        last = finish_s + self.chunk_s(self.last_chunk_tokens(out_len)) if out_len > 1 else first
        if gaps is None or not len(gaps):
            return first, last, gaps
        if self.stream_interval == 1:
            return first, last, gaps  # every chunk one token: the same fixed delay cancels out
        times = np.concatenate(([first_token_s], first_token_s + np.cumsum(np.asarray(gaps, dtype=float))))
        ends = self.chunks(len(times))
        seen = [times[e - 1] + self.chunk_s(e - p) for p, e in zip([0] + ends, ends)]
        out = array("d")
        for j in range(1, len(ends)):
            gap = seen[j] - seen[j - 1]
            if self.itl_per_token:
                m = ends[j] - ends[j - 1]
                out.extend([gap / m] * m)
            else:
                out.append(gap)
        return first, last, out


def check_frontend(cfg, engine: str, version: str, where: str = "config") -> None:
    """Refuse [frontend] settings the engine's release has no way to honour."""
    fe = cfg
    if fe is None:
        return
    costs = costs_for(engine, version)
    if fe.enabled and costs is None:
        known = ", ".join(f"{e} ({v})" for e, v in COSTS)
        raise ConfigError(f"{where} [frontend] enabled = true: no frontend is modelled for engine {engine!r} "
                          f"release {version!r}; allowed: one of {known}, or enabled = false")
    if fe.stream_interval_tokens > 1 and costs is not None and not costs.stream_interval_settable:
        raise ConfigError(f"{where} [frontend] stream_interval_tokens = {fe.stream_interval_tokens}: {engine} "
                          f"{version} has no stream_interval setting (every step's token is sent); allowed: 1 "
                          f"(or 0, the default), or a release that has it (vllm-v1 0.15, sglang 0.5)")


def frontend_of(fe, engine: str, version: str) -> Frontend | None:
    """The run's frontend (None: off). `fe` is the config's FrontendConfig, or None (the
    section absent: on where the engine's release has one modelled)."""
    costs = costs_for(engine, version)
    if costs is None or (fe is not None and fe.enabled is False):
        return None
    name = f"{engine} ({version})"
    if fe is None:
        return Frontend(costs, name=name)
    return Frontend(costs, fe.cpu_speed, max(fe.stream_interval_tokens, 1), fe.itl, name=name)
