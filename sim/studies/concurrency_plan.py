"""`ppsim plan --concurrency N`: a plan in users' units, the deployment that holds N concurrent users.

The load is a closed loop of N clients (`[workload] concurrency = N`, sim/workloads/client.py), as
`vllm bench serve --max-concurrency N`, SGLang's `bench_serving --max-concurrency N` and genai-perf's
`--concurrency N` run it: every client sends its next request when its previous one has finished, the
workload's request list consumed in order (its arrival times ignored). Each candidate is simulated at N
clients, meets the SLOs or not (`sim.studies.sweep.SustainedSLO`, as in rate mode), and those meeting them
on every seed are ranked as in rate mode: fewest GPUs, then cost per hour, then margin
(`sim.studies.verdict.rank`).

Probe length, mirroring rate mode (sim/studies/plan_candidates.py `plan_load`, sim/studies/sweep.py `tail_requests`):

- the tail rule: at least `tail_requests(slo)` requests, so that the SLO's highest percentile rests on
  `TAIL_SAMPLES` requests past the warm-up share (`hold_tail`);
- the warm-up: a closed loop starts with all N clients sending at t = 0, a burst no steady state has,
  and fills over its first round. Each client sends at least `MIN_ROUNDS` (8) requests
  (sim/studies/concurrency.py, what `ppsim goodput --concurrency` holds), so that first round is at most
  1/8 of the requests, inside the first quarter the tail rule and the saturation check count as warm-up
  (`WARMUP_SHARE`). A time window as rate mode's (`PROBE_MIN_WINDOW_S`) is not needed: a closed loop
  cannot absorb a rate as a burst (N requests are in flight at every moment), so a deployment is held at
  its own pace once its first round has passed.

A request count the user sets (`--set workload.num_requests=M`) is kept, with a warning when it is below
either bound.

Cost: `cost_per_million_at_rate` is taken at the candidate's achieved throughput at N clients,
`achieved_rps` = completed requests / the run's duration (first send to last finish: vLLM's
`request_throughput`, sim/outputs/bench_metrics.py), mean over its seeds; `rate_rps` carries the same
number (the rate the row's cost and plot point are at). A run stopped early once it certainly misses has
no achieved rate (NaN), as its percentiles.

Goodput in users (`clients_above`, as rate mode's `goodputs_above`): for each candidate meeting the SLOs on
every seed, the most clients meeting them, first seed, searched from N upward: N doubled until a level misses
(at most `CLIENTS_CAP` x N; one still passing there is flagged), then bisection on the integers until the
highest passing level is within 10% of the lowest failing one (sim/studies/plan_probes.py `GOODPUT_RESOLUTION`).
Each level holds `MIN_ROUNDS` requests per client (sim/studies/concurrency.py `with_concurrency`), failing
runs stopped once certain to miss. One seed's highest pass sits on the SLO boundary, so that level is then
stepped down, m, floor(m / 1.1), ... (integer clients, never below N, which counts), until it counts on every
paired seed as a rate does (`counted_clients`, sim/studies/sweep.py `holds_on_seeds`: every seed meets the SLOs
and the lower end of the 95% interval of their margins is >= 0). `goodput_clients` is that level,
`goodput_rps` the rate the first seed achieved there, `cost_per_million_at_goodput` the cost at it (efficiency at
the most users it holds).

`--verify` re-simulates the recommendation at N clients and the `VERIFY_TOP` candidates holding the most
clients at theirs, with `VERIFY_FACTOR` x their probe's requests (at least `VERIFY_MIN_REQUESTS`), no early
stop, and says whether each holds (sim/studies/plan_verify.py).
"""

from __future__ import annotations

import copy
import math

from sim.core.errors import ConfigError
from sim.studies.concurrency import MIN_ROUNDS, with_concurrency
from sim.studies.plan_candidates import (STOP_FACTOR, _cluster_of, check_workload,  # noqa: F401 (check_workload: its home)
                                         deployment_table, policies_for)
from sim.studies.plan_probes import at_rate_row, cost_columns, metric_columns
from sim.studies.plan_verify import TABLE, VERIFY_FACTOR, VERIFY_MIN_REQUESTS, VERIFY_TOP
from sim.studies.sweep import holds_on_seeds, tail_requests

