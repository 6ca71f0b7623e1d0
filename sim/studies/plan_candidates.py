"""The planner's candidates and their inputs (`ppsim plan`, sim/studies/plan.py on top): the model and its
profiles, the TP x PP x replica splits, the per-replica throughput bound that screens them, KV-pool refusals, the
deployment and cluster tables each candidate runs as, the `--set` overrides and the load a plan probes with.
The lowest of the planner's modules: it imports none of them."""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from sim.core.lazy import lazy
from sim.core import fsio, tomlio
from sim.core.config import REPO_ROOT
from sim.core.errors import ConfigError
from sim.latency.profiled import Profile, ProfiledLatencyModel, kv_capacity_tokens
from sim.core.slo import SLO
from sim.studies.sweep import size_key
from sim.workloads import build_workload_said, resolve_workload

np = lazy("numpy")

INTERCONNECTS = {"pcie": "a100-pcie-40gb", "nvlink": "a100-sxm-80gb-nvswitch"}
POLICIES = {
    "static-256": ({"name": "static"}, 256, None),
    "static-512": ({"name": "static"}, 512, None),
    "static-1024": ({"name": "static"}, 1024, None),
    "static-2048": ({"name": "static"}, 2048, None),
    "greedy": ({"name": "greedy"}, 128, None),
    "predictive": ({"name": "predictive"}, 128, None),
    "predictive+DS": ({"name": "predictive"}, 128, {"name": "delay-scheduling"}),
}
# What each other engine is planned with: its own knob, the step's token budget (SGLang's
# --chunked-prefill-size, vLLM's --max-num-batched-tokens), at the engine's default ("default": chunk 0, the
# engine sizes it: sim/engine/schedulers/sglang.py, vllm_v1.py `settings`) and two static values; vLLM V0 runs
# without chunked prefill (its budget is max(max_model_len, 2048): vllm_v0.py), so its default only. The paper's
# policies (greedy, predictive) run on them only when named in --policies, labelled "what-if:" (no such engine
# has them); predictive+DS needs FastPP's micro-batch rebalancer and never runs elsewhere.
ENGINE_DEFAULT = "default"
ENGINE_POLICIES = {"sglang": (ENGINE_DEFAULT, "static-512", "static-2048"),
                   "vllm-v1": (ENGINE_DEFAULT, "static-512", "static-2048"),
                   "vllm-v0": (ENGINE_DEFAULT,)}
WHAT_IF = "what-if:"
RATES = [0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]
KV_HEADROOM_WARN = 0.05
GOODPUT_REPLICATE = 0.7  # goodput mode: more seeds for candidates within 70% of the best first seed
STOP_FACTOR = 2.0  # rate mode: a run stops once a percentile certainly exceeds 2x its threshold
CONTEXT_TOKENS = 16384
MEM_FRACTION = 0.9
MAX_GPUS_EXHAUSTIVE = 256  # --gpus: every split is simulated (4096 GPUs: 336 runs of up to 4096 replicas, hours)
MAX_PRICE = 1e4  # $ per GPU-hour: a bound far above any list price, below which costs stay finite
# Every probe's Poisson arrivals span at least this long (more requests at a higher rate), so that a rate is
# held, not absorbed as a burst: 1,000 requests at 185 req/s span 5 s, which a 4-node deployment absorbed
# while serving 63 req/s (issue 39). With the late-arrival check (sim.core.slo.SLO.meets) and the saturation
# check (sim.studies.sweep.SustainedSLO) a rate counts only where it is sustained. --quick: QUICK_WINDOW_S.
PROBE_MIN_WINDOW_S = 60.0
QUICK_WINDOW_S = 30.0


# -- candidates ---------------------------------------------------------------------------

# hand-built profile families -> (GPU spec in profiles/gpus, interconnect); other families are GPU names
FAMILY_GPU = {"a100-pcie-40gb": ("a100-pcie-40gb", None), "a100-sxm-80gb-nvswitch": ("a100-sxm-80gb", "nvswitch")}


def family_dir(gpu: str) -> Path:
    p = Path(gpu)
    if not p.is_dir():
        p = REPO_ROOT / "profiles" / gpu
    if not p.is_dir():  # a GPU with built profiles only (profiles/built/<gpu>, `ppsim profile build --all`)
        p = REPO_ROOT / "profiles" / "built" / gpu
    from sim.latency.hardware import gpu_names

    # any GPU of profiles/gpus/: its profiles resolve through the library (shipped, AIC, or built on first use)
    if not p.is_dir() and gpu not in gpu_names():
        raise ConfigError(f"--gpu {gpu!r}: no such profile family; allowed: {', '.join(dict.fromkeys([*FAMILY_GPU, *gpu_names()]))} "
                          f"or a folder path")
    return p


@dataclass(frozen=True)
class PlanModel:
    """A model `--model` names by a profile folder, or `--model-config` by a Hugging Face config.json (a plain
    model id stays a str): its profiles come from the folder where it has the TP degree, else are built into
    the cache ($PIPESIM_CACHE/profiles, as `sim.profiling.library` caches them) from its architecture: the
    config.json's, or the shipped model file of the folder's model. Nothing is written into the checkout."""
    name: str                    # the model's name (the folder's [profile] model, the config's folder)
    folder: Path | None = None   # tp<T>/ profile folders, or one profile (its meta.toml)
    arch: object | None = None   # the ModelArch to build missing TP degrees from (None: none known)
    key: str = ""                # the cache folder of a config.json's builds: <name>-<hash of the config>
    gpu: str | None = None       # the folder's GPU (its meta.toml), which the plan runs on

    def __str__(self) -> str:
        return str(self.folder) if self.folder is not None else self.name


