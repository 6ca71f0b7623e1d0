"""Sweeps: run many simulation points in parallel, cache each result as it completes, and
search the goodput (the highest rate at which P90 TTFT and P90 TPOT meet the SLO).

- A *point* is a run-config table (plain dict). Its id is a hash of the table, so a sweep
  interrupted half-way resumes where it stopped: finished points are read back from the
  cache file (JSON lines, appended and flushed as each point completes).
- Siblings: points that differ only in their [slo] table are simulated as one lock-step run
  (`evaluate_siblings`, sim/engine/lockstep.py; not those that stop once certain to meet the
  SLO, `[slo] stop_when_met`), and static-chunk points that differ only in their chunk as one
  run at the largest chunk; the run stands for a sibling only where it is
  exactly that sibling's own run, and the others are simulated afterwards, so every cached
  summary is the one its own simulation gives.
- Executors: in-process (jobs = 1), local processes (`jobs` > 1, the default; one pool kept
  for the runner's life, so the rounds of a search reuse the workers' set-up; `Runner.close`),
  or a Ray cluster (`executor="ray"`, `address=...`; Ray is an optional extra).
- Goodput: the artifact's integer-rate sweep (any rates: `parse_rates` reads `0.25:4`; the
  same requests at every rate: only the Poisson gaps are rescaled) brackets the goodput (or, for
  a search given a hint, steps that double from the hint on the 0.05 req/s grid: `_gallop`),
  then bisection refines it to `tol` (and to 10% of the rate below 1 req/s) (decisions.md),
  splitting a bracket at whole multiples of `tol` where it is made of them (`_split`: the goodput
  lands on the 0.05 req/s grid); a search failing at its lowest rate runs bisection's lowest
  probe first.
  A failed run does not meet the SLO. If the outcome is not monotone in the rate, the highest
  passing rate below the first failing one is reported and flagged.
- Sustainable, not absorbed: a rate passes only if the late arrivals (the last quarter of the
  arrival window) meet the SLO percentiles too (`sim.outputs.metrics.meets_slo`), and a run never spans
  a shorter arrival window than the artifact's at the top of its sweep (beyond the sweep's range
  the number of requests grows with the rate; `Search.window_s`).
"""

from __future__ import annotations

from sim.core.lazy import lazy

import copy
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
sstats = lazy("scipy.stats")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError, PipeSimError
from sim.outputs.metrics import meets_slo  # noqa: F401  (re-exported: the goodput criterion)
from sim.core.slo import SLO, pkey
from dataclasses import fields

# A hinted search's first step away from its hint (req/s; `_gallop`). It moves no result on a
# monotone outcome, only the number of runs: of 0.1, 0.2, 0.4 and 0.6, 0.4 took the fewest in a
# replay of the committed results' searches (`benchmarks/search_replay.py`; benchmarks/README.md,
# "Sweeps"), whose other seeds sit a median 7 cells of 0.05 req/s from the hint they start at.
GALLOP_RPS = 0.4
# A search's flags: it still passes at the highest rate it may run; its goodput lies above the
# sweep's top rate (found by extension or by a gallop).
NOT_BRACKETED = "not_bracketed (passes at the highest rate)"
# The arrival window a run spans at least, when neither the search nor its config says (req/s
# of the artifact's sweep top: 400 Azure requests over 1..10 req/s span 40 s at 10 req/s).
REFERENCE_RATE_RPS = 10.0
# Where a search whose config names no GPU peak (a constant latency model) stops extending.
FALLBACK_MAX_RPS = 1024.0
EXTENDED = "extended beyond the sweep range"

SUMMARY_FIELDS = (
    "status", "reason", "num_requests", "num_finished", "mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms",
    "p99_ttft_ms", "mean_tpot_ms", "p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_e2e_ms", "p50_e2e_ms",
    "p90_e2e_ms", "p99_e2e_ms", "slo_attainment", "ttft_attainment", "tpot_attainment", "throughput_rps",
    "p50_iter_ms", "p90_iter_ms", "p99_iter_ms", "mean_iter_ms", "bubble_fraction", "kv_peak_tokens",
    "kv_peak_active_tokens",
    "kv_capacity_tokens", "num_retractions", "duration_s", "num_iterations", "num_chunk_decisions",
    "num_rebalancer_moves", "bubble_ms_per_iter", "total_bubble_s", "prefill_tokens_per_s", "output_tokens_per_s",
    "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms", "slo", "meets_slo", "num_late_requests", "saturated",
    "sustained_throughput_rps", "offered_rate_rps", "completion_rate_rps", "num_truncated_prompts", "num_clipped_outputs",
    # multi-node and disaggregated runs (sim/outputs/cluster.py; absent: None)
    "mode", "gpus", "nodes_used", "mean_kv_transfer_ms", "p99_kv_transfer_ms", "kv_link_utilisation_max",
)
# Percentiles an SLO names besides P50/P90/P99 (e.g. p95_ttft_ms) travel with the summary too.
PERCENTILE_KEY = re.compile(r"^(late_)?p[0-9.]+_(ttft|tpot|e2e)_ms$")


