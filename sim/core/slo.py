"""Service-level objectives at any percentile: one frozen dataclass, read by the goodput
criterion, the early-stop guard, the summaries and `ppsim plan`.

An SLO bounds a percentile of a per-request metric: TTFT and TPOT always (the paper's
P90 TTFT <= 2 s and P90 TPOT <= 200 ms by default), E2E optionally. Percentiles are numpy's
default (linear interpolation between order statistics); a summary holds the value of each
percentile an SLO names under `p<q>_<metric>_ms` (e.g. `p95_ttft_ms`, `p99.9_tpot_ms`).

On the command line an SLO is `METRIC:pQ:MS`, e.g. `--slo ttft:p99:1000 --slo tpot:p90:100`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.core.errors import ConfigError

METRICS = ("ttft", "tpot", "e2e")
LATE_FRACTION = 0.25  # the late arrivals: the last quarter of the arrival window (`SLO.meets`)


def pkey(q: float, metric: str) -> str:
    """The summary key of a percentile: pkey(95, "ttft") -> "p95_ttft_ms"."""
    return f"p{q:g}_{metric}_ms"


def late_from_s(first_s: float, last_s: float) -> float:
    """Where the late arrivals start in an arrival window [first_s, last_s] (`SLO.meets`)."""
    return last_s - LATE_FRACTION * (last_s - first_s)


def need_under(n: int, q: float) -> int:
    """How many of n values must be at most x for numpy's q-th percentile (linear interpolation)
    to be at most x whatever the others are: both order statistics it interpolates, at floor(h)
    and (when h is not whole) floor(h) + 1, h = (n - 1) q / 100, must be among them. 0 for no
    values (no percentile: `SLO.meets` lets a missing TPOT pass)."""
    if n <= 0:
        return 0
    h = (n - 1) * (q / 100.0)
    lo = math.floor(h)
    return lo + 1 + (1 if h > lo else 0)


def need_over(n: int, q: float) -> int:
    """How many of n values must exceed x for numpy's q-th percentile (linear interpolation)
    to exceed x whatever the others are: the value at the lower order statistic floor(h),
    h = (n - 1) q / 100, must itself be one of them, so n - floor(h) of them."""
    if n <= 0:
        return 1
    return n - math.floor((n - 1) * (q / 100.0))


@dataclass(frozen=True)
class SLO:
    """The SLOs. `e2e_ms = None`: no E2E objective. `stop_when_violated`: end the run (status
    "stopped") as soon as a percentile is certain to exceed `stop_factor` x its threshold, for
    searches that only need pass or fail (factor 1) or only need numbers for runs that do not
    miss badly (`ppsim plan --rate`, factor 2). `stop_when_met` (with `stop_when_violated`,
    factor 1): also end it (status "met") as soon as the run is certain to meet the SLO, i.e.
    every percentile, over all requests and over the late arrivals (`meets`), is certain to be
    within its threshold whatever the unfinished requests do; the summary's statistics are then
    those of the requests finished so far, and only its verdict is the full run's."""

    ttft_ms: float = 2000.0
    ttft_percentile: float = 90.0
    tpot_ms: float = 200.0
    tpot_percentile: float = 90.0
    e2e_ms: float | None = None
    e2e_percentile: float = 90.0
    stop_when_violated: bool = False
    stop_factor: float = 1.0
    stop_when_met: bool = False

    def validate(self, where: str) -> None:
        from sim.core.checks import number

        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            if getattr(self, key) is not None:  # a finite threshold: inf would pass and fail at once
                number(getattr(self, key), where, f"[slo] {key}", 0, 1e10, lo_open=True)
        number(self.stop_factor, where, "[slo] stop_factor", 1, 1e6)
        if not self.stop_factor >= 1:
            raise ConfigError(f"{where}: [slo] stop_factor must be >= 1, got {self.stop_factor}")
        if self.stop_when_met and not (self.stop_when_violated and self.stop_factor == 1):
            raise ConfigError(f"{where}: [slo] stop_when_met needs stop_when_violated = true and stop_factor = 1 "
                              f"(a run that stops once its verdict is certain, either way)")
        if self.ttft_ms <= 0 or self.tpot_ms <= 0 or (self.e2e_ms is not None and self.e2e_ms <= 0):
            raise ConfigError(f"{where}: [slo] ttft_ms and tpot_ms must be > 0 (and e2e_ms when set)")
        for m in METRICS:
            q = getattr(self, f"{m}_percentile")
            if not 0 < q <= 100:
                raise ConfigError(f"{where}: [slo] {m}_percentile must be in (0, 100], got {q}")

    def objectives(self) -> list[tuple[str, float, float]]:
        """(metric, percentile, threshold ms) of every objective set."""
        out = [("ttft", self.ttft_percentile, self.ttft_ms), ("tpot", self.tpot_percentile, self.tpot_ms)]
        if self.e2e_ms is not None:
            out.append(("e2e", self.e2e_percentile, self.e2e_ms))
        return out

    def keys(self) -> list[str]:
        """The summary keys the SLO reads, e.g. ["p99_ttft_ms", "p90_tpot_ms"]."""
        return [pkey(q, m) for m, q, _ in self.objectives()]

    def describe(self) -> str:
        return " and ".join(f"P{q:g} {m.upper()} <= {ms:g} ms" for m, q, ms in self.objectives())

    def meets(self, summary: dict) -> bool:
        """The goodput criterion: the run completed every request, every percentile the SLO
        names meets its threshold (a run without a TPOT, every output one token long, meets the
        TPOT objective), and so does the same percentile over the late arrivals (the last
        quarter of the arrival window, `late_p<q>_<metric>_ms`, when the summary has it). The
        late check makes the rate sustainable: a server that only absorbs a finite burst serves
        its early arrivals well while its queue keeps growing, and its late arrivals show it."""
        if summary.get("status") == "met":  # stopped once certain to meet its own SLO (`stop_when_met`)
            if summary.get("slo") != self.describe():
                raise ConfigError(f"a run stopped once certain to meet {summary.get('slo')!r} has no verdict "
                                  f"for {self.describe()!r}")
            return True
        if summary.get("status") != "ok" or summary.get("num_finished") != summary.get("num_requests"):
            return False
        for m, q, ms in self.objectives():
            key = pkey(q, m)
            if key not in summary:
                raise ConfigError(f"summary has no {key!r}: it was computed for a different SLO percentile")
            v = summary[key]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                if m == "tpot":
                    continue
                return False
            if v > ms:
                return False
            late = summary.get("late_" + key)
            if late is not None and not (isinstance(late, float) and math.isnan(late)) and late > ms:
                return False
        return True

    def margin(self, summary: dict) -> float:
        """The smallest relative slack over the objectives, 1 - value / threshold (negative:
        missed). NaN when a percentile is missing."""
        slack = []
        for m, q, ms in self.objectives():
            v = summary.get(pkey(q, m))
            if v is None or (isinstance(v, float) and math.isnan(v)):
                if m == "tpot":
                    continue
                return math.nan
            slack.append(1 - v / ms)
        return min(slack) if slack else math.nan

    def scaled(self, factor: float) -> "SLO":
        """The same percentiles with every threshold times `factor` (SLO-scale studies)."""
        return replace(self, ttft_ms=self.ttft_ms * factor, tpot_ms=self.tpot_ms * factor,
                       e2e_ms=None if self.e2e_ms is None else self.e2e_ms * factor)


