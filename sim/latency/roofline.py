"""The roofline floor: no part of an iteration runs faster than the GPU's datasheet peaks allow.

A profile's `[roofline]` section (profiles/FORMAT.md) names the GPU the simulated iteration runs on
(`gpu_spec`, its dense BF16 peak `bf16_tflops` and HBM bandwidth `hbm_bw_gbps`, copied from
profiles/gpus/<gpu_spec>.toml), the per-direction bandwidth of the link between two GPUs
(`link_bw_gbps`, from profiles/interconnects/) and the GPU the tables were measured on
(`base_gpu_spec`, `base_bf16_tflops`, `base_hbm_bw_gbps`: the bounds a table point itself must obey).

Every part takes at least max(FLOPs / peak, bytes moved / bandwidth):

| part | FLOPs | bytes |
|---|---|---|
| linear layers, one layer | 2 x tokens x layer_params / tp (GEMMs) | layer_params / tp x dtype_bytes (weights read once) |
| the same, an MoE layer (`[moe]`) | 2 x tokens x (layer_params - (E - k) x expert_params) / tp: each token runs k of the E routed experts | (layer_params - (E - touched(tokens)) x expert_params) / tp x dtype_bytes: only the experts the batch routes to are read, `expected_experts` of them |
| prefill attention, one layer | 4 x head_dim x q_heads/tp per (query, key) pair; a chunk of c tokens after a prefix of p has c p + c (c + 1) / 2 pairs (causal) | the KV cache of prefix and chunk, 2 x kv_heads/tp x head_dim x dtype_bytes per token |
| decode attention, one layer | (memory bound) | the KV cache of every context token, as above |
| LM head | 2 x vocab x hidden / tp per sampled sequence | vocab x hidden / tp x dtype_bytes |
| communication | | the bytes each GPU sends / the link's per-direction bandwidth (ring all-reduce 2 (t-1)/t x message, all-gather (t-1)/t x message, PP send the activation) |

`Floors` holds these as per-unit times (seconds), so the latency model applies them with one
multiplication and one comparison each.

`expected_experts(E, k, T)`: the expected number of distinct experts T tokens touch when each picks k of E
experts uniformly without replacement: one expert is missed by one token with probability 1 - k/E, by all T
independently with (1 - k/E)^T, so E (1 - (1 - k/E)^T). Real routers are not uniform (skewed routing touches
fewer experts): a profile whose expert table was measured at a skewed routing (`[moe] distribution`, a power
law) counts the experts that routing touches instead (`sim.latency.moe_routing.touched_experts`); a balanced
one keeps the uniform expectation, stated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.errors import DataError
from sim.latency.moe_routing import touched_experts

FIELDS = ("bf16_tflops", "hbm_bw_gbps")


@dataclass(frozen=True)
class Bounds:
    """One GPU's physical bounds, in FLOP/s and bytes/s (link_bw 0: not known)."""

    gpu_spec: str
    peak_flops: float
    hbm_bw: float
    link_bw: float = 0.0
    peak_dtype: str = "bf16"     # the dtype of peak_flops (the linear layers' GEMM dtype)

    def describe(self) -> str:
        link = f", link {self.link_bw / 1e9:g} GB/s per direction" if self.link_bw else ""
        return (f"{self.gpu_spec}: dense {self.peak_dtype.upper()} {self.peak_flops / 1e12:g} TFLOP/s, "
                f"HBM {self.hbm_bw / 1e9:g} GB/s" + link)


def _positive(sec: dict, key: str, where: str) -> float:
    val = sec.get(key)
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val <= 0:
        raise DataError(f"{where}: key {key!r} must be a finite number > 0, got {val!r}")
    return float(val)


def bounds_from_meta(meta: dict, where: str, base: bool = False) -> Bounds | None:
    """The target GPU's bounds (or, with `base`, those of the GPU the tables were measured on, which
    default to the target's) from meta.toml's `[roofline]`; None when the profile has no such section."""
    rl = meta.get("roofline")
    if rl is None:
        return None
    where = f"{where} [roofline]"
    if not isinstance(rl, dict):
        raise DataError(f"{where}: must be a table")
    link = _positive(rl, "link_bw_gbps", where) * 1e9 if "link_bw_gbps" in rl else 0.0
    # `peak_tflops` (with `peak_dtype`): the dense peak of the dtype the linear layers run in (an FP8 profile's
    # GEMMs are bounded by the FP8 peak); absent, the dense BF16 peak
    dtype = str(rl.get("peak_dtype", "bf16"))
    if base and "base_gpu_spec" in rl:
        key = "base_peak_tflops" if "base_peak_tflops" in rl else "base_bf16_tflops"
        return Bounds(str(rl["base_gpu_spec"]), _positive(rl, key, where) * 1e12,
                      _positive(rl, "base_hbm_bw_gbps", where) * 1e9, link, dtype)
    key = "peak_tflops" if "peak_tflops" in rl else "bf16_tflops"
    return Bounds(str(rl.get("gpu_spec", "")), _positive(rl, key, where) * 1e12,
                  _positive(rl, "hbm_bw_gbps", where) * 1e9, link, dtype)


def expected_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts `tokens` tokens touch, each routed to `top_k` of `num_experts` uniformly:
    E (1 - (1 - k/E)^T) (module docstring)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


