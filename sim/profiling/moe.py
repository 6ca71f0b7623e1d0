"""Mixture-of-experts profiles from measured expert kernels (issue 44): AIConfigurator's MoE tables.

An MoE layer's MLP is a router GEMM (hidden -> experts, BF16) and the fused routed-expert kernel
(top-k routing, the experts' gated MLPs, the weighted sum). AIConfigurator measures the fused kernel as the
engine runs it (`moe/<engine>/<version>/moe_perf.parquet` of `aiconfigurator-core`: one row per
(kernel_source, moe_dtype, num_tokens, hidden_size, inter_size, topk, num_experts, moe_tp_size, moe_ep_size,
distribution), latency in ms; num_tokens are the tokens entering the layer, before top-k expansion) and
composes an MoE block as router GEMM + that kernel + the dispatch, which for experts sharded by TP is the
layer's all-reduce (`sdk/models/blocks/moe.py` `build_moe_block_ops`). This module does the same:

- **Expert time** (`AicMoe.curve`): the table's curve over tokens for the model's (hidden, expert FFN, top-k,
  experts), the profile's moe_tp and ep, the weight dtype's kernel (`MOE_KERNELS`: vLLM's unquantized fused
  MoE (Triton) for BF16 and its ModelOpt per-tensor FP8 MoE (FlashInfer CUTLASS) for FP8, matching the
  per-tensor FP8 dense GEMMs of `sim.profiling.aic`; SGLang's Triton fused MoE for BF16) and the routing
  distribution (`balanced`, or the table's skewed `power_law_1.01` / `power_law_1.2`, chosen when the profile
  is built), median over duplicate rows, interpolated linearly in (log tokens, log ms) between measured
  token counts.
- **The rest of the layer** (QKV and O GEMMs, RoPE, norms, residual add, attention, LM head, all-reduce
  rows, P2P) is `sim.profiling.aic.build_aic_profile`'s, built for the model's attention shape; its MLP
  columns are replaced by the router GEMM and the expert curve.
- **Layout**: experts sharded by TP (vLLM's and SGLang's default without `--enable-expert-parallel` /
  `--ep-size`): moe_tp = tp, ep = 1, one all-reduce after the MoE layer as after a dense MLP. The memory
  model holds every expert, each split over TP (`ModelArch.layer_params_per_gpu`). Or (`ep` = tp) expert
  parallelism at data-parallel attention 1 (sim/core/ep.py): moe_tp = 1, num_experts / ep whole experts per GPU
  (the same bytes), the table's (moe_tp 1, ep) rows, which time the busiest rank (sim/latency/moe_routing.py),
  against a floor of that rank's experts and slots (`busiest_rank`); the dense parts and the all-reduce (now
  the combine) as the TP-sharded layout's; each EP curve is compared with its TP-sharded twin
  (`ep_vs_tp_sharded`, in [derivation] moe_checks).
- **Checks** (`data_checks`): each curve point against the roofline floor that reads only the experts the
  tokens touch under the table's routing (`sim.latency.moe_routing.touched_experts`), and whether the curve
  gets faster with TP (the table's rows at moe_tp / 2), both written into the profile's [derivation].

**The A100** (`build_moe_profile_a100`): AIConfigurator's A100 system is not wired for dense parts
(`sim.profiling.aic.SYSTEMS`), so the rest of the layer is Vidur's A100 data (`sim.profiling.build`, as every
A100 built profile) and the router GEMM Vidur's GEMM model at (experts, hidden). The expert curve, per
profiles/crosscheck_moe_a100.md: AIConfigurator's A100 SGLang 0.5.10 rows of the Triton fused MoE
(`A100_MOE_TABLE`; its vLLM 0.14 A100 table has power-law rows only, `vllm_fused_moe`, within about 10% of
SGLang's power-law rows for Mixtral at moe_tp 1-4: the same Triton kernel), except Mixtral-8x7B at TP 1, where
AIConfigurator's rows are 2.7-2.8x the roofline floor from 1024 tokens (1.7-2.0x the second source) and the
MIT-licensed Frontier table (NetX-lab/Frontier `data/profiling/compute/a100/mixtral_8x7b_moe/moe.csv`: gating +
shuffling + grouped GEMM, timed apart, on Vidur's token grid) is used instead (`FRONTIER_CSV`, derived by
profiles/derive_frontier_moe.py with the source commit in its header).
"""

from __future__ import annotations

import dataclasses
import tempfile
import tomllib
from functools import cached_property
from pathlib import Path

from sim.core.lazy import lazy

np = lazy("numpy")
pd = lazy("pandas")

