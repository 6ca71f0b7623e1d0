"""Table-driven ground-truth latency from a profile directory (see profiles/FORMAT.md).

Stage time for a micro-batch of T = prefill tokens + decode requests, on a stage holding n
layers of a TP-t shard:

    n * [ layer(T) * s(T) + s_comp * prefill_attention + s_mem * decode_attention ]
      (layer(T) * s(T) evaluated at the grid point T rounds up to, then a running maximum)
      + comm (PP activation send to the next stage; 2 all-reduces per layer when t > 1)
      + first-stage embedding, last-stage LM head and sampling

`layer(T)` rounds T up to the profile grid and takes the running maximum, so more tokens
never cost less; past the grid it is linear in T at the rate of a least-squares line through the
top half of the measured grid (never negative). The iteration overhead (CPU scheduling + token
broadcast) is charged once per lock-step iteration by the engine.

The roofline floor (`[roofline]`, sim/latency/roofline.py, profiles/FORMAT.md "Physical bounds"):
every part takes at least max(FLOPs / peak, bytes / bandwidth) on the profile's GPU: the linear
table at each grid point and past it, prefill attention (causal FLOPs, KV reads), decode attention
(KV reads), the LM head (its weights; with many sampled sequences their GEMM FLOPs at the best MFU
of the profile's own linear table, `lm_mfu`) and communication (bytes over the link). The floors of
the token-count parts are applied once per token count (cached); attention's and the LM head's per
batch, in StageTimer. A profile without `[roofline]` runs without a floor.

Communication (`[comm] model`):

- `"alpha-beta"` (default): PP send `p2p_alpha + activation_bytes_per_token * T / p2p_bw`;
  TP ring all-reduce `allreduce_alpha + 2(t-1)/t * T * hidden * dtype_bytes / busBW`.
- `"table"`: `comm.csv` (`op, num_workers, bytes, ms`) measured collectives. The PP send uses
  the `send_recv` rows (2 workers; the smallest worker count present if 2 is absent) and the
  all-reduce the `all_reduce` rows at `num_workers = tp`. Lookup: median over duplicate sizes,
  running maximum over bytes (so a bigger message never costs less; small-message timings are
  bimodal), then linear interpolation of log(ms) in log(bytes); below the smallest size the
  smallest size's time (latency floor), above the largest size linear in bytes from the last
  two points (bandwidth bound; proportional to bytes if their slope is not positive).

Ground-truth structure and variance (`[ground_truth]` in meta.toml; every key optional, and a
profile without the section is the plain table model above):

- `decode_wave_fraction` (phi) and `sm_count` (W): decode attention is not linear in the context
  sum. FlashInfer's decode kernel runs one thread block per (request, KV head) in waves over the
  W SMs, so a fraction phi of the work is padded to full waves:
  `b_ctx * [(1 - phi) * sum_ctx + phi * mean_ctx * pad(n)]`, `pad(n) = ceil(n h / W) W / h`
  with h KV heads per GPU (fitted to the measured decode steps, see profiles/fit_ground_truth.py).
- `cpu_per_request_us`: the scheduler's Python work grows with the requests in the micro-batch
  (it walks its lists), so the per-iteration CPU cost is `cpu_ms + cpu_per_request_us * n_req`.
  An empty slot's turn pays no scheduler CPU cost (the artifact's `get_next_batch_to_run`
  returns early and no forward runs), only the token broadcast.
- `jitter_cv`, `stall_prob`, `stall_mean_ms`, `slow_prob`, `slow_mean`, `drift_sigma`, `drift_iters`:
  run-to-run variance (the last two a persistent clock drift), drawn per iteration by the
  engine from seeded per-stage streams (sim/latency/variance.py). `[latency] variance = false`
  in a run config turns them off (the zero-variance truth for tests and exact golden runs);
  `[latency] noise_cv > 0` overrides `jitter_cv`.

On a cluster (`placement`, set by sim/engine/cluster.py from a run's `[cluster]` table): a PP send to a
stage on another node, and the all-reduces and logits all-gather of a TP group spanning nodes, are costed
by the cluster's network model instead (sim/latency/cluster.py); inside a node the profile's own model
above applies, so a one-node placement gives the same stage times bit for bit.

TP (tp > 1) also pays SGLang's all-gather of the vocabulary-parallel logits before sampling, on
the last stage: `allreduce_alpha + (t-1)/t * n_seq * vocab * dtype_bytes / busBW` with n_seq the
sequences sampled (decodes plus prefill pieces); with a comm table, the all-reduce curve at half
the bytes (a ring all-gather moves half the bytes of a ring all-reduce).
"""

from __future__ import annotations

from sim.core.lazy import lazy

import bisect
import math
from dataclasses import dataclass
from pathlib import Path

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError, DataError
from sim.core.tomlio import read_toml
from sim.latency.base import BatchStats, StepTime, latency_models
from sim.latency.roofline import Bounds, Floors, bounds_from_meta
from sim.latency.variance import IterationNoise, VarianceParams
from sim.latency.stagetimer import StageTimer

GIB = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    layer_params: float
    embedding_params: float
    dtype_bytes: int                # bytes per element of the linear layers' weights
    intermediate_size: int = 0      # optional (builder writes it); informational, not used for timing
    kv_dtype_bytes: int = 0         # bytes per element of the KV cache (0: dtype_bytes)
    act_dtype_bytes: int = 0        # bytes per element of activations, embedding and LM head (0: dtype_bytes)
    moe_num_experts: int = 0        # [moe]: routed experts per MoE layer (0: a dense model)
    moe_top_k: int = 0              # [moe]: experts each token is routed to
    moe_expert_params: float = 0.0  # [moe]: parameters of one routed expert (layer_params counts all of them)
    moe_distribution: str = "balanced"  # [moe]: the routing the expert table was measured at (moe_routing.py)

    @property
    def kv_bytes(self) -> int:
        return self.kv_dtype_bytes or self.dtype_bytes

    @property
    def act_bytes(self) -> int:
        return self.act_dtype_bytes or self.dtype_bytes


