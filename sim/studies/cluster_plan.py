"""`ppsim plan --rate R --max-gpus N`: the fewest GPUs (then the lowest cost) that serve R req/s within the
SLOs, over GPU counts up to N on nodes of `--gpus-per-node` GPUs joined by `--network`, co-located or
disaggregated (prefill:decode ratios), TP x PP per pool and chunk policy (issue 34). With `--concurrency N`
instead of a rate, the load is N closed-loop clients (sim/studies/concurrency_plan.py): a screen runs one
instance at its share, ceil(N / k) clients, the throughput bound gives no lower count (a closed loop's rate is
what it achieves), costs are at each candidate's achieved rate, and the goodput is the most clients each
confirmed candidate holds (`clients_above`).

Candidates
- Instance shapes: TP over `--tp` (default 1, 2, 4, 8, ... up to the node's GPUs: a TP group inside one node;
  wider TP is not searched), PP over `--pp` (default 1, 2, 4), at most N GPUs; a shape without a profile, or whose KV
  pool cannot hold one full-context request, is dropped with the reason; so is a shape, engine and policy whose
  pool as the engine sizes it cannot hold the workload's longest request (a prefill pool: prompt;
  `sim.studies.plan.KvPools`). `--set` as `--gpus N` takes it (`sim.studies.plan.plan_overrides`).
- Co-located: k replicas of a shape with a chunk policy (`--policies`, default static-512 and
  static-2048), behind a least-loaded router.
- Disaggregated: P prefill instances of a shape with a chunk policy + D decode instances of a shape
  (`[disaggregation]`, sim/engine/disagg.py; `--kv-transfer`, `--first-token`), least-loaded routers.
  Every deployment is placed on the nodes in order (sim/latency/cluster.py), so its `nodes` and its
  cross-node sends are those of the placement.

The search, with its stated bounds (each candidate's row says which one decided it)
1. Throughput bound (`sim.studies.plan.throughput_bound_rps`: every token crosses every layer's linear
   part at the profile's cheapest per-token time): an instance serves at most b requests/s (prompt and
   output tokens for a co-located replica, prompt tokens for a prefill instance, output tokens for a
   decode instance), so R needs at least ceil(R / b) instances; a shape needing more than N GPUs that way
   is *pruned* (overloaded).
2. Screens, one instance at its share of the load: k replicas behind a router split R into k streams of
   R / k, so a replica's screen is one replica at R / k; the smallest k that meets the SLOs is found by
   galloping up from the bound (k = bound, +1, +3, +7, ..., at most N / GPUs) until one passes, then by
   bisection (more replicas never hurt: assumed monotone, as the goodput search assumes in the rate;
   `CountSearch` says why from the bound). Pools are screened the same way: a decode instance at R / D
   with ample prefill instances (of the largest prefill shape, as many as keep each below a quarter of its bound),
   for the whole SLO; a prefill instance at R / P with ample decode instances (the best decode shape's
   count for its share, plus one), for the TTFT objective only. A disaggregated deployment's capacity is
   composed from its pools' (P and D found independently). A shape or pool that misses even at the most
   instances N allows is *pruned* (screen).
3. Confirmation: the candidates with the fewest GPUs (`--confirm`, default 4 per round, up to 3 rounds;
   the first round adds the fewest-GPU candidate of each mode and node count) are simulated in full (every instance, router, placement, KV transfers) over the paired seeds; one that
   misses, or meets the SLOs on every seed too thinly to count (`sim.studies.sweep.holds_on_seeds`: the 95%
   interval of the seeds' margins reaches below zero), gets the next count of the instance kind with the
   least slack (TTFT: prefill, TPOT: decode) in the next round. A candidate not confirmed keeps its screen numbers (status `estimated`).
4. Cost (`--price-per-gpu-hour`, else GPU-hours), one basis per column: `cost_per_hour`,
   `cost_per_million_at_rate` (serving R) and `cost_per_million_at_goodput` (at each confirmed candidate's
   goodput, searched from R upward to within 10% on the first seed, then stepped down by 10% until it
   counts on every seed: `sim.studies.plan.goodputs_above`; NaN where none was measured). plan.png puts
   each candidate at the rate, on the ranking's basis (output tokens/s per GPU against the margin; an
   estimate at its screen's: `sim.studies.plan_plot`).

Engines (`--engine fastpp,sglang,vllm-v1,vllm-v0`, any subset; plan.csv's `engine`, `engine_version`): every
candidate is searched per engine with that engine's own knobs: fastpp the `--policies` (the paper's chunk
policies and delay scheduling); sglang and vllm-v1 their default token budget (`default`: chunked_prefill_size,
max_num_batched_tokens) and the static budgets of `--policies` (their own knob), any other policy of
`--policies` a what-if, labelled so (a rebalancer, FastPP's, pruned); vllm-v0 its default only, at PP 1, co-located
only (0.6.3.post1 has no disaggregated prefill). Disaggregated pools run the engine's scheduler with its
hand-off (`handoff`, sim/engine/disagg.py). Each engine's instances run on the kernel data of its era
(`ClusterPlan.engine_shapes`, sim/profiling/library.py: on the H100 AIConfigurator's for sglang and vllm-v1,
Vidur's for fastpp and vllm-v0; `--kernel-data` overrides). The engines' candidates are ranked together.

Ranking: confirmed candidates meeting the SLOs on every seed (sustained: not saturated; by `holds_on_seeds`), by fewest GPUs,
then cost per hour, then margin (mean over seeds); those of the best one's GPU count whose margin CI overlaps its are tied.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from sim.core.ep import NO_EP_ENGINES
from sim.core.errors import ConfigError
from sim.core.lazy import lazy
from sim.core.slo import SLO
from sim.latency.profiled import Profile, kv_capacity_tokens
from sim.studies import concurrency_plan as cp
from sim.studies.concurrency_plan import clients_above, goodput_columns, hold_clients, mean_achieved
from sim.studies.concurrency_plan import verify as verify_clients
from sim.studies.plan_candidates import (MEM_FRACTION, POLICIES, KvPools, check_engine_sets, check_routing,
                                         deployment_table, engine_overrides, engine_sizes, family_dir, model_context,
                                         moe_layouts, moe_of, nodes_used, plan_load, plan_model_of, plan_overrides,
                                         resolve_profile, throughput_bound_rps, weights_reason, _short)
from sim.studies.plan_probes import (THIN_MARGIN, at_rate_row, cost_columns, cost_unit, goodputs_above, layout_text,
                                     parse_prices, refused_thinly)
from sim.studies.plan_verify import TABLE, verify
from sim.studies.sweep import Runner, SustainedSLO, hold_tail, holds_on_seeds, size_key, sustained

np = lazy("numpy")
pd = lazy("pandas")

DEFAULT_POLICIES = ("static-512", "static-2048")
DEFAULT_PP = (1, 2, 4)
PREFILL_SHARE = 0.25     # an ample prefill instance runs at most this share of its throughput bound
RELAXED_MS = 1e9         # the objective a pool screen does not judge (TPOT for a prefill screen)
ROUNDS = 3


@dataclass(frozen=True)
class Shape:
    tp: int
    pp: int
    profile: str
    kv: int
    ep: int = 1  # an MoE model's expert-parallel size (sim/core/ep.py); co-located instances only

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def text(self) -> str:
        return layout_text(self.tp, self.pp, self.ep)


@dataclass
class Cand:
    mode: str                 # colocated | disaggregated
    policy: str
    shape: Shape | None = None        # colocated
    replicas: int = 0
    pshape: Shape | None = None       # disaggregated
    P: int = 0
    dshape: Shape | None = None
    D: int = 0
    screen: dict | None = None        # the screen summary that judged it (co-located: the replica's)
    engine: str = "fastpp"            # the scheduler every instance runs (`--engine`)

    @property
    def gpus(self) -> int:
        if self.mode == "colocated":
            return self.replicas * self.shape.gpus
        return self.P * self.pshape.gpus + self.D * self.dshape.gpus

    def key(self) -> tuple:
        if self.mode == "colocated":
            return ("c", self.shape, self.replicas, self.policy, self.engine)
        return ("d", self.pshape, self.P, self.policy, self.dshape, self.D, self.engine)

    def label(self) -> str:
        tag = engine_tag(self.engine, self.policy)
        if self.mode == "colocated":
            return f"colocated {self.replicas}x({self.shape.text()}) {self.policy}{tag}"
        return (f"disagg P {self.P}x({self.pshape.text()}) {self.policy} + D {self.D}x({self.dshape.text()}){tag}")


ENGINE_DEFAULT = "default"  # an engine's own default token budget (chunk_size_tokens = 0)


def engine_policies(engine: str, policies: list[str]) -> list[str]:
    """The chunk settings a candidate of `engine` is planned with (module docstring, "Engines")."""
    if engine == "fastpp":
        return list(policies)
    if engine == "vllm-v0":
        return [ENGINE_DEFAULT]
    return [ENGINE_DEFAULT, *policies]


def what_if(engine: str, policy: str) -> bool:
    """A paper's chunk policy on an engine that does not have it (`--policies` asked for it)."""
    return engine != "fastpp" and policy in POLICIES and POLICIES[policy][0]["name"] != "static"


