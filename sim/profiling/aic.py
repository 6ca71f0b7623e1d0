"""AIConfigurator's measured kernel database as a second kernel-data source (`ppsim profile build --data aic`).

NVIDIA's AIConfigurator publishes the kernel timings it plans with as the PyPI package `aiconfigurator-core`
(Apache-2.0; the optional extra `pipesim[aic]`). Its tables are parquet files under
`aiconfigurator_core/systems/data/<system>/<op>/<engine>/<version>/`, one system per GPU (`h100_sxm`,
`h200_sxm`, `b200_sxm`, ...), and `systems/<system>.yaml` holds the GPU's peaks. This module reads the
installed files offline (no network, no import of the package's own estimator) and composes a PipeSim
profile (profiles/FORMAT.md) the way `sim.profiling.build` composes one from Vidur's data:

- **GEMMs** (`gemm/<engine>/<ver>/gemm_perf.parquet`: m, n, k, dtype, kernel, latency ms): the four
  projections of one TP shard at (N, K) = `gemm_shapes`, over the table's token grid (m). A shape on the
  table's (n, k) grid is read as measured; any other is interpolated bilinearly in (log n, log k) on
  log-time between the four grid shapes around it (n beyond the grid, e.g. an LM head's vocabulary: linear
  in n from the largest n, as side-by-side GEMMs). BF16 is `torch.nn.functional.linear` (cuBLAS); FP8 is
  vLLM's per-tensor `CutlassFP8ScaledMMLinearKernel` (FP8 checkpoints with per-tensor scales);
  block-scaled FP8 kernels (DeepSeek-style checkpoints) are not used. FP8 rows slower than their BF16
  twin at the same (m, n, k) are reported as suspect (`suspect_gemm_rows`) and used as measured: an FP8
  checkpoint cannot fall back to BF16 GEMMs. On Blackwell (sm_version 100) vLLM's FP8 GEMM runs one kernel on
  one grid for m in [1, 16] and in (16, 64] (`SM100_FP8_SAME_GRID`): each range's rows are read as their median
  (the B200 table's M = 1 rows are 1.5-3x the rest of their range; its running maximum in the latency model
  would carry them to every decode step).
- **Element-wise ops** (activation, RoPE, two RMSNorms, residual add): AIConfigurator has no table for them
  and costs them as bytes / (mem_bw x mem_bw_empirical_scaling_factor) + mem_empirical_constant_latency
  (`sdk/operations/elementwise.py`, constants from `systems/<system>.yaml`); the same formula here.
- **Attention**: prefill `a + b_c c + b_c2 c^2 + b_cp c p` fitted (non-negative least squares in relative
  error, `kernels.fit_nnls_rel`) to the context-attention rows (batch x input length, no prefix) and decode
  `a + b_ctx sum(ctx)` to the generation rows (batch x context) of the shard's query / KV heads, head dim
  and KV-cache dtype, contexts up to the model's context length. The tables have no prefix, so `b_cp` is
  `2 b_c2` (a prefix pair costs what a causal pair does: the c^2 term counts c^2 / 2 pairs). Where the
  table lacks the shard's query-head count (e.g. Qwen2.5-7B's 28), the nearest measured count with the
  same KV heads stands in, prefill rates scaled by the query-head ratio (FLOPs), decode kept (KV bytes).
  The kernel is the one the engine runs on the GPU: FlashAttention-3 on Hopper, FlashInfer's TRT-LLM
  kernels on Blackwell (`ATTENTION_KERNELS`); SGLang 0.5.14 (`--engine sglang`): fa3 / trtllm_mha.
- **Communication** (`comm.csv`, `[comm] model = "table"`): the TP all-reduce per message size is the
  engine's own choice, `allreduce_choice`: vLLM's (and SGLang's, same rule) custom all-reduce
  (`custom_allreduce_perf.parquet`, CUDA-graph rows) for world sizes 2, 4, 6, 8 on one fully connected
  NVLink node and messages under its `max_size` of 8 MiB (vLLM `CustomAllreduce.__init__` and `should_custom_ar`,
  vllm/distributed/device_communicators/custom_all_reduce.py), NCCL's measured all-reduce
  (`comm/nccl/<the system's nccl_version>/nccl_perf.parquet`) otherwise. AIConfigurator has no
  point-to-point table; its P2P model (p2p_latency + bytes / intra_node_bw, `systems/<system>.yaml`) gives
  the `send_recv` rows.
- **LM head**: the GEMM table at (vocabulary, hidden) and 1 token, in BF16 (FP8 checkpoints keep the LM head
  and the embedding in 16 bits).

Every profile records the package version, the AIConfigurator system, the engine and its version, the
kernel sources and the dtypes it used (`[profile] aic_*`, `[derivation]`), and the rows it found suspect.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
import warnings
from functools import cached_property
from pathlib import Path

from sim.core.lazy import lazy

np = lazy("numpy")
pd = lazy("pandas")

from sim.core import fsio, tomlio
from sim.core.errors import DataError
from sim.profiling.build import (DEFAULT_OVERHEAD, LAYER_COLS, COMPACT_COLS, BEYOND, ground_truth_section,
                                 gpu_scaling, render_attention_csv)
from sim.profiling.kernels import (ELEMENTWISE_OPS, GEMM_OPS, Arch, elementwise_bytes_per_token, fit_nnls_rel,
                                   gemm_shapes)
from sim.latency.hardware import PROFILES, GpuSpec
from sim.profiling.specs import ModelArch

PACKAGE = "aiconfigurator-core"
MODULE = "aiconfigurator_core"
# PipeSim GPU spec -> AIConfigurator system
# (the A100's tables are vLLM 0.14 ones with other kernel names, `vllm_default` GEMMs and `vllm_flash_attn`:
# not wired; Vidur's A100 data stays its source)
SYSTEMS = {"h100-sxm-80gb": "h100_sxm", "h200-sxm": "h200_sxm", "b200-sxm": "b200_sxm"}
# engine -> the version whose GEMM, attention and custom all-reduce tables every system above has
ENGINE_VERSIONS = {"vllm": {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "b200_sxm": "0.24.0"},
                   "sglang": {"h100_sxm": "0.5.14", "h200_sxm": "0.5.14", "b200_sxm": "0.5.14"}}
# engine -> dtype -> (gemm_dtype, kernel_source) of the GEMM table: the dense BF16 linear, and the per-tensor FP8
# linear each engine runs for FP8 checkpoints (block-scaled FP8 kernels, for DeepSeek-style checkpoints, not used)
GEMM_KERNELS = {"vllm": {"bf16": ("bfloat16", "torch.nn.functional.linear"),
                         "fp8": ("fp8", "CutlassFP8ScaledMMLinearKernel")},
                "sglang": {"bf16": ("bfloat16", "sglang_torch_linear"),
                           "fp8": ("fp8", "sglang_sgl_kernel_fp8_scaled_mm")}}
DTYPE_BYTES = {"bf16": 2, "fp8": 1}
KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
# engine -> sm_version of the system YAML -> (context, generation) attention kernel the engine runs there by
# default: vLLM picks FlashAttention (FA3 on Hopper) and, on Blackwell, FlashInfer with TRT-LLM-generated
# kernels (vllm/platforms/cuda.py, attention backend priorities); SGLang 0.5 defaults to fa3 on Hopper and
# trtllm_mha on Blackwell for MHA/GQA models (python/sglang/srt/server_args.py, attention backend choice)
ATTENTION_KERNELS = {"vllm": {90: ("vllm_flash_attn_fa3", "vllm_flash_attn_fa3"),
                              100: ("vllm_flashinfer_trtllmprefill", "vllm_flashinfer_trtllmdecode")},
                     "sglang": {90: ("fa3", "fa3"), 100: ("trtllm_mha", "trtllm_mha")}}
# The GEMM tables' m grid is dense up to 4353 tokens (steps of 256, each boundary and boundary + 1) and then
# jumps to 8192, 16384, 32768: rounding a 5000-token batch up to 8192 would charge it 1.6x. The profile keeps the
# dense part; past it the run extrapolates linearly in tokens (FORMAT.md), which the sparse points check
# (`extrapolation_check`, written into [derivation]).
GRID_MAX_TOKENS = 4353
# Both engines' custom all-reduce on CUDA: world sizes 2, 4, 6, 8 (`_SUPPORTED_WORLD_SIZES`), messages under
# 8 MiB (vLLM `CustomAllreduce(max_size=8192 * 1024)`, vllm/distributed/device_communicators/custom_all_reduce.py;
# SGLang `CustomAllreduce._MAX_CAR_SIZE = 8192 * 1024`, python/sglang/srt/distributed/device_communicators/
# custom_all_reduce.py), on 2 GPUs or a fully connected NVLink group (`should_custom_ar`)
CUSTOM_AR_MAX_BYTES = 8192 * 1024
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
# vLLM's per-tensor FP8 GEMM on Blackwell (sm_version 100) picks its CUTLASS configuration by m alone
# (csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm100_fp8_dispatch.cuh, `cutlass_gemm_sm100_fp8_dispatch`):
# m in [1, 16] runs `sm100_fp8_config_M16_swap_ab` and m in (16, 64] `sm100_fp8_config_M64_swap_ab` (tiles 128 x 32
# and 128 x 64 over the swapped m, so one tile row covers every m of the range: the same kernel on the same grid);
# m = 64 with k < 4096 runs `sm100_fp8_config_M64` instead. Within such a range the time is one number; the measured
# rows scatter around it (AIC's B200 table has M = 1 rows 1.5-3x the others of their range), so each range's
# rows are read as their median. Above m = 64 the grid grows with m: rows read as measured.
SM100_FP8_SAME_GRID = ((1, 16), (17, 64))
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
# The comm tables' message_size counts elements (AIConfigurator's comm shims factor "an element count",
# sdk/perf_database.py `_factor_message_size`; its models query tokens x hidden), here 16-bit ones
COMM_ELEMENT_BYTES = 2
AIC_DIR = PROFILES / "aic"               # the shipped AIC-built library (profiles/build_aic.py)


def package_root() -> Path:
    """The installed package's folder, or a one-line DataError saying how to install it."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"--data aic: the package {PACKAGE} is not installed; pip install 'pipesim[aic]' "
                        f"(or pip install {PACKAGE})")
    return Path(list(spec.submodule_search_locations)[0])