COMM_OPS = ("all_reduce", "send_recv")

# `[ground_truth]` keys and their values when absent (absent = the plain, exactly linear model)
GROUND_TRUTH_KEYS = {
    "decode_wave_fraction": 0.0,
    "sm_count": 108.0,
    "cpu_per_request_us": 0.0,
    "jitter_cv": 0.0,
    "stall_prob": 0.0,
    "stall_mean_ms": 0.0,
    "slow_prob": 0.0,
    "slow_mean": 0.0,
    "drift_sigma": 0.0,
    "drift_iters": 0.0,
}


# Allowed values of every number of meta.toml the simulator reads: (low, high, low excluded, integer);
# high None = no upper bound. Every other number in meta.toml must be finite. The upper bounds are far
# beyond any machine or model (a 1000-layer model, a 1000 s operation, 1 MB/s links) and keep every
# simulated time finite and well inside the clock's resolution: a value past them is a damaged file.
_COUNT = (1, 2**31 - 1, False, True)
_SIZE = (1, 10**6, False, True)       # hidden size, heads, head dim (the largest models: 16384, 128, 256)
_PARAMS = (0.0, 1e13, True, False)    # parameters of one layer or of the embedding (a 405B layer: 3.2e9)
_MS = (0.0, 1e6, False, False)        # milliseconds: at most 1000 s
_US = (0.0, 1e9, False, False)        # microseconds: at most 1000 s
_GBPS = (1e-3, 1e9, False, False)     # GB/s: 1 MB/s to 1 EB/s
_FRAC = (0.0, 1.0, False, False)
# s_mem / s_comp scale the measured tables to a sibling SKU (the A100 80GB -> 40GB PCIe factors are
# 1.03-1.31, profiles/README.md); a factor of more than 10 either way is another machine, not a scaling
_SCALE = (0.1, 10.0, False, False)
# the largest value of a profile table's cell (ms; attention: ms, ms per token, ms per token^2)
TABLE_MAX = {"ms": 1e6, "a_ms": 1e6, "b_c": 1e3, "b_c2": 1.0, "b_cp": 1.0, "b_ctx": 1e3}
META_RANGES: dict[str, dict[str, tuple]] = {
    "profile": {"tp": _COUNT},
    "model": {"num_layers": (1, 1000, False, True), "hidden_size": _SIZE, "num_q_heads": _SIZE,
              "num_kv_heads": _SIZE, "head_dim": _SIZE, "vocab_size": (1, 10**7, False, True),
              "layer_params": _PARAMS, "embedding_params": _PARAMS,
              "dtype_bytes": (1, 4, False, True), "kv_dtype_bytes": (1, 4, False, True),
              "act_dtype_bytes": (1, 4, False, True), "intermediate_size": (0, 2**31 - 1, False, True),
              "context_length_tokens": _COUNT},
    "scaling": {"s_mem": _SCALE, "s_comp": _SCALE, "mem_bound_tokens": _COUNT, "comp_bound_tokens": _COUNT},
    "overhead": {"cpu_ms": _MS, "lm_head_ms": _MS, "embedding_ms": _MS, "sample_ms": _MS, "broadcast_us": _US},
    "comm": {"p2p_alpha_us": _US, "p2p_bw_gbps": _GBPS, "activation_bytes_per_token": (0.0, 1e8, True, False),
             "allreduce_alpha_us": _US, "allreduce_busbw_gbps": _GBPS},
    "memory": {"gpu_mem_gib": (0.0, 1e6, True, False), "m_init_gib": (0.0, 1e6, True, False)},
    "ground_truth": {"decode_wave_fraction": _FRAC, "sm_count": (1.0, 1e6, False, False),
                     "cpu_per_request_us": _US, "jitter_cv": (0.0, 10.0, False, False), "stall_prob": _FRAC,
                     "stall_mean_ms": _MS, "slow_prob": _FRAC, "slow_mean": (0.0, 100.0, False, False),
                     "drift_sigma": (0.0, 10.0, False, False), "drift_iters": (0.0, 1e9, False, False)},
    "moe": {"num_experts": _COUNT, "top_k": _COUNT, "expert_params": _PARAMS, "moe_tp": _COUNT, "ep": _COUNT},
    "roofline": {"bf16_tflops": _GBPS, "peak_tflops": _GBPS, "base_peak_tflops": _GBPS, "hbm_bw_gbps": _GBPS, "link_bw_gbps": _GBPS, "base_bf16_tflops": _GBPS,
                 "base_hbm_bw_gbps": _GBPS},
}
# [measured]: the ranges the tables and fits cover, each [low, high] (profiles/FORMAT.md)
MEASURED_KEYS = ("tokens", "prefill_chunk", "prefill_context", "prefill_prefix", "decode_batch", "decode_context",
                 "comm_bytes")


def range_text(lo, hi, lo_open: bool, integer: bool) -> str:
    kind = "an integer" if integer else "a finite number"
    if hi is None:
        return f"{kind} {'>' if lo_open else '>='} {lo:g}"
    return f"{kind} in {'(' if lo_open else '['}{lo:g}, {hi if isinstance(hi, int) else format(hi, 'g')}]"


def check_number(val, rng: tuple, where: str, key: str):
    """`val` if it lies in `rng` (META_RANGES' form), else a one-line DataError naming the key and the range."""
    lo, hi, lo_open, integer = rng
    ok = not isinstance(val, bool) and isinstance(val, (int, float)) and math.isfinite(val)
    if ok and integer:
        ok = float(val).is_integer()
    if ok:
        ok = (val > lo if lo_open else val >= lo) and (hi is None or val <= hi)
    if not ok:
        raise DataError(f"{where}: key {key!r} must be {range_text(*rng)}, got {val!r}")
    return val


def _walk_numbers(node, path: str):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk_numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk_numbers(v, f"{path}[{i}]")
    elif isinstance(node, float):
        yield path, node