class Floors:
    """The floor of each part for one model shape, TP degree and GPU (seconds; see the module docstring)."""

    def __init__(self, bounds: Bounds, layer_params: float, hidden: int, q_heads: int, kv_heads: int,
                 head_dim: int, vocab: int, dtype_bytes: int, tp: int, kv_dtype_bytes: int = 0,
                 act_dtype_bytes: int = 0, moe: tuple[int, int, float] | None = None,
                 moe_distribution: str = "balanced") -> None:
        # moe: (routed experts E, top-k, parameters of one expert) of an MoE layer; None: dense
        self.moe_distribution = moe_distribution
        kv_bytes = kv_dtype_bytes or dtype_bytes
        act_bytes = act_dtype_bytes or dtype_bytes
        self.bounds = bounds
        peak, bw = bounds.peak_flops, bounds.hbm_bw
        params = layer_params / tp
        self.linear_bytes = params * dtype_bytes                   # every weight of the layer
        self.moe = moe
        if moe is not None:
            e, k, expert = moe
            self.expert_bytes = expert / tp * dtype_bytes          # one routed expert's shard
            self.fixed_bytes = (layer_params - e * expert) / tp * dtype_bytes   # what every pass reads
            params = (layer_params - (e - k) * expert) / tp       # the parameters one token runs through
        self.linear_flops_per_token = 2.0 * params
        self.linear_token_s = self.linear_flops_per_token / peak   # compute bound, per token
        self.linear_weights_s = self.linear_bytes / bw             # memory bound, per layer and pass
        self.pair_flops = 4.0 * head_dim * (q_heads / tp)          # QK^T and PV of one (query, key) pair
        self.pair_s = self.pair_flops / peak
        self.kv_token_bytes = 2.0 * max(1, kv_heads // tp) * head_dim * kv_bytes
        self.kv_token_s = self.kv_token_bytes / bw
        self.lm_flops_per_seq = 2.0 * vocab * hidden / tp
        self.lm_bytes = vocab * hidden * act_bytes / tp
        self.lm_seq_s = self.lm_flops_per_seq / peak
        self.lm_weights_s = self.lm_bytes / bw
        self.link_byte_s = 1.0 / bounds.link_bw if bounds.link_bw else 0.0

    @classmethod
    def for_shape(cls, bounds: Bounds, shape, tp: int) -> "Floors":
        e = getattr(shape, "moe_num_experts", 0)
        moe = (e, shape.moe_top_k, shape.moe_expert_params) if e else None
        return cls(bounds, shape.layer_params, shape.hidden_size, shape.num_q_heads, shape.num_kv_heads,
                   shape.head_dim, shape.vocab_size, shape.dtype_bytes, tp,
                   getattr(shape, "kv_dtype_bytes", 0), getattr(shape, "act_dtype_bytes", 0), moe,
                   getattr(shape, "moe_distribution", "balanced"))

    def weight_bytes(self, tokens: float) -> float:
        """Weight bytes one GPU reads in one layer's pass over `tokens` tokens: all of them (dense), or the
        fixed part and the experts the tokens are expected to touch (MoE)."""
        if self.moe is None:
            return self.linear_bytes
        e, k, _ = self.moe
        if self.moe_distribution == "balanced":
            return self.fixed_bytes + expected_experts(e, k, tokens) * self.expert_bytes
        return self.fixed_bytes + touched_experts(e, k, tokens, self.moe_distribution) * self.expert_bytes

    # -- per part, seconds --
    def linear_s(self, tokens: float) -> float:
        """One layer's linear (non-attention) floor for a pass over `tokens` tokens."""
        if self.moe is not None:
            return max(tokens * self.linear_token_s, self.weight_bytes(tokens) / self.bounds.hbm_bw)
        return max(tokens * self.linear_token_s, self.linear_weights_s)

    @staticmethod
    def prefill_pairs(prefill_tokens: float, sum_c2: float, sum_cp: float) -> float:
        """(query, key) pairs of causal prefill pieces: sum of c p + c (c + 1) / 2."""
        return sum_cp + 0.5 * (sum_c2 + prefill_tokens)

    @staticmethod
    def prefill_kv_tokens(prefill_tokens: float, sum_cp: float) -> float:
        """A lower bound on the KV tokens prefill pieces touch: sum of (c + p) >= sum c + sum c p / sum c
        (each piece's prefix is at least its c p over the batch's prefill tokens)."""
        return prefill_tokens + (sum_cp / prefill_tokens if prefill_tokens > 0 else 0.0)

    def prefill_attention_s(self, prefill_tokens: float, sum_c2: float, sum_cp: float) -> float:
        return max(self.prefill_pairs(prefill_tokens, sum_c2, sum_cp) * self.pair_s,
                   self.prefill_kv_tokens(prefill_tokens, sum_cp) * self.kv_token_s)

    def decode_attention_s(self, sum_ctx: float) -> float:
        return sum_ctx * self.kv_token_s

    def lm_head_s(self, num_seqs: float) -> float:
        return max(num_seqs * self.lm_seq_s, self.lm_weights_s)

    def comm_s(self, nbytes: float) -> float:
        """Bytes one GPU sends over the link (0 when the link bandwidth is not known)."""
        return nbytes * self.link_byte_s
