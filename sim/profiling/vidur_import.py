"""Convert Vidur-format profiling CSVs into a PipeSim profile directory (`ppsim profile import-vidur`).

Inputs (Vidur's `data/profiling` layout; see ../shared/data/README.md):

- `mlp.csv` (required): per-operator kernel times, `time_stats.<op>.median` (ms) per `num_tokens`
  and `num_tensor_parallel_workers`, ops attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj,
  mlp_act, attn_rope, input_layernorm, post_attention_layernorm, add. The rows at the model
  config's `tp` are taken as they are (no shape mapping: the CSV must describe the model, which is
  checked against its n_embd / n_expanded_embd columns when present); median over duplicate token
  counts. Per layer: qkv = attn_pre_proj, o = attn_post_proj, gate_up = mlp_up_proj,
  down = mlp_down_proj, act = mlp_act, rope = attn_rope, rmsnorm_x2 = the two layernorms,
  residual_add = add.
- `attention.csv` (optional): Vidur's format (`is_prefill`, `batch_size`, `prefill_chunk_size`,
  `kv_cache_size`, `time_stats.attn_prefill.median`, `time_stats.attn_decode.median`,
  `num_tensor_parallel_workers`) or the transcribed excerpt's (`kind`, `tp`, `batch_size`,
  `prefill_chunk_size`, `kv_cache_size`, `time_ms`). The prefill and decode models are fitted by
  non-negative least squares in relative error (`profile_io.fit_attention`). Without it the
  attention coefficients are a roofline estimate from the shapes (recorded as assumed).
- `all_reduce.csv` / `send_recv.csv` (optional, in DIR or --network): `time_stats.<op>.median`,
  `num_workers`, `size` (bytes), `devices_per_node`. Kept: all_reduce on one node
  (devices_per_node = num_workers), send_recv between 2 GPUs of one node; median over duplicate
  sizes. Written to comm.csv, with `[comm] model = "table"` when send_recv (and, for tp > 1, the
  all-reduce at num_workers = tp) is present.

Vidur's simulator has no per-iteration CPU overhead, LM head, embedding, sampling or broadcast term; a
PipeSim profile has them (`[overhead]`). Every one is reported with its value and status: the default
(assumed, not fitted), user-supplied in CONFIG's `[overhead]` table or by `--overhead key=value`, or
off (`--no-overheads`, for a like-for-like comparison with Vidur).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.errors import DataError
from sim.profiling.profile_io import (DEFAULT_OVERHEAD, OVERHEAD_UNITS, analytic_attention, fit_attention,
                                    read_model_config, write_profile)
from sim.latency.profiled import read_csv_table

MLP_OPS = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "gate_up_proj": "mlp_up_proj",
           "down_proj": "mlp_down_proj", "act": "mlp_act", "rope": "attn_rope"}
NORM_OPS = ("input_layernorm", "post_attention_layernorm")


def _find(dirs: list[Path], name: str) -> Path | None:
    hits: list[Path] = []
    for d in dirs:
        if (d / name).is_file():
            hits.append(d / name)
    if not hits:
        for d in dirs:
            hits += sorted(d.rglob(name))
    hits = sorted(set(hits))
    if len(hits) > 1:
        raise DataError(f"{dirs[0]}: several {name} files found ({', '.join(str(h) for h in hits[:3])}); "
                        f"point DIR/--network at one model / one network folder")
    return hits[0] if hits else None


def _numeric(df: pd.DataFrame, col: str, path: Path, positive: bool = False) -> pd.Series:
    vals = pd.to_numeric(df[col], errors="coerce")
    if vals.isna().any() or (vals < 0).any() or (positive and (vals <= 0).any()):
        raise DataError(f"{path}: column {col!r} must hold {'positive' if positive else 'non-negative'} numbers")
    return vals


def layer_table_from_mlp(path: Path, model: dict, tp: int) -> pd.DataFrame:
    cols = [f"time_stats.{op}.median" for op in (*MLP_OPS.values(), *NORM_OPS, "add")]
    df = read_csv_table(path, ["num_tokens", "num_tensor_parallel_workers", *cols])
    tps = sorted(set(df["num_tensor_parallel_workers"].tolist()))
    df = df[df["num_tensor_parallel_workers"] == tp]
    if df.empty:
        raise DataError(f"{path}: column 'num_tensor_parallel_workers' has no rows for tp = {tp}; present: {tps}")
    for key, col in (("hidden_size", "n_embd"), ("intermediate_size", "n_expanded_embd")):
        if col in df.columns and model.get(key) and int(df[col].iloc[0]) != int(model[key]):
            raise DataError(f"{path}: column {col!r} is {int(df[col].iloc[0])} but the model's {key} is "
                            f"{model[key]}: the CSV profiles a different model")
    tok = _numeric(df, "num_tokens", path, positive=True)
    if not np.all(tok == np.round(tok)):
        raise DataError(f"{path}: column 'num_tokens' must hold integers")
    work = pd.DataFrame({"num_tokens": tok.astype(int)})
    for c in cols:
        work[c] = _numeric(df, c, path).to_numpy()
    g = work.groupby("num_tokens").median()
    out = pd.DataFrame(index=g.index)
    for ours, op in MLP_OPS.items():
        out[ours] = g[f"time_stats.{op}.median"]
    out["rmsnorm_x2"] = sum(g[f"time_stats.{op}.median"] for op in NORM_OPS)
    out["residual_add"] = g["time_stats.add.median"]
    out["linear_ms"] = out[["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]].sum(axis=1)
    out["layer_nonattn_ms"] = out[["linear_ms", "act", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    if (out["layer_nonattn_ms"] <= 0).any():
        raise DataError(f"{path}: a token count has zero total time (column 'time_stats.*.median')")
    return out


def attention_points(path: Path, tp: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(prefill points: batch, chunk, prefix, ms; decode points: batch, context, ms) at `tp`."""
    df = read_csv_table(path, ["batch_size", "prefill_chunk_size", "kv_cache_size"])
    if "kind" in df.columns:                                  # transcribed excerpt
        for c in ("tp", "time_ms"):
            if c not in df.columns:
                raise DataError(f"{path}: missing column {c!r}")
        df = df[df["tp"] == tp]
        is_pre = df["kind"].astype(str) == "prefill"
        t_pre = t_dec = _numeric(df, "time_ms", path, positive=True)
    else:                                                     # Vidur attention.csv
        need = ["is_prefill", "num_tensor_parallel_workers", "time_stats.attn_prefill.median",
                "time_stats.attn_decode.median"]
        for c in need:
            if c not in df.columns:
                raise DataError(f"{path}: missing column {c!r}")
        df = df[df["num_tensor_parallel_workers"] == tp]
        is_pre = df["is_prefill"].astype(str).str.lower().isin(["true", "1"])
        t_pre = pd.to_numeric(df["time_stats.attn_prefill.median"], errors="coerce")
        t_dec = pd.to_numeric(df["time_stats.attn_decode.median"], errors="coerce")
    if df.empty:
        raise DataError(f"{path}: no attention rows for tp = {tp}")
    b = _numeric(df, "batch_size", path, positive=True)
    c = _numeric(df, "prefill_chunk_size", path)
    k = _numeric(df, "kv_cache_size", path)
    pre = pd.DataFrame({"batch": b[is_pre], "chunk": c[is_pre], "prefix": k[is_pre], "ms": t_pre[is_pre]})
    dec = pd.DataFrame({"batch": b[~is_pre], "context": k[~is_pre], "ms": t_dec[~is_pre]})
    pre = pre[(pre["ms"] > 0) & (pre["chunk"] > 0)].dropna()
    dec = dec[dec["ms"] > 0].dropna()
    return pre, dec


