"""Re-derive the committed A100 latency profiles from the shared data folder.

Usage (from the repository root):

    python profiles/build_a100.py                 # (re)write every profile table
    python profiles/build_a100.py --check         # compare instead; exit 1 listing differing files
    python profiles/build_a100.py --kv-table      # print the KV-capacity table of profiles/README.md
    python profiles/build_a100.py --data ../shared/data --out profiles

What it builds (format: profiles/FORMAT.md; method: reference/latency-profiles.md sections 4, 5, 7, 8, 10):

* ``a100-pcie-40gb/<model>/tp<T>/``: the paper's machine. The tables keep the A100-80GB base values; the
  40GB scaling (s_mem, s_comp), overheads and the PCIe alpha-beta communication model live in meta.toml.
* ``a100-sxm-80gb-nvswitch/<model>/tp<T>/``: the same tables on the measured hardware (no scaling), with the
  measured DGX NVSwitch collectives in comm.csv.

for <model> in qwen2.5-32b, qwen2.5-14b and T in 1, 2, 4.

Every meta.toml also gets the physics of profiles/FORMAT.md: ``[model] context_length_tokens`` (from
profiles/models/<model>.toml), ``[roofline]`` (the simulated GPU's and the A100 80GB's peaks from
profiles/gpus/, the link bandwidth from profiles/interconnects/) and ``[measured]`` (the token grid, the ranges
of the attention points behind the coefficients, the comm.csv sizes).

Fitted values: when ``profiles/fits.toml`` exists (written by ``profiles/calibrate.py``), its lookup mode,
s_mem, s_comp and cpu_ms and its [[fit]] records (target, achieved, residual, seeds, simulator commit,
method) go into every a100-pcie-40gb meta.toml (the 14B profiles inherit the 32B fit); parameters it does
not fit keep their defaults with a status saying why. The NVSwitch profiles are not affected. ``--fits``
points elsewhere (a missing file means: defaults).

Sources (relative to the data folder):

* layer_nonattn.csv: research-derived/qwen2.5_a100_layer_linear_ms.csv (per-layer A100-80GB values). The
  Qwen2.5-14B TP2 rows are not in that file, so they are derived here from the Vidur InternLM-20B operator
  profile with the same shape mapping (section 4.1); the mapping is first checked against every row the file
  does have, and the build fails if it does not reproduce them.
* attention.csv: research-derived/attention_model_coefficients.csv (TP1 and TP4 rows as given; TP2 scaled).
* comm.csv (NVSwitch only): vidur-profiles/network/a100_dgx/{all_reduce,send_recv}.csv.

Only numpy, pandas and the standard library are used. Every float is written with a fixed format, so the
output is byte-stable across runs and platforms.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"
DEFAULT_OUT = REPO / "profiles"

# Source files, relative to the data folder. meta.toml records them relative to the shared folder
# ("data/..."), as FORMAT.md asks.
LAYER_CSV = "research-derived/qwen2.5_a100_layer_linear_ms.csv"
LAYER_DERIVATION_CSV = "research-derived/qwen2.5_a100_layer_linear_derivation.csv"
ATTENTION_CSV = "research-derived/attention_model_coefficients.csv"
INTERNLM_CSV = "vidur-profiles/compute/a100/internlm/internlm-20b/mlp.csv"
ALL_REDUCE_CSV = "vidur-profiles/network/a100_dgx/all_reduce.csv"
SEND_RECV_CSV = "vidur-profiles/network/a100_dgx/send_recv.csv"

TPS = (1, 2, 4)

MODELS = {
    "qwen2.5-32b": dict(name="Qwen2.5-32B", num_layers=64, hidden_size=5120, num_q_heads=40, num_kv_heads=8,
                        head_dim=128, vocab_size=152064, ffn=27648, layer_params=487.6e6),
    "qwen2.5-14b": dict(name="Qwen2.5-14B", num_layers=48, hidden_size=5120, num_q_heads=40, num_kv_heads=8,
                        head_dim=128, vocab_size=152064, ffn=13824, layer_params=275.3e6),
}
# [model] context_length_tokens: max_position_embeddings of each model's config.json, read from
# profiles/models/<model>.toml (which cites it), so the two kinds of profile agree.

# [roofline] (profiles/FORMAT.md): the GPU each hardware folder simulates and its interconnect, by their spec
# files in profiles/gpus/ and profiles/interconnects/; the tables are Vidur's A100 80GB data, whose spec is
# profiles/gpus/a100-sxm-80gb.toml (the GPU their points must be physical on).
ROOFLINE = {"a100-pcie-40gb": ("a100-pcie-40gb", "pcie-p2p-disabled"),
            "a100-sxm-80gb-nvswitch": ("a100-sxm-80gb", "nvswitch")}
BASE_GPU = "a100-sxm-80gb"
KERNEL_FAMILY = "a100"
# The points behind the attention coefficients (research-derived/attention_model_coefficients.csv was fitted
# to them): their ranges are each profile's [measured] attention ranges.
ATTENTION_POINTS_CSV = "vidur-profiles-llama3-8b-attention-excerpt/llama3-8b_a100_attention_points_transcribed.csv"
BEYOND = ("past each range the model follows the hardware: layer_nonattn linear in tokens at the least-squares "
          "rate of the top half of the grid (never negative), attention at the fitted FLOP (prefill) and KV-byte "
          "(decode) rates, communication linear in bytes; every part at least its roofline floor ([roofline], "
          "profiles/FORMAT.md)")

FITS_TOML = DEFAULT_OUT / "fits.toml"   # written by profiles/calibrate.py; applied to every PCIE profile

PCIE = "a100-pcie-40gb"
NVSWITCH = "a100-sxm-80gb-nvswitch"
HARDWARE = {
    PCIE: dict(gpu="A100-40GB-PCIe", s_mem=1.25, s_comp=1.10, gpu_mem_gib=39.6, m_init_gib=39.0),
    NVSWITCH: dict(gpu="A100-80GB-SXM-NVSwitch", s_mem=1.0, s_comp=1.0, gpu_mem_gib=79.2, m_init_gib=78.5),
}

# Column order of layer_nonattn.csv: the research file's order (per-op columns, then the two sums).
GEMM_COLS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
OTHER_COLS = ["act", "rope", "rmsnorm_x2", "residual_add"]
LAYER_COLS = GEMM_COLS + OTHER_COLS + ["linear_ms", "layer_nonattn_ms"]
LAYER_DECIMALS = 4          # the research-derived file's precision; derived rows are rounded the same way

DTYPE_BYTES = 2
ACTIVATION_BYTES_PER_TOKEN = 2 * 5120 * DTYPE_BYTES   # PP send: cat(hidden, residual), bf16
ALLREDUCE_BYTES_PER_TOKEN = 5120 * DTYPE_BYTES        # TP all-reduce message: hidden, bf16
MAX_TOKENS = 4096                                     # end of the profile grid


# --------------------------------------------------------------------------------------------------------------
# Shapes


def shape_layer_params(m: dict) -> int:
    """Parameters of one unsharded layer: QKV weights + bias, O, gate + up + down, two RMSNorm weights."""
    h, d = m["hidden_size"], m["head_dim"]
    qkv_out = (m["num_q_heads"] + 2 * m["num_kv_heads"]) * d
    return h * qkv_out + qkv_out + h * h + 3 * h * m["ffn"] + 2 * h


def embedding_params(m: dict) -> int:
    return m["vocab_size"] * m["hidden_size"]


# --------------------------------------------------------------------------------------------------------------
# Non-attention layer tables


def load_internlm(data: Path) -> pd.DataFrame:
    """InternLM-20B per-op medians indexed by (tp, num_tokens); median over duplicate token counts
    (2048 and 4096 are profiled twice per TP degree)."""
    raw = pd.read_csv(data / INTERNLM_CSV)
    cols = [c for c in raw.columns if c.startswith("time_stats.") and c.endswith(".median")]
    g = raw.groupby(["num_tensor_parallel_workers", "num_tokens"])[cols].median()
    g.columns = [c.split(".")[1] for c in cols]
    g.index.names = ["tp", "num_tokens"]
    return g


def derive_from_internlm(ilm: pd.DataFrame, model: str, tp: int) -> pd.DataFrame:
    """Section 4.1 shape mapping, per layer, at one TP degree, unrounded.

    QKV has N = 56*128/tp; the nearest InternLM shard is TP(2*tp) (N = 120*128/(2*tp)), scaled by the N ratio
    7168/7680. O is the same shape at the same TP. The 14B MLP is InternLM's at the same TP; the 32B MLP
    (twice as wide) is InternLM's at tp/2, or two InternLM TP1 MLPs at tp = 1. RoPE rotates 40+8 heads
    against InternLM's 40+40. Norms and the residual add act on the full hidden state at every TP degree,
    so they are InternLM's TP1 values.
    """
    def op(t: int, name: str) -> pd.Series:
        return ilm.loc[t, name]

    if model == "qwen2.5-14b":
        mlp_tp, mlp_mult = tp, 1
    elif tp == 1:
        mlp_tp, mlp_mult = 1, 2
    else:
        mlp_tp, mlp_mult = tp // 2, 1
    d = pd.DataFrame(index=ilm.loc[1].index)
    d["qkv_proj"] = op(2 * tp, "attn_pre_proj") * 7168 / 7680
    d["o_proj"] = op(tp, "attn_post_proj")
    d["gate_up_proj"] = mlp_mult * op(mlp_tp, "mlp_up_proj")
    d["down_proj"] = mlp_mult * op(mlp_tp, "mlp_down_proj")
    d["act"] = mlp_mult * op(mlp_tp, "mlp_act")
    d["rope"] = op(tp, "attn_rope") * 48 / 80
    d["rmsnorm_x2"] = op(1, "input_layernorm") + op(1, "post_attention_layernorm")
    d["residual_add"] = op(1, "add")
    # Sums from the unrounded parts, then round, as the research-derived file does.
    d["linear_ms"] = d[GEMM_COLS].sum(axis=1)
    d["layer_nonattn_ms"] = d[["linear_ms"] + OTHER_COLS].sum(axis=1)
    return d[LAYER_COLS].round(LAYER_DECIMALS)


def mlp_source(model: str, tp: int) -> str:
    """Words for the MLP mapping of derive_from_internlm, for meta.toml."""
    if model == "qwen2.5-14b":
        return f"InternLM TP{tp}"
    return "2 x InternLM TP1" if tp == 1 else f"InternLM TP{tp // 2}"


def load_layer_tables(data: Path) -> tuple[dict, dict]:
    """Per-layer tables for every (model, tp), and the max |difference| of the InternLM re-derivation
    against each (model, tp) that the research-derived file contains."""
    src = pd.read_csv(data / LAYER_CSV)
    ilm = load_internlm(data)
    tables, check = {}, {}
    for model, m in MODELS.items():
        for tp in TPS:
            rows = src[(src["model"] == m["name"]) & (src["tp"] == tp)]
            derived = derive_from_internlm(ilm, model, tp)
            if len(rows):
                t = rows.groupby("num_tokens")[LAYER_COLS].median()
                diff = (derived - t).abs().to_numpy()
                if derived.index.equals(t.index):
                    check[(model, tp)] = float(diff.max())
                else:
                    check[(model, tp)] = math.inf
            else:
                t = derived     # 14B TP2: not in the research-derived file
            tables[(model, tp)] = t
    # The derivation is only trusted for the missing rows if it reproduces every row that is present
    # (one unit in the last place at most).
    worst = max(check.values())
    if worst > 1.01 * 10 ** -LAYER_DECIMALS:
        raise SystemExit(f"InternLM re-derivation disagrees with {LAYER_CSV}: {check}")
    return tables, check


def render_layer_csv(t: pd.DataFrame) -> str:
    lines = [",".join(["num_tokens"] + LAYER_COLS)]
    for n, row in t.iterrows():
        lines.append(",".join([str(int(n))] + [f"{row[c]:.{LAYER_DECIMALS}f}" for c in LAYER_COLS]))
    return "\n".join(lines) + "\n"


def running_max(t: pd.DataFrame) -> np.ndarray:
    """Per-layer total after the lookup's running maximum (section 4.4): more tokens never cost less."""
    return np.maximum.accumulate(t["layer_nonattn_ms"].to_numpy())