def package_version() -> str:
    return importlib.metadata.version(PACKAGE)


def _yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise DataError(f"{path}: AIConfigurator system spec missing")
    return yaml.safe_load(path.read_text())


def interp_loglog(grid: np.ndarray, x: float) -> tuple[int, int, float]:
    """(i, j, w): x lies between grid[i] and grid[j], at weight w of grid[j] in log space (i == j on the grid
    or beyond its ends)."""
    grid = np.asarray(grid, float)
    if x <= grid[0]:
        return 0, 0, 0.0
    if x >= grid[-1]:
        n = len(grid) - 1
        return n, n, 0.0
    j = int(np.searchsorted(grid, x))
    if grid[j] == x:
        return j, j, 0.0
    i = j - 1
    return i, j, float(math.log(x / grid[i]) / math.log(grid[j] / grid[i]))


@dataclasses.dataclass
class AicData:
    """The tables of one AIConfigurator system, engine and version."""

    system: str
    engine: str = "vllm"
    version: str = ""
    root: Path | None = None

    def __post_init__(self) -> None:
        self.root = self.root or package_root()
        versions = ENGINE_VERSIONS.get(self.engine)
        if versions is None:
            raise DataError(f"--engine {self.engine!r}: not supported by the AIC importer; allowed: "
                            f"{', '.join(ENGINE_VERSIONS)}")
        if self.system not in versions:
            raise DataError(f"AIC system {self.system!r}: no {self.engine} tables chosen; allowed: "
                            f"{', '.join(versions)}")
        self.version = self.version or versions[self.system]
        self.spec = _yaml(self.root / "systems" / f"{self.system}.yaml")
        self.data = self.root / "systems" / self.spec["data_dir"]
        self.nccl_version = str(self.spec.get("misc", {}).get("nccl_version", ""))

    def _table(self, op: str, name: str, engine: str | None = None, version: str | None = None) -> pd.DataFrame:
        path = self.data / op / (engine or self.engine) / (version or self.version) / name
        if not path.is_file():
            raise DataError(f"{path}: AIConfigurator table missing ({PACKAGE} {package_version()})")
        return pd.read_parquet(path)

    def rel(self, op: str, name: str, engine: str | None = None, version: str | None = None) -> str:
        """A table's path inside the package, for provenance."""
        return f"{MODULE}/systems/{self.spec['data_dir']}/{op}/{engine or self.engine}/{version or self.version}/{name}"

    # -- GEMMs ---------------------------------------------------------------------------------------------
    @cached_property
    def _gemm(self) -> pd.DataFrame:
        return self._table("gemm", "gemm_perf.parquet")

    @cached_property
    def _cubes(self) -> dict:
        return {}

    def _gemm_cube(self, dtype: str):
        """(m grid, n grid, k grid, ms[m, n, k]) of one dtype's kernel (median over duplicate rows)."""
        if dtype in self._cubes:
            return self._cubes[dtype]
        kernels = GEMM_KERNELS[self.engine]
        if dtype not in kernels:
            raise DataError(f"weight dtype {dtype!r}: allowed: {', '.join(kernels)}")
        gd, ks = kernels[dtype]
        df = self._gemm[(self._gemm["gemm_dtype"] == gd) & (self._gemm["kernel_source"] == ks)]
        if df.empty:
            raise DataError(f"{self.rel('gemm', 'gemm_perf.parquet')}: no {gd} rows of {ks}")
        med = df.groupby(["m", "n", "k"])["latency"].median()
        ms, ns, kk = (np.array(sorted(set(med.index.get_level_values(i)))) for i in range(3))
        cube = med.reindex(pd.MultiIndex.from_product([ms, ns, kk])).to_numpy().reshape(len(ms), len(ns), len(kk))
        if self.engine == "vllm" and dtype == "fp8" and self.sm_version == 100:
            cube = same_grid_medians(ms, kk, cube, SM100_FP8_SAME_GRID)
        # (n, k) pairs the table lacks (65536 x 65536) stay NaN; a lookup that needs one fails (gemm_ms)
        if np.isnan(cube).all(axis=(1, 2)).any() or np.isnan(cube).any(axis=0).sum() > len(ns):
            raise DataError(f"{self.rel('gemm', 'gemm_perf.parquet')}: {ks} rows do not cover the m x n x k grid")
        self._cubes[dtype] = (ms, ns, kk, cube)
        return self._cubes[dtype]

    def gemm_ms(self, n: int, k: int, dtype: str = "bf16") -> tuple[np.ndarray, np.ndarray, str]:
        """(m grid, ms per call over it, how): measured at a grid (n, k); else bilinear in (log n, log k) of
        log-time; n past the grid linear in n from the largest n."""
        ms, ns, ks, cube = self._gemm_cube(dtype)
        scale = 1.0
        how = "measured"
        if n > ns[-1]:
            scale, how = n / ns[-1], f"{ns[-1]}x{k} x {n}/{ns[-1]} (n past the table)"
            n = int(ns[-1])
        i, j, wn = interp_loglog(ns, n)
        a, b, wk = interp_loglog(ks, k)
        if (i, j, a, b) != (i, i, a, a) or ns[i] != n or ks[a] != k:
            how = (f"interpolated in (log n, log k) between n {ns[i]}..{ns[j]} and k {ks[a]}..{ks[b]}"
                   if how == "measured" else how + "; interpolated")
        lg = np.log(cube)
        val = ((1 - wn) * (1 - wk) * lg[:, i, a] + wn * (1 - wk) * lg[:, j, a] + (1 - wn) * wk * lg[:, i, b]
               + wn * wk * lg[:, j, b])
        if np.isnan(val).any():
            raise DataError(f"{self.rel('gemm', 'gemm_perf.parquet')}: no {dtype} rows around n {n}, k {k}")
        return ms, np.exp(val) * scale, how

    def suspect_gemm_rows(self, shapes: list[tuple[int, int]] | None = None) -> pd.DataFrame:
        """FP8 rows slower than their BF16 twin at the same (m, n, k) (restricted to `shapes` if given)."""
        ms, ns, ks, bf = self._gemm_cube("bf16")
        _, _, _, f8 = self._gemm_cube("fp8")
        idx = np.argwhere(np.nan_to_num(f8) > np.nan_to_num(bf))
        rows = pd.DataFrame({"m": ms[idx[:, 0]], "n": ns[idx[:, 1]], "k": ks[idx[:, 2]],
                             "fp8_ms": f8[tuple(idx.T)], "bf16_ms": bf[tuple(idx.T)]})
        if shapes is not None:
            keep = set(shapes)
            rows = rows[[(int(n), int(k)) in keep for n, k in zip(rows["n"], rows["k"])]]
        return rows.reset_index(drop=True)

    # -- element-wise ops -----------------------------------------------------------------------------------
    def elementwise_coeffs(self) -> tuple[float, float]:
        """(a_ms, b_ms_per_byte) of AIConfigurator's analytic memory-op model on this GPU."""
        g = self.spec["gpu"]
        return (float(g["mem_empirical_constant_latency"]) * 1e3,
                1e3 / (float(g["mem_bw"]) * float(g["mem_bw_empirical_scaling_factor"])))

    # -- attention -----------------------------------------------------------------------------------------
    @cached_property
    def sm_version(self) -> int:
        return int(self.spec["gpu"]["sm_version"])

    def attention_kernels(self) -> tuple[str, str]:
        ker = ATTENTION_KERNELS[self.engine].get(self.sm_version)
        if ker is None:
            raise DataError(f"AIC system {self.system}: no attention kernel chosen for sm_version {self.sm_version}")
        return ker

    def attention_rows(self, phase: str, q_heads: int, kv_heads: int, head_dim: int, kv_dtype: str
                       ) -> tuple[pd.DataFrame, int, str]:
        """(rows, query heads of the rows, table path) of `phase` ("context" / "generation") at the shard's
        heads; the nearest measured query-head count with the same KV heads when the exact one is absent."""
        name = f"{phase}_attention_perf.parquet"
        df = self._attention_table(name)
        ker = self.attention_kernels()[0 if phase == "context" else 1]
        sel = df[(df["kernel_source"] == ker) & (df["kv_cache_dtype"] == KV_DTYPES[kv_dtype])
                 & (df["num_key_value_heads"] == kv_heads) & (df["head_dim"] == head_dim)
                 & (df["window_size"] == 0) & (df["attn_dtype"] == "bfloat16")]
        if sel.empty:
            raise DataError(f"{self.rel('attention', name)}: no {ker} rows with {kv_heads} KV heads of {head_dim}, "
                            f"KV cache {kv_dtype}")
        have = sorted(set(sel["num_heads"].tolist()))
        q = min(have, key=lambda h: (abs(math.log(h / q_heads)), h))
        return sel[sel["num_heads"] == q], q, self.rel("attention", name)

    @cached_property
    def _att(self) -> dict:
        return {}

    def _attention_table(self, name: str) -> pd.DataFrame:
        if name not in self._att:
            self._att[name] = self._table("attention", name)
        return self._att[name]

    def attention_fit(self, q_heads: int, kv_heads: int, head_dim: int, kv_dtype: str, max_context: int
                      ) -> dict:
        """Prefill and decode coefficients (per layer, ms) of one shard, their fit quality, the measured
        ranges and how they were made."""
        ctx, qc, ctx_path = self.attention_rows("context", q_heads, kv_heads, head_dim, kv_dtype)
        ctx = ctx[ctx["isl"] <= max_context]
        gen, qg, gen_path = self.attention_rows("generation", q_heads, kv_heads, head_dim, kv_dtype)
        gen = gen.assign(context=gen["isl"] + gen["step"])
        gen = gen[gen["context"] <= max_context]
        b, c, t = (ctx[k].to_numpy(float) for k in ("batch_size", "isl", "latency"))
        X = np.column_stack([np.ones_like(c), b * c, b * c * c])
        cp, ep = fit_nnls_rel(X, t)
        s = q_heads / qc                    # prefill FLOPs scale with query heads
        pre = {"a_ms": float(cp[0]), "b_c": float(cp[1] * s), "b_c2": float(cp[2] * s), "b_cp": float(2 * cp[2] * s)}
        B, C, t = (gen[k].to_numpy(float) for k in ("batch_size", "context", "latency"))
        cd, ed = fit_nnls_rel(np.column_stack([np.ones_like(t), B * C]), t)
        dec = {"a_ms": float(cd[0]), "b_ctx": float(cd[1])}
        notes = []
        if qc != q_heads:
            notes.append(f"prefill rows of {qc} query heads scaled by {q_heads}/{qc}")
        if qg != q_heads:
            notes.append(f"decode rows of {qg} query heads (same {kv_heads} KV heads) used as they are")
        return {"prefill": pre, "decode": dec,
                "quality": {"prefill": _quality(ep), "decode": _quality(ed)},
                "measured": {"prefill_chunk": [int(ctx["isl"].min()), int(ctx["isl"].max())],
                             "prefill_context": [int(ctx["isl"].min()), int(ctx["isl"].max())],
                             "prefill_prefix": [0, 0],      # the context tables have no cached prefix
                             "decode_batch": [int(gen["batch_size"].min()), int(gen["batch_size"].max())],
                             "decode_context": [int(gen["context"].min()), int(gen["context"].max())]},
                "kernels": self.attention_kernels(), "tables": [ctx_path, gen_path], "notes": notes}

    # -- communication -------------------------------------------------------------------------------------
    @cached_property
    def custom_ar(self) -> pd.DataFrame:
        df = self._table("comm", "custom_allreduce_perf.parquet")
        return df[(df["allreduce_dtype"] == "bfloat16") & df["kernel_source"].str.endswith("_graph")]

    @cached_property
    def nccl(self) -> pd.DataFrame:
        df = self._table("comm", "nccl_perf.parquet", engine="nccl", version=self.nccl_version)
        return df[(df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")]

    def allreduce_choice(self, num_gpus: int, nbytes: int) -> tuple[str, float]:
        """(kernel, ms) of one all-reduce of `nbytes` (16-bit elements) over `num_gpus` GPUs of one NVSwitch
        node, as the engine chooses: custom all-reduce for a supported world size and a message under its
        max_size, else NCCL (median over the table's repeated rows)."""
        use_custom = num_gpus in CUSTOM_AR_WORLD_SIZES and nbytes < CUSTOM_AR_MAX_BYTES
        table = self.custom_ar if use_custom else self.nccl
        rows = table[(table["num_gpus"] == num_gpus) & (table["message_size"] * COMM_ELEMENT_BYTES == nbytes)]
        if rows.empty:
            raise DataError(f"AIC {self.system}: no {'custom' if use_custom else 'NCCL'} all-reduce row for "
                            f"{num_gpus} GPUs at {nbytes} bytes")
        return ("custom" if use_custom else "nccl"), float(rows["latency"].median())

    def allreduce_rows(self, num_gpus: int, link_gbps: float) -> tuple[list[tuple[int, float, str]], list[str]]:
        """((bytes, ms, kernel) at every message size both tables hold for `num_gpus` GPUs, the rows left out):
        a row faster than a ring all-reduce can be over the link (2 (n-1)/n x bytes / ms above `link_gbps`:
        NCCL's NVLink SHARP algorithm reduces in the switch, which the ring floor of the profile format
        does not model) is left out and reported; past the last row the run extrapolates linearly."""
        sizes = sorted(set(self.nccl.loc[self.nccl["num_gpus"] == num_gpus, "message_size"])
                       & set(self.custom_ar.loc[self.custom_ar["num_gpus"] == num_gpus, "message_size"]))
        out, dropped = [], []
        for s in sizes:
            nbytes = int(s) * COMM_ELEMENT_BYTES
            kind, ms = self.allreduce_choice(num_gpus, nbytes)
            ring_gbps = 2 * (num_gpus - 1) / num_gpus * nbytes / (ms / 1e3) / 1e9
            if ring_gbps > link_gbps:
                dropped.append(f"{kind} {num_gpus} GPUs {nbytes} B: {ring_gbps:.0f} GB/s ring-equivalent > link "
                               f"{link_gbps:g}")
                continue
            out.append((nbytes, ms, kind))
        return out, dropped

    def p2p_ms(self, nbytes: int) -> float:
        node = self.spec["node"]
        return (float(node["p2p_latency"]) + nbytes / float(node["intra_node_bw"])) * 1e3


def aic_ground_truth(gpu: GpuSpec) -> dict:
    """The built profiles' `[ground_truth]` (variance and host cost transferred from the calibrated profile) with
    `decode_wave_fraction` = 0: that term pads FlashInfer's A100 decode kernel (one thread block per request and
    KV head, no split over the context) to full waves of SMs, fitted to the transcribed A100 points. The AIC
    decode rows are measured kernels of this GPU (FA3 / TRT-LLM, which split long contexts over the SMs): their
    wave effects are in the rows already, and at batch 1 over a 32k context the transferred term would charge
    the kernel about 4x what the table measured."""
    gt = ground_truth_section(gpu)
    gt["decode_wave_fraction"] = 0.0
    gt["source"] += ("; decode_wave_fraction 0 for AIConfigurator-built profiles (measured decode kernels, "
                     "sim/profiling/aic.py aic_ground_truth)")
    return gt


def same_grid_medians(ms: np.ndarray, ks: np.ndarray, cube: np.ndarray,
                      ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The GEMM cube (m x n x k, ms) with each m range that runs one kernel on one grid read as the median of its
    measured rows, per (n, k) (NaN rows left out); m = 64 at k < 4096 stays as measured (another configuration,
    SM100_FP8_SAME_GRID)."""
    out = cube.copy()
    for lo, hi in ranges:
        rows = np.flatnonzero((ms >= lo) & (ms <= hi))
        if len(rows) == 0:
            continue
        for kj, k in enumerate(ks):
            sel = rows[~((ms[rows] == 64) & (k < 4096))]
            if len(sel) == 0:
                continue
            with warnings.catch_warnings():  # an (n, k) the table lacks is NaN in every row: stays NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                mid = np.nanmedian(cube[sel, :, kj], axis=0)
            out[sel, :, kj] = np.where(np.isnan(cube[sel, :, kj]), np.nan, mid)
    return out


def fp8_slower_points(aic: AicData, shapes: dict[str, tuple[int, int]]) -> list[str]:
    """"op@tokens" where the FP8 GEMM (as the profile reads it) is slower than the BF16 one at the same shape."""
    out = []
    for op, (n, k) in shapes.items():
        m, f8, _ = aic.gemm_ms(n, k, "fp8")
        _, bf, _ = aic.gemm_ms(n, k, "bf16")
        keep = m <= GRID_MAX_TOKENS
        out += [f"{op}@{int(t)}" for t, a, b in zip(m[keep], f8[keep], bf[keep]) if a > b]
    return out


def _quality(err: np.ndarray) -> dict:
    return {"points": int(len(err)), "median_rel_err": float(np.median(err)),
            "p90_rel_err": float(np.percentile(err, 90))}


def _fmt(x: float) -> str:
    return f"{x:.5g}"


def layer_table(aic: AicData, model: ModelArch, tp: int, weight_dtype: str) -> tuple[pd.DataFrame, dict]:
    """layer_nonattn.csv columns (FORMAT.md) over the GEMM table's token grid, and how each GEMM was read."""
    arch = Arch(model.hidden_size, model.intermediate_size, model.num_q_heads, model.num_kv_heads, model.head_dim,
                model.gated_mlp, 2)      # activations are 16-bit whatever the weights
    how = {}
    out = None
    for op, (n, k) in gemm_shapes(arch, tp).items():
        grid, ms, h = aic.gemm_ms(n, k, weight_dtype)
        if out is None:
            out = pd.DataFrame(index=pd.Index(grid.astype(np.int64), name="num_tokens"))
        out[op] = ms
        how[op] = f"{n}x{k} {h}"
    dense = out.index <= GRID_MAX_TOKENS
    beyond = out[~dense].copy()
    out = out[dense].copy()
    a, b = aic.elementwise_coeffs()
    ew = elementwise_bytes_per_token(arch, tp)
    tokens = out.index.to_numpy(float)
    for op in ELEMENTWISE_OPS:
        val = a + b * ew[op] * tokens
        out["rmsnorm_x2" if op == "rmsnorm" else op] = 2 * val if op == "rmsnorm" else val
    out["linear_ms"] = out[list(GEMM_OPS)].sum(axis=1)
    out["layer_nonattn_ms"] = out[["linear_ms", "act", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    how["beyond"] = extrapolation_check(out, beyond)
    return out, how


def extrapolation_check(dense: pd.DataFrame, beyond: pd.DataFrame) -> str:
    """How the run's linear extrapolation past the dense grid (FORMAT.md: the least-squares rate over the top
    half of the grid) compares with the table's sparse GEMM points past it (sum of the four GEMMs)."""
    if beyond.empty:
        return "no GEMM points past the grid"
    lin = dense["linear_ms"]
    top = lin[lin.index >= lin.index[-1] / 2]
    x = top.index.to_numpy(float)
    rate = max(0.0, float(np.polyfit(x, top.to_numpy(float), 1)[0]))
    parts = []
    for m, row in beyond.iterrows():
        meas = float(sum(row[op] for op in GEMM_OPS))
        pred = float(lin.iloc[-1]) + rate * (m - lin.index[-1])
        parts.append(f"{int(m)}: {pred / meas - 1:+.1%}")
    return "linear extrapolation of the four GEMMs vs the table's points past the grid: " + ", ".join(parts)


def render_layer_csv(layer: pd.DataFrame, compact: bool) -> str:
    cols = COMPACT_COLS if compact else LAYER_COLS
    lines = [",".join(["num_tokens"] + cols)]
    for n, row in layer.iterrows():
        lines.append(",".join([str(int(n))] + [_fmt(row[c]) for c in cols]))
    return "\n".join(lines) + "\n"


def render_comm_csv(ar: dict[int, list[tuple[int, float, str]]], p2p: list[tuple[int, float]]) -> str:
    lines = ["op,num_workers,bytes,ms"]
    for n, rows in sorted(ar.items()):
        lines += [f"all_reduce,{n},{s},{_fmt(ms)}" for s, ms, _ in rows]
    lines += [f"send_recv,2,{s},{_fmt(ms)}" for s, ms in p2p]
    return "\n".join(lines) + "\n"


def profile_name(model: str, weight_dtype: str, kv_dtype: str) -> str:
    """The library folder of a model in a dtype pair, e.g. llama-3.1-8b-fp8-kvfp8."""
    return f"{model}-{weight_dtype}-kv{kv_dtype}"


def aic_dir(root: Path, gpu: GpuSpec, engine: str, model: str, weight_dtype: str, kv_dtype: str, tp: int) -> Path:
    return root / gpu.name / engine / profile_name(model, weight_dtype, kv_dtype) / f"tp{tp}"


def build_aic_profile(model: ModelArch, gpu: GpuSpec, tp: int, out: str | Path, engine: str = "vllm",
                      weight_dtype: str = "bf16", kv_dtype: str = "bf16", compact: bool = False,
                      replace: bool = True, aic: AicData | None = None):
    """Write a profile built from AIConfigurator's tables to `out` and return the loaded `Profile`."""
    from sim.latency.profiled import Profile
    from sim.profiling.profile_io import check_staged

    if model.moe is not None:
        raise DataError(f"--model {model.name}: a mixture-of-experts model; sim/profiling/moe.py "
                        f"(profiles/build_moe.py) builds it from AIConfigurator's MoE tables")
    model.check_tp(tp)
    if gpu.name not in SYSTEMS:
        raise DataError(f"--gpu {gpu.name!r}: no AIConfigurator system for it; allowed with --data aic: "
                        f"{', '.join(SYSTEMS)}")
    if weight_dtype not in DTYPE_BYTES:
        raise DataError(f"--weight-dtype {weight_dtype!r}: allowed: {', '.join(DTYPE_BYTES)}")
    if kv_dtype not in KV_DTYPES:
        raise DataError(f"--kv-dtype {kv_dtype!r}: allowed: {', '.join(KV_DTYPES)}")
    peak = gpu.peak_tflops(weight_dtype)
    aic = aic or AicData(SYSTEMS[gpu.name], engine)
    layer, gemm_how = layer_table(aic, model, tp, weight_dtype)
    q_heads, kv_heads = model.num_q_heads // tp, max(1, model.num_kv_heads // tp)
    ctx_len = model.context_length_tokens or 32768
    att = aic.attention_fit(q_heads, kv_heads, model.head_dim, kv_dtype, ctx_len)
    _, lm, lm_how = aic.gemm_ms(model.vocab_size, model.hidden_size, "bf16")
    link = gpu.nvlink_gbps
    if not link:
        raise DataError(f"profiles/gpus/{gpu.name}.toml [gpu]: field 'nvlink_gbps' is needed for --data aic")
    ar, ar_dropped = {}, []
    if tp > 1:
        ar[tp], ar_dropped = aic.allreduce_rows(tp, link)
    p2p_sizes = sorted({s for rows in ar.values() for s, _, _ in rows}
                       or set(aic.nccl["message_size"].astype(int) * COMM_ELEMENT_BYTES))
    p2p = [(s, aic.p2p_ms(s)) for s in p2p_sizes]
    scaling, scale_records = gpu_scaling(gpu)
    shapes = gemm_shapes(model.kernel_arch, tp)
    suspects = fp8_slower_points(aic, shapes) if weight_dtype == "fp8" else []
    gd, gk = GEMM_KERNELS[engine][weight_dtype]
    version = package_version()
    gemm_path = aic.rel("gemm", "gemm_perf.parquet")
    ar_path = aic.rel("comm", "custom_allreduce_perf.parquet")
    nccl_path = aic.rel("comm", "nccl_perf.parquet", engine="nccl", version=aic.nccl_version)
    a_ew, b_ew = aic.elementwise_coeffs()
    ar_kinds = sorted({k for rows in ar.values() for _, _, k in rows})
    custom_upto = max((s for rows in ar.values() for s, _, k in rows if k == "custom"), default=0)
    data_source = (f"AIConfigurator measured kernels ({PACKAGE} {version}, {aic.system}, {engine} {aic.version}; "
                   f"weights {weight_dtype}, KV cache {kv_dtype}); attention fitted")
    meta = {
        "profile": {"gpu": gpu.display, "model": model.name, "tp": tp, "source": "built",
                    "data_source": data_source, "attention": "fitted", "gpu_spec": gpu.name,
                    "interconnect": gpu.default_interconnect, "kernel_data": "aic",
                    "base_hardware": f"AIConfigurator {aic.system} kernel data",
                    "aic_package": PACKAGE, "aic_version": version, "aic_system": aic.system,
                    "engine": engine, "engine_version": aic.version, "nccl_version": aic.nccl_version,
                    "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
                    "gemm_kernel": gk, "attention_kernels": list(att["kernels"]),
                    "units": {"time": "ms", "size": "bytes", "bandwidth": "GB/s (1e9 B/s)"},
                    "sources": list(dict.fromkeys([gemm_path, *att["tables"], ar_path, nccl_path,
                                                   f"{MODULE}/systems/{aic.system}.yaml",
                                                   f"profiles/gpus/{gpu.name}.toml", model.source,
                                                   "profiles/a100-pcie-40gb/qwen2.5-32b/tp1/meta.toml"]))},
        "model": {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "num_q_heads": model.num_q_heads, "num_kv_heads": model.num_kv_heads,
                  "head_dim": model.head_dim, "vocab_size": model.vocab_size,
                  "intermediate_size": model.intermediate_size, "layer_params": model.layer_params,
                  "embedding_params": model.embedding_params, "dtype_bytes": DTYPE_BYTES[weight_dtype],
                  "kv_dtype_bytes": DTYPE_BYTES[kv_dtype], "act_dtype_bytes": 2,
                  "gated_mlp": model.gated_mlp, "qkv_bias": model.qkv_bias,
                  "tied_embeddings": model.tied_embeddings,
                  **({"context_length_tokens": model.context_length_tokens} if model.context_length_tokens else {})},
        "lookup": {"mode": scaling["lookup"]},
        "scaling": {"s_mem": scaling["s_mem"], "s_comp": scaling["s_comp"], "mem_bound_tokens": 128,
                    "comp_bound_tokens": 1024, "status": scaling["status"], "source": scaling["source"]},
        "overhead": {"cpu_ms": scaling["cpu_ms"], "lm_head_ms": round(float(lm[0]), 4), **DEFAULT_OVERHEAD},
        "comm": {"model": "table", "activation_bytes_per_token": 2 * model.hidden_size * 2,
                 # alpha-beta fallback keys (the table is what runs): AIConfigurator's P2P model for both
                 "p2p_alpha_us": float(aic.spec["node"]["p2p_latency"]) * 1e6,
                 "p2p_bw_gbps": float(aic.spec["node"]["intra_node_bw"]) / 1e9,
                 "allreduce_alpha_us": float(aic.spec["node"]["p2p_latency"]) * 1e6,
                 "allreduce_busbw_gbps": min(float(aic.spec["node"]["intra_node_bw"]) / 1e9, link)},
        "memory": {"gpu_mem_gib": gpu.memory_gib, "m_init_gib": gpu.m_init_gib},
        "roofline": {"gpu_spec": gpu.name, "bf16_tflops": gpu.bf16_tflops, "peak_tflops": peak,
                     "peak_dtype": weight_dtype, "hbm_bw_gbps": gpu.hbm_bw_gbps, "interconnect": gpu.default_interconnect,
                     "link_bw_gbps": link, "base_gpu_spec": gpu.name, "base_bf16_tflops": gpu.bf16_tflops,
                     "base_peak_tflops": peak, "base_hbm_bw_gbps": gpu.hbm_bw_gbps,
                     "source": (f"profiles/gpus/{gpu.name}.toml ({gpu.source}); the tables were measured on this GPU "
                                f"(AIConfigurator {aic.system}); peak_tflops: dense {weight_dtype.upper()}")},
        "measured": {"tokens": [int(layer.index[0]), int(layer.index[-1])], **att["measured"],
                     **({"comm_bytes": [int(ar[tp][0][0]), int(ar[tp][-1][0])]} if ar else {}),
                     "source": f"tokens: the m grid of {gemm_path}; attention: the rows fitted ({', '.join(att['tables'])})",
                     "beyond": BEYOND},
        "ground_truth": aic_ground_truth(gpu),
        "derivation": {
            "layer_nonattn": (f"GEMMs from {gemm_path} ({gd}, {gk}) at (N x K) per op for TP{tp}: "
                              + "; ".join(f"{op} {gemm_how[op]}" for op in GEMM_OPS)
                              + (f"; m in {', '.join(f'[{lo}, {hi}]' for lo, hi in SM100_FP8_SAME_GRID)}: the median of "
                                 f"the range's rows (one kernel and grid in vLLM's SM100 FP8 dispatch, "
                                 f"SM100_FP8_SAME_GRID in sim/profiling/aic.py)"
                                 if engine == "vllm" and weight_dtype == "fp8" and aic.sm_version == 100 else "")
                              + f"; grid up to {GRID_MAX_TOKENS} tokens (the table's dense part); {gemm_how['beyond']}"
                              + f"; act, rope, 2 x rmsnorm, residual add by bytes moved as AIConfigurator costs memory "
                                f"ops: {a_ew:.4g} ms + bytes / ({aic.spec['gpu']['mem_bw']:.4g} B/s x "
                                f"{aic.spec['gpu']['mem_bw_empirical_scaling_factor']}) (systems/{aic.system}.yaml)"),
            "attention": (f"fitted to {', '.join(att['tables'])} ({att['kernels'][0]} / {att['kernels'][1]}, KV cache "
                          f"{kv_dtype}) at {q_heads} q / {kv_heads} kv heads x {model.head_dim}, contexts <= {ctx_len}; "
                          "prefill a + b_c c + b_c2 c^2 (no prefix rows: b_cp = 2 b_c2), decode a + b_ctx sum(ctx)"
                          + ("; " + "; ".join(att["notes"]) if att["notes"] else "")),
            "lm_head": f"lm_head_ms = the BF16 GEMM table at {model.vocab_size}x{model.hidden_size}, 1 token ({lm_how})",
            "overhead": "embedding_ms, sample_ms, broadcast_us: defaults, not fitted",
            "comm": (f"NCCL table folder {aic.nccl_version} (the system's nccl_version; its rows' version column "
                     f"says {', '.join(sorted(set(aic.nccl['version'].astype(str))))}); "
                     + ((f"all_reduce rows: {ENGINE_NAMES[engine]}'s choice per message size ({', '.join(ar_kinds)}): custom all-reduce "
                      f"({ar_path}, CUDA-graph rows) below {CUSTOM_AR_MAX_BYTES} bytes for world sizes "
                      f"{CUSTOM_AR_WORLD_SIZES} on one NVLink node (largest custom row: {custom_upto} bytes), NCCL "
                      f"{aic.nccl_version} ({nccl_path}) above; ") if ar else "tp1: no all-reduce; ")
                     + (f"rows left out (faster than a ring over the link): {'; '.join(ar_dropped)}; "
                        if ar_dropped else "")
                     + "message sizes: the tables' element counts x 2 bytes; "
                     + f"send_recv rows: AIConfigurator's P2P model, p2p_latency + bytes / intra_node_bw "
                       f"(systems/{aic.system}.yaml; no measured P2P table)"),
            "scaling": f"{scaling['status']} ({scaling['source']})",
            "dtypes": (f"weights {weight_dtype} ({DTYPE_BYTES[weight_dtype]} B per element of the linear layers; "
                       f"embedding and LM head 16-bit), KV cache {kv_dtype} ({DTYPE_BYTES[kv_dtype]} B), activations "
                       "and collectives 16-bit"),
            "suspect_rows": ((f"FP8 GEMM slower than its BF16 twin at {len(suspects)} of "
                              f"{4 * len(layer)} (op, tokens) points of this profile"
                              + (f" ({', '.join(suspects[:6])}{', ...' if len(suspects) > 6 else ''})" if suspects else "")
                              + "; used as measured: an FP8 checkpoint runs the FP8 kernel")
                             if weight_dtype == "fp8" else "none checked (BF16)"),
        },
        "fit_errors": {**{f"attention_{c}_median_rel_err": q["median_rel_err"] for c, q in att["quality"].items()},
                       **{f"attention_{c}_p90_rel_err": q["p90_rel_err"] for c, q in att["quality"].items()},
                       "gemm_interpolated_ops": [op for op in GEMM_OPS if "measured" not in gemm_how[op]],
                       "gemm_measured_ops": [op for op in GEMM_OPS if "measured" in gemm_how[op]]},
    }
    if compact:
        meta["derivation"]["columns"] = ("per-op columns omitted to keep the shipped library small; "
                                         "ppsim profile build --data aic --out DIR writes them")
    text = "# Generated by ppsim profile build --data aic; do not edit by hand.\n" + tomlio.dumps(meta)
    for rec in scale_records:
        keep = {k: rec[k] for k in ("param", "value", "status", "target", "achieved", "residual") if k in rec}
        text += "\n[[fit]]\n" + tomlio.dumps(keep)
    out = Path(out)
    with fsio.StagedFolder(out) as staged:
        fsio.write_text(staged.path / "layer_nonattn.csv", render_layer_csv(layer, compact))
        fsio.write_text(staged.path / "attention.csv", render_attention_csv(att["prefill"], att["decode"]))
        fsio.write_text(staged.path / "comm.csv", render_comm_csv(ar, p2p))
        fsio.write_text(staged.path / "meta.toml", text)
        check_staged(staged)
        if replace:
            staged.commit()
        else:
            staged.commit_if_absent("meta.toml")
    return Profile.load(out)
