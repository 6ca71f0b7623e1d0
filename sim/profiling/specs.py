"""Model architectures as data (profiles/models), and what a profile needs of its GPU and interconnect (the
roofline section, whether the weights fit). GPUs and interconnects themselves are read by
`sim.latency.hardware` (a run reads them too, to cost a cluster's links).

- `ModelArch`: a decoder-only transformer (layers, hidden, FFN, q/KV heads, head dim, vocabulary,
  gated MLP, QKV bias, tied embeddings, dtype bytes), read from `profiles/models/<name>.toml` or parsed
  offline from a Hugging Face `config.json` (`model_from_hf_config`; missing fields are refused with a
  one-line error naming the field).
- `MoeSpec`: the mixture-of-experts part of a model (`[moe]` in the model file; Mixtral's and Qwen3-MoE's
  config.json): routed experts, top-k, expert FFN size, shared experts and their size, the layers that keep a
  dense MLP, the router's dtype. Every routed expert is resident on some GPU: a GPU holds
  experts / (ep x moe_tp) of each MoE layer's experts (`layer_params_per_gpu`). DeepSeek-V2/V3 configs
  (MLA attention) are refused: MLA is not modelled.
- `base_gpu`, `roofline_section`: the GPU a kernel-data family was measured on, a profile's `[roofline]`.
- `check_weights_fit`, `fits_somewhere`: whether a TP x PP split holds the weights.

Readers raise `DataError` (one line, file and field named); nothing here times anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.core.errors import DataError
from sim.core.tomlio import read_toml
from sim.latency.cluster import allowed_tps_of, check_tp_of
from sim.latency.hardware import PROFILES, GpuSpec, Interconnect, gpu_names, load_gpu
from sim.profiling.kernels import Arch

MODELS_DIR = PROFILES / "models"
GIB = 1 << 30

DENSE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MOE_MODEL_TYPES = ("mixtral", "qwen3_moe")
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")
ROUTER_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class MoeSpec:
    """The mixture-of-experts MLP of a model: every MoE layer has `num_experts` routed experts (gated MLPs of
    `expert_intermediate_size`), each token goes to `top_k` of them, plus `num_shared_experts` always-active
    experts of `shared_intermediate_size`; layers in `dense_layers` keep a dense MLP (`intermediate_size`)."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0    # per shared expert
    dense_layers: tuple[int, ...] = ()   # 0-based indices of the layers with a dense MLP
    router_dtype: str = "bf16"           # the gate's weights (vLLM's Mixtral / Qwen3-MoE gate: the model dtype)


def _moe_from_table(t: dict, num_layers: int, where: str) -> MoeSpec:
    where = f"{where} [moe]"
    known = {"num_experts", "top_k", "expert_intermediate_size", "num_shared_experts", "shared_intermediate_size",
             "dense_layers", "router_dtype", "source"}
    extra = sorted(set(t) - known)
    if extra:
        raise DataError(f"{where}: unknown field {extra[0]!r}; allowed: {', '.join(sorted(known))}")
    e, k, f = (_int(t, key, where) for key in ("num_experts", "top_k", "expert_intermediate_size"))
    if k > e:
        raise DataError(f"{where}: field 'top_k' ({k}) must be <= 'num_experts' ({e})")
    shared = t.get("num_shared_experts", 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise DataError(f"{where}: field 'num_shared_experts' must be an integer >= 0, got {shared!r}")
    sf = _int(t, "shared_intermediate_size", where) if shared else 0
    dense = t.get("dense_layers", [])
    if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers
                                          for i in dense) or len(set(dense)) != len(dense):
        raise DataError(f"{where}: field 'dense_layers' must be a list of distinct layer indices in "
                        f"0..{num_layers - 1}, got {dense!r}")
    if len(dense) == num_layers:
        raise DataError(f"{where}: field 'dense_layers' lists every layer; a model without MoE layers has no [moe]")
    rd = t.get("router_dtype", "bf16")
    if rd not in ROUTER_DTYPES:
        raise DataError(f"{where}: field 'router_dtype' must be one of {', '.join(ROUTER_DTYPES)}, got {rd!r}")
    return MoeSpec(e, k, f, shared, sf, tuple(sorted(dense)), rd)