from sim.core import fsio, tomlio
from sim.core.errors import DataError
from sim.latency.moe_routing import DISTRIBUTIONS, busiest_rank, touched_experts
from sim.profiling.aic import (COMPACT_COLS, GRID_MAX_TOKENS, MODULE, PACKAGE, SYSTEMS, AicData, build_aic_profile,
                               fp8_slower_points, package_version, profile_name)
from sim.profiling.kernels import gemm_shapes
from sim.latency.hardware import PROFILES, GpuSpec
from sim.profiling.specs import ModelArch

MOE_DIR = PROFILES / "moe"               # the shipped MoE library (profiles/build_moe.py)
# engine -> dtype -> (moe_dtype, kernel_source) of the MoE table (see the module docstring)
MOE_KERNELS = {"vllm": {"bf16": ("bfloat16", "vllm_unquantizedfusedmoe_triton_tritonexperts"),
                        "fp8": ("fp8", "vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts")},
               "sglang": {"bf16": ("bfloat16", "sglang_fused_moe_triton")}}
# the A100's MoE table (see the module docstring): (AIC system, engine, version, kernel_source, moe_dtype)
A100_MOE_TABLE = ("a100_sxm", "sglang", "0.5.10", "sglang_fused_moe_triton", "bfloat16")
A100_GPUS = ("a100-sxm-80gb",)
# Frontier's Mixtral-8x7B A100 table, reduced to per-(TP, tokens) medians of its three parts
FRONTIER_CSV = MOE_DIR / "sources" / "frontier_a100_mixtral_8x7b_moe.csv"
FRONTIER_USED = {("mixtral-8x7b", 1)}   # (model, TP) whose A100 expert curve is Frontier's, not AIConfigurator's
SLOW_BOUND = 3.0                         # a point this many times its roofline floor is reported (profile check's)
# the [moe] layout of an EP profile (sim/core/ep.py)
EP_LAYOUT = ("expert parallel over the TP group (vLLM --enable-expert-parallel at data-parallel size 1): moe_tp = 1, "
             "{local} whole experts per rank, attention TP-sharded; no dispatch (every rank holds the step's tokens), "
             "one all-reduce over the {ep} ranks after the layer (combine); the busiest rank sets the expert time")
LAYER_COLS = ["qkv_proj", "o_proj", "router", "moe_experts", "rope", "rmsnorm_x2", "residual_add", "linear_ms",
              "layer_nonattn_ms"]


def interp_loglog_curve(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """y at `at`, linear in (log x, log y) between the points of (x, y); past either end, the end segment's
    line (x sorted, increasing, >= 1 point; y > 0)."""
    lx, ly, la = np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), np.log(np.asarray(at, float))
    if len(lx) == 1:
        return np.full(len(la), float(y[0]))
    j = np.clip(np.searchsorted(lx, la), 1, len(lx) - 1)
    w = (la - lx[j - 1]) / (lx[j] - lx[j - 1])
    return np.exp(ly[j - 1] + w * (ly[j] - ly[j - 1]))


@dataclasses.dataclass
class AicMoe:
    """The MoE table of one AIConfigurator system and engine version."""

    aic: AicData

    @cached_property
    def table(self) -> pd.DataFrame:
        return self.aic._table("moe", "moe_perf.parquet")

    @property
    def rel(self) -> str:
        return self.aic.rel("moe", "moe_perf.parquet")

    def curve(self, model: ModelArch, dtype: str, moe_tp: int, ep: int = 1,
              distribution: str = "balanced") -> tuple[np.ndarray, np.ndarray]:
        """(tokens, ms) of the fused routed-expert kernel for `model`'s MoE shape; a one-line DataError naming
        what the table has when it lacks the shape."""
        kernels = MOE_KERNELS.get(self.aic.engine, {})
        if dtype not in kernels:
            raise DataError(f"weight dtype {dtype!r}: no {self.aic.engine} MoE kernel chosen; allowed: "
                            f"{', '.join(kernels)}")
        md, ks = kernels[dtype]
        return table_curve(self.table, self.rel, ks, md, model, moe_tp, ep, distribution)