# the sections of meta.toml every profile has (profiles/FORMAT.md)
META_SECTIONS = ("profile", "model", "lookup", "scaling", "overhead", "comm", "memory")


def read_meta(folder: Path) -> dict:
    """A profile folder's meta.toml, read and checked (`validate_meta`): a one-line DataError naming it."""
    meta_path = Path(folder) / "meta.toml"
    if not Path(folder).is_dir():  # (the folder is what was given: named, not a meta.toml inside it)
        raise DataError(f"profile {folder}: no such folder (meta.toml missing); allowed: a profile folder "
                        f"(ppsim list)")
    if not meta_path.is_file():
        raise DataError(f"profile {folder}: not a profile folder (meta.toml missing)")
    meta = read_toml(meta_path, DataError, "not a profile directory (meta.toml missing)")
    for section in META_SECTIONS:
        if section not in meta:
            raise DataError(f"{meta_path}: missing section [{section}]")
    validate_meta(meta, meta_path)
    return meta


def validate_meta(meta: dict, meta_path: Path) -> None:
    """Every section a table, every number of meta.toml finite, every number the simulator reads in
    its range (META_RANGES), communication bandwidths within the link's, the [measured] ranges
    ordered; one-line DataError."""
    for sec in (*META_SECTIONS, *META_RANGES, "measured"):
        if sec in meta and not isinstance(meta[sec], dict):
            raise DataError(f"{meta_path}: [{sec}] must be a table, got {meta[sec]!r:.40}")
    fits = meta.get("fit", [])
    if not (isinstance(fits, list) and all(isinstance(f, dict) for f in fits)):
        raise DataError(f"{meta_path}: [[fit]] must be an array of tables, got {fits!r:.40}")
    units = meta.get("profile", {}).get("units", {})
    if not isinstance(units, dict):
        raise DataError(f"{meta_path} [profile]: key 'units' must be a table, got {units!r:.40}")
    sources = meta.get("profile", {}).get("sources", [])
    if not (isinstance(sources, list) and all(isinstance(x, str) for x in sources)):
        raise DataError(f"{meta_path} [profile]: key 'sources' must be a list of strings, got {sources!r:.40}")
    for path, val in _walk_numbers(meta, ""):
        if not math.isfinite(val):
            sec, _, key = path.partition(".")
            raise DataError(f"{meta_path} [{sec}]: key {key or sec!r} must be a finite number, got {val!r}")
    for sec, keys in META_RANGES.items():
        table = meta.get(sec)
        if not isinstance(table, dict):
            continue
        for key, rng in keys.items():
            if key in table:
                check_number(table[key], rng, f"{meta_path} [{sec}]", key)
    sc = meta.get("scaling", {})
    if isinstance(sc, dict) and sc.get("comp_bound_tokens", 1) < sc.get("mem_bound_tokens", 0):
        raise DataError(f"{meta_path} [scaling]: key 'comp_bound_tokens' must be >= mem_bound_tokens "
                        f"({sc.get('mem_bound_tokens')}), got {sc.get('comp_bound_tokens')}")
    link = meta.get("roofline", {}).get("link_bw_gbps") if isinstance(meta.get("roofline"), dict) else None
    cm = meta.get("comm", {})
    if link and isinstance(cm, dict):
        for key in ("p2p_bw_gbps", "allreduce_busbw_gbps"):
            if key in cm and cm[key] > link:
                raise DataError(f"{meta_path} [comm]: key {key!r} must be in (0, {link:g}] (the link's per-direction "
                                f"bandwidth, [roofline] link_bw_gbps), got {cm[key]!r}")
    ms = meta.get("measured")
    if ms is not None:
        if not isinstance(ms, dict):
            raise DataError(f"{meta_path} [measured]: must be a table")
        for key in MEASURED_KEYS:
            if key not in ms:
                continue
            v = ms[key]
            if not (isinstance(v, list) and len(v) == 2 and all(not isinstance(x, bool) and isinstance(x, (int, float))
                                                                 and x >= 0 for x in v) and v[0] <= v[1]):
                raise DataError(f"{meta_path} [measured]: key {key!r} must be [low, high] with 0 <= low <= high, "
                                f"got {v!r}")


def read_csv_table(path: Path, required: list[str]) -> pd.DataFrame:
    """A CSV with the `required` columns, or a one-line DataError naming the file and column."""
    if not path.is_file():
        raise DataError(f"{path}: profile table missing")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable CSV: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    for col in required:
        if col not in df.columns:
            raise DataError(f"{path}: missing column {col!r}; required: {', '.join(required)}")
    return df


def _need(table: dict, key: str, where: str, *, positive: bool = True) -> float:
    if key not in table:
        raise DataError(f"{where}: missing key {key!r}")
    val = table[key]
    if (isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val)
            or (positive and val <= 0) or val < 0):
        raise DataError(f"{where}: key {key!r} must be a finite {'positive' if positive else 'non-negative'} number, got {val!r}")
    return float(val)


def extrapolation_rate(grid: np.ndarray, ms: np.ndarray) -> float:
    """The rate (ms per token) at which a per-layer table grows beyond its last grid point: the
    least-squares slope of the measured points in the top half of the grid (tokens >= last / 2; the
    last two points if the top half holds fewer), never negative; 0 for a one-point grid."""
    g = np.asarray(grid, dtype=float)
    y = np.asarray(ms, dtype=float)
    if len(g) < 2:
        return 0.0
    top = g >= g[-1] / 2
    if top.sum() < 2:
        top = np.zeros(len(g), dtype=bool)
        top[-2:] = True
    x, v = g[top], y[top]
    x0 = x.mean()
    slope = float(np.sum((x - x0) * (v - v.mean())) / np.sum((x - x0) ** 2))
    return max(slope, 0.0)


