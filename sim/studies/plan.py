"""`ppsim plan`: what-if capacity planning. Which deployment of N GPUs serves a load best?

Candidates: every `replicas` x (TP x PP) split of the N GPUs (TP over the divisors of a
replica's GPUs), behind a round-robin or least-loaded router when there are several
replicas, with every chunk policy (static 256/512/1024/2048, greedy, predictive, predictive +
delay scheduling). A split without a profile or whose KV pool cannot hold one full-context
request is *dropped* (listed with the reason, never silently), and so is a candidate whose KV pool
as its engine sizes it cannot hold the workload's longest request (`KvPools`; a stderr line and
plan.json `kv_refused` too). `--model` is a model id, a profile folder or (`--model-config`) a
config.json (`PlanModel`); missing TP degrees are built into the cache; without `--gpu` the plan
runs on the paper's A100-40GB PCIe only for a model hand-built there (`plan_gpu`).

Three questions:

- `--rate R` (or a timestamped trace, `--trace FILE`, replayed at its own times, scaled to R
  when `--rate` is given): simulate every candidate at that load and report mean/P50/P90/P99
  TTFT, TPOT and E2E, the percentiles the SLO names, SLO attainment, KV headroom, cost per
  million requests and whether the SLOs hold; rank those meeting them (sustained: not saturated) by
  fewest GPUs, then cost per hour, then margin (`sim.studies.verdict.rank`). Cost columns, one basis
  each: `cost_per_hour`, `cost_per_million_at_rate` (serving R: the one to present) and
  `cost_per_million_at_goodput` (at each one's goodput, `goodputs_above`: searched from R upward to within
  10% on the first seed, then stepped down until every seed holds, `sim.studies.sweep.holds_on_seeds`; NaN
  for those missing the SLOs and a trace replayed at its timestamps). A candidate meets the SLOs at R by the
  same rule: every seed passes and the 95% interval of their margins does not reach below zero.
- `--concurrency N` (users, not a rate): every candidate as a closed loop of N clients, ranked as at a
  rate, its cost at the rate it achieves there (sim/studies/concurrency_plan.py).
- no `--rate`: each candidate's goodput: each seed's highest rate meeting the SLOs (`sim.studies.sweep`;
  their mean and 95% CI), then from the lowest of them down by 10% steps to the highest rate that counts on
  every seed (`counted_rates`, `sim.studies.sweep.holds_on_seeds`), ranked by that goodput with ties (the
  seeds' CIs overlapping) broken by cost, then GPUs.

More GPUs than a node holds (`--gpus N` > `--gpus-per-node`, default 8): every split is placed
on nodes of that many GPUs joined by `--network` (`nodes_used`: in order, each TP group inside one
node), and its runs carry that `[cluster]` table, so a PP send to another node and a TP group's
all-reduces across nodes are costed over the network (sim/engine/cluster.py); plan.csv's `nodes` is
the placement's.

Seeds are paired: seed s gives every candidate the same arrivals and lengths. They are staged:
the first seed runs for every candidate; the others only where they can change the answer
(rate mode: not stopped early, and a first-seed margin within `--replicate-within` of the SLO
boundary or of the best; goodput mode: a first-seed goodput at least 70% of the best, searched
around the first seed's goodput). Every row says how many seeds it has. Ranking, ties and the
verdict paragraph are `sim.studies.verdict`.

Cheap bounds before simulating: the memory fit above, and a throughput bound: every token of
a request passes through every layer's linear part, so the busiest stage needs at least
(prompt + output tokens) x its layers x the cheapest per-token layer time of the profile (the
minimum over the grid of time / tokens) per request; a replica serves at most 1 / that many
requests per second. A candidate whose bound is below `--rate` is *pruned* (overloaded); in
goodput searches the bound caps the rates searched. Goodput searches also screen each split
with one fixed chunk and prune splits below `--prune-below` of the best screen, climb the
rates two at a time stopping at the first failure, and stop runs once their percentiles are
certain to miss (`[slo] stop_when_violated`); runs are cached by content, so the screen's
runs are reused by the full search and a re-plan reuses every run.

`--interconnect both` is like-for-like: the NVLink candidates use the PCIe profile's layer
tables, scaling, CPU cost and GPU memory, with only the communication model (collectives
table or alpha-beta, token broadcast) taken from the NVLink profile; the plan lists what
differed.
"""

from __future__ import annotations

from sim.core.lazy import lazy

import copy
import math
from dataclasses import dataclass
from pathlib import Path

pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)
np = lazy("numpy")

from sim.core import fsio, tomlio  # noqa: E402
from sim.core.config import REPO_ROOT  # noqa: E402
from sim.core.errors import ConfigError  # noqa: E402
from sim.latency.profiled import Profile, ProfiledLatencyModel, kv_capacity_tokens  # noqa: E402
from sim.core.slo import SLO, slo_from_specs  # noqa: E402
from sim.studies.sweep import (Runner, Search, goodput_searches, holds_on_seeds, mean_ci, meets_slo,  # noqa: E402
                               size_key, hold_tail, sustained, with_rate)
from sim.studies.plan_verify import TABLE, verify  # noqa: E402
from sim.studies.verdict import family, rank, verdict  # noqa: E402
from sim.workloads import build_workload_said, resolve_workload  # noqa: E402

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
    """The GPUs a model id has shipped profiles on: hand-built families, profiles/built/, profiles/aic/."""
    root = REPO_ROOT / "profiles"
    out = [f for f in FAMILY_GPU if (root / f / model).is_dir()]
    out += sorted(d.parent.name for d in (root / "built").glob(f"*/{model}") if d.is_dir())
    out += sorted(d.parents[1].name for d in (root / "aic").glob(f"*/vllm/{model}-bf16-kvbf16") if d.is_dir())
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


