"""Run configuration: frozen dataclasses loaded from TOML, validated on load.

A run config has the sections below; every key is checked (unknown keys, wrong types and
out-of-range values are one-line `ConfigError`s naming the file, the key and what is
allowed). `--set a.b=value` overrides parse `value` as a TOML value.

    seed = 1
    horizon_s = 0            # 0: drain every request
    [parallel]  pp, tp, replicas, router = "round-robin" | "least-loaded", ep, attention_dp (MoE: sim/core/ep.py)
    [scheduler] chunk_size_tokens, context_length_tokens, mem_fraction, kv_tokens,
                max_running_requests, chunk_policy = {name, params}, rebalancer = {name, params}
    [latency]   kind = "profile" | "constant", profile = "<dir>", variance, noise_cv, stage_ms, overhead_ms,
                overrides = {param = value}
    [slo]       ttft_ms, ttft_percentile, tpot_ms, tpot_percentile, e2e_ms, e2e_percentile,
                stop_when_violated, stop_factor, stop_when_met (sim.core.slo)
    [server]    on_kv_exhausted = "exit" | "retract", host_time = "modelled" | "profile"
    [workload]  name = "<file in workloads/>" and overrides, or an inline kind (sim.workloads)
    [plugins]   modules = ["my_policy.py", "my_pkg.policies"]   (user plug-ins, sim.core.plugins)
    [cluster]   nodes, gpus_per_node, network, interconnect, gpu, nics_per_node   (sim.core.cluster_config)
    [disaggregation] kv_transfer, first_token, decode_reserve_tokens, [.prefill] and [.decode] pools
    [frontend]  enabled, cpu_speed, stream_interval_tokens, itl = "chunk" | "token"   (sim.latency.frontend)
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sim.core.checks import number
from sim.core.errors import ConfigError
from sim.core.slo import SLO as SLOConfig  # noqa: F401  (the [slo] section; re-exported)
from sim.core.cluster_config import DisaggConfig, check_cluster_table  # [cluster], [disaggregation]

REPO_ROOT = Path(__file__).resolve().parents[2]

# The largest values a config may ask for. They bound what PipeSim can hold in memory or what
# a model could use, not what a user may want: a value above them is refused with this range.
MAX_PP = 256  # pipeline stages (more than any model here has layers: refused again at load)
MAX_TP = 64
MAX_REPLICAS = 1024  # each replica holds a scheduler, its pipeline and its records
MAX_TOKENS = 1 << 20  # chunk and context lengths (1M tokens)
MAX_SECONDS = 1e7  # horizons and latencies (115 days)


DEFAULT_CONTEXT_TOKENS = 16384  # [scheduler] context_length_tokens when a config leaves it out


def bounded(default, lo=None, hi=None, *, integer: bool = False, lo_open: bool = False):
    """A config field whose value must be a finite number in [lo, hi] (`lo_open`: (lo, hi]);
    the one gate for config numbers (`sim.core.checks.number`) reads these bounds."""
    return field(default=default, metadata={"range": (lo, hi, integer, lo_open)})


@dataclass(frozen=True)
class PolicySpec:
    """A plug-in named in config: `{name = "...", params = {...}}`."""

    name: str = "static"
    params: Mapping[str, Any] = field(default_factory=dict)


ROUTERS = ("round-robin", "least-loaded")


@dataclass(frozen=True)
class ParallelConfig:
    """A deployment: `replicas` independent servers of `tp` x `pp` GPUs behind a router."""

    pp: int = bounded(1, 1, MAX_PP, integer=True)
    tp: int = bounded(1, 1, MAX_TP, integer=True)
    replicas: int = bounded(1, 1, MAX_REPLICAS, integer=True)
    router: str = "round-robin"
    # MoE expert parallelism (sim/core/ep.py); None: absent (1), kept out of the echoed config
    ep: int | None = bounded(None, 1, MAX_TP, integer=True)
    attention_dp: int | None = bounded(None, 1, MAX_TP, integer=True)

    def validate(self, where: str) -> None:
        for key in ("pp", "tp", "replicas"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{where}: [parallel] {key} must be >= 1, got {getattr(self, key)}")
        if self.router not in ROUTERS:
            raise ConfigError(f"{where}: [parallel] router must be one of: {', '.join(ROUTERS)}; got {self.router!r}")
        from sim.core.ep import check_ep_layout
        check_ep_layout(self.tp, self.ep or 1, self.attention_dp or 1, where)


ENGINES = ("fastpp", "sglang", "vllm-v1", "vllm-v0")
FASTPP_CHUNK_TOKENS = 2048  # the artifact's default chunk (its launch scripts' --chunked-prefill-size)


@dataclass(frozen=True)
class SchedulerConfig:
    """The serving engine's scheduler. `engine` picks the scheduler (sim/engine/schedulers/, one
    module each, with its source version); the knobs below it are the engines' own, and each
    engine's defaults are in sim/engine/schedulers/README.md."""

    # 0: the engine's default token budget per step (FastPP's 2048; SGLang's chunked_prefill_size
    # and vLLM's max_num_batched_tokens by GPU memory), resolved when the run starts
    chunk_size_tokens: int = bounded(0, 0, MAX_TOKENS, integer=True)
    # the artifact's --context-length; a model whose own context is shorter gets its own instead
    # (SGLang and vLLM default to the model's; sim/engine/run.py pool_sizes)
    context_length_tokens: int = bounded(DEFAULT_CONTEXT_TOKENS, 8, MAX_TOKENS, integer=True)
    # the share of GPU memory the engine may use (SGLang's mem_fraction_static, vLLM's
    # gpu_memory_utilization); None: the engine's default (FastPP 0.9; SGLang's by GPU memory)
    mem_fraction: float | None = bounded(None, 0, 1, lo_open=True)
    kv_tokens: int = bounded(0, 0, 1 << 34, integer=True)  # 0: computed from the profile's memory model
    max_running_requests: int = bounded(0, 0, 1 << 24, integer=True)  # 0: the engine's own default
    chunk_policy: PolicySpec = field(default_factory=PolicySpec)
    rebalancer: PolicySpec | None = None
    engine: str = "fastpp"
    # the engine's release whose defaults apply (sim/engine/schedulers/README.md lists them, e.g.
    # vllm-v1 "0.10", "0.11", "0.15"); "": the release the engine's module was read from
    engine_version: str = ""
    prefix_cache: bool | None = None  # None: as the engine ships (on for sglang and vllm-v1)
    block_size_tokens: int = bounded(16, 1, 4096, integer=True)  # vLLM's block_size
    long_prefill_token_threshold: int = bounded(0, 0, MAX_TOKENS, integer=True)  # vLLM V1; 0: off
    max_prefill_tokens: int = bounded(16384, 1, MAX_TOKENS, integer=True)  # SGLang
    schedule_policy: str = "fcfs"  # SGLang: "fcfs" (its default) or "lpm"
    cuda_graphs: bool | None = None  # CUDA-graph padding of small batches; None: as the engine ships
    # SGLang's overlap scheduler, vLLM's async scheduling (the host's next-step work under the GPU's
    # step); None: as the engine version ships (SGLang: on when pp = 1; vLLM V1: on from 0.15)
    overlap: bool | None = None
    ignore_eos: bool = True  # what the benchmark client sends (SGLang's bench_serving: true)

    def __post_init__(self) -> None:
        # FastPP's default chunk is known without the hardware: resolved here, so a FastPP
        # config reads (and writes out) the same 2048 as before engines were a choice
        if self.chunk_size_tokens == 0 and self.engine == "fastpp":
            object.__setattr__(self, "chunk_size_tokens", FASTPP_CHUNK_TOKENS)
        if self.mem_fraction is None and self.engine in ("fastpp", "vllm-v1", "vllm-v0"):
            # FastPP's launch scripts and vLLM's gpu_memory_utilization: 0.9
            object.__setattr__(self, "mem_fraction", 0.9)

    def validate(self, where: str) -> None:
        # (the engine's name is checked against the scheduler registry when the run starts:
        # plug-in engines register there too)
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ConfigError(f"{where}: [scheduler] schedule_policy must be one of: fcfs, lpm; got "
                              f"{self.schedule_policy!r}")
        if self.chunk_size_tokens < 1 and self.engine == "fastpp":
            raise ConfigError(f"{where}: [scheduler] chunk_size_tokens must be >= 1, got {self.chunk_size_tokens}")
        if self.context_length_tokens < 8:
            raise ConfigError(f"{where}: [scheduler] context_length_tokens must be >= 8")
        if self.mem_fraction is not None and not 0 < self.mem_fraction <= 1:
            raise ConfigError(f"{where}: [scheduler] mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.kv_tokens < 0 or self.max_running_requests < 0:
            raise ConfigError(f"{where}: [scheduler] kv_tokens and max_running_requests must be >= 0")


@dataclass(frozen=True)
class LatencyConfig:
    kind: str = "profile"
    profile: str = "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"
    noise_cv: float = bounded(0.0, 0, 5)  # > 0: overrides the profile's stage-jitter CV
    variance: bool = True  # the profile's run-to-run variance ([ground_truth]); false: zero-variance truth
    stage_ms: float = bounded(10.0, 0, MAX_SECONDS * 1e3, lo_open=True)  # kind = "constant" only
    overhead_ms: float = bounded(0.0, 0, MAX_SECONDS * 1e3)  # kind = "constant" only
    # what-if values of the profile's free parameters, e.g. {allreduce_busbw_gbps = 12.0}
    # (keys: sim.latency.analysis.OVERRIDE_KEYS); the profile on disk is not changed
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def validate(self, where: str) -> None:
        if self.kind not in ("profile", "constant"):
            raise ConfigError(f"{where}: [latency] kind must be one of: profile, constant; got {self.kind!r}")
        if self.noise_cv < 0:
            raise ConfigError(f"{where}: [latency] noise_cv must be >= 0, got {self.noise_cv}")
        for key, val in self.overrides.items():  # key names are checked against the profile when it loads
            if key != "mode":  # each parameter's own range is checked where it is applied (sim.latency.analysis)
                number(val, where, f"[latency.overrides] {key}", 0, None)
        if self.stage_ms <= 0 or self.overhead_ms < 0:
            raise ConfigError(f"{where}: [latency] stage_ms must be > 0 and overhead_ms >= 0, "
                              f"got {self.stage_ms} and {self.overhead_ms}")

    def profile_path(self) -> Path:
        p = Path(self.profile)
        return p if p.is_absolute() else REPO_ROOT / p


ON_KV_EXHAUSTED = ("exit", "retract")
HOST_TIME = ("modelled", "profile")


@dataclass(frozen=True)
class ServerConfig:
    """What the server does when a prefill/mixed batch cannot allocate its KV, and whose host time
    per step it pays.

    `on_kv_exhausted`: `"exit"` (default, the artifact): the run ends with status "failed", as the
    real server exits. `"retract"`: the prefill part of the batch is dropped and the slot runs a
    decode batch instead, retracting and requeueing requests as on a decode OOM; the run goes on.

    `host_time`: `"modelled"` (the default, also when absent): the engine version's host time model where it has one
    (sim/engine/hosttime.py: vLLM V1, SGLang 0.5), else the latency profile's; `"profile"`: the
    profile's `cpu_ms` + `cpu_per_request_us` for every engine (the pre-model behaviour, for runs
    calibrated against it). Either way a constant latency model charges its `overhead_ms`."""

    on_kv_exhausted: str = "exit"
    host_time: str | None = None  # None: "modelled" (left out of a run's config.toml, as before the key existed)

    def validate(self, where: str) -> None:
        if self.on_kv_exhausted not in ON_KV_EXHAUSTED:
            raise ConfigError(f"{where}: [server] on_kv_exhausted must be one of: {', '.join(ON_KV_EXHAUSTED)}; "
                              f"got {self.on_kv_exhausted!r}")
        if self.host_time is not None and self.host_time not in HOST_TIME:
            raise ConfigError(f"{where}: [server] host_time must be one of: {', '.join(HOST_TIME)}; "
                              f"got {self.host_time!r}")


@dataclass(frozen=True)
class FrontendConfig:
    """The API server's share of a request (sim/latency/frontend.py). The section absent: on for the
    engine releases it is sourced for (vllm-v1, sglang), off for the others (fastpp, vllm-v0)."""

    enabled: bool | None = None  # None: as sourced for the engine; false: off; true: on (refused where not sourced)
    cpu_speed: float = bounded(1.0, 0, 100, lo_open=True)  # the host's single-thread speed / the reference CPUs'
    # tokens a streamed chunk carries (vLLM --stream-interval from 0.15, SGLang --stream-interval); 0: the
    # release's default (1)
    stream_interval_tokens: int = bounded(0, 0, 1 << 16, integer=True)
    itl: str = "chunk"  # the client's gaps: one a chunk (vllm bench serve) or split per token (SGLang's native)

    def validate(self, where: str) -> None:
        if self.itl not in ("chunk", "token"):
            raise ConfigError(f"{where}: [frontend] itl must be one of: chunk, token; got {self.itl!r}")


@dataclass(frozen=True)
class PluginsConfig:
    """User plug-ins to import before the run: `.py` files (relative paths are resolved
    against the config file when it is loaded) or importable module names."""

    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunConfig:
    seed: int = bounded(1, 0, 2**63 - 1, integer=True)
    horizon_s: float = bounded(0.0, 0, MAX_SECONDS)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    workload: Mapping[str, Any] = field(default_factory=dict)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    # multi-node placement and prefill/decode pools (sim/core/cluster_config.py; None: absent, one node)
    cluster: Mapping[str, Any] | None = None
    disaggregation: DisaggConfig | None = None
    frontend: FrontendConfig | None = None  # None: the engine's default (sim/latency/frontend.py)

    def validate(self, where: str) -> None:
        if self.horizon_s < 0:
            raise ConfigError(f"{where}: horizon_s must be >= 0, got {self.horizon_s}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"{where}: seed must be an integer in [0, 2^63), got {self.seed}")
        if not self.workload:
            raise ConfigError(f"{where}: missing section [workload]")
        for sec in (self.parallel, self.scheduler, self.latency, self.slo, self.server):
            sec.validate(where)
        if self.frontend is not None:
            self.frontend.validate(where)
        if self.cluster is not None:
            check_cluster_table(self.cluster, where)
        from sim.core.ep import check_ep_engine, check_ep_placement
        check_ep_placement(self.parallel.ep or 1, self.cluster, self.disaggregation is not None, where)
        check_ep_engine(self.parallel.ep or 1, self.scheduler.engine, where)
        if self.disaggregation is not None:
            self.disaggregation.validate(where)
            if self.cluster is None:
                raise ConfigError(f"{where}: [disaggregation] needs a [cluster] table (nodes, gpus_per_node, network) "
                                  f"to place its pools and cost the KV transfer")
            if (self.parallel.pp, self.parallel.tp, self.parallel.replicas) != (1, 1, 1):
                raise ConfigError(f"{where}: [parallel] pp, tp and replicas do not apply with [disaggregation]; "
                                  f"allowed: instances, tp and pp in [disaggregation.prefill] and [disaggregation.decode]")

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(obj):
    if isinstance(obj, Mapping):
        return {k: _to_plain(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, args[0], where, key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: [{key}] must be a table, got {value!r}")
        return _from_table(tp, value, where, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {key} must be an array, got {value!r}")
        return tuple(_convert(v, typing.get_args(tp)[0], where, key) for v in value)
    if tp is Mapping[str, Any] or origin in (Mapping, dict, typing.Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {key} must be a table, got {value!r}")
        return copy.deepcopy(dict(value))
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
        return float(number(value, where, key))  # finite: NaN and inf are refused everywhere
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp}")


def _from_table(cls, table: Mapping[str, Any], where: str, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(fields)
    for key in table:
        if key not in names:
            loc = f"[{prefix}] " if prefix else ""
            raise ConfigError(f"{where}: {loc}unknown key {key!r}; allowed: {', '.join(names)}")
    kwargs = {}
    for name in names:
        if name in table:
            full = f"{prefix}.{name}" if prefix else name
            bounds = fields[name].metadata.get("range")
            if bounds is not None:  # the field's range, in the one error a bad number gets
                lo, hi, integer, lo_open = bounds
                shown = f"[{prefix}] {name}" if prefix else name
                number(table[name], where, shown, lo, hi, integer=integer and not isinstance(table[name], float),
                       lo_open=lo_open)
            kwargs[name] = _convert(table[name], hints[name], where, full)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], value); value parsed as TOML, else a plain string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def attribute_to_override(message: str, overrides: list[str]) -> str:
    """Blame a `--set` override for an error it caused: when the message names an override's
    key (its last dotted part, as a word) or its value, the message is re-headed
    `--set KEY=VALUE: ...` instead of the config or workload file the value landed in."""
    import re

    hits = []
    for text in overrides:
        if "=" not in text:
            continue
        key, raw = text.split("=", 1)
        leaf = key.strip().split(".")[-1]
        value = raw.strip().strip('"\'')
        # NOTE: the earliest mention wins among equals: a message names the field at fault
        # before any list of allowed ones
        m = re.search(rf"(?<![\w-]){re.escape(leaf)}(?![\w-])", message) if leaf else None
        v = re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])", message) if value else None
        if m:
            hits.append((0, m.start(), text))
        elif v:
            hits.append((1, v.start(), text))
        elif "." in key.strip() and key.strip().rsplit(".", 1)[0] in message:  # the section it set, e.g. [slo]
            hits.append((2, message.index(key.strip().rsplit(".", 1)[0]), text))
    if not hits or message.startswith("--set "):
        return message
    text = min(hits, key=lambda h: (h[0], h[1]))[2]
    head, sep, rest = message.partition(": ")
    # NOTE: drop the file the value landed in (a path or "config [section]"), keep the rest.
    if sep and (" " not in head or re.fullmatch(r"config( \[[\w.]+\])?", head)):
        message = f"{rest} (overriding {head})"
    return f"--set {text}: {message}"


def apply_overrides(table: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    table = copy.deepcopy(table)
    for text in overrides:
        path, value = parse_override(text)
        node = table
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {text!r}: {part!r} is not a table")
            node = nxt
        node[path[-1]] = value
    return table


# The [scheduler] knobs only some built-in engines read (each engine module's `settings`/`build`,
# sim/engine/schedulers/README.md): set to another value than its default for another engine, a
# knob would be ignored without a word. (The default passes: a run's config.toml lists every knob.)
# Plug-in engines read what they like: not checked.
ENGINE_KNOBS = {
    "overlap": ("sglang", "vllm-v1"), "schedule_policy": ("sglang",), "max_prefill_tokens": ("sglang",),
    "ignore_eos": ("sglang",), "long_prefill_token_threshold": ("vllm-v1",),
    "block_size_tokens": ("vllm-v1", "vllm-v0"),
}


def check_engine_knobs(sc: "SchedulerConfig", where: str, section: str = "[scheduler]") -> None:
    """Refuse a knob of `sc` set away from its default that its (built-in) engine does not read."""
    if sc.engine not in ENGINES:
        return
    if sc.engine == "vllm-v0" and sc.chunk_policy.name != "static":
        # V0 runs with chunked prefill off (sim/engine/schedulers/vllm_v0.py): a prompt runs whole in
        # one step, so a policy's chunk below a prompt left it waiting forever ("stuck ... cannot be
        # admitted into a KV pool"), and any other chunk changes nothing
        raise ConfigError(f"{where}: {section} chunk_policy {sc.chunk_policy.name!r} with engine 'vllm-v0': V0 runs "
                          f"without chunked prefill, so there is no chunk to control; allowed: chunk_policy "
                          f"'static', or an engine with chunked prefill (fastpp, sglang, vllm-v1)")
    defaults = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}
    for key, engines in ENGINE_KNOBS.items():
        value = getattr(sc, key)
        if sc.engine not in engines and value != defaults[key]:
            names = " or ".join(repr(e) for e in engines)
            shown = str(value).lower() if isinstance(value, bool) else repr(value).replace("'", '"')
            raise ConfigError(f"{where}: {section} {key} = {shown} is a setting of engine {names} only; engine "
                              f"{sc.engine!r} has none and would ignore it; allowed: remove {key}, or engine = {names}")


def config_from_table(table: Mapping[str, Any], where: str = "config") -> RunConfig:
    cfg = _from_table(RunConfig, table, where)
    cfg.validate(where)
    check_engine_knobs(cfg.scheduler, where)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    return config_from_table(load_table(path, overrides), str(path))


def load_table(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The config file's table with `--set` overrides applied (not yet validated)."""
    from sim.core.plugins import resolve_table_paths
    from sim.core.tomlio import read_toml

    table = resolve_table_paths(read_toml(path, ConfigError, "config file not found"), Path(path).parent, str(path))
    return apply_overrides(table, overrides or [])