def table_curve(df: pd.DataFrame, rel: str, ks: str, md: str, model: ModelArch, moe_tp: int, ep: int,
                distribution: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, ms): the median per num_tokens of an AIConfigurator MoE table's rows of kernel `ks`, dtype `md`
    at `model`'s MoE shape, (moe_tp, ep) and routing `distribution`."""
    if distribution not in DISTRIBUTIONS:
        raise DataError(f"--moe-distribution {distribution!r}: allowed: {', '.join(DISTRIBUTIONS)}")
    m = model.moe
    shape = df[(df["kernel_source"] == ks) & (df["moe_dtype"] == md) & (df["hidden_size"] == model.hidden_size)
               & (df["inter_size"] == m.expert_intermediate_size) & (df["topk"] == m.top_k)
               & (df["num_experts"] == m.num_experts) & (df["distribution"] == distribution)]
    rows = shape[(shape["moe_tp_size"] == moe_tp) & (shape["moe_ep_size"] == ep)]
    if rows.empty:
        have = sorted({(int(a), int(b)) for a, b in zip(shape["moe_tp_size"], shape["moe_ep_size"])})
        raise DataError(f"{rel}: no {ks} {md} rows for {model.name} (hidden {model.hidden_size}, expert FFN "
                        f"{m.expert_intermediate_size}, top-{m.top_k} of {m.num_experts}, {distribution}) at "
                        f"moe_tp {moe_tp} x ep {ep}; (moe_tp, ep) present: "
                        f"{', '.join(f'({a}, {b})' for a, b in have) or 'none'}")
    med = rows.groupby("num_tokens")["latency"].median()
    return med.index.to_numpy(np.int64), med.to_numpy(float)


def expert_floor_ms(model: ModelArch, tokens: np.ndarray, gpu: GpuSpec, dtype_bytes: int, peak_tflops: float,
                    moe_tp: int, distribution: str = "balanced", ep: int = 1) -> np.ndarray:
    """The routed experts' roofline floor per token count (ms): max(the weights of the experts the tokens touch
    under `distribution` / HBM bandwidth, 2 x tokens x top-k x expert parameters / peak), one TP shard; with
    ep > 1 the busiest expert-parallel rank's experts and slots (`sim.latency.moe_routing.busiest_rank`)."""
    m = model.moe
    out = []
    for t in tokens:
        if ep == 1:
            touched = touched_experts(m.num_experts, m.top_k, float(t), distribution)
            slots = float(t) * m.top_k
        else:
            slots, touched = busiest_rank(m.num_experts, m.top_k, float(t), ep, distribution)
        mem = touched * model.expert_params / moe_tp * dtype_bytes / (gpu.hbm_bw_gbps * 1e9)
        comp = 2.0 * slots * model.expert_params / moe_tp / (peak_tflops * 1e12)
        out.append(max(mem, comp) * 1e3)
    return np.array(out)


def expert_curve_on_grid(model: ModelArch, tokens_moe: np.ndarray, ms_moe: np.ndarray, grid: np.ndarray,
                         gpu: GpuSpec, dtype_bytes: int, peak_tflops: float, moe_tp: int,
                         distribution: str, ep: int = 1) -> tuple[np.ndarray, str]:
    """The expert curve on the profile's token grid: linear in (log tokens, log ms) between the measured token
    counts, and never below its roofline floor (an interpolated point can fall below it where the routing's
    touched experts jump between two measured counts, as AIConfigurator's power law does when the T k slots
    first outnumber the experts); (ms, the lifted points as text, '' when none)."""
    interp = interp_loglog_curve(tokens_moe, ms_moe, grid)
    floor = expert_floor_ms(model, grid, gpu, dtype_bytes, peak_tflops, moe_tp, distribution, ep)
    lifted = ", ".join(f"{int(t)}: {f / i - 1:+.1%}" for t, i, f in zip(grid, interp, floor) if f > i)
    return np.maximum(interp, floor), lifted


def data_checks(model: ModelArch, tokens: np.ndarray, ms: np.ndarray, gpu: GpuSpec, dtype_bytes: int,
                peak_tflops: float, moe_tp: int, slower: tuple[np.ndarray, np.ndarray] | None,
                distribution: str = "balanced", ep: int = 1) -> dict:
    """Each measured point against its roofline floor (the weights of the experts the tokens touch under the
    table's routing `distribution` over HBM bandwidth, their FLOPs over the dtype's peak), and against the same
    tokens at moe_tp / 2 (`slower`)."""
    floor = expert_floor_ms(model, tokens, gpu, dtype_bytes, peak_tflops, moe_tp, distribution, ep)
    ratio = ms / floor
    out = {"roofline_ratio_min": float(ratio.min()), "roofline_ratio_max": float(ratio.max()),
           "slow_points": [f"{int(t)}: {r:.1f}x" for t, r in zip(tokens, ratio) if r > SLOW_BOUND]}
    if slower is not None:
        st, sms = slower
        common = np.intersect1d(tokens, st)
        here = dict(zip(tokens.tolist(), ms.tolist()))
        half = dict(zip(st.tolist(), sms.tolist()))
        out["tp_not_faster"] = [f"{int(t)}: {here[t]:.4g} ms vs {half[t]:.4g} ms at moe_tp {moe_tp // 2}"
                                for t in common if here[t] >= half[t]]
    if not (ratio >= 1 - 1e-9).all():
        bad = [f"{int(t)}: {r:.2f}x" for t, r in zip(tokens, ratio) if r < 1 - 1e-9]
        raise DataError(f"MoE table points faster than their roofline floor on {gpu.name}: {', '.join(bad)}")
    return out