def resolve_profile(family_path: Path, model: "str | PlanModel", tp: int) -> tuple[Path | None, str]:
    """The one place a (GPU family, model, TP degree) finds its latency profile: the profile
    directory, or None and why not. (A resolver that builds missing profiles plugs in here.)"""
    if isinstance(model, PlanModel):
        return _resolve_own(family_path, model, tp)
    d = family_path / model / f"tp{tp}"
    if (d / "meta.toml").is_file():
        return d, ""
    gpu, interconnect = FAMILY_GPU.get(family_path.name, (family_path.name, None))
    from sim.core.errors import PipeSimError
    from sim.profiling import library

    try:
        library.load_gpu(gpu)
    except PipeSimError:
        return None, f"no profile: {_short(d)} does not exist"
    try:  # built offline from the shipped kernel data (issue 11), cached under $PIPESIM_CACHE
        return library.resolve_profile(model, gpu, tp, interconnect), ""
    except PipeSimError as exc:
        return None, f"no profile: {' '.join(str(exc).split())}"


def _resolve_own(family_path: Path, model: PlanModel, tp: int) -> tuple[Path | None, str]:
    """A `PlanModel`'s profile at TP `tp`: the folder's, else built into the cache from its architecture
    (`sim.profiling.library` for a shipped model; a config.json's under <name>-<hash>), or None and why."""
    from sim.core.errors import PipeSimError
    from sim.profiling import library

    for d in _folder_profiles(model.folder) if model.folder is not None else []:
        if int(tomlio.read_toml(d / "meta.toml", ConfigError).get("profile", {}).get("tp", -1)) == tp:
            return d, ""
    where = f"{_short(model.folder)} has no TP{tp} profile" if model.folder is not None else ""
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


def weights_reason(family_path: Path, model: "str | PlanModel", tp: int, pp: int) -> str:
    """"weights need X GB per GPU, have Y" when the model's weights alone do not fit, else ""."""
    gpu, _ = FAMILY_GPU.get(family_path.name, (family_path.name, None))
    from sim.core.errors import PipeSimError
    from sim.profiling import library

    try:
        if isinstance(model, PlanModel):  # (a folder without an architecture: its profile's memory says it)
            if model.arch is not None:
                from sim.profiling.specs import check_weights_fit

                check_weights_fit(model.arch, library.load_gpu(gpu), tp, pp)
            return ""
        library.check_weights(model, gpu, tp, pp)
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
           context: int | None = None) -> list[Split]:
    """Every replicas x TP x PP split of `gpus` GPUs; TP over the divisors of a replica's GPUs. A split whose
    KV pool cannot hold one request of the context it serves (`model_context`) is dropped, with the reason."""
    if isinstance(model, str) and not (family_path / model).is_dir() and model not in _library_models():
        known = sorted(d.name for d in family_path.iterdir() if d.is_dir())
        raise ConfigError(f"--model {model!r}: no profile in {family_path}; allowed: {', '.join(known)}")
    out = []
    for replicas in (r for r in range(1, gpus + 1) if gpus % r == 0):
        per = gpus // replicas
        for tp in (t for t in range(1, per + 1) if per % t == 0):
            pp = per // tp
            path, reason = resolve_profile(family_path, model, tp)
            if path is None:
                out.append(Split(name, replicas, tp, pp, "", 0, reason))
                continue
            prof = Profile.load(path)
            if pp > prof.shape().num_layers:
                out.append(Split(name, replicas, tp, pp, _short(path), 0,
                                 f"PP {pp} > the model's {prof.shape().num_layers} layers"))
                continue
            kv = kv_capacity_tokens(prof, pp, mem_fraction)
            ctx = model_context(prof, context)
            reason = "" if kv >= ctx else (weights_reason(family_path, model, tp, pp) or
                                            f"does not fit: KV pool {max(kv, 0)} tokens < one {ctx}-token request")
            out.append(Split(name, replicas, tp, pp, _short(path), kv, reason))
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
        from sim.studies.concurrency_plan import check_workload

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
        "parallel": {"pp": pp, "tp": tp, "replicas": replicas, "router": router},
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


GOODPUT_RESOLUTION = 1.1   # a goodput above the rate is bracketed to within 10% (the highest pass / lowest fail)


