"""`run(config) -> RunResult`: build the workload, latency model and policies, simulate.

Pure: no files are written here (the CLI and the experiment layer do I/O).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field, replace
from pathlib import Path

import simpy

from sim.core.config import DEFAULT_CONTEXT_TOKENS, RunConfig
from sim.engine.lockstep import Lockstep, LockstepChunkPolicy, LockstepGuard, LockstepRebalancer
from sim.engine.pipeline import Inbox, Pipeline, SLOGuard
from sim.engine.records import IterationLog
from sim.engine.requests import RequestArrays, RequestTable
from sim.engine.schedulers import EngineSettings, Hardware, engine as engine_for
from sim.core.errors import ConfigError
from sim.core.ep import check_profile_ep
from sim.core.lazy import lazy
from sim.latency.constant import ConstantLatencyModel  # noqa: F401  (registers "constant")
from sim.latency.profiled import Profile, ProfiledLatencyModel
from sim.latency.base import BatchStats
from sim.core.plugins import load_all as load_plugins
from sim.policies import PolicyContext
from sim.policies.guards import build_chunk_policy, build_rebalancer
from sim.workloads import RequestSpec, build_workload, workload_client

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)


@dataclass
class RunResult:
    config: RunConfig
    status: str  # "ok" or "failed"
    reason: str
    requests: RequestTable  # every request's final state; iterates like a list (sim/engine/requests.py)
    iterations: dict  # column name -> typed column (sim/engine/records.py); indexes like a list
    stage_busy: list  # stage_busy[row]: per-stage busy seconds of iteration `row` (a StageBusy)
    # (with keep_iterations=False both are a SpilledColumns: the summary's columns only)
    decisions: list  # (time_s, slot, old_chunk, new_chunk, reason)
    moves: list  # (time_s, slot, req_id, action, where)
    kv_capacity_tokens: int
    kv_peak_tokens: int
    max_running_requests: int
    end_s: float
    iteration_overhead_s: float
    extras: dict = field(default_factory=dict)
    host_s: list = field(default_factory=list)  # per iteration: host time before the stages start
    # the peak KV the requests hold (kv_peak_tokens less a prefix cache's evictable tokens; Pipeline.kv_peak_active)
    kv_peak_active_tokens: int | None = None


def build_latency(cfg: RunConfig, placement=None):
    lat, pp = cfg.latency, cfg.parallel.pp
    if lat.kind == "constant":
        return ConstantLatencyModel(pp, lat.stage_ms, lat.overhead_ms)
    profile = load_profile_cached(lat.profile_path())
    if lat.overrides:
        from sim.latency.analysis import with_overrides

        profile = with_overrides(profile, **lat.overrides)
    if profile.tp != cfg.parallel.tp:
        raise ConfigError(
            f"config [parallel] tp = {cfg.parallel.tp} but profile {lat.profile} is for tp = {profile.tp}"
        )
    check_profile_ep(cfg.parallel.ep or 1, profile.meta, str(lat.profile))
    return ProfiledLatencyModel(profile, pp, noise_cv=lat.noise_cv, seed=cfg.seed, variance=lat.variance,
                                placement=placement)


_PROFILES: dict[tuple, Profile] = {}


def load_profile_cached(path) -> Profile:
    """`Profile.load`, once per process for each profile folder (sweeps run many points on one
    profile). Keyed by the folder and its files' modification times, so an edited profile is
    read again; profiles are read-only data, so sharing one between runs changes no result."""
    folder = Path(path).resolve()
    stamp = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())) \
        if folder.is_dir() else ()
    key = (str(folder), stamp)
    profile = _PROFILES.get(key)
    if profile is None:
        profile = Profile.load(path)
        if stamp:
            _PROFILES[key] = profile
    return profile


def hardware(cfg: RunConfig, latency) -> Hardware:
    """What the engine's defaults depend on, read from the profile's metadata."""
    meta = getattr(getattr(latency, "profile", None), "meta", None) or {}
    spec = str(meta.get("roofline", {}).get("gpu_spec") or meta.get("profile", {}).get("gpu_spec") or "")
    mem = meta.get("memory", {}).get("gpu_mem_gib", 0.0)
    return Hardware(gpu_spec=spec, gpu_mem_gib=float(mem or 0.0), tp=cfg.parallel.tp, pp=cfg.parallel.pp)


def check_settings(settings: EngineSettings, name: str) -> None:
    """An engine's resolved settings within the ranges the pipeline needs (a plug-in engine's
    `settings` may return anything): a one-line PluginError naming the engine, not a crash later."""
    from sim.core.checks import number
    from sim.core.errors import PluginError
    from sim.engine.schedulers import schedulers

    origin = schedulers.origin(name) if name in schedulers.names() else "?"
    where = f"engine {name!r} ({origin}): its settings()"
    number(settings.token_budget, where, "token_budget", 1, 1 << 40, integer=True, error=PluginError)
    number(settings.max_running, where, "max_running", 0, 1 << 24, integer=True, error=PluginError)


# The smallest KV pool that holds a request: max_req_len = pool - 1, a prompt of max_req_len - 5 >= 1.
MIN_POOL_TOKENS = 7


def pool_sizes(cfg: RunConfig, latency, eng=None, settings: EngineSettings | None = None,
               hw: Hardware | None = None) -> tuple[int, int, int, int]:
    """(kv tokens per stage, max_running_requests, max_req_len, max_req_input_len), as the
    engine sizes them (FastPP and SGLang: SGLang's profile_max_num_token and max_running_requests;
    vLLM: its gpu_memory_utilization share less the activations of a full step)."""
    sc = cfg.scheduler
    model_ctx = getattr(getattr(latency, "profile", None), "context_length", None)
    ctx = sc.context_length_tokens
    if model_ctx and ctx > model_ctx and ctx == DEFAULT_CONTEXT_TOKENS:
        ctx = model_ctx  # the default never exceeds the model's own context (the engines default to it)
    elif model_ctx and ctx > model_ctx:  # (a prompt beyond the context is cut to it, warned)
        raise ConfigError(f"config [scheduler] context_length_tokens = {sc.context_length_tokens} exceeds the model's "
                          f"context length {model_ctx} (profile {cfg.latency.profile}: [model] context_length_tokens); "
                          f"allowed: <= {model_ctx}")
    kv = sc.kv_tokens
    frac = sc.mem_fraction
    if frac is None and eng is not None and hasattr(eng, "mem_fraction"):
        frac = eng.mem_fraction(settings, hw)
    if kv == 0:
        if frac is None and hasattr(latency, "kv_capacity_tokens"):
            # (a plug-in engine without a default share of memory: the config must say it)
            raise ConfigError(f"config [scheduler] mem_fraction: engine {sc.engine!r} has no default (it has no "
                              f"mem_fraction(settings, hw) method); allowed: mem_fraction in (0, 1], or kv_tokens")
        if not hasattr(latency, "kv_capacity_tokens") or latency.kv_capacity_tokens(frac) is None:
            raise ConfigError("config [scheduler] kv_tokens must be set when the latency model has no memory model")
        reduce = getattr(eng, "kv_reduce", "mean")  # FastPP: the mean of ranks 0 and 1; others: the min
        kv = latency.kv_capacity_tokens(frac, reduce) if reduce != "mean" else latency.kv_capacity_tokens(frac)
        if eng is not None and hasattr(eng, "kv_reserved_tokens"):
            kv -= eng.kv_reserved_tokens(settings, latency, hw)
    if kv <= 0:
        # (at mem_fraction 1 no larger fraction fits: only more GPUs, or fewer reserved tokens, do)
        larger = "a larger mem_fraction (<= 1), pp or tp" if frac is None or frac < 1 else "a larger pp or tp"
        raise ConfigError(f"config [scheduler] mem_fraction = {frac}: the model does not fit in GPU "
                          f"memory at pp = {cfg.parallel.pp}, tp = {cfg.parallel.tp} (profile {cfg.latency.profile}: "
                          f"KV pool <= 0 tokens); allowed: {larger}")
    before_blocks = kv
    if eng is not None and hasattr(eng, "pool_tokens"):
        kv = eng.pool_tokens(kv, sc)  # vLLM: whole blocks, less V1's null block
    max_num_reqs = min(max(int(kv / ctx * 512), 2048), 4096)
    if settings is not None and settings.engine.startswith("vllm"):
        max_running = settings.max_running  # max_num_seqs: a count limit, not derived from the pool
    else:
        max_running = sc.max_running_requests or min(kv // 2, max_num_reqs + 1)
    max_req_len = min(ctx - 1, kv - 1)
    if max_req_len - 5 < 1:
        # SGLang's limits (scheduler.py: max_req_len = min(context_len - 1, max_total_num_tokens - 1),
        # max_req_input_len = max_req_len - 5): a pool this small holds no prompt at all, and every
        # request would "finish" with a prompt of 0 or fewer tokens
        given = (f"kv_tokens = {sc.kv_tokens}" if sc.kv_tokens else
                 f"mem_fraction = {frac} (profile {cfg.latency.profile})")
        need, blocks = MIN_POOL_TOKENS, ""
        if before_blocks != kv:  # vLLM: the pool counts whole blocks, less V1's null block
            while eng.pool_tokens(need, sc) < MIN_POOL_TOKENS:
                need += 1
            blocks = f" ({max(kv, 0)} in the engine's whole {sc.block_size_tokens}-token blocks)"
        raise ConfigError(f"config [scheduler] {given}: a KV pool of {before_blocks} token(s) per stage{blocks} "
                          f"cannot hold one request, which needs at least {MIN_POOL_TOKENS} (a 1-token prompt, its "
                          f"output token and the 5 the engine keeps in reserve); allowed: kv_tokens >= {need}, or 0 "
                          f"to size the pool from the profile's memory")
    return kv, max_running, max_req_len, max_req_len - 5


def run(cfg: RunConfig, requests: list[RequestSpec] | RequestArrays | None = None,
        keep_iterations: bool = True, alt_slos: tuple = (), itls: bool = True) -> RunResult:
    """Simulate one run. `requests` overrides the config's workload (used by sweeps).

    `keep_iterations=False` keeps only the per-iteration columns the summary reads, in
    temporary files (`ppsim run --no-iterations`): `iterations_frame` is then unavailable.

    `itls=False` keeps no inter-token gaps: the summary then has no `*_itl_ms` statistics and
    requests.csv no `max_itl_ms` (NaN), for callers that read neither (sweeps).

    `alt_slos`: other SLOs this run is also simulated for, in lock step (sim/engine/lockstep.py;
    one replica only). `extras["alternates"][i]` tells whether this run is exactly the run of
    `cfg` with `alt_slos[i]` (every decision agreed and its early-stop guard never tripped)."""
    load_plugins(cfg.plugins.modules)  # idempotent; this is how worker processes get them
    if requests is None:
        requests = build_workload(cfg.workload, seed=cfg.seed)
    client_spec = workload_client(cfg.workload)
    driven = client_spec is not None and client_spec.drives_arrivals
    if cfg.disaggregation is not None and cfg.frontend is not None and cfg.frontend.enabled:
        raise ConfigError("config [frontend] enabled = true: the API server's share is not modelled with "
                          "[disaggregation] (its router and two servers); allowed: enabled = false, or no [frontend]")
    if cfg.disaggregation is not None:  # prefill and decode pools (sim/engine/disagg.py)
        from sim.engine.disagg import run_disaggregated

        client = None
        if driven:
            # the client loop sends into the prefill pool and hears each finish from the decode pool
            from sim.engine.client import Client
            from sim.core.rng import stream

            arrays = RequestArrays.of(requests)
            ready_s = client_spec.ready_s(arrays.arrival_s)
            requests = replace(arrays, arrival_s=np.full(len(arrays), np.inf))

            def client(env, table, send, close):
                return Client(env, table, ready_s, client_spec.think_s(len(table), stream(cfg.seed, "think")),
                              client_spec.slots, client_spec.request_timeout_s, send, close)
        result = run_disaggregated(cfg, requests, keep_iterations=keep_iterations, alt_slos=alt_slos, itls=itls,
                                   client=client)
        result.extras["client"] = client_spec  # an open-loop client's timeouts (sim/outputs/metrics.py)
        return result
    arrays = RequestArrays.of(requests)
    ready_s = None
    if driven:
        # send times depend on completions: the client process (sim/engine/client.py) writes each
        # request's arrival when it sends it; unsent rows hold inf (not arrived)
        ready_s = client_spec.ready_s(arrays.arrival_s)
        arrays = replace(arrays, arrival_s=np.full(len(arrays), np.inf))
    del requests  # the arrays hold the workload; a list of RequestSpec is ~150 bytes a request
    latency = build_latency(cfg)
    placed, latencies = None, None
    if cfg.cluster is not None:  # multi-node: each replica costs its own placement (sim/engine/cluster.py)
        from sim.engine.cluster import place_run

        placed, latencies = place_run(cfg, latency, lambda comm: build_latency(cfg, comm))
        latency = latencies[0]
    sc = cfg.scheduler
    eng = engine_for(sc.engine)
    hw = hardware(cfg, latency)
    settings = eng.settings(sc, hw)
    check_settings(settings, sc.engine)
    if sc.rebalancer is not None and sc.engine != "fastpp":
        raise ConfigError(f"config [scheduler.rebalancer]: a rebalancer moves requests between FastPP's micro-batch "
                          f"slots; engine {sc.engine!r} has none; allowed: engine = 'fastpp', or no rebalancer")
    kv, max_running, max_req_len, max_input = pool_sizes(cfg, latency, eng, settings, hw)
    frontend = build_frontend(cfg, settings)
    sent_s = None
    if frontend is not None:
        # the client's send times stay the requests' arrival_s; the scheduler sees each one when
        # the API server has received and tokenized it (sim/latency/frontend.py)
        sent_s = arrays.arrival_s
        if driven:
            sent_s = sent_s.copy()  # the client writes both as it sends
        else:
            arrays = replace(arrays, arrival_s=frontend.server_arrivals(sent_s, arrays.prompt_tokens))
    budget = settings.token_budget
    # start-up profiling draws from its own streams, so it never shifts the run's draws
    make_noise = getattr(latency, "make_noise", None)
    startup_noise = make_noise("startup") if make_noise else None
    def context_of(slo, noise) -> PolicyContext:
        return PolicyContext(
            num_stages=cfg.parallel.pp, slo_ttft_s=slo.ttft_ms / 1e3, slo_tpot_s=slo.tpot_ms / 1e3,
            launch_chunk_tokens=budget, kv_capacity_tokens=kv,
            startup_profile=lambda c: startup_profile(latency, c, kv, max_req_len, noise=noise),
            context_length_tokens=sc.context_length_tokens,
        )

    context = context_of(cfg.slo, startup_noise)
    params = dict(sc.chunk_policy.params)
    if sc.chunk_policy.name == "static":
        params.setdefault("chunk_size_tokens", budget)

    def build_policies(ctx=context):
        """A fresh chunk controller (and rebalancer): every replica runs its own instances."""
        policy = build_chunk_policy(sc.chunk_policy.name, params, ctx, "config [scheduler.chunk_policy]")
        rebalancer = None
        if sc.rebalancer is not None:
            rebalancer = build_rebalancer(sc.rebalancer.name, dict(sc.rebalancer.params), ctx,
                                          "config [scheduler.rebalancer]")
        return policy, rebalancer

    # requests become Req objects when they arrive and leave for the table's columns when
    # they finish (sim/engine/requests.py)
    table = RequestTable(arrays, max_input, max_req_len, itls=itls, sent_s=sent_s, frontend=frontend)
    env = simpy.Environment()
    n = cfg.parallel.replicas
    requested = len(alt_slos)  # each gets its verdict, False where none can be given
    alt_slos = tuple(alt_slos) if n == 1 else ()

    if cfg.slo.stop_when_met and alt_slos:
        raise ConfigError("[slo] stop_when_met: a run that stops once certain to meet its SLO cannot stand for "
                          "other SLOs in lock step (alt_slos)")

    def guard_of(slo):
        if not slo.stop_when_violated:
            return None
        f = slo.stop_factor / 1e3
        # certain to meet: only where the full run's every request arrives and one pool holds them
        met = slo.stop_when_met and n == 1 and not cfg.horizon_s and not driven
        return SLOGuard(table, slo.ttft_ms * f, slo.tpot_ms * f, slo.ttft_percentile, slo.tpot_percentile,
                        None if slo.e2e_ms is None else slo.e2e_ms * f, slo.e2e_percentile,
                        kv_tokens=kv if met else None)

    guard = guard_of(cfg.slo)
    lockstep = None
    if alt_slos:
        guard = LockstepGuard(guard, [guard_of(s) for s in alt_slos])
        lockstep = Lockstep([0.5 * s.tpot_ms / 1e3 for s in alt_slos], rebalanced=sc.rebalancer is not None)
    on_finish = table.finish
    if guard is not None:
        def on_finish(req, guard=guard):
            guard.finished(req)
            table.finish(req)
    client = None
    if driven:
        from sim.engine.client import Client
        from sim.core.rng import stream

        finish_table = on_finish

        def on_finish(req, finish_table=finish_table):
            finish_table(req)
            client.finished(req)
    pipes = []
    for i in range(n):
        policy, rebalancer = build_policies()
        if lockstep is not None:
            # each alternate profiles on a fresh start-up stream, as its own run would
            alts = [build_policies(context_of(s, make_noise("startup") if make_noise else None)) for s in alt_slos]
            policy = LockstepChunkPolicy(policy, [a[0] for a in alts], lockstep)
            if rebalancer is not None:
                rebalancer = LockstepRebalancer(rebalancer, [a[1] for a in alts], lockstep)
        sched = eng.build(settings, cfg.parallel.pp, kv, max_running, policy.initial_chunk(), cfg.server.on_kv_exhausted,
                          sc)
        sched.on_finish = on_finish
        if cfg.server.host_time == "profile":
            sched.host_cost = None  # the profile's cpu_ms + cpu_per_request_us, not the version's model
        inbox = Inbox(env, table) if n == 1 and not driven else Inbox(env)
        pipes.append(Pipeline(env, sched, latencies[i] if latencies else latency, policy, inbox, cfg.horizon_s,
                              rebalancer=rebalancer,
                              slo_tpot_s=context.slo_tpot_s, guard=guard,
                              noise=make_noise("latency" if i == 0 else f"latency-replica{i}") if make_noise else None,
                              alone=n == 1 and not driven))  # a client is a second process
        if not keep_iterations:
            pipes[-1].log.spill = True  # before its first record: the summary's columns go to files
    if driven:
        def send(req):
            target = pick_replica(req.row, pipes, cfg.parallel.router)
            req.replica = target
            pipes[target].inbox.push(req)

        def close():
            for p in pipes:
                p.inbox.close()

        client = Client(env, table, ready_s, client_spec.think_s(len(table), stream(cfg.seed, "think")),
                        client_spec.slots, client_spec.request_timeout_s, send, close, frontend)
    elif n > 1:
        env.process(route(env, table, pipes, cfg.parallel.router))
    # The objects alive before the simulation (imported modules, the workload, profiles, a sweep
    # worker's caches) are left out of the collector's full passes while it runs: they survive
    # them all, and each full pass would walk them again (about 6% of a long run).
    gc.freeze()
    try:
        if pipes[0].proc is None:
            pipes[0].run_alone()  # no router, no client: the pipeline is the clock's only process
        else:
            env.run(until=env.all_of([p.proc for p in pipes]))
    finally:
        gc.unfreeze()
    table.close()
    failed = [p for p in pipes if p.status == "failed"]
    stopped = [p for p in pipes if p.status in ("stopped", "met")]
    log = IterationLog.merge([p.log for p in pipes], cfg.parallel.pp)
    decisions, moves = [], []
    for p in pipes:
        decisions.extend(p.decisions)
        moves.extend(p.move_log)
    return RunResult(
        config=cfg, status="failed" if failed else stopped[0].status if stopped else "ok",
        reason=(guard.reason if stopped and not failed else
                "; ".join(f"replica {pipes.index(p)}: {p.reason}" if n > 1 else p.reason for p in failed)),
        requests=table, iterations=log.columns, stage_busy=log.stage_busy, decisions=decisions, moves=moves,
        kv_capacity_tokens=kv, kv_peak_tokens=max(p.kv_peak for p in pipes), max_running_requests=max_running,
        kv_peak_active_tokens=max(p.kv_peak_active for p in pipes),
        end_s=env.now, iteration_overhead_s=latency.iteration_overhead_s,
        host_s=log.columns["host_s"] if keep_iterations else [],
        extras={"stage_layers": list(getattr(latency, "layers", [])),
                "engine": settings,
                "client": client_spec,  # the client loop (sim/workloads/client.py); None: open loop
                **({"frontend": frontend} if frontend is not None else {}),
                "engine_events": sorted(e for p in pipes for e in getattr(p.sched, "events", [])),
                "prefix_cache": _cache_stats(pipes) if settings.prefix_cache else None,
                "num_kv_exhausted": sum(p.sched.kv_exhausted_events for p in pipes),
                # with a static chunk: this run is exactly the run at any chunk >= chunk_need
                # unless the budget ever bound (sim/engine/schedulers/fastpp.py)
                "chunk_bound": any(p.sched.chunk_bound for p in pipes),
                "chunk_need": max(p.sched.chunk_need for p in pipes),
                "alternates": ([a and not t for a, t in zip(lockstep.alive, guard.tripped)]
                               if lockstep is not None else [False] * requested),
                **({"cluster": placed.describe(), "cluster_warnings": placed.warnings} if placed else {})},
    )


def build_frontend(cfg: RunConfig, settings: EngineSettings):
    """The run's API-server model (sim/latency/frontend.py), None when off."""
    from sim.latency.frontend import check_frontend, frontend_of

    check_frontend(cfg.frontend, settings.engine, settings.version)
    return frontend_of(cfg.frontend, settings.engine, settings.version)