def _folder_profiles(folder: Path) -> list[Path]:
    """The profiles a folder holds: itself (a meta.toml: `ppsim profile build --out`) or its tp<T>/."""
    return [folder] if (folder / "meta.toml").is_file() else sorted(d for d in folder.glob("tp*")
                                                                      if (d / "meta.toml").is_file())


def plan_model(model: str | None, config: str | None = None) -> "str | PlanModel":
    """`--model` and `--model-config` resolved: a model id (a str, as before), or a `PlanModel` for a profile
    folder or a config.json. One-line errors name the flag and what is allowed."""
    import hashlib

    from sim.profiling.specs import load_model, model_from_hf_config

    arch, key = None, ""
    if config is not None:
        arch = model_from_hf_config(config)  # (one-line DataError: missing field, MoE, not JSON)
        key = f"{arch.name}-{hashlib.sha256(Path(config).read_bytes()).hexdigest()[:10]}"
    if model is None:
        if arch is None:
            return "qwen2.5-32b"
        return PlanModel(arch.name, arch=arch, key=key)
    if model in _library_models() or (Path(model).name == model and any(
            (REPO_ROOT / "profiles" / f / model).is_dir() for f in FAMILY_GPU)):
        if arch is not None:
            raise ConfigError(f"--model {model} with --model-config {config}: two architectures; allowed: one of "
                              f"them, or --model a profile folder with --model-config its model's config.json")
        return model
    folder = Path(model)
    if not folder.is_dir():
        hand = sorted(d.name for d in family_dir(INTERCONNECTS["pcie"]).iterdir() if d.is_dir())
        raise ConfigError(f"--model {model!r}: no such model or profile folder; allowed: {', '.join(hand)} (on the "
                          f"default GPU), {', '.join(m for m in _library_models() if m not in hand)} (with --gpu), "
                          f"a profile folder (ppsim profile build --out), or --model-config PATH (a config.json)")
    found = _folder_profiles(folder)
    if not found:
        raise ConfigError(f"--model {model}: no profile in the folder (no meta.toml, no tp<T>/meta.toml); "
                          f"allowed: a folder ppsim profile build --out wrote, or one of tp<T>/ such folders")
    meta = tomlio.read_toml(found[0] / "meta.toml", ConfigError)
    prof = meta.get("profile", {})
    gpu = str(prof.get("gpu_spec") or meta.get("roofline", {}).get("gpu_spec") or "")
    name = str(prof.get("model") or meta.get("model", {}).get("name") or folder.name)
    if not gpu:
        raise ConfigError(f"--model {model}: {_short(found[0] / 'meta.toml')} names no GPU ([profile] gpu_spec or "
                          f"[roofline] gpu_spec); allowed: a profile ppsim profile build wrote")
    if arch is None and name in _library_models():
        arch = load_model(name)
    return PlanModel(name, folder=folder.resolve(), arch=arch, key=key or name, gpu=gpu)


def model_gpus(model: str) -> list[str]:
    """The GPUs a model id has shipped profiles on: hand-built families, profiles/built/, profiles/aic/, profiles/moe/."""
    root = REPO_ROOT / "profiles"
    out = [f for f in FAMILY_GPU if (root / f / model).is_dir()]
    out += sorted(d.parent.name for d in (root / "built").glob(f"*/{model}") if d.is_dir())
    out += sorted(d.parents[1].name for d in (root / "aic").glob(f"*/vllm/{model}-bf16-kvbf16") if d.is_dir())
    out += sorted(d.parents[1].name for d in (root / "moe").glob(f"*/vllm/{model}-bf16-kvbf16") if d.is_dir())
    return list(dict.fromkeys(out))


def plan_gpu(args) -> str:
    """The GPU (profile family) a plan runs on, said in its header, and `args.gpu` set where the model fixes
    it. `--gpu` when given; a profile folder: its own GPU; otherwise the default, the paper's A100-40GB PCIe
    (`--interconnect`: its family), for both `--gpus` and `--max-gpus`, and only for a model with a
    hand-built profile there (profiles/a100-pcie-40gb/<model>/, calibrated on the paper's server): any other
    model needs --gpu, and the one-line error names the GPUs that have its profiles."""
    model = plan_model(args.model, getattr(args, "model_config", None))
    args.plan_model = model
    if isinstance(model, PlanModel) and model.folder is not None:
        if args.gpu and Path(args.gpu).name not in (model.gpu, Path(family_dir(model.gpu)).name):
            raise ConfigError(f"--model {args.model}: its profiles are for GPU {model.gpu}, not --gpu {args.gpu}; "
                              f"allowed: --gpu {model.gpu}, or no --gpu")
        if getattr(args, "interconnect", None) is not None:
            raise ConfigError(f"--interconnect {args.interconnect} with --model {args.model}: the folder's "
                              f"profiles fix the GPU ({model.gpu}); allowed: no --interconnect")
        args.gpu = args.gpu or model.gpu
        return args.gpu
    if args.gpu:
        return args.gpu
    ic = getattr(args, "interconnect", None) or "pcie"
    fams = [INTERCONNECTS[n] for n in (INTERCONNECTS if ic == "both" else [ic]) if n in INTERCONNECTS]
    if isinstance(model, str) and fams and all((REPO_ROOT / "profiles" / f / model).is_dir() for f in fams):
        if getattr(args, "max_gpus", None):
            args.gpu = fams[0]
        return " and ".join(fams)
    shipped = model_gpus(model) if isinstance(model, str) else []
    default = " and ".join(fams) or INTERCONNECTS["pcie"]
    hand = sorted(d.name for d in family_dir(INTERCONNECTS["pcie"]).iterdir() if d.is_dir())
    raise ConfigError(f"--model {model}: no hand-built profile on the default GPU {default} (the paper's server; "
                      f"it has {', '.join(hand)}); allowed: --gpu NAME"
                      + (f", e.g. one with shipped profiles of it: {', '.join(shipped)}" if shipped else
                         " (its profiles are built into the cache on first use)"))


