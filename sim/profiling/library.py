"""Finding a latency profile for (model, GPU, TP, interconnect), building it on the fly when none is shipped.

Two kernel-data sources build profiles (`KERNEL_DATA`): Vidur's 2024 measurements ("vidur": the hand-built
and `profiles/built/` profiles) and AIConfigurator's database ("aic": `profiles/aic/`, vLLM 0.24's kernels).
`choose_profile` picks one for a run or plan by GPU name, in this order:

1. an explicit `kernel_data` ("vidur" or "aic", e.g. `ppsim plan --kernel-data`) wins; a source that cannot
   serve the request is a one-line error, never a silent switch;
2. a GPU only AIConfigurator covers (`kernel_data = "aic"` in its spec: h200-sxm, b200-sxm) takes AIC;
3. otherwise the engine's era (`ENGINE_KERNEL_DATA`): the current engines (vllm-v1, sglang 0.5) take the AIC
   profile where the shipped AIC library has the GPU, model, TP and dtypes, the 2024 engines (fastpp, the
   paper's system; vllm-v0 0.6.3) and no engine at all take Vidur's. A current engine on a shape the AIC
   library lacks falls back to Vidur and says so (`Choice.note`); FP8 is AIC's alone (Vidur measured BF16).

Vidur's order: a shipped hand-built profile (`profiles/a100-pcie-40gb/...`, `profiles/a100-sxm-80gb-nvswitch/...`),
whose measured/calibrated tables take precedence; a shipped built profile (`profiles/built/<gpu>[-<ic>]/<model>/
tp<T>/`, `ppsim profile build --all`); a built profile in the cache, `$PIPESIM_CACHE/profiles/<gpu>[-<ic>]/<model>/
tp<T>/` (default `~/.cache/pipesim`), built there on first use from the shipped kernel data (offline, about a
second). AIC's: the shipped library, `profiles/aic/<gpu>/vllm/<model>-<w>-kv<kv>/tp<T>/`; on an AIC-only GPU
also one built into the cache from the installed aiconfigurator-core (extra pipesim[aic]). On a GPU both sources
cover, AIC comes from the shipped library only, so that a result does not depend on whether the package is
installed. profiles/README.md ("Which source by default") says why and how far the two sources differ.

`check_weights(model, gpu, tp, pp)` raises the one-line "weights need X GB per GPU, have Y" error
before a run would end up with an empty KV pool.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sim.core.errors import ConfigError, DataError
from sim.profiling.aic import AIC_DIR, SYSTEMS, aic_dir, build_aic_profile, profile_name
from sim.profiling.build import AIC_FAMILY, BUILT_DIR, build_profile, built_dir
from sim.latency.hardware import PROFILES, load_gpu, load_interconnect
from sim.profiling.specs import check_weights_fit, load_model, model_names

# Hand-built profile folders: (gpu, interconnect) -> folder under profiles/.
HAND_BUILT = {("a100-pcie-40gb", "pcie-p2p-disabled"): "a100-pcie-40gb",
              ("a100-sxm-80gb", "nvswitch"): "a100-sxm-80gb-nvswitch"}


def cache_root() -> Path:
    env = os.environ.get("PIPESIM_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "pipesim") / "profiles"


# The kernel-data sources (`kernel_data`): Vidur's 2024 measurements and AIConfigurator's database.
KERNEL_DATA = ("vidur", "aic")
DTYPES = ("bf16", "fp8")
# The source each built-in engine takes by default where both cover the GPU: the era of its kernels. vllm-v1
# (0.10.1.1, 0.11.0, 0.15.1: sim/engine/schedulers/vllm_v1.py VERSIONS) and sglang (0.5.23: sglang.py) are
# 2025-2026 releases on the kernels AIConfigurator measured with vLLM 0.24 and SGLang 0.5.14 (FlashAttention-3
# on Hopper); fastpp (the FastPP artifact, a fork of SGLang 0.4.1 of 2024: fastpp.py) and vllm-v0 (0.6.3 of
# 2024: vllm_v0.py) ran on the 2024 PyTorch-era kernels Vidur measured. Every version of each falls in one era.
# An engine not named here (a plug-in) takes Vidur's, as every run did before AIC existed.
ENGINE_KERNEL_DATA = {"fastpp": "vidur", "vllm-v0": "vidur", "vllm-v1": "aic", "sglang": "aic"}


@dataclass(frozen=True)
class Choice:
    """A resolved profile: its folder, the source it was built from and, where the source is not the one
    the engine's era asks for (a fallback), why (else "")."""

    path: Path
    kernel_data: str  # "vidur" or "aic"
    note: str = ""


