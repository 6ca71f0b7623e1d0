"""Kernel cost model of one GPU family, fitted offline from Vidur's measured kernel data.

What it models (per layer, one TP shard, milliseconds, at the token counts of the Vidur grid):

- **GEMMs** (QKV, O, gate-up, down) as t(M tokens, N, K). The measured shapes of a GPU family (every
  model x TP degree x projection in Vidur's mlp.csv files) are kept as tables over the token grid. A
  shape that was measured is looked up; any other shape is predicted from the `NEIGHBOURS` measured
  shapes nearest in (log N, `K_WEIGHT` x log K): each neighbour's measured curve is scaled by the ratio
  of a roofline cost, `max(2 M N K / flops, 2 (N K + M K + M N) / bytes_per_s) + launch`, at the target
  and at the neighbour's shape, and the scaled curves are averaged geometrically with inverse-squared-
  distance weights. N counts more than K in the distance because N (with M) sets the grid of output
  tiles over the SMs, i.e. where the curve steps and how full each wave is, while K only sets the length
  of each tile's loop, which the roofline ratio already scales.
  The measured curves are saw-tooths over M: the time stays flat while the output tiles fill a wave
  over the SMs and jumps when a new wave starts, at token counts that depend on N. Two rules carry
  that wave structure from the neighbours to the target (`predict_gemm`):
  (1) at each token count a neighbour's weight is multiplied by `exp(-d / PHASE_SCALE)`, d the mean
  |log| difference between the target's and the neighbour's wave utilisation (output tiles / (waves x
  SMs), `wave_utilisation`, averaged over the `WAVE_TILES` cuBLAS may pick), so neighbours in the same
  wave phase count more; (2) where the GEMM is compute bound (M >= `REINDEX_RIDGE` x flops / bytes_per_s),
  each neighbour is also read at the token count that gives it the target's number of output tiles
  (M ceil(N / 128) / ceil(N_i / 128)), i.e. the same number of waves, and that reading is averaged
  (`REINDEX_MIX`) with the reading at the same M (leave-one-model-out: profiles/README.md).
- **Element-wise ops** (activation, RoPE, the two RMSNorms, the residual add) by bytes moved:
  `a + b * bytes`, one (a, b) per op, fitted by non-negative least squares in relative error.
- **Attention**: prefill `a + b_c c + b_c2 c^2 + b_cp c p` per 32 x 128 query dims and decode
  `a + b_ctx sum(ctx)` per 1024 KV dims (heads x head dim), fitted to the real A100 attention points
  and scaled by FLOPs (query heads x head dim) and bytes (KV heads x head dim). A family without
  attention data of its own takes the A100 fit times measured A100/GPU ratios (compute-bound GEMMs
  for prefill, element-wise bytes for decode) and is marked "scaled".

The fitting functions (`fit_elementwise`, `fit_attention_points`, `leave_one_model_out`, `layer_errors`)
are used by `profiles/build_kernels.py`, which writes `profiles/kernels/<family>.toml` (coefficients,
each with the data files it came from) and `profiles/kernels/<family>-gemm.csv` (the measured GEMM
curves); `KernelModel.load` reads them back without the shared data folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sim.core.lazy import lazy

np = lazy("numpy")
pd = lazy("pandas")

from sim.core.errors import DataError
from sim.core.tomlio import read_toml

KERNELS_DIR = Path(__file__).resolve().parents[2] / "profiles" / "kernels"

GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
ELEMENTWISE_OPS = ("act", "rope", "rmsnorm", "residual_add")
VIDUR_OP = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "gate_up_proj": "mlp_up_proj",
            "down_proj": "mlp_down_proj", "act": "mlp_act", "rope": "attn_rope", "residual_add": "add",
            "rmsnorm": "input_layernorm"}
NEIGHBOURS = 16           # measured shapes averaged per prediction (8-24 give the same errors within 0.3 points)
K_WEIGHT = 0.25           # weight of log K against log N in the neighbour distance (N sets the tile grid)
DISTANCE_FLOOR = 0.05     # log-distance added before inverse-distance weighting (an exact hit dominates)
LAUNCH_S = 5e-6           # per-kernel floor of the roofline cost ratio
# Output tiles (rows of M x columns of N) of the bf16 tensor-core GEMM kernels cuBLAS/CUTLASS mostly run on
# Ampere and Hopper at these sizes; which one cuBLAS picks for a shape that was not measured is unknown, so
# the wave phase is averaged over the three.
WAVE_TILES = ((128, 128), (128, 256), (256, 128))
PHASE_SCALE = 0.1         # mean |log utilisation| difference at which a neighbour's weight drops by 1/e
                          # (0.05-0.2 give the same errors within 0.3 points)
REINDEX_RIDGE = 3.0       # re-index neighbours only at M >= 3 x the roofline ridge flops/bytes_per_s (tokens;
                          # A100 ~480, H100 ~860, A40 ~620), where the time follows the output tiles
REINDEX_TILE_N = 128      # N columns per output tile when counting tiles for the re-indexing
REINDEX_MIX = 0.5         # weight of the re-indexed reading against the same-M reading (log-time)
PREFILL_REF_DIMS = 32 * 128    # query heads x head dim the prefill coefficients are stated for
DECODE_REF_DIMS = 1024         # KV heads x head dim the decode coefficient is stated for


@dataclass(frozen=True)
class Arch:
    """What the kernel model needs of an architecture (full model, unsharded)."""
    hidden_size: int
    intermediate_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    gated_mlp: bool = True
    dtype_bytes: int = 2


def gemm_shapes(a: Arch, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection on one TP shard (KV heads replicated when tp > KV heads)."""
    kv = max(1, a.num_kv_heads // tp)
    q = a.num_q_heads // tp
    ffn = a.intermediate_size // tp
    return {"qkv_proj": ((q + 2 * kv) * a.head_dim, a.hidden_size),
            "o_proj": (a.hidden_size, q * a.head_dim),
            "gate_up_proj": ((2 if a.gated_mlp else 1) * ffn, a.hidden_size),
            "down_proj": (a.hidden_size, ffn)}


def elementwise_bytes_per_token(a: Arch, tp: int) -> dict[str, float]:
    """Bytes read + written per token by each element-wise op on one TP shard."""
    kv = max(1, a.num_kv_heads // tp)
    q = a.num_q_heads // tp
    ffn = a.intermediate_size // tp
    db = a.dtype_bytes
    return {"act": (3 if a.gated_mlp else 2) * ffn * db,      # gated: read gate and up, write one
            "rope": 2 * (q + kv) * a.head_dim * db,           # rotate q and k in place
            "rmsnorm": 2 * a.hidden_size * db,                # one norm: read, write the full hidden state
            "residual_add": 3 * a.hidden_size * db}


def roofline_s(m: np.ndarray, n: float, k: float, flops: float, bytes_per_s: float) -> np.ndarray:
    fl = 2.0 * m * n * k / flops
    by = 2.0 * (n * k + m * k + m * n) / bytes_per_s
    return np.maximum(fl, by) + LAUNCH_S


def wave_utilisation(m: np.ndarray, n: float, sm_count: int, tile: tuple[int, int]) -> np.ndarray:
    """Fraction of the SM slots that do work when an M x N output is cut into `tile` = (rows, columns) tiles,
    one tile per SM per wave: tiles / (waves x SMs), tiles = ceil(M / rows) ceil(N / columns), waves =
    ceil(tiles / SMs). 1 when the last wave is full; a step down where a new wave starts."""
    tiles = np.ceil(np.asarray(m, float) / tile[0]) * math.ceil(n / tile[1])
    return tiles / (np.ceil(tiles / sm_count) * sm_count)


def _log_utilisation(m: np.ndarray, n: float, sm_count: int) -> np.ndarray:
    return np.array([np.log(wave_utilisation(m, n, sm_count, t)) for t in WAVE_TILES])


def predict_gemm(grid: np.ndarray, shapes: np.ndarray, table: np.ndarray, n: int, k: int,
                 flops: float, bytes_per_s: float, sm_count: int) -> np.ndarray:
    """ms over `grid` for shape (n, k) from measured `shapes` (S x 2) with curves `table` (S x G) of a GPU with
    `sm_count` SMs (module docstring: neighbours, roofline ratio, wave-phase weights, tile re-indexing)."""
    grid = np.asarray(grid, float)
    dist = np.hypot(np.log(shapes[:, 0] / n), K_WEIGHT * np.log(shapes[:, 1] / k))
    idx = np.argsort(dist, kind="stable")[:NEIGHBOURS]
    target = roofline_s(grid, n, k, flops, bytes_per_s)
    target_util = _log_utilisation(grid, n, sm_count)
    compute_bound = grid >= REINDEX_RIDGE * flops / bytes_per_s
    logs, weights = [], []
    for i in idx:
        ni, ki = shapes[i, 0], shapes[i, 1]
        same_m = np.log(table[i] * target / roofline_s(grid, ni, ki, flops, bytes_per_s))
        # The token count at which neighbour i has the target's number of output tiles (so as many waves),
        # read at the first grid point at or above it (the time is flat up to the next tile boundary).
        m_eq = grid * math.ceil(n / REINDEX_TILE_N) / math.ceil(ni / REINDEX_TILE_N)
        j = np.minimum(np.searchsorted(grid, m_eq), len(grid) - 1)
        reindexed = np.log(table[i][j] * target / roofline_s(grid[j], ni, ki, flops, bytes_per_s))
        use = compute_bound & (m_eq <= grid[-1])
        logs.append(np.where(use, REINDEX_MIX * reindexed + (1 - REINDEX_MIX) * same_m, same_m))
        phase = np.mean(np.abs(_log_utilisation(grid, ni, sm_count) - target_util), axis=0)
        # A re-indexed reading is in the target's wave phase by construction: no phase weight there.
        weights.append(np.where(use, 1.0, np.exp(-phase / PHASE_SCALE)) / (dist[i] + DISTANCE_FLOOR) ** 2)
    w = np.array(weights)
    w /= w.sum(axis=0)
    return np.exp(np.sum(np.array(logs) * w, axis=0))


def fit_nnls_rel(X: np.ndarray, t: np.ndarray, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares in relative error, rows weighted by `w`; (coefficients, |relative errors|)."""
    from scipy.optimize import nnls

    sw = np.ones_like(t) if w is None else np.sqrt(w)
    coef, _ = nnls(X / t[:, None] * sw[:, None], sw)
    return coef, np.abs(X @ coef / t - 1)


def fit_elementwise(points: pd.DataFrame) -> tuple[float, float, np.ndarray]:
    """points: bytes, ms -> (a_ms, b_ms_per_byte, |rel err|)."""
    b, t = points["bytes"].to_numpy(float), points["ms"].to_numpy(float)
    coef, err = fit_nnls_rel(np.column_stack([np.ones_like(b), b]), t)
    return float(coef[0]), float(coef[1]), err


def fit_attention_points(prefill: pd.DataFrame, decode: pd.DataFrame) -> tuple[dict, dict, dict]:
    """prefill: batch, chunk, prefix, q_dims, ms, weight; decode: batch, context, kv_dims, ms, weight.

    Prefill b-terms are per PREFILL_REF_DIMS query dims, decode b_ctx per DECODE_REF_DIMS KV dims.
    Returns (prefill coefficients, decode coefficients, quality per component)."""
    B, c, p, t = (prefill[k].to_numpy(float) for k in ("batch", "chunk", "prefix", "ms"))
    s = prefill["q_dims"].to_numpy(float) / PREFILL_REF_DIMS
    X = np.column_stack([np.ones_like(c), s * B * c, s * B * c * c, s * B * c * p])
    cp, ep = fit_nnls_rel(X, t, prefill["weight"].to_numpy(float))
    B, ctx, t = (decode[k].to_numpy(float) for k in ("batch", "context", "ms"))
    s = decode["kv_dims"].to_numpy(float) / DECODE_REF_DIMS
    cd, ed = fit_nnls_rel(np.column_stack([np.ones_like(t), s * B * ctx]), t, decode["weight"].to_numpy(float))
    quality = {"prefill": _quality(ep), "decode": _quality(ed)}
    return (dict(zip(("a_ms", "b_c", "b_c2", "b_cp"), map(float, cp))),
            {"a_ms": float(cd[0]), "b_ctx": float(cd[1])}, quality)


def _quality(err: np.ndarray) -> dict:
    return {"points": int(len(err)), "median_rel_err": float(np.median(err)),
            "p90_rel_err": float(np.percentile(err, 90))}


def leave_one_model_out(grid: np.ndarray, shapes: np.ndarray, table: np.ndarray, owners: list[set[str]],
                        flops: float, bytes_per_s: float, sm_count: int, max_tokens: int = 4096) -> pd.DataFrame:
    """For each model, predict each of its shapes from the shapes no held-out model has.

    `owners[i]` names the models that have shape i (identical shapes of two models, e.g. Llama-2-70B and
    Llama-3-70B, are held out together). Returns one row per (model, shape, token count) with the
    predicted and measured ms and rel_err."""
    rows = []
    keep_m = grid <= max_tokens
    models = sorted(set().union(*owners))
    for model in models:
        held = np.array([model in o for o in owners])
        for i in np.flatnonzero(held):
            pred = predict_gemm(grid, shapes[~held], table[~held], shapes[i, 0], shapes[i, 1], flops, bytes_per_s,
                                sm_count)
            n, k = int(shapes[i, 0]), int(shapes[i, 1])
            for m, p, t in zip(grid[keep_m], pred[keep_m], table[i][keep_m]):
                rows.append((model, n, k, int(m), float(p), float(t), float(p / t - 1)))
    return pd.DataFrame(rows, columns=["model", "N", "K", "num_tokens", "pred_ms", "ms", "rel_err"])


def layer_errors(loo: pd.DataFrame, layers: dict[tuple[str, int], list[tuple[int, int]]]) -> pd.DataFrame:
    """Leave-one-model-out error of the per-layer GEMM time: the sum of the four projections of one
    (model, TP degree), `layers[(model, tp)]` = their (N, K), predicted and measured, summed per token count.

    This is the quantity a stage time is built from; errors of single GEMMs partly cancel in it.
    Returns one row per (model, tp, token count) with rel_err."""
    by = {key: g for key, g in loo.groupby(["model", "N", "K"])}
    rows = []
    for (model, tp), nks in sorted(layers.items()):
        parts = [by[(model, int(n), int(k))].set_index("num_tokens") for n, k in nks]
        pred = sum(p["pred_ms"] for p in parts)
        ms = sum(p["ms"] for p in parts)
        rows.append(pd.DataFrame({"model": model, "tp": int(tp), "num_tokens": pred.index,
                                  "rel_err": (pred / ms - 1).to_numpy()}))
    return pd.concat(rows, ignore_index=True)


def level_oracle_errors(loo: pd.DataFrame, edges: tuple[int, ...] | None = None) -> np.ndarray:
    """|error| of the leave-one-model-out predictions once each held-out shape's own level error is
    divided out: the median of log(predicted / measured) over its token counts (over each token
    range [edges[i], edges[i+1]) separately, if `edges` are given).

    Not a predictor (it reads the measured answer): what is left is the error of the step pattern
    within a shape's curve (or range), i.e. a floor for any method that got the level of every
    unmeasured shape exactly right and kept the neighbours' steps."""
    err = np.log1p(loo["rel_err"].to_numpy(float))
    keys = [loo["model"].to_numpy(), loo["N"].to_numpy(), loo["K"].to_numpy()]
    if edges is not None:
        keys.append(np.digitize(loo["num_tokens"].to_numpy(), edges))
    level = pd.Series(err).groupby(keys).transform("median").to_numpy()
    return np.abs(np.expm1(err - level))


class KernelModel:
    """A fitted kernel model of one GPU family, read from profiles/kernels/<family>.{toml,-gemm.csv}."""

    def __init__(self, family: str, meta: dict, grid: np.ndarray, shapes: np.ndarray, table: np.ndarray,
                 path: Path) -> None:
        self.family = family
        self.meta = meta
        self.grid = grid
        self.shapes = shapes
        self.table = table
        self.path = path
        rf = meta["roofline"]
        self.flops = float(rf["flops"])
        self.bytes_per_s = float(rf["bytes_per_s"])
        self.sm_count = int(rf["sm_count"])

    @classmethod
    def load(cls, family: str, kernels_dir: Path = KERNELS_DIR) -> "KernelModel":
        toml_path = kernels_dir / f"{family}.toml"
        meta = read_toml(toml_path, DataError, "kernel data missing (profiles/build_kernels.py writes it)")
        for section in ("roofline", "elementwise", "attention"):
            if section not in meta:
                raise DataError(f"{toml_path}: missing section [{section}]")
        sms = meta["roofline"].get("sm_count")
        if isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0:
            raise DataError(f"{toml_path}: [roofline] sm_count must be a positive integer, got {sms!r}")
        csv = kernels_dir / f"{family}-gemm.csv"
        if not csv.is_file():
            raise DataError(f"{csv}: kernel GEMM table missing (profiles/build_kernels.py writes it)")
        df = pd.read_csv(csv)
        if "num_tokens" not in df.columns:
            raise DataError(f"{csv}: missing column 'num_tokens'")
        cols = [c for c in df.columns if c != "num_tokens"]
        try:
            shapes = np.array([[int(x) for x in c.split("x")] for c in cols], dtype=float)
        except ValueError:
            raise DataError(f"{csv}: GEMM columns must be named <N>x<K>, got {cols[:3]}") from None
        table = df[cols].to_numpy(float).T
        if not np.all(np.isfinite(table)) or np.any(table <= 0):
            raise DataError(f"{csv}: GEMM times must be positive numbers (ms)")
        return cls(family, meta, df["num_tokens"].to_numpy(np.int64), shapes, table, toml_path)

    def gemm_ms(self, n: int, k: int) -> np.ndarray:
        """Per-call GEMM time over the grid; a measured shape is returned as measured."""
        hit = np.flatnonzero((self.shapes[:, 0] == n) & (self.shapes[:, 1] == k))
        if len(hit):
            return self.table[hit[0]].copy()
        return predict_gemm(self.grid.astype(float), self.shapes, self.table, n, k, self.flops, self.bytes_per_s,
                            self.sm_count)

    def gemm_is_measured(self, n: int, k: int) -> bool:
        return bool(np.any((self.shapes[:, 0] == n) & (self.shapes[:, 1] == k)))

    def elementwise_ms(self, op: str, bytes_per_token: float) -> np.ndarray:
        c = self.meta["elementwise"][op]
        return c["a_ms"] + c["b_ms_per_byte"] * bytes_per_token * self.grid.astype(float)

    def layer_table(self, a: Arch, tp: int) -> pd.DataFrame:
        """layer_nonattn.csv columns of FORMAT.md for one TP shard, indexed by num_tokens."""
        out = pd.DataFrame(index=pd.Index(self.grid, name="num_tokens"))
        for op, (n, k) in gemm_shapes(a, tp).items():
            out[op] = self.gemm_ms(n, k)
        ew = elementwise_bytes_per_token(a, tp)
        out["act"] = self.elementwise_ms("act", ew["act"])
        out["rope"] = self.elementwise_ms("rope", ew["rope"])
        out["rmsnorm_x2"] = 2 * self.elementwise_ms("rmsnorm", ew["rmsnorm"])
        out["residual_add"] = self.elementwise_ms("residual_add", ew["residual_add"])
        out["linear_ms"] = out[list(GEMM_OPS)].sum(axis=1)
        out["layer_nonattn_ms"] = out[["linear_ms", "act", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
        return out

    def attention(self, a: Arch, tp: int) -> tuple[dict, dict, str]:
        """(prefill, decode, status) per layer on one TP shard; status is "fitted" or "scaled"."""
        att = self.meta["attention"]
        q_dims = a.num_q_heads // tp * a.head_dim
        kv_dims = max(1, a.num_kv_heads // tp) * a.head_dim
        s = q_dims / PREFILL_REF_DIMS
        pre = {"a_ms": att["prefill"]["a_ms"], "b_c": att["prefill"]["b_c"] * s,
               "b_c2": att["prefill"]["b_c2"] * s, "b_cp": att["prefill"]["b_cp"] * s}
        dec = {"a_ms": att["decode"]["a_ms"], "b_ctx": att["decode"]["b_ctx"] * kv_dims / DECODE_REF_DIMS}
        return pre, dec, str(att.get("status", "fitted"))

    @property
    def sources(self) -> list[str]:
        return list(self.meta.get("sources", []))


def families(kernels_dir: Path = KERNELS_DIR) -> list[str]:
    return sorted(p.stem for p in kernels_dir.glob("*.toml"))


def rel_err_summary(err: np.ndarray) -> tuple[float, float]:
    e = np.abs(np.asarray(err, float))
    return (float(np.median(e)), float(np.percentile(e, 90))) if len(e) else (math.nan, math.nan)
