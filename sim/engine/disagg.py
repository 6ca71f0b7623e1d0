"""Disaggregated prefill/decode serving (issue 34): a prefill pool and a decode pool of lock-step
pipelines (`[disaggregation]`, sim/core/cluster_config.py), the prompt's KV cache shipped from one to the
other over the cluster's links.

Each instance is the co-located engine's own `Pipeline` and the scheduler of `[scheduler] engine`: FastPP's,
SGLang 0.5.23's or vLLM V1's, in its prefill or decode role (sim/engine/schedulers/roles.py; any TP x PP: PP
inside either pool works), placed on the `[cluster]` with the two pools one after the other
(`sim.latency.cluster.place`); its stages' sends and all-reduces are costed by where they sit
(sim/engine/cluster.py). A request's life:

1. **Routing.** When it arrives, a router per pool picks its prefill instance and its decode instance
   (`round-robin`, or `least-loaded`: fewest requests routed there and not done), as SGLang's load
   balancer picks the pair up front (sglang `python/sglang/srt/disaggregation/mini_lb.py`).
2. **Prefill.** The prefill instance runs it as a request of one output token (vLLM's proxy sends the
   prefill with `max_tokens = 1`, vllm `benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py`),
   chunked by the pool's chunk policy. When its prefill finishes the instance keeps its KV (the tokens
   stay allocated in its pool) until the decode side holds it.
3. **Decode pre-allocation.** (fastpp, sglang) Once its prefill has started, the decode instance reserves the prompt's KV
   in its own pool as soon as it has room for the prompt plus `decode_reserve_tokens` (default 512) for
   every request it holds or receives, first come first served: SGLang's decode `PreallocQueue`
   (`_allocatable_tokens`: free tokens less `num_reserved_decode_tokens` x (running + transfer + waiting),
   sglang `python/sglang/srt/disaggregation/decode.py`). A prompt that cannot fit an empty decode pool
   fails the run with the reason.
   (vllm-v1) vLLM's proxy sends the decode request once the prefill has returned, and the decode instance's
   scheduler allocates the prompt's blocks when it admits it, with no reserve, while fewer than
   `max_num_seqs` requests run (a request loading remote KV is not running), first come first served (vllm
   0.10.1.1 `v1/core/sched/scheduler.py` `Scheduler.schedule`: `allocate_slots(request, num_new_tokens +
   num_external_computed_tokens, ..., delay_cache_blocks=load_kv_async)`, then `WAITING_FOR_REMOTE_KVS`).
   Here the allocation is made at the event (the prefill's end, a request leaving), not at the next step.
4. **Transfer.** The KV bytes: each decode stage's layers from the prefill stages that hold them, each
   destination TP shard's heads from a source shard holding them (`ClusterModel.kv_transfer_links`:
   2 x layers x KV heads per shard x head_dim x dtype bytes x prompt tokens). The transfer occupies the
   links it uses (each GPU's NIC out and in, or its NVLink inside a node, one queue per link, first booked
   first served) for alpha + the busiest link's bytes / bandwidth.
   - `kv_transfer = "after_prefill"` (vLLM's NIXL/Mooncake connectors, SGLang's default "forward then
     send", DistServe's block migration): it starts when the prefill has ended, the decode side has
     pre-allocated and its links are free.
   - `"layerwise"` (Splitwise's per-layer transfer during the prompt phase; SGLang's layer-wise NIXL
     path): it streams while the prefill computes, from its first chunk on (once pre-allocated and the
     links are free), and ends no earlier than the prefill's end plus the last layer's share
     (1 / layers of the busiest link's time) and alpha: only that tail and the link queueing are exposed.
     The stream's link time is booked when the prefill ends (links are booked in that order).
   - `"chunked"` (SGLang 0.5.23's sends, `disaggregation/prefill.py`: `process_prefill_chunk` calls
     `send_kv_chunk` for each chunk of a chunked prompt as its forward is done, `process_batch_result_
     disagg_prefill` the last chunk): chunk j's share of the bytes leaves when it is computed (taken as when
     chunk j + 1 is scheduled; the prefill's end for the last), after the chunks before it, once pre-allocated
     and the links are free (`DisaggRun._chunked_end`): a one-chunk prompt ships after its prefill.
5. **Hand-off.** When the KV has arrived the decode instance holds it (its reservation becomes the
   request's), and only then does the prefill instance free its copy: a request's KV has one owner at a
   time. The request joins the decode instance's running requests at its next micro-batch (as a decode:
   one token at its context). `DisaggRun.audit` checks this ledger: every instance's pool equals, token
   for token, what its owned requests, held prefills, pre-allocations and in-flight decode slots account
   for (`DisaggRun(audit=True)` runs it after every event of the simulation; tests/test_disagg.py, with a
   planted early free that it catches).
6. **First token** (`first_token`):
   - `"decode"` (vLLM's disaggregated proxy streams the decode instance's output; Dynamo's clients read
     the decode server): token 1 comes from the decode instance's first step after the KV
     arrived (vLLM's connectors recompute the last prompt token, `num_computed_tokens = num_tokens - 1`),
     so TTFT includes the prefill, the transfer and the decode side's first step. Every output token is
     decoded on the decode side.
   - `"prefill"` (DistServe's context stage emits token 1 at `ContextEnd`, before migration; Splitwise's
     prompt phase produces it): TTFT ends with the prefill, and the transfer and the decode side's
     queueing fall into the gap between tokens 1 and 2 (in TPOT and the ITLs). A one-token output
     finishes at the prefill instance without a transfer.
   - `"transfer"` (SGLang 0.5.23: the prefill server samples token 1 and ships it with the KV; the
     decode server appends it when the transfer completes (`disaggregation/decode.py`, the handoff's
     `output_ids.append`) and streams it from a "prebuilt" batch that runs no forward pass
     (`batch_result_processor.py` `process_batch_result_prebuilt`), before the request's first decode
     step): token 1 at the KV's landing, token 2 from the decode side's next micro-batch. A one-token
     output finishes at the landing. (SGLang sends a chunked prompt's KV chunk by chunk: with
     `kv_transfer = "layerwise"` the transfer streams during the prefill.)
7. Decoding as in a co-located instance of the engine (KV exhaustion retracts, or preempts in vLLM: the
   request is prefilled again on its decode instance). A landed request joins the running requests of the
   next micro-batch: FastPP's paused list; SGLang's prebuilt batch (`disaggregation/decode.py`
   `_get_new_prebuilt_batch`: up to `max_running_requests` less those running, per micro-batch with PP);
   vLLM's first step after the KV arrived computes the last prompt token (`_update_waiting_for_remote_kv`:
   `num_computed_tokens = num_tokens - 1`), modelled as a decode of one token at its context, while fewer
   than `max_num_seqs` run.

Each engine's hand-off, as `ppsim plan --max-gpus` deploys it (sim/studies/cluster_plan.py `handoff`):
SGLang `kv_transfer = "chunked"`, `first_token = "transfer"`; vLLM `"after_prefill"`, `"decode"` (its
NIXL connector's decode side reads the blocks after the prefill, which frees them only then:
`kv_connector/v1/nixl_connector.py` `NixlConnectorScheduler.request_finished` returns `delay_free_blocks`).
A `[disaggregation]` table may set any combination with any engine.

Records: every request has one row in requests.csv (with `prefill_instance`, `decode_instance`,
`kv_transfer_ms`: from the prefill's end, or the pre-allocation if later, to the KV's arrival: link
queueing and the exposed transfer; `kv_wait_ms`: from the prefill's end to the decode side's
pre-allocation, when it came later). The iterations of all instances are in one table, prefill
instances first (`replica` = the instance's number over both pools; summary.json's `disaggregation` and the
timeline name them), stages beyond an instance's PP empty; they are kept in memory (`run(keep_iterations=
False)` does not spill them, as the pools' stage counts may differ).

Not modelled: Dynamo's conditional disaggregation (short prompts prefilled on the decode side), KV-aware
routing, prefix caches (off in both pools for every engine; `prefix_cache = true` is refused), control-plane
latency (handshakes, polling, bootstrap), a decode instance's own prefills interfering beyond re-prefills after
retraction, vLLM V0 (0.6.3.post1 has no disaggregated prefill; refused), SGLang's optimistic prefill before
bootstrap. With a horizon the run stops at it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import replace
from pathlib import Path

import simpy

from sim.core.config import ParallelConfig, PolicySpec, RunConfig
from sim.core.errors import ConfigError
from sim.core.lazy import lazy
from sim.engine.cluster import PlacedRun, place_pools
from sim.engine.pipeline import Inbox, Pipeline, SLOGuard
from sim.engine.records import IterationLog
from sim.engine.requests import RequestArrays, RequestTable
from sim.engine.schedulers.fastpp import Scheduler
from sim.engine.state import FINISHED, RUNNING, Req
from sim.policies import PolicyContext
from sim.policies.guards import build_chunk_policy
from sim.latency.cluster import PoolShape, kv_transfer_bytes, model_of_profile

np = lazy("numpy")

POOLS = ("prefill", "decode")


from sim.engine.schedulers.roles import DecodeScheduler, PrefillScheduler, build_role  # noqa: E402


class DisaggFailed(Exception):
    """The deployment cannot go on (a prompt larger than an empty decode pool)."""


class KVLedgerError(AssertionError):
    """The KV audit found a pool whose tokens do not add up to its capacity when each request's KV is owned
    by one side only, or a request counting tokens on a side that does not own its KV (`DisaggRun.audit`)."""


class Flow:
    """One request's way through the two pools (times in seconds; nan until it happens)."""

    __slots__ = ("req", "shadow", "p", "d", "tokens", "start_s", "prefilled_s", "ready_s", "xfer_start_s",
                 "landed_s", "link_wait_s", "bytes", "chunks")

    def __init__(self, req: Req, shadow: Req, p: int, d: int) -> None:
        self.req, self.shadow, self.p, self.d = req, shadow, p, d
        self.tokens = shadow.prompt_len
        nan = math.nan
        self.start_s = self.prefilled_s = self.ready_s = self.xfer_start_s = self.landed_s = nan
        self.link_wait_s = nan
        self.bytes = 0
        self.chunks: list[tuple[float, int]] = []  # (scheduled at, tokens) of each prefill chunk