def default_kernel_data(engine: str | None) -> str:
    """The source a run of `engine` takes by default where both cover the GPU (None: no engine, Vidur's)."""
    return ENGINE_KERNEL_DATA.get(engine, "vidur") if engine else "vidur"


def resolve_profile(model: str, gpu: str, tp: int, interconnect: str | None, *, engine: str | None = None,
                    kernel_data: str = "") -> Path:
    """The profile directory for `model` on `gpu` at TP `tp` (interconnect None: the GPU's default), BF16
    (`choose_profile`'s path)."""
    return choose_profile(model, gpu, tp, interconnect, engine=engine, kernel_data=kernel_data).path


def choose_profile(model: str, gpu: str, tp: int, interconnect: str | None = None, *, engine: str | None = None,
                   kernel_data: str = "", weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                   where: str = "kernel_data") -> Choice:
    """The profile a run or plan by GPU name takes (module docstring: the order). `kernel_data` "" lets the
    GPU and the engine's era decide; `where` names the flag or field the override came from in errors."""
    if kernel_data not in ("", *KERNEL_DATA):
        raise ConfigError(f"{where} {kernel_data!r}: allowed: {', '.join(KERNEL_DATA)}")
    for name, val in (("weight dtype", weight_dtype), ("KV dtype", kv_dtype)):
        if val not in DTYPES:
            raise ConfigError(f"{name} {val!r}: allowed: {', '.join(DTYPES)}")
    spec = load_gpu(gpu)
    if spec.kernel_data == AIC_FAMILY:  # AIConfigurator is the only source of this GPU
        if kernel_data == "vidur":
            raise ConfigError(f"{where} 'vidur': Vidur measured no {spec.name}; allowed: aic")
        return Choice(_aic_path(model, spec, tp, interconnect, weight_dtype, kv_dtype, build=True), "aic")
    bf16 = weight_dtype == kv_dtype == "bf16"
    want = kernel_data or ("aic" if not bf16 else default_kernel_data(engine))
    if want == "vidur":
        if not bf16:
            raise ConfigError(f"{where} 'vidur': Vidur's kernel data is BF16 only, asked weights {weight_dtype}, "
                              f"KV cache {kv_dtype}; allowed: {where} aic")
        return Choice(_vidur_path(model, spec, tp, interconnect), "vidur")
    why = _aic_gap(model, spec, tp, interconnect, weight_dtype, kv_dtype)
    if not why:
        return Choice(_aic_path(model, spec, tp, interconnect, weight_dtype, kv_dtype, build=False), "aic")
    if kernel_data == "aic":  # asked for explicitly: no silent switch
        raise DataError(f"{where} 'aic': {why}; allowed: {where} vidur (BF16)")
    if not bf16:  # FP8, which Vidur lacks: nothing to fall back to
        raise DataError(f"weights {weight_dtype}, KV cache {kv_dtype}: only AIConfigurator's data has FP8, and {why}; "
                        f"allowed: BF16 weights and KV cache")
    note = ""
    if spec.name in SYSTEMS:  # AIC covers the GPU, not this shape: the user would expect its data
        note = f"{engine} takes AIConfigurator's kernel data by default, but {why}: Vidur's data instead"
    return Choice(_vidur_path(model, spec, tp, interconnect), "vidur", note)