def goodputs_above(runner: Runner, tables: list[dict], rate: float, slo: SLO, desc: str = "plan: goodput",
                   seed_tables: list[list[dict]] | None = None) -> list[tuple[float, dict | None]]:
    """The goodput of each deployment (`tables`, each on its first seed and meeting the SLOs at `rate`),
    searched from `rate` upward: the rate doubled until a run misses the SLOs (never beyond the deployment's
    physical ceiling, `sim.studies.sweep.Search.ceiling_rps`), then geometric bisection until the highest
    passing rate is within 10% of the lowest failing one (`GOODPUT_RESOLUTION`); the runs of every deployment
    in one parallel batch per step, each holding its rate as long as the run at R spans (more requests at
    higher rates, as goodput searches do: `Search.window_s`), the failing ones stopped once certain to miss.
    A run passes by `slo.meets`, the test `--verify` applies (sim/studies/plan_verify.py).

    The highest passing rate of one seed sits on the SLO boundary (its long run fails about as often as it
    holds: experiments/plan_verify/README.md), so it is not yet the goodput: with `seed_tables` (each
    deployment's tables on its other paired seeds, at `rate`) the goodput is the highest rate of the ladder
    g, g / 1.1, g / 1.1^2, ... (g the highest pass; the search's own resolution) at which the rate counts by
    `sim.studies.sweep.holds_on_seeds`: every seed passes and the lower end of the 95% interval of their
    margins is >= 0; at `rate` itself it counts (the deployment met the SLOs there by the same rule), so the
    ladder ends there. Returns (goodput; the first seed's summary at it, a full run). The run at R is the
    table itself (cached); a table missing the SLOs there gets (0, None). Cost per million requests is
    taken at this goodput: at R it is GPUs / R, the same for every deployment of a GPU count."""
    searches = [Search({"key": i}, t, [rate], slo=slo) for i, t in enumerate(tables)]
    n = len(searches)
    lo, hi = [0.0] * n, [math.inf] * n
    at: list[dict | None] = [None] * n
    probes = [(i, float(rate)) for i in range(n)]
    while probes:
        res = runner.run([searches[i].at(r) for i, r in probes], desc=desc)
        for (i, r), out in zip(probes, res):
            if slo.meets(out):
                lo[i], at[i] = r, out
            else:
                hi[i] = r
        probes = []
        for i, s in enumerate(searches):
            if lo[i] <= 0:
                continue
            if math.isinf(hi[i]):
                r = round(min(2 * lo[i], s.ceiling_rps), 4)
            elif hi[i] / lo[i] > GOODPUT_RESOLUTION:
                r = round(math.sqrt(lo[i] * hi[i]), 4)
            else:
                continue
            if lo[i] < r < hi[i]:
                probes.append((i, r))
    if seed_tables:
        todo = [i for i in range(n) if lo[i] > rate and seed_tables[i]]
        groups = [[searches[i], *(Search({"key": i}, t, [rate], slo=slo) for t in seed_tables[i])] for i in todo]
        for i, (g, summ) in zip(todo, counted_rates(runner, groups, [lo[i] for i in todo], slo, float(rate),
                                                    f"{desc}: seeds")):
            lo[i], at[i] = g, summ[0]
    return [(lo[i], at[i]) for i in range(n)]


def counted_rates(runner: Runner, groups: list[list[Search]], starts: list[float], slo: SLO, floor: float,
                  desc: str, floor_counts: bool = True) -> list[tuple[float, list[dict]]]:
    """For each group of one deployment's searches, one per paired seed, the highest rate of the ladder
    start, start / 1.1, start / 1.1^2, ... (`GOODPUT_RESOLUTION`, the searches' own resolution) at which the
    rate counts, `sim.studies.sweep.holds_on_seeds`, with the group's runs there. The ladder ends at `floor`:
    with `floor_counts` the floor itself counts unchecked (the demanded rate, where the deployment met the
    SLOs by the same rule; only the first seed's run there is returned), else a group reaching it has no
    goodput (0, no runs). Every group's step runs in one parallel batch."""
    rates = list(starts)
    done: dict[int, tuple[float, list[dict]]] = {}
    todo = list(range(len(groups)))
    while todo:
        res = runner.run([s.at(rates[i]) for i in todo for s in groups[i]], desc=desc)
        k, nxt = 0, []
        for i in todo:
            summ = res[k:k + len(groups[i])]
            k += len(groups[i])
            if holds_on_seeds(slo, summ):
                done[i] = (rates[i], summ)
                continue
            down = round(rates[i] / GOODPUT_RESOLUTION, 4)
            if down > floor * (1 + 1e-9):
                rates[i] = down
                nxt.append(i)
            elif floor_counts:  # back at the demanded rate, which counts (see above): the first seed's run there
                done[i] = (floor, runner.run([groups[i][0].at(floor)], desc=desc))
            else:
                done[i] = (0.0, [])
        todo = nxt
    return [done[i] for i in range(len(groups))]


def _num(v) -> float:
    return math.nan if v is None else float(v)


def metric_columns(slo: SLO) -> list[str]:
    cols = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99")]
    return cols + [k for k in slo.keys() if k not in cols]


def seed_margin(summary: dict, slo: SLO) -> float:
    """One run's margin with the sign of its verdict (negative: it fails `slo.meets`): `slo.margin` (1 -
    percentile / threshold, the smallest over the objectives; a saturated run's at most its completion
    shortfall), and for a run failing on what that does not read, the smallest slack of its late arrivals'
    percentiles (`late_p<q>_<metric>_ms`, part of the criterion); -inf for a run that failed, stopped or did not
    finish, or fails with no slack to measure (saturated while completions kept pace: its queue grew)."""
    if summary.get("status") != "ok" or summary.get("num_finished") != summary.get("num_requests"):
        return -math.inf
    m = slo.margin(summary)
    if slo.meets(summary) or m < 0:
        return m
    late = [1 - _num(summary.get("late_" + k)) / ms for k, (_, _, ms) in zip(slo.keys(), slo.objectives())]
    late = [v for v in late if v < 0]
    return min(late) if late else -math.inf


def kv_headroom(summary: dict) -> float:
    """1 - the peak KV in use / the pool. In use: what the requests hold (their own tokens and the cached prefixes
    they pin), `kv_peak_active_tokens`; a prefix cache keeps freed tokens as evictable cache, which an
    allocation takes back, so `kv_peak_tokens` (free tokens only counted out) reads a full pool. A summary
    without the active peak (an older cached run) gives `kv_peak_tokens`'."""
    cap = summary.get("kv_capacity_tokens")
    if not cap:
        return math.nan
    peak = summary.get("kv_peak_active_tokens")
    return 1 - (peak if peak is not None else summary["kv_peak_tokens"]) / cap


