"""The highest concurrency meeting an SLO: a sweep over closed-loop client counts.

The users' unit of a benchmark like `vllm bench serve --max-concurrency N` or genai-perf's
`--concurrency N`: N clients in a closed loop (`[workload] concurrency = N`,
sim/workloads/client.py), each sending its next request when the previous one finishes. The
search runs the levels LO, 2 LO, 4 LO, ... up to HI (doubling, as concurrency sweeps are run),
then bisects on the integers between the highest passing level and the lowest failing one.
A level passes when the run meets the config's SLO (`sim.outputs.metrics.meets_slo`: every
request finished, each percentile within its threshold, the late arrivals too).

Each run sends at least `MIN_ROUNDS` requests per client (`num_requests` grows with N), so a
high level is held long enough for its steady state rather than its ramp; the request list is
the workload's, consumed in order.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from sim.core.errors import ConfigError

MIN_ROUNDS = 8  # requests per client at the least
MAX_LEVEL = 1 << 20


def parse_levels(text: str, flag: str = "--concurrency") -> tuple[int, int]:
    """`LO:HI` (integers, 1 <= LO <= HI) -> (LO, HI)."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not 1 <= lo <= hi <= MAX_LEVEL:
        raise ConfigError(f"{flag} {text!r}: expected LO:HI, integers with 1 <= LO <= HI <= {MAX_LEVEL}, e.g. 1:128")
    return lo, hi


def sweep_levels(lo: int, hi: int) -> list[int]:
    """LO, 2 LO, 4 LO, ... and HI."""
    levels, n = [], lo
    while n < hi:
        levels.append(n)
        n *= 2
    levels.append(hi)
    return levels


def with_concurrency(table: dict, n: int) -> dict:
    """`table` with a closed loop of `n` clients (open-loop fields removed), at least
    `MIN_ROUNDS` requests per client."""
    t = copy.deepcopy(table)
    wl = t.setdefault("workload", {})
    wl.pop("max_concurrency", None)
    wl["concurrency"] = int(n)
    num = wl.get("num_requests")
    if isinstance(num, int) and not isinstance(num, bool):
        wl["num_requests"] = max(num, MIN_ROUNDS * n)
    return t


@dataclass
class ConcurrencySearch:
    table: dict
    slo: object
    results: dict = field(default_factory=dict)  # level -> summary

    def passes(self, n: int) -> bool:
        from sim.outputs.metrics import meets_slo

        return meets_slo(self.results[n], self.slo)


def search(runner, table: dict, slo, lo: int, hi: int, desc: str = "concurrency") -> tuple[int, ConcurrencySearch]:
    """(highest level meeting the SLO, or 0 when LO fails; the search with every run's summary)."""
    s = ConcurrencySearch(table, slo)
    levels = sweep_levels(lo, hi)
    for n, summary in zip(levels, runner.run([with_concurrency(table, n) for n in levels], desc=desc)):
        s.results[n] = summary
    # the last passing level before the first failing one (a pass above a failure is not trusted)
    good, bad = 0, None
    for n in levels:
        if not s.passes(n):
            bad = n
            break
        good = n
    if good == 0:
        return 0, s
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        s.results[mid] = runner.run([with_concurrency(table, mid)], desc=desc)[0]
        if s.passes(mid):
            good = mid
        else:
            bad = mid
    return good, s


def rows(s: ConcurrencySearch, keys: list[str]) -> list[dict]:
    """One row per level run: concurrency, verdict, the SLO's percentiles, requests per second."""
    out = []
    for n in sorted(s.results):
        r = s.results[n]
        dur, fin = r.get("duration_s"), r.get("num_finished")
        rps = fin / dur if isinstance(dur, (int, float)) and dur and fin is not None else math.nan
        out.append({"concurrency": n, "meets_slo": s.passes(n), **{k: r.get(k) for k in keys},
                    "request_throughput": rps, "status": r.get("status")})
    return out