def plan_model_of(args) -> "str | PlanModel":
    """`args`' model (`plan_model`), resolved once with its GPU (`plan_gpu`)."""
    if getattr(args, "plan_model", None) is None:
        plan_gpu(args)
    return args.plan_model


def moe_layouts(model: "str | PlanModel", tp: int) -> list[int]:
    """The expert-parallel sizes a plan tries at TP `tp` (sim/core/ep.py): 1 (experts sharded by TP) for every
    model; also ep = tp (whole experts over the TP group, data-parallel attention 1) for an MoE model when tp > 1
    divides its experts. (1 < ep < tp and ep > tp, which needs data-parallel attention, are not modelled.)"""
    moe = moe_of(model)
    return [1, tp] if moe is not None and tp > 1 and not moe.num_experts % tp else [1]


MOE_ROUTINGS = ("balanced", "power_law_1.2")  # the routings profiles/moe/ ships (profiles/build_moe.py ROUTINGS)


def check_routing(model: "str | PlanModel", routing: str) -> None:
    """`--moe-routing` other than balanced is for an MoE model only (one-line error)."""
    if routing not in MOE_ROUTINGS:
        raise ConfigError(f"--moe-routing {routing!r}: allowed: {', '.join(MOE_ROUTINGS)}")
    if routing != "balanced" and moe_of(model) is None:
        raise ConfigError(f"--moe-routing {routing}: {model} is not a mixture-of-experts model; allowed: balanced")


def moe_of(model: "str | PlanModel"):
    """The `[moe]` spec of the plan's model (None: dense, or no architecture known)."""
    if isinstance(model, PlanModel):
        return getattr(model.arch, "moe", None)
    from sim.profiling.library import is_moe, load_model

    return load_model(model).moe if is_moe(model) else None


def resolve_profile(family_path: Path, model: "str | PlanModel", tp: int, ep: int = 1,
                    routing: str = "balanced") -> tuple[Path | None, str]:
    """The one place a (GPU family, model, TP degree, expert-parallel size) finds its latency profile: the profile
    directory, or None and why not. (A resolver that builds missing profiles plugs in here.) An MoE model by
    name: the MoE library's at `routing` (sim.profiling.library.moe_profile; `--moe-routing`)."""
    if isinstance(model, PlanModel):
        return _resolve_own(family_path, model, tp, ep, routing)
    from sim.core.errors import PipeSimError
    from sim.profiling import library

    if library.is_moe(model):
        gpu, _ = FAMILY_GPU.get(family_path.name, (family_path.name, None))
        try:
            return library.moe_profile(model, gpu, tp, ep, routing), ""
        except PipeSimError as exc:
            return None, f"no profile: {' '.join(str(exc).split())}"
    d = family_path / model / f"tp{tp}"
    if (d / "meta.toml").is_file():
        return d, ""
    gpu, interconnect = FAMILY_GPU.get(family_path.name, (family_path.name, None))

    try:
        library.load_gpu(gpu)
    except PipeSimError:
        return None, f"no profile: {_short(d)} does not exist"
    try:  # built offline from the shipped kernel data (issue 11), cached under $PIPESIM_CACHE
        return library.resolve_profile(model, gpu, tp, interconnect), ""
    except PipeSimError as exc:
        return None, f"no profile: {' '.join(str(exc).split())}"


def _resolve_own(family_path: Path, model: PlanModel, tp: int, ep: int = 1,
                 routing: str = "balanced") -> tuple[Path | None, str]:
    """A `PlanModel`'s profile at TP `tp` (and expert-parallel size `ep`, its profile's [moe] ep): the folder's,
    else built into the cache from its architecture (`sim.profiling.library` for a shipped model; a config.json's
    under <name>-<hash>), or None and why. An MoE layout comes from the folder or the MoE library only."""
    from sim.core.errors import PipeSimError
    from sim.profiling import library

    for d in _folder_profiles(model.folder) if model.folder is not None else []:
        meta = tomlio.read_toml(d / "meta.toml", ConfigError)
        moe = meta.get("moe") or {}
        if (int(meta.get("profile", {}).get("tp", -1)) == tp and int(moe.get("ep", 1)) == ep
                and (not moe or str(meta["profile"].get("moe_distribution", "balanced")) == routing)):
            return d, ""
    layout = f"TP{tp}" + (f" EP{ep}" if ep > 1 else "")
    where = f"{_short(model.folder)} has no {layout} profile" if model.folder is not None else ""
    if getattr(model.arch, "moe", None) is not None:
        if model.key == model.name and library.is_moe(model.name):
            gpu, _ = FAMILY_GPU.get(family_path.name, (family_path.name, None))
            try:
                return library.moe_profile(model.name, gpu, tp, ep, routing), ""
            except PipeSimError as exc:
                return None, f"no profile: {where + '; ' if where else ''}{' '.join(str(exc).split())}"
        return None, (f"no profile: {where + '; ' if where else ''}an MoE model's profiles are built by "
                      f"profiles/build_moe.py (ppsim profile build --data aic), not on the fly")
    if model.arch is None:
        return None, (f"no profile: {where}, and no architecture to build one (give --model-config its "
                      f"config.json)")
    gpu, interconnect = FAMILY_GPU.get(family_path.name, (family_path.name, None))
    try:
        if model.key == model.name and model.name in _library_models():  # a shipped model: the library's cache
            return library.resolve_profile(model.name, gpu, tp, interconnect), ""
        from sim.latency.hardware import load_interconnect
        from sim.profiling.build import build_profile, built_dir

        spec = library.load_gpu(gpu)
        model.arch.check_tp(tp, where="tp")
        if spec.kernel_data == "aic":
            from sim.profiling.aic import aic_dir, build_aic_profile

            out = aic_dir(library.cache_root() / "aic", spec, "vllm", model.key, "bf16", "bf16", tp)
            if not (out / "meta.toml").is_file():
                build_aic_profile(model.arch, spec, tp, out, replace=False)
            return out, ""
        ic = interconnect or spec.default_interconnect
        out = built_dir(library.cache_root(), spec, ic, model.key, tp)
        if not (out / "meta.toml").is_file():
            build_profile(model.arch, spec, load_interconnect(ic), tp, out, replace=False)
        return out, ""
    except PipeSimError as exc:
        return None, f"no profile: {where + '; ' if where else ''}{' '.join(str(exc).split())}"