class Instance:
    def __init__(self, pool: str, index: int, pipe: Pipeline, sched: Scheduler, latency, comm) -> None:
        self.pool, self.index, self.pipe, self.sched, self.latency, self.comm = pool, index, pipe, sched, latency, comm
        self.routed = 0  # requests routed here and not done (the least-loaded router's count)
        self.queue: deque[Flow] = deque()  # decode: waiting for pre-allocation
        self.in_flight = 0  # decode: pre-allocated, KV not yet arrived
        self.held = 0  # prefill: tokens of finished prefills kept for their transfer

    @property
    def name(self) -> str:
        return f"{self.pool} {self.index}"


def sibling_profile(base: str, tp: int) -> str:
    """The [latency] profile's folder for another TP degree (`.../tp4` -> `.../tp8`)."""
    p = Path(base)
    if p.name.startswith("tp") and p.name[2:].isdigit():
        return str(p.parent / f"tp{tp}")
    return base


def pool_config(cfg: RunConfig, name: str) -> RunConfig:
    """The run config one instance of pool `name` runs as (its TP x PP, profile, chunk settings)."""
    pool = getattr(cfg.disaggregation, name)
    sc = cfg.scheduler
    prof = pool.profile or sibling_profile(cfg.latency.profile, pool.tp)
    policy = sc.chunk_policy
    if pool.chunk_policy:
        policy = PolicySpec(name=pool.chunk_policy["name"], params=dict(pool.chunk_policy.get("params", {})))
    sc = replace(sc, chunk_size_tokens=pool.chunk_size_tokens or sc.chunk_size_tokens, chunk_policy=policy,
                 kv_tokens=pool.kv_tokens or sc.kv_tokens,
                 max_running_requests=pool.max_running_requests or sc.max_running_requests, rebalancer=None,
                 prefix_cache=False if sc.engine != "fastpp" else sc.prefix_cache)
    return replace(cfg, parallel=ParallelConfig(pp=pool.pp, tp=pool.tp, replicas=pool.instances, router=pool.router),
                   scheduler=sc, latency=replace(cfg.latency, profile=prof), disaggregation=None)