def parse_slo_spec(text: str, flag: str = "--slo") -> tuple[str, float, float]:
    """`ttft:p99:1000` -> ("ttft", 99.0, 1000.0), or a one-line ConfigError."""
    parts = text.split(":")
    hint = f"{flag} {text!r}: expected METRIC:pQ:MS with METRIC one of {', '.join(METRICS)}, e.g. ttft:p99:1000"
    if len(parts) != 3 or parts[0].lower() not in METRICS or not parts[1].lower().startswith("p"):
        raise ConfigError(hint)
    try:
        q, ms = float(parts[1][1:]), float(parts[2])
    except ValueError:
        raise ConfigError(hint) from None
    if not 0 < q <= 100 or not ms > 0 or not math.isfinite(ms):
        raise ConfigError(f"{flag} {text!r}: the percentile must be in (0, 100] and MS > 0")
    return parts[0].lower(), q, ms


def slo_overrides(specs: list[str]) -> list[str]:
    """`--slo` specs as `--set slo.KEY=VALUE` overrides (for run configs)."""
    out = []
    for text in specs or []:
        m, q, ms = parse_slo_spec(text)
        out += [f"slo.{m}_ms={ms!r}", f"slo.{m}_percentile={q!r}"]
    return out


def slo_from_specs(specs: list[str], base: SLO | None = None) -> SLO:
    """`base` (default: the paper's P90/P90) with each `--slo` spec applied."""
    slo = base or SLO()
    for text in specs or []:
        m, q, ms = parse_slo_spec(text)
        slo = replace(slo, **{f"{m}_ms": ms, f"{m}_percentile": q})
    return slo