def weights_reason(family_path: Path, model: "str | PlanModel", tp: int, pp: int, ep: int = 1) -> str:
    """"weights need X GB per GPU, have Y" when the model's weights alone do not fit, else "" (an MoE model:
    its experts over `ep` ranks, `sim.profiling.specs.weights_gib_per_gpu`)."""
    gpu, _ = FAMILY_GPU.get(family_path.name, (family_path.name, None))
    from sim.core.errors import PipeSimError
    from sim.profiling import library

    try:
        if isinstance(model, PlanModel):  # (a folder without an architecture: its profile's memory says it)
            if model.arch is not None:
                from sim.profiling.specs import check_weights_fit

                check_weights_fit(model.arch, library.load_gpu(gpu), tp, pp, ep)
            return ""
        library.check_weights(model, gpu, tp, pp, ep)
    except PipeSimError as exc:
        return f"does not fit: {' '.join(str(exc).split())}"
    return ""


def _library_models() -> list[str]:
    from sim.profiling.library import model_names

    return model_names()


def _short(p: Path) -> str:
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p)


@dataclass(frozen=True)
class Split:
    interconnect: str
    replicas: int
    tp: int
    pp: int
    profile: str  # "" when dropped for lack of one
    kv_tokens: int
    reason: str  # why it is dropped; "" if it can run
    ep: int = 1  # an MoE model's expert-parallel size (1: experts sharded by TP; tp: sim/core/ep.py)


def model_context(prof: Profile, context: int | None) -> int:
    """The context a run of `prof` serves: `context` when set (`--set scheduler.context_length_tokens`;
    beyond the model's own, refused as `ppsim run` refuses it: sim/engine/run.py pool_sizes), else the
    default 16,384, never beyond the model's own context."""
    own = prof.context_length
    if context is None:
        return min(CONTEXT_TOKENS, own) if own else CONTEXT_TOKENS
    if own and context > own:
        raise ConfigError(f"--set scheduler.context_length_tokens={context}: exceeds the model's context length "
                          f"{own} (profile {_short(Path(prof.path))}: [model] "
                          f"context_length_tokens); allowed: <= {own}")
    return context


def splits(family_path: Path, name: str, model: str, gpus: int, mem_fraction: float = MEM_FRACTION,
           context: int | None = None, routing: str = "balanced") -> list[Split]:
    """Every replicas x TP (x EP, an MoE model's: `moe_layouts`) x PP split of `gpus` GPUs; TP over the divisors
    of a replica's GPUs. A split whose KV pool cannot hold one request of the context it serves (`model_context`)
    is dropped, with the reason. `routing`: an MoE model's profiles' (`--moe-routing`)."""
    if isinstance(model, str) and not (family_path / model).is_dir() and model not in _library_models():
        known = sorted(d.name for d in family_path.iterdir() if d.is_dir())
        raise ConfigError(f"--model {model!r}: no profile in {family_path}; allowed: {', '.join(known)}")
    out = []
    for replicas in (r for r in range(1, gpus + 1) if gpus % r == 0):
        per = gpus // replicas
        for tp, ep in ((t, e) for t in range(1, per + 1) if per % t == 0 for e in moe_layouts(model, t)):
            pp = per // tp
            path, reason = resolve_profile(family_path, model, tp, ep, routing)
            if path is None:
                # (an MoE model: the library builds only what fits somewhere, so say first when it does not fit)
                reason = (weights_reason(family_path, model, tp, pp, ep) if moe_of(model) else "") or reason
                out.append(Split(name, replicas, tp, pp, "", 0, reason, ep))
                continue
            prof = Profile.load(path)
            if pp > prof.shape().num_layers:
                out.append(Split(name, replicas, tp, pp, _short(path), 0,
                                 f"PP {pp} > the model's {prof.shape().num_layers} layers", ep))
                continue
            kv = kv_capacity_tokens(prof, pp, mem_fraction)
            ctx = model_context(prof, context)
            reason = "" if kv >= ctx else (weights_reason(family_path, model, tp, pp, ep) or
                                            f"does not fit: KV pool {max(kv, 0)} tokens < one {ctx}-token request")
            out.append(Split(name, replicas, tp, pp, _short(path), kv, reason, ep))
    return out


def longest_request_tokens(table: dict, seeds: list[int], prompt_only: bool = False) -> int:
    """The most tokens (prompt + output; `prompt_only`: prompt) one request of the plan's workload `table`
    holds, over the builds of its seeds (the probes' lengths: a rate changes the arrivals, not the lengths)."""
    return max((r.prompt_tokens + (0 if prompt_only else r.output_tokens)
                for s in seeds for r in build_workload_said(table, seed=s)[0]), default=0)