def engine_profile(profile: str, engine: str, kernel_data: str = "", where: str = "--kernel-data") -> tuple[str, str]:
    """(profile, note): the profile a run of `engine` takes in place of `profile`, a Vidur profile found by GPU
    name (`profiles/built/<gpu>[-<ic>]/<model>/tp<T>`, the cache's twin, or a hand-built family's), chosen by
    `choose_profile` (BF16); `profile` itself, in the same spelling, where that choice is Vidur's or where
    `profile` is no library profile (a user's folder, an AIC one). `note`: a fallback's reason, else ""."""
    path = Path(profile) if Path(profile).is_absolute() else PROFILES.parent / profile
    found = _library_key(path)
    if found is None:
        if kernel_data:
            raise ConfigError(f"{where} {kernel_data!r}: {profile} is not a library profile found by GPU name; "
                              f"allowed: a GPU name (--gpu) with {where}")
        return profile, ""
    gpu, ic, model, tp = found
    if model not in model_names():  # a user's own model (plan --model-config): built from its config.json by
        # Vidur's cost model into the cache; no AIConfigurator twin can be built without a model file
        if kernel_data == "aic":
            raise ConfigError(f"{where} 'aic': model {model!r} has no model file to build an AIConfigurator "
                              f"profile from; allowed: vidur (its profiles are Vidur-built)")
        return profile, (f"{model}: its profiles are Vidur-built (from its config.json), not AIConfigurator's"
                         if default_kernel_data(engine) == "aic" else "")
    choice = choose_profile(model, gpu, tp, ic, engine=engine, kernel_data=kernel_data, where=where)
    if choice.kernel_data == "vidur":
        return profile, choice.note
    return (str(choice.path.relative_to(PROFILES.parent)) if choice.path.is_relative_to(PROFILES.parent)
            else str(choice.path)), choice.note


def _library_key(path: Path) -> tuple[str, str, str, int] | None:
    """(gpu, interconnect, model, tp) of a Vidur library profile folder, or None."""
    if len(path.parts) < 3 or not path.name.startswith("tp") or not path.name[2:].isdigit():
        return None
    tp, model, gdir, root = int(path.name[2:]), path.parent.name, path.parent.parent.name, path.parent.parent.parent
    for (gpu, ic), hand in HAND_BUILT.items():
        if root == PROFILES and gdir == hand:
            return gpu, ic, model, tp
    if root not in (BUILT_DIR, cache_root()):
        return None
    for name in sorted(_gpu_names(), key=len, reverse=True):  # longest first: a GPU name may prefix another
        if gdir == name or gdir.startswith(name + "-"):
            spec = load_gpu(name)
            return name, gdir[len(name) + 1:] or spec.default_interconnect, model, tp
    return None


def _gpu_names() -> list[str]:
    return [p.stem for p in (PROFILES / "gpus").glob("*.toml")]


def _aic_gap(model: str, spec, tp: int, interconnect: str | None, weight_dtype: str, kv_dtype: str) -> str:
    """Why the shipped AIC library cannot serve this shape on a GPU Vidur covers ("" when it can)."""
    if spec.name not in SYSTEMS:
        return f"AIConfigurator's library has no {spec.name} profiles (it has {', '.join(SYSTEMS)})"
    if interconnect and interconnect != spec.default_interconnect:
        return (f"AIConfigurator's {spec.name} tables were measured on one {spec.default_interconnect} node, "
                f"not {interconnect}")
    path = aic_dir(AIC_DIR, spec, "vllm", model, weight_dtype, kv_dtype, tp)
    if not (path / "meta.toml").is_file():  # (the model at no TP: one message for all, as a plan repeats it)
        at = f" TP{tp}" if path.parent.is_dir() else ""
        return (f"the AIConfigurator library has no {profile_name(model, weight_dtype, kv_dtype)}{at} profile "
                f"on {spec.name} (profiles/aic/index.csv lists them)")
    return ""


def _vidur_path(model: str, spec, tp: int, interconnect: str | None) -> Path:
    ic = interconnect or spec.default_interconnect
    hand = HAND_BUILT.get((spec.name, ic))
    if hand is not None:
        p = PROFILES / hand / model / f"tp{tp}"
        if (p / "meta.toml").is_file():
            return p
    shipped = built_dir(BUILT_DIR, spec, ic, model, tp)
    if (shipped / "meta.toml").is_file():
        return shipped
    arch = _arch(model, tp)
    cached = built_dir(cache_root(), spec, ic, model, tp)
    if not (cached / "meta.toml").is_file():
        build_profile(arch, spec, load_interconnect(ic), tp, cached, replace=False)
    return cached