def ep_vs_tp_sharded(tokens: np.ndarray, ms: np.ndarray, twin: tuple[np.ndarray, np.ndarray]) -> str:
    """The EP curve against its TP-sharded twin (same GPUs, moe_tp = tp, ep 1) at the token counts both have, as
    text for [derivation] moe_checks: the ratio range and the points where EP is not faster."""
    tt, tms = twin
    here, other = dict(zip(tokens.tolist(), ms.tolist())), dict(zip(tt.tolist(), tms.tolist()))
    common = sorted(set(here) & set(other))
    if not common:
        return "; no token counts in common with the TP-sharded layout"
    r = [here[t] / other[t] for t in common]
    slower = [f"{int(t)}: {q:.2f}x" for t, q in zip(common, r) if q >= 1]
    return (f"; EP / TP-sharded layout (moe_tp = tp, ep 1) at {len(common)} token counts: {min(r):.2f}x..{max(r):.2f}x"
            + (f", not faster at {', '.join(slower)}" if slower else ", faster at every one"))


def _fmt(x: float) -> str:
    return f"{x:.5g}"


def moe_dir(root: Path, gpu: GpuSpec, engine: str, model: str, weight_dtype: str, kv_dtype: str, tp: int,
            distribution: str = "balanced", ep: int = 1) -> Path:
    name = profile_name(model, weight_dtype, kv_dtype) + ("" if distribution == "balanced" else f"-{distribution}")
    return root / gpu.name / engine / name / (f"tp{tp}" if ep == 1 else f"tp{tp}-ep{ep}")