# --------------------------------------------------------------------------------------------------------------
# Attention


def load_attention(data: Path) -> dict:
    """Coefficient rows of the research-derived file, keyed by what they apply to."""
    raw = pd.read_csv(data / ATTENTION_CSV)
    keys = {"llama_prefill": ("prefill", "Llama-3-8B TP1"),
            "prefill_tp1": ("prefill", "(40 q / 8 kv)"),
            "prefill_tp4": ("prefill", "(10 q / 2 kv)"),
            "decode_kv8": ("decode", "8 KV heads per GPU"),
            "decode_kv2": ("decode", "2 KV heads per GPU")}
    out = {}
    for key, (comp, text) in keys.items():
        hit = raw[raw["component"].str.startswith(comp) & raw["applies_to"].str.contains(text, regex=False)]
        if len(hit) != 1:
            raise SystemExit(f"{ATTENTION_CSV}: expected one {comp} row for {text!r}, found {len(hit)}")
        r = hit.iloc[0]
        out[key] = {"a_ms": r["a_ms"], "b_c": r["b_c_ms_per_tok"], "b_c2": r["b_c2_ms_per_tok2"],
                    "b_cp": r["b_cp_ms_per_tok2"], "b_ctx": r["b_ctx_ms_per_ctx_token"]}
    # The Qwen rows are the Llama fit scaled by query heads; check it so the TP2 scaling below is consistent.
    for key, q_heads in (("prefill_tp1", 40), ("prefill_tp4", 10)):
        for b in ("b_c", "b_c2", "b_cp"):
            want = out["llama_prefill"][b] * q_heads / 32
            if abs(out[key][b] / want - 1) > 2e-3:
                raise SystemExit(f"{ATTENTION_CSV}: {key} {b} is not the Llama fit x {q_heads}/32")
    return out