def comm_from_vidur(ar_path: Path | None, sr_path: Path | None) -> pd.DataFrame | None:
    parts = []
    for path, op in ((ar_path, "all_reduce"), (sr_path, "send_recv")):
        if path is None:
            continue
        col = f"time_stats.{op}.median"
        df = read_csv_table(path, [col, "num_workers", "size"])
        if "devices_per_node" in df.columns:
            keep = (df["devices_per_node"] == df["num_workers"]) if op == "all_reduce" else \
                (df["num_workers"] == 2) & (df["devices_per_node"] == 2)
            df = df[keep]
        if df.empty:
            raise DataError(f"{path}: no single-node rows (column 'devices_per_node')")
        size = _numeric(df, "size", path, positive=True)
        parts.append(pd.DataFrame({"op": op, "num_workers": df["num_workers"].astype(int).to_numpy(),
                                   "bytes": size.astype(np.int64).to_numpy(),
                                   "ms": _numeric(df, col, path, positive=True).to_numpy()}))
    if not parts:
        return None
    df = pd.concat(parts)
    return df.groupby(["op", "num_workers", "bytes"], as_index=False)["ms"].median()


def parse_overrides(items: list[str] | None) -> dict[str, float]:
    """`--overhead key=value` items -> {key: value}; one-line errors name the flag, key and allowed keys."""
    out: dict[str, float] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or key not in DEFAULT_OVERHEAD:
            raise DataError(f"--overhead {item!r}: expected key=value with key one of "
                            f"{', '.join(DEFAULT_OVERHEAD)}")
        try:
            v = float(val)
        except ValueError:
            raise DataError(f"--overhead {item!r}: value must be a number >= 0") from None
        if not v >= 0 or v == float("inf"):
            raise DataError(f"--overhead {item!r}: value must be a number >= 0")
        out[key] = v
    return out