UNIT = "concurrent clients"
RULE = ("among those meeting the SLOs at {n} concurrent clients on every seed (sustained: not saturated; late "
        "arrivals too) with the 95% interval of their margins not below zero, fewest GPUs, then cost per hour, "
        "then margin")
COST_NOTE = ("cost columns: cost_per_hour = GPUs x price; cost_per_million_at_rate = at the candidate's achieved "
             "throughput at N clients (achieved_rps = completed / duration, its rate_rps); "
             "cost_per_million_at_goodput = at the rate it achieves with the most clients meeting the SLOs "
             "(goodput_clients, counted on every seed; goodput_rps, the first seed's)")
CLIENTS_CAP = 16  # the goodput search in clients stops at 16 N (flagged when it still passes there)
RESOLUTION = 1.1  # the highest passing level within 10% of the lowest failing one (plan_probes.py GOODPUT_RESOLUTION)


def check_flags(args) -> None:
    """`--concurrency N` with the flags it excludes: one-line errors."""
    n = getattr(args, "concurrency", None)
    if n is None:
        return
    if getattr(args, "rate", None) is not None:
        raise ConfigError(f"--concurrency {n} and --rate {args.rate:g}: a plan's load is either N closed-loop "
                          f"clients or a rate; allowed: one of them")
    if getattr(args, "trace", None):
        raise ConfigError(f"--concurrency {n} with --trace: a trace is replayed at its timestamps (an open loop); "
                          f"allowed: --workload NAME with --concurrency, or --trace with --rate")


def hold_clients(table: dict, n: int, slo, quick: bool = False, asked: bool = False) -> str:
    """Make the [workload] `table` a closed loop of `n` clients, in place: `concurrency = n` (no
    `max_concurrency`), and at least `MIN_ROUNDS` requests per client and `tail_requests(slo)` requests
    (module docstring). A size the user `asked` for is kept; returns what was done or warned ("" if nothing)."""
    table.pop("max_concurrency", None)
    table["concurrency"] = int(n)
    have = table.get("num_requests")
    if not (isinstance(have, int) and have > 0):
        return ""
    need = max(MIN_ROUNDS * int(n), tail_requests(slo, quick))
    if have >= need:
        return ""
    if asked:
        return (f"workload.num_requests={have} kept as --set asks, below the {need} a closed loop of {n} clients "
                f"holds ({MIN_ROUNDS} per client, and the SLO's tail: sim.studies.concurrency_plan): its warm-up "
                f"and tail weigh more")
    table["num_requests"] = need
    return (f"probes hold at least {need} requests (were {have}): {MIN_ROUNDS} per client of the {n} (the first "
            f"round, all {n} sent at once, is the warm-up) and the SLO's tail (sim.studies.sweep.tail_requests)")


def with_clients(table: dict, n: float) -> dict:
    """A run table at a share of the clients: `ceil(n)` of them (a screen of one instance at its share of N
    clients, sim/studies/cluster_plan.py), the request list as sized for all N (more rounds per client)."""
    t = copy.deepcopy(table)
    t["workload"]["concurrency"] = max(1, math.ceil(n - 1e-9))
    return t


def achieved_rps(summary: dict) -> float:
    """Completed requests / duration (first send to last finish) of a run that ran to the end; NaN otherwise."""
    dur, fin = summary.get("duration_s"), summary.get("num_finished")
    if summary.get("status") != "ok" or not isinstance(dur, (int, float)) or not dur > 0 or fin is None:
        return math.nan
    return float(fin) / float(dur)


def mean_achieved(summaries: list[dict]) -> float:
    vals = [achieved_rps(s) for s in summaries]
    return float(sum(vals) / len(vals)) if vals and all(math.isfinite(v) for v in vals) else math.nan


def long_table(table: dict) -> dict:
    """`table` (a closed loop) with `VERIFY_FACTOR` x its requests (at least `VERIFY_MIN_REQUESTS`), run to
    the end."""
    t = copy.deepcopy(table)
    wl = t["workload"]
    n = int(wl.get("num_requests") or 0)
    if n > 0:
        wl["num_requests"] = max(VERIFY_FACTOR * n, VERIFY_MIN_REQUESTS)
    slo = t.get("slo", {})
    slo["stop_when_violated"] = False
    slo.pop("stop_factor", None)
    slo.pop("stop_when_met", None)
    return t