def policy_spec(policy: str) -> tuple:
    """(chunk_policy table, chunk_size_tokens, rebalancer) of a policy name (`ENGINE_DEFAULT`: static at the
    engine's own budget, chunk_size_tokens 0)."""
    return ({"name": "static"}, 0, None) if policy == ENGINE_DEFAULT else POLICIES[policy]


def engine_tag(engine: str, policy: str) -> str:
    return "" if engine == "fastpp" else f" [{engine}{', what-if' if what_if(engine, policy) else ''}]"


def handoff(engine: str, kv_transfer: str, first_token: str) -> dict:
    """A disaggregated candidate's hand-off: its engine's own (sim/engine/disagg.py) for SGLang (KV sent chunk
    by chunk, token 1 sampled by the prefill server and streamed as the KV lands) and vLLM (the decode
    instance reads the KV once the prefill has finished, then computes token 1); `--kv-transfer` and
    `--first-token` for FastPP."""
    if engine == "sglang":
        return {"kv_transfer": "chunked", "first_token": "transfer"}
    if engine == "vllm-v1":
        return {"kv_transfer": "after_prefill", "first_token": "decode"}
    return {"kv_transfer": kv_transfer, "first_token": first_token}


def engine_version(engine: str) -> str:
    """The release an engine's candidates run (its default `[scheduler] engine_version`)."""
    import importlib

    from sim.engine.schedulers import engine as engine_of

    eng = engine_of(engine, where="--engine")
    key = getattr(importlib.import_module(type(eng).__module__), "DEFAULT_VERSION", "")
    return str(getattr(eng, "versions", {}).get(key, key))


class CountSearch:
    """The smallest instance count in [lo, hi] whose probe passes (monotone in the count): a gallop up from
    the bound, lo, lo + 1, lo + 3, lo + 7, ... (capped at hi) until a count passes, then bisection between
    the largest failing and the smallest passing count.

    Why from the bound and not from the top: a count's probe runs one instance at R / count, so the top's
    is the lightest load and the longest run (a fixed request count at the lowest rate: the most
    iterations, small batches) and it passes, running to its end; the counts near the bound carry the
    heavy loads, and those that miss stop as soon as the miss is certain (`[slo] stop_when_violated`).
    On a monotone outcome both orders find the same count, with that count's probe (the screen numbers)
    the same run (benchmarks/README.md, "every engine, --verify")."""

    def __init__(self, name: str, lo: int, hi: int, make, passes) -> None:
        self.name, self.lo, self.hi, self.make, self.passes = name, lo, hi, make, passes
        self.results: dict[int, dict] = {}
        self.best: int | None = None      # smallest passing count
        self.fail = lo - 1                # largest failing count
        self.done = lo > hi

    def probe(self) -> int | None:
        if self.done:
            return None
        if self.best is None:  # galloping: the next count doubles the distance from the bound
            return min(self.hi, self.lo + 2 * (self.fail - self.lo) + 1) if self.fail >= self.lo else self.lo
        if self.best - self.fail <= 1:
            self.done = True
            return None
        return (self.fail + self.best) // 2

    def record(self, count: int, summary: dict) -> None:
        self.results[count] = summary
        if self.passes(summary):
            self.best = count if self.best is None else min(self.best, count)
        else:
            self.fail = max(self.fail, count)
        if self.best is None and count == self.hi:  # nothing passes, not even at the most instances N allows
            self.done = True
        elif self.best is not None and self.best - self.fail <= 1:
            self.done = True


def run_searches(runner: Runner, searches: list[CountSearch], desc: str) -> None:
    """Advance every search one probe per round, all probes of a round in one parallel batch."""
    while True:
        probes = [(s, s.probe()) for s in searches]
        probes = [(s, c) for s, c in probes if c is not None]
        if not probes:
            return
        res = runner.run([s.make(c) for s, c in probes], desc=desc)
        for (s, c), summ in zip(probes, res):
            s.record(c, summ)