def pool_refusal(table: dict, longest: int, where: str, what: str = "request") -> str:
    """Why a candidate (its run config `table`) cannot hold the workload's longest request (`longest`
    tokens) in its KV pool as its engine sizes the pool (sim/engine/run.py pool_sizes: SGLang's
    profile_max_num_token at its mem_fraction_static, vLLM's gpu_memory_utilization less a full step's
    activations in whole blocks less V1's null block), else "". The engine serves a request of at most
    min(context - 1, pool - 1) tokens (SGLang's max_req_len) and cuts a longer one; the context's own cut is
    warned as truncation, the pool's is a refusal. A bad `--set` in `table` is the one-line ConfigError of
    `where`, not a refusal."""
    from sim.core.config import config_from_table
    from sim.engine.run import build_latency, hardware, pool_sizes
    from sim.engine.schedulers import engine as engine_of

    cfg = config_from_table(table, where)
    lat = build_latency(cfg)
    eng, sc = engine_of(cfg.scheduler.engine, where="--engine"), cfg.scheduler
    hw = hardware(cfg, lat)
    try:
        kv = pool_sizes(cfg, lat, eng, eng.settings(sc, hw), hw)[0]
    except ConfigError as exc:  # (no pool at all, or one too small for any request)
        return f"does not fit: {sc.engine} leaves no usable KV pool ({' '.join(str(exc).split())})"
    own = getattr(lat.profile, "context_length", None)
    ctx = min(sc.context_length_tokens, own) if own else sc.context_length_tokens
    need = min(longest, ctx - 1)
    if kv - 1 >= need:
        return ""
    return (f"does not fit: {sc.engine} sizes its KV pool at {kv} tokens per stage, so it serves requests of at most "
            f"{kv - 1} tokens; the workload's longest {what} has {longest} tokens"
            + (f" ({need} within the {ctx}-token context)" if need < longest else ""))


class KvPools:
    """The plan's KV-pool refusals (`pool_refusal`), one check per (profile, TP, PP, engine, chunk policy):
    the pool depends on the engine (its memory share, its whole blocks) and on its step's token budget (vLLM
    reserves a full step's activations), not on the router or the replica count."""

    def __init__(self, workload: dict, seeds: list[int], slo: SLO, engine_sets: tuple[str, ...],
                 engines: list[str], prompt_only: bool = False) -> None:
        self.workload, self.slo, self.engine_sets, self.engines = workload, slo, engine_sets, engines
        self.seeds, self.prompt_only = seeds, prompt_only
        self.longest: int | None = None  # (built on the first check: a plan whose every candidate is pruned
        # by its throughput bound, at a rate whose probes would hold millions of requests, never builds them)
        self.what = "prompt" if prompt_only else "request"  # (a prefill instance holds the prompt only)
        self.why: dict[tuple, str] = {}

    def refusals(self, profile: str, tp: int, pp: int, engine: str, policies: list[str]) -> dict[str, str]:
        """{policy: why its pool cannot hold the longest request} for those of `policies` that cannot."""
        for p in policies:
            key = (profile, tp, pp, engine, p)
            if key not in self.why:
                if self.longest is None:
                    self.longest = longest_request_tokens(self.workload, self.seeds, self.prompt_only)
                t = deployment_table(self.workload, profile, 1, tp, pp, "round-robin", p, self.slo, engine=engine,
                                     overrides=engine_overrides(self.engine_sets, engine, self.engines))
                self.why[key] = pool_refusal(t, self.longest, f"plan --set (engine {engine})", self.what)
        return {p: self.why[(profile, tp, pp, engine, p)] for p in policies if self.why[(profile, tp, pp, engine, p)]}

    def lines(self) -> list[str]:
        """One line per refused instance shape and engine, its policies and why (stderr and plan.json)."""
        out: dict[tuple, list[str]] = {}
        for (profile, tp, pp, engine, p), why in self.why.items():
            if why:
                out.setdefault((profile, tp, pp, engine, why), []).append(p)
        return [f"refused, not ranked: TP{tp}xPP{pp} [{engine}] {', '.join(ps)} ({profile}): {why}"
                for (profile, tp, pp, engine, why), ps in out.items()]


def throughput_bound_rps(profile: str, pp: int, replicas: int, tokens_per_request: float) -> float:
    """Upper bound on the requests/s a deployment serves (module docstring)."""
    prof = Profile.load(REPO_ROOT / profile if not Path(profile).is_absolute() else profile)
    lat = ProfiledLatencyModel(prof, pp)
    grid = [int(g) for g in prof.grid]
    # on the grid: the model's own times (running maximum over the grid: sim.latency.profiled.layer_nonattn_s)
    per_token = min(lat.layer_nonattn_s(g, scaled=True) / g for g in grid)
    # beyond it the time grows at the model's extrapolation rate (never negative), never below its roofline
    # floor: time / tokens tends to the larger of the two. Both 0 (a flat top, no floor): the grid's minimum
    # stands, a finite bound (the slope of the last two points made it infinite for 95 of 137 profiles, whose
    # last point is lower than the one before).
    limit = lat.extrapolation_rate_s(scaled=True)
    if lat.floors is not None:
        big = 1 << 30
        limit = max(limit, lat.floors.linear_s(float(big)) / big)
    if limit > 0:
        per_token = min(per_token, limit)
    busiest = max(lat.layers) * per_token * tokens_per_request
    return replicas / busiest if busiest > 0 else math.inf


# -- like-for-like interconnects ------------------------------------------------------------

