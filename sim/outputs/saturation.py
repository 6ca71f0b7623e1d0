"""Saturation: did the offered load exceed what the server can serve, and what can it serve?

A run whose queue keeps growing tells the capacity of the deployment: while requests wait,
the server never runs short of work, so its completion rate is its service rate. The
definitions (times in seconds of simulated time):

- t0: the first arrival; t_e: the end of the load, min(last arrival, end of the run).
- W(t): the waiting queue (arrived, not admitted, retracted ones included) after each
  scheduler iteration, `num_waiting` in iterations.csv.
- The saturated phase [t_s, t_q]: t_s is the end of the last iteration that started at or
  before t_e with an empty queue (t0 if the queue was never empty); t_q is the start of the
  first iteration after t_s with an empty queue (the queue drained after the load), or the
  end of the run. With replicas, the intersection over replicas (every replica has work queued).
- saturated = (t_e - t_s >= (t_e - t0) / 2) and (more requests arrived than finished in
  (t_s, t_e]): the queue stayed non-empty over at least the second half of the load and the
  backlog grew.
- sustained_throughput_rps: completions per second over the saturated phase, counted from
  t_a = max(t_s, first completion) (before the first completion the pipeline is filling):
  #{finish in (t_a, t_q]} / (t_q - t_a). Reported for saturated runs only (None otherwise:
  then the completion rate is the offered load, not the capacity). It converges as runs get
  longer; a run whose whole saturated phase is the first fill of the KV pool underestimates
  it. Default config at 20 req/s: 3.1 req/s from 400 requests, 5.6 from 2,000, 5.76 from 5,000
  (the run fails at t = 668 s with "exit") and 5.84 with "retract" (all 5,000 served).

The queue alone misses an overload that piles up in the running set rather than the waiting
queue (vLLM V1 admits every request its KV pool holds: at 60 req/s offered against a capacity
of about 20 its queue stayed empty while its batch grew), and a disaggregated run has one
queue per instance. So completions are also compared with arrivals directly, for every engine
and mode, on the measured span of the load:

- warm-up: the median end-to-end latency L0 of the requests arriving in the first quarter of
  the load (before it, the first completions cannot have come); the measured span is
  (t_m, t_e], t_m = max(t0 + (t_e - t0) / 2, t0 + L0): the second half of the load, never
  within the warm-up.
- offered_rate_rps = arrivals in the span / its length; completion_rate_rps = completions in
  the span / its length (in a steady state they agree up to noise).
- backlogged = arrivals - completions in the span > max(BACKLOG_SHARE x arrivals, 3 sqrt(arrivals)):
  the backlog (arrived, not finished: queued or running) grew by more than 10% of the span's
  arrivals and beyond Poisson noise.

saturated = the queue condition above OR backlogged: one definition, used by `run` (summary.json),
and through the summary by `goodput`, `plan` and `gate` (`sustained`). For a saturated run
without a queue phase, sustained_throughput_rps is the completion rate over the span.
"""

from __future__ import annotations

import math

from sim.core.lazy import lazy

np = lazy("numpy")
pd = lazy("pandas")

SATURATION_KEYS = ("saturated", "saturated_since_s", "saturated_until_s", "sustained_throughput_rps",
                   "offered_rate_rps", "completion_rate_rps")
BACKLOG_SHARE = 0.1  # the backlog may grow by at most this share of the measured span's arrivals
NOISE_SIGMAS = 3.0   # ... and by at most this many sqrt(arrivals) (Poisson noise on a short span)


def saturation(req_df: pd.DataFrame, it_df: pd.DataFrame, end_s: float) -> dict:
    """The saturation fields of a run from its requests.csv and iterations.csv frames."""
    arrival = req_df["arrival_s"].to_numpy(dtype=float)
    windows = []
    load = load_window(arrival, end_s)
    if load is not None and len(it_df):
        parts = it_df.groupby("replica") if "replica" in it_df.columns else [(0, it_df)]
        windows = [replica_window(it["start_s"].to_numpy(), it["end_s"].to_numpy(), it["num_waiting"].to_numpy(),
                                  *load, end_s) for _replica, it in parts]
    return saturation_of(arrival, req_df["finish_s"].to_numpy(dtype=float, na_value=np.nan), windows, end_s)


