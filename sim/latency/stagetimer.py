"""The profiled ground truth's per-batch stage times: the engine's per-iteration hot path.

`ProfiledLatencyModel` (profiled.py) holds the model: the tables, the scaling, the communication
and the overhead terms. Per micro-batch only two things vary: the parts that depend on the token
count alone (looked up once per count and cached here) and the attention term (decode contexts,
prefill squares), which is the same for every stage. `StageTimer` keeps those two as plain numbers,
so that mypyc compiles them (sim/native.py) and the engine calls it without a Python frame; the
sources give the same floats, in the same order of operations, compiled or not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


class StageTimer:
    """`times(st)`: every stage's total seconds for a batch with stats `st` (a BatchStats).

    `parts_of(tokens)` gives, per stage, (layers, linear_s, comm_s, overhead_s) for a batch of
    `tokens` tokens with no attention (cached in `parts`, a dict that timers of the same profile
    and stage split may share); `gather_s(num_seqs)`, if given, the TP logits all-gather
    added to the last stage. The attention coefficients are the profile's (ms), with the scaling
    factors `s_comp` (prefill) and `s_mem` (decode) and the decode wave padding (profiled.py).
    `overhead_s(st)`: the iteration's host time (scheduler CPU per iteration and per request,
    token broadcast).

    The roofline floor (sim/latency/roofline.py) of the per-batch terms, 0 = off: `pair_ms`, ms per
    causal (query, key) pair of prefill attention at peak; `kv_ms`, ms per KV-cache token read at the
    HBM bandwidth (prefill and decode attention); `lm_seq_s`, seconds of LM head per sampled sequence
    at peak, against the last stage's `lm_head_s` (already in its parts)."""

    def __init__(self, parts_of: Callable[[int], Any], num_stages: int, s_comp: float, s_mem: float,
                 prefill: dict, decode: dict, wave_frac: float, kv_heads: int, sm_count: float,
                 cpu_s: float, cpu_per_req_s: float, broadcast_s: float,
                 gather_s: Callable[[int], float] | None = None,
                 parts: dict[int, tuple[tuple[int, float, float, float], ...]] | None = None,
                 pair_ms: float = 0.0, kv_ms: float = 0.0, lm_head_s: float = 0.0, lm_seq_s: float = 0.0) -> None:
        self.parts_of = parts_of
        self.num_stages = num_stages
        # Every number is held as a float and the batch's sums are read as floats: exact for
        # integers below 2^53, so each product and quotient is the reference's (Python's mixed
        # int/float arithmetic converts the int the same way), in the same order.
        self.s_comp = float(s_comp)
        self.s_mem = float(s_mem)
        self.p_a = float(prefill["a_ms"])
        self.p_c = float(prefill["b_c"])
        self.p_c2 = float(prefill["b_c2"])
        self.p_cp = float(prefill["b_cp"])
        self.d_a = float(decode["a_ms"])
        self.d_ctx = float(decode["b_ctx"])
        self.wave_frac = float(wave_frac)
        self.kv_heads = int(kv_heads)
        self.sm_count = float(sm_count)
        self.cpu_s = float(cpu_s)
        self.cpu_per_req_s = float(cpu_per_req_s)
        self.broadcast_s = float(broadcast_s)
        self.gather_s = gather_s
        self.pair_ms = float(pair_ms)
        self.kv_ms = float(kv_ms)
        self.lm_head_s = float(lm_head_s)
        self.lm_seq_s = float(lm_seq_s)
        # `parts`: a cache of `parts_of` to share with other timers of the same profile and stages
        self._parts: dict[int, tuple[tuple[int, float, float, float], ...]] = {} if parts is None else parts
        self._zeros = (0.0,) * num_stages

    def attention_s(self, st: Any) -> float:
        """One layer's attention time for the batch (seconds)."""
        npre = int(st.num_prefill)
        n = int(st.num_decode)
        c = c2 = cp = ctx = 0.0
        if npre:
            c = float(st.prefill_tokens)
            c2 = float(st.sum_c2)
            cp = float(st.sum_cp)
        if n:
            ctx = float(st.sum_decode_ctx)
        return self._attention_ms(npre, c, c2, cp, n, ctx) / 1e3

    def _attention_ms(self, npre: int, c: float, c2: float, cp: float, n: int, ctx: float) -> float:
        """One layer's attention (ms) of `npre` prefill pieces (c tokens, sums c^2 and c p) and `n` decodes
        (context sum `ctx`): the fitted formulas, scaled, at least their roofline floor."""
        t = 0.0
        if npre:
            pre = self.s_comp * (self.p_a + self.p_c * c + self.p_c2 * c2 + self.p_cp * cp)
            if self.pair_ms > 0.0:   # the roofline floor: causal FLOPs at peak, KV bytes at the HBM bandwidth
                flops = self.pair_ms * (cp + 0.5 * (c2 + c))
                if flops > pre:
                    pre = flops
                if c > 0.0:
                    mem = self.kv_ms * (c + cp / c)
                    if mem > pre:
                        pre = mem
            t += pre
        if n:
            raw = ctx
            if self.wave_frac > 0:
                h, w = self.kv_heads, self.sm_count
                padded = math.ceil(n * h / w) * w / h
                ctx = (1 - self.wave_frac) * ctx + self.wave_frac * (ctx / n) * padded
            dec = self.s_mem * (self.d_a + self.d_ctx * ctx)
            if self.kv_ms * raw > dec:   # the roofline floor: every context token's KV read once
                dec = self.kv_ms * raw
            t += dec
        return t

    def overhead_s(self, st: Any) -> float:
        """Critical-path host time of one iteration whose slot runs `st` (None: an empty turn)."""
        if st is None:
            return self.broadcast_s
        return self.cpu_s + self.cpu_per_req_s * float(st.num_prefill + st.num_decode) + self.broadcast_s

    def times(self, st: Any) -> tuple[float, ...]:
        # int(x) of each count, without calling the builtin when it is an int already (the engine's
        # stats are; analysis code may pass numpy integers): compiled, the call cost more than the rest
        x = st.prefill_tokens
        pt: int = x if isinstance(x, int) else int(x)
        x = st.num_decode
        nd: int = x if isinstance(x, int) else int(x)
        if pt + nd <= 0:
            return self._zeros
        x = st.pad_tokens
        tokens = pt + nd + (x if isinstance(x, int) else int(x))  # the linear layers compute a CUDA graph's padding rows too
        parts = self._parts.get(tokens)
        if parts is None:
            parts = tuple([(int(n), float(lin), float(comm), float(ov)) for n, lin, comm, ov in self.parts_of(tokens)])
            self._parts[tokens] = parts
        # attention_s, with each field of the batch read once
        x = st.num_prefill
        npre: int = x if isinstance(x, int) else int(x)
        c2 = cp = ctx = 0.0
        # (float(x) twice over: compiled, the branch where x is known to be an int converts it
        # without calling the builtin; the other one takes numpy integers)
        if npre:
            x = st.sum_c2
            c2 = float(x) if isinstance(x, int) else float(x)
            x = st.sum_cp
            cp = float(x) if isinstance(x, int) else float(x)
        if nd:
            x = st.sum_decode_ctx
            ctx = float(x) if isinstance(x, int) else float(x)
        att = self._attention_ms(npre, float(pt) if npre else 0.0, c2, cp, nd, ctx) / 1e3
        # same order of additions as StepTime.total_s
        times = tuple([lin + n * att + comm + ov for n, lin, comm, ov in parts])
        if self.lm_seq_s > 0.0 or self.gather_s is not None:
            nseq = npre + nd
            if self.lm_seq_s > 0.0:  # the LM head's compute floor on the last stage (profiled.stage_time)
                extra = float(nseq) * self.lm_seq_s - self.lm_head_s
                if extra > 0.0:
                    n, lin, comm, ov = parts[-1]
                    times = times[:-1] + ((lin + extra) + n * att + comm + ov,)
            if self.gather_s is not None:  # the logits all-gather depends on the sequences, not only the tokens
                times = times[:-1] + (times[-1] + self.gather_s(nseq),)
        return times