@dataclass(frozen=True)
class SustainedSLO(SLO):
    """An SLO whose goodput criterion also asks that the run be not saturated: completions kept up with
    arrivals (`saturated` in its summary, the one definition of sim/outputs/saturation.py), so a rate
    counts only where it is sustained, not absorbed as a burst (`ppsim plan`). Its thresholds, percentiles
    and runs are its SLO's (same tables, same cache keys); only the verdict on a summary adds the check."""

    def meets(self, summary: dict) -> bool:
        return super().meets(summary) and not summary.get("saturated")

    def margin(self, summary: dict) -> float:
        """The margin of the test `meets` applies: the smallest relative slack, 1 - value / threshold, over
        every objective's percentile over all requests and over the late arrivals (`late_p<q>_<metric>_ms`,
        when the summary has it), and for a saturated run at most the completion shortfall, completion /
        offered - 1. Negative where `meets` fails on a threshold, the late arrivals or saturation (before
        issue 39's conservative goodput it read all requests only: a row that missed on its late arrivals
        showed a positive margin)."""
        m = super().margin(summary)
        late = [1 - summary["late_" + pkey(q, metric)] / ms for metric, q, ms in self.objectives()
                if _finite(summary.get("late_" + pkey(q, metric)))]
        if late and m == m:
            m = min(m, *late)
        if not summary.get("saturated"):
            return m
        offered, done = summary.get("offered_rate_rps"), summary.get("completion_rate_rps")
        short = done / offered - 1.0 if offered and done is not None else -1.0
        return min(m, short) if m == m else short


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# How a rate counts (issue 39: "a goodput is the highest probed rate that passes, so its long run sits on
# the SLO boundary"). Every probe and `ppsim plan --verify` judge a run alike, by `SustainedSLO.meets`
# (each percentile over all requests and over the late arrivals within its threshold, the run not
# saturated). One short probe passing is not evidence that the rate holds: a percentile over a probe's
# requests is a noisy estimate of the steady state's, and a rate found as "the highest that passes" is the
# one whose noise was kindest. So a rate counts for a deployment only if, over its paired seeds (the same
# seeds every candidate runs), (1) every seed passes and (2) the lower end of the two-sided
# `HOLD_CONFIDENCE` Student-t interval of the seeds' margins (`SustainedSLO.margin`) is not below zero:
# the steady-state margin, which a long run measures and the seeds' mean estimates, is positive at
# 97.5% one-sided confidence. With one seed there is no interval: (1) alone (the plan says so).
# A deployment whose seeds all pass with a thin, scattered margin is refused: margins of +1%, +4%, +12%
# (mean 5.67%, s.d. 5.69%) give 5.67% - 4.303 x 5.69% / sqrt(3) = -8.5% (tests/test_goodput_seeds.py).
HOLD_CONFIDENCE = 0.95


def holds_on_seeds(slo: SLO, summaries: list[dict]) -> bool:
    """Whether a rate counts for a deployment whose runs at it, one per paired seed, are `summaries` (the
    rule above): every run passes `slo.meets`, and with two seeds or more the lower end of the
    `HOLD_CONFIDENCE` interval of their `slo.margin` is >= 0."""
    if not summaries or not all(slo.meets(s) for s in summaries):
        return False
    if len(summaries) < 2:
        return True
    margins = [slo.margin(s) for s in summaries]
    if not all(_finite(m) for m in margins):
        return False
    return mean_ci(margins, HOLD_CONFIDENCE)[1] >= 0.0


# The probe window of a tail objective (`ppsim plan`; issue 39). A percentile p is the value that
# (100 - p)% of the requests exceed: a P99 over 400 requests rests on 4 of them, and a rate whose P99
# held in such a probe missed it at 5,000 requests (benchmarks/README.md, "Sustained probes and
# --verify"). The rule: a probe holds enough requests that, past its warm-up (the first quarter of the
# load, the share the saturation check's warm-up reads, sim/outputs/saturation.py), the SLO's highest
# percentile rests on at least TAIL_SAMPLES requests beyond it:
#     n >= ceil(TAIL_SAMPLES / ((1 - p / 100) x (1 - WARMUP_SHARE)))
# P90: 267 requests, P95: 534, P99: 2,667, P99.9: 26,667. With 20 samples beyond it the empirical P99
# of 2,000 measured requests is their 20th largest, whose rank's 95% binomial interval (20 +- 1.96
# sqrt(19.8), 11 to 29) puts it between P98.5 and P99.5. `--quick` applies TAIL_SAMPLES_QUICK (a
# screen: P99 on 5 samples, 667 requests). The probe's time window (plan_candidates.py `PROBE_MIN_WINDOW_S`)
# still applies: the larger of the two.
TAIL_SAMPLES = 20
TAIL_SAMPLES_QUICK = 5
WARMUP_SHARE = 0.25


def tail_requests(slo: SLO, quick: bool = False) -> int:
    """The fewest requests a probe of `slo` holds (the rule above), for its highest percentile."""
    ps = [slo.ttft_percentile, slo.tpot_percentile]
    if slo.e2e_ms is not None:
        ps.append(slo.e2e_percentile)
    top = max(float(p) for p in ps)
    if not 0 < top < 100:
        raise ConfigError(f"SLO percentile {top:g}: allowed 0 < p < 100")
    samples = TAIL_SAMPLES_QUICK if quick else TAIL_SAMPLES
    return math.ceil(samples / ((1.0 - top / 100.0) * (1.0 - WARMUP_SHARE)) - 1e-9)