@dataclass(frozen=True)
class ModelArch:
    name: str                  # id used in paths and configs, e.g. "qwen2.5-32b"
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    gated_mlp: bool = True
    qkv_bias: bool = False
    tied_embeddings: bool = False
    dtype_bytes: int = 2
    source: str = ""
    context_length_tokens: int = 0     # max_position_embeddings of the model's config.json (0: not known)
    kv_dtype_bytes: int = 0            # bytes per KV-cache element (0: dtype_bytes)
    moe: MoeSpec | None = None         # None: a dense model

    @property
    def kv_bytes(self) -> int:
        return self.kv_dtype_bytes or self.dtype_bytes

    @property
    def kernel_arch(self) -> Arch:
        return Arch(self.hidden_size, self.intermediate_size, self.num_q_heads, self.num_kv_heads,
                    self.head_dim, self.gated_mlp, self.dtype_bytes)

    @property
    def attention_params(self) -> int:
        """One unsharded layer's attention and norms: QKV (+ bias), O, two norm weights."""
        h, d = self.hidden_size, self.head_dim
        qkv = (self.num_q_heads + 2 * self.num_kv_heads) * d
        return h * qkv + (qkv if self.qkv_bias else 0) + self.num_q_heads * d * h + 2 * h

    def mlp_params(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    @property
    def expert_params(self) -> int:
        """One routed expert of one MoE layer (0 for a dense model)."""
        return self.mlp_params(self.moe.expert_intermediate_size) if self.moe else 0

    @property
    def moe_fixed_params(self) -> int:
        """The MLP part of an MoE layer every token runs: router (hidden x experts) and shared experts."""
        m = self.moe
        return self.hidden_size * m.num_experts + m.num_shared_experts * self.mlp_params(m.shared_intermediate_size)

    @property
    def layer_params(self) -> int:
        """One unsharded layer: QKV (+ bias), O, MLP, two norm weights; of an MoE model, an MoE layer with all
        its experts (the layers of `dense_layers` have `dense_layer_params`)."""
        if self.moe is None:
            return self.attention_params + self.mlp_params(self.intermediate_size)
        return self.attention_params + self.moe_fixed_params + self.moe.num_experts * self.expert_params

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.mlp_params(self.intermediate_size)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - len(self.moe.dense_layers) if self.moe else 0

    @property
    def total_layer_params(self) -> int:
        """Every layer's parameters (MoE layers with all their experts)."""
        if self.moe is None:
            return self.num_layers * self.layer_params
        return self.num_moe_layers * self.layer_params + len(self.moe.dense_layers) * self.dense_layer_params

    @property
    def active_layer_params(self) -> int:
        """The layers' parameters one token runs through: top-k routed experts per MoE layer."""
        if self.moe is None:
            return self.total_layer_params
        moe_layer = self.attention_params + self.moe_fixed_params + self.moe.top_k * self.expert_params
        return self.num_moe_layers * moe_layer + len(self.moe.dense_layers) * self.dense_layer_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.total_layer_params + self.embedding_params * (1 if self.tied_embeddings else 2)

    @property
    def active_params(self) -> int:
        return self.active_layer_params + self.embedding_params * (1 if self.tied_embeddings else 2)

    def weight_bytes(self) -> float:
        return self.total_params * self.dtype_bytes

    def layer_params_per_gpu(self, attn_tp: int, moe_tp: int | None = None, ep: int = 1) -> float:
        """One MoE layer's parameters on one GPU: attention, norms and shared experts split over `attn_tp`,
        the router replicated (vLLM's and SGLang's gate is a ReplicatedLinear), and experts / (ep x moe_tp)
        routed experts, each split over `moe_tp` (default: attn_tp, the TP-sharded layout). A dense model's
        layer: layer_params / attn_tp."""
        if self.moe is None:
            return self.layer_params / attn_tp
        moe_tp = attn_tp if moe_tp is None else moe_tp
        m = self.moe
        if m.num_experts % ep:
            raise DataError(f"ep {ep}: does not divide the {m.num_experts} experts of {self.name}")
        shared = m.num_shared_experts * self.mlp_params(m.shared_intermediate_size)
        return ((self.attention_params + shared) / attn_tp + self.hidden_size * m.num_experts
                + m.num_experts / ep * self.expert_params / moe_tp)

    def check_tp(self, tp: int, where: str = "--tp") -> None:
        """TP must divide the query heads, and divide or be a multiple of the KV heads (SGLang replicates)."""
        check_tp_of(self.name, self.num_q_heads, self.num_kv_heads, tp, where)


def allowed_tps(m: ModelArch, candidates=(1, 2, 4, 8)) -> list[int]:
    return allowed_tps_of(m.num_q_heads, m.num_kv_heads, candidates)


MODEL_INT_KEYS = ("num_layers", "hidden_size", "intermediate_size", "num_q_heads", "num_kv_heads", "head_dim",
                  "vocab_size")


def _int(table: dict, key: str, where: str) -> int:
    v = table.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DataError(f"{where}: field {key!r} must be an integer >= 1, got {v!r}")
    return v


def _bool(table: dict, key: str, where: str, default: bool) -> bool:
    v = table.get(key, default)
    if not isinstance(v, bool):
        raise DataError(f"{where}: field {key!r} must be true or false, got {v!r}")
    return v


def model_from_table(m: dict, name: str, where: str, moe: dict | None = None) -> ModelArch:
    vals = {k: _int(m, k, where) for k in MODEL_INT_KEYS}
    db = m.get("dtype_bytes", 2)
    if db not in (1, 2, 4):
        raise DataError(f"{where}: field 'dtype_bytes' must be 1, 2 or 4, got {db!r}")
    ctx = _int(m, "context_length_tokens", where) if "context_length_tokens" in m else 0
    arch = ModelArch(name=name, **vals, gated_mlp=_bool(m, "gated_mlp", where, True),
                     qkv_bias=_bool(m, "qkv_bias", where, False),
                     tied_embeddings=_bool(m, "tied_embeddings", where, False), dtype_bytes=db,
                     source=str(m.get("source", where)), context_length_tokens=ctx,
                     moe=None if moe is None else _moe_from_table(moe, vals["num_layers"], where))
    if arch.num_q_heads % arch.num_kv_heads:
        raise DataError(f"{where}: field 'num_kv_heads' ({arch.num_kv_heads}) must divide 'num_q_heads' "
                        f"({arch.num_q_heads})")
    return arch


def model_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.toml"))


def load_model(name: str) -> ModelArch:
    path = MODELS_DIR / f"{name}.toml"
    if not path.is_file():
        raise DataError(f"--model {name!r}: unknown model; allowed: {', '.join(model_names())} "
                        f"(or --model-config PATH to a Hugging Face config.json)")
    cfg = read_toml(path, DataError)
    if not isinstance(cfg.get("model"), dict):
        raise DataError(f"{path}: missing table [model]")
    if "context_length_tokens" not in cfg["model"]:
        raise DataError(f"{path}: missing field 'context_length_tokens' (max_position_embeddings of the model's "
                        "config.json)")
    if "moe" in cfg and not isinstance(cfg["moe"], dict):
        raise DataError(f"{path}: [moe] must be a table")
    return model_from_table(cfg["model"], name, str(path), cfg.get("moe"))


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelArch:
    """A dense Llama/Qwen/Mistral-style model from a Hugging Face config.json, offline."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: config.json not found (--model-config)")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise DataError(f"{path}: expected a JSON object")
    where = str(path)
    mt = cfg.get("model_type")
    if cfg.get("kv_lora_rank") or str(mt).startswith("deepseek"):
        raise DataError(f"{where}: field 'model_type' is {mt!r}: DeepSeek-style models use MLA attention "
                        f"(kv_lora_rank), which PipeSim does not model (it would be wrong to price it as MHA); "
                        f"allowed: {', '.join(DENSE_MODEL_TYPES + MOE_MODEL_TYPES)}")
    if mt not in DENSE_MODEL_TYPES + MOE_MODEL_TYPES:
        raise DataError(f"{where}: field 'model_type' is {mt!r}; allowed: "
                        f"{', '.join(DENSE_MODEL_TYPES + MOE_MODEL_TYPES)}")
    if mt in DENSE_MODEL_TYPES:
        for key in MOE_KEYS:
            if cfg.get(key):
                raise DataError(f"{where}: field {key!r} = {cfg[key]!r} in a {mt!r} config: mixture-of-experts "
                                f"configs are read for model_type {', '.join(MOE_MODEL_TYPES)}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise DataError(f"{where}: field 'hidden_act' is {act!r}; allowed: 'silu' (gated MLP)")
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                "max_position_embeddings"):
        if key not in cfg:
            raise DataError(f"{where}: missing field {key!r}")
    heads = _int(cfg, "num_attention_heads", where)
    hidden = _int(cfg, "hidden_size", where)
    if cfg.get("head_dim") is None and hidden % heads:
        # head_dim is hidden_size / num_attention_heads when the config gives none (transformers' default)
        raise DataError(f"{where}: field 'hidden_size' ({hidden!r}) must be a multiple of 'num_attention_heads' "
                        f"({heads}) when the config has no 'head_dim'")
    head_dim = cfg.get("head_dim") if cfg.get("head_dim") is not None else hidden // heads
    # absent (or null): multi-head attention, as transformers reads it; 0 is no count of heads
    kv = cfg.get("num_key_value_heads")
    kv = heads if kv is None else kv
    dtype = cfg.get("torch_dtype", "bfloat16")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise DataError(f"{where}: field 'torch_dtype' is {dtype!r}; allowed: bfloat16, float16, float32")
    table = {"num_layers": cfg["num_hidden_layers"], "hidden_size": hidden,
             "intermediate_size": cfg["intermediate_size"], "num_q_heads": heads, "num_kv_heads": kv,
             "head_dim": head_dim, "vocab_size": cfg["vocab_size"], "gated_mlp": True,
             # Qwen2 has a QKV bias without a config key; Llama/Mistral say it in attention_bias.
             "qkv_bias": bool(cfg.get("attention_bias", mt == "qwen2")),
             "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
             "dtype_bytes": 2,      # served in BF16/FP16 whatever the checkpoint's dtype
             "context_length_tokens": cfg["max_position_embeddings"],
             "source": f"{path} (Hugging Face config.json, parsed offline)"}
    hf_to_ours = {"num_layers": "num_hidden_layers", "num_q_heads": "num_attention_heads",
                  "num_kv_heads": "num_key_value_heads", "context_length_tokens": "max_position_embeddings"}
    try:
        return model_from_table(table, name or path.parent.name.lower() or "custom", where,
                                _hf_moe(cfg, mt, where) if mt in MOE_MODEL_TYPES else None)
    except DataError as exc:
        # Name the config.json field rather than ours.
        msg = str(exc)
        for ours, theirs in hf_to_ours.items():
            msg = msg.replace(f"field {ours!r}", f"field {theirs!r}")
        raise DataError(msg) from None


def _hf_moe(cfg: dict, mt: str, where: str) -> dict:
    """The [moe] table of a Mixtral or Qwen3-MoE config.json, as transformers builds the model:
    Mixtral (`MixtralSparseMoeBlock`): every layer sparse, num_local_experts experts of intermediate_size;
    Qwen3-MoE (`Qwen3MoeDecoderLayer`): layer i is sparse when i is not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0, experts of moe_intermediate_size, dense layers of intermediate_size."""
    n = cfg["num_hidden_layers"]
    if mt == "mixtral":
        need = ("num_local_experts", "num_experts_per_tok")
        experts_key, ffn_key = "num_local_experts", "intermediate_size"
        dense = []
    else:
        need = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        experts_key, ffn_key = "num_experts", "moe_intermediate_size"
        step = cfg.get("decoder_sparse_step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise DataError(f"{where}: field 'decoder_sparse_step' must be an integer >= 1, got {step!r}")
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise DataError(f"{where}: field 'mlp_only_layers' must be a list of layer indices, got {only!r}")
        dense = [i for i in range(n) if i in only or (i + 1) % step]
    for key in need:
        if key not in cfg:
            raise DataError(f"{where}: missing field {key!r} (a {mt} config)")
    table = {"num_experts": cfg[experts_key], "top_k": cfg["num_experts_per_tok"],
             "expert_intermediate_size": cfg[ffn_key], "dense_layers": dense, "router_dtype": "bf16"}
    try:
        _moe_from_table(table, n, where)
    except DataError as exc:
        msg = str(exc).replace(f"{where} [moe]", where)
        for ours, theirs in (("num_experts", experts_key), ("top_k", "num_experts_per_tok"),
                             ("expert_intermediate_size", ffn_key)):
            msg = msg.replace(f"field {ours!r}", f"field {theirs!r}").replace(f"({ours!r}", f"({theirs!r}")
        raise DataError(msg) from None
    return table


# -- GPUs and interconnects ----------------------------------------------------------------------------------

def base_gpu(family: str) -> GpuSpec:
    """The GPU a kernel-data family was measured on: the spec of that family with no sibling-SKU scaling
    (no calibration, s_mem = s_comp = 1). Its peaks bound the tables themselves (`ppsim profile check`)."""
    found = []
    for name in gpu_names():
        g = load_gpu(name)
        sc = g.scaling
        if g.kernel_data == family and "calibration" not in sc and sc.get("s_mem", 1.0) == 1.0 \
                and sc.get("s_comp", 1.0) == 1.0:
            found.append(g)
    if len(found) != 1:
        raise DataError(f"profiles/gpus/: {len(found)} unscaled GPU specs with kernel_data = {family!r} "
                        f"({', '.join(g.name for g in found) or 'none'}); exactly one is the hardware it was measured on")
    return found[0]


def roofline_section(gpu: GpuSpec, ic: Interconnect, family: str) -> dict:
    """`[roofline]` of a profile on `gpu` over `ic` whose tables are `family` data (profiles/FORMAT.md)."""
    base = base_gpu(family)
    return {"gpu_spec": gpu.name, "bf16_tflops": gpu.bf16_tflops, "hbm_bw_gbps": gpu.hbm_bw_gbps,
            "interconnect": ic.name, "link_bw_gbps": ic.link_bw(family, f" (--gpu {gpu.name})"),
            "base_gpu_spec": base.name, "base_bf16_tflops": base.bf16_tflops, "base_hbm_bw_gbps": base.hbm_bw_gbps,
            "source": (f"profiles/gpus/{gpu.name}.toml ({gpu.source}); link: profiles/interconnects/{ic.name}.toml "
                       f"[link] ({ic.link_source}); tables measured on profiles/gpus/{base.name}.toml")}


def weights_gib_per_gpu(m: ModelArch, tp: int, pp: int, ep: int = 1) -> float:
    """The largest per-GPU weight share of a TP x PP split (first or last stage, which hold the embedding /
    LM head, as profiled.kv_capacity_tokens counts them); an MoE model's experts over `ep` expert-parallel ranks
    (1: sharded by TP; ep = tp: whole experts, moe_tp = tp / ep, sim/core/ep.py)."""
    from sim.latency.profiled import stage_layers

    layers = stage_layers(m.num_layers, pp)
    emb = m.embedding_params * m.dtype_bytes / tp
    worst = 0.0
    for s, n in enumerate(layers):
        # an MoE layer: experts / (ep x moe_tp) resident experts, moe_tp = tp / ep (ep 1: sharded by TP)
        w = (n * m.layer_params * m.dtype_bytes / tp if m.moe is None
             else n * m.layer_params_per_gpu(tp, tp // ep, ep) * m.dtype_bytes)
        if s == 0:
            w += emb
        if s == pp - 1 and not (m.tied_embeddings and pp == 1):
            w += emb
        worst = max(worst, w)
    return worst / GIB


def check_weights_fit(m: ModelArch, gpu: GpuSpec, tp: int, pp: int = 1, ep: int = 1) -> None:
    """Raise a one-line DataError when the weights alone do not fit the GPU's free memory."""
    need = weights_gib_per_gpu(m, tp, pp, ep)
    have = gpu.m_init_gib
    if need >= have * 0.9:    # SGLang keeps (1 - mem_fraction_static) of M_init free; 0.9 is its default
        at = f"TP={tp} x PP={pp}" + (f" (EP={ep})" if ep > 1 else "")
        raise DataError(f"{m.name} on {gpu.name} at {at}: weights need {need * GIB / 1e9:.1f} GB per "
                        f"GPU, have {have * GIB / 1e9:.1f} (usable for weights + KV: "
                        f"{have * 0.9 * GIB / 1e9:.1f})")


def fits_somewhere(m: ModelArch, gpu: GpuSpec, tp: int, max_gpus: int = 8) -> bool:
    """Whether some PP degree with TP x PP <= max_gpus holds the weights (and leaves room for KV)."""
    for pp in range(1, max_gpus // tp + 1):
        try:
            check_weights_fit(m, gpu, tp, pp)
            return True
        except DataError:
            continue
    return False