def like_for_like(base: Path, other: Path, model: str, dest: Path) -> tuple[Path, list[str]]:
    """A profile family under `dest`: `base`'s profiles of `model` with only the communication
    model (the [comm] section, comm.csv, the token broadcast) taken from `other`. Returns the
    family folder and what differed (held fixed and changed)."""
    notes, held = [], []
    dest = dest.resolve()  # run configs name the profile by this path, from any working folder
    for d in sorted((base / model).glob("tp*")):
        od = other / model / d.name
        if not (d / "meta.toml").is_file() or not (od / "meta.toml").is_file():
            continue
        meta = tomlio.read_toml(d / "meta.toml", ConfigError)
        ometa = tomlio.read_toml(od / "meta.toml", ConfigError)
        # the ground truth's variance and host costs are the GPU server's, not the interconnect's
        new = {k: copy.deepcopy(meta[k]) for k in ("profile", "model", "lookup", "scaling", "overhead", "memory",
                                                   "ground_truth") if k in meta}
        new["comm"] = copy.deepcopy(ometa["comm"])
        new["overhead"]["broadcast_us"] = ometa["overhead"].get("broadcast_us", 0)
        new["profile"]["gpu"] = f"{meta['profile'].get('gpu')} with the communication of {ometa['profile'].get('gpu')}"
        new["derivation"] = {"like_for_like": f"{_short(d)} with [comm] and broadcast_us from {_short(od)}"}
        out = dest / model / d.name
        out.mkdir(parents=True, exist_ok=True)
        # the tables first and meta.toml last: a folder with meta.toml is a complete profile
        for f in ("layer_nonattn.csv", "attention.csv"):
            fsio.write_bytes(out / f, (d / f).read_bytes())
        if new["comm"].get("model") == "table":
            fsio.write_bytes(out / "comm.csv", (od / "comm.csv").read_bytes())
        fsio.write_text(out / "meta.toml", tomlio.dumps(new))
        changed = [f"{k} {meta['comm'].get(k)} -> {v}" for k, v in ometa["comm"].items() if meta["comm"].get(k) != v]
        b0, b1 = meta["overhead"].get("broadcast_us"), ometa["overhead"].get("broadcast_us")
        if b0 != b1:
            changed.append(f"broadcast_us {b0} -> {b1}")
        notes.append(f"{d.name}: " + ", ".join(changed))
        for sec, key in (("overhead", "cpu_ms"), ("memory", "gpu_mem_gib"), ("scaling", "s_mem"), ("scaling", "s_comp")):
            if meta[sec].get(key) != ometa[sec].get(key):
                held.append(f"{key} {meta[sec].get(key)} (the other profile has {ometa[sec].get(key)})")
    held = sorted(set(held))
    lines = [f"like-for-like: the {other.name} candidates run {base.name}'s layer tables, attention, "
             f"lookup, scaling, CPU cost, run-to-run variance and memory; only the communication model is {other.name}'s."]
    if held:
        lines.append("held fixed at the base GPU's values: " + "; ".join(held) + ".")
    lines += ["communication changed: " + n for n in notes]
    return dest, lines


# -- workload -------------------------------------------------------------------------------

@dataclass
class PlanLoad:
    table: dict  # the [workload] table every candidate runs (without seed)
    timestamped: bool  # replayed at recorded (possibly scaled) times: no rate knob
    rate_rps: float | None  # the load of rate mode (None: goodput mode)
    note: str
    changes: tuple[str, ...]  # what the workload's reader changed of its input (build_workload_said)
    tokens: dict[str, float]  # mean prompt, output and total tokens per request (`mean_tokens`)
    # requests per unit of the workload's rate: 1 for requests; a conversation workload's rate_rps starts
    # sessions, each sending its turns: requests / sessions of its seed-1 build. Rates and goodputs in the
    # plan's outputs are requests/s (the searches run in the workload's own unit).
    per_unit: float = 1.0
    clients: int | None = None  # `--concurrency N`: a closed loop of N clients (sim/studies/concurrency_plan.py)


def _mean_rate(reqs) -> float:
    t = [r.arrival_s for r in reqs]
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else math.nan


def probe_window_s(args) -> float:
    """The shortest arrival window of a probe (`PROBE_MIN_WINDOW_S`, `QUICK_WINDOW_S` with --quick)."""
    return QUICK_WINDOW_S if getattr(args, "quick", False) else PROBE_MIN_WINDOW_S


def check_workload(merged: dict, name: str) -> None:
    """A conversation workload's turns follow their sessions' clocks; a closed loop over them is not planned."""
    if merged.get("kind") == "conversation" or "num_sessions" in merged:
        raise ConfigError(f"--concurrency with --workload {name}: a conversation workload sends its turns on its "
                          f"sessions' clocks, which a closed loop of clients does not model; allowed: a request "
                          f"workload (e.g. azure-conv-synth, sharegpt)")