def attention_for_tp(coef: dict, model: dict, tp: int) -> tuple[dict, dict, str]:
    """(prefill, decode, how) for one TP degree. TP1/TP4 are the file's rows; TP2 (20 q / 4 kv per GPU) scales
    the Llama prefill b-terms by 20/32 (FLOPs scale with query heads) and interpolates decode linearly in KV
    heads per GPU between the 2- and 8-head fits (decode is a KV read, linear in KV bytes)."""
    q_heads = model["num_q_heads"] // tp
    kv_heads = model["num_kv_heads"] // tp
    if tp == 1:
        return coef["prefill_tp1"], coef["decode_kv8"], (
            "TP1 (40 q / 8 kv per GPU): prefill = Qwen TP1 row (Llama-3-8B fit, b x 40/32); "
            "decode = 8-KV-head fit, as given in the source")
    if tp == 4:
        return coef["prefill_tp4"], coef["decode_kv2"], (
            "TP4 (10 q / 2 kv per GPU): prefill = Qwen TP4 row (Llama-3-8B fit, b x 10/32); "
            "decode = 2-KV-head fit, as given in the source")
    llama = coef["llama_prefill"]
    prefill = {"a_ms": llama["a_ms"]}
    for b in ("b_c", "b_c2", "b_cp"):
        prefill[b] = llama[b] * q_heads / 32
    lo, hi = coef["decode_kv2"], coef["decode_kv8"]
    w = (kv_heads - 2) / (8 - 2)
    decode = {k: lo[k] + w * (hi[k] - lo[k]) for k in ("a_ms", "b_ctx")}
    how = (f"TP{tp} ({q_heads} q / {kv_heads} kv per GPU, no fitted row): prefill a = Llama fit a, "
           f"b-terms = Llama-3-8B fit x {q_heads}/32 (FLOPs scale with query heads); decode a and b_ctx "
           f"interpolated linearly in KV heads per GPU between the 2-head (TP4) and 8-head (TP1) fits: "
           f"2-head + ({kv_heads}-2)/6 x (8-head - 2-head)")
    return prefill, decode, how