def shapes_of(fam: Path, model: str, max_gpus: int, gpn: int, pps: tuple[int, ...],
              tps: tuple[int, ...] | None = None, mem_fraction: float = MEM_FRACTION,
              context: int | None = None, routing: str = "balanced") -> tuple[list[Shape], list[dict]]:
    """The instance shapes (module docstring; an MoE model's TP x EP layouts too, `moe_layouts`), and a row for
    each one dropped, with the reason; `context` and `mem_fraction` as `--set scheduler.*` sets them
    (sim.studies.plan.engine_sizes); `routing`: an MoE model's profiles' (`--moe-routing`)."""
    ok, dropped = [], []
    if tps is not None:
        wide = [t for t in tps if t > gpn]
        if wide:
            raise ConfigError(f"--tp {wide[0]}: a TP group wider than a node ({gpn} GPUs, --gpus-per-node) is not "
                              f"searched; allowed: TP <= {gpn}")
    tps = [t for t in (tps or (1, 2, 4, 8, 16, 32, 64)) if t <= gpn and t <= max_gpus]
    for tp, ep in ((t, e) for t in tps for e in moe_layouts(model, t)):
        path, reason = resolve_profile(fam, model, tp, ep, routing)
        for pp in pps:
            if tp * pp > max_gpus:
                continue
            base = {"mode": "-", "tp": tp, "pp": pp, "ep": ep, "gpus": tp * pp, "policy": "-", "status": "dropped",
                    "deployment": f"instance {layout_text(tp, pp, ep)}"}
            if path is None:
                # (an MoE model: the library builds only what fits somewhere, so say first when it does not fit)
                dropped.append({**base, "reason": (weights_reason(fam, model, tp, pp, ep) if moe_of(model) is not None
                                                   else "") or reason})
                continue
            prof = Profile.load(path)
            if pp > prof.shape().num_layers:
                dropped.append({**base, "reason": f"PP {pp} > the model's {prof.shape().num_layers} layers"})
                continue
            kv = kv_capacity_tokens(prof, pp, mem_fraction)
            ctx = model_context(prof, context)
            if kv < ctx:
                dropped.append({**base, "reason": weights_reason(fam, model, tp, pp, ep) or
                                f"does not fit: KV pool {max(kv, 0)} tokens < one {ctx}-token request"})
                continue
            ok.append(Shape(tp, pp, _short(path), kv, ep))
    return ok, dropped