def at_rate_row(summaries: list[dict], slo: SLO) -> dict:
    """One candidate at the user's load, over its seeds: seed means of the latency columns,
    attainment, the worst KV headroom (`kv_headroom`), the margin and the SLO verdict. The margin
    has the verdict's sign (`seed_margin`): meeting the SLOs on every seed, the mean over seeds and its 95% CI
    (refused all the same where that CI reaches below zero: then the margin is the CI's lower end, and
    `margin_seed_mean` keeps the mean); else the worst seed's (negative: by how much it misses), its CI bounds
    the same."""
    row = {c: float(np.nanmean([_num(s.get(c)) for s in summaries])) if any(s.get(c) is not None for s in summaries)
           else math.nan for c in metric_columns(slo)}
    row["slo_attainment"] = float(np.mean([_num(s.get("slo_attainment")) for s in summaries]))
    heads = [kv_headroom(s) for s in summaries if s.get("kv_capacity_tokens")]
    row["kv_headroom"] = min(heads) if heads else math.nan
    margins = [seed_margin(s, slo) for s in summaries]
    row["seeds_meeting"] = sum(slo.meets(s) for s in summaries)
    every_seed = row["seeds_meeting"] == len(summaries)
    if every_seed:
        row["margin"], row["margin_ci_lo"], row["margin_ci_hi"] = mean_ci(margins)
    else:
        row["margin"] = row["margin_ci_lo"] = row["margin_ci_hi"] = min(margins)
    # the rate counts only where every seed meets the SLOs and the margins' 95% interval does not reach
    # below zero (`sim.studies.sweep.holds_on_seeds`): a thin margin on three short runs is not a sustained one
    row["meets_slo"] = holds_on_seeds(slo, summaries)
    row["refused_thin_margin"] = bool(every_seed and not row["meets_slo"])
    row["margin_seed_mean"] = row["margin"]
    if row["refused_thin_margin"]:  # the margin the verdict read: the interval's lower end, below zero
        row["margin"] = row["margin_ci_lo"]
    row["run_status"] = ";".join(sorted({s.get("status") or "?" for s in summaries}))
    # what the runs cut of the requests (the context or the pool: sim/cli/run.py run_warnings), never silent
    row["truncated_prompts"] = max(int(s.get("num_truncated_prompts") or 0) for s in summaries)
    row["clipped_outputs"] = max(int(s.get("num_clipped_outputs") or 0) for s in summaries)
    return row


def parse_prices(text: str | None, names: list[str]) -> dict[str, float]:
    """`2.0` (every GPU) or `pcie=1.6,nvlink=2.2` -> {interconnect: $/GPU-hour}."""
    if not text:
        return {}
    try:
        if "=" not in text:
            prices = dict.fromkeys(names, float(text))
        else:
            prices = {k.strip(): float(v) for k, v in (part.split("=", 1) for part in text.split(","))}
    except ValueError:
        raise ConfigError(f"--price-per-gpu-hour {text!r}: expected a number or NAME=PRICE,..., "
                          f"e.g. 2.0 or pcie=1.6,nvlink=2.2") from None
    for k in prices:
        if k not in names:
            raise ConfigError(f"--price-per-gpu-hour {text!r}: unknown name {k!r}; allowed: {', '.join(names)}")
    missing = [n for n in names if n not in prices]
    if missing:  # (one unit per column: $ for every row or GPU-hours for every row)
        raise ConfigError(f"--price-per-gpu-hour {text!r}: no price for {', '.join(missing)}; allowed: a price "
                          f"for each of {', '.join(names)}, or one number for all")
    if any(not (math.isfinite(v) and 0 < v <= MAX_PRICE) for v in prices.values()):
        raise ConfigError(f"--price-per-gpu-hour {text!r}: prices must be finite $ per GPU-hour in (0, {MAX_PRICE:g}]")
    return prices


def cost_per_million(price: float | None, gpus: int, rate_rps: float) -> float:
    """$ per million requests served at `rate_rps` on `gpus` GPUs at `price` $/GPU-hour."""
    if not price or not rate_rps > 0:
        return math.nan
    return price * gpus / 3600.0 / rate_rps * 1e6


def cost_columns(gpus: int, price: float | None, rate_rps: float | None, goodput_rps: float) -> dict:
    """A row's cost columns, one basis each (`price` None: GPU-hours, a price of 1): `cost_per_hour` (GPUs x
    price), `cost_per_million_at_rate` (serving the demanded rate: NaN without one) and
    `cost_per_million_at_goodput` (at the deployment's own goodput; NaN where none was found)."""
    price = price or 1.0
    return {"cost_per_hour": price * gpus,
            "cost_per_million_at_rate": cost_per_million(price, gpus, rate_rps) if rate_rps else math.nan,
            "cost_per_million_at_goodput": cost_per_million(price, gpus, goodput_rps)
            if math.isfinite(goodput_rps) and goodput_rps > 0 else math.nan}


def cost_unit(prices: dict) -> str:
    """What the cost columns count: $ with --price-per-gpu-hour, else GPU-hours."""
    return "$" if prices else "GPU-hours"


RULE_RATE = ("among those meeting the SLOs on every seed (sustained: not saturated; late arrivals too) with the 95% "
             "interval of their margins not below zero, fewest GPUs, then cost per hour (at the rate it orders "
             "cost_per_million_at_rate alike), then margin")
def refused_thinly(r) -> bool:
    """Whether a row (dict or pandas row) met the SLOs on every seed but was refused by the margin interval."""
    v = r.get("refused_thin_margin")
    return isinstance(v, (bool, np.bool_)) and bool(v)


THIN_MARGIN = ("meets the SLOs on every seed, but thinly: the margins' 95% interval reaches {margin_ci_lo:+.1%} "
               "(sim.studies.sweep.holds_on_seeds), so the rate does not count")
RULE_GOODPUT = ("highest goodput counted on every seed (sim.studies.sweep.holds_on_seeds; ties where the seeds' goodput "
                "CIs overlap: lower cost_per_million_at_goodput, then fewer GPUs)")
COST_NOTE = ("cost columns: cost_per_hour = GPUs x price; cost_per_million_at_rate = serving the demanded rate (the "
             "one to present); cost_per_million_at_goodput = at the candidate's own goodput (efficiency at full load)")