def hold_tail(workload: dict, slo: SLO, per_unit: float = 1.0, quick: bool = False, asked: bool = False) -> str:
    """Raise a Poisson-rate [workload] table's size (requests, or sessions of `per_unit` requests each)
    to `tail_requests(slo)` in place; returns what it did ("" when the table held enough already). A size
    the user `asked` for (`--set workload.num_requests=N`) is kept, with a warning that the tail rests on
    fewer requests."""
    size = size_key(workload)
    n = workload.get(size)
    if not (isinstance(n, int) and n > 0):
        return ""
    need = tail_requests(slo, quick)
    want = math.ceil(need / per_unit - 1e-9) if size == "num_sessions" else need
    if n >= want:
        return ""
    p = max(slo.ttft_percentile, slo.tpot_percentile, slo.e2e_percentile if slo.e2e_ms is not None else 0)
    if asked:
        return (f"workload.{size}={n} kept as --set asks, below the {want} the P{p:g} objective's probes hold "
                f"(sim.studies.sweep.tail_requests): its tail rests on fewer requests")
    workload[size] = want
    return (f"probes hold at least {want} {'sessions' if size == 'num_sessions' else 'requests'} (were {n}): the "
            f"P{p:g} objective rests on >= {TAIL_SAMPLES_QUICK if quick else TAIL_SAMPLES} requests beyond it past "
            f"the first {WARMUP_SHARE:.0%} (sim.studies.sweep.tail_requests)")


def sustained(slo: SLO) -> SustainedSLO:
    """`slo` with the sustained criterion (`SustainedSLO`)."""
    return slo if isinstance(slo, SustainedSLO) else SustainedSLO(**{f.name: getattr(slo, f.name) for f in fields(slo)})


def point_id(table: dict) -> str:
    """A hash of the config table alone (groups sibling points)."""
    return hashlib.sha1(json.dumps(table, sort_keys=True).encode()).hexdigest()[:16]


def point_key(table: dict, inputs: str | None = None) -> str:
    """A point's cache identity: its table and the contents of every file it reads
    (`sim.studies.inputs.input_digest`), so an input edited in place is simulated again."""
    if inputs is None:
        from sim.studies.inputs import input_digest

        inputs = input_digest(table)
    return hashlib.sha1((json.dumps(table, sort_keys=True) + inputs).encode()).hexdigest()[:16]


def evaluate(table: dict) -> dict:
    """Run one point; return its summary (only plain numbers and strings: `SUMMARY_FIELDS` and
    the latency percentiles, so the run keeps no inter-token gaps, which it would not return)."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import summarize

    return _plain(summarize(run(config_from_table(table), itls=False)))


def evaluate_siblings(tables: list[dict]) -> list[dict | None]:
    """Run `tables[0]` once for all `tables`, which differ from it either only in [slo] or, with
    a static chunk policy, only in the chunk size. SLO siblings run in lock step beside it
    (sim/engine/lockstep.py); a chunk sibling is this very run when the chunk budget never bound
    and its chunk is at least the budget every batch needed (sim/engine/schedulers/fastpp.py). Returns
    each table's summary, or None for a table whose own run this one was not exactly."""
    from dataclasses import replace

    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import summarize

    cfgs = [config_from_table(t) for t in tables]
    chunk = cfgs[0].scheduler.chunk_size_tokens
    by_slo = [i for i in range(1, len(cfgs)) if cfgs[i].scheduler.chunk_size_tokens == chunk]
    res = run(cfgs[0], alt_slos=tuple(cfgs[i].slo for i in by_slo), itls=False)
    same = dict(zip(by_slo, res.extras["alternates"]))
    ex = res.extras
    out = [_plain(summarize(res))]
    for i in range(1, len(cfgs)):
        ok = same[i] if i in same else (not ex["chunk_bound"] and cfgs[i].scheduler.chunk_size_tokens >= ex["chunk_need"])
        out.append(_plain(summarize(replace(res, config=cfgs[i]))) if ok else None)
    return out


def _without(table: dict, static_chunk: bool) -> dict:
    # a run that stops once certain to meet its SLO stands for no other SLO (sim/engine/run.py)
    met = isinstance(table.get("slo"), dict) and table["slo"].get("stop_when_met", False)
    t = {k: v for k, v in table.items() if k != "slo" or met}
    if static_chunk:
        t["scheduler"] = {k: v for k, v in t["scheduler"].items() if k != "chunk_size_tokens"}
    return t


def _static_chunk(table: dict) -> bool:
    """A static chunk policy taking its chunk from [scheduler] chunk_size_tokens."""
    sc = table.get("scheduler")
    if not isinstance(sc, dict):
        return False
    pol = sc.get("chunk_policy", {})
    return isinstance(pol, dict) and pol.get("name", "static") == "static" and not pol.get("params")


def _chunk(table: dict):
    return table.get("scheduler", {}).get("chunk_size_tokens")


def _sibling_groups(tables: dict[str, dict]) -> list[list[str]]:
    """Point ids grouped into sibling sets, each a list with its primary first: points that
    differ only in [slo], or (static chunk) only in the chunk size. A set mixing both kinds is
    split by chunk into SLO sets."""
    groups: dict[str, list[str]] = {}
    for pid, t in tables.items():
        groups.setdefault(point_id(_without(t, _static_chunk(t))), []).append(pid)
    out = []
    for pids in groups.values():
        by_chunk: dict = {}
        for p in pids:
            by_chunk.setdefault(_chunk(tables[p]), []).append(p)
        slos = {json.dumps(tables[p].get("slo"), sort_keys=True) for p in pids}
        out += list(by_chunk.values()) if len(by_chunk) > 1 and len(slos) > 1 else [pids]
    return [sorted(g, key=lambda p: _primary_rank(tables[p])) for g in out]


