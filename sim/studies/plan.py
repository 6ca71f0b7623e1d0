"""`ppsim plan`: what-if capacity planning. Which deployment of N GPUs serves a load best?

The planner's modules, each importing only those before it (ARCHITECTURE.md): `plan_candidates`
(models, profiles, splits, KV-pool refusals, overrides, the load), `plan_probes` (probes at a rate,
goodputs, margins, costs), `plan_verify`, `verdict`, `plan_plot`, `concurrency_plan` (users' units),
`cluster_plan` (`--max-gpus`) and this one, which runs the `--gpus N` and plain plans.

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

import math
from pathlib import Path

pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)
np = lazy("numpy")

from sim.core.errors import ConfigError  # noqa: E402
from sim.core.slo import SLO, slo_from_specs  # noqa: E402
from sim.studies.sweep import (Runner, Search, goodput_searches, mean_ci, size_key,  # noqa: E402
                               hold_tail, sustained, with_rate)
from sim.studies.plan_verify import TABLE, verify  # noqa: E402
from sim.studies.verdict import family, rank, verdict  # noqa: E402
from sim.workloads import build_workload_said, resolve_workload  # noqa: E402
from sim.studies import concurrency_plan as cp  # noqa: E402
from sim.studies.cluster_plan import run_cluster_plan  # noqa: E402
from sim.studies.concurrency_plan import hold_clients, plan_rows  # noqa: E402
from sim.studies.concurrency_plan import verify as verify_clients  # noqa: E402
from sim.studies.plan_candidates import (CONTEXT_TOKENS, ENGINE_DEFAULT, ENGINE_POLICIES, FAMILY_GPU,
                                         GOODPUT_REPLICATE, INTERCONNECTS, KV_HEADROOM_WARN, KvPools,
                                         MAX_GPUS_EXHAUSTIVE, MAX_PRICE, MEM_FRACTION, PLAN_OWNS, POLICIES,
                                         PROBE_MIN_WINDOW_S, PlanLoad, PlanModel, QUICK_WINDOW_S, RATES,
                                         SET_SECTIONS, STOP_FACTOR, Split, WHAT_IF, _cluster_of, _folder_profiles,
                                         _library_models, _mean_rate, _resolve_own, _short, check_engine_sets,
                                         check_routing, cluster_table, deployment_table, engine_overrides,
                                         engine_sizes, family_dir, moe_layouts, moe_of, like_for_like, longest_request_tokens, mean_tokens, model_context,
                                         model_gpus, nodes_used, plan_gpu, plan_load, plan_model, plan_model_of,
                                         plan_overrides, policies_for, policy_spec, pool_refusal, probe_window_s,
                                         resolve_profile, splits, throughput_bound_rps,
                                         weights_reason)  # noqa: E402,F401
from sim.core.ep import NO_EP_ENGINES  # noqa: E402
from sim.studies.plan_probes import (COST_NOTE, GOODPUT_RESOLUTION, RULE_GOODPUT, RULE_RATE, THIN_MARGIN, _num,
                                     at_rate_row, cost_columns, cost_per_million, cost_unit, counted_rates,
                                     goodputs_above, kv_headroom, label, metric_columns, parse_prices,
                                     refused_thinly, seed_margin)  # noqa: E402,F401


def run_plan(args) -> tuple[pd.DataFrame, dict]:
    if getattr(args, "max_gpus", None):  # the fewest GPUs over a cluster (sim/studies/cluster_plan.py)
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
    routing = getattr(args, "moe_routing", None) or "balanced"
    check_routing(model, routing)
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
        for sp, eng in ((sp, eng) for sp in splits(fam, fam_name, model, args.gpus, mem_fraction, context, routing)
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
                        "ep": sp.ep, "attention_dp": 1, "gpus": args.gpus, "nodes": nodes, "gpus_per_node": gpn,
                        "network": network if nodes > 1 else "-", "mode": "colocated", "engine": eng,
                        "router": router, "family": family(sp.replicas, sp.tp, sp.pp),
                        "profile": sp.profile, "kv_tokens": sp.kv_tokens}
                reason = sp.reason or ("vllm-v0 runs pp = 1 only (V0's one scheduler per virtual engine is not "
                                       "modelled: sim/engine/schedulers/vllm_v0.py)" if eng == "vllm-v0" and sp.pp > 1
                                       else NO_EP_ENGINES[eng] if sp.ep > 1 and eng in NO_EP_ENGINES else "")
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
    if moe_of(model) is not None:  # (a dense model's plan.json as before)
        meta["moe_routing"] = routing
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