class Profile:
    """The parsed contents of one profile directory (tables + meta), no timing logic."""

    def __init__(self, path: Path, meta: dict, grid: np.ndarray, layer_ms: np.ndarray,
                 attention: dict[str, dict[str, float]], comm: pd.DataFrame | None,
                 layer_raw: np.ndarray | None = None) -> None:
        self.path = path
        self.meta = meta
        self.grid = grid
        self.layer_ms = layer_ms        # the running maximum of the table (what the lookup reads)
        self.layer_raw = layer_ms if layer_raw is None else layer_raw   # the table as measured
        self.attention = attention
        self.comm = comm
        # Per stage count: the token-count parts of the stage times (ProfiledLatencyModel), which
        # depend on this profile and the stage split only, so every run on it shares them (a
        # sweep's worker runs hundreds of points on one cached profile).
        self.token_parts: dict[int, dict] = {}

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        path = Path(path)
        meta_path = path / "meta.toml"
        meta = read_meta(path)
        units = meta["profile"].get("units", {})
        if units.get("time", "ms") != "ms":
            raise DataError(f"{meta_path}: [profile] units.time must be 'ms', got {units.get('time')!r}")
        lay_path = path / "layer_nonattn.csv"
        lay = read_csv_table(lay_path, ["num_tokens", "layer_nonattn_ms"])
        grid = lay["num_tokens"].to_numpy()
        if not np.issubdtype(grid.dtype, np.integer) or len(grid) == 0 or grid[0] < 1:
            raise DataError(f"{lay_path}: column 'num_tokens' must hold integers >= 1")
        if np.any(np.diff(grid) <= 0):
            raise DataError(f"{lay_path}: column 'num_tokens' must be strictly increasing (sorted, unique)")
        top = TABLE_MAX["ms"]
        ms = pd.to_numeric(lay["layer_nonattn_ms"], errors="coerce").to_numpy(dtype=float)
        if np.any(~np.isfinite(ms)) or np.any(ms <= 0) or np.any(ms > top):
            raise DataError(f"{lay_path}: column 'layer_nonattn_ms' must hold positive numbers (finite, ms) "
                            f"up to {top:g}")
        for col in lay.columns:
            if col in ("num_tokens", "layer_nonattn_ms"):
                continue
            vals = pd.to_numeric(lay[col], errors="coerce").to_numpy(dtype=float)
            if np.any(~np.isfinite(vals)) or np.any(vals < 0) or np.any(vals > top):
                raise DataError(f"{lay_path}: column {col!r} must hold non-negative numbers (finite, ms) up to {top:g}")
        att_path = path / "attention.csv"
        att = read_csv_table(att_path, ["component", "a_ms", "b_c", "b_c2", "b_cp", "b_ctx"])
        for col in ("a_ms", "b_c", "b_c2", "b_cp", "b_ctx"):
            # an empty cell is 0; text that is no number is refused (NaN below)
            vals = pd.to_numeric(att[col], errors="coerce").where(att[col].notna(), 0.0)
            if vals.isna().any() or (vals < 0).any() or not np.all(np.isfinite(vals)) or (vals > TABLE_MAX[col]).any():
                raise DataError(f"{att_path}: column {col!r} must hold non-negative numbers (finite; ms, per token) "
                                f"up to {TABLE_MAX[col]:g}")
            att[col] = vals
        attention = {}
        for comp in ("prefill", "decode"):
            rows = att[att["component"] == comp]
            if len(rows) != 1:
                raise DataError(f"{att_path}: column 'component' needs exactly one {comp!r} row")
            attention[comp] = {k: float(rows.iloc[0][k]) for k in ("a_ms", "b_c", "b_c2", "b_cp", "b_ctx")}
        comm = None
        comm_model = meta["comm"].get("model", "alpha-beta")
        if comm_model not in ("alpha-beta", "table"):
            raise DataError(f"{meta_path} [comm]: model must be 'alpha-beta' or 'table', got {comm_model!r}")
        if comm_model == "table":
            comm = load_comm_table(path / "comm.csv")
        ranges = meta.get("measured", {})
        if "tokens" in ranges and list(ranges["tokens"]) != [int(grid[0]), int(grid[-1])]:
            raise DataError(f"{meta_path} [measured]: key 'tokens' must be the grid's range of {lay_path.name}, "
                            f"[{int(grid[0])}, {int(grid[-1])}], got {ranges['tokens']!r}")
        return cls(path, meta, grid.astype(np.int64), np.maximum.accumulate(ms), attention, comm, layer_raw=ms)

    @property
    def tp(self) -> int:
        return int(self.meta["profile"].get("tp", 1))

    @property
    def model_id(self) -> str:
        return str(self.meta["profile"].get("model", self.path.parent.name))

    @property
    def context_length(self) -> int | None:
        """The model's context length ([model] context_length_tokens), None when not recorded."""
        v = self.meta["model"].get("context_length_tokens")
        return int(v) if v else None

    def bounds(self, base: bool = False) -> Bounds | None:
        """The GPU bounds of `[roofline]` (the target GPU, or with `base` the GPU the tables were measured
        on); None for a profile without the section (no floor, `profile check` refuses it)."""
        return bounds_from_meta(self.meta, str(self.path / "meta.toml"), base=base)

    def measured(self) -> dict[str, tuple[float, float]]:
        """The measured ranges (`[measured]`, FORMAT.md), `tokens` always (the grid's)."""
        out = {k: (float(v[0]), float(v[1])) for k, v in self.meta.get("measured", {}).items()
               if k in MEASURED_KEYS}
        out["tokens"] = (float(self.grid[0]), float(self.grid[-1]))
        return out

    def ground_truth(self) -> dict[str, float]:
        """The optional `[ground_truth]` section (structure and variance), checked."""
        gt = self.meta.get("ground_truth", {})
        where = f"{self.path / 'meta.toml'} [ground_truth]"
        out = {}
        for key, default in GROUND_TRUTH_KEYS.items():
            if key in gt:
                out[key] = _need(gt, key, where, positive=False)
            else:
                out[key] = default
        if not 0 <= out["decode_wave_fraction"] <= 1:
            raise DataError(f"{where}: key 'decode_wave_fraction' must be in [0, 1], got {out['decode_wave_fraction']}")
        for key in ("stall_prob", "slow_prob"):
            if not 0 <= out[key] <= 1:
                raise DataError(f"{where}: key '{key}' must be in [0, 1], got {out[key]}")
        if out["sm_count"] < 1:
            raise DataError(f"{where}: key 'sm_count' must be >= 1, got {out['sm_count']}")
        return out

    def shape(self) -> ModelShape:
        m, where = self.meta["model"], f"{self.path / 'meta.toml'} [model]"
        # the checks a model file gets (sim/profiling/specs.py model_from_table): grouped-query heads
        # divide the query heads (so there are no more of them), and a dtype is 1, 2 or 4 bytes
        q, kv = int(_need(m, "num_q_heads", where)), int(_need(m, "num_kv_heads", where))
        if q % kv:
            raise DataError(f"{where}: key 'num_kv_heads' ({kv}) must divide 'num_q_heads' ({q})")
        if m.get("dtype_bytes", 2) not in (1, 2, 4):
            raise DataError(f"{where}: key 'dtype_bytes' must be 1, 2 or 4, got {m.get('dtype_bytes')!r}")
        moe = self.meta.get("moe", {})
        if moe:
            mw = f"{self.path / 'meta.toml'} [moe]"
            e, k = int(_need(moe, "num_experts", mw)), int(_need(moe, "top_k", mw))
            if k > e:
                raise DataError(f"{mw}: key 'top_k' ({k}) must be <= num_experts ({e})")
            if e * _need(moe, "expert_params", mw) >= _need(m, "layer_params", where):
                raise DataError(f"{mw}: key 'expert_params' x num_experts must be < [model] layer_params")
        return ModelShape(
            num_layers=int(_need(m, "num_layers", where)),
            hidden_size=int(_need(m, "hidden_size", where)),
            num_q_heads=int(_need(m, "num_q_heads", where)),
            num_kv_heads=int(_need(m, "num_kv_heads", where)),
            head_dim=int(_need(m, "head_dim", where)),
            vocab_size=int(_need(m, "vocab_size", where)),
            layer_params=_need(m, "layer_params", where),
            embedding_params=_need(m, "embedding_params", where),
            dtype_bytes=int(m.get("dtype_bytes", 2)),
            intermediate_size=int(m.get("intermediate_size", 0) or 0),
            kv_dtype_bytes=int(m.get("kv_dtype_bytes", 0) or 0),
            act_dtype_bytes=int(m.get("act_dtype_bytes", 0) or 0),
            moe_num_experts=int(moe.get("num_experts", 0)) if moe else 0,
            moe_top_k=int(moe.get("top_k", 0)) if moe else 0,
            moe_expert_params=float(moe.get("expert_params", 0.0)) if moe else 0.0,
            moe_distribution=_moe_distribution(moe, where),
        )