class ClusterPlan:
    def __init__(self, args, runner: Runner, load, slo: SLO, seeds: list[int], price: float | None,
                 fam: Path, tokens: dict[str, float]) -> None:
        self.args, self.runner, self.load, self.slo, self.seeds = args, runner, load, slo, seeds
        self.price = price
        self.fam = fam
        # the load: R req/s, or with `--concurrency N` N closed-loop clients, whose share an instance's screen
        # runs at (`workload`: ceil(N / k) clients; sim/studies/concurrency_plan.py)
        self.clients = getattr(load, "clients", None)
        self.rate = float(self.clients if self.clients is not None else load.rate_rps)
        self.N = args.max_gpus
        self.gpn = args.gpus_per_node
        self.network = args.network
        self.tokens = tokens
        self.policies = list(args.policies)
        self.engines = list(getattr(args, "engine", None) or ["fastpp"])
        self.rows: list[dict] = []
        self.pruned = 0
        self.notes: list[str] = []  # where an engine's kernel data fell back to Vidur's (plan.json kernel_data_notes)
        # each engine's `--set`s (sim.studies.plan.engine_overrides) and the KV-pool refusals of its shapes
        self.sets: dict[str, tuple[str, ...]] = {}
        self.pools: dict[bool, KvPools] = {}
        self.engine_sets: tuple[str, ...] = ()
        from sim.latency.cluster import ClusterSpec, profile_hardware

        self._hw: dict[str, tuple] = {}
        self._nodes: dict[tuple, int] = {}
        self._spec = ClusterSpec
        self._profile_hw = profile_hardware

    # -- tables --------------------------------------------------------------------------------------------
    def nodes_of(self, pools: list[tuple[str, int, Shape]]) -> int:
        from sim.latency.cluster import PoolShape, place

        key = tuple(pools)
        if key in self._nodes:
            return self._nodes[key]
        shape = pools[0][2]
        if shape.profile not in self._hw:
            prof = Profile.load(Path(shape.profile) if Path(shape.profile).is_absolute()
                                else Path(__file__).resolve().parents[2] / shape.profile)
            self._hw[shape.profile] = self._profile_hw(prof.meta, prof.path)
        gpu, ic = self._hw[shape.profile]
        spec = self._spec(10_000, self.gpn, gpu or "h100-sxm-80gb", ic or "nvswitch", self.network)
        self._nodes[key] = place(spec, [PoolShape(n, k, s.tp, s.pp) for n, k, s in pools]).nodes_used
        return self._nodes[key]

    def cluster(self, nodes: int) -> dict:
        return {"nodes": nodes, "gpus_per_node": self.gpn, "network": self.network}

    def slo_table(self, slo: SLO, stop: bool) -> dict:
        t = {k: v for k, v in vars(slo).items() if v is not None}
        t["stop_when_violated"] = stop
        return t

    def workload(self, rate: float) -> dict:
        wl = copy.deepcopy(self.load.table)
        if self.clients is not None:  # a share of the clients, each with the request list sized for all N
            wl["concurrency"] = max(1, math.ceil(rate - 1e-9))
            return wl
        wl["rate_rps"] = float(rate)
        return wl

    def least(self, bound: float) -> int:
        """The fewest instances the throughput bound allows for the load (closed loop: 1, its rate unknown)."""
        return 1 if self.clients is not None else max(1, math.ceil(self.rate / bound - 1e-9))

    def share(self, load: float) -> str:
        """A screen's share of the load, in its unit."""
        return f"{math.ceil(load - 1e-9)} clients" if self.clients is not None else f"{load:.3g} req/s"

    def coloc_table(self, shape: Shape, k: int, policy: str, rate: float, seed: int, stop: bool,
                    engine: str = "fastpp") -> dict:
        t = deployment_table(self.workload(rate), shape.profile, k, shape.tp, shape.pp,
                             "least-loaded" if k > 1 else "round-robin",
                             "static-2048" if policy == ENGINE_DEFAULT else policy, self.slo, seed, stop_early=stop,
                             engine=engine, overrides=self.sets.get(engine, ()))
        if policy == ENGINE_DEFAULT:
            t["scheduler"]["chunk_size_tokens"] = 0
        t["cluster"] = self.cluster(self.nodes_of([("colocated", k, shape)]))
        return t

    def disagg_table(self, ps: Shape, P: int, policy: str, ds: Shape, D: int, rate: float, seed: int, stop: bool,
                     slo: SLO | None = None, engine: str = "fastpp") -> dict:
        chunk_policy, chunk, _reb = policy_spec(policy)
        pool = lambda s, k: {"instances": k, "tp": s.tp, "pp": s.pp, "profile": s.profile,  # noqa: E731
                             "router": "least-loaded"}
        sched = {"chunk_size_tokens": chunk}
        if engine != "fastpp":  # (a FastPP table stays as before engines were an axis: same cache keys)
            sched["engine"] = engine
        table = {"seed": seed, "scheduler": sched,
                 "latency": {"kind": "profile", "profile": ds.profile},
                 "slo": self.slo_table(slo or self.slo, stop), "workload": self.workload(rate),
                 "cluster": self.cluster(self.nodes_of([("prefill", P, ps), ("decode", D, ds)])),
                 "disaggregation": {**handoff(engine, self.args.kv_transfer, self.args.first_token),
                                    "prefill": {**pool(ps, P), "chunk_size_tokens": chunk,
                                                "chunk_policy": copy.deepcopy(chunk_policy)},
                                    "decode": pool(ds, D)}}
        if self.sets.get(engine):  # (none: the table as before, the same cache keys)
            from sim.core.config import apply_overrides

            table = apply_overrides(table, list(self.sets[engine]))
        return table

    def table_of(self, c: Cand, seed: int, stop: bool) -> dict:
        if c.mode == "colocated":
            return self.coloc_table(c.shape, c.replicas, c.policy, self.rate, seed, stop, c.engine)
        return self.disagg_table(c.pshape, c.P, c.policy, c.dshape, c.D, self.rate, seed, stop, engine=c.engine)

    # -- bounds --------------------------------------------------------------------------------------------
    def bound(self, s: Shape, which: str) -> float:
        return throughput_bound_rps(s.profile, s.pp, 1, self.tokens[which])

    def _prune(self, base: dict, reason: str) -> None:
        self.pruned += 1
        self.rows.append({**base, "status": "pruned", "reason": reason})

    def engine_shapes(self, shapes: list[Shape], engine: str) -> list[Shape]:
        """`shapes` on the data source of `engine`'s kernel era (sim.profiling.library.engine_profile; on the
        H100: AIC for sglang and vllm-v1, Vidur for fastpp and vllm-v0; `--kernel-data` overrides)."""
        from dataclasses import replace

        from sim.profiling.library import engine_profile

        out = []
        for s in shapes:
            path, note = engine_profile(s.profile, engine, getattr(self.args, "kernel_data", None) or "")
            self.notes += [note] if note and note not in self.notes else []
            out.append(replace(s, profile=path))
        return out

    def refused(self, base: dict, s: Shape, engine: str, policy: str, prompt_only: bool = False) -> bool:
        """Whether the engine's KV pool of shape `s` cannot hold the workload's longest request (a prefill
        instance: prompt), listed as dropped with the reason (sim.studies.plan.pool_refusal)."""
        if prompt_only not in self.pools:
            self.pools[prompt_only] = KvPools(self.load.table, self.seeds, self.slo, self.engine_sets, self.engines,
                                              prompt_only)
        why = self.pools[prompt_only].refusals(s.profile, s.tp, s.pp, engine, [policy]).get(policy)
        if why:
            self.rows.append({**base, "status": "dropped", "reason": why})
        return bool(why)

    def refused_lines(self) -> list[str]:
        return [line for p in self.pools.values() for line in p.lines()]

    # -- the search ----------------------------------------------------------------------------------------
    def run(self, shapes: list[Shape]) -> list[dict]:
        R, N, slo = self.rate, self.N, self.slo
        eshapes = {e: self.engine_shapes(shapes, e) for e in self.engines}
        seed = self.seeds[0]
        ttft_only = SustainedSLO(ttft_ms=slo.ttft_ms, ttft_percentile=slo.ttft_percentile, tpot_ms=RELAXED_MS,
                        tpot_percentile=slo.tpot_percentile)
        searches: list[tuple[str, tuple, CountSearch]] = []
        usable: dict[str, list[Shape]] = {}
        for e in self.engines:
            usable[e] = []
            for s in eshapes[e]:
                if e == "vllm-v0" and s.pp > 1:
                    self._prune({"mode": "-", "tp": s.tp, "pp": s.pp, "ep": s.ep, "policy": "-", "profile": s.profile,
                                 "engine": e, "deployment": f"instance {s.text()}{engine_tag(e, '-')}"},
                                "vllm-v0 with pipeline parallelism (one scheduler per virtual engine) is not modelled")
                    continue
                if s.ep > 1 and e in NO_EP_ENGINES:
                    self._prune({"mode": "-", "tp": s.tp, "pp": s.pp, "ep": s.ep, "policy": "-", "profile": s.profile,
                                 "engine": e, "deployment": f"instance {s.text()}{engine_tag(e, '-')}"},
                                NO_EP_ENGINES[e])
                    continue
                usable[e].append(s)
        # co-located replicas
        for e in self.engines:
            for s in usable[e]:
                lo = self.least(self.bound(s, "total"))
                hi = N // s.gpus
                for pol in engine_policies(e, self.policies):
                    base = {"mode": "colocated", "tp": s.tp, "pp": s.pp, "ep": s.ep, "policy": pol,
                            "profile": s.profile, "engine": e, "deployment": f"colocated kx({s.text()}) {pol}{engine_tag(e, pol)}"}
                    if e != "fastpp" and policy_spec(pol)[2] is not None:
                        self._prune(base, f"{pol}: its rebalancer moves requests between FastPP's micro-batch "
                                          f"slots; {e} has none")
                        continue
                    if lo > hi:
                        self._prune(base, f"overloaded: the throughput bound ({self.bound(s, 'total'):.3g} req/s "
                                          f"per replica) needs >= {lo} replicas = {lo * s.gpus} GPUs > {N}")
                        continue
                    if self.refused(base, s, e, pol):
                        continue
                    searches.append(("colocated", (s, pol, e), CountSearch(
                        f"{s.text()} {pol}{engine_tag(e, pol)}", lo, hi,
                        lambda k, s=s, pol=pol, e=e: self.coloc_table(s, 1, pol, R / k, seed, True, e),
                        slo.meets)))
        # disaggregated pools take the shapes without expert parallelism ([disaggregation] pools have no ep:
        # sim/core/ep.py check_ep_placement)
        eshapes = {e: [s for s in eshapes[e] if s.ep == 1] for e in self.engines}
        # decode pools: ample prefill of the largest prefill shape that fits one node
        pfast = {e: max(eshapes[e], key=lambda s: (s.pp == 1, s.tp, -s.pp)) for e in self.engines if eshapes[e]}
        pbound = {e: self.bound(pfast[e], "prompt") for e in pfast}

        def ample_prefill(rate: float, e: str, dshape: Shape | None = None) -> int:
            if self.clients is not None:  # `rate` is clients: the decode instance's bound caps their rate, and
                # one prefill instance per client never queues a prompt
                return max(1, min(math.ceil(self.bound(dshape, "output") / (PREFILL_SHARE * pbound[e])),
                                  math.ceil(rate - 1e-9)))
            return max(1, math.ceil(rate / (PREFILL_SHARE * pbound[e])))

        dengines = [e for e in self.engines if e != "vllm-v0" and e in pfast]
        if "vllm-v0" in self.engines:
            self._prune({"mode": "disaggregated", "policy": "-", "engine": "vllm-v0",
                         "deployment": "disagg [vllm-v0]"},
                        "vllm-v0 (vLLM 0.6.3.post1) has no disaggregated prefill (its KV connector came later); "
                        "not modelled")
        dsearch: dict[tuple, CountSearch] = {}
        for e in dengines:
            dpol = "static-2048" if e == "fastpp" else ENGINE_DEFAULT
            for s in eshapes[e]:
                lo = self.least(self.bound(s, "output"))
                hi = (N - 1) // s.gpus
                base = {"mode": "disaggregated", "tp": s.tp, "pp": s.pp, "policy": "-", "profile": s.profile,
                        "engine": e, "deployment": f"disagg decode pool Dx({s.text()}){engine_tag(e, '-')}"}
                if hi < 1:
                    self._prune(base, f"too large: a decode instance of {s.gpus} GPUs leaves none of the {N} for "
                                      f"prefill")
                    continue
                if lo > hi:
                    self._prune(base, f"overloaded: the decode throughput bound ({self.bound(s, 'output'):.3g} req/s "
                                      f"per instance) needs >= {lo} decode instances = {lo * s.gpus} GPUs > {N - 1}")
                    continue
                if self.refused(base, s, e, dpol):
                    continue
                dsearch[s, e] = CountSearch(
                    f"decode {s.text()}{engine_tag(e, '-')}", lo, hi,
                    lambda D, s=s, e=e, dpol=dpol: self.disagg_table(pfast[e], ample_prefill(R / D, e, s), dpol, s, 1,
                                                                     R / D, seed, True, engine=e),
                    slo.meets)
        run_searches(self.runner, [x for _, _, x in searches] + list(dsearch.values()), "plan: screens")
        # prefill pools: ample decode of the best decode shape (fewest GPUs for R) of the same engine
        psearch: dict[tuple, CountSearch] = {}
        for e in dengines:
            dbest = min((s for s, de in dsearch if de == e and dsearch[s, e].best is not None),
                        key=lambda s: (dsearch[s, e].best * s.gpus, s.gpus), default=None)
            if dbest is None:
                continue
            dcount = dsearch[dbest, e].best
            for s in eshapes[e]:
                lo = self.least(self.bound(s, "prompt"))
                hi = (N - dbest.gpus) // s.gpus
                for pol in engine_policies(e, self.policies):
                    base = {"mode": "disaggregated", "tp": s.tp, "pp": s.pp, "policy": pol, "profile": s.profile,
                            "engine": e, "deployment": f"disagg prefill pool Px({s.text()}) {pol}{engine_tag(e, pol)}"}
                    if policy_spec(pol)[2] is not None:
                        self._prune(base, f"{pol}: a rebalancer moves decodes between slots; a prefill instance has "
                                          f"none")
                        continue
                    if hi < 1:
                        self._prune(base, f"too large: a prefill instance of {s.gpus} GPUs and one decode instance of "
                                          f"the best decode shape ({dbest.gpus} GPUs) exceed {N} GPUs")
                        continue
                    if lo > hi:
                        self._prune(base, f"overloaded: the prefill throughput bound ({self.bound(s, 'prompt'):.3g} "
                                          f"req/s per instance) needs >= {lo} prefill instances = {lo * s.gpus} GPUs")
                        continue
                    if self.refused(base, s, e, pol, prompt_only=True):
                        continue
                    psearch[(s, pol, e)] = CountSearch(
                        f"prefill {s.text()} {pol}{engine_tag(e, pol)}", lo, hi,
                        lambda P, s=s, pol=pol, e=e, dbest=dbest, dcount=dcount: self.disagg_table(
                            s, 1, pol, dbest, math.ceil(dcount / P) + 1, R / P, seed, True, slo=ttft_only, engine=e),
                        ttft_only.meets)
        run_searches(self.runner, list(psearch.values()), "plan: prefill screens")
        cands: list[Cand] = []
        for mode, (s, pol, e), cs in searches:
            if cs.best is None:
                self._prune({"mode": "colocated", "tp": s.tp, "pp": s.pp, "ep": s.ep, "policy": pol,
                             "profile": s.profile, "engine": e, "deployment": f"colocated kx({s.text()}) {pol}{engine_tag(e, pol)}"},
                            f"screen: one replica misses the SLOs at {self.share(R / cs.hi)}, its share with "
                            f"{cs.hi} replicas (the most {N} GPUs allow)")
                continue
            cands.append(Cand("colocated", pol, shape=s, replicas=cs.best, screen=cs.results[cs.best], engine=e))
        for (s, e), cs in dsearch.items():
            if cs.best is None:
                self._prune({"mode": "disaggregated", "tp": s.tp, "pp": s.pp, "policy": "-", "profile": s.profile,
                             "engine": e, "deployment": f"disagg decode pool Dx({s.text()}){engine_tag(e, '-')}"},
                            f"screen: one decode instance misses the SLOs at {self.share(R / cs.hi)} with ample prefill "
                            f"({cs.hi} instances, the most {N} GPUs allow)")
        for (ps, pol, e), cs in psearch.items():
            if cs.best is None:
                self._prune({"mode": "disaggregated", "tp": ps.tp, "pp": ps.pp, "policy": pol, "profile": ps.profile,
                             "engine": e,
                             "deployment": f"disagg prefill pool Px({ps.text()}) {pol}{engine_tag(e, pol)}"},
                            f"screen: one prefill instance misses the TTFT SLO at {self.share(R / cs.hi)} with ample "
                            f"decode ({cs.hi} instances)")
                continue
            for (ds, de), dcs in dsearch.items():
                if de != e or dcs.best is None:
                    continue
                c = Cand("disaggregated", pol, pshape=ps, P=cs.best, dshape=ds, D=dcs.best,
                         screen=_compose(cs.results[cs.best], dcs.results[dcs.best]), engine=e)
                if c.gpus > N:
                    self._prune({"mode": "disaggregated", "tp": ps.tp, "pp": ps.pp, "policy": pol, "engine": e,
                                 "deployment": c.label(), "gpus": c.gpus},
                                f"composed: {cs.best} prefill + {dcs.best} decode instances need {c.gpus} GPUs > {N}")
                    continue
                cands.append(c)
        return self.confirm(cands)

    def confirm(self, cands: list[Cand]) -> list[dict]:
        """Full simulations of the fewest-GPU candidates, over every seed (module docstring, step 3)."""
        seen: dict[tuple, Cand] = {c.key(): c for c in cands}
        queue = sorted(seen.values(), key=lambda c: (c.gpus, -self._screen_margin(c)))
        done: dict[tuple, list[dict]] = {}
        for rnd in range(ROUNDS):
            batch = [c for c in queue if c.key() not in done][:self.args.confirm]
            if rnd == 0:  # and the fewest-GPU candidate of each mode and node count, so that the answer compares them
                groups: dict[tuple, Cand] = {}
                for c in queue:
                    groups.setdefault((c.mode, self.cand_nodes(c)), c)
                batch += [c for c in groups.values() if c not in batch]
            if not batch:
                break
            res = self.runner.run([self.table_of(c, s, True) for c in batch for s in self.seeds],
                                  desc="plan: confirm in full")
            k = len(self.seeds)
            met = False
            for i, c in enumerate(batch):
                summ = res[i * k:(i + 1) * k]
                done[c.key()] = summ
                if holds_on_seeds(self.slo, summ):  # every seed, with a margin whose interval stays >= 0
                    met = True
                    continue
                bumped = self._bump(c, summ)
                if bumped is not None and bumped.key() not in seen:
                    seen[bumped.key()] = bumped
                    queue.append(bumped)
            queue.sort(key=lambda c: (c.gpus, -self._screen_margin(c)))
            best_gpus = min((c.gpus for c in batch if holds_on_seeds(self.slo, done[c.key()])), default=None)
            if met and best_gpus is not None and all(c.gpus > best_gpus or c.key() in done for c in queue):
                break
        ok = [c for c in seen.values() if c.key() in done and holds_on_seeds(self.slo, done[c.key()])]
        goodput = self._goodputs(ok)
        rows = []
        for c in seen.values():
            rows.append(self._row(c, done.get(c.key()), goodput.get(c.key())))
        return rows

    def cand_nodes(self, c: Cand) -> int:
        if c.mode == "colocated":
            return self.nodes_of([("colocated", c.replicas, c.shape)])
        return self.nodes_of([("prefill", c.P, c.pshape), ("decode", c.D, c.dshape)])

    def _screen_margin(self, c: Cand) -> float:
        m = self.slo.margin(c.screen) if c.screen else math.nan
        return m if math.isfinite(m) else -math.inf

    def _bump(self, c: Cand, summ: list[dict]) -> Cand | None:
        """The next count of the instance kind that missed (TTFT: prefill, else decode / replicas). A
        disaggregated candidate refused on its seeds adds a prefill instance where TTFT has the least slack
        (the seeds' mean of 1 - value / threshold, over all requests and the late arrivals), else a decode one."""
        if c.mode == "colocated":
            n = Cand("colocated", c.policy, shape=c.shape, replicas=c.replicas + 1, screen=c.screen, engine=c.engine)
        else:
            prefill_missed = _least_slack(self.slo, summ) == "ttft"
            n = Cand("disaggregated", c.policy, pshape=c.pshape, P=c.P + prefill_missed, dshape=c.dshape,
                     D=c.D + (not prefill_missed), screen=c.screen, engine=c.engine)
        return n if n.gpus <= self.N else None

    def _goodputs(self, ok: list[Cand]) -> dict[tuple, tuple[float, dict | None]]:
        """Goodput of each confirmed candidate, searched from R upward on the first seed and counted where every
        seed holds with a margin interval not below zero (cost at goodput), with the first seed's summary at
        that goodput (`sim.studies.plan.goodputs_above`); at N clients the most clients meeting the SLOs, counted
        on every seed by the same rule, the first seed's summary there and a flag
        (`sim.studies.concurrency_plan.clients_above`)."""
        if self.clients is not None:
            found = clients_above(self.runner, [self.table_of(c, self.seeds[0], True) for c in ok], self.clients,
                                  self.slo, seed_tables=[[self.table_of(c, s, True) for s in self.seeds[1:]]
                                                         for c in ok])
            return {c.key(): f for c, f in zip(ok, found)}
        found = goodputs_above(self.runner, [self.table_of(c, self.seeds[0], True) for c in ok], self.rate, self.slo,
                               seed_tables=[[self.table_of(c, s, True) for s in self.seeds[1:]] for c in ok])
        return {c.key(): f for c, f in zip(ok, found)}

    def _row(self, c: Cand, summ: list[dict] | None, found: tuple[float, dict | None] | None) -> dict:
        base = {"mode": c.mode, "deployment": c.label(), "policy": c.policy, "gpus": c.gpus,
                "rate_rps": self.rate if self.clients is None else math.nan, "engine": c.engine, "engine_version": engine_version(c.engine),
                "what_if": what_if(c.engine, c.policy)}
        if c.mode == "colocated":
            base.update(replicas=c.replicas, tp=c.shape.tp, pp=c.shape.pp, ep=c.shape.ep, attention_dp=1,
                        profile=c.shape.profile,
                        nodes=self.nodes_of([("colocated", c.replicas, c.shape)]))
        else:
            base.update(replicas=c.P + c.D, tp=c.pshape.tp, pp=c.pshape.pp, ep=1, attention_dp=1,
                        profile=c.pshape.profile,
                        prefill_instances=c.P, prefill_tp=c.pshape.tp, prefill_pp=c.pshape.pp,
                        decode_instances=c.D, decode_tp=c.dshape.tp, decode_pp=c.dshape.pp,
                        nodes=self.nodes_of([("prefill", c.P, c.pshape), ("decode", c.D, c.dshape)]))
        price = self.price
        if summ is None:  # not simulated in full: its screen's numbers
            sc = c.screen or {}
            return {**base, "status": "estimated", "num_seeds": 0, "reason": "",
                    "note": "screen only (composed from one instance at its share of the load); not confirmed: "
                            "candidates with fewer GPUs were",
                    "mean_tpot_ms": _num(sc.get("mean_tpot_ms")), "mean_ttft_ms": _num(sc.get("mean_ttft_ms")),
                    **{k: _num(sc.get(k)) for k in self.slo.keys()},
                    # not judged: only a full simulation says whether it meets the SLOs (empty in plan.csv)
                    "screen_margin": self.slo.margin(sc) if sc else math.nan, "meets_slo": math.nan,
                    **cost_columns(c.gpus, price, self.rate if self.clients is None else None, math.nan)}
        row = {**base, "status": "ok", "reason": "", "num_seeds": len(summ), **at_rate_row(summ, self.slo),
               "note": "", TABLE: self.table_of(c, self.seeds[0], False)}
        for k in ("mean_kv_transfer_ms", "p99_kv_transfer_ms", "kv_link_utilisation_max"):
            row[k] = _num(np.nanmean([_num(s.get(k)) for s in summ])) if any(s.get(k) is not None for s in summ) \
                else math.nan
        row["screen_margin"] = self.slo.margin(c.screen) if c.screen else math.nan
        g = found[0] if found is not None and found[0] > 0 else None
        row["goodput_rps"] = g if g is not None else math.nan
        at_g = found[1] if found is not None and g is not None else None
        row["goodput_mean_tpot_ms"] = _num(at_g.get("mean_tpot_ms")) if at_g else math.nan
        rate = self.rate
        if self.clients is not None:  # cost at what it serves at N clients (sim/studies/concurrency_plan.py)
            rate = row["rate_rps"] = row["achieved_rps"] = mean_achieved(summ)
            row["concurrency"] = self.clients
            if found is not None:  # the most clients it holds: goodput_clients, goodput_rps the rate there
                row.update(goodput_columns(*found))
        row.update(cost_columns(c.gpus, price, rate if math.isfinite(rate) else None, row["goodput_rps"]))
        if refused_thinly(row):
            row["note"] = "meets the SLOs on every seed in full simulation, thinly: not counted (see warnings)"
        elif not row["meets_slo"]:
            row["note"] = "misses the SLOs in full simulation" + (
                f" on {len(summ) - int(row['seeds_meeting'])} of {len(summ)} seeds" if row["seeds_meeting"] else "")
        elif g is None:
            row["note"] = "goodput not found (no cost at goodput)"
        return row


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _least_slack(slo: SLO, summaries: list[dict]) -> str:
    """The objective (ttft, tpot, e2e) with the least mean slack over `summaries`, 1 - value / threshold, each
    run's slack the smaller of all requests' and the late arrivals' percentile (a missing percentile: none
    for TPOT, whose absence passes; for the others no slack at all)."""
    def slack(s: dict, m: str, q: float, ms: float) -> float:
        vals = [s.get(k) for k in (f"p{q:g}_{m}_ms", f"late_p{q:g}_{m}_ms")]
        vals = [v for v in vals if isinstance(v, (int, float)) and v == v]
        if not vals:
            return math.inf if m == "tpot" else -math.inf
        return 1 - max(vals) / ms
    mean = {m: sum(slack(s, m, q, ms) for s in summaries) / len(summaries) for m, q, ms in slo.objectives()}
    return min(mean, key=lambda m: mean[m])