def _cache_stats(pipes) -> dict:
    """The prefix caches' counts, summed over the replicas (sim/engine/schedulers/cached.py)."""
    keys = ("hit_tokens", "saved_tokens", "admitted_prompt_tokens", "evicted_tokens")
    return {k: sum(getattr(p.sched, k, 0) for p in pipes) for k in keys}


def route(env: simpy.Environment, table: RequestTable, pipes: list[Pipeline], policy: str):
    """The router: sends each request, when it arrives, to one replica (its `Req` is made then).

    `round-robin` cycles through the replicas; `least-loaded` picks the replica with the
    fewest outstanding requests (queued, waiting or running), ties to the lowest index."""
    arrival = table.arrival_s
    for i in range(len(table)):
        arrival_s = float(arrival[i])
        if arrival_s > env.now:
            yield env.timeout(arrival_s - env.now)
        req = table.make(i)
        target = pick_replica(i, pipes, policy)
        req.replica = target
        pipes[target].inbox.push(req)
    for p in pipes:
        p.inbox.close()


def pick_replica(i: int, pipes: list[Pipeline], policy: str) -> int:
    """The router's choice for the i-th request (see `route`)."""
    if len(pipes) == 1:
        return 0
    if policy == "round-robin":
        return i % len(pipes)
    loads = [len(p.inbox) + len(p.sched.waiting) + p.sched.num_active for p in pipes]
    return loads.index(min(loads))


def startup_profile(latency, chunk: int, kv_tokens: int, max_req_len: int,
                    warmup: int = 3, repeats: int = 5, noise=None) -> float:
    """The artifact's start-up profiling of a candidate chunk, run on the ground truth as a
    black box: in steady state every stage holds a pure `chunk`-token prefill (one request a
    step, each finishing after one token), so one iteration costs the slowest stage plus the
    iteration's host time. Mean of `repeats` measurements after `warmup` (variance included,
    drawn from the start-up streams, when the ground truth has variance). Returns nan for an infeasible chunk (the artifact skips it)."""
    if chunk > kv_tokens or chunk > max_req_len:
        return float("nan")
    stats = BatchStats.prefill(chunk)
    times = latency.stage_times(stats)
    overhead_of = getattr(latency, "overhead_s", None)
    host = latency.iteration_overhead_s if overhead_of is None else overhead_of(stats)
    samples = []
    for _ in range(warmup + repeats):
        if noise is None:
            samples.append(max(times) + host)
        else:
            factors, stall_s = noise.next()
            samples.append(max(t * f for t, f in zip(times, factors)) + host + stall_s)
    return sum(samples[warmup:]) / repeats