def plan_load(args, overrides: dict) -> PlanLoad:
    if args.trace:
        path = Path(args.trace)
        if not path.is_file():
            raise ConfigError(f"--trace {args.trace!r}: file not found")
        table = {"kind": "trace", "file": str(path.resolve()), "arrivals": "timestamps", **overrides}
    else:
        table = {"name": args.workload, **overrides}
    merged, _ = resolve_workload(table)
    if getattr(args, "concurrency", None) is not None:
        check_workload(merged, args.workload)
    timestamped = merged.get("kind") == "trace" and merged.get("arrivals", "poisson") != "poisson"
    if args.quick and not timestamped and "num_sessions" not in merged:
        table["num_requests"] = min(int(merged.get("num_requests", 150) or 150), 150)
    if args.rate is not None and not args.rate > 0:
        raise ConfigError(f"--rate must be > 0 req/s, got {args.rate}")
    if not timestamped and args.rate is not None:
        table["rate_rps"] = float(args.rate)
    # built once, here: what its reader changed (the candidates' runs build it silently, in workers) and its
    # token counts; a timestamp_speedup set below scales the arrival times only, not the requests
    reqs, said = build_workload_said(table, seed=1)
    changes, tokens = tuple(said), mean_tokens(reqs)
    per = 1.0
    if merged.get("kind") == "conversation":
        per = len(reqs) / int(merged["num_sessions"])
        changes = changes + (f"workload {args.workload}: a conversation workload's rate starts sessions; "
                             f"{per:.3g} requests per session (seed 1): the plan's rates and goodputs are requests/s "
                             f"(= sessions/s x {per:.3g}); --rate is sessions/s",)
    if not timestamped:
        # held at least the probe window (a conversation workload's size is its sessions), here at the rate and
        # in the goodput searches at theirs (`with_rate` scales the size the table names); after the token
        # counts, which need no more requests (a rate beyond every candidate's bound is pruned, never run)
        size = size_key(merged)
        n = int(table.get(size, merged.get(size, 0)) or 0)
        if n > 0:
            table[size] = n if args.rate is None else max(n, math.ceil(float(args.rate) * probe_window_s(args) - 1e-9))
    clients = getattr(args, "concurrency", None)
    if clients is not None:  # sized by run_plan (`concurrency_plan.hold_clients`), once the SLO is known
        table["concurrency"] = int(clients)
        return PlanLoad(table, False, None, f"workload {args.workload}: a closed loop of {clients} concurrent "
                                            f"clients (each sends its next request when its previous one "
                                            f"finishes; the request list in order)", changes, tokens, per, clients)
    if not timestamped:
        if args.rate is None:
            return PlanLoad(table, False, None, f"workload {args.workload}: goodput search over Poisson rates",
                            changes, tokens, per)
        unit = "req/s" if per == 1.0 else f"sessions/s ({args.rate * per:.3g} req/s)"
        return PlanLoad(table, False, float(args.rate), f"workload {table.get('name', 'trace')}: Poisson arrivals "
                                                        f"at {args.rate:g} {unit}", changes, tokens, per)
    # NOTE: a timestamped trace keeps its arrival times; --rate only rescales them.
    own = _mean_rate(reqs)
    src = args.trace or args.workload
    if args.rate is None:
        return PlanLoad(table, True, own, f"{src}: {len(reqs)} requests replayed at their timestamps "
                                          f"(mean {own:.3g} req/s)", changes, tokens)
    speedup = float(merged.get("timestamp_speedup", 1.0)) * args.rate / own
    table["timestamp_speedup"] = speedup
    return PlanLoad(table, True, float(args.rate), f"{src}: {len(reqs)} requests replayed at their timestamps "
                                                   f"scaled by {speedup:.3g} (mean {own:.3g} -> {args.rate:g} req/s)",
                    changes, tokens)


def mean_tokens(reqs, context: int = CONTEXT_TOKENS) -> dict[str, float]:
    """The mean prompt, output and total tokens per request of `reqs` (each request clipped to the context)."""
    if not reqs:
        return {"prompt": 0.0, "output": 0.0, "total": 0.0}
    p = np.array([min(r.prompt_tokens, context) for r in reqs], dtype=float)
    t = np.array([min(r.prompt_tokens + r.output_tokens, context) for r in reqs], dtype=float)
    return {"prompt": float(p.mean()), "output": float((t - p).mean()), "total": float(t.mean())}


# -- runs -----------------------------------------------------------------------------------

def policies_for(c: dict, asked: tuple[str, ...] | None = None) -> list[str]:
    """The chunk policies a candidate is planned with: FastPP, the paper's (every one, or those `asked` in
    --policies); another engine, its own knob (`ENGINE_POLICIES`: its default and static chunks, those asked
    when --policies names some) and a paper policy only when asked, as a labelled what-if (never
    predictive+DS: the rebalancer is FastPP's)."""
    eng = c.get("engine", "fastpp")
    if c.get("kv_refused"):  # (those whose KV pool cannot hold the longest request: `KvPools`)
        return [p for p in policies_for({"engine": eng}, asked) if p not in c["kv_refused"]]
    if eng == "fastpp":
        return [p for p in POLICIES if asked is None or p in asked]
    native = ENGINE_POLICIES.get(eng, (ENGINE_DEFAULT,))
    if asked is None:
        return list(native)
    own = [p for p in native if p in asked or p == ENGINE_DEFAULT]
    if eng == "vllm-v0":  # no chunked prefill: nothing else to set
        return own
    return own + [WHAT_IF + p for p in asked if p not in native and POLICIES[p][2] is None]


def policy_spec(policy: str) -> tuple[dict, int, dict | None]:
    """(chunk_policy table, chunk tokens, rebalancer) of a planned policy name (`POLICIES`, the engines' own
    "default": chunk 0, and "what-if:NAME")."""
    if policy == ENGINE_DEFAULT:
        return {"name": "static"}, 0, None
    return POLICIES[policy.removeprefix(WHAT_IF)]


def deployment_table(workload: dict, profile: str, replicas: int, tp: int, pp: int, router: str, policy: str,
                     slo: SLO, seed: int = 1, stop_early: bool = False, engine: str = "fastpp",
                     cluster: dict | None = None, overrides: tuple[str, ...] = ()) -> dict:
    """One candidate's run config table; `overrides`: the plan's `--set` of the engine's settings
    (`engine_overrides`), applied last as `ppsim run --set` applies them."""
    chunk_policy, chunk, rebalancer = policy_spec(policy)
    slo_table = {k: v for k, v in vars(slo).items() if v is not None}
    slo_table["stop_when_violated"] = stop_early
    table = {
        "seed": seed,
        "parallel": {"pp": pp, "tp": tp, "replicas": replicas, "router": router, **profile_layout(profile)},
        "scheduler": {"chunk_size_tokens": chunk, "chunk_policy": copy.deepcopy(chunk_policy)},
        "latency": {"kind": "profile", "profile": profile},
        "slo": slo_table,
        "workload": copy.deepcopy(workload),
    }
    if rebalancer:
        table["scheduler"]["rebalancer"] = copy.deepcopy(rebalancer)
    if engine != "fastpp":  # (a FastPP table stays as before engines were an axis: same cache keys)
        table["scheduler"]["engine"] = engine
    if cluster is not None:  # placed on nodes (sim/engine/cluster.py); one node: no table, the same run
        table["cluster"] = copy.deepcopy(cluster)
    if overrides:  # (none: the table as before, the same cache keys)
        from sim.core.config import apply_overrides

        table = apply_overrides(table, list(overrides))
    return table