def label(r: dict) -> str:
    split = f"TP{r['tp']}xPP{r['pp']}"
    if r["replicas"] > 1:
        split = f"{r['replicas']}x({split}) {r['router']}"
    engine = r.get("engine", "fastpp")
    return f"{r['interconnect']}: {split} {r['policy']}" + ("" if engine == "fastpp" else f" [{engine}]")


def run_plan(args) -> tuple[pd.DataFrame, dict]:
    if getattr(args, "max_gpus", None):  # the fewest GPUs over a cluster (sim/studies/cluster_plan.py)
        from sim.studies.cluster_plan import run_cluster_plan

        return run_cluster_plan(args)
    if getattr(args, "gpus", None) is None:
        args.gpus = 4
    if not (args.slo_ttft_ms > 0 and args.slo_tpot_ms > 0):
        raise ConfigError("--slo-ttft-ms, --slo-tpot-ms and --gpus must be positive")
    slo = sustained(slo_from_specs(args.slo, SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)))
    slo.validate("plan --slo")
    if args.gpus < 1 or args.seeds < 1:
        raise ConfigError("--gpus and --seeds must be >= 1")
    overrides, engine_sets = plan_overrides(args.set)
    context, mem_fraction = engine_sizes(engine_sets)
    out = Path(args.out)
    # more GPUs than a node holds: every split is placed on nodes of --gpus-per-node GPUs joined by --network
    # (its cross-node sends and spanning all-reduces costed there; sim/engine/cluster.py)
    gpn = getattr(args, "gpus_per_node", None) or 8
    network = getattr(args, "network", None) or "ib-ndr"
    if args.gpus > gpn:
        from sim.latency.cluster import load_network

        load_network(network)  # one-line error naming the allowed networks
        if not args.gpu and (args.interconnect or "pcie") == "both":
            raise ConfigError(f"--interconnect both with --gpus {args.gpus} > --gpus-per-node {gpn}: the like-for-like "
                              f"profiles name no hardware to place on nodes; allowed: --gpus <= {gpn}, or one "
                              f"interconnect")
    model = plan_model_of(args)  # (sets args.gpu for a profile folder; refuses a model without a default GPU)
    families, notes, kernel_notes = [], [], []
    if args.gpu:
        families = [(Path(args.gpu).name, family_dir(args.gpu))]
    else:
        interconnect = args.interconnect or "pcie"
        names = list(INTERCONNECTS) if interconnect == "both" else [interconnect]
        for n in names:
            if n not in INTERCONNECTS:
                raise ConfigError(f"--interconnect {n!r}: allowed: pcie, nvlink, both")
        families = [(names[0], family_dir(INTERCONNECTS[names[0]]))]
        if len(names) == 2:
            fam, lines = like_for_like(families[0][1], family_dir(INTERCONNECTS["nvlink"]), model,
                                       out / "profiles" / f"{INTERCONNECTS['pcie']}+nvlink-comm")
            families.append(("nvlink", fam))
            notes += lines
    prices = parse_prices(args.price_per_gpu_hour, [n for n, _ in families])
    load = plan_load(args, overrides)
    if load.clients is not None:  # a closed loop's probes: rounds per client and the tail (concurrency_plan)
        from sim.studies.concurrency_plan import hold_clients

        load.changes += tuple(x for x in [hold_clients(load.table, load.clients, slo, args.quick,
                                                       "num_requests" in overrides)] if x)
    elif not load.timestamped:  # a tail objective's probes (sim.studies.sweep.tail_requests; issue 39b hook)
        load.changes += tuple(x for x in [hold_tail(load.table, slo, load.per_unit, args.quick,
                                                         size_key(load.table) in overrides)] if x)
    mode = "concurrency" if load.clients is not None else "goodput" if load.rate_rps is None else "rate"
    seeds = list(range(1, args.seeds + 1))
    runner = Runner(out / "cache.jsonl", jobs=args.jobs, executor=args.executor, address=args.address,
                    progress=not args.no_progress)
    tokens = load.tokens["total"]
    rows, cands = [], []
    engines = list(getattr(args, "engine", None) or ["fastpp"])
    for eng in engines:
        from sim.engine.schedulers import engine as engine_of

        engine_of(eng, where="--engine")
    asked = getattr(args, "policies_asked", None)
    pools = KvPools(load.table, seeds, slo, engine_sets, engines)
    for fam_name, fam in families:
        for sp, eng in ((sp, eng) for sp in splits(fam, fam_name, model, args.gpus, mem_fraction, context)
                        for eng in engines):
            if sp.profile:  # the data source of the engine's kernel era (sim.profiling.library.engine_profile)
                from dataclasses import replace
                from sim.profiling.library import engine_profile

                path, note = engine_profile(sp.profile, eng, getattr(args, "kernel_data", None) or "")
                sp = replace(sp, profile=path)
                kernel_notes += [note] if note and note not in kernel_notes else []
            routers = ["round-robin", "least-loaded"] if sp.replicas > 1 else ["single"]
            nodes = nodes_used(gpn, [("colocated", sp.replicas, sp.tp, sp.pp)])
            for router in routers:
                base = {"interconnect": fam_name, "replicas": sp.replicas, "tp": sp.tp, "pp": sp.pp,
                        "gpus": args.gpus, "nodes": nodes, "gpus_per_node": gpn,
                        "network": network if nodes > 1 else "-", "mode": "colocated", "engine": eng,
                        "router": router, "family": family(sp.replicas, sp.tp, sp.pp),
                        "profile": sp.profile, "kv_tokens": sp.kv_tokens}
                reason = sp.reason or ("vllm-v0 runs pp = 1 only (V0's one scheduler per virtual engine is not "
                                       "modelled: sim/engine/schedulers/vllm_v0.py)" if eng == "vllm-v0" and sp.pp > 1
                                       else "")
                if reason:
                    rows.append({**base, "policy": "-", "status": "dropped", "reason": reason})
                    continue
                bound = throughput_bound_rps(sp.profile, sp.pp, sp.replicas, tokens)
                base["throughput_bound_rps"] = bound
                if mode == "rate" and load.rate_rps * load.per_unit > bound:
                    rows.append({**base, "policy": "-", "status": "pruned",
                                 "reason": f"overloaded: {load.rate_rps * load.per_unit:g} req/s > the throughput bound {bound:.3g} "
                                           f"req/s ({tokens:.0f} tokens per request)"})
                    continue
                why = pools.refusals(sp.profile, sp.tp, sp.pp, eng, policies_for(base, asked))
                rows += [{**base, "policy": p, "status": "dropped", "reason": w} for p, w in why.items()]
                if len(why) == len(policies_for(base, asked)):
                    continue
                base["kv_refused"] = tuple(why)
                cands.append(base)
    sets = {eng: engine_overrides(engine_sets, eng, engines) for eng in engines}
    check_engine_sets(cands, load, slo, sets)
    price = {c["interconnect"]: prices.get(c["interconnect"]) for c in cands}
    if mode == "rate":
        rows += _plan_at_rate(runner, cands, load, slo, seeds, price, args.replicate_within, sets, asked)
    elif mode == "concurrency":  # ranked as at a rate (sim/studies/concurrency_plan.py)
        from sim.studies.concurrency_plan import plan_rows

        rows += plan_rows(runner, cands, load, slo, seeds, price, args.replicate_within, sets, asked)
    else:
        rows += _plan_goodput(runner, cands, load, slo, seeds, price, args, sets, asked)
    if load.per_unit != 1.0:
        rows = [in_requests(r, load.per_unit, price.get(r["interconnect"])) for r in rows]
    df = pd.DataFrame(rows)
    df.insert(0, "deployment", [label(r) for r in df.to_dict("records")])
    ranked_as = "rate" if mode == "concurrency" else mode
    df = rank(df, ranked_as)
    df["warnings"] = [_warnings(r, ranked_as) for r in df.to_dict("records")]
    if mode == "concurrency" and getattr(args, "verify", False):
        from sim.studies.concurrency_plan import verify as verify_clients

        checks = verify_clients(runner, df.to_dict("records"), load.clients, slo)
    else:
        checks = (verify(runner, df.to_dict("records"), None if load.rate_rps is None else load.rate_rps * load.per_unit,
                         slo, load.per_unit) if getattr(args, "verify", False) else None)
    df = df.drop(columns=[TABLE, "kv_refused"], errors="ignore")
    meta = {"mode": mode, "model": str(model), "gpus": args.gpus, "slo": slo.describe(), "seeds": len(seeds),
            "rate_rps": None if load.rate_rps is None else load.rate_rps * load.per_unit, "load": load.note,
            "interconnect_notes": notes, "kernel_data_notes": kernel_notes, "requests_per_rate_unit": load.per_unit,
            "workload_warnings": list(load.changes),
            "tokens_per_request": tokens, "output_tokens_per_request": load.tokens["output"],
            "gpus_per_node": gpn, "network": network if args.gpus > gpn else None,
            "cost_unit": cost_unit(prices),
            "rule": RULE_RATE if mode == "rate" else RULE_GOODPUT}
    if mode == "concurrency":
        from sim.studies import concurrency_plan as cp

        meta.update(concurrency=load.clients, load_unit=cp.UNIT, rule=cp.RULE.format(n=load.clients), cost_note=cp.COST_NOTE)
    cut = df[(df.get("truncated_prompts", 0) > 0) | (df.get("clipped_outputs", 0) > 0)] \
        if "truncated_prompts" in df else df.iloc[:0]
    meta["truncation"] = [{"deployment": r["deployment"], "truncated_prompts": int(r["truncated_prompts"]),
                           "clipped_outputs": int(r["clipped_outputs"]), "context_length_tokens": context
                           or CONTEXT_TOKENS} for r in cut.to_dict("records")]
    if meta["truncation"]:
        worst = max(meta["truncation"], key=lambda t: t["truncated_prompts"] + t["clipped_outputs"])
        meta["workload_warnings"].append(
            f"{len(cut)} candidate(s) cut requests to their context or KV pool (at most "
            f"{worst['truncated_prompts']} prompt(s) truncated and {worst['clipped_outputs']} output(s) clipped, "
            f"{worst['deployment']}; context {worst['context_length_tokens']} tokens unless the model's is shorter; "
            f"plan.json truncation; raise it with --set scheduler.context_length_tokens=N)")
    meta["kv_refused"] = pools.lines()
    meta["verdict"] = verdict(df, ranked_as, slo.describe(), meta["rate_rps"], meta["cost_unit"],
                              load_text=f"{load.clients} concurrent clients" if mode == "concurrency" else None)
    if checks is not None:
        meta["verification"] = checks
    return df, meta