ENGINES = ("fastpp", "sglang", "vllm-v1")  # the schedulers disaggregated pools run (module docstring)


def check_pools(cfg: RunConfig) -> dict[str, RunConfig]:
    """Each pool's run config, or a one-line ConfigError naming the field."""
    sc = cfg.scheduler
    if getattr(sc, "engine", "fastpp") not in ENGINES:
        raise ConfigError(f"config [scheduler] engine = {sc.engine!r}: not modelled with [disaggregation] (vLLM "
                          f"0.6.3.post1, vllm-v0, has no disaggregated prefill; plug-in engines have no roles); "
                          f"allowed: engine = {', '.join(repr(e) for e in ENGINES)}")
    if sc.engine != "fastpp" and sc.prefix_cache:
        raise ConfigError(f"config [scheduler] prefix_cache = true with [disaggregation]: prefix caches in "
                          f"disaggregated pools are not modelled; allowed: prefix_cache = false (or unset)")
    if sc.rebalancer is not None:
        raise ConfigError("config [scheduler.rebalancer]: not supported with [disaggregation] (decode instances "
                          "admit requests through the paused list); allowed: no rebalancer")
    if cfg.latency.kind != "profile":
        raise ConfigError("config [disaggregation]: the pools need profiled latency models; allowed: "
                          "[latency] kind = \"profile\"")
    out = {}
    for name in POOLS:
        pc = pool_config(cfg, name)
        path = pc.latency.profile_path()
        if not (path / "meta.toml").is_file():
            raise ConfigError(f"config [disaggregation.{name}] profile: {pc.latency.profile} does not exist (tp = "
                              f"{pc.parallel.tp}); allowed: a profile folder for TP{pc.parallel.tp} "
                              f"(profile = \"...\")")
        out[name] = pc
    return out


def same_model_and_gpu(pool_cfgs: dict[str, RunConfig]) -> None:
    """Refuse pools whose profiles are of different models or GPUs: the KV transfer is costed
    with one model's shapes and the cluster placed for one GPU (the decode pool's profile), so
    heterogeneous pools (Splitwise-style) are not modelled; each pool may differ only in TP/PP."""
    from sim.engine.run import load_profile_cached
    from sim.latency.cluster import model_of_profile

    seen = {}
    for name in POOLS:
        pc = pool_cfgs[name]
        prof = load_profile_cached(pc.latency.profile_path())
        meta = prof.meta
        arch = model_of_profile(meta, str(prof.path / "meta.toml"))
        head = meta.get("profile") if isinstance(meta.get("profile"), dict) else {}
        roof = meta.get("roofline") if isinstance(meta.get("roofline"), dict) else {}
        gpu = str(roof.get("gpu_spec") or head.get("gpu_spec") or head.get("gpu") or "?")
        shapes = {k: v for k, v in dataclasses.asdict(arch).items() if k != "name"}
        seen[name] = (pc.latency.profile, arch.name, gpu, shapes)
    (pp, pm, pg, ps), (dp, dm, dg, ds) = seen["prefill"], seen["decode"]
    if ps != ds or pm != dm or pg != dg:
        what = "model" if (ps != ds or pm != dm) else "GPU"
        raise ConfigError(f"config [disaggregation.decode] profile {dp} ({dm} on {dg}) and [disaggregation.prefill] "
                          f"profile {pp} ({pm} on {pg}) differ in {what}: pools of different models or GPUs are not "
                          f"modelled (the KV transfer takes one model's shapes, the cluster one GPU); allowed: "
                          f"profiles of one model on one GPU, one for each pool's tp")


def run_disaggregated(cfg: RunConfig, requests, keep_iterations: bool = True, alt_slos: tuple = (),
                      itls: bool = True, client=None):
    """Simulate a disaggregated deployment; returns a `sim.engine.run.RunResult`."""
    return DisaggRun(cfg, RequestArrays.of(requests), itls).run(len(alt_slos), client)