def _primary_rank(table: dict) -> tuple:
    """The sibling to simulate for real: one that runs to the end (no early stop), then the
    largest chunk (the least likely to be bound by its budget), then the loosest SLO (the least
    likely to stop, and every tighter sibling's guard can still be checked beside it)."""
    slo = table.get("slo", {})
    chunk = _chunk(table)
    return (bool(slo.get("stop_when_violated", False)), -(chunk if isinstance(chunk, (int, float)) else 0),
            -float(slo.get("ttft_ms", 2000.0)), -float(slo.get("tpot_ms", 200.0)), point_id(table))


def _plain(summary: dict) -> dict:
    out = {k: summary.get(k) for k in SUMMARY_FIELDS}
    out.update({k: v for k, v in summary.items() if PERCENTILE_KEY.match(k)})
    for k, v in out.items():
        if isinstance(v, float) and math.isnan(v):
            out[k] = None
        elif hasattr(v, "item"):
            out[k] = v.item()
    return out


class Runner:
    """Runs points with caching, in parallel, with a progress bar.

    The cache is a JSON-lines file, one point per line: `{"id", "table", "inputs", "summary",
    "check"}`: `id` is the point's key (`point_key`: its table and `inputs`, the digest of the
    files it reads), `check` a hash of the rest. A line whose inputs changed since is simply
    another point's. It survives faults:

    - a line cut by a kill, or altered on disk, fails to parse or to match its id or check
      and is ignored (that point runs again); appends start on a fresh line;
    - appends are single writes under an exclusive `flock`, flushed and fsynced, so sweeps
      sharing a cache folder never interleave lines; each `run` first reads what other
      sweeps have added, so a point finished elsewhere is not simulated again;
    - summaries are kept as JSON round-trips, so a point read back from the cache is
      identical to one just simulated, and a sweep killed and restarted ends byte-identical.
    """

    def __init__(self, cache_path: str | Path | None = None, jobs: int = 1, executor: str = "process",
                 address: str | None = None, progress: bool = True, evaluate_fn: Callable = evaluate) -> None:
        if executor not in ("process", "ray"):
            raise ConfigError(f"--executor must be one of: process, ray; got {executor!r}")
        if jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {jobs}")
        self.cache_path = Path(cache_path) if cache_path else None
        self.jobs = jobs
        self.executor = executor
        self.address = address
        self.progress = progress
        self.evaluate_fn = evaluate_fn
        self.cache: dict[str, dict] = {}
        self._pool = None  # the worker processes (`_run_processes`), kept between rounds
        self.num_bad_lines = 0  # cut or corrupt cache lines seen (their points run again)
        self._read_offset = 0
        self._inputs: dict[str, str] = {}  # point key -> its input digest (`run`)
        self._load()

    @staticmethod
    def _check(pid: str, table: dict, summary: dict) -> str:
        return hashlib.sha1(json.dumps([pid, table, summary], sort_keys=True).encode()).hexdigest()[:16]

    def _load(self) -> None:
        """Read the cache lines appended since the last read (by this or another sweep)."""
        if not self.cache_path or not self.cache_path.is_file():
            return
        import fcntl

        with self.cache_path.open("rb") as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
            try:
                if os.fstat(fh.fileno()).st_size < self._read_offset:
                    self._read_offset = 0  # the file was replaced: read it again
                fh.seek(self._read_offset)
                data = fh.read()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        end = data.rfind(b"\n") + 1  # a last line without its newline may still be being written
        self._read_offset += end
        for line in data[:end].split(b"\n"):
            if line.strip():
                rec = self._parse(line)
                if rec is None:
                    self.num_bad_lines += 1
                else:
                    self.cache.setdefault(rec["id"], rec["summary"])

    def _parse(self, line: bytes) -> dict | None:
        try:
            rec = json.loads(line)
            pid, table, summary = rec["id"], rec["table"], rec["summary"]
        except (ValueError, TypeError, KeyError):
            return None
        inputs = rec.get("inputs")
        # lines written before the key covered the inputs have none: their inputs are unknown
        if not isinstance(summary, dict) or not isinstance(table, dict) or not isinstance(inputs, str):
            return None
        if pid != point_key(table, inputs) or rec.get("check") != self._check(pid, table, summary):
            return None
        return rec

    def _store(self, pid: str, table: dict, summary: dict) -> None:
        inputs = self._inputs[pid]  # as they were when the round started (`run`)
        text = json.dumps({"id": pid, "table": table, "inputs": inputs, "summary": summary,
                           "check": self._check(pid, table, summary)}, sort_keys=True)
        self.cache[pid] = json.loads(text)["summary"]  # what a resumed sweep reads back
        if self.cache_path:
            import fcntl

            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.cache_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                # a line cut by a kill must not swallow this one
                lead = b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
                os.write(fd, lead + text.encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)  # releases the lock

    def has(self, table: dict) -> bool:
        """Whether `table`'s summary is cached (as of the last read of the cache file)."""
        return point_key(table) in self.cache

    def run(self, tables: list[dict], desc: str = "points") -> list[dict]:
        from sim.studies.inputs import input_digest

        self._load()
        ids = []
        for t in tables:
            inputs = input_digest(t)
            pid = point_key(t, inputs)
            self._inputs[pid] = inputs
            ids.append(pid)
        todo: dict[str, dict] = {}
        for pid, t in zip(ids, tables):
            if pid not in self.cache and pid not in todo:
                todo[pid] = t
        if todo:
            bar = _progress(len(todo), desc, self.progress)
            try:
                tasks = self._tasks(todo)
                if self.executor == "ray":
                    self._run_ray(todo, tasks, bar)
                elif self.jobs == 1 or len(todo) == 1:
                    queue = list(reversed(tasks))
                    while queue:
                        pids = queue.pop()
                        fn, arg = self._call(pids, todo)
                        queue.extend(reversed(self._finish(pids, todo, fn(arg), bar)))
                else:
                    self._run_processes(todo, tasks, bar)
            finally:
                bar.close()
        return [self.cache[pid] for pid in ids]

    # A task is a list of point ids: one point, or sibling points (`_sibling_groups`) simulated
    # as one run, the primary first (`evaluate_siblings`). Siblings the run could not stand for
    # come back as a follow-up task.
    def _tasks(self, todo: dict[str, dict]) -> list[list[str]]:
        if self.evaluate_fn is not evaluate:  # other evaluators return other things: one run each
            return [[pid] for pid in todo]
        return _sibling_groups(todo)

    def _call(self, pids: list[str], todo: dict[str, dict]) -> tuple[Callable, Any]:
        if len(pids) == 1:
            return self.evaluate_fn, todo[pids[0]]
        return evaluate_siblings, [todo[p] for p in pids]

    def _finish(self, pids: list[str], todo: dict[str, dict], result, bar) -> list[list[str]]:
        """Store a task's summaries; return the follow-up task of the siblings left unserved."""
        outs = [result] if len(pids) == 1 else result
        left = []
        for pid, out in zip(pids, outs):
            if out is None:
                left.append(pid)
            else:
                self._store(pid, todo[pid], out)
                bar.update(1)
        return [left] if left else []

    def _run_processes(self, todo: dict[str, dict], tasks: list[list[str]], bar) -> None:
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # slow to import

        # One pool for the runner's life: a search calls `run` once per round (dozens per
        # study), and a fresh pool per round would redo each worker's set-up (imports, the
        # per-process caches of profiles and trace data) every round.
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, initializer=_worker_init,
                                             initargs=(os.getpid(),))
        pool = self._pool
        futures = {}

        def submit(pids):
            fn, arg = self._call(pids, todo)
            fut = pool.submit(fn, arg)
            futures[fut] = pids
            return fut

        pending = {submit(t) for t in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    for t in self._finish(futures.pop(fut), todo, fut.result(), bar):
                        pending.add(submit(t))
        except BaseException as exc:
            for fut in pending:
                fut.cancel()
            # a failed or interrupted round leaves no workers behind (nor a broken pool); on Ctrl-C
            # the workers are stopped at once rather than waited for
            self.abort() if isinstance(exc, KeyboardInterrupt) else self.close()
            raise

    def abort(self) -> None:
        """Stop the worker processes now, their simulations unfinished (on Ctrl-C). A second
        Ctrl-C from here on is ignored: the first one is being handled (the process is ending)."""
        import signal
        import threading

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            # NOTE: the executor's manager thread sees its killed workers as a broken pool and
            # tries to fail futures already cancelled (InvalidStateError in Python 3.11): a
            # report of the abort itself, not news, so it is not printed.
            hook = threading.excepthook
            threading.excepthook = lambda args: None if args.exc_type.__name__ == "InvalidStateError" else hook(args)
            for proc in procs:
                proc.terminate()

    def close(self) -> None:
        """Shut the worker processes down (the next `run` starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _run_ray(self, todo: dict[str, dict], tasks: list[list[str]], bar) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install '.[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False,
                     **({} if self.address else {"num_cpus": self.jobs}))
        remotes: dict = {}
        refs = {}

        def submit(pids):
            fn, arg = self._call(pids, todo)
            if fn not in remotes:
                remotes[fn] = ray.remote(fn)
            ref = remotes[fn].remote(arg)
            refs[ref] = pids
            return ref

        pending = [submit(t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                for t in self._finish(refs.pop(ref), todo, ray.get(ref), bar):
                    pending.append(submit(t))


def _worker_init(parent_pid: int) -> None:
    """Set up a worker process: it ends with its parent, whatever ends the parent (also
    SIGKILL, which runs no clean-up: Linux's parent-death signal), and leaves Ctrl-C to the
    parent, which then shuts the pool down (a worker hit by the terminal's SIGINT would print a
    traceback of its own)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the parent stops its workers with SIGTERM (and a closed terminal sends SIGHUP to them all):
    # each removes its spill folders in $TMPDIR before it ends, which the default action would not
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _worker_ended)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pool's own pipes end idle workers
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_ended(signum, _frame) -> None:
    from sim.core.fsio import remove_temp_folders

    remove_temp_folders()
    os._exit(128 + signum)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled, leave=False, dynamic_ncols=True)