def verify(runner, rows: list[dict], clients: int, slo) -> list[dict]:
    """The recommendation (rank 1) at `clients` clients and the `VERIFY_TOP` highest `goodput_clients` at
    theirs, re-simulated at length (`long_table`), and whether each holds."""
    chosen = [(r, f"recommended, at {clients} clients", clients)
              for r in rows if r.get("rank") == 1 and r.get(TABLE)][:1]
    good = [r for r in rows if r.get(TABLE) and _finite(r.get("goodput_clients")) and r["goodput_clients"] > 0]
    good.sort(key=lambda r: -r["goodput_clients"])
    chosen += [(r, f"most clients, at {int(r['goodput_clients'])}", int(r["goodput_clients"]))
               for r in good[:VERIFY_TOP]]
    tables = [long_table(with_concurrency(r[TABLE], n)) for r, _what, n in chosen]
    results = runner.run(tables, desc="plan: verify") if tables else []
    return [{"deployment": r["deployment"], "check": what, "concurrency": n, "rate_rps": achieved_rps(s),
             "num_requests": t["workload"].get("num_requests"), "holds": bool(slo.meets(s)),
             "status": s.get("status"), "saturated": bool(s.get("saturated")),
             "offered_rate_rps": s.get("offered_rate_rps"), "completion_rate_rps": s.get("completion_rate_rps"),
             "margin": slo.margin(s), **{k: s.get(k) for k in slo.keys()}}
            for (r, what, n), t, s in zip(chosen, tables, results)]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def clients_above(runner, tables: list[dict], n: int, slo, desc: str = "plan: most clients",
                  seed_tables: list[list[dict]] | None = None) -> list[tuple[int, dict | None, str]]:
    """For each table (a closed loop of `n` clients on its first seed, meeting the SLOs there): (the most clients
    meeting the SLOs, the first seed's summary of its run, a flag) by the search of the module docstring. With
    `seed_tables` (each table's tables on its other paired seeds) that level is stepped down until it counts on
    every seed (`counted_clients`, as `goodputs_above` does for a rate). A table missing the SLOs at `n` gets
    (0, None, "")."""
    k = len(tables)
    lo, hi = [0] * k, [math.inf] * k
    at: list[dict | None] = [None] * k
    cap = CLIENTS_CAP * int(n)
    probes = [(i, int(n)) for i in range(k)]
    while probes:
        res = runner.run([with_concurrency(tables[i], m) for i, m in probes], desc=desc)
        for (i, m), out in zip(probes, res):
            if slo.meets(out):
                lo[i], at[i] = m, out
            else:
                hi[i] = m
        probes = []
        for i in range(k):
            if lo[i] <= 0:
                continue
            if math.isinf(hi[i]):
                m = min(2 * lo[i], cap)
            elif hi[i] / lo[i] > RESOLUTION and hi[i] - lo[i] > 1:
                m = int(round(math.sqrt(lo[i] * hi[i])))
            else:
                continue
            if lo[i] < m < hi[i]:
                probes.append((i, m))
    if seed_tables:
        todo = [i for i in range(k) if lo[i] > n and seed_tables[i]]
        found = counted_clients(runner, [[tables[i], *seed_tables[i]] for i in todo], [lo[i] for i in todo], int(n),
                                slo, f"{desc}: seeds")
        for i, (m, summary) in zip(todo, found):
            lo[i], at[i] = m, summary
    return [(lo[i], at[i], f"passes at {cap} clients (the search's cap, {CLIENTS_CAP} N): at least"
             if lo[i] >= cap else "") for i in range(k)]


def counted_clients(runner, groups: list[list[dict]], starts: list[int], n: int, slo,
                    desc: str) -> list[tuple[int, dict]]:
    """For each group of one candidate's tables, one per paired seed, the highest level of the ladder m,
    floor(m / 1.1), ... (`RESOLUTION`, integer clients, at least one fewer each step) at which it counts,
    `sim.studies.sweep.holds_on_seeds` (every seed meets the SLOs, the 95% interval of their margins not below
    zero: plan_probes.py `counted_rates` for a rate), with the first seed's summary there. The ladder ends at
    `n`, which counts unchecked (the candidate met the SLOs there by the same rule). Every group's step runs in
    one parallel batch."""
    levels = [int(m) for m in starts]
    done: dict[int, tuple[int, dict]] = {}
    todo = list(range(len(groups)))
    while todo:
        res = runner.run([with_concurrency(t, levels[i]) for i in todo for t in groups[i]], desc=desc)
        k, nxt = 0, []
        for i in todo:
            summ = res[k:k + len(groups[i])]
            k += len(groups[i])
            if holds_on_seeds(slo, summ):
                done[i] = (levels[i], summ[0])
                continue
            down = min(levels[i] - 1, math.floor(levels[i] / RESOLUTION + 1e-9))
            if down > n:
                levels[i] = down
                nxt.append(i)
            else:  # back at N, which counts: the first seed's run there
                done[i] = (int(n), runner.run([with_concurrency(groups[i][0], n)], desc=desc)[0])
        todo = nxt
    return [done[i] for i in range(len(groups))]