def _plan_at_rate(runner, cands, load, slo, seeds, price, within: float, sets: dict | None = None,
                  asked: tuple[str, ...] | None = None) -> list[dict]:
    """Every candidate x policy at the load. The first seed runs everywhere, stopping a run
    once a percentile is certain to exceed twice its threshold; the other seeds run only for
    candidates that could matter: not stopped, and within `within` of the SLO boundary or of
    the best first-seed margin of their cost (others keep one seed, and say so)."""
    items = [(c, p) for c in cands for p in policies_for(c, asked)]
    sets = sets or {}

    def table(c, policy, seed):
        router = "round-robin" if c["router"] == "single" else c["router"]
        t = deployment_table(load.table, c["profile"], c["replicas"], c["tp"], c["pp"], router, policy, slo, seed,
                             stop_early=True, engine=c.get("engine", "fastpp"), cluster=_cluster_of(c),
                             overrides=sets.get(c.get("engine", "fastpp"), ()))
        t["slo"]["stop_factor"] = STOP_FACTOR
        return t

    first = runner.run([table(c, p, seeds[0]) for c, p in items], desc="plan: first seed")
    margin1 = [slo.margin(s) if s.get("status") == "ok" else -math.inf for s in first]
    # without a price, GPU-hours per million requests is the cost
    cost = [cost_per_million(price[c["interconnect"]] or 1.0, c["gpus"], load.rate_rps) for c, _ in items]
    best = {}
    for m, k in zip(margin1, cost):
        key = round(k, 6) if math.isfinite(k) else None
        best[key] = max(best.get(key, -math.inf), m)
    more = [i for i, (m, k) in enumerate(zip(margin1, cost)) if len(seeds) > 1 and first[i].get("status") == "ok"
            and (abs(m) <= within or m >= best[round(k, 6) if math.isfinite(k) else None] - within)]
    rest = runner.run([table(*items[i], s) for i in more for s in seeds[1:]], desc="plan: more seeds")
    extra = {i: rest[j * (len(seeds) - 1):(j + 1) * (len(seeds) - 1)] for j, i in enumerate(more)}
    rows = []
    for i, (c, policy) in enumerate(items):
        summ = [first[i], *extra.get(i, [])]
        row = {**c, "policy": policy, "status": "ok", "reason": "", "rate_rps": load.rate_rps,
               "num_seeds": len(summ), **at_rate_row(summ, slo), "note": "", TABLE: table(c, policy, seeds[0])}
        if first[i].get("status") == "stopped":
            for col in metric_columns(slo) + ["slo_attainment"]:
                row[col] = math.nan  # only the requests finished by the stop: not comparable
            row["note"] = f"misses by more than {STOP_FACTOR:g}x: {first[i].get('reason')}"
        elif len(summ) < len(seeds):
            row["note"] = (f"{len(summ)} seed: first-seed margin {margin1[i]:+.0%} is more than {within:.0%} from "
                           f"the SLO boundary and from the best of its cost")
        rows.append(row)
    # cost at each deployment's own goodput (at the rate it is GPUs / rate, the same for every split of N GPUs):
    # searched from the rate upward on the first seed, for those meeting the SLOs on every seed
    # (a trace replayed at its timestamps has no rate to raise: its cost stays at its own rate)
    meets = [i for i, r in enumerate(rows) if r["meets_slo"]] if not load.timestamped else []
    found = goodputs_above(runner, [table(*items[i], seeds[0]) for i in meets], load.rate_rps, slo,
                           seed_tables=[[table(*items[i], s) for s in seeds[1:]] for i in meets])
    for i, (g, at_g) in zip(meets, found):
        rows[i]["goodput_rps"] = g if g > 0 else math.nan
        rows[i]["goodput_mean_tpot_ms"] = _num(at_g.get("mean_tpot_ms")) if at_g and g > 0 else math.nan
    for i, row in enumerate(rows):
        c = items[i][0]
        row.update(cost_columns(c["gpus"], price[c["interconnect"]], load.rate_rps, _num(row.get("goodput_rps"))))
    return rows


