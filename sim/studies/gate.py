"""The statistics of `ppsim gate`: is a candidate policy better than (or no worse than) a
baseline on a metric, judged on paired seeds?

Pure functions on numbers (no simulation here; `sim/cli/gate.py` runs the sides). With
baseline values b_i and candidate values c_i on the same seed i (same arrivals, same latency
draws), the per-seed *improvement* is d_i = c_i - b_i for a higher-is-better metric and
d_i = b_i - c_i for a lower-is-better one, so d > 0 always means "the candidate is better".
The 95% CI of the mean improvement is the paired t interval

    mean(d) +- t_{0.975, n-1} * sd(d) / sqrt(n)        (sd with n - 1 in the denominator)

and the margin m = margin_frac * |mean(b)| is the non-inferiority margin. Verdicts:

    better        CI low  > 0            (better with 95% confidence)
    no worse      CI low >= -m           (not better, but at most m worse)
    worse         CI high < -m           (worse by more than the margin)
    inconclusive  otherwise              (the CI straddles -m)

`--expect better` holds on "better" only; `--expect no-worse` on "better" or "no worse".
When the CI straddles the expectation's boundary (0 for better, -m for no worse), the gate
estimates how many more seeds would make the CI narrow enough to decide, assuming the mean
and the spread stay as measured: the smallest N with t_{0.975, N-1} * sd / sqrt(N) < |mean - boundary|.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sim.core.lazy import lazy
sstats = lazy("scipy.stats")

# gate metric -> (summary field, higher is better, unit)
METRICS = {
    "goodput": ("goodput_rps", True, "req/s"),
    "attainment": ("slo_attainment", True, ""),
    "p90_ttft": ("p90_ttft_ms", False, "ms"),
    "p90_tpot": ("p90_tpot_ms", False, "ms"),
    "p99_tpot": ("p99_tpot_ms", False, "ms"),
    "mean_e2e": ("mean_e2e_ms", False, "ms"),
}
EXPECTATIONS = ("better", "no-worse")
VERDICTS = ("worse", "inconclusive", "no worse", "better")  # worst first
MAX_SEEDS = 10_000


@dataclass(frozen=True)
class Comparison:
    """One paired comparison. Differences are improvements (> 0: candidate better)."""

    n: int
    baseline_mean: float
    candidate_mean: float
    mean_improvement: float
    ci_low: float
    ci_high: float
    margin_abs: float
    verdict: str
    holds: bool
    more_seeds: int | None  # seeds to add to decide the expectation (None: not needed or hopeless)
    note: str
    dropped: int = 0  # seeds without a value on either side (a run without the metric)

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def paired_t_ci(diffs: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the paired t interval; infinite bounds with fewer than 2 values."""
    n = len(diffs)
    if n == 0:
        return math.nan, -math.inf, math.inf
    mean = sum(diffs) / n
    if n == 1:
        return mean, -math.inf, math.inf
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = float(sstats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def verdict_of(ci_low: float, ci_high: float, margin_abs: float) -> str:
    if ci_low > 0:
        return "better"
    if ci_low >= -margin_abs:
        return "no worse"
    if ci_high < -margin_abs:
        return "worse"
    return "inconclusive"


def holds(verdict: str, expect: str) -> bool:
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {EXPECTATIONS}, got {expect!r}")
    return verdict == "better" if expect == "better" else verdict in ("better", "no worse")


def seeds_needed(diffs: list[float], boundary: float, confidence: float = 0.95) -> int | None:
    """Total seeds N for which the t half-width drops below |mean - boundary|, with the
    measured mean and sd; None when that cannot happen (no spread estimate, or the mean
    sits on the boundary)."""
    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    gap = abs(mean - boundary)
    if gap == 0 or sd == 0:
        return None
    for total in range(max(n, 2), MAX_SEEDS + 1):
        if float(sstats.t.ppf((1 + confidence) / 2, total - 1)) * sd / math.sqrt(total) < gap:
            return total
    return None


def compare(baseline: list[float | None], candidate: list[float | None], higher_is_better: bool, expect: str,
            margin_frac: float = 0.05, confidence: float = 0.95) -> Comparison:
    """Compare paired per-seed values (index i = seed i on both sides; None = no value)."""
    if len(baseline) != len(candidate):
        raise ValueError("baseline and candidate need one value per seed each")
    if margin_frac < 0:
        raise ValueError(f"margin must be >= 0, got {margin_frac}")
    pairs = [(b, c) for b, c in zip(baseline, candidate) if _finite(b) and _finite(c)]
    dropped = len(baseline) - len(pairs)
    sign = 1.0 if higher_is_better else -1.0
    diffs = [sign * (c - b) for b, c in pairs]
    b_mean = sum(b for b, _ in pairs) / len(pairs) if pairs else math.nan
    c_mean = sum(c for _, c in pairs) / len(pairs) if pairs else math.nan
    mean, lo, hi = paired_t_ci(diffs, confidence)
    margin_abs = margin_frac * abs(b_mean) if pairs else 0.0
    verdict = verdict_of(lo, hi, margin_abs) if pairs else "inconclusive"
    ok = holds(verdict, expect)
    boundary = 0.0 if expect == "better" else -margin_abs
    more, note = None, ""
    if not ok and lo <= boundary <= hi:
        total = seeds_needed(diffs, boundary, confidence)
        if len(diffs) < 2:
            note = "need at least 2 seeds with values for a confidence interval"
        elif total is None:
            note = "the mean improvement sits on the decision boundary: more seeds are unlikely to decide"
        else:
            more = total - len(diffs)
            side = "hold" if mean > boundary else "fail"
            note = f"about {more} more seeds would likely decide it (the expectation would {side})"
    return Comparison(len(diffs), b_mean, c_mean, mean, lo, hi, margin_abs, verdict, ok, more, note, dropped)


def overall(comparisons: list[Comparison], expect: str) -> tuple[str, bool]:
    """One verdict over several workloads: the worst one; the expectation must hold on each."""
    if not comparisons:
        return "inconclusive", False
    worst = min((c.verdict for c in comparisons), key=VERDICTS.index)
    return worst, all(c.holds for c in comparisons)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def markdown(result: dict) -> str:
    """The short summary for CI logs and pull-request comments, from `ppsim gate`'s JSON."""
    metric, unit = result["metric"], result["unit"]
    direction = "higher is better" if result["higher_is_better"] else "lower is better"
    status = "PASS" if result["overall"]["holds"] else "FAIL"
    lines = [
        f"## PipeSim gate: {status}",
        "",
        f"Candidate `{result['candidate']}` vs baseline `{result['baseline']}` on **{metric}** ({direction}), "
        f"{result['seeds']} paired seeds; expected: **{result['expect']}** (margin {result['margin_pct']:g}% "
        f"of the baseline).",
        "",
        "| workload | baseline | candidate | candidate - baseline (95% CI) | verdict |",
        "|---|---|---|---|---|",
    ]
    sign = 1.0 if result["higher_is_better"] else -1.0
    for w in result["workloads"]:
        c = w["comparison"]
        lo, hi = c["ci_low"], c["ci_high"]
        ci = "(CI n/a)" if lo is None or hi is None else "[{}, {}]".format(*map(_num, sorted((sign * lo, sign * hi))))
        verdict = c["verdict"] + ("" if c["holds"] else " (expectation fails)")
        if c["note"]:
            verdict += f"; {c['note']}"
        if c["dropped"]:
            verdict += f"; {c['dropped']} seeds without a value"
        lines.append(f"| {w['workload']} | {_num(c['baseline_mean'])} {unit} | {_num(c['candidate_mean'])} {unit} | "
                     f"{_num(sign * c['mean_improvement'] if c['mean_improvement'] is not None else None)} {ci} | "
                     f"{verdict} |")
    o = result["overall"]
    lines += ["", f"Overall: **{o['verdict']}**; the expectation {'holds' if o['holds'] else 'does not hold'}."]
    lines += ["", "Per seed (baseline -> candidate): " + "; ".join(
        f"{w['workload']}: " + ", ".join(f"{s}: {_num(b)} -> {_num(c)}" for s, b, c in
                                          zip(result["seed_list"], w["baseline_values"], w["candidate_values"]))
        for w in result["workloads"])]
    return "\n".join(lines) + "\n"


def _num(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:.4g}"