def with_rate(table: dict, rate: float, min_window_s: float = 0.0) -> dict:
    """`table` at `rate`. With `min_window_s`, the number of requests grows with the rate so that
    the arrival window never spans less than `min_window_s` (a high rate is then held long
    enough to tell a sustained load from an absorbed burst)."""
    t = copy.deepcopy(table)
    wl = t.setdefault("workload", {})
    if "concurrency" in wl:  # a closed loop sends when requests finish: a rate would be ignored
        raise ConfigError(f"[workload] concurrency = {wl['concurrency']!r} is a closed loop, whose sends do not "
                          f"follow a rate, so a rate sweep cannot move it; allowed: no 'concurrency' (or "
                          f"'max_concurrency' with the rate), or `ppsim goodput --concurrency LO:HI`")
    wl["rate_rps"] = float(rate)
    size = size_key(wl)
    n = wl.get(size)
    if min_window_s > 0 and isinstance(n, int) and n > 0:
        wl[size] = max(n, math.ceil(rate * min_window_s - 1e-9))
    return t


def size_key(workload: dict) -> str:
    """What a [workload] table counts its size in, at its `rate_rps`: sessions for a conversation workload
    (its rate starts sessions), else requests."""
    return "num_sessions" if "num_sessions" in workload else "num_requests"