def _compose(prefill: dict, decode: dict) -> dict:
    """A disaggregated candidate's screen numbers: TTFT from its prefill screen, the rest from its decode
    screen."""
    out = dict(decode)
    for k, v in prefill.items():
        if "ttft" in k:
            out[k] = v
    return out


def rank_cluster(df: pd.DataFrame) -> pd.DataFrame:
    """Ranked order (module docstring): fewest GPUs, then cost per hour, then margin; ties by margin CI."""
    df = df.copy()
    for col in ("margin", "margin_ci_lo", "margin_ci_hi", "cost_per_hour", "goodput_rps"):
        if col not in df:  # (nothing simulated in full)
            df[col] = math.nan
    df["rank"] = math.nan
    df["tied_with_best"] = False
    ok = (df["status"] == "ok") & df.get("meets_slo", pd.Series(False, index=df.index)).fillna(False).astype(bool)
    elig = df[ok].assign(_c=lambda d: d["cost_per_hour"].astype(float).fillna(math.inf))
    elig = elig.sort_values(["gpus", "_c", "margin"], ascending=[True, True, False])
    if len(elig):
        best = elig.iloc[0]
        tied = (elig["gpus"] == best["gpus"]) & (elig["margin_ci_lo"] <= best["margin_ci_hi"] + 1e-12) & \
               (best["margin_ci_lo"] <= elig["margin_ci_hi"] + 1e-12)
        elig.loc[tied, "tied_with_best"] = True
    elig = elig.drop(columns="_c")
    order = {"ok": 0, "estimated": 1, "pruned": 2, "dropped": 3}
    rest = df[~ok].assign(_s=lambda d: d["status"].map(order).fillna(4), _g=lambda d: d["gpus"].fillna(1e9))
    rest = rest.sort_values(["_s", "_g"]).drop(columns=["_s", "_g"])
    out = pd.concat([elig, rest])
    out.loc[elig.index, "rank"] = range(1, len(elig) + 1)
    return out.reset_index(drop=True)