def resolve_overheads(cfg: dict, overrides: dict[str, float], no_overheads: bool) -> tuple[dict, dict]:
    """(values, status) of every [overhead] term: defaults < the CONFIG's [overhead] < --no-overheads <
    --overhead key=value."""
    where = cfg["path"]
    values, status = dict(DEFAULT_OVERHEAD), {k: "default, not yet fitted" for k in DEFAULT_OVERHEAD}
    for key, v in cfg.get("overhead", {}).items():
        if key not in DEFAULT_OVERHEAD:
            raise DataError(f"{where}: [overhead] key {key!r} unknown; allowed: {', '.join(DEFAULT_OVERHEAD)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise DataError(f"{where}: [overhead] key {key!r} must be a number >= 0, got {v!r}")
        values[key], status[key] = v, f"user-supplied ({where} [overhead])"
    if no_overheads:
        for key in values:
            values[key], status[key] = 0, "off (--no-overheads: like-for-like with Vidur)"
    for key, v in overrides.items():
        values[key], status[key] = v, "user-supplied (--overhead)"
    return values, status


def import_vidur(src: str | Path, model_cfg: str | Path, out: str | Path, network: str | Path | None = None,
                 overrides: dict[str, float] | None = None, no_overheads: bool = False):
    """Build a profile at `out` from Vidur CSVs under `src` (and `network`). Returns (Profile, report lines)."""
    src = Path(src)
    if not src.exists():
        raise DataError(f"{src}: no such folder")
    cfg = read_model_config(model_cfg)
    overhead, overhead_status = resolve_overheads(cfg, overrides or {}, no_overheads)
    cfg = {**cfg, "overhead": overhead}
    tp, model = cfg["tp"], cfg["model"]
    dirs = [src] if src.is_dir() else [src.parent]
    mlp = src if src.is_file() else _find(dirs, "mlp.csv")
    if mlp is None:
        raise DataError(f"{src}: no mlp.csv found (Vidur compute profile)")
    net_dirs = [Path(network)] if network else dirs
    if network and not Path(network).is_dir():
        raise DataError(f"{network}: no such folder (--network)")
    layer = layer_table_from_mlp(mlp, model, tp)
    report = [f"layer_nonattn.csv: {len(layer)} token counts {layer.index.min()}..{layer.index.max()} "
              f"from {mlp} at tp {tp}"]
    sources = [str(mlp)]
    att = _find(dirs, "attention.csv")
    derivation = {"layer_nonattn": f"Vidur mlp.csv at num_tensor_parallel_workers = {tp}, median column, median "
                                   "over duplicate token counts; no shape mapping"}
    pre = dec = None
    if att is not None:
        pts_pre, pts_dec = attention_points(att, tp)
        pre, dec, q = fit_attention(pts_pre, pts_dec)
        sources.append(str(att))
        for comp, qq in q.items():
            report.append(f"attention {comp}: {qq['points']} points, median |rel err| {qq['median_rel_err']:.1%}, "
                          f"p90 {qq['p90_rel_err']:.1%}")
        derivation["attention"] = (f"fitted to {att} at tp {tp} by non-negative least squares in relative error: "
                                   + "; ".join(f"{c} {v['points']} points, median |rel err| "
                                               f"{v['median_rel_err']:.1%}" for c, v in q.items()))
    a_pre, a_dec = analytic_attention(model, tp)
    if pre is None or dec is None:
        missing = [c for c, v in (("prefill", pre), ("decode", dec)) if v is None]
        derivation["attention_assumed"] = (f"{', '.join(missing)}: no measured points; roofline estimate from "
                                           "the shapes (176 / 133 TFLOP/s for the c^2 / c*p terms, 1.64 TB/s "
                                           "KV reads: the A100 Vidur fits of latency-profiles.md section 5)")
        report.append(f"attention {', '.join(missing)}: no points, roofline estimate (assumed)")
        pre = pre or a_pre
        dec = dec or a_dec
    ar, sr = _find(net_dirs, "all_reduce.csv"), _find(net_dirs, "send_recv.csv")
    comm = comm_from_vidur(ar, sr)
    if comm is not None:
        sources += [str(p) for p in (ar, sr) if p is not None]
        derivation["comm"] = ("comm.csv from Vidur network CSVs: all_reduce with devices_per_node = num_workers, "
                              "send_recv with 2 GPUs on one node, median column, median over duplicate sizes")
        report.append(f"comm.csv: {len(comm)} rows ({', '.join(sorted(set(comm['op'])))})")
    prof = write_profile(out, cfg=cfg, layer=layer, prefill=pre, decode=dec, comm=comm,
                         gpu="Vidur profile (unspecified GPU)", base_hardware=f"Vidur profile: {src}",
                         sources=sources, derivation=derivation, overhead_status=overhead_status,
                         source="imported (ppsim profile import-vidur)")
    # Vidur simulates none of these terms: say what was added and why, so a comparison can switch them off.
    for key, v in overhead.items():
        report.append(f"overhead {key} = {v:g} [{OVERHEAD_UNITS[key]}]: {overhead_status[key]}")
    report.append(f"wrote {out} (comm model {prof.meta['comm']['model']})")
    return prof, report