def _moe_distribution(moe: dict | None, where: str) -> str:
    """[moe] distribution: one of the measured tables' routings (balanced when absent)."""
    from sim.latency.moe_routing import DISTRIBUTIONS

    dist = str(moe.get("distribution", "balanced")) if moe else "balanced"
    if dist not in DISTRIBUTIONS:
        raise DataError(f"{where}: [moe] distribution = {dist!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    return dist


def load_comm_table(path: Path) -> pd.DataFrame:
    """Read and check comm.csv: op in COMM_OPS, num_workers >= 1 (int), bytes >= 1 (int), ms > 0."""
    df = read_csv_table(path, ["op", "num_workers", "bytes", "ms"])
    bad = sorted(set(df["op"].astype(str)) - set(COMM_OPS))
    if bad:
        raise DataError(f"{path}: column 'op' has {bad[0]!r}; allowed: {', '.join(COMM_OPS)}")
    for col in ("num_workers", "bytes"):
        if not np.issubdtype(df[col].dtype, np.integer) or (df[col] < 1).any():
            raise DataError(f"{path}: column {col!r} must hold integers >= 1")
    ms = pd.to_numeric(df["ms"], errors="coerce")
    if ms.isna().any() or (ms <= 0).any() or (ms > TABLE_MAX["ms"]).any():
        raise DataError(f"{path}: column 'ms' must hold positive numbers (ms) up to {TABLE_MAX['ms']:g}")
    return df.assign(ms=ms.astype(float))


class CommCurve:
    """One collective's time against message size (see the module docstring for the rule)."""

    def __init__(self, nbytes: np.ndarray, ms: np.ndarray) -> None:
        order = np.argsort(nbytes, kind="stable")
        df = pd.DataFrame({"b": np.asarray(nbytes, float)[order], "ms": np.asarray(ms, float)[order]})
        df = df.groupby("b", as_index=False)["ms"].median()
        self.bytes = df["b"].to_numpy()
        self.ms = np.maximum.accumulate(df["ms"].to_numpy())
        self._lb = np.log(self.bytes)
        self._lm = np.log(self.ms)
        if len(self.bytes) >= 2 and self.ms[-1] > self.ms[-2]:
            self._slope = (self.ms[-1] - self.ms[-2]) / (self.bytes[-1] - self.bytes[-2])
        else:
            self._slope = self.ms[-1] / self.bytes[-1]

    def __call__(self, nbytes: float) -> float:
        """Milliseconds for a message of `nbytes` bytes."""
        if nbytes <= self.bytes[0]:
            return float(self.ms[0])
        if nbytes >= self.bytes[-1]:
            return float(self.ms[-1] + self._slope * (nbytes - self.bytes[-1]))
        return float(math.exp(np.interp(math.log(nbytes), self._lb, self._lm)))


def comm_curve(profile: "Profile", op: str, num_workers: int) -> CommCurve:
    """The `op` curve of the profile's comm table at `num_workers` (send_recv: 2, else the smallest
    count present)."""
    df = profile.comm
    where = profile.path / "comm.csv"
    rows = df[df["op"] == op]
    if rows.empty:
        raise DataError(f"{where}: column 'op' has no {op!r} rows ([comm] model = 'table')")
    counts = sorted(set(rows["num_workers"].tolist()))
    if op == "send_recv" and num_workers not in counts:
        num_workers = counts[0]
    if num_workers not in counts:
        raise DataError(f"{where}: column 'num_workers' has no {op!r} rows for {num_workers} workers "
                        f"(the profile's tp); present: {counts}")
    sel = rows[rows["num_workers"] == num_workers]
    return CommCurve(sel["bytes"].to_numpy(), sel["ms"].to_numpy())


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per stage as the artifact splits them (vLLM's get_pp_indices): floor(L/pp) each,
    the last takes the rest, e.g. 64 layers at pp = 3 -> [21, 21, 22]. Any 1 <= pp <= L runs;
    pp > L would leave a stage without layers, which the artifact cannot build."""
    if not 1 <= pp <= num_layers:
        raise ConfigError(f"config [parallel] pp = {pp} does not fit a model of {num_layers} layers; "
                          f"allowed: 1..{num_layers} (at least one layer per stage)")
    base = num_layers // pp
    return [base] * (pp - 1) + [num_layers - base * (pp - 1)]


def kv_capacity_tokens(profile: Profile, pp: int, mem_fraction: float, reduce: str = "mean") -> int:
    """KV pool tokens per stage, as SGLang 0.4.1 sizes it (profile_max_num_token).

    Each GPU: (free after load - M_init * (1 - mem_fraction)) / cell. With pp > 1 every rank
    adopts the mean of rank 0's and rank 1's values, rounded down to a multiple of pp.
    """
    shape, tp = profile.shape(), profile.tp
    mem = profile.meta["memory"]
    where = f"{profile.path / 'meta.toml'} [memory]"
    m_init = _need(mem, "m_init_gib", where)
    layers = stage_layers(shape.num_layers, pp)
    kv_heads = max(1, shape.num_kv_heads // tp)

    def rank_tokens(stage: int) -> int:
        weights = layers[stage] * shape.layer_params / tp * shape.dtype_bytes
        # embedding and LM head stay 16-bit in FP8 checkpoints (only the linear layers are quantized)
        if stage == 0:
            weights += shape.embedding_params / tp * shape.act_bytes
        if stage == pp - 1:
            weights += shape.embedding_params / tp * shape.act_bytes  # untied LM head
        after_load = m_init - weights / GIB
        cell = kv_heads * shape.head_dim * layers[stage] * 2 * shape.kv_bytes
        return int((after_load - m_init * (1 - mem_fraction)) * GIB // cell)

    if pp == 1:
        return max(0, rank_tokens(0))
    if reduce == "min":  # SGLang 0.5.23 and vLLM: the smallest stage's pool (an all-reduce MIN over ranks)
        return max(0, min(rank_tokens(s) for s in range(pp)))
    avg = (rank_tokens(0) + rank_tokens(1)) // 2
    return max(0, avg // pp * pp)


@latency_models.register("profile")
class ProfiledLatencyModel:
    """Ground truth from a profile directory, composed into `pp` stages."""

    def __init__(self, profile: Profile, pp: int, noise_cv: float = 0.0, seed: int | None = None,
                 variance: bool = True, placement=None) -> None:
        # `placement`: where this instance's ranks sit on a cluster (sim/engine/cluster.py): an object with
        # `key` and allreduce_s / send_s / gather_s(..., default) that cost a group or send crossing nodes
        # over the network and return `default` (this profile's own cost) inside a node; None: one node
        self.placement = placement
        self.profile = profile
        self.num_stages = pp
        meta = profile.meta
        where = f"{profile.path / 'meta.toml'}"
        sc, ov, cm = meta["scaling"], meta["overhead"], meta["comm"]
        self.mode = meta["lookup"].get("mode", "grid")
        if self.mode not in ("grid", "bucket128"):
            raise DataError(f"{where} [lookup]: mode must be 'grid' or 'bucket128', got {self.mode!r}")
        self.s_mem = _need(sc, "s_mem", where + " [scaling]")
        self.s_comp = _need(sc, "s_comp", where + " [scaling]")
        self.t_mem = _need(sc, "mem_bound_tokens", where + " [scaling]")
        self.t_comp = _need(sc, "comp_bound_tokens", where + " [scaling]")
        self.shape = profile.shape()
        self.tp = profile.tp
        self.layers = stage_layers(self.shape.num_layers, pp)
        w = where + " [overhead]"
        self.cpu_s = _need(ov, "cpu_ms", w, positive=False) / 1e3
        self.broadcast_s = _need(ov, "broadcast_us", w, positive=False) / 1e6 if pp > 1 else 0.0
        self.lm_head_s = _need(ov, "lm_head_ms", w, positive=False) / 1e3 * self.s_mem / self.tp
        # The roofline floor ([roofline], sim/latency/roofline.py): None for a profile without GPU bounds.
        bounds = profile.bounds()
        self.floors = Floors.for_shape(bounds, self.shape, self.tp) if bounds is not None else None
        self.lm_seq_s = 0.0     # LM-head compute per sampled sequence (0: no floor; set with the table below)
        self.lm_mfu = 0.0       # the best MFU of the linear table: the LM head's efficiency when compute bound
        if self.floors is not None:
            self.lm_head_s = max(self.lm_head_s, self.floors.lm_weights_s)
        self.embedding_s = _need(ov, "embedding_ms", w, positive=False) / 1e3
        self.sample_s = _need(ov, "sample_ms", w, positive=False) / 1e3
        w = where + " [comm]"
        self.act_bytes = _need(cm, "activation_bytes_per_token", w)
        self.p2p_alpha_s = _need(cm, "p2p_alpha_us", w, positive=False) / 1e6
        self.p2p_bw = _need(cm, "p2p_bw_gbps", w) * 1e9
        self.ar_alpha_s = _need(cm, "allreduce_alpha_us", w, positive=False) / 1e6
        self.ar_bw = _need(cm, "allreduce_busbw_gbps", w) * 1e9
        if self.floors is not None and self.floors.bounds.link_bw:
            # an alpha-beta bandwidth at most the link's keeps alpha + bytes / bw above the link floor, with
            # no per-batch comparison (meta.toml and overrides are checked against the link; this covers a
            # profile given other bounds, `profile check --gpu`)
            self.p2p_bw = min(self.p2p_bw, self.floors.bounds.link_bw)
            self.ar_bw = min(self.ar_bw, self.floors.bounds.link_bw)
        self.comm_model = cm.get("model", "alpha-beta")
        self._p2p_curve = self._ar_curve = None
        if self.comm_model == "table":
            if pp > 1:
                self._p2p_curve = comm_curve(profile, "send_recv", 2)
            if self.tp > 1:
                self._ar_curve = comm_curve(profile, "all_reduce", self.tp)
        self.iteration_overhead_s = self.cpu_s + self.broadcast_s
        gt = profile.ground_truth()
        self.wave_frac = gt["decode_wave_fraction"]
        self.sm_count = gt["sm_count"]
        self.cpu_per_req_s = gt["cpu_per_request_us"] / 1e6
        self.kv_heads_per_gpu = max(1, self.shape.num_kv_heads // self.tp)
        if variance:
            self.variance = VarianceParams(jitter_cv=float(noise_cv) or gt["jitter_cv"],
                                           stall_prob=gt["stall_prob"], stall_mean_ms=gt["stall_mean_ms"],
                                           slow_prob=gt["slow_prob"], slow_mean=gt["slow_mean"],
                                           drift_sigma=gt["drift_sigma"], drift_iters=gt["drift_iters"])
        else:  # the zero-variance truth, plus an explicit noise_cv if one was asked for
            self.variance = VarianceParams(jitter_cv=float(noise_cv))
        self.seed = seed
        self._grid = profile.grid.tolist()
        self._ms = profile.layer_ms.tolist()
        # Scaled per-layer times at the grid points: s(T) is taken at the looked-up grid point (the
        # padded kernel that actually runs), then a running maximum again, because s(T) falls from
        # s_mem to s_comp while the table may be flat: more tokens never cost less after scaling.
        s_grid = np.array([self.scale(int(g)) for g in profile.grid])
        scaled = np.maximum.accumulate(profile.layer_ms * s_grid)
        if self.floors is not None:
            fl = self.floors
            # The LM head is one vocab x hidden GEMM over the sampled sequences: the profile gives its
            # memory-bound time (few rows); with many rows it is compute bound, and no GEMM of this
            # profile runs faster than the best its own linear layers reach on this GPU (their largest
            # MFU over the grid, at most 1: the roofline).
            mfu = np.max(fl.linear_flops_per_token * profile.grid / (scaled / 1e3)) / fl.bounds.peak_flops
            self.lm_mfu = min(float(mfu), 1.0)
            self.lm_seq_s = fl.lm_seq_s / self.lm_mfu
            # the roofline floor at each grid point (the padded kernel that runs), then the running
            # maximum again; a physical table is above it everywhere and keeps its values bit for bit
            floor_ms = np.array([fl.linear_s(float(g)) * 1e3 for g in profile.grid])
            scaled = np.maximum.accumulate(np.maximum(scaled, floor_ms))
        self._scaled_ms = scaled.tolist()
        # Beyond the grid: linear in tokens at the rate fitted to the top of the measured range
        # (`extrapolation_rate`), from the last grid value, never below the floor.
        self._rate_ms = extrapolation_rate(profile.grid, profile.layer_raw)
        self._scaled_rate_ms = extrapolation_rate(profile.grid, profile.layer_raw * s_grid)
        # the per-batch hot path (stagetimer.py, compiled with the engine): attention and the
        # cached token-count parts; `stage_times` is its bound method (no Python frame per batch)
        att = profile.attention
        fl = self.floors
        self._timer = StageTimer(self._token_parts, pp, self.s_comp, self.s_mem, att["prefill"], att["decode"],
                                 self.wave_frac, self.kv_heads_per_gpu, self.sm_count, self.cpu_s, self.cpu_per_req_s,
                                 self.broadcast_s, self.logits_gather_s if self.tp > 1 else None,
                                 profile.token_parts.setdefault(pp if placement is None else (pp, placement.key), {}),
                                 pair_ms=fl.pair_s * 1e3 if fl else 0.0, kv_ms=fl.kv_token_s * 1e3 if fl else 0.0,
                                 lm_head_s=self.lm_head_s, lm_seq_s=self.lm_seq_s)
        self.stage_times = self._timer.times
        # `overhead_s(st)`: the critical-path host time of one iteration whose slot runs `st`
        # (None: an empty turn, which pays only the broadcast)
        self.overhead_s = self._timer.overhead_s

    # -- building blocks (seconds, one layer unless stated) --
    def scale(self, tokens: int) -> float:
        """s(T): memory-bound factor up to t_mem tokens, compute-bound from t_comp, log-interpolated."""
        if tokens <= self.t_mem:
            return self.s_mem
        if tokens >= self.t_comp:
            return self.s_comp
        frac = math.log(tokens / self.t_mem) / math.log(self.t_comp / self.t_mem)
        return self.s_mem + (self.s_comp - self.s_mem) * frac

    def layer_nonattn_s(self, tokens: int, scaled: bool = False) -> float:
        """One layer's non-attention time at base hardware (or scaled to the target GPU with `scaled`,
        floored by its roofline), seconds: round up to 128 (bucket128), round up to the grid, running
        maximum; beyond the grid linear in tokens at the rate of the top of the measured range."""
        if tokens <= 0:
            return 0.0
        if self.mode == "bucket128":
            tokens = ((tokens - 1) // 128 + 1) * 128
        grid, ms = self._grid, (self._scaled_ms if scaled else self._ms)
        i = bisect.bisect_left(grid, tokens)
        if i < len(grid):
            return ms[i] / 1e3
        rate = self._scaled_rate_ms if scaled else self._rate_ms
        out = ms[-1] + rate * (tokens - grid[-1])
        if scaled and self.floors is not None:
            out = max(out, self.floors.linear_s(float(tokens)) * 1e3)
        return out / 1e3

    def extrapolation_rate_s(self, scaled: bool = True) -> float:
        """Seconds per token of one layer's non-attention time beyond the grid (before the floor)."""
        return (self._scaled_rate_ms if scaled else self._rate_ms) / 1e3

    def attention_s(self, st: BatchStats) -> float:
        """One layer's attention time (seconds): prefill terms scaled by s_comp, decode by s_mem."""
        return self._timer.attention_s(st)

    def _comm_floor(self, t: float, sent_bytes: float) -> float:
        """`t` (seconds), at least the bytes this GPU sends over the link at its bandwidth."""
        if self.floors is not None and self.floors.link_byte_s > 0:
            return max(t, self.floors.comm_s(sent_bytes))
        return t

    def p2p_s(self, tokens: int) -> float:
        """PP activation send of `tokens` tokens into the next stage (seconds)."""
        size = self.act_bytes * tokens
        if self._p2p_curve is not None:
            return self._comm_floor(self._p2p_curve(size) / 1e3, size)
        return self.p2p_alpha_s + size / self.p2p_bw   # p2p_bw <= the link's: above the floor

    def allreduce_s(self, tokens: int) -> float:
        """One TP all-reduce of the hidden state of `tokens` tokens (seconds); 0 at tp = 1."""
        if self.tp <= 1:
            return 0.0
        size = tokens * self.shape.hidden_size * self.shape.act_bytes
        sent = 2 * (self.tp - 1) / self.tp * size      # a ring all-reduce sends this much from each GPU
        if self._ar_curve is not None:
            return self._comm_floor(self._ar_curve(size) / 1e3, sent)
        return self.ar_alpha_s + 2 * (self.tp - 1) / self.tp * size / self.ar_bw   # ar_bw <= the link's

    def logits_gather_s(self, num_seqs: int) -> float:
        """SGLang's all-gather of the vocab-parallel logits of `num_seqs` sequences (seconds); 0 at tp = 1."""
        if self.tp <= 1 or num_seqs <= 0:
            return 0.0
        size = num_seqs * self.shape.vocab_size * self.shape.act_bytes
        if self._ar_curve is not None:   # a ring all-gather sends (t-1)/t of the bytes from each GPU
            t = self._comm_floor(self._ar_curve(size / 2) / 1e3, (self.tp - 1) / self.tp * size)
        else:
            t = self.ar_alpha_s + (self.tp - 1) / self.tp * size / self.ar_bw   # ar_bw <= the link's
        if self.placement is not None:   # the last stage's TP group spanning nodes gathers over the network
            t = self.placement.gather_s(size, t)
        return t

    def lm_head_time_s(self, num_seqs: int) -> float:
        """The LM head on the last stage for `num_seqs` sampled sequences (seconds): the profile's
        memory-bound time, or, for many sequences, their GEMM FLOPs at the best MFU the profile's own
        linear layers reach (`lm_mfu`), whichever is longer."""
        extra = float(num_seqs) * self.lm_seq_s - self.lm_head_s
        return self.lm_head_s + extra if extra > 0.0 else self.lm_head_s

    def make_noise(self, prefix: str = "latency") -> IterationNoise | None:
        """The per-iteration draws of one pipeline (None for a zero-variance truth)."""
        if not self.variance.enabled:
            return None
        if self.seed is None:
            raise ValueError("a ground truth with variance needs the run seed (ProfiledLatencyModel(seed=...))")
        return IterationNoise(self.variance, self.num_stages, self.seed, prefix)

    # -- the protocol --
    def stage_time(self, st: BatchStats, stage: int) -> StepTime:
        tokens = st.num_tokens
        if tokens <= 0:
            return StepTime(0.0, 0.0, 0.0, 0.0)
        n = self.layers[stage]
        linear = n * self.layer_nonattn_s(tokens, scaled=True)
        attention = n * self.attention_s(st)
        ar = self.allreduce_s(tokens)
        if self.placement is not None:   # a TP group spanning nodes all-reduces over the network
            ar = self.placement.allreduce_s(stage, tokens * self.shape.hidden_size * self.shape.act_bytes, ar)
        comm = 2 * n * ar
        overhead = 0.0
        if stage == 0:
            overhead += self.embedding_s
        if stage < self.num_stages - 1:
            send = self.p2p_s(tokens)  # activation send into the next stage
            if self.placement is not None:   # over the network when the next stage is on another node
                send = self.placement.send_s(stage, self.act_bytes * tokens, send)
            comm += send
        else:
            linear += self.lm_head_s
            if self.lm_seq_s > 0.0:   # the LM head's compute floor (as StageTimer.times adds it)
                extra = float(st.num_prefill + st.num_decode) * self.lm_seq_s - self.lm_head_s
                if extra > 0.0:
                    linear += extra
            overhead += self.sample_s
            comm += self.logits_gather_s(st.num_prefill + st.num_decode)
        return StepTime(linear, attention, comm, overhead)

    def _token_parts(self, tokens: int) -> tuple:
        """Per stage (layers, linear, comm, overhead) of a batch of `tokens` tokens: what
        `stage_time` gives that does not depend on the attention (StageTimer caches it)."""
        steps = [self.stage_time(BatchStats(tokens), s) for s in range(self.num_stages)]
        return tuple((n, t.linear_s, t.comm_s, t.overhead_s) for n, t in zip(self.layers, steps))

    # `stage_times(st)`: `stage_time(st, s).total_s` for every stage, bit for bit (set in
    # __init__ to the StageTimer's `times`)

    def kv_capacity_tokens(self, mem_fraction: float, reduce: str = "mean") -> int:
        return kv_capacity_tokens(self.profile, self.num_stages, mem_fraction, reduce)