def cluster_verdict(df: pd.DataFrame, rate: float, slo_text: str, max_gpus: int, pruned: int,
                    unit: str = "GPU-hours", clients: int | None = None) -> str:

    top = df[df["rank"] == 1]
    n_full = int((df["status"] == "ok").sum())
    n_est = int((df["status"] == "estimated").sum())
    load = f"{clients} concurrent clients" if clients is not None else f"{rate:g} req/s"
    head = (f"At {load} with {slo_text}, on up to {max_gpus} GPUs: {n_full} deployments simulated in full, "
            f"{n_est} estimated from their screens, {pruned} pruned by the bounds or screens, "
            f"{int((df['status'] == 'dropped').sum())} dropped (no profile, no memory, or a KV pool too small for "
            f"the longest request).")
    if top.empty:
        return head + " None meets the SLOs on every seed within the GPUs allowed: add GPUs, relax the SLOs or " \
                      "lower the rate."
    b = top.iloc[0]
    from sim.studies.verdict import _money

    at_rate = f"{_money(float(b['cost_per_million_at_rate']), unit)} per million requests at {rate:g} req/s" \
        if clients is None else (f"{_money(float(b['cost_per_million_at_rate']), unit)} per million requests at "
                                 f"the {float(b['achieved_rps']):.3g} req/s it serves at {load}")
    gp, cg = b.get("goodput_rps"), b.get("cost_per_million_at_goodput")
    at_g = f" ({_money(float(cg), unit)} at its goodput {gp:.3g} req/s)" if gp == gp and cg == cg else ""
    m = b.get("goodput_clients")
    if at_g and clients is not None and m == m and m is not None:
        at_g = f" ({_money(float(cg), unit)} at the most clients it holds, {m:.0f}, serving {gp:.3g} req/s)"
    text = [head, f"Fewest GPUs: {b['deployment']} on {int(b['gpus'])} GPUs ({int(b['nodes'])} node"
                  f"{'s' if int(b['nodes']) > 1 else ''}, {b['mode']}), margin {100 * b['margin']:.1f}% "
                  f"(95% CI {100 * b['margin_ci_lo']:.1f}% to {100 * b['margin_ci_hi']:.1f}%), {at_rate}{at_g}."]
    other = df[df["rank"].notna() & (df["mode"] != b["mode"])]
    if len(other):
        o = other.iloc[0]
        text.append(f"Best {o['mode']} deployment: {o['deployment']} on {int(o['gpus'])} GPUs, margin "
                    f"{100 * o['margin']:.1f}%.")
    else:
        est = df[(df["status"] == "estimated") & (df["mode"] != b["mode"])]
        if len(est):
            e = est.sort_values("gpus").iloc[0]
            text.append(f"No {e['mode']} deployment was confirmed; its fewest-GPU screen estimate is "
                        f"{e['deployment']} on {int(e['gpus'])} GPUs.")
        else:
            text.append(f"No {'disaggregated' if b['mode'] == 'colocated' else 'colocated'} deployment meets the "
                        f"SLOs within {max_gpus} GPUs.")
    tied = df[df["tied_with_best"] & (df["rank"] > 1)]
    if len(tied):
        text.append(f"Tied with it (same GPUs, margin CIs overlap): {', '.join(tied['deployment'].head(4))}.")
    return " ".join(text)