def _aic_path(model: str, spec, tp: int, interconnect: str | None, weight_dtype: str, kv_dtype: str,
              build: bool) -> Path:
    if interconnect and interconnect != spec.default_interconnect:
        raise DataError(f"interconnect {interconnect!r}: {spec.name} profiles come from AIConfigurator's tables, "
                        f"measured on one {spec.default_interconnect} node; allowed: {spec.default_interconnect}")
    shipped = aic_dir(AIC_DIR, spec, "vllm", model, weight_dtype, kv_dtype, tp)
    if (shipped / "meta.toml").is_file() or not build:
        return shipped
    arch = _arch(model, tp)
    cached = aic_dir(cache_root() / "aic", spec, "vllm", model, weight_dtype, kv_dtype, tp)
    if not (cached / "meta.toml").is_file():
        build_aic_profile(arch, spec, tp, cached, weight_dtype=weight_dtype, kv_dtype=kv_dtype, replace=False)
    return cached


def _arch(model: str, tp: int):
    if model not in model_names():
        raise DataError(f"model {model!r}: no profile and no architecture to build one; allowed: "
                        f"{', '.join(model_names())} (add profiles/models/{model}.toml)")
    arch = load_model(model)
    arch.check_tp(tp, where="tp")
    return arch


def check_weights(model: str, gpu: str, tp: int, pp: int, ep: int = 1) -> None:
    """One-line DataError when `model`'s weights do not fit `gpu` at TP x PP (an MoE model: its experts over
    `ep` expert-parallel ranks)."""
    check_weights_fit(load_model(model), load_gpu(gpu), tp, pp, ep)


def is_moe(model: str) -> bool:
    """Whether `model` is a shipped model file with an `[moe]` table (its profiles are the MoE library's)."""
    return model in model_names() and load_model(model).moe is not None


def moe_profile(model: str, gpu: str, tp: int, ep: int = 1, distribution: str = "balanced") -> Path:
    """The shipped MoE profile (`profiles/moe/<gpu>/vllm/<model>-bf16-kvbf16[-<routing>]/tp<T>[-ep<E>]/`,
    profiles/build_moe.py) of `model` on `gpu` at TP `tp` and expert parallelism `ep` (1: experts sharded by
    TP; tp: sim/core/ep.py); a one-line DataError naming the layouts the library has for the GPU when absent
    (MoE profiles are AIConfigurator-built only: the Vidur builder refuses MoE)."""
    from sim.profiling.moe import MOE_DIR, moe_dir

    spec = load_gpu(gpu)
    path = moe_dir(MOE_DIR, spec, "vllm", model, "bf16", "bf16", tp, distribution, ep)
    if (path / "meta.toml").is_file():
        return path
    have = sorted((d.name for d in path.parent.glob("tp*") if (d / "meta.toml").is_file()),
                  key=lambda n: (int(n[2:].split("-")[0]), n))
    layout = f"TP{tp}" + (f" EP{ep}" if ep > 1 else "")
    raise DataError(f"no {layout} profile of {model} ({distribution} routing) on {spec.name} in the MoE library "
                    f"(profiles/moe/index.csv); it has: {', '.join(have) or 'none on this GPU'}")


def built_profile_lines(root: Path = BUILT_DIR, repo: Path = PROFILES.parent) -> list[str]:
    """One line per built <gpu>/<model> folder with its TP degrees, e.g. profiles/built/h100-sxm-80gb/
    llama-3.1-8b/tp{1,2,4,8} (attention scaled)."""
    groups: dict[Path, list[int]] = {}
    for meta in sorted(root.glob("*/*/tp*/meta.toml")):
        groups.setdefault(meta.parent.parent, []).append(int(meta.parent.name[2:]))
    lines = []
    for mdir, tps in sorted(groups.items()):
        rel = mdir.relative_to(repo) if mdir.is_relative_to(repo) else mdir
        scaled = "attention = \"scaled\"" in (mdir / f"tp{min(tps)}" / "meta.toml").read_text()
        lines.append(f"{rel}/tp{{{','.join(str(t) for t in sorted(tps))}}}" + (" (attention scaled)" if scaled else ""))
    return lines