def load_window(arrival: np.ndarray, end_s: float) -> tuple[float, float] | None:
    """(t0, t_e) from every request's arrival time; None when there is no load to speak of."""
    arrived = arrival[arrival <= end_s]
    if not len(arrived):
        return None
    t0 = float(arrived.min())
    t_e = min(float(arrived.max()), float(end_s))
    return (t0, t_e) if t_e > t0 else None


def replica_window(start: np.ndarray, end: np.ndarray, waiting: np.ndarray, t0: float, t_e: float,
                   end_s: float) -> tuple[float, float]:
    """One replica's saturated phase (t_s, t_q) from its iterations' start_s, end_s, num_waiting."""
    empty = waiting == 0
    before = empty & (start <= t_e)
    t_s = min(float(end[before].max()), t_e) if before.any() else t0
    after = empty & (start > t_s)
    return t_s, float(start[after].min()) if after.any() else float(end_s)


def saturation_of(arrival: np.ndarray, finish: np.ndarray, windows: list, end_s: float) -> dict:
    """The saturation fields from every request's arrival and finish time (NaN: none) and each
    replica's `replica_window` (none for a run without iterations)."""
    none = {"saturated": False, "saturated_since_s": None, "saturated_until_s": None,
            "sustained_throughput_rps": None, "offered_rate_rps": None, "completion_rate_rps": None}
    load = load_window(arrival, end_s)
    if load is None:
        return none
    t0, t_e = load
    span = measured_span(arrival, finish, t0, t_e)
    backlog = None
    if span is not None:
        t_m = span
        arr_in = int(((arrival > t_m) & (arrival <= t_e)).sum())
        fin_in = int(((finish > t_m) & (finish <= t_e)).sum())  # (NaN compares False)
        rates = {"offered_rate_rps": arr_in / (t_e - t_m), "completion_rate_rps": fin_in / (t_e - t_m)}
        none = {**none, **rates}
        if arr_in - fin_in > max(BACKLOG_SHARE * arr_in, NOISE_SIGMAS * math.sqrt(arr_in)):
            backlog = {"saturated": True, "saturated_since_s": t_m, "saturated_until_s": float(end_s),
                       "sustained_throughput_rps": rates["completion_rate_rps"], **rates}
    t_s, t_q = t0, float(end_s)
    for t_s_r, t_q_r in windows:  # the intersection over replicas
        t_s = max(t_s, t_s_r)
        t_q = min(t_q, t_q_r)
    arrived = arrival[arrival <= end_s]
    finish = finish[~np.isnan(finish)]
    arrivals_in = int(((arrived > t_s) & (arrived <= t_e)).sum())
    finished_in = int(((finish > t_s) & (finish <= t_e)).sum())
    saturated = bool(windows) and (t_e - t_s) >= 0.5 * (t_e - t0) and arrivals_in > finished_in and t_q > t_s
    if not saturated:
        return backlog or none
    t_a = max(t_s, float(finish.min())) if len(finish) else t_q
    rate = float(((finish > t_a) & (finish <= t_q)).sum() / (t_q - t_a)) if t_q > t_a else math.nan
    return {**none, "saturated": True, "saturated_since_s": t_s, "saturated_until_s": t_q,
            "sustained_throughput_rps": rate}


def measured_span(arrival: np.ndarray, finish: np.ndarray, t0: float, t_e: float) -> float | None:
    """t_m, the start of the measured span (t_m, t_e] of the load (module docstring), or None
    when the warm-up covers the whole load (the run is too short to tell)."""
    early = (arrival >= t0) & (arrival <= t0 + 0.25 * (t_e - t0)) & ~np.isnan(finish)
    warm = float(np.median(finish[early] - arrival[early])) if early.any() else 0.0
    t_m = max(t0 + 0.5 * (t_e - t0), t0 + warm)
    return t_m if t_m < t_e else None