def build_moe_profile(model: ModelArch, gpu: GpuSpec, tp: int, out: str | Path, engine: str = "vllm",
                      weight_dtype: str = "bf16", kv_dtype: str = "bf16", distribution: str = "balanced",
                      compact: bool = False, aic: AicData | None = None, ep: int = 1):
    """Write the profile of MoE `model` on `gpu` at TP `tp` to `out`; return the loaded `Profile`. ep = 1:
    experts sharded by TP (moe_tp = tp); ep = tp: expert parallelism across the TP group at data-parallel
    attention 1 (moe_tp = 1, num_experts / ep whole experts per rank, sim/core/ep.py), the expert curve the
    table's (moe_tp 1, ep) rows, whose power-law rows time the busiest rank (sim/latency/moe_routing.py)."""
    from sim.latency.profiled import Profile
    from sim.profiling.profile_io import check_staged

    m = model.moe
    if m is None:
        raise DataError(f"--model {model.name}: not a mixture-of-experts model (no [moe]); build it with "
                        f"ppsim profile build")
    if m.dense_layers or m.num_shared_experts:
        raise DataError(f"--model {model.name}: dense layers and shared experts are not in MoE profiles yet "
                        f"(every layer must be an MoE layer of routed experts only)")
    if gpu.name not in SYSTEMS:
        raise DataError(f"--gpu {gpu.name!r}: no AIConfigurator system for it; allowed: {', '.join(SYSTEMS)}")
    model.check_tp(tp)
    if m.expert_intermediate_size % tp:
        raise DataError(f"--tp {tp}: does not divide the expert FFN ({m.expert_intermediate_size}) of {model.name}")
    if ep not in (1, tp) or m.num_experts % ep:
        raise DataError(f"--ep {ep}: allowed: 1 or the TP degree ({tp}), dividing the {m.num_experts} experts of "
                        f"{model.name} (sim/core/ep.py)")
    moe_tp = tp if ep == 1 else 1
    aic = aic or AicData(SYSTEMS[gpu.name], engine)
    table = AicMoe(aic)
    tokens_moe, ms_moe = table.curve(model, weight_dtype, moe_tp, ep, distribution)
    slower = None
    if tp > 1 and ep == 1:
        try:
            slower = table.curve(model, weight_dtype, tp // 2, 1, distribution)
        except DataError:
            slower = None
    # EP against its TP-sharded twin (same GPUs, moe_tp = tp, ep 1) at the token counts both have
    vs_tp = ep_vs_tp_sharded(tokens_moe, ms_moe, table.curve(model, weight_dtype, tp, 1, distribution)) \
        if ep > 1 else ""
    # the dense parts: the AIC builder on the model's attention shape (its MLP columns are replaced below)
    proxy = dataclasses.replace(model, moe=None, intermediate_size=m.expert_intermediate_size)
    with tempfile.TemporaryDirectory(prefix="pipesim-moe-") as tmp:
        base = Path(tmp) / "dense"
        build_aic_profile(proxy, gpu, tp, base, engine=engine, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                          compact=False, aic=aic)
        dense = pd.read_csv(base / "layer_nonattn.csv", index_col="num_tokens")
        attention_csv = (base / "attention.csv").read_text()
        comm_csv = (base / "comm.csv").read_text()
        meta = tomllib.loads((base / "meta.toml").read_text())
    grid = dense.index.to_numpy(np.int64)
    rgrid, router_ms, router_how = aic.gemm_ms(m.num_experts, model.hidden_size, "bf16")
    router = pd.Series(router_ms, index=rgrid.astype(np.int64)).reindex(grid)
    layer = pd.DataFrame(index=dense.index)
    layer["qkv_proj"], layer["o_proj"] = dense["qkv_proj"], dense["o_proj"]
    layer["router"] = router.to_numpy(float)
    dtype_bytes = 1 if weight_dtype == "fp8" else 2
    peak = gpu.peak_tflops(weight_dtype)
    layer["moe_experts"], lifted = expert_curve_on_grid(model, tokens_moe, ms_moe, grid, gpu, dtype_bytes, peak,
                                                        moe_tp, distribution, ep)
    for col in ("rope", "rmsnorm_x2", "residual_add"):
        layer[col] = dense[col]
    layer["linear_ms"] = layer[["qkv_proj", "o_proj", "router", "moe_experts"]].sum(axis=1)
    layer["layer_nonattn_ms"] = layer[["linear_ms", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    if layer.isna().any().any():
        raise DataError(f"{aic.rel('gemm', 'gemm_perf.parquet')}: router GEMM rows missing on the token grid")
    checks = data_checks(model, tokens_moe, ms_moe, gpu, dtype_bytes, peak, moe_tp, slower, distribution, ep)
    md, ks = MOE_KERNELS[engine][weight_dtype]
    moe_path = table.rel
    version = package_version()
    attn_shapes = {op: s for op, s in gemm_shapes(proxy.kernel_arch, tp).items() if op in ("qkv_proj", "o_proj")}
    suspects = fp8_slower_points(aic, attn_shapes) if weight_dtype == "fp8" else []
    beyond = tokens_moe[tokens_moe > grid[-1]]
    past = interp_loglog_curve(tokens_moe[tokens_moe <= grid[-1]], ms_moe[tokens_moe <= grid[-1]], beyond)
    pm, mm = meta["profile"], meta["model"]
    pm["data_source"] = (f"AIConfigurator measured kernels ({PACKAGE} {version}, {aic.system}, {engine} {aic.version}; "
                         f"weights {weight_dtype}, KV cache {kv_dtype}); MoE experts from {ks} ({distribution} "
                         f"routing{'' if ep == 1 else f', expert parallel ep {ep}'}); attention fitted")
    pm["moe_kernel"], pm["moe_dtype"], pm["moe_distribution"] = ks, md, distribution
    pm["sources"] = list(dict.fromkeys([moe_path, *pm["sources"]]))
    mm["intermediate_size"] = m.expert_intermediate_size
    mm["layer_params"] = model.layer_params
    meta["moe"] = {"num_experts": m.num_experts, "top_k": m.top_k,
                   "expert_intermediate_size": m.expert_intermediate_size, "expert_params": model.expert_params,
                   "router_params": model.hidden_size * m.num_experts, "moe_tp": moe_tp, "ep": ep,
                   "layout": "experts sharded by TP (moe_tp = tp, ep = 1): one all-reduce after the layer"
                   if ep == 1 else EP_LAYOUT.format(ep=ep, local=m.num_experts // ep),
                   "distribution": distribution, "router_dtype": m.router_dtype}
    der = meta["derivation"]
    der["layer_nonattn"] = (
        f"qkv_proj, o_proj, rope, rmsnorm_x2, residual_add: {der['layer_nonattn'].split('; act, rope')[0]} "
        f"(the MLP GEMMs of that derivation are not used); router: the BF16 GEMM table at "
        f"{m.num_experts}x{model.hidden_size} ({router_how}); moe_experts: {moe_path} {ks} {md} rows for hidden "
        f"{model.hidden_size}, inter {m.expert_intermediate_size}, top-{m.top_k} of {m.num_experts}, moe_tp {moe_tp}, "
        f"ep {ep}, {distribution} (median per num_tokens over {len(tokens_moe)} token counts "
        f"{int(tokens_moe[0])}..{int(tokens_moe[-1])}), linear in (log tokens, log ms) between them; the table's "
        f"points past the grid vs the log-log line of the last segment: "
        + (", ".join(f"{int(t)}: {p / v - 1:+.1%}" for t, p, v in
                     zip(beyond, past, ms_moe[tokens_moe > grid[-1]])) or "none")
        + (f"; interpolated points below their roofline floor, lifted to it: {lifted}" if lifted else ""))
    der["moe_checks"] = (f"expert kernel / roofline floor (touched experts' weights / HBM, their FLOPs / dense "
                         f"{weight_dtype.upper()} peak): {checks['roofline_ratio_min']:.2f}x..{checks['roofline_ratio_max']:.2f}x"
                         + (f"; over {SLOW_BOUND:g}x: {', '.join(checks['slow_points'])}" if checks["slow_points"] else "")
                         + ("" if slower is None else
                            ("; not faster than at moe_tp " + str(tp // 2) + ": " + ", ".join(checks["tp_not_faster"])
                             if checks["tp_not_faster"] else f"; faster than moe_tp {tp // 2} at every token count"))
                         + vs_tp)
    der["dtypes"] = der["dtypes"] + f"; experts {md} ({ks}), router BF16"
    if weight_dtype == "fp8":
        der["suspect_rows"] = (f"FP8 GEMM slower than its BF16 twin at {len(suspects)} (op, tokens) points of the "
                               f"attention projections" + (f" ({', '.join(suspects[:6])}{', ...' if len(suspects) > 6 else ''})"
                                                          if suspects else "") + "; used as measured")
    fe = meta["fit_errors"]
    fe["gemm_interpolated_ops"] = [op for op in fe["gemm_interpolated_ops"] if op in ("qkv_proj", "o_proj")]
    fe["gemm_measured_ops"] = [op for op in fe["gemm_measured_ops"] if op in ("qkv_proj", "o_proj")]
    fe["moe_roofline_ratio_min"] = checks["roofline_ratio_min"]
    if compact:
        der["columns"] = "per-op columns omitted to keep the shipped library small; profiles/build_moe.py writes them"
    fits = meta.pop("fit", [])
    text = "# Generated by profiles/build_moe.py (sim/profiling/moe.py); do not edit by hand.\n" + tomlio.dumps(meta)
    for rec in fits:
        text += "\n[[fit]]\n" + tomlio.dumps(rec)
    cols = COMPACT_COLS if compact else LAYER_COLS
    lines = [",".join(["num_tokens"] + cols)]
    lines += [",".join([str(int(n))] + [_fmt(row[c]) for c in cols]) for n, row in layer.iterrows()]
    out = Path(out)
    with fsio.StagedFolder(out) as staged:
        fsio.write_text(staged.path / "layer_nonattn.csv", "\n".join(lines) + "\n")
        fsio.write_text(staged.path / "attention.csv", attention_csv)
        fsio.write_text(staged.path / "comm.csv", comm_csv)
        fsio.write_text(staged.path / "meta.toml", text)
        check_staged(staged)
        staged.commit()
    return Profile.load(out)


def a100_moe_table() -> tuple[pd.DataFrame, str]:
    """(rows, path inside the package) of the A100's MoE table (`A100_MOE_TABLE`)."""
    from sim.profiling.aic import package_root

    system, engine, version, _, _ = A100_MOE_TABLE
    rel = f"systems/data/{system}/moe/{engine}/{version}/moe_perf.parquet"
    path = package_root() / rel
    if not path.is_file():
        raise DataError(f"{path}: AIConfigurator table missing ({PACKAGE} {package_version()})")
    return pd.read_parquet(path), f"{MODULE}/{rel}"


def frontier_curve(tp: int, path: Path = FRONTIER_CSV) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, ms) of Frontier's A100 Mixtral-8x7B MoE layer at TP `tp` (gating + shuffling + grouped GEMM)."""
    if not path.is_file():
        raise DataError(f"{path}: missing; python profiles/derive_frontier_moe.py FILE writes it")
    df = pd.read_csv(path, comment="#")
    rows = df[df["tp"] == tp].sort_values("num_tokens")
    if rows.empty:
        raise DataError(f"{path}: no rows at tp {tp}; present: {', '.join(map(str, sorted(df['tp'].unique())))}")
    return rows["num_tokens"].to_numpy(np.int64), rows["moe_ms"].to_numpy(float)


def build_moe_profile_a100(model: ModelArch, gpu: GpuSpec, tp: int, out: str | Path,
                           distribution: str = "balanced", compact: bool = False):
    """Write the BF16 profile of MoE `model` on an A100 at TP `tp` (experts sharded by TP) to `out`: the dense
    parts from Vidur's A100 data, the experts from `A100_MOE_TABLE` or, for `FRONTIER_USED`, Frontier's table
    (module docstring); return the loaded `Profile`."""
    from sim.latency.hardware import load_interconnect
    from sim.latency.profiled import Profile
    from sim.profiling.build import build_profile
    from sim.profiling.kernels import KernelModel
    from sim.profiling.profile_io import check_staged

    m = model.moe
    if m is None:
        raise DataError(f"--model {model.name}: not a mixture-of-experts model (no [moe])")
    if m.dense_layers or m.num_shared_experts:
        raise DataError(f"--model {model.name}: dense layers and shared experts are not in MoE profiles yet "
                        f"(every layer must be an MoE layer of routed experts only)")
    if gpu.name not in A100_GPUS:
        raise DataError(f"--gpu {gpu.name!r}: the A100 MoE builder covers {', '.join(A100_GPUS)}")
    model.check_tp(tp)
    if m.expert_intermediate_size % tp:
        raise DataError(f"--tp {tp}: does not divide the expert FFN ({m.expert_intermediate_size}) of {model.name}")
    system, engine, version, ks, md = A100_MOE_TABLE
    df, table_rel = a100_moe_table()
    if (model.name, tp) in FRONTIER_USED and distribution == "balanced":
        tokens_moe, ms_moe = frontier_curve(tp)
        moe_src = FRONTIER_CSV.relative_to(PROFILES.parent).as_posix()
        kernel = "frontier_moe_gating+shuffling+grouped_gemm"
        why = ("Frontier's table, not AIConfigurator's, at this TP: the latter's rows are 2.7-2.8x the roofline "
               "floor from 1024 tokens (profiles/crosscheck_moe_a100.md)")
    else:
        tokens_moe, ms_moe = table_curve(df, table_rel, ks, md, model, tp, 1, distribution)
        moe_src, kernel = table_rel, ks
        why = (f"AIConfigurator's {engine} {version} rows of the Triton fused MoE kernel (its vLLM 0.14 A100 "
               f"table has power-law rows only; profiles/crosscheck_moe_a100.md)")
    slower = None
    if tp > 1:
        try:
            slower = table_curve(df, table_rel, ks, md, model, tp // 2, 1, distribution)
        except DataError:
            slower = None
    proxy = dataclasses.replace(model, moe=None, intermediate_size=m.expert_intermediate_size)
    ic = load_interconnect(gpu.default_interconnect)
    with tempfile.TemporaryDirectory(prefix="pipesim-moe-") as tmp:
        base = Path(tmp) / "dense"
        build_profile(proxy, gpu, ic, tp, base, compact=False)
        dense = pd.read_csv(base / "layer_nonattn.csv", index_col="num_tokens")
        attention_csv = (base / "attention.csv").read_text()
        meta = tomllib.loads((base / "meta.toml").read_text())
    grid = dense.index.to_numpy(np.int64)
    km = KernelModel.load(gpu.kernel_data)
    if not np.array_equal(km.grid.astype(np.int64), grid):
        raise DataError(f"profiles/kernels/{km.family}-gemm.csv: its token grid is not the built profile's")
    router_how = ("measured" if km.gemm_is_measured(m.num_experts, model.hidden_size)
                  else "predicted from neighbouring shapes")
    layer = pd.DataFrame(index=dense.index)
    layer["qkv_proj"], layer["o_proj"] = dense["qkv_proj"], dense["o_proj"]
    layer["router"] = km.gemm_ms(m.num_experts, model.hidden_size)
    layer["moe_experts"], lifted = expert_curve_on_grid(model, tokens_moe, ms_moe, grid, gpu, 2,
                                                        gpu.peak_tflops("bf16"), tp, distribution)
    for col in ("rope", "rmsnorm_x2", "residual_add"):
        layer[col] = dense[col]
    layer["linear_ms"] = layer[["qkv_proj", "o_proj", "router", "moe_experts"]].sum(axis=1)
    layer["layer_nonattn_ms"] = layer[["linear_ms", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    checks = data_checks(model, tokens_moe, ms_moe, gpu, 2, gpu.peak_tflops("bf16"), tp, slower, distribution)
    pm, mm, der, fe = meta["profile"], meta["model"], meta["derivation"], meta["fit_errors"]
    pm["data_source"] = pm["data_source"] + f"; MoE experts from {kernel} ({distribution} routing)"
    pm["moe_kernel"], pm["moe_dtype"], pm["moe_distribution"] = kernel, md, distribution
    pm["sources"] = list(dict.fromkeys([moe_src, table_rel, *pm["sources"]]))
    mm["intermediate_size"] = m.expert_intermediate_size
    mm["layer_params"] = model.layer_params
    meta["moe"] = {"num_experts": m.num_experts, "top_k": m.top_k,
                   "expert_intermediate_size": m.expert_intermediate_size, "expert_params": model.expert_params,
                   "router_params": model.hidden_size * m.num_experts, "moe_tp": tp, "ep": 1,
                   "layout": "experts sharded by TP (moe_tp = tp, ep = 1): one all-reduce after the layer",
                   "distribution": distribution, "router_dtype": m.router_dtype}
    beyond = tokens_moe[tokens_moe > grid[-1]]
    past = interp_loglog_curve(tokens_moe[tokens_moe <= grid[-1]], ms_moe[tokens_moe <= grid[-1]], beyond)
    der["layer_nonattn"] = (
        f"qkv_proj, o_proj, rope, rmsnorm_x2, residual_add: {der['layer_nonattn'].split('; act, rope')[0]} "
        f"(the MLP GEMMs of that derivation are not used); router: the {km.family} GEMM model at "
        f"{m.num_experts}x{model.hidden_size} ({router_how}); "
        f"moe_experts: {moe_src} ({kernel}, {md}, hidden {model.hidden_size}, inter {m.expert_intermediate_size}, "
        f"top-{m.top_k} of {m.num_experts}, moe_tp {tp}, ep 1, {distribution}; median per num_tokens over "
        f"{len(tokens_moe)} token counts {int(tokens_moe[0])}..{int(tokens_moe[-1])}), linear in (log tokens, "
        f"log ms) between them; {why}; the table's points past the grid vs the log-log line of the last "
        f"segment: " + (", ".join(f"{int(t)}: {p / v - 1:+.1%}" for t, p, v in
                                  zip(beyond, past, ms_moe[tokens_moe > grid[-1]])) or "none")
        + (f"; interpolated points below their roofline floor, lifted to it: {lifted}" if lifted else ""))
    der["moe_checks"] = (f"expert kernel / roofline floor (touched experts' weights / HBM, their FLOPs / dense "
                         f"BF16 peak): {checks['roofline_ratio_min']:.2f}x..{checks['roofline_ratio_max']:.2f}x"
                         + (f"; over {SLOW_BOUND:g}x: {', '.join(checks['slow_points'])}" if checks["slow_points"] else "")
                         + ("" if slower is None else
                            (f"; not faster than {ks} at moe_tp {tp // 2}: " + ", ".join(checks["tp_not_faster"])
                             if checks["tp_not_faster"] else f"; faster than {ks} at moe_tp {tp // 2} at every "
                             f"token count")))
    fe["gemm_measured_ops"] = [op for op in fe["gemm_measured_ops"] if op in ("qkv_proj", "o_proj")]
    fe["gemm_predicted_ops"] = [op for op in fe["gemm_predicted_ops"] if op in ("qkv_proj", "o_proj")]
    fe["moe_roofline_ratio_min"] = checks["roofline_ratio_min"]
    if compact:
        der["columns"] = "per-op columns omitted to keep the shipped library small; profiles/build_moe.py writes them"
    fits = meta.pop("fit", [])
    text = "# Generated by profiles/build_moe.py (sim/profiling/moe.py); do not edit by hand.\n" + tomlio.dumps(meta)
    for rec in fits:
        text += "\n[[fit]]\n" + tomlio.dumps(rec)
    cols = COMPACT_COLS if compact else LAYER_COLS
    lines = [",".join(["num_tokens"] + cols)]
    lines += [",".join([str(int(n))] + [_fmt(row[c]) for c in cols]) for n, row in layer.iterrows()]
    out = Path(out)
    with fsio.StagedFolder(out) as staged:
        fsio.write_text(staged.path / "layer_nonattn.csv", "\n".join(lines) + "\n")
        fsio.write_text(staged.path / "attention.csv", attention_csv)
        fsio.write_text(staged.path / "meta.toml", text)
        check_staged(staged)
        staged.commit()
    return Profile.load(out)
