"""Finding a latency profile for (model, GPU, TP, interconnect), building it on the fly when none is shipped.

Order of `resolve_profile`:

1. a shipped hand-built profile (`profiles/a100-pcie-40gb/...`, `profiles/a100-sxm-80gb-nvswitch/...`),
   whose measured/calibrated tables take precedence;
2. a shipped built profile (`profiles/built/<gpu>[-<ic>]/<model>/tp<T>/`, `ppsim profile build --all`);
3. a built profile in the cache, `$PIPESIM_CACHE/profiles/<gpu>[-<ic>]/<model>/tp<T>/` (default
   `~/.cache/pipesim`), built there on first use from the shipped kernel data (offline, about a second).

A GPU only AIConfigurator's database covers (`kernel_data = "aic"`: h200-sxm, b200-sxm) resolves to the
shipped AIC library's BF16 profile, `profiles/aic/<gpu>/vllm/<model>-bf16-kvbf16/tp<T>/`, else to one built
into the cache from the installed aiconfigurator-core (extra pipesim[aic]). The H100 keeps its Vidur-built
profile as the default (committed results stay as they are); its AIC profiles (BF16 and FP8) are chosen by
path (profiles/README.md says why and how the two sources differ).

`check_weights(model, gpu, tp, pp)` raises the one-line "weights need X GB per GPU, have Y" error
before a run would end up with an empty KV pool.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.core.errors import DataError
from sim.profiling.build import AIC_FAMILY, BUILT_DIR, build_profile, built_dir
from sim.latency.hardware import PROFILES, load_gpu, load_interconnect
from sim.profiling.specs import check_weights_fit, load_model, model_names

# Hand-built profile folders: (gpu, interconnect) -> folder under profiles/.
HAND_BUILT = {("a100-pcie-40gb", "pcie-p2p-disabled"): "a100-pcie-40gb",
              ("a100-sxm-80gb", "nvswitch"): "a100-sxm-80gb-nvswitch"}


def cache_root() -> Path:
    env = os.environ.get("PIPESIM_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "pipesim") / "profiles"


def resolve_profile(model: str, gpu: str, tp: int, interconnect: str | None) -> Path:
    """The profile directory for `model` on `gpu` at TP `tp` (interconnect None: the GPU's default)."""
    spec = load_gpu(gpu)
    if spec.kernel_data == AIC_FAMILY:
        return _resolve_aic(model, spec, tp, interconnect)
    ic = interconnect or spec.default_interconnect
    hand = HAND_BUILT.get((gpu, ic))
    if hand is not None:
        p = PROFILES / hand / model / f"tp{tp}"
        if (p / "meta.toml").is_file():
            return p
    shipped = built_dir(BUILT_DIR, spec, ic, model, tp)
    if (shipped / "meta.toml").is_file():
        return shipped
    if model not in model_names():
        raise DataError(f"model {model!r}: no profile and no architecture to build one; allowed: "
                        f"{', '.join(model_names())} (add profiles/models/{model}.toml)")
    arch = load_model(model)
    arch.check_tp(tp, where="tp")
    cached = built_dir(cache_root(), spec, ic, model, tp)
    if not (cached / "meta.toml").is_file():
        build_profile(arch, spec, load_interconnect(ic), tp, cached, replace=False)
    return cached


def _resolve_aic(model: str, spec, tp: int, interconnect: str | None) -> Path:
    from sim.profiling.aic import AIC_DIR, aic_dir, build_aic_profile

    if interconnect and interconnect != spec.default_interconnect:
        raise DataError(f"interconnect {interconnect!r}: {spec.name} profiles come from AIConfigurator's tables, "
                        f"measured on one {spec.default_interconnect} node; allowed: {spec.default_interconnect}")
    shipped = aic_dir(AIC_DIR, spec, "vllm", model, "bf16", "bf16", tp)
    if (shipped / "meta.toml").is_file():
        return shipped
    if model not in model_names():
        raise DataError(f"model {model!r}: no profile and no architecture to build one; allowed: "
                        f"{', '.join(model_names())} (add profiles/models/{model}.toml)")
    arch = load_model(model)
    arch.check_tp(tp, where="tp")
    cached = aic_dir(cache_root() / "aic", spec, "vllm", model, "bf16", "bf16", tp)
    if not (cached / "meta.toml").is_file():
        build_aic_profile(arch, spec, tp, cached, replace=False)
    return cached


def check_weights(model: str, gpu: str, tp: int, pp: int) -> None:
    """One-line DataError when `model`'s weights do not fit `gpu` at TP x PP."""
    check_weights_fit(load_model(model), load_gpu(gpu), tp, pp)


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