@dataclass
class Search:
    """One goodput search: a base config table (without rate), its sweep rates, and the SLO
    the goodput criterion uses (may differ from the table's thresholds, for SLO-scale studies
    of static schemes, whose runs do not depend on the SLO; its percentiles must be the
    table's, whose summaries hold them). `slo` wins over `ttft_ms`/`tpot_ms` (P90/P90)."""

    label: dict
    table: dict
    rates: list[float]
    ttft_ms: float = 2000.0
    tpot_ms: float = 200.0
    results: dict = field(default_factory=dict)  # rate -> summary
    lo: float = 0.0
    hi: float = math.inf
    flag: str = ""
    min_window_s: float | None = None  # None: the sweep's window at its highest rate (see `window_s`)
    slo: SLO | None = None
    full_sweep: bool | None = None  # None: as `goodput_searches` is told
    # For rates off the sweep (extension, bisection), and every rate of a hinted search: a cheaper
    # table giving the same verdict under `slo` (e.g. `table` with an early stop at `slo`), used
    # unless `table` at that rate is already cached. None: `table` everywhere.
    probe_table: dict | None = None
    # Where a search that does not sweep every rate starts (req/s; it gallops from there, `_gallop`):
    # e.g. the goodput another seed found for the same scheme. None: it climbs from the lowest sweep
    # rate (`_climb`). Only the number of runs depends on it when the outcome is monotone in the rate.
    hint_rps: float | None = None
    _ceiling: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.slo is None:
            self.slo = SLO(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms)
        self.ttft_ms, self.tpot_ms = self.slo.ttft_ms, self.slo.tpot_ms

    def passes(self, rate: float) -> bool:
        return meets_slo(self.results[rate], self.slo)

    @property
    def window_s(self) -> float:
        """The shortest arrival window a run of this search may span, so that a high rate is held
        long enough to tell a sustained load from an absorbed burst: `min_window_s` when given
        (the experiments give the artifact's own window at the top of its sweep), else the config's
        own window (its requests at its workload's `rate_rps`, or at `REFERENCE_RATE_RPS`). It
        depends on the search's config only, never on which rates the sweep runs: a point's
        result is the same whatever other points a sweep holds."""
        if self.min_window_s is not None:
            return self.min_window_s
        wl = self.table.get("workload", {})
        n, rate = wl.get(size_key(wl)), wl.get("rate_rps")
        if not (isinstance(n, int) and n > 0):
            return 0.0
        ok = isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < math.inf
        return n / (rate if ok else REFERENCE_RATE_RPS)

    @property
    def ceiling_rps(self) -> float:
        """The physical ceiling of this search's rate (`sim.studies.inputs.ceiling_rps`)."""
        if self._ceiling is None:
            from sim.studies.inputs import ceiling_rps

            try:
                self._ceiling = ceiling_rps(self.table)
            except PipeSimError:
                self._ceiling = math.inf  # (fake tables in tests; a real one fails when it runs)
        return self._ceiling

    def at(self, rate: float, cached: Callable[[dict], bool] | None = None) -> dict:
        t = with_rate(self.table, rate, self.window_s)
        # `cached` unknown: the sweep's own rates run `table` (they are the ones other studies share)
        if self.probe_table is None or (cached(t) if cached is not None else rate in self.rates):
            return t
        return with_rate(self.probe_table, rate, self.window_s)