RATE_COLUMNS = ("rate_rps", "goodput_rps", "goodput_seed_mean_rps", "goodput_ci_lo", "goodput_ci_hi", "goodput_per_gpu")


def in_requests(row: dict, per: float, price: float | None) -> dict:
    """A conversation workload's row with its rates in requests/s (x `per`, requests per session; each also
    kept in sessions/s as `<name>_sessions`) and its cost columns taken at them."""
    out = dict(row)
    for k in RATE_COLUMNS:
        if isinstance(out.get(k), (int, float)) and math.isfinite(out[k]):
            out[k.replace("_rps", "") + "_sessions_per_s" if k.endswith("_rps") else k + "_sessions"] = out[k]
            out[k] = out[k] * per
    if out.get("status") == "ok":
        out.update(cost_columns(out["gpus"], price, out.get("rate_rps"), _num(out.get("goodput_rps"))))
    return out


def _cluster_of(c: dict) -> dict | None:
    return cluster_table(int(c.get("nodes", 1)), int(c.get("gpus_per_node", 8)), c.get("network", "ib-ndr"))


def _plan_goodput(runner, cands, load, slo, seeds, price, args, sets: dict | None = None,
                  asked: tuple[str, ...] | None = None) -> list[dict]:
    rows = []
    sets = sets or {}
    tol = 0.25 if args.quick else 0.05

    def search(c, policy, seed, stop=True):
        router = "round-robin" if c["router"] == "single" else c["router"]
        table = deployment_table(load.table, c["profile"], c["replicas"], c["tp"], c["pp"], router, policy, slo,
                                 seed, stop_early=stop, engine=c.get("engine", "fastpp"), cluster=_cluster_of(c),
                                 overrides=sets.get(c.get("engine", "fastpp"), ()))
        top = c["throughput_bound_rps"] / load.per_unit  # (in the workload's rate unit)
        rates = [r for r in RATES if r < top] + [round(top, 4)]
        found = Search({"policy": policy, "seed": seed}, table, sorted(set(rates)), slo=slo)
        found.min_window_s = max(found.window_s, probe_window_s(args))  # held, not a burst (PROBE_MIN_WINDOW_S)
        return found

    screens = [search(c, ("static-512" if c["pp"] > 1 else "static-2048") if c.get("engine", "fastpp") == "fastpp"
                      else ENGINE_DEFAULT, seeds[0]) for c in cands]
    found = goodput_searches(runner, screens, tol=0.5, desc="plan: screen", full_sweep=False)
    best = {}
    for c, f in zip(cands, found):
        best[c["interconnect"]] = max(best.get(c["interconnect"], 0.0), f["goodput_rps"])
    kept = []
    for c, f in zip(cands, found):
        cut = args.prune_below * best[c["interconnect"]]
        if f["goodput_rps"] < cut:
            rows.append({**c, "policy": "-", "status": "pruned",
                         "reason": f"dominated: screen goodput {f['goodput_rps']:.2f} < {args.prune_below:.0%} of the "
                                   f"best split's {best[c['interconnect']]:.2f} req/s"})
        else:
            kept.append(c)
    items = [(c, p) for c in kept for p in policies_for(c, asked)]
    first = goodput_searches(runner, [search(c, p, seeds[0]) for c, p in items], tol=tol, desc="plan: goodput",
                             full_sweep=False)
    # The other seeds only where they can matter: within GOODPUT_REPLICATE of the best first-seed
    # goodput of the interconnect; their search starts around the first seed's goodput.
    top = {}
    for (c, _), f in zip(items, first):
        top[c["interconnect"]] = max(top.get(c["interconnect"], 0.0), f["goodput_rps"])
    more = [i for i, ((c, _), f) in enumerate(zip(items, first))
            if len(seeds) > 1 and f["goodput_rps"] > 0 and f["goodput_rps"] >= GOODPUT_REPLICATE * top[c["interconnect"]]]
    extra_searches = []
    for i in more:
        g1 = first[i]["goodput_rps"]
        for seed in seeds[1:]:
            s_ = search(*items[i], seed)
            s_.rates = sorted({round(g1 * f, 4) for f in (0.8, 0.9, 1.0, 1.1, 1.25)})
            extra_searches.append(s_)
    found = goodput_searches(runner, extra_searches, tol=tol, desc="plan: more seeds", full_sweep=False)
    n_more = len(seeds) - 1
    extra = {i: found[j * n_more:(j + 1) * n_more] for j, i in enumerate(more)}
    # The goodput that counts (sim.studies.sweep.holds_on_seeds): each seed's search ends at its own highest
    # pass, on its SLO boundary, so their mean is one a long run misses about half the time; from the lowest
    # seed's goodput down the 10% ladder until every seed holds with a margin interval >= 0 (`counted_rates`;
    # a candidate searched on one seed keeps that seed's goodput: no interval).
    ladder = [k for k, f in enumerate(first) if k in extra and f["goodput_rps"] > 0
              and all(e["goodput_rps"] > 0 for e in extra[k])]
    groups = [[search(*items[k], sd) for sd in seeds] for k in ladder]
    starts = [min(f["goodput_rps"] for f in [first[k], *extra[k]]) for k in ladder]
    held = {k: first[k]["goodput_rps"] for k in range(len(items))}
    held.update({k: 0.0 for k in extra if k not in ladder})
    held.update({k: g for k, (g, _) in zip(ladder, counted_rates(runner, groups, starts, slo, tol,
                                                                   "plan: goodput on every seed", False))})
    # the operating point: 80% of the goodput, first seed, a full run (percentiles, KV peak)
    stats, ops = [], []
    for k, (c, policy) in enumerate(items):
        mine = [first[k], *extra.get(k, [])]
        m, lo, hi = mean_ci([f["goodput_rps"] for f in mine])
        stats.append((m, lo, hi, sorted({f["flag"] for f in mine if f["flag"]}), len(mine), held[k]))
        t = search(c, policy, seeds[0], stop=False).table
        ops.append(with_rate(t, max(0.8 * held[k], 0.05)))
    op_res = runner.run(ops, desc="plan: at 80% of goodput")
    for (c, policy), (m, lo, hi, flags, n, g), r in zip(items, stats, op_res):
        head = kv_headroom(r)
        note = "" if n == len(seeds) else (f"{n} seed: first-seed goodput below {GOODPUT_REPLICATE:.0%} of the best; "
                                           f"not replicated")
        rows.append({**c, "policy": policy, "status": "ok", "reason": "", "num_seeds": n, "note": note,
                     "goodput_rps": g, "goodput_seed_mean_rps": m, "goodput_ci_lo": max(lo, 0.0), "goodput_ci_hi": hi,
                     "goodput_per_gpu": g / c["gpus"], **cost_columns(c["gpus"], price[c["interconnect"]], None, g),
                     **{f"{k}_at_80pct": _num(r.get(k)) for k in slo.keys()},
                     "mean_tpot_ms_at_80pct": _num(r.get("mean_tpot_ms")),
                     "kv_headroom_at_80pct": head, "flag": "; ".join(flags),
                     "edge": "top" if any("not_bracketed" in f or "extended" in f for f in flags) else "",
                     TABLE: search(c, policy, seeds[0], stop=False).table})
    return rows


def _warnings(r: dict, mode: str) -> str:
    w = []
    head = r.get("kv_headroom" if mode == "rate" else "kv_headroom_at_80pct")
    if r.get("status") == "ok" and head is not None and isinstance(head, float) and head < KV_HEADROOM_WARN:
        w.append(f"KV headroom {head:.1%} < {KV_HEADROOM_WARN:.0%} at the operating point")
    if mode == "goodput" and r.get("edge"):
        w.append("goodput at the top of the searched range (the throughput bound or 64 req/s)")
    if mode == "goodput" and isinstance(r.get("flag"), str) and "non_monotone" in r["flag"]:
        w.append("non-monotone SLO outcome in the rate")
    if mode == "rate" and r.get("status") == "ok" and 0 < r.get("seeds_meeting", 0) < r.get("num_seeds", 0):
        w.append(f"meets the SLOs on {int(r['seeds_meeting'])} of {int(r['num_seeds'])} seeds only")
    if mode == "rate" and r.get("status") == "ok" and refused_thinly(r):
        w.append(THIN_MARGIN.format(**r))
    return "; ".join(w)
# -- outputs (plan.png: sim/studies/plan_plot.py) ------------------------------------------


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return _jsonable(v.item())
    return v




