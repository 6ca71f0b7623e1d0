"""`ppsim profile build`: a latency profile for any dense model on a GPU + interconnect, from kernel data.

A built profile has today's format (profiles/FORMAT.md), so every command takes it:

- `layer_nonattn.csv`: the kernel model (`sim.profiling.kernels.KernelModel`) of the GPU's kernel-data
  family at the model's GEMM shapes for one TP shard, on the Vidur token grid, plus element-wise ops.
- `attention.csv`: the family's attention fit scaled to the shard's query / KV dims.
- `meta.toml`: shapes, the GPU's sibling-SKU scaling and lookup (for a100-pcie-40gb the calibrated values
  of profiles/fits.toml, as the hand-built profiles), overheads (the LM head from the GEMM model, the rest
  defaults), the interconnect's alpha-beta model, the GPU's memory, and provenance:
  `[profile] source = "built"`, `attention = "fitted" | "scaled"`, the kernel and data files used, and
  `[fit_errors]` (leave-one-model-out GEMM errors of the family, per GEMM and per layer sum of the four
  GEMMs, attention fit errors, which GEMM shapes were measured and which predicted), and `[ground_truth]`
  (structure and variance of the truth, FORMAT.md): every key of the calibrated hand-built Qwen2.5-32B
  A100 PCIe profile's section, copied as it is (assumed for other models and GPUs), except `sm_count`,
  which comes from the GPU TOML.

No comm.csv is written (alpha-beta only), so the built library stays small.

The files are written into a staging sibling of the profile folder and swapped in whole once
they load as a profile (`sim.core.fsio.StagedFolder`): a failed or interrupted build leaves the
folder as it was (or absent). Whether an existing folder may be replaced is decided by the caller
(`sim.cli.profile.profile_out`; `--all` rebuilds the shipped library in place of itself).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from sim.core.lazy import lazy

np = lazy("numpy")

from sim.core import fsio, tomlio
from sim.core.errors import DataError
from sim.profiling.kernels import GEMM_OPS, KernelModel, gemm_shapes
from sim.latency.hardware import (PROFILES, GpuSpec, Interconnect, comm_model, fits_file, load_gpu,
                                  load_interconnect)
from sim.profiling.specs import ModelArch, load_model, roofline_section

LAYER_COLS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act", "rope", "rmsnorm_x2", "residual_add",
              "linear_ms", "layer_nonattn_ms"]
DEFAULT_OVERHEAD = {"embedding_ms": 0.1, "sample_ms": 0.2, "broadcast_us": 30}
BUILT_DIR = PROFILES / "built"
TPS = (1, 2, 4, 8)
AIC_FAMILY = "aic"      # kernel_data of GPUs that only AIConfigurator's database covers (sim/profiling/aic.py)
# The calibrated profile whose [ground_truth] section every built profile carries (profiles/README.md).
GROUND_TRUTH_PROFILE = "a100-pcie-40gb/qwen2.5-32b/tp1/meta.toml"


def ground_truth_section(gpu: GpuSpec) -> dict:
    """[ground_truth] for a built profile: every key of the calibrated hand-built profile's section (copied,
    not listed here, so new keys carry over), `sm_count` from the GPU TOML, and where the values come from."""
    path = PROFILES / GROUND_TRUTH_PROFILE
    if not path.is_file():
        raise DataError(f"{path}: hand-built profile missing (python profiles/build_a100.py writes it)")
    gt = dict(tomllib.loads(path.read_text()).get("ground_truth", {}))
    if not gt:
        raise DataError(f"{path}: no [ground_truth] section to transfer")
    if gpu.sm_count:
        gt["sm_count"] = gpu.sm_count
    gt["source"] = (f"transferred from the calibrated Qwen2.5-32B A100 PCIe profile (profiles/{GROUND_TRUTH_PROFILE}; "
                    "assumed for other models/GPUs)"
                    + (f"; sm_count from profiles/gpus/{gpu.name}.toml" if gpu.sm_count else ""))
    return gt


def gpu_scaling(gpu: GpuSpec) -> tuple[dict, list[dict]]:
    """(values: s_mem, s_comp, lookup, cpu_ms, status, source; [[fit]] records) for a GPU."""
    sc = gpu.scaling
    if "calibration" in sc:
        fits = fits_file(sc["calibration"])
        fit = fits["fit"]
        vals = {"s_mem": fit.get("s_mem", {}).get("value", 1.25), "s_comp": fit.get("s_comp", {}).get("value", 1.10),
                "cpu_ms": fit.get("cpu_ms", {}).get("value", 2.0), "lookup": fits["lookup"].get("mode", "grid"),
                "status": str(sc.get("status", "")), "source": f"profiles/{sc['calibration']}"}
        records = [{**fit[p], "record": f"profiles/{sc['calibration']}"} for p in ("s_mem", "s_comp", "cpu_ms")
                   if p in fit]
        return vals, records
    vals = {k: sc.get(k, d) for k, d in (("s_mem", 1.0), ("s_comp", 1.0), ("cpu_ms", 2.0), ("lookup", "grid"))}
    vals["status"] = str(sc.get("status", "default"))
    vals["source"] = f"profiles/gpus/{gpu.name}.toml"
    records = [{"param": p, "value": vals[p], "status": vals["status"], "target": "", "achieved": "",
                "residual": ""} for p in ("s_mem", "s_comp", "cpu_ms")]
    return vals, records


def _fmt(x: float) -> str:
    return f"{x:.5g}"


COMPACT_COLS = ["linear_ms", "layer_nonattn_ms"]


def render_layer_csv(layer, compact: bool = False) -> str:
    cols = COMPACT_COLS if compact else LAYER_COLS
    lines = [",".join(["num_tokens"] + cols)]
    for n, row in layer.iterrows():
        lines.append(",".join([str(int(n))] + [_fmt(row[c]) for c in cols]))
    return "\n".join(lines) + "\n"


def render_attention_csv(pre: dict, dec: dict) -> str:
    return "\n".join(["component,a_ms,b_c,b_c2,b_cp,b_ctx",
                      ",".join(["prefill"] + [_fmt(pre[k]) for k in ("a_ms", "b_c", "b_c2", "b_cp")] + [""]),
                      ",".join(["decode", _fmt(dec["a_ms"]), "", "", "", _fmt(dec["b_ctx"])])]) + "\n"


def _physics_or_refuse(folder: Path, model: ModelArch, tp: int) -> None:
    """A one-line DataError when the profile in `folder` breaks the hardware's physics (`profile
    check`): e.g. a multi-head (non-GQA) model, whose attention the grouped-query kernel fits,
    scaled by query heads, put at 150-290% of HBM bandwidth past 8k tokens."""
    from sim.latency.physics import check_profile
    from sim.latency.profiled import Profile

    prof = Profile.load(folder)
    if prof.bounds() is None:
        return
    rep = check_profile(prof)
    if rep.ok:
        return
    first = rep.problems[0].line("").strip() if rep.problems else "see ppsim profile check"
    mha = (f"; {model.name} has multi-head attention (num_kv_heads = num_q_heads = {model.num_q_heads}), which the "
           f"grouped-query attention fits do not cover" if model.num_kv_heads == model.num_q_heads else "")
    raise DataError(f"profile build {model.name} TP{tp}: the built profile fails the physics check ({first}){mha}; "
                    f"not written")


def build_profile(model: ModelArch, gpu: GpuSpec, ic: Interconnect, tp: int, out: str | Path,
                  compact: bool = False, replace: bool = True, physics: bool = False):
    """Write a built profile to `out` and return the loaded `Profile`. `compact` (the shipped library)
    writes only the linear and total columns of layer_nonattn.csv; the timing is the same.
    `replace=False` (the profile cache): keep `out` if another process has written it meanwhile
    (the same inputs build the same profile), so concurrent builds never move a folder a reader uses.
    `physics` (`ppsim profile build`): a profile that fails `profile check` is refused, not written."""
    from sim.latency.profiled import Profile

    if model.moe is not None:
        raise DataError(f"--model {model.name}: a mixture-of-experts model; Vidur's data has no expert kernels: "
                        f"build it from AIConfigurator's MoE tables: ppsim profile build --data aic (sim/profiling/moe.py)")
    model.check_tp(tp)
    km = KernelModel.load(gpu.kernel_data)
    comm, comm_how, comm_records = comm_model(ic, km.family, tp, km.meta)
    scaling, scale_records = gpu_scaling(gpu)
    arch = model.kernel_arch
    layer = km.layer_table(arch, tp)
    pre, dec, att_status = km.attention(arch, tp)
    # LM head: one vocab x hidden GEMM on the sampled rows (few tokens: memory bound), full vocabulary
    # (the profile divides it by TP); the 1-token point of the GEMM model.
    lm_head_ms = float(km.gemm_ms(model.vocab_size, model.hidden_size)[0])
    shapes = gemm_shapes(arch, tp)
    measured = {op: km.gemm_is_measured(*shapes[op]) for op in GEMM_OPS}
    val = km.meta.get("validation", {})
    att_q = km.meta["attention"].get("quality", {})
    data_source = (f"Vidur measured kernels ({gpu.kernel_data} data"
                   + (f", scaled to {gpu.display}" if scaling["s_mem"] != 1.0 or scaling["s_comp"] != 1.0 else "")
                   + f"); attention {att_status}")
    sources = [f"profiles/kernels/{km.family}.toml", f"profiles/kernels/{km.family}-gemm.csv",
               f"profiles/gpus/{gpu.name}.toml", f"profiles/interconnects/{ic.name}.toml", model.source,
               f"profiles/{GROUND_TRUTH_PROFILE}"]
    sources += km.sources + list(km.meta["attention"].get("sources", []))
    meta = {
        "profile": {"gpu": gpu.display, "model": model.name, "tp": tp, "source": "built",
                    "data_source": data_source, "attention": att_status, "gpu_spec": gpu.name,
                    "interconnect": ic.name, "kernel_data": km.family,
                    "base_hardware": f"Vidur {km.family} kernel data",
                    "units": {"time": "ms", "size": "bytes", "bandwidth": "GB/s (1e9 B/s)"},
                    "sources": list(dict.fromkeys(sources))},
        "model": {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "num_q_heads": model.num_q_heads, "num_kv_heads": model.num_kv_heads,
                  "head_dim": model.head_dim, "vocab_size": model.vocab_size,
                  "intermediate_size": model.intermediate_size, "layer_params": model.layer_params,
                  "embedding_params": model.embedding_params, "dtype_bytes": model.dtype_bytes,
                  "gated_mlp": model.gated_mlp, "qkv_bias": model.qkv_bias,
                  "tied_embeddings": model.tied_embeddings,
                  **({"context_length_tokens": model.context_length_tokens} if model.context_length_tokens else {})},
        "lookup": {"mode": scaling["lookup"]},
        "scaling": {"s_mem": scaling["s_mem"], "s_comp": scaling["s_comp"], "mem_bound_tokens": 128,
                    "comp_bound_tokens": 1024, "status": scaling["status"], "source": scaling["source"]},
        "overhead": {"cpu_ms": scaling["cpu_ms"], "lm_head_ms": round(lm_head_ms, 4), **DEFAULT_OVERHEAD},
        "comm": {"model": "alpha-beta", "activation_bytes_per_token": 2 * model.hidden_size * model.dtype_bytes,
                 **comm},
        "memory": {"gpu_mem_gib": gpu.memory_gib, "m_init_gib": gpu.m_init_gib},
        "roofline": roofline_section(gpu, ic, km.family),
        "measured": measured_section(layer, km),
        "ground_truth": ground_truth_section(gpu),
        "derivation": {
            "layer_nonattn": (f"GEMMs from the {km.family} kernel model at (N, K) per op for TP{tp}: "
                              + ", ".join(f"{op} {shapes[op][0]}x{shapes[op][1]} "
                                          f"({'measured' if measured[op] else 'predicted from neighbouring shapes'})"
                                          for op in GEMM_OPS)
                              + "; act, rope, 2 x rmsnorm, residual add by bytes moved"),
            "attention": (f"{att_status}: {km.meta['attention'].get('method', '')}; scaled to "
                          f"{model.num_q_heads // tp} q / {max(1, model.num_kv_heads // tp)} kv heads x "
                          f"{model.head_dim} per GPU"),
            "lm_head": f"lm_head_ms = GEMM model at {model.vocab_size}x{model.hidden_size}, 1 token (memory bound)",
            "overhead": "embedding_ms, sample_ms, broadcast_us: defaults, not fitted",
            "comm": comm_how,
            "scaling": f"{scaling['status']} ({scaling['source']})",
        },
        "fit_errors": {"gemm_loo_median_rel_err": val.get("loo_median_rel_err", float("nan")),
                       "gemm_loo_p90_rel_err": val.get("loo_p90_rel_err", float("nan")),
                       "gemm_layer_loo_median_rel_err": val.get("layer_median_rel_err", float("nan")),
                       "gemm_layer_loo_p90_rel_err": val.get("layer_p90_rel_err", float("nan")),
                       "gemm_measured_ops": [op for op in GEMM_OPS if measured[op]],
                       "gemm_predicted_ops": [op for op in GEMM_OPS if not measured[op]],
                       **{f"attention_{c}_median_rel_err": q.get("median_rel_err", 0.0) for c, q in att_q.items()},
                       **{f"attention_{c}_p90_rel_err": q.get("p90_rel_err", 0.0) for c, q in att_q.items()}},
    }
    if compact:
        meta["derivation"]["columns"] = ("per-op columns omitted to keep the shipped library small; "
                                         "ppsim profile build --out DIR writes them")
    text = "# Generated by ppsim profile build; do not edit by hand.\n" + tomlio.dumps(meta)
    for rec in scale_records + comm_records:
        # Calibrated values point at their record (target, achieved, residual, method live there).
        fields = ("param", "value", "status", "record", "residual") if "record" in rec else \
            ("param", "value", "status", "target", "achieved", "residual")
        keep = {k: rec[k] for k in fields if k in rec}
        text += "\n[[fit]]\n" + tomlio.dumps(keep)
    # The profile is written into a staging sibling, loaded there (a profile that does not load is
    # never swapped in) and swapped in whole: a failed or interrupted build leaves `out` as it was,
    # and a replaced profile keeps no file of the old one (no stale comm.csv).
    from sim.profiling.profile_io import check_staged

    out = Path(out)
    with fsio.StagedFolder(out) as staged:
        fsio.write_text(staged.path / "layer_nonattn.csv", render_layer_csv(layer, compact))
        fsio.write_text(staged.path / "attention.csv", render_attention_csv(pre, dec))
        fsio.write_text(staged.path / "meta.toml", text)
        check_staged(staged)
        if physics:
            _physics_or_refuse(staged.path, model, tp)
        if replace:
            staged.commit()
        else:
            staged.commit_if_absent("meta.toml")
    return Profile.load(out)


BEYOND = ("past each range the model follows the hardware: layer_nonattn linear in tokens at the least-squares "
          "rate of the top half of the grid (never negative), attention at the fitted FLOP (prefill) and KV-byte "
          "(decode) rates, communication linear in bytes; every part at least its roofline floor ([roofline], "
          "profiles/FORMAT.md)")


def measured_section(layer, km: KernelModel) -> dict:
    """`[measured]`: the ranges the tables and fits cover (the grid, the family's attention points)."""
    grid = [int(x) for x in layer.index]
    out = {"tokens": [grid[0], grid[-1]], **km.meta["attention"].get("measured", {})}
    out["source"] = (f"tokens: the {km.family} GEMM grid (profiles/kernels/{km.family}-gemm.csv); attention: the points "
                     f"of the {km.family} attention fit (profiles/kernels/{km.family}.toml [attention])")
    out["beyond"] = BEYOND
    return out


def resolve_model(name: str | None, config: str | None) -> ModelArch:
    from sim.profiling.specs import model_from_hf_config

    if (name is None) == (config is None):
        raise DataError("profile build: give exactly one of --model NAME or --model-config PATH")
    return load_model(name) if name else model_from_hf_config(config)


def built_dir(root: Path, gpu: GpuSpec, ic_name: str, model: str, tp: int) -> Path:
    """profiles/built/<gpu>[-<ic>]/<model>/tp<T>: the interconnect is named only when not the GPU's default."""
    gdir = gpu.name if ic_name == gpu.default_interconnect else f"{gpu.name}-{ic_name}"
    return root / gdir / model / f"tp{tp}"


def build_all(root: Path = BUILT_DIR, progress: bool = True) -> list[Path]:
    """Every shipped model x GPU (its default interconnect) x TP in {1,2,4,8} that is allowed and fits
    on at most 8 GPUs."""
    from sim.latency.hardware import gpu_names
    from sim.profiling.specs import allowed_tps, fits_somewhere, model_names

    jobs = []
    for g in gpu_names():
        gpu = load_gpu(g)
        if gpu.kernel_data == AIC_FAMILY:   # AIConfigurator-only GPUs: profiles/build_aic.py builds their library
            continue
        for m in model_names():
            model = load_model(m)
            if model.moe is not None:     # MoE models: profiles/build_moe.py builds their profiles
                continue
            for tp in allowed_tps(model, TPS):
                if fits_somewhere(model, gpu, tp):
                    jobs.append((gpu, model, tp))
    written = []
    it = jobs
    if progress:
        from tqdm import tqdm

        it = tqdm(jobs, desc="profile build --all", unit="profile")
    for gpu, model, tp in it:
        ic = load_interconnect(gpu.default_interconnect)
        out = built_dir(root, gpu, ic.name, model.name, tp)
        build_profile(model, gpu, ic, tp, out, compact=True)
        written.append(out)
    return written


def model_id(model: ModelArch) -> str:
    return model.name