class DisaggRun:
    """One disaggregated run. `audit=True` checks the KV ledger (`audit`) after every event of the
    simulation: slower, for tests."""

    def __init__(self, cfg: RunConfig, arrays: RequestArrays, itls: bool = True, audit: bool = False) -> None:
        from sim.engine.run import build_latency, check_settings, hardware, load_profile_cached, pool_sizes, \
            startup_profile
        from sim.engine.schedulers import engine as engine_of

        self.cfg = cfg
        dg = cfg.disaggregation
        self.dg = dg
        self.pool_cfgs = check_pools(cfg)
        base = load_profile_cached(self.pool_cfgs["decode"].latency.profile_path())
        shapes = [PoolShape(n, getattr(dg, n).instances, getattr(dg, n).tp, getattr(dg, n).pp) for n in POOLS]
        self.placed: PlacedRun = place_pools(cfg, shapes, base.meta, base.path)
        self.env = simpy.Environment()
        self.engine = getattr(cfg.scheduler, "engine", "fastpp")
        # vLLM's proxy sends the decode request once the prefill has returned, and its scheduler allocates the
        # prompt's blocks when it admits it (no reserve; fewer than max_num_seqs running); SGLang's decode
        # server pre-allocates while the prefill runs, keeping a reserve per request (module docstring)
        self.alloc_after_prefill = self.engine == "vllm-v1"
        sizes, lats, settings, budgets = {}, {}, {}, {}
        for name in POOLS:
            pc = self.pool_cfgs[name]
            prof = load_profile_cached(pc.latency.profile_path())
            if prof.tp != pc.parallel.tp:
                raise ConfigError(f"config [disaggregation.{name}] tp = {pc.parallel.tp} but profile "
                                  f"{pc.latency.profile} is for tp = {prof.tp}")
            by_key: dict = {}
            lats[name] = []
            for comm in self.placed.comms[name]:
                if comm.key not in by_key:
                    hook = comm if comm.spans_nodes or any(comm.crosses) else None
                    by_key[comm.key] = build_latency(pc, hook)
                lats[name].append(by_key[comm.key])
            if self.engine == "fastpp":
                sizes[name] = pool_sizes(pc, lats[name][0])
                budgets[name] = pc.scheduler.chunk_size_tokens
            else:  # the engine's own sizing and defaults, for the pool's TP x PP (sim/engine/run.py)
                eng = engine_of(self.engine)
                hw = hardware(pc, lats[name][0])
                settings[name] = eng.settings(pc.scheduler, hw)
                check_settings(settings[name], self.engine)
                sizes[name] = pool_sizes(pc, lats[name][0], eng, settings[name], hw)
                budgets[name] = settings[name].token_budget
        self.model = model_of_profile(base.meta, str(base.path / "meta.toml"))
        same_model_and_gpu(self.pool_cfgs)
        self.layers = {n: list(lats[n][0].layers) for n in POOLS}
        # a request must fit both pools: the stricter context limit truncates and clips for both
        self.max_req_len = min(sizes[n][2] for n in POOLS)
        self.max_input = self.max_req_len - 5
        self.table = RequestTable(arrays, self.max_input, self.max_req_len, itls=itls)
        slo = cfg.slo
        self.guard = None
        if slo.stop_when_violated:
            f = slo.stop_factor / 1e3
            self.guard = SLOGuard(self.table, slo.ttft_ms * f, slo.tpot_ms * f, slo.ttft_percentile,
                                  slo.tpot_percentile, None if slo.e2e_ms is None else slo.e2e_ms * f,
                                  slo.e2e_percentile)
        self.instances: dict[str, list[Instance]] = {}
        for name in POOLS:
            pc = self.pool_cfgs[name]
            kv, max_running = sizes[name][0], sizes[name][1]
            sc = pc.scheduler
            budget = budgets[name]
            params = dict(sc.chunk_policy.params)
            if sc.chunk_policy.name == "static":
                params.setdefault("chunk_size_tokens", budget)
            self.instances[name] = []
            for i, lat in enumerate(lats[name]):
                make_noise = getattr(lat, "make_noise", None)
                startup = make_noise(f"{name}{i}-startup") if make_noise else None
                ctx = PolicyContext(num_stages=pc.parallel.pp, slo_ttft_s=slo.ttft_ms / 1e3,
                                    slo_tpot_s=slo.tpot_ms / 1e3, launch_chunk_tokens=budget,
                                    kv_capacity_tokens=kv, context_length_tokens=sc.context_length_tokens,
                                    startup_profile=lambda c, lat=lat, kv=kv, noise=startup:
                                    startup_profile(lat, c, kv, self.max_req_len, noise=noise))
                if name == "prefill":
                    policy = build_chunk_policy(sc.chunk_policy.name, params, ctx,
                                                "config [disaggregation.prefill] chunk_policy")
                    if self.engine == "fastpp":
                        sched: Scheduler = PrefillScheduler(pc.parallel.pp, kv, max_running, policy.initial_chunk(),
                                                            cfg.server.on_kv_exhausted)
                    else:
                        sched = build_role(self.engine, "prefill", settings[name], pc.parallel.pp, kv, max_running,
                                           policy.initial_chunk(), cfg.server.on_kv_exhausted, sc)
                    sched.on_start = lambda shadow, now, i=i: self._started(shadow, now)
                    sched.on_chunk = self._chunk
                    sched.on_finish = lambda shadow, i=i: self._prefilled(shadow)
                else:
                    policy = build_chunk_policy("static", {"chunk_size_tokens": budget}, ctx,
                                                "config [disaggregation.decode]")
                    if self.engine == "fastpp":
                        sched = DecodeScheduler(pc.parallel.pp, kv, max_running, policy.initial_chunk(),
                                                cfg.server.on_kv_exhausted)
                    else:
                        sched = build_role(self.engine, "decode", settings[name], pc.parallel.pp, kv, max_running,
                                           policy.initial_chunk(), cfg.server.on_kv_exhausted, sc)
                    sched.on_finish = lambda req, i=i: self._decoded(req, i)
                pipe = Pipeline(self.env, sched, lat, policy, Inbox(self.env), cfg.horizon_s,
                                slo_tpot_s=slo.tpot_ms / 1e3, guard=self.guard,
                                noise=make_noise(f"{name}{i}-latency") if make_noise else None)
                self.instances[name].append(Instance(name, i, pipe, sched, lat, self.placed.comms[name][i]))
        self.flows: dict[int, Flow] = {}  # id(shadow) -> its flow, while prefilling
        self.by_row: dict[int, Flow] = {}
        self.link_free: dict = {}  # link -> the time its booked transfers end
        self.link_busy: dict = {}  # link -> seconds busy moving bytes
        self.transfers: list[tuple] = []  # (rid, prefill, decode, start_s, end_s, bytes) for the timeline
        self.unlanded = 0
        self.routed_all = False
        self.failure = ""
        self.stop = self.env.event()
        self.audit_on = audit
        self.on_finish = None  # a client loop's hook (sim/engine/client.py via run(client=...))
        # what the audits saw: checks made, and the requests seen waiting for the decode side's pre-allocation
        # with their finished prefill's KV held by the prefill instance (most at once, and which)
        self.audited = {"checks": 0, "most_waiting_on_prefill": 0, "waited_on_prefill": set()}

    # -- routing ----------------------------------------------------------------------------------------------
    def _pick(self, pool: str, k: int) -> int:
        inst = self.instances[pool]
        if getattr(self.dg, pool).router == "round-robin":
            return k % len(inst)
        loads = [x.routed for x in inst]
        return loads.index(min(loads))

    def _route(self):
        table, env = self.table, self.env
        arrival = table.arrival_s
        for k in range(len(table)):
            t = float(arrival[k])
            if t > env.now:
                yield env.timeout(t - env.now)
            self._send(table.make(k))
        self._routed_all()

    def _send(self, req: Req) -> None:
        """A request arrives: its prompt to a prefill instance (the router, or a client process)."""
        k = req.row
        shadow = Req(req.rid, req.arrival_s, req.orig_prompt_len, 1, self.max_input, self.max_req_len)
        shadow.keep_itls = False
        p, d = self._pick("prefill", k), self._pick("decode", k)
        flow = Flow(req, shadow, p, d)
        self.flows[id(shadow)] = flow
        self.by_row[k] = flow
        req.replica = d
        self.instances["prefill"][p].routed += 1
        self.instances["decode"][d].routed += 1
        self.unlanded += 1
        self.instances["prefill"][p].pipe.inbox.push(shadow)

    def _routed_all(self) -> None:
        for inst in self.instances["prefill"]:
            inst.pipe.inbox.close()
        self.routed_all = True
        self._maybe_close()

    def _direct(self, flow: Flow) -> bool:
        """A one-token output with token 1 from the prefill side finishes there (no transfer)."""
        return self.dg.first_token == "prefill" and flow.req.max_new <= 1

    # -- prefill side -------------------------------------------------------------------------------------------
    def _started(self, shadow: Req, now: float) -> None:
        flow = self.flows[id(shadow)]
        if not math.isnan(flow.start_s):  # (a shadow retracted and prefilled again started once)
            return
        flow.start_s = now
        req = flow.req
        req.admit_s = shadow.admit_s
        req.state = RUNNING
        if not self._direct(flow) and not self.alloc_after_prefill:
            dec = self.instances["decode"][flow.d]
            dec.queue.append(flow)
            self._admit(dec, now)

    def _chunk(self, shadow: Req, tokens: int, now: float) -> None:
        flow = self.flows.get(id(shadow))
        if flow is not None:
            flow.chunks.append((now, tokens))

    def _prefilled(self, shadow: Req) -> None:
        flow = self.flows.pop(id(shadow))
        now = self.env.now
        flow.prefilled_s = now
        req = flow.req
        req.num_chunks = shadow.num_chunks
        req.num_retractions += shadow.num_retractions
        pre = self.instances["prefill"][flow.p]
        pre.routed -= 1
        if self.dg.first_token == "prefill":
            req.out_len = 1
            req.first_token_s = req.last_token_s = now
        if self._direct(flow):  # done: nothing to ship
            req.finished = True
            req.state = FINISHED
            req.finish_s = now
            self.instances["decode"][flow.d].routed -= 1
            self.unlanded -= 1
            self._finish(req)
            self._maybe_close()
            return
        # the prefill instance keeps the prompt's KV (just freed by its scheduler) until the decode side holds it
        pre.sched.kv_free -= flow.tokens
        pre.held += flow.tokens
        if self.alloc_after_prefill:  # the decode request reaches its instance now (vLLM's proxy)
            dec = self.instances["decode"][flow.d]
            dec.queue.append(flow)
            self._admit(dec, now)
            return
        self._transfer(flow)

    # -- decode side --------------------------------------------------------------------------------------------
    def _admit(self, dec: Instance, now: float) -> None:
        """SGLang's pre-allocation, first come first served (module docstring, step 3)."""
        sched, reserve = dec.sched, self.dg.decode_reserve_tokens
        vllm = self.alloc_after_prefill
        if vllm:  # vLLM: no reserve; admitted while fewer than max_num_seqs run (`Scheduler.schedule`)
            reserve = 0
        while dec.queue:
            flow = dec.queue[0]
            if vllm and sched.num_active >= sched.max_running:
                return
            allocatable = sched.kv_free - reserve * (sched.num_active + dec.in_flight)
            if allocatable < flow.tokens + reserve:
                if sched.num_active == 0 and dec.in_flight == 0:
                    self.failure = (f"request {flow.req.rid}: its KV ({flow.tokens} tokens) and the decode reserve "
                                    f"({reserve} tokens) cannot fit decode instance {dec.index}'s empty pool of "
                                    f"{sched.kv_capacity} tokens")
                    raise DisaggFailed(self.failure)
                return
            dec.queue.popleft()
            sched.kv_free -= flow.tokens
            dec.in_flight += 1
            flow.ready_s = now
            self._transfer(flow)

    def _transfer(self, flow: Flow) -> None:
        """Book the links once both sides are ready (module docstring, step 4)."""
        layerwise = self.dg.kv_transfer == "layerwise"
        chunked = self.dg.kv_transfer == "chunked"
        if math.isnan(flow.ready_s) or math.isnan(flow.prefilled_s):
            return
        now = self.env.now
        pre, dec = self.instances["prefill"][flow.p], self.instances["decode"][flow.d]
        alpha, busy = self.placed.model.kv_transfer_links(self.model, flow.tokens, pre.comm.groups, dec.comm.groups,
                                                          self.layers["prefill"], self.layers["decode"])
        d = max(busy.values(), default=0.0)
        free = max((self.link_free.get(k, -math.inf) for k in busy), default=-math.inf)
        ready = max(flow.start_s, flow.ready_s) if layerwise or chunked else now
        start = max(ready, free)
        end = start + alpha + d
        if layerwise:  # the last layer's share cannot leave before the prefill has computed it
            end = max(end, flow.prefilled_s + alpha + d / self.model.num_layers)
        if chunked:
            end = self._chunked_end(flow, start, alpha, d)
        for k, b in busy.items():
            self.link_free[k] = end
            self.link_busy[k] = self.link_busy.get(k, 0.0) + b
        flow.xfer_start_s = start
        flow.link_wait_s = start - ready
        flow.bytes = kv_transfer_bytes(self.model, flow.tokens, 1)  # the prompt's whole KV (every head and layer)
        self.transfers.append((flow.req.rid, flow.p, flow.d, start, end, flow.bytes))
        ev = self.env.timeout(max(end - now, 0.0))
        ev.callbacks.append(lambda _ev, flow=flow: self._land(flow))

    def _chunked_end(self, flow: Flow, start: float, alpha: float, d: float) -> float:
        """SGLang's chunk-by-chunk sends (`disaggregation/prefill.py`: `process_prefill_chunk` calls
        `send_kv_chunk(req)` for each chunk but the last as its forward is done, `process_batch_result_disagg_
        prefill` the last one with `last_chunk=True`): chunk j's share of the bytes leaves once it is computed,
        taken to be when chunk j + 1 is scheduled (the prefill's end for the last), after the chunks before it,
        on the links from `start` (pre-allocated, links free); alpha once at the end."""
        sizes = [n for _t, n in flow.chunks]
        total = sum(sizes)
        if not sizes or total <= 0:
            return max(start, flow.prefilled_s) + alpha + d
        done = [t for t, _n in flow.chunks[1:]] + [flow.prefilled_s]
        t = start
        for computed, n in zip(done, sizes):
            t = max(t, computed) + d * n / total
        return t + alpha

    def _land(self, flow: Flow) -> None:
        """The KV has arrived: the decode side holds it, then the prefill side frees its copy (step 5)."""
        now = self.env.now
        req = flow.req
        dec, pre = self.instances["decode"][flow.d], self.instances["prefill"][flow.p]
        req.prefix_len = req.fill_len = req.prompt_len
        req.kv_base = flow.tokens  # the reservation is now the request's
        dec.in_flight -= 1
        flow.landed_s = now
        if self.dg.first_token == "transfer":  # token 1 streamed by the decode side as it lands (step 6)
            req.out_len = 1
            req.first_token_s = req.last_token_s = now
        if self.dg.first_token == "transfer" and req.max_new <= 1:
            # done on arrival: the decode side frees what it just took over
            dec.sched.kv_free += req.kv_base
            req.kv_base = 0
            req.finished = True
            req.state = FINISHED
            req.finish_s = now
            dec.routed -= 1
            self._finish(req)
            self._admit(dec, now)
        else:
            dec.pipe.inbox.push(req)
        pre.sched.kv_free += flow.tokens
        pre.held -= flow.tokens
        self.unlanded -= 1
        self._maybe_close()

    def _decoded(self, req: Req, d: int) -> None:
        dec = self.instances["decode"][d]
        dec.routed -= 1
        self._finish(req)
        self._admit(dec, self.env.now)

    def _finish(self, req: Req) -> None:
        if self.guard is not None:
            self.guard.finished(req)
        self.table.finish(req)
        if self.on_finish is not None:
            self.on_finish(req)

    def _maybe_close(self) -> None:
        if self.routed_all and self.unlanded == 0:
            for inst in self.instances["decode"]:
                inst.pipe.inbox.close()

    # -- the KV ledger ------------------------------------------------------------------------------------------
    def audit(self) -> None:
        """Check, at this instant, that nothing is lost between the pools (raises `KVLedgerError`).

        Each request's KV has exactly one owner, given by where it is in its life: the prefill instance
        from its first chunk until the decode instance holds it (the transfer has landed), the decode
        instance after. From that alone, and each request's own token count (`Req.kv_held`), the ledger of
        every instance is rebuilt and must equal its pool, token for token:

            capacity = free + tokens of the requests it computes (prefill: the prompts being prefilled;
                       decode: the landed requests, re-prefills after a retraction included)
                     + prefill: the finished prefills it owns, awaiting their transfer's landing
                     + decode: the pre-allocations of transfers not landed yet
                     + the decode tokens of micro-batches in flight (allocated when formed, counted by the
                       request when its token comes back)

        A prefill side that frees a copy before the decode side holds it leaves its pool with more free
        tokens than the ledger; one that never frees it, with fewer; a decode side that takes a request
        without its pre-allocation, likewise. The instances' own counters (`held`, `in_flight`) must agree
        with the ledger too. A pipeline that failed (its scheduler stopped mid-batch) is not checked."""
        ledger: dict[tuple[str, int], int] = {}
        held: dict[int, int] = {}
        reserved: dict[int, int] = {}
        in_transit: dict[int, int] = {}  # transfers pre-allocated on a decode instance, not landed yet
        waiting = 0
        for f in self.by_row.values():
            prefilled, landed = not math.isnan(f.prefilled_s), not math.isnan(f.landed_s)
            on_prefill = prefilled and not landed and not self._direct(f)
            ledger["prefill", f.p] = ledger.get(("prefill", f.p), 0) + f.shadow.kv_held
            if prefilled and f.shadow.kv_held:
                raise KVLedgerError(f"request {f.req.rid}: its finished prefill still counts {f.shadow.kv_held} "
                                    f"tokens as its own on prefill instance {f.p}")
            if on_prefill:
                held[f.p] = held.get(f.p, 0) + f.tokens
                if math.isnan(f.ready_s):  # waiting for room on the decode side, its KV on the prefill side
                    waiting += 1
                    self.audited["waited_on_prefill"].add(f.req.rid)
            if not math.isnan(f.ready_s) and not landed:
                reserved[f.d] = reserved.get(f.d, 0) + f.tokens
                in_transit[f.d] = in_transit.get(f.d, 0) + 1
            if landed:
                ledger["decode", f.d] = ledger.get(("decode", f.d), 0) + f.req.kv_held
            elif f.req.kv_held and not f.req.finished:
                raise KVLedgerError(f"request {f.req.rid}: {f.req.kv_held} tokens on decode instance {f.d} before "
                                    f"its KV landed")
        for pool in POOLS:
            for inst in self.instances[pool]:
                if inst.pipe.status == "failed":
                    continue
                i, sched = inst.index, inst.sched
                slots = sum(len(m.decodes) for m in inst.pipe.inflight if m is not None)
                own = ledger.get((pool, i), 0)
                extra = held.get(i, 0) if pool == "prefill" else reserved.get(i, 0)
                total = sched.kv_free + own + extra + slots
                if total != sched.kv_capacity:
                    what = "owned finished prefills" if pool == "prefill" else "pre-allocations in flight"
                    raise KVLedgerError(
                        f"t={self.env.now:.6f}s {inst.name}: {sched.kv_free} free + {own} of its requests + {extra} "
                        f"{what} + {slots} decode slots in flight = {total} != its pool of {sched.kv_capacity} tokens")
                if pool == "prefill" and inst.held != held.get(i, 0):
                    raise KVLedgerError(f"{inst.name}: holds {inst.held} tokens for transfers, the ledger "
                                        f"{held.get(i, 0)}")
                if pool == "decode" and inst.in_flight != in_transit.get(i, 0):
                    raise KVLedgerError(f"{inst.name}: {inst.in_flight} transfers in flight by its count, not the "
                                        f"ledger's")
        a = self.audited
        a["checks"] += 1
        a["most_waiting_on_prefill"] = max(a["most_waiting_on_prefill"], waiting)

    # -- the run ------------------------------------------------------------------------------------------------
    def _watch(self, pipe: Pipeline) -> None:
        def done(_ev) -> None:
            if pipe.status != "ok" and not self.stop.triggered:
                self.stop.succeed()
        pipe.proc.callbacks.append(done)

    def run(self, requested_alternates: int = 0, client=None):
        """`client(env, table, send, close)`: a client loop that sends the requests (run.py's
        closed loops and capped open loops) instead of the router's fixed arrivals."""
        from sim.engine.run import RunResult

        env = self.env
        everyone = [x for n in POOLS for x in self.instances[n]]
        pipes = [x.pipe for x in everyone]
        for p in pipes:
            self._watch(p)
        if client is None:
            env.process(self._route())
        else:
            self.on_finish = client(env, self.table, self._send, self._routed_all).finished
        if self.audit_on:  # the ledger after every event (env.run calls env.step for each)
            step = env.step

            def audited_step() -> None:
                step()
                self.audit()

            env.step = audited_step  # type: ignore[method-assign]
        until = [env.all_of([p.proc for p in pipes]), self.stop]
        if self.cfg.horizon_s:
            until.append(env.timeout(self.cfg.horizon_s))
        try:
            env.run(until=env.any_of(until))
        except DisaggFailed:
            pass
        self.table.close()
        failed = [x for x in everyone if x.pipe.status == "failed"]
        stopped = [x for x in everyone if x.pipe.status in ("stopped", "met")]
        if self.failure:
            status, reason = "failed", self.failure
        elif failed:
            status, reason = "failed", "; ".join(f"{x.name}: {x.pipe.reason}" for x in failed)
        elif stopped:
            status, reason = "stopped", self.guard.reason if self.guard is not None else stopped[0].pipe.reason
        else:
            status, reason = "ok", ""
        dec0 = self.instances["decode"][0]
        log = merge_logs([x.pipe.log for x in everyone])
        decisions, moves = [], []
        for x in everyone:
            decisions.extend(x.pipe.decisions)
            moves.extend(x.pipe.move_log)
        return RunResult(
            config=self.cfg, status=status, reason=reason, requests=self.table, iterations=log.columns,
            stage_busy=log.stage_busy, decisions=decisions, moves=moves,
            kv_capacity_tokens=dec0.sched.kv_capacity,
            kv_peak_tokens=max(x.pipe.kv_peak for x in self.instances["decode"]),
            kv_peak_active_tokens=max(x.pipe.kv_peak_active for x in self.instances["decode"]),
            max_running_requests=dec0.sched.max_running, end_s=env.now,
            iteration_overhead_s=dec0.latency.iteration_overhead_s, host_s=log.columns["host_s"],
            extras={"stage_layers": self.layers["decode"],
                    "num_kv_exhausted": sum(x.sched.kv_exhausted_events for x in everyone),
                    # never a stand-in for a sibling point of a sweep (sim/studies/sweep.py)
                    "chunk_bound": True, "chunk_need": 0, "alternates": [False] * requested_alternates,
                    "cluster": self.placed.describe(), "cluster_warnings": self.placed.warnings,
                    "instance_names": [x.name for x in everyone],
                    "instance_stages": [x.sched.num_slots for x in everyone],
                    "disaggregation": self.describe(everyone),
                    "kv_transfers": list(self.transfers),
                    "request_columns": self.request_columns()},
        )

    def describe(self, everyone: list[Instance]) -> dict:
        dur = max(self.env.now - (float(self.table.arrival_s.min()) if len(self.table) else 0.0), 0.0)
        links = {f"{d}:{s.node}/{s.local_gpu}:{k}": b for (d, s, k), b in self.link_busy.items()}
        out = {"engine": self.engine, "kv_transfer": self.dg.kv_transfer, "first_token": self.dg.first_token,
               "decode_reserve_tokens": self.dg.decode_reserve_tokens, "duration_s": dur,
               "link_busy_s": links}
        for n in POOLS:
            pool = getattr(self.dg, n)
            out[n] = {"instances": pool.instances, "tp": pool.tp, "pp": pool.pp, "gpus": pool.gpus,
                      "router": pool.router, "profile": self.pool_cfgs[n].latency.profile,
                      "kv_tokens": self.instances[n][0].sched.kv_capacity,
                      "stage_layers": self.layers[n]}
        return out

    def request_columns(self) -> dict:
        n = len(self.table)
        cols = {"prefill_instance": np.full(n, -1, dtype=np.int32), "decode_instance": np.full(n, -1, dtype=np.int32),
                "kv_tokens": np.zeros(n, dtype=np.int64), "kv_bytes": np.zeros(n, dtype=np.int64),
                "prefill_end_s": np.full(n, np.nan), "kv_ready_s": np.full(n, np.nan),
                "kv_wait_ms": np.full(n, np.nan), "kv_link_wait_ms": np.full(n, np.nan),
                "kv_transfer_ms": np.full(n, np.nan)}
        for row, f in self.by_row.items():
            cols["prefill_instance"][row] = f.p
            cols["decode_instance"][row] = f.d
            cols["kv_tokens"][row] = f.tokens
            cols["prefill_end_s"][row] = f.prefilled_s
            if not math.isnan(f.landed_s):
                cols["kv_bytes"][row] = f.bytes
                cols["kv_ready_s"][row] = f.landed_s
                cols["kv_wait_ms"][row] = max(f.ready_s - f.prefilled_s, 0.0) * 1e3
                cols["kv_link_wait_ms"][row] = f.link_wait_s * 1e3
                cols["kv_transfer_ms"][row] = (f.landed_s - max(f.prefilled_s, f.ready_s)) * 1e3
        return cols

    def flows_checked(self) -> list[Flow]:
        """Every flow, after the run (tests read their times)."""
        return list(self.by_row.values())


def merge_logs(logs: list[IterationLog]) -> IterationLog:
    """The instances' iteration logs one after another (`replica` = instance), stage columns padded with
    empty stages up to the largest PP."""
    width = max(log.num_stages for log in logs)
    if all(log.num_stages == width for log in logs):
        return IterationLog.merge(logs, width)
    out = IterationLog(width)
    columns = out.columns
    from array import array

    columns["replica"] = array("q")
    for i, log in enumerate(logs):
        for name, col in log.columns.items():
            columns[name].extend(col)
        columns["replica"].extend(array("q", [i]) * len(log))
        busy = np.frombuffer(log.stage_busy.flat, dtype=np.float64).reshape(len(log), log.num_stages)
        padded = np.zeros((len(log), width))
        padded[:, :log.num_stages] = busy
        out.stage_busy.flat.frombytes(padded.tobytes())
    return out
