"""The token-level summary of one micro-batch that every latency term depends on (`BatchStats`).

Its own module so that mypyc compiles it with the engine (sim/native.py): the engine makes one
per micro-batch (about 700,000 in a 10^5-request run), and a compiled class is built by the
compiled scheduler without a Python frame. sim/latency/base.py re-exports it (the latency-model
contract). The fields are left untyped (`Any`): analysis code builds stats from numpy integers,
which a compiled class with `int` fields would refuse.
"""

from __future__ import annotations

from typing import Any

FIELDS = ("prefill_tokens", "num_prefill", "sum_c2", "sum_cp", "num_decode", "sum_decode_ctx", "pad_tokens")


class BatchStats:
    """Token-level summary of one micro-batch (what every latency term depends on).

    - `prefill_tokens`: new tokens of all prefill pieces (chunks and whole prompts);
    - `num_prefill`: number of prefill pieces;
    - `sum_c2`: sum over prefill pieces of new_tokens^2;
    - `sum_cp`: sum over prefill pieces of new_tokens * prefix_tokens;
    - `num_decode`: decode requests (one token each);
    - `sum_decode_ctx`: sum over decode requests of their context length (prompt + output);
    - `pad_tokens`: padding rows of a CUDA-graph replay (linear layers only; 0 when eager).
    """

    __slots__ = ("prefill_tokens", "num_prefill", "sum_c2", "sum_cp", "num_decode", "sum_decode_ctx", "pad_tokens")

    prefill_tokens: Any
    num_prefill: Any
    sum_c2: Any
    sum_cp: Any
    num_decode: Any
    sum_decode_ctx: Any
    pad_tokens: Any

    def __init__(
        self,
        prefill_tokens: Any = 0,
        num_prefill: Any = 0,
        sum_c2: Any = 0,
        sum_cp: Any = 0,
        num_decode: Any = 0,
        sum_decode_ctx: Any = 0,
    ) -> None:
        self.prefill_tokens = prefill_tokens
        self.num_prefill = num_prefill
        self.sum_c2 = sum_c2
        self.sum_cp = sum_cp
        self.num_decode = num_decode
        self.sum_decode_ctx = sum_decode_ctx
        # rows a CUDA graph pads the batch with (the engines' captured sizes): the linear layers
        # compute them, attention does not (sim/engine/schedulers/, EngineSettings.capture_sizes)
        self.pad_tokens = 0

    @property
    def num_tokens(self) -> Any:
        """Tokens the linear layers see: prefill tokens + one per decode request."""
        return self.prefill_tokens + self.num_decode

    @classmethod
    def prefill(cls, chunk: Any, prefix: Any = 0) -> BatchStats:
        return cls(chunk, 1, chunk * chunk, chunk * prefix, 0, 0)

    @classmethod
    def decode(cls, num: Any, context: Any) -> BatchStats:
        return cls(0, 0, 0, 0, num, num * context)

    def key(self) -> tuple[Any, ...]:
        return (self.prefill_tokens, self.num_prefill, self.sum_c2, self.sum_cp, self.num_decode, self.sum_decode_ctx)

    def __repr__(self) -> str:
        return "BatchStats(" + ", ".join(f"{k}={getattr(self, k)}" for k in FIELDS) + ")"