def run_cluster_plan(args) -> tuple[pd.DataFrame, dict]:
    """`ppsim plan --rate R --max-gpus N` (module docstring): the plan table (ranked) and its metadata."""
    from sim.core.slo import slo_from_specs
    from sim.latency.cluster import load_network

    slo = sustained(slo_from_specs(args.slo, SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)))
    slo.validate("plan --slo")
    if args.rate is None and getattr(args, "concurrency", None) is None:
        raise ConfigError("--max-gpus answers the fewest GPUs that serve a load: give --rate R (req/s) or "
                          "--concurrency N (clients)")
    if args.trace:
        raise ConfigError("--max-gpus with --trace: not supported (the screens split the load by rate); allowed: "
                          "--workload NAME with --rate")
    if args.seeds < 1:
        raise ConfigError("--seeds must be >= 1")
    engines = list(getattr(args, "engine", None) or ["fastpp"])
    for e in engines:
        engine_version(e)  # one-line error naming the known engines
    load_network(args.network)  # one-line error naming the allowed networks
    bad = [p for p in args.policies if p not in POLICIES]
    if bad or not args.policies:
        raise ConfigError(f"--policies {','.join(args.policies)!r}: unknown policy {bad[0] if bad else ''!r}; "
                          f"allowed: {', '.join(POLICIES)}")
    # the same --set as --gpus mode: workload.*, and scheduler.*/latency.*/server.* other than what the plan
    # chooses, each engine's to the runs of the engines that read it (sim.studies.plan.plan_overrides)
    overrides, engine_sets = plan_overrides(args.set)
    context, mem_fraction = engine_sizes(engine_sets)
    model = plan_model_of(args)  # (--gpu, a profile folder's GPU, or the default GPU: sim.studies.plan.plan_gpu)
    routing = getattr(args, "moe_routing", None) or "balanced"
    check_routing(model, routing)
    fam = family_dir(args.gpu)
    price = parse_prices(args.price_per_gpu_hour, [fam.name]).get(fam.name)
    load = plan_load(args, overrides)
    if load.clients is not None:  # a closed loop's probes (sim/studies/concurrency_plan.py)
        load.changes += tuple(x for x in [hold_clients(load.table, load.clients, slo, args.quick,
                                                       "num_requests" in overrides)] if x)
    else:
        load.changes += tuple(x for x in [hold_tail(load.table, slo, load.per_unit, args.quick,
                                                         size_key(load.table) in overrides)] if x)
    if load.per_unit != 1.0:
        raise ConfigError(f"--max-gpus with --workload {args.workload}: a conversation workload's rate is sessions/s, "
                          f"which the screens cannot split by replica; allowed: a request workload, or --gpus N")
    out = Path(args.out)
    seeds = list(range(1, args.seeds + 1))
    runner = Runner(out / "cache.jsonl", jobs=args.jobs, executor=args.executor, address=args.address,
                    progress=not args.no_progress)
    tokens = load.tokens
    shapes, dropped = shapes_of(fam, model, args.max_gpus, args.gpus_per_node, tuple(args.pp),
                                tuple(args.tp) if getattr(args, "tp", None) else None, mem_fraction, context,
                                routing)
    if not shapes:
        raise ConfigError(f"--model {model} on {fam.name}: no instance shape of at most {args.max_gpus} GPUs "
                          f"fits (" + "; ".join(f"TP{r['tp']}xPP{r['pp']}: {r['reason']}" for r in dropped[:3]) + ")")
    plan = ClusterPlan(args, runner, load, slo, seeds, price, fam, tokens)
    plan.engine_sets = engine_sets
    plan.sets = {e: engine_overrides(engine_sets, e, engines) for e in engines}
    # every engine's run config with its --sets validated as ppsim run validates it, before anything runs
    check_engine_sets([{"engine": e, "profile": shapes[0].profile, "replicas": 1, "tp": shapes[0].tp,
                        "pp": shapes[0].pp} for e in engines], load, slo, plan.sets)
    rows = plan.run(shapes)
    df = pd.DataFrame([*rows, *plan.rows, *[{**r, "nodes": nodes_used(args.gpus_per_node, [("x", 1, r["tp"], r["pp"])])}
                                            for r in dropped]])
    for col in ("gpus", "nodes"):  # (every candidate pruned, no shape dropped: no row has them)
        if col not in df:
            df[col] = math.nan
    for col in ("ep", "attention_dp"):  # (rows of no instance shape, e.g. an engine pruned whole: no EP)
        df[col] = df[col].fillna(1).astype(int) if col in df else 1
    df["interconnect"] = fam.name
    df["router"] = "least-loaded"
    if "engine" in df:  # (a dropped shape is dropped for every engine)
        df["engine"] = df["engine"].fillna("-")
    df = rank_cluster(df)
    df["warnings"] = [_cluster_warnings(r) for r in df.to_dict("records")]
    if load.clients is not None and getattr(args, "verify", False):
        checks = verify_clients(runner, df.to_dict("records"), load.clients, slo)
    else:
        checks = verify(runner, df.to_dict("records"), load.rate_rps, slo) if getattr(args, "verify", False) else None
    df = df.drop(columns=[TABLE], errors="ignore")
    meta = {"mode": "rate", "model": str(model), "gpus": args.max_gpus, "max_gpus": args.max_gpus,
            "gpus_per_node": args.gpus_per_node, "network": args.network, "gpu": fam.name,
            "slo": slo.describe(), "seeds": len(seeds), "rate_rps": load.rate_rps, "load": load.note,
            "workload_warnings": list(load.changes), "interconnect_notes": [], "kernel_data_notes": plan.notes,
            "tokens_per_request": tokens["total"], "output_tokens_per_request":
            tokens["output"], "pruned": plan.pruned, "kv_transfer": args.kv_transfer,
            "first_token": args.first_token, "policies": list(args.policies), "engines": engines,
            "engine_versions": {e: engine_version(e) for e in engines},
            "cost_unit": cost_unit({fam.name: price} if price else {}),
            "rule": "fewest GPUs meeting the SLOs on every seed (sustained: not saturated; late arrivals too) with "
                    "the 95% interval of their margins not below zero, then cost per hour, then margin"}
    if load.clients is not None:
        meta.update(mode="concurrency", concurrency=load.clients, load_unit=cp.UNIT, cost_note=cp.COST_NOTE,
                    rule=f"fewest GPUs meeting the SLOs at {load.clients} concurrent clients on every seed (sustained: "
                         f"not saturated; late arrivals too) with the 95% interval of their margins not below "
                         f"zero, then cost per hour, then margin")
    meta["kv_refused"] = plan.refused_lines()
    if moe_of(model) is not None:  # (a dense model's plan.json as before)
        meta["moe_routing"] = routing
    meta["verdict"] = cluster_verdict(df, load.rate_rps, slo.describe(), args.max_gpus, plan.pruned, meta["cost_unit"],
                                      clients=load.clients)
    meta["by_mode_and_nodes"] = by_mode_and_nodes(df)
    if checks is not None:
        meta["verification"] = checks
    return df, meta


