"""Writing PipeSim profile directories (profiles/FORMAT.md) from measured data.

Shared by `ppsim profile import-vidur` (sim.profiling.vidur_import) and `ppsim profile collect`
(sim.profiling.collect):

- `read_model_config(path)`: the small model TOML (`[model]` of FORMAT.md plus `tp`);
- `fit_attention(prefill_points, decode_points)`: least-squares fit of the attention model;
- `analytic_attention(shape, tp)`: the roofline fallback when no attention points exist;
- `write_profile(out, ...)`: layer_nonattn.csv, attention.csv, optional comm.csv and meta.toml,
  written into a staging sibling of `out`, loaded there with `Profile.load` and only then swapped
  in whole (`sim.core.fsio.StagedFolder`), so a written profile is always a valid one and a
  failed or interrupted write leaves `out` as it was (or absent);
- `check_staged(staged)`: that load, shared with `ppsim profile build` (sim.profiling.build).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core import fsio, tomlio
from sim.core.errors import DataError, PipeSimError

# Per-iteration and per-stage extras a profile adds on top of the measured layers (profiles/FORMAT.md
# [overhead]); assumed values, not fitted to anything.
DEFAULT_OVERHEAD = {"cpu_ms": 2.0, "lm_head_ms": 1.0, "embedding_ms": 0.1, "sample_ms": 0.2, "broadcast_us": 30}
OVERHEAD_UNITS = {"cpu_ms": "ms per iteration, scheduler CPU on the critical path",
                  "lm_head_ms": "ms per iteration on the last stage, split over TP",
                  "embedding_ms": "ms on the first stage", "sample_ms": "ms on the last stage",
                  "broadcast_us": "us per iteration, token-id broadcast when PP > 1"}

MODEL_KEYS_INT = ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "vocab_size")
LAYER_COLS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act", "rope", "rmsnorm_x2", "residual_add",
              "linear_ms", "layer_nonattn_ms"]
GEMM_COLS = LAYER_COLS[:4]

# Roofline rates used only when no attention points were measured (A100-class, from the Vidur
# Llama-3-8B fits in reference/latency-profiles.md section 5): causal c^2 term, c*p term, KV reads.
ANALYTIC_C2_FLOPS = 176e12
ANALYTIC_CP_FLOPS = 133e12
ANALYTIC_KV_BYTES_PER_S = 1.64e12
ANALYTIC_PREFILL_A_MS = 0.0117
ANALYTIC_DECODE_A_MS = 0.0204


def read_model_config(path: str | Path) -> dict:
    """The model TOML: `tp` (top level or in [model]) and a [model] table with FORMAT.md's keys.
    `intermediate_size`, `dtype_bytes`, `layer_params`, `embedding_params`, `context_length_tokens` are
    optional (the two params are computed from the shapes, gated MLP with QKV bias assumed). Optional
    [profile] (gpu, model; `gpu_spec` and `interconnect`, names in profiles/gpus/ and profiles/interconnects/,
    give the profile its [roofline] bounds),
    [memory] (gpu_mem_gib, m_init_gib) and [overhead] tables are copied into meta.toml."""
    path = Path(path)
    cfg = tomlio.read_toml(path, DataError, "model config not found")
    m = cfg.get("model")
    if not isinstance(m, dict):
        raise DataError(f"{path}: missing table [model]")
    m = dict(m)
    tp = cfg.get("tp", m.pop("tp", None))
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DataError(f"{path}: key 'tp' must be an integer >= 1, got {tp!r}")
    for key in MODEL_KEYS_INT:
        v = m.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DataError(f"{path}: [model] key {key!r} must be an integer >= 1, got {v!r}")
    if m["num_q_heads"] % tp or m["num_kv_heads"] % tp and m["num_kv_heads"] > tp:
        raise DataError(f"{path}: tp = {tp} does not divide the heads ({m['num_q_heads']} q / {m['num_kv_heads']} kv)")
    m.setdefault("dtype_bytes", 2)
    h, d, ffn = m["hidden_size"], m["head_dim"], m.get("intermediate_size", 0)
    if "layer_params" not in m:
        if not ffn:
            raise DataError(f"{path}: [model] needs 'layer_params' or 'intermediate_size'")
        qkv = (m["num_q_heads"] + 2 * m["num_kv_heads"]) * d
        m["layer_params"] = float(h * qkv + qkv + m["num_q_heads"] * d * h + 3 * h * ffn + 2 * h)
    m.setdefault("embedding_params", m["vocab_size"] * h)
    return {"tp": tp, "model": m, "profile": dict(cfg.get("profile", {})),
            "memory": dict(cfg.get("memory", {})), "overhead": dict(cfg.get("overhead", {})), "path": path}


# -- attention ---------------------------------------------------------------------------------------------

def fit_attention(prefill: pd.DataFrame | None, decode: pd.DataFrame | None) -> tuple[dict, dict, dict]:
    """Fit per-layer attention models by non-negative least squares in relative error.

    prefill: columns batch (pieces), chunk, prefix, ms -> t = a + b_c*B*c + b_c2*B*c^2 + b_cp*B*c*p
    decode: columns batch, context, ms -> t = a + b_ctx*B*ctx. Returns (prefill, decode, quality);
    quality holds points and median/p90 |relative error| per component."""
    from scipy.optimize import nnls

    quality: dict = {}
    pre = dec = None
    if prefill is not None and len(prefill) >= 4:
        B, c, p, t = (prefill[k].to_numpy(float) for k in ("batch", "chunk", "prefix", "ms"))
        X = np.column_stack([np.ones_like(c), B * c, B * c * c, B * c * p])
        coef, _ = nnls(X / t[:, None], np.ones_like(t))
        rel = np.abs(X @ coef / t - 1)
        pre = dict(zip(("a_ms", "b_c", "b_c2", "b_cp"), coef.tolist()))
        quality["prefill"] = {"points": len(t), "median_rel_err": float(np.median(rel)),
                              "p90_rel_err": float(np.percentile(rel, 90))}
    if decode is not None and len(decode) >= 2:
        B, ctx, t = (decode[k].to_numpy(float) for k in ("batch", "context", "ms"))
        X = np.column_stack([np.ones_like(t), B * ctx])
        coef, _ = nnls(X / t[:, None], np.ones_like(t))
        rel = np.abs(X @ coef / t - 1)
        dec = {"a_ms": float(coef[0]), "b_ctx": float(coef[1])}
        quality["decode"] = {"points": len(t), "median_rel_err": float(np.median(rel)),
                             "p90_rel_err": float(np.percentile(rel, 90))}
    return pre, dec, quality


def analytic_attention(model: dict, tp: int) -> tuple[dict, dict]:
    """Roofline attention coefficients (ms per layer) from the shapes, for when nothing was measured."""
    qh = model["num_q_heads"] / tp
    kvh = max(1.0, model["num_kv_heads"] / tp)
    d, db = model["head_dim"], model.get("dtype_bytes", 2)
    pre = {"a_ms": ANALYTIC_PREFILL_A_MS, "b_c": 0.0,
           "b_c2": 2 * d * qh / ANALYTIC_C2_FLOPS * 1e3,      # causal QK^T + PV: 2*2*c^2/2*d flops per head
           "b_cp": 4 * d * qh / ANALYTIC_CP_FLOPS * 1e3}
    dec = {"a_ms": ANALYTIC_DECODE_A_MS, "b_ctx": 2 * kvh * d * db / ANALYTIC_KV_BYTES_PER_S * 1e3}
    return pre, dec


# -- communication -------------------------------------------------------------------------------------------

def fit_alpha_beta(comm: pd.DataFrame, op: str, n: int, lo: float, hi: float) -> tuple[float, float] | None:
    """(alpha_us, bw_gbps) of t = alpha + f*bytes/BW over sizes in [lo, hi], least squares in relative
    error; f = 2(n-1)/n for all_reduce, 1 for send_recv. None if fewer than 2 points."""
    d = comm[(comm["op"] == op) & (comm["num_workers"] == n) & (comm["bytes"] >= lo) & (comm["bytes"] <= hi)]
    if len(d) < 2:
        d = comm[(comm["op"] == op) & (comm["num_workers"] == n)]
    if len(d) < 2:
        return None
    f = 2 * (n - 1) / n if op == "all_reduce" else 1.0
    x, t = d["bytes"].to_numpy(float), d["ms"].to_numpy(float)
    X = np.column_stack([np.ones_like(x), f * x]) / t[:, None]
    from scipy.optimize import nnls

    (alpha, inv_bw), _ = nnls(X, np.ones_like(t))
    if inv_bw <= 0:
        return None
    return float(alpha) * 1e3, 1.0 / float(inv_bw) / 1e6      # ms -> us; bytes/ms -> GB/s


# -- writing ---------------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:.6g}"


def check_staged(staged: fsio.StagedFolder) -> None:
    """Load the profile written into `staged` before it is swapped in (one that does not load never
    replaces anything); an error names the destination folder, not the hidden staging folder."""
    from sim.latency.profiled import Profile

    try:
        Profile.load(staged.path)
    except PipeSimError as exc:
        raise type(exc)(str(exc).replace(str(staged.path), str(staged.out))) from None


def write_profile(out: str | Path, *, cfg: dict, layer: pd.DataFrame, prefill: dict, decode: dict,
                  comm: pd.DataFrame | None, gpu: str, base_hardware: str, sources: list[str],
                  derivation: dict, provenance: dict | None = None, overhead_status: dict | None = None,
                  source: str | None = None):
    """Write a profile directory and return the loaded `Profile`. `layer` is indexed by num_tokens and
    has (a subset of) LAYER_COLS, at least layer_nonattn_ms; scaling is 1.0 (the tables are the
    measured hardware)."""
    from sim.latency.profiled import Profile

    # Every file goes into this staging folder; `out` is replaced only once all of them load.
    with fsio.StagedFolder(out) as staged:
        _write_files(staged.path, cfg=cfg, layer=layer, prefill=prefill, decode=decode, comm=comm, gpu=gpu,
                     base_hardware=base_hardware, sources=sources, derivation=derivation,
                     provenance=provenance, overhead_status=overhead_status, source=source)
        check_staged(staged)
        staged.commit()
    return Profile.load(out)


def _write_files(out: Path, *, cfg: dict, layer: pd.DataFrame, prefill: dict, decode: dict,
                 comm: pd.DataFrame | None, gpu: str, base_hardware: str, sources: list[str],
                 derivation: dict, provenance: dict | None, overhead_status: dict | None,
                 source: str | None) -> None:
    """The profile's files, written into the (staging) folder `out`."""
    layer = layer.sort_index()
    cols = [c for c in LAYER_COLS if c in layer.columns]
    lines = [",".join(["num_tokens"] + cols)]
    for n, row in layer.iterrows():
        lines.append(",".join([str(int(n))] + [f"{row[c]:.6g}" for c in cols]))
    fsio.write_text(out / "layer_nonattn.csv", "\n".join(lines) + "\n")
    att = ["component,a_ms,b_c,b_c2,b_cp,b_ctx",
           ",".join(["prefill"] + [_fmt(prefill[k]) for k in ("a_ms", "b_c", "b_c2", "b_cp")] + [""]),
           ",".join(["decode", _fmt(decode["a_ms"]), "", "", "", _fmt(decode["b_ctx"])])]
    fsio.write_text(out / "attention.csv", "\n".join(att) + "\n")

    m, tp = cfg["model"], cfg["tp"]
    act_bytes = 2 * m["hidden_size"] * m["dtype_bytes"]
    ar_bytes = m["hidden_size"] * m["dtype_bytes"]
    comm_meta = {"model": "alpha-beta", "p2p_alpha_us": 25, "p2p_bw_gbps": 10,
                 "activation_bytes_per_token": act_bytes, "allreduce_alpha_us": 60, "allreduce_busbw_gbps": 9}
    fits = []
    if comm is not None and len(comm):
        comm = comm.sort_values(["op", "num_workers", "bytes"]).reset_index(drop=True)
        lines = ["op,num_workers,bytes,ms"] + [f"{r.op},{int(r.num_workers)},{int(r.bytes)},{r.ms:.6g}"
                                               for r in comm.itertuples()]
        fsio.write_text(out / "comm.csv", "\n".join(lines) + "\n")
        has_sr = (comm["op"] == "send_recv").any()
        has_ar = ((comm["op"] == "all_reduce") & (comm["num_workers"] == tp)).any()
        if has_sr and (tp == 1 or has_ar):
            comm_meta["model"] = "table"
        sr = fit_alpha_beta(comm, "send_recv", 2, act_bytes, act_bytes * 4096)
        if sr:
            comm_meta["p2p_alpha_us"], comm_meta["p2p_bw_gbps"] = round(sr[0], 3), round(sr[1], 3)
        ar = fit_alpha_beta(comm, "all_reduce", tp, ar_bytes, ar_bytes * 4096) if tp > 1 else None
        if ar:
            comm_meta["allreduce_alpha_us"], comm_meta["allreduce_busbw_gbps"] = round(ar[0], 3), round(ar[1], 3)
        fits = [("p2p_alpha_us", sr), ("p2p_bw_gbps", sr), ("allreduce_alpha_us", ar), ("allreduce_busbw_gbps", ar)]
    memory = {"gpu_mem_gib": 79.2, "m_init_gib": 78.5}
    memory.update(cfg.get("memory", {}))
    overhead = dict(DEFAULT_OVERHEAD)
    overhead.update(cfg.get("overhead", {}))
    prof = cfg.get("profile", {})
    meta = {
        "profile": {"gpu": prof.get("gpu", gpu), "model": prof.get("model", cfg["path"].stem), "tp": tp,
                    "base_hardware": base_hardware,
                    "units": {"time": "ms", "size": "bytes", "bandwidth": "GB/s (1e9 B/s)"},
                    "sources": sources, **({"source": source} if source else {})},
        "model": {k: m[k] for k in (*MODEL_KEYS_INT, "intermediate_size", "layer_params", "embedding_params",
                                     "dtype_bytes", "context_length_tokens") if k in m},
        "lookup": {"mode": "grid"},
        "scaling": {"s_mem": 1.0, "s_comp": 1.0, "mem_bound_tokens": 128, "comp_bound_tokens": 1024},
        "overhead": overhead,
        "comm": comm_meta,
        "memory": memory,
        "derivation": derivation,
    }
    meta["measured"] = {"tokens": [int(layer.index[0]), int(layer.index[-1])],
                        "source": "tokens: the grid of layer_nonattn.csv"}
    if prof.get("gpu_spec"):
        # [roofline] (profiles/FORMAT.md): the run-time floor and `ppsim profile check`, from the spec files
        from sim.latency.hardware import load_gpu, load_interconnect
        from sim.profiling.specs import roofline_section

        g = load_gpu(str(prof["gpu_spec"]))
        ic = load_interconnect(str(prof.get("interconnect", g.default_interconnect)))
        meta["roofline"] = roofline_section(g, ic, g.kernel_data)
        meta["profile"]["gpu_spec"] = g.name
    if provenance:
        meta["provenance"] = provenance
    text = "# Generated by ppsim profile; do not edit by hand.\n" + tomlio.dumps(meta)
    fitted = {k for k, v in fits if v}
    for param in ("s_mem", "s_comp", "cpu_ms", "allreduce_busbw_gbps", "allreduce_alpha_us", "p2p_bw_gbps",
                  "p2p_alpha_us"):
        sec = "scaling" if param.startswith("s_") else "overhead" if param == "cpu_ms" else "comm"
        status = ("measured hardware, no scaling" if sec == "scaling" else
                  (overhead_status or {}).get(param, "default, not yet fitted") if sec == "overhead" else
                  "fitted to comm.csv (fallback alpha-beta)" if param in fitted else "default, not yet fitted")
        text += ("\n[[fit]]\n" + tomlio.dumps({"param": param, "value": meta[sec][param], "status": status,
                                                  "target": "", "achieved": "", "residual": ""}))
    fsio.write_text(out / "meta.toml", text)


def check_positive(df: pd.DataFrame, col: str, where: str) -> pd.Series:
    vals = pd.to_numeric(df[col], errors="coerce")
    if vals.isna().any() or (vals < 0).any() or not np.all(np.isfinite(vals)):
        raise DataError(f"{where}: column {col!r} must hold non-negative numbers")
    return vals


def nan_to_none(x: float):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x