def profile_layout(profile: str) -> dict:
    """The `[parallel]` fields an MoE profile's layout sets (`{"ep": E}` for an expert-parallel profile, whose
    [moe] ep a run must match: sim/core/ep.py check_profile_ep), else {} (a table as before: the same cache keys)."""
    ep = _profile_ep(str(profile))
    return {"ep": ep} if ep > 1 else {}


@functools.lru_cache(maxsize=256)
def _profile_ep(profile: str) -> int:
    path = Path(profile) if Path(profile).is_absolute() else REPO_ROOT / profile
    if not (path / "meta.toml").is_file():  # (a profile the run will refuse in its own words)
        return 1
    return int((tomlio.read_toml(path / "meta.toml", ConfigError).get("moe") or {}).get("ep", 1))


def nodes_used(gpus_per_node: int, pools: list[tuple[str, int, int, int]]) -> int:
    """The nodes of `gpus_per_node` GPUs that pools of (name, instances, TP, PP) take when placed in order
    (sim.latency.cluster.place: each TP group inside one node when it fits)."""
    from sim.latency.cluster import ClusterSpec, PoolShape, place

    spec = ClusterSpec(1 << 20, gpus_per_node, "", "", "")
    return place(spec, [PoolShape(n, k, tp, pp) for n, k, tp, pp in pools]).nodes_used


def cluster_table(nodes: int, gpus_per_node: int, network: str) -> dict | None:
    """The `[cluster]` table of a run over `nodes` nodes (None for one node: the run without it, bit for bit)."""
    if nodes <= 1:
        return None
    return {"nodes": nodes, "gpus_per_node": gpus_per_node, "network": network}


# What a plan's --set may not set: what the plan searches or takes from its own flags.
PLAN_OWNS = {"parallel": "the plan searches TP, PP and replicas", "seed": "--seeds", "slo": "--slo",
             "scheduler.engine": "--engine", "scheduler.chunk_size_tokens": "the chunk axis, --policies",
             "scheduler.chunk_policy": "the chunk axis, --policies", "scheduler.rebalancer": "the chunk axis, --policies",
             "latency.kind": "--model and --gpu", "latency.profile": "--model and --gpu"}
SET_SECTIONS = ("workload", "scheduler", "latency", "server")


def plan_overrides(sets: list[str]) -> tuple[dict, tuple[str, ...]]:
    """A plan's `--set`s: (the [workload] fields, the engine's settings as `--set` texts), the sections
    `ppsim run --set` sets other than what the plan chooses (`PLAN_OWNS`)."""
    from sim.core.config import apply_overrides, parse_override

    workload, engine = [], []
    for text in sets:
        path, _ = parse_override(text)
        key = ".".join(path)
        owner = next((v for k, v in PLAN_OWNS.items() if key == k or key.startswith(k + ".")), None)
        if owner:
            raise ConfigError(f"--set {text!r}: {key} is what the plan chooses ({owner}); allowed: workload.KEY, "
                              f"scheduler.KEY, latency.KEY or server.KEY other than "
                              f"{', '.join(k for k in PLAN_OWNS if '.' in k)}")
        if path[0] not in SET_SECTIONS or len(path) < 2:
            raise ConfigError(f"--set {text!r}: {path[0]!r} is no section a plan sets; allowed: "
                              f"{', '.join(s + '.KEY' for s in SET_SECTIONS)}")
        (workload if path[0] == "workload" else engine).append(text)
    return apply_overrides({"workload": {}}, workload)["workload"], tuple(engine)


def engine_sizes(engine_sets: tuple[str, ...]) -> tuple[int | None, float]:
    """(context_length_tokens set, else None; mem_fraction set, else the plan's MEM_FRACTION) of the engine
    `--set`s, for the memory fit of the splits."""
    from sim.core.config import apply_overrides

    sc = apply_overrides({}, list(engine_sets)).get("scheduler", {})
    ctx, frac = sc.get("context_length_tokens"), sc.get("mem_fraction")
    ctx = ctx if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0 else None
    frac = float(frac) if isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 < frac <= 1 \
        else MEM_FRACTION
    return ctx, frac


def engine_overrides(engine_sets: tuple[str, ...], engine: str, engines: list[str]) -> tuple[str, ...]:
    """The engine `--set`s a run of `engine` takes: a knob only some engines read (sim.core.config
    ENGINE_KNOBS, e.g. SGLang's schedule_policy) goes to the plan's engines that read it; one that none of
    them reads goes to every run, to be refused as `ppsim run` refuses it."""
    from sim.core.config import ENGINE_KNOBS, parse_override

    out = []
    for text in engine_sets:
        path, _ = parse_override(text)
        readers = ENGINE_KNOBS.get(path[-1], ()) if path[0] == "scheduler" and len(path) == 2 else ()
        if readers and engine not in readers and any(e in readers for e in engines):
            continue
        out.append(text)
    return tuple(out)


def check_engine_sets(cands: list[dict], load, slo: SLO, sets: dict) -> None:
    """Every engine's run config, with its `--set`s, validated as `ppsim run` validates it (one candidate
    per engine), before anything is simulated: a bad value is a one-line error naming the `--set`."""
    from sim.core.config import config_from_table

    seen = set()
    for c in cands:
        eng = c.get("engine", "fastpp")
        if eng in seen or not sets.get(eng):
            continue
        seen.add(eng)
        t = deployment_table(load.table, c["profile"], c["replicas"], c["tp"], c["pp"], "round-robin",
                             "static-2048" if eng == "fastpp" else ENGINE_DEFAULT, slo, engine=eng,
                             overrides=sets[eng])
        config_from_table(t, f"plan --set (engine {eng})")



def _cluster_of(c: dict) -> dict | None:
    return cluster_table(int(c.get("nodes", 1)), int(c.get("gpus_per_node", 8)), c.get("network", "ib-ndr"))