def by_mode_and_nodes(df: pd.DataFrame) -> list[str]:
    """One line per (mode, nodes): its best deployment (ranked first, else its fewest-GPU estimate)."""
    lines = []
    cands = df[df["status"].isin(["ok", "estimated"])]
    for (mode, nodes), g in cands.groupby(["mode", "nodes"], sort=True):
        ranked = g[g["rank"].notna()].sort_values("rank")
        if len(ranked):
            r = ranked.iloc[0]
            what = (f"{r['deployment']} on {int(r['gpus'])} GPUs meets the SLOs (margin {100 * r['margin']:.1f}%, "
                    f"95% CI {100 * r['margin_ci_lo']:.1f}% to {100 * r['margin_ci_hi']:.1f}%; rank {int(r['rank'])})")
        else:
            r = g.sort_values(["gpus"]).iloc[0]
            if r["status"] == "ok" and refused_thinly(r):
                what = (f"{r['deployment']} on {int(r['gpus'])} GPUs meets the SLOs on every seed, thinly (the seeds' mean "
                        f"margin {100 * r['margin_seed_mean']:.1f}%, 95% CI from {100 * r['margin_ci_lo']:.1f}%): not counted")
            elif r["status"] == "ok":
                what = f"{r['deployment']} on {int(r['gpus'])} GPUs misses the SLOs in full simulation"
            else:
                what = (f"{r['deployment']} on {int(r['gpus'])} GPUs by its screen (margin "
                        f"{100 * r['screen_margin']:.1f}%), not simulated in full")
        lines.append(f"{mode}, {int(nodes)} node{'s' if int(nodes) > 1 else ''}: {what}")
    return lines


def _cluster_warnings(r: dict) -> str:
    w = []
    head = r.get("kv_headroom")
    if r.get("status") == "ok" and isinstance(head, float) and head == head and head < 0.05:
        w.append(f"KV headroom {head:.1%} < 5% at the rate")
    if r.get("status") == "ok" and 0 < (r.get("seeds_meeting") or 0) < (r.get("num_seeds") or 0):
        w.append(f"meets the SLOs on {int(r['seeds_meeting'])} of {int(r['num_seeds'])} seeds only")
    if r.get("status") == "ok" and refused_thinly(r):
        w.append(THIN_MARGIN.format(**r))
    return "; ".join(w)