def plan_rows(runner, cands: list[dict], load, slo, seeds: list[int], price: dict, within: float,
              sets: dict | None = None, asked: tuple[str, ...] | None = None) -> list[dict]:
    """Every candidate x policy at `load.clients` clients (sim/studies/plan.py `_plan_at_rate`'s staging: the
    first seed everywhere, stopped once a percentile certainly exceeds `STOP_FACTOR` x its threshold; the
    other seeds where the first-seed margin is within `within` of the SLO boundary or of the best of its
    cost per hour)."""

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
    per_hour = [round((price[c["interconnect"]] or 1.0) * c["gpus"], 6) for c, _ in items]
    best: dict = {}
    for m, k in zip(margin1, per_hour):
        best[k] = max(best.get(k, -math.inf), m)
    more = [i for i, (m, k) in enumerate(zip(margin1, per_hour)) if len(seeds) > 1 and first[i].get("status") == "ok"
            and (abs(m) <= within or m >= best[k] - within)]
    rest = runner.run([table(*items[i], s) for i in more for s in seeds[1:]], desc="plan: more seeds")
    extra = {i: rest[j * (len(seeds) - 1):(j + 1) * (len(seeds) - 1)] for j, i in enumerate(more)}
    rows = []
    for i, (c, policy) in enumerate(items):
        summ = [first[i], *extra.get(i, [])]
        got = mean_achieved(summ)
        row = {**c, "policy": policy, "status": "ok", "reason": "", "concurrency": load.clients,
               "achieved_rps": got, "rate_rps": got, "num_seeds": len(summ), **at_rate_row(summ, slo), "note": "",
               TABLE: table(c, policy, seeds[0])}
        if first[i].get("status") == "stopped":
            for col in metric_columns(slo) + ["slo_attainment"]:
                row[col] = math.nan  # only the requests finished by the stop: not comparable
            row["note"] = f"misses by more than {STOP_FACTOR:g}x: {first[i].get('reason')}"
        elif len(summ) < len(seeds):
            row["note"] = (f"{len(summ)} seed: first-seed margin {margin1[i]:+.0%} is more than {within:.0%} from "
                           f"the SLO boundary and from the best of its cost")
        rows.append(row)
    # the most clients each holds (first seed, then counted on every seed), for those meeting the SLOs
    meets = [i for i, r in enumerate(rows) if r["meets_slo"]]
    found = clients_above(runner, [table(*items[i], seeds[0]) for i in meets], load.clients, slo,
                          seed_tables=[[table(*items[i], s) for s in seeds[1:]] for i in meets])
    for i, found_i in zip(meets, found):
        rows[i].update(goodput_columns(*found_i))
    for i, row in enumerate(rows):
        c, got = items[i][0], row["achieved_rps"]
        for k, v in goodput_columns(0, None, "").items():  # (missing the SLOs at N: none searched)
            row.setdefault(k, v)
        row.update(cost_columns(c["gpus"], price[c["interconnect"]], got if math.isfinite(got) else None,
                                row["goodput_rps"]))
    return rows


def goodput_columns(most: int, summary: dict | None, flag: str) -> dict:
    """A row's goodput in users: `goodput_clients`, the rate achieved there (`goodput_rps`), its mean TPOT
    (the plot's x) and the search's flag."""
    ok = most > 0 and summary is not None
    return {"goodput_clients": most if ok else math.nan,
            "goodput_rps": achieved_rps(summary) if ok else math.nan,
            "goodput_mean_tpot_ms": float(summary["mean_tpot_ms"]) if ok and summary.get("mean_tpot_ms") is not None
            else math.nan, "goodput_flag": flag}
