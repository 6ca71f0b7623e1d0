"""`ppsim plan --verify`: does the plan's answer hold when simulated at length?

A plan's probes are as long as its searches can afford (sim/studies/plan_candidates.py: `PROBE_MIN_WINDOW_S`); a
planner presenting an answer wants it checked on a longer run. The check re-simulates, on the first seed
and without an early stop:

- the recommended deployment (rank 1) at the demanded rate (rate mode), and
- the `VERIFY_TOP` candidates with the highest goodputs, each at its own goodput,

each with `VERIFY_FACTOR` times its probe's requests (sessions, for a conversation workload) and at least
`VERIFY_MIN_REQUESTS`, and reports whether each holds: the SLO percentiles met over all requests and the
late arrivals, and the run not saturated (`sim.studies.sweep.SustainedSLO.meets`, the test every probe
applies), with its margin (`SustainedSLO.margin`: the slack of that same test, negative where it fails).
The probes count a rate more strictly than one pass (`sim.studies.sweep.holds_on_seeds`: every paired seed
passes and their margins' 95% interval stays >= 0), so that the one long run checked here holds.
"""

from __future__ import annotations

import copy
import math

from sim.studies.sweep import Runner, size_key, with_rate

VERIFY_FACTOR = 10          # times the probe's requests
VERIFY_MIN_REQUESTS = 5000  # at least (the done-when of issue 39: 5,000+ requests)
VERIFY_TOP = 3              # the highest goodputs checked besides the recommendation
TABLE = "_table"            # a row's first-seed run table (the plan keeps it until the check, never writes it)


def long_table(table: dict, rate: float) -> dict:
    """`table` at `rate` with `VERIFY_FACTOR` x its size (at least `VERIFY_MIN_REQUESTS`), run to the end."""
    t = copy.deepcopy(table)
    wl = t["workload"]
    size = size_key(wl)
    n = int(wl.get(size) or 0)
    if n > 0:
        wl[size] = max(VERIFY_FACTOR * n, VERIFY_MIN_REQUESTS if size == "num_requests" else 0)
    slo = t.get("slo", {})
    slo["stop_when_violated"] = False
    slo.pop("stop_factor", None)
    slo.pop("stop_when_met", None)
    return with_rate(t, rate)


def picks(rows: list[dict], rate_rps: float | None) -> list[tuple[dict, str, float]]:
    """(row, what, rate in req/s) to check: the recommendation at the rate, the top goodputs at theirs."""
    out = []
    best = [r for r in rows if r.get("rank") == 1 and r.get(TABLE)]
    if best and rate_rps:
        out.append((best[0], "recommended, at the rate", float(rate_rps)))
    good = [r for r in rows if r.get(TABLE) and isinstance(r.get("goodput_rps"), float)
            and math.isfinite(r["goodput_rps"]) and r["goodput_rps"] > 0]
    good.sort(key=lambda r: -r["goodput_rps"])
    out += [(r, "top goodput, at it", float(r["goodput_rps"])) for r in good[:VERIFY_TOP]]
    return out


def verify(runner: Runner, rows: list[dict], rate_rps: float | None, slo, per_unit: float = 1.0) -> list[dict]:
    """Each pick's long run and whether it holds (module docstring). `per_unit`: requests per unit of the
    workload's rate (a conversation workload's requests per session), the tables' rates being in that unit."""
    chosen = picks(rows, rate_rps)
    tables = [long_table(r[TABLE], rate / per_unit) for r, _what, rate in chosen]
    results = runner.run(tables, desc="plan: verify") if tables else []
    out = []
    for (r, what, rate), t, s in zip(chosen, tables, results):
        size = size_key(t["workload"])
        out.append({"deployment": r["deployment"], "check": what, "rate_rps": rate,
                    size: t["workload"][size], "holds": bool(slo.meets(s)), "status": s.get("status"),
                    "saturated": bool(s.get("saturated")), "offered_rate_rps": s.get("offered_rate_rps"),
                    "completion_rate_rps": s.get("completion_rate_rps"), "margin": slo.margin(s),
                    **{k: s.get(k) for k in slo.keys()}})
    return out


def describe(checks: list[dict]) -> list[str]:
    """One line per check, for the console and plan.txt."""
    lines = []
    for c in checks:
        size = c.get("num_requests", c.get("num_sessions"))
        nums = ", ".join(f"{k} {v:.4g}" for k, v in c.items() if k.startswith("p") and k.endswith("_ms")
                         and isinstance(v, float))
        lines.append(f"{c['deployment']} ({c['check']}, {c['rate_rps']:.4g} req/s, {size} "
                     f"{'requests' if 'num_requests' in c else 'sessions'}): "
                     f"{'holds' if c['holds'] else 'does NOT hold'} ({nums}"
                     f"{'; saturated' if c['saturated'] else ''}; status {c['status']})")
    return lines