def fmt_coef(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"


def render_attention_csv(prefill: dict, decode: dict) -> str:
    lines = ["component,a_ms,b_c,b_c2,b_cp,b_ctx",
             ",".join(["prefill"] + [fmt_coef(prefill.get(k)) for k in ("a_ms", "b_c", "b_c2", "b_cp")] + [""]),
             ",".join(["decode", fmt_coef(decode["a_ms"]), "", "", "", fmt_coef(decode["b_ctx"])])]
    return "\n".join(lines) + "\n"


def attention_ms(prefill: dict, c: float, p: float = 0.0) -> float:
    """One prefill piece on one layer (80GB base), section 5."""
    return prefill["a_ms"] + prefill["b_c"] * c + prefill["b_c2"] * c * c + prefill["b_cp"] * c * p


# --------------------------------------------------------------------------------------------------------------
# Communication (NVSwitch profiles)


def load_comm(data: Path) -> pd.DataFrame:
    """Measured DGX collectives as op,num_workers,bytes,ms. all_reduce: one node (devices_per_node =
    num_workers) with 2, 4, 8 GPUs; send_recv: two GPUs on the same node (devices_per_node = 2). The median
    column; the 16 MiB point is profiled twice, so take the median over duplicate sizes."""
    parts = []
    ar = pd.read_csv(data / ALL_REDUCE_CSV)
    ar = ar[ar["num_workers"].isin([2, 4, 8]) & (ar["devices_per_node"] == ar["num_workers"])]
    parts.append(ar.assign(op="all_reduce", ms=ar["time_stats.all_reduce.median"]))
    sr = pd.read_csv(data / SEND_RECV_CSV)
    sr = sr[(sr["num_workers"] == 2) & (sr["devices_per_node"] == 2)]
    parts.append(sr.assign(op="send_recv", ms=sr["time_stats.send_recv.median"]))
    df = pd.concat(parts).rename(columns={"size": "bytes"})
    df = df.groupby(["op", "num_workers", "bytes"], as_index=False)["ms"].median()
    return df.sort_values(["op", "num_workers", "bytes"]).reset_index(drop=True)


def render_comm_csv(df: pd.DataFrame) -> str:
    # Source medians have microsecond resolution; medians of two give half-microseconds: 4 decimals are exact.
    lines = ["op,num_workers,bytes,ms"]
    lines += [f"{r.op},{int(r.num_workers)},{int(r.bytes)},{r.ms:.4f}" for r in df.itertuples()]
    return "\n".join(lines) + "\n"


def fit_alpha_beta(df: pd.DataFrame, op: str, n: int) -> dict:
    """Fit t = alpha + f * bytes / BW to the table, f = 2(n-1)/n for a ring all-reduce and 1 for send_recv,
    over the message sizes Qwen2.5 produces (1..4096 tokens), by least squares in relative error: the
    small-message points (tens of microseconds) would otherwise carry no weight against the large ones."""
    per_token = ALLREDUCE_BYTES_PER_TOKEN if op == "all_reduce" else ACTIVATION_BYTES_PER_TOKEN
    f = 2 * (n - 1) / n if op == "all_reduce" else 1.0
    d = df[(df["op"] == op) & (df["num_workers"] == n)]
    d = d[(d["bytes"] >= per_token) & (d["bytes"] <= per_token * MAX_TOKENS)]
    x = d["bytes"].to_numpy(dtype=float)
    t = d["ms"].to_numpy(dtype=float)
    a = np.column_stack([np.ones_like(x), f * x]) / t[:, None]
    (alpha_ms, inv_bw_ms_per_byte), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    rel = (alpha_ms + f * x * inv_bw_ms_per_byte) / t - 1
    return dict(alpha_us=round(alpha_ms * 1e3, 1), bw_gbps=round(1 / inv_bw_ms_per_byte / 1e6, 1),
                n_points=len(x), lo=int(x.min()), hi=int(x.max()),
                median_abs_rel=float(np.median(np.abs(rel))), rms_rel=float(np.sqrt(np.mean(rel ** 2))))


# --------------------------------------------------------------------------------------------------------------
# KV capacity (section 10)

GIB = 2 ** 30


def kv_rank_tokens(m: dict, tp: int, pp: int, rank: int, m_init_gib: float) -> int:
    """SGLang 0.4.1 profile_max_num_token for one GPU of a tp x pp layout (the last stage takes the
    remainder of the layers)."""
    per_stage = m["num_layers"] // pp
    layers = per_stage if rank < pp - 1 else m["num_layers"] - per_stage * (pp - 1)
    weights = layers * m["layer_params"] / tp * DTYPE_BYTES
    if rank == 0:                       # embedding, vocab-sharded under TP
        weights += embedding_params(m) * DTYPE_BYTES / tp
    if rank == pp - 1:                  # untied LM head, same size
        weights += embedding_params(m) * DTYPE_BYTES / tp
    after_load_gib = m_init_gib - weights / GIB
    cell = (m["num_kv_heads"] // tp) * m["head_dim"] * layers * 2 * DTYPE_BYTES
    return math.floor((after_load_gib - m_init_gib * (1 - 0.9)) * GIB / cell)


def kv_tokens(m: dict, tp: int, pp: int, m_init_gib: float) -> dict:
    r0 = kv_rank_tokens(m, tp, pp, 0, m_init_gib)
    if pp == 1:
        return dict(rank0=r0, rank1=None, pool=r0)
    r1 = kv_rank_tokens(m, tp, pp, 1, m_init_gib)
    # With pp > 1 every stage adopts the average of ranks 0 and 1, rounded down to a multiple of pp.
    return dict(rank0=r0, rank1=r1, pool=(r0 + r1) // 2 // pp * pp)


def kv_table(hardware: str = PCIE, gpus: int = 4) -> str:
    """Markdown table of the KV pool every TP x PP split of `gpus` GPUs leaves, for both models."""
    m_init = HARDWARE[hardware]["m_init_gib"]
    lines = [f"KV pool, {HARDWARE[hardware]['gpu']}, M_init = {m_init} GiB, {gpus} GPUs "
             f"(tokens per stage; each stage's micro-batches share it)", "",
             "| model | TP x PP | layers per GPU | KV heads per GPU | cell (KiB) | weights rank 0 / rank 1 (GiB) "
             "| tokens rank 0 / rank 1 | pool (tokens) |",
             "|---|---|---|---|---|---|---|---|"]
    for model, m in MODELS.items():
        for tp in TPS:
            if gpus % tp:
                continue
            pp = gpus // tp
            layers = m["num_layers"] // pp
            kvh = m["num_kv_heads"] // tp
            cell_kib = kvh * m["head_dim"] * layers * 2 * DTYPE_BYTES / 1024
            k = kv_tokens(m, tp, pp, m_init)
            w = []
            for rank in ([0] if pp == 1 else [0, 1]):
                wb = layers * m["layer_params"] / tp * DTYPE_BYTES
                wb += embedding_params(m) * DTYPE_BYTES / tp * ((rank == 0) + (rank == pp - 1))
                w.append(f"{wb / GIB:.2f}")
            toks = f"{k['rank0']:,}" if pp == 1 else f"{k['rank0']:,} / {k['rank1']:,}"
            lines.append(f"| {m['name']} | {tp} x {pp} | {layers} | {kvh} | {cell_kib:g} | {' / '.join(w)} "
                         f"| {toks} | **{k['pool']:,}** |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# meta.toml

FIT_TARGETS = {   # reference/latency-profiles.md section 12
    "s_mem": "section 12 step 2: Fig. 11 azure-conv ~4 req/s PP_static chunk 512 P90 51.68 ms, P99 65.34 ms; "
             "cnn-reversed ~8 req/s PP_static chunk 256 P90 28.94 ms",
    "s_comp": "section 12 step 2: Fig. 11 azure-conv ~4 req/s PP_static chunk 512 P90 51.68 ms, P99 65.34 ms; "
              "cnn-reversed ~8 req/s PP_static chunk 256 P90 28.94 ms; check: 2048-token prefill then "
              "128-token prefill bubble ~627 ms",
    "cpu_ms": "section 12 step 2: Fig. 11 azure-conv ~4 req/s PP_static chunk 512 P90 51.68 ms, P99 65.34 ms; "
              "cnn-reversed ~8 req/s PP_static chunk 256 P90 28.94 ms",
    "allreduce_busbw_gbps": "section 12 step 3: Fig. 9 azure-conv TP goodput 3.48 req/s, and PP_static beats "
                            "TP on every 32B workload (bound 6-23.7 GB/s)",
    "allreduce_alpha_us": "section 12 step 3: fixed at 60 us (measured bound), not fitted",
    "p2p_bw_gbps": "section 12 step 3: default kept; report the step-2 percentiles at 8 and 12 GB/s",
    "p2p_alpha_us": "section 12 step 3: default kept (15-30 us); sensitivity reported with p2p_bw_gbps",
}


# The ground truth's structure and variance ([ground_truth] in meta.toml; sim/latency/profiled.py).
# Defaults before calibration, and the documented physical range of each (calibrate.py's bounds):
# - cpu_per_request_us: SGLang's Python scheduler walks its per-request lists every iteration
#   (prepare, result processing, finish checks, detokenizer send): about 5-50 us per request;
# - jitter_cv: run-to-run kernel-time variation of one stage (clocks under a 250 W cap, PCIe and
#   memory contention): 1-8%;
# - stall_prob / stall_mean_ms: occasional host-side stalls of an iteration (GC, scheduler
#   hiccups, a late rank at the blocking token broadcast): 0-10% of iterations, 2-30 ms each.
# - slow_prob / slow_mean: occasional slow iterations, every stage stretched by 1 + Exp(slow_mean)
#   (clocks throttled under the power cap, a contended PCIe switch): 0-15% of iterations, 5-60%.
GROUND_TRUTH_DEFAULTS = {"cpu_per_request_us": 20.0, "jitter_cv": 0.03, "stall_prob": 0.02, "stall_mean_ms": 10.0,
                         "slow_prob": 0.02, "slow_mean": 0.2}
GROUND_TRUTH_FILE = DEFAULT_OUT / "ground_truth.toml"  # written by profiles/fit_ground_truth.py
for _k in GROUND_TRUTH_DEFAULTS:
    FIT_TARGETS[_k] = ("section 12 step 2 (variance and per-request CPU, the fidelity issue): Fig. 11 azure-conv "
                       "~4 req/s PP_static chunk 512 P90 51.68 ms, P99 65.34 ms; cnn-reversed ~8 req/s PP_static "
                       "chunk 256 P90 28.94 ms")


def load_ground_truth(path: Path = GROUND_TRUTH_FILE) -> dict:
    """profiles/ground_truth.toml's decode-wave fit, or {} when absent."""
    return tomllib.loads(path.read_text()).get("decode_wave", {}) if path.is_file() else {}


# Status of the parameters profiles/calibrate.py does not fit (PCIE profiles).
UNFITTED_STATUS = {
    "allreduce_busbw_gbps": "default; not fitted by profiles/calibrate.py: section 12 step 3 (TP goodput) belongs "
                            "to the experiments issue; sensitivity in profiles/README.md",
    "allreduce_alpha_us": "default, fixed at 60 us by section 12 step 3 (not fitted)",
    "p2p_bw_gbps": "default kept (no target identifies it); step-2 percentiles at 8 and 12 GB/s in "
                   "profiles/README.md",
    "p2p_alpha_us": "default kept (15-30 us); no target identifies it",
}


def load_fits(path: Path | None) -> dict | None:
    """profiles/fits.toml as {'lookup': {...}, 'fit': {param: entry}}, or None when absent."""
    if path is None or not path.is_file():
        return None
    raw = tomllib.loads(path.read_text())
    fits = {"lookup": raw.get("lookup", {}), "fit": {f["param"]: f for f in raw.get("fit", [])}}
    # NOTE: the TP all-reduce step (profiles/calibrate_tp.py) writes its own file, so re-running
    # the step-2 calibration never drops it.
    tp_path = path.with_name("fits_tp.toml")
    if tp_path.is_file():
        fits["fit"].update({f["param"]: f for f in tomllib.loads(tp_path.read_text()).get("fit", [])})
    return fits


def toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_num(x: float | int) -> str:
    # Keep the type: floats stay floats in TOML ("39.0", not "39"), so a loader sees one type per key.
    return repr(float(x)) if isinstance(x, float) else str(int(x))


def context_length(model: str) -> int:
    """[model] context_length_tokens of profiles/models/<model>.toml (cited there)."""
    return int(tomllib.loads((DEFAULT_OUT / "models" / f"{model}.toml").read_text())["model"]["context_length_tokens"])


def roofline_lines(hardware: str) -> list[str]:
    """The [roofline] section of a hardware folder, from the GPU and interconnect spec files."""
    gpu_name, ic_name = ROOFLINE[hardware]
    gpu = tomllib.loads((DEFAULT_OUT / "gpus" / f"{gpu_name}.toml").read_text())["gpu"]
    base = tomllib.loads((DEFAULT_OUT / "gpus" / f"{BASE_GPU}.toml").read_text())["gpu"]
    link = tomllib.loads((DEFAULT_OUT / "interconnects" / f"{ic_name}.toml").read_text())["link"]
    return [
        "",
        "[roofline]                           # physical bounds: the run-time floor and ppsim profile check",
        f"gpu_spec = {toml_str(gpu_name)}",
        f"bf16_tflops = {toml_num(float(gpu['bf16_tflops']))}",
        f"hbm_bw_gbps = {toml_num(float(gpu['hbm_bw_gbps']))}",
        f"interconnect = {toml_str(ic_name)}",
        f"link_bw_gbps = {toml_num(float(link['bw_gbps'][KERNEL_FAMILY]))}",
        f"base_gpu_spec = {toml_str(BASE_GPU)}",
        f"base_bf16_tflops = {toml_num(float(base['bf16_tflops']))}",
        f"base_hbm_bw_gbps = {toml_num(float(base['hbm_bw_gbps']))}",
        "source = " + toml_str(f"profiles/gpus/{gpu_name}.toml ({gpu['source']}); link: profiles/interconnects/"
                               f"{ic_name}.toml [link] ({link['source']}); tables measured on profiles/gpus/"
                               f"{BASE_GPU}.toml"),
    ]


def measured_ranges(data: Path) -> dict[int, dict[str, list[int]]]:
    """Per TP degree, the ranges of the attention points behind the coefficients (TP1: the 8-KV-head decode
    points, TP4: the 2-KV-head ones, TP2: both, interpolated between them; prefill: every prefill point)."""
    pts = pd.read_csv(data / ATTENTION_POINTS_CSV)
    pre, dec = pts[pts["kind"] == "prefill"], pts[pts["kind"] == "decode"]
    ctx = pre["prefill_chunk_size"] + pre["kv_cache_size"]
    out = {}
    for tp, sel in ((1, dec["tp"] == 1), (2, dec["tp"].isin([1, 4])), (4, dec["tp"] == 4)):
        d = dec[sel]
        out[tp] = {"prefill_chunk": [int(pre["prefill_chunk_size"].min()), int(pre["prefill_chunk_size"].max())],
                   "prefill_context": [int(ctx.min()), int(ctx.max())],
                   "decode_batch": [int(d["batch_size"].min()), int(d["batch_size"].max())],
                   "decode_context": [int(d["kv_cache_size"].min()), int(d["kv_cache_size"].max())]}
    return out


def measured_lines(ranges: dict, comm_bytes: list[int] | None) -> list[str]:
    lines = ["", "[measured]                           # what the tables and fits cover; beyond: profiles/FORMAT.md",
             f"tokens = [1, {MAX_TOKENS}]"]
    lines += [f"{k} = [{v[0]}, {v[1]}]" for k, v in ranges.items()]
    if comm_bytes:
        lines.append(f"comm_bytes = [{comm_bytes[0]}, {comm_bytes[1]}]")
    src = (f"tokens: the research-derived layer grid; attention: the points of data/{ATTENTION_POINTS_CSV} behind "
           f"data/{ATTENTION_CSV}" + ("; comm_bytes: comm.csv" if comm_bytes else ""))
    lines += [f"source = {toml_str(src)}", f"beyond = {toml_str(BEYOND)}"]
    return lines


def render_meta(hardware: str, model: str, tp: int, sources: list[str], derivation: dict,
                comm: dict, fits: dict | None = None, measured: dict | None = None,
                comm_bytes: list[int] | None = None) -> str:
    hw, m = HARDWARE[hardware], MODELS[model]
    nvswitch = hardware == NVSWITCH
    fits = None if nvswitch else fits
    fitted = {k: v["value"] for k, v in (fits or {}).get("fit", {}).items()}
    if fitted:
        hw = dict(hw, **{k: fitted[k] for k in ("s_mem", "s_comp") if k in fitted})
    cpu_ms = fitted.get("cpu_ms", 2.0)
    mode = (fits or {}).get("lookup", {}).get("mode", "grid")
    scaling_status = "measured hardware, no scaling" if nvswitch else "default, not yet fitted"
    out = [
        "# Generated by profiles/build_a100.py from the shared data folder; do not edit by hand.",
        "[profile]",
        f"gpu = {toml_str(hw['gpu'])}",
        f"model = {toml_str(model)}",
        f"tp = {tp}",
        'base_hardware = "A100-80GB (Vidur profile)"',
        'units = { time = "ms", size = "bytes", bandwidth = "GB/s (1e9 B/s)" }',
        "sources = [" + ", ".join(toml_str(s) for s in sources) + "]",
        "",
        "[model]",
        f"num_layers = {m['num_layers']}",
        f"hidden_size = {m['hidden_size']}",
        f"num_q_heads = {m['num_q_heads']}",
        f"num_kv_heads = {m['num_kv_heads']}",
        f"head_dim = {m['head_dim']}",
        f"vocab_size = {m['vocab_size']}",
        f"intermediate_size = {m['ffn']}",
        f"layer_params = {m['layer_params'] / 1e6:g}e6          # from shapes: {shape_layer_params(m)}",
        f"embedding_params = {embedding_params(m)}    # vocab x hidden; the untied LM head has the same size",
        f"dtype_bytes = {DTYPE_BYTES}",
        f"context_length_tokens = {context_length(model)}     # max_position_embeddings (profiles/models/{model}.toml)",
        "",
        "[lookup]",
        f"mode = {toml_str(mode)}",
    ]
    if fits and fits.get("lookup"):
        lk = fits["lookup"]
        out += [f"{k} = {toml_str(lk[k])}" for k in ("status", "target", "achieved", "residual") if k in lk]
    out += [
        "",
        "[scaling]",
        f"s_mem = {toml_num(hw['s_mem'])}",
        f"s_comp = {toml_num(hw['s_comp'])}",
        "mem_bound_tokens = 128",
        "comp_bound_tokens = 1024",
        "",
        "[overhead]",
        f"cpu_ms = {toml_num(float(cpu_ms))}",
        "lm_head_ms = 1.0",
        "embedding_ms = 0.1",
        "sample_ms = 0.2",
        "broadcast_us = 30",
        "",
        "[comm]",
    ]
    if nvswitch:
        out += [
            'model = "table"                      # comm.csv; the alpha-beta keys below are a fitted fallback',
            f"p2p_alpha_us = {toml_num(comm['p2p']['alpha_us'])}",
            f"p2p_bw_gbps = {toml_num(comm['p2p']['bw_gbps'])}",
            f"activation_bytes_per_token = {ACTIVATION_BYTES_PER_TOKEN}",
            f"allreduce_alpha_us = {toml_num(comm['ar']['alpha_us'])}",
            f"allreduce_busbw_gbps = {toml_num(comm['ar']['bw_gbps'])}",
        ]
    else:
        out += [
            'model = "alpha-beta"',
            f"p2p_alpha_us = {toml_num(fitted.get('p2p_alpha_us', 25))}",
            f"p2p_bw_gbps = {toml_num(fitted.get('p2p_bw_gbps', 10))}",
            f"activation_bytes_per_token = {ACTIVATION_BYTES_PER_TOKEN}",
            f"allreduce_alpha_us = {toml_num(fitted.get('allreduce_alpha_us', 60))}",
            f"allreduce_busbw_gbps = {toml_num(fitted.get('allreduce_busbw_gbps', 9))}",
        ]
    gt_fit = {k: float(fitted.get(k, v)) for k, v in GROUND_TRUTH_DEFAULTS.items()}
    wave = load_ground_truth()
    out += [
        "",
        "[ground_truth]                        # structure and variance of the truth (profiles/FORMAT.md)",
        f"decode_wave_fraction = {toml_num(float(wave.get('decode_wave_fraction', 0.0)))}",
        f"sm_count = {int(wave.get('sm_count', 108))}",
    ] + [f"{k} = {toml_num(v)}" for k, v in gt_fit.items()]
    if wave:
        out += [f"decode_wave_source = {toml_str(wave['source'])}",
                f"decode_wave_achieved = {toml_str(wave['achieved'])}"]
    out += [
        "",
        "[memory]",
        f"gpu_mem_gib = {toml_num(hw['gpu_mem_gib'])}",
        f"m_init_gib = {toml_num(hw['m_init_gib'])}",
    ]
    out += roofline_lines(hardware)
    if measured is not None:
        out += measured_lines(measured, comm_bytes)
    out += [
        "",
        "[derivation]                         # how the tables were made (not read by the simulator)",
    ]
    out += [f"{k} = {toml_str(v)}" for k, v in derivation.items()]

    values = {"s_mem": hw["s_mem"], "s_comp": hw["s_comp"], "cpu_ms": float(cpu_ms)}
    if nvswitch:
        values.update(allreduce_busbw_gbps=comm["ar"]["bw_gbps"], allreduce_alpha_us=comm["ar"]["alpha_us"],
                      p2p_bw_gbps=comm["p2p"]["bw_gbps"], p2p_alpha_us=comm["p2p"]["alpha_us"])
    else:
        values.update(allreduce_busbw_gbps=9, allreduce_alpha_us=60, p2p_bw_gbps=10, p2p_alpha_us=25)
        values.update({k: v for k, v in fitted.items() if k in values})
    values.update(gt_fit)
    for param in ("s_mem", "s_comp", "cpu_ms", *GROUND_TRUTH_DEFAULTS, "allreduce_busbw_gbps", "allreduce_alpha_us",
                  "p2p_bw_gbps", "p2p_alpha_us"):
        status, target, achieved, residual = "default, not yet fitted", FIT_TARGETS[param], "", ""
        if nvswitch and param in ("s_mem", "s_comp"):
            status, target = scaling_status, "none: the base tables were measured on A100-80GB"
        elif nvswitch and param not in ("cpu_ms", *GROUND_TRUTH_DEFAULTS):
            f = comm["p2p" if param.startswith("p2p") else "ar"]
            status = "fitted to comm.csv (fallback only; [comm] model = \"table\")"
            target = (f"comm.csv {f['op']} num_workers {f['n']}{' (unused at tp1)' if f['unused'] else ''}, "
                      f"{f['n_points']} sizes {f['lo']}-{f['hi']} B, least squares in relative error")
            achieved = f"median |relative error| {f['median_abs_rel']:.1%}"
            residual = f"rms relative error {f['rms_rel']:.1%}"
        seeds, commit, method = 0, "", ""
        if fits is not None:
            f = fits["fit"].get(param)
            if f is not None:
                status, target, achieved, residual = f["status"], f["target"], f["achieved"], f["residual"]
                seeds, commit, method = f.get("seeds", 0), f.get("simulator_commit", ""), f.get("method", "")
            elif param in UNFITTED_STATUS:
                status = UNFITTED_STATUS[param]
        out += ["", "[[fit]]", f"param = {toml_str(param)}", f"value = {toml_num(values[param])}",
                f"status = {toml_str(status)}", f"target = {toml_str(target)}",
                f"achieved = {toml_str(achieved)}", f"residual = {toml_str(residual)}"]
        if fits is not None:
            out += [f"seeds = {int(seeds)}", f"simulator_commit = {toml_str(commit)}"]
            if method:
                out += [f"method = {toml_str(method)}"]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Build


def build(data: Path, fits_path: Path | None = FITS_TOML) -> dict[str, str]:
    """Every generated file, as {path relative to the profiles folder: text}. The fitted values and
    [[fit]] entries of the PCIE profiles come from `fits_path` (profiles/fits.toml) when it exists."""
    fits = load_fits(fits_path)
    for model, m in MODELS.items():
        # meta.toml states the rounded figure of section 10; make sure the shapes agree with it.
        if abs(shape_layer_params(m) - m["layer_params"]) > 0.05e6:
            raise SystemExit(f"{model}: layer_params {m['layer_params']} != shapes {shape_layer_params(m)}")

    layers, check = load_layer_tables(data)
    coef = load_attention(data)
    comm_df = load_comm(data)
    comm_csv = render_comm_csv(comm_df)
    measured = measured_ranges(data)
    comm_bytes = [int(comm_df["bytes"].min()), int(comm_df["bytes"].max())]
    p2p = dict(fit_alpha_beta(comm_df, "send_recv", 2), op="send_recv", n=2, unused=False)
    check_text = ", ".join(f"{m.split('-')[1].upper()} TP{t} {d:.4f} ms" for (m, t), d in sorted(check.items()))

    files = {}
    for model, m in MODELS.items():
        for tp in TPS:
            prefill, decode, attn_how = attention_for_tp(coef, m, tp)
            derived = (model, tp) not in check
            layer_how = (
                "rows of the research-derived file for this model and TP (median over duplicate token counts)"
                if not derived else
                "not in the research-derived file: derived from InternLM-20B (Vidur A100-80GB) per section 4.1: "
                f"MLP (gate_up, down, act) = {mlp_source(model, tp)}; O = InternLM TP{tp}; "
                f"QKV = InternLM TP{2 * tp} attn_pre_proj x 7168/7680; rope = InternLM TP{tp} x 48/80; "
                "norms and residual add = InternLM TP1 (full hidden); median over duplicate token counts; "
                "sums from unrounded parts, rounded to 4 decimals")
            sources = ["data/" + LAYER_CSV, "data/" + LAYER_DERIVATION_CSV, "data/" + INTERNLM_CSV,
                       "data/" + ATTENTION_CSV]
            derivation = {
                "layer_nonattn": layer_how,
                "layer_method_check": ("the section 4.1 mapping applied to InternLM-20B reproduces every row of "
                                       f"the research-derived file; max |diff| over all columns: {check_text}"),
                "attention": attn_how,
            }
            for hardware in HARDWARE:
                comm = None
                srcs = list(sources)
                if hardware == NVSWITCH:
                    n = tp if tp > 1 else 2
                    ar = dict(fit_alpha_beta(comm_df, "all_reduce", n), op="all_reduce", n=n, unused=tp == 1)
                    comm = {"ar": ar, "p2p": p2p}
                    srcs += ["data/" + ALL_REDUCE_CSV, "data/" + SEND_RECV_CSV]
                    derivation_hw = dict(derivation, comm=(
                        "comm.csv: DGX A100 NVSwitch medians; all_reduce rows with num_workers 2/4/8 on one node "
                        "(devices_per_node = num_workers), send_recv rows with 2 GPUs on one node "
                        "(devices_per_node = 2); median over duplicate sizes. The alpha-beta keys are fitted "
                        f"to it (all_reduce at num_workers {n}, ring factor 2(n-1)/n; send_recv at 2) over "
                        "1-4096 tokens of Qwen messages, least squares in relative error"))
                else:
                    derivation_hw = derivation
                d = f"{hardware}/{model}/tp{tp}"
                files[f"{d}/layer_nonattn.csv"] = render_layer_csv(layers[(model, tp)])
                files[f"{d}/attention.csv"] = render_attention_csv(prefill, decode)
                files[f"{d}/meta.toml"] = render_meta(hardware, model, tp, srcs, derivation_hw, comm, fits,
                                                      measured[tp], comm_bytes if hardware == NVSWITCH else None)
                if hardware == NVSWITCH:
                    files[f"{d}/comm.csv"] = comm_csv
    for path, text in files.items():
        if path.endswith(".toml"):
            tomllib.loads(text)     # fail here, not in the simulator, if a string broke the syntax
    return files


def generated_dirs() -> list[str]:
    return list(HARDWARE)


def compare(files: dict[str, str], out: Path) -> list[str]:
    """Differences between the generated files and those under `out`, as 'differs|missing|unexpected: path'."""
    problems = []
    for path, text in sorted(files.items()):
        p = out / path
        if not p.exists():
            problems.append(f"missing: {path}")
        elif p.read_bytes() != text.encode():
            problems.append(f"differs: {path}")
    for top in generated_dirs():
        root = out / top
        if root.exists():
            for p in sorted(root.rglob("*")):
                rel = p.relative_to(out).as_posix()
                if p.is_file() and rel not in files:
                    problems.append(f"unexpected: {rel}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared data folder (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="profiles folder (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing; exit 1 on any "
                    "difference")
    ap.add_argument("--kv-table", action="store_true", help="print the KV-capacity tables and exit")
    ap.add_argument("--fits", type=Path, default=FITS_TOML, help="fitted values written by profiles/calibrate.py "
                    "(default: %(default)s; applied when present)")
    args = ap.parse_args(argv)

    if args.kv_table:
        print(kv_table(PCIE))
        print(kv_table(NVSWITCH))
        return 0
    if not args.data.is_dir():
        print(f"data folder not found: {args.data}", file=sys.stderr)
        return 2
    files = build(args.data, args.fits)
    if args.check:
        problems = compare(files, args.out)
        for line in problems:
            print(line)
        print(f"{len(files)} files checked, {len(problems)} differences")
        return 1 if problems else 0
    for path, text in files.items():
        p = args.out / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode())
    print(f"wrote {len(files)} files under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