def goodput_searches(runner: Runner, searches: list[Search], tol: float = 0.05, desc: str = "goodput",
                     max_rate: float = math.inf, full_sweep: bool = True, step: int = 2,
                     gallop_rps: float | None = GALLOP_RPS) -> list[dict]:
    """Run several goodput searches together: the integer-rate sweep, then (for searches that
    still pass at their highest rate) extension rounds at 1.5x the highest rate until a rate
    fails, up to each search's physical ceiling (`Search.ceiling_rps`: the rate whose prompt
    tokens alone need the deployment's whole BF16 peak) and `max_rate`, then bisection rounds
    (one midpoint per unfinished search per round). A search that passes at its ceiling is
    flagged `not_bracketed`.

    A full sweep (`full_sweep=True`, or a search's own `full_sweep`) runs every rate of the
    sweep in the first parallel batch (the artifact's sweep, for per-rate figures). Otherwise a
    search with a `hint_rps` gallops from it (`_gallop`: steps of `gallop_rps`, doubling, on the
    `tol` grid, between the lowest sweep rate and `max_rate`) until a passing and a failing rate
    bracket the goodput, and one without climbs the sweep's rates `step` at a time from the
    lowest until a passing and a failing rate are adjacent (`_climb`; so do hinted searches, from
    the sweep rate at or below their hint, with `gallop_rps=None`). Either gives the full
    sweep's goodput when the outcome is monotone in the rate, with far fewer runs (non-monotone
    outcomes outside the rates run go unseen). All kinds share the batches."""
    limit = {id(s): min(max_rate, s.ceiling_rps) if math.isfinite(s.ceiling_rps) else
             (max_rate if math.isfinite(max_rate) else FALLBACK_MAX_RPS) for s in searches}
    first = {id(s): (full_sweep if s.full_sweep is None else s.full_sweep) for s in searches}
    gallops = {id(s) for s in searches if not first[id(s)] and s.hint_rps is not None and gallop_rps is not None}
    while True:
        jobs = []
        for s in searches:
            if first[id(s)]:
                rates = sorted(s.rates)
            elif id(s) in gallops:
                rates = _gallop(s, gallop_rps, tol, limit[id(s)])
            else:
                rates = _climb(s, step)
            jobs += [(s, r) for r in rates]
            first[id(s)] = False
        if not jobs:
            break
        res = runner.run([s.at(r, runner.has if s.hint_rps is not None else None) for s, r in jobs],
                         desc=f"{desc}: sweep")
        for (s, r), out in zip(jobs, res):
            s.results[r] = out
    for s in searches:
        if id(s) in gallops:
            _gallop_bracket(s)
        else:
            _bracket(s)
    while True:
        # NOTE: beyond the sweep's range, so that a goodput above it is found, not capped.
        open_ = [s for s in searches if not math.isfinite(s.hi) and max(s.results) < limit[id(s)] - 1e-9]
        if not open_:
            break
        nxt = [min(limit[id(s)], float(max(math.ceil(max(s.results) * 1.5), max(s.results) + 1))) for s in open_]
        _probe(runner, list(zip(open_, nxt)), f"{desc}: extend", fail_flag=EXTENDED)
    # A search failing at its lowest rate most often has no goodput at all, which bisection
    # learns only after its every probe failed. Its last probe (the lowest) goes first: if that
    # fails, a monotone outcome fails at every probe, and the goodput is 0 after one run (the
    # runs at a fraction of 1 req/s are the longest: every request alone, until the early stop
    # is certain). If it passes, bisection goes on from the same bracket (same probes, same
    # result; the run is cached if bisection reaches it).
    floor = [s for s in searches if s.lo == 0 and math.isfinite(s.hi) and s.hi > tol + 1e-9]
    if floor:
        probes = [(s, _lowest_probe(s.hi, tol)) for s in floor]
        res = runner.run([s.at(r, runner.has) for s, r in probes], desc=f"{desc}: floor")
        for (s, r), out in zip(probes, res):
            s.results[r] = out
            if not meets_slo(out, s.slo):
                s.hi = r
    while True:
        active = [s for s in searches if math.isfinite(s.hi) and s.hi - s.lo > _resolution(s.lo, s.hi, tol) + 1e-9]
        if not active:
            break
        _probe(runner, [(s, _split(s.lo, s.hi, _resolution(s.lo, s.hi, tol))) for s in active], f"{desc}: bisect")
    out = []
    for s in searches:
        if id(s) in gallops:
            _gallop_flag(s)
        out.append({**s.label, "goodput_rps": round(s.lo, 4), "flag": s.flag})
    return out


def parse_rates(text: str, flag: str = "--rates") -> list[float]:
    """`LO:HI` or `LO:HI:STEP` (req/s, fractions allowed) -> the sweep rates LO, LO + STEP, ...
    up to HI inclusive. STEP defaults to min(1, LO): 1:10 is 1..10, 0.25:4 is 0.25, 0.5, ..., 4."""
    hint = f"{flag} {text!r}: expected LO:HI or LO:HI:STEP in req/s, e.g. 1:10 or 0.25:4 or 0.5:4:0.5"
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(hint)
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(hint) from None
    lo, hi = vals[0], vals[1]
    step = vals[2] if len(vals) == 3 else min(1.0, lo)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ConfigError(f"{flag} {text!r}: need 0 < LO <= HI")
    if not (math.isfinite(step) and step > 0):
        raise ConfigError(f"{flag} {text!r}: STEP must be > 0")
    n = int(math.floor((hi - lo) / step + 1e-9))
    if n > 1000:
        raise ConfigError(f"{flag} {text!r}: {n + 1} rates; use a larger STEP (at most 1001 rates)")
    return [round(lo + i * step, 6) for i in range(n + 1)]


def _probe(runner: Runner, probes: list[tuple[Search, float]], desc: str, fail_flag: str = "") -> None:
    """Run one rate per search in one parallel batch; a pass raises the search's lower bound,
    a failure lowers its upper bound (and sets `fail_flag`, if given)."""
    res = runner.run([s.at(r, runner.has) for s, r in probes], desc=desc)
    for (s, r), out in zip(probes, res):
        s.results[r] = out
        if meets_slo(out, s.slo):
            s.lo = r
        else:
            s.hi = r
            if fail_flag:
                s.flag = fail_flag


def _climb(s: Search, step: int) -> list[float]:
    """The next sweep rates a climbing search runs: first `step` rates from the sweep rate at or
    below its hint (default: the lowest rate) up; then, while every rate run passes, the `step`
    rates above the highest pass, or, once a rate fails, the `step` rates below the lowest failure
    down to the highest pass; nothing once a pass and a failure are adjacent sweep rates (or a
    failure is at the bottom, or every rate up to the top passes). When the outcome is monotone
    in the rate this brackets the goodput between the same two sweep rates wherever it starts."""
    rates = sorted(s.rates)
    if not s.results:
        hint = rates[0] if s.hint_rps is None else s.hint_rps
        i = max(sum(r <= hint for r in rates) - 1, 0)
        return rates[i:i + step]
    fails = [r for r in s.results if not s.passes(r)]
    if fails:
        top_fail = min(fails)
        passes = [r for r in s.results if r < top_fail and s.passes(r)]
        floor = max(passes) if passes else -math.inf
        gap = [r for r in rates if floor < r < top_fail and r not in s.results]
        return gap[::-1][:step]
    return [r for r in rates if r > max(s.results) and r not in s.results][:step]


def _gallop(s: Search, step_rps: float, tol: float, max_rate: float) -> list[float]:
    """The next rate a hinted search probes: first its hint (on the `tol` grid, inside [lowest
    sweep rate, `max_rate`]); then, while every rate run passes, the highest pass plus
    `step_rps` x 2^(passes - 1) (at most `max_rate`), or, while every rate run fails, the lowest
    failure minus `step_rps` x 2^(failures - 1) (at least the lowest sweep rate); nothing once a
    pass and a failure bracket the goodput, the lowest sweep rate fails, or `max_rate` passes.
    The distance covered doubles with each probe, so a goodput d req/s from the hint is
    bracketed in about log2(d / step_rps) + 2 runs, and the bracket is whole `tol` cells, which
    bisection then splits on the same grid (`_split`): the goodput is the full sweep's when the
    outcome is monotone in the rate. Below the lowest sweep rate the search is plain bisection
    from (0, lowest rate), as for every other search."""
    lowest = min(s.rates)

    def grid(rate: float) -> float:
        return round(round(rate / tol) * tol, 6)

    if not s.results:
        return [min(max(grid(s.hint_rps), lowest), max_rate)]
    passes = [r for r in s.results if s.passes(r)]
    fails = [r for r in s.results if not s.passes(r)]
    if passes and fails:
        return []
    if passes:
        top = max(passes)
        return [] if top >= max_rate else [min(grid(top + step_rps * 2 ** (len(passes) - 1)), max_rate)]
    bottom = min(fails)
    return [] if bottom <= lowest else [max(grid(bottom - step_rps * 2 ** (len(fails) - 1)), lowest)]


def _gallop_bracket(s: Search) -> None:
    """A galloped search's bracket: its lowest failure (or none) and the highest pass below it."""
    fails = [r for r in s.results if not s.passes(r)]
    s.hi = min(fails) if fails else math.inf
    s.lo = max((r for r in s.results if r < s.hi and s.passes(r)), default=0.0)
    if not fails:
        s.flag = NOT_BRACKETED


def _gallop_flag(s: Search) -> None:
    """After bisection: a galloped goodput at or above the sweep's top rate is flagged as a swept
    search's extension would be on a monotone outcome."""
    if math.isfinite(s.hi) and s.lo >= max(s.rates):
        s.flag = EXTENDED


def _resolution(lo: float, hi: float, tol: float) -> float:
    """How narrow bisection makes the bracket (lo, hi): `tol`, and 10% of the rate once a rate
    below 1 req/s has passed (an absolute tolerance is coarse there: 0.25 req/s is found as 0.25,
    not 0.2)."""
    return min(tol, 0.1 * hi) if lo > 0 else tol


def _split(lo: float, hi: float, res: float) -> float:
    """Bisection's next probe in the bracket (lo, hi), to be narrowed to `res`. A bracket that is a
    whole number of cells of `res` (an integer bracket at 0.05 req/s is 20 cells) is split at a
    cell boundary, its smaller half below, so that it ends one cell wide: 4.4 probes on average
    and at most 5 for 20 cells, against 5 halvings to 1/32 (decisions.md: 0.05 req/s, not
    finer). Any other bracket is halved."""
    cells = (hi - lo) / res
    n = round(cells)
    if n >= 2 and abs(cells - n) < 1e-6:
        return round(lo + res * (n // 2), 6)
    return round((lo + hi) / 2, 6)


def _lowest_probe(hi: float, tol: float) -> float:
    """The last rate bisection probes from the bracket (0, hi) when every probe fails."""
    while hi > tol + 1e-9:
        hi = _split(0.0, hi, tol)
    return hi


def _bracket(s: Search) -> None:
    rates = sorted(r for r in s.rates if r in s.results)
    passing = [s.passes(r) for r in rates]
    if all(passing):
        s.lo, s.hi, s.flag = rates[-1], math.inf, NOT_BRACKETED
        return
    first_fail = next(i for i, p in enumerate(passing) if not p)
    s.hi = rates[first_fail]
    s.lo = rates[first_fail - 1] if first_fail > 0 else 0.0
    if any(passing[first_fail + 1:]):
        s.flag = "non_monotone"


def per_rate_rows(searches: Iterable[Search]) -> list[dict]:
    """Every simulated rate of every search, as tidy rows."""
    rows = []
    for s in searches:
        for rate in sorted(s.results):
            r = s.results[rate]
            rows.append({**s.label, "rate_rps": rate, "integer_rate": rate in s.rates,
                         **r, "meets_slo": meets_slo(r, s.slo)})
    return rows


def mean_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and a t-distribution confidence interval over replications."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return math.nan, math.nan, math.nan
    m = float(v.mean())
    if len(v) == 1:
        return m, m, m
    half = float(sstats.t.ppf((1 + confidence) / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return m, m - half, m + half


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.1f}s"
