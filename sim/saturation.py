"""Saturation: did the offered load exceed what the server can serve, and what can it serve?

A run whose queue keeps growing tells the capacity of the deployment, whatever the run
length, if the completions are counted over the phase where the server never ran short of
work. The definitions (all times in seconds of simulated time):

- t0: the first arrival; t_e: the end of the load, min(last arrival, end of the run), so the
  drain after the last arrival (and a run cut short by a failure or a horizon) is excluded.
- W(t): the waiting queue (arrived, not admitted, retracted ones included) after each
  scheduler iteration, `num_waiting` in iterations.csv.
- t_s, the start of the saturated phase: the end of the last iteration that started at or
  before t_e with an empty queue (W = 0), or t0 if the queue was never empty. With replicas,
  the latest such time over the replicas (every replica has work queued from t_s on).
- saturated = (t_e - t_s >= half of the load window, t_e - t0) and (more requests arrived than
  finished in (t_s, t_e]): the queue stayed non-empty over at least the second half of the
  load and the backlog grew.
- sustained_throughput_rps: completions per second over the saturated phase, counted from
  t_a = max(t_s, first completion) (before the first completion the pipeline is filling):
  #{finish in (t_a, t_e]} / (t_e - t_a). Reported for saturated runs only (None otherwise,
  when the completion rate is the offered load, not the capacity).
"""

from __future__ import annotations

import math

import pandas as pd

SATURATION_KEYS = ("saturated", "saturated_since_s", "sustained_throughput_rps")


def saturation(req_df: pd.DataFrame, it_df: pd.DataFrame, end_s: float) -> dict:
    """The saturation fields of a run from its requests.csv and iterations.csv frames."""
    none = {"saturated": False, "saturated_since_s": None, "sustained_throughput_rps": None}
    arrived = req_df[req_df["arrival_s"] <= end_s]
    if arrived.empty:
        return none
    t0 = float(arrived["arrival_s"].min())
    t_e = min(float(arrived["arrival_s"].max()), float(end_s))
    if t_e <= t0:
        return none
    t_s = t0
    if len(it_df):
        groups = it_df.groupby("replica") if "replica" in it_df.columns else [(0, it_df)]
        for _replica, it in groups:
            empty = it[(it["num_waiting"] == 0) & (it["start_s"] <= t_e)]
            if len(empty):
                t_s = max(t_s, min(float(empty["end_s"].max()), t_e))
    finish = req_df["finish_s"].dropna()
    arrivals_in = int(((arrived["arrival_s"] > t_s) & (arrived["arrival_s"] <= t_e)).sum())
    finished_in = int(((finish > t_s) & (finish <= t_e)).sum())
    saturated = (t_e - t_s) >= 0.5 * (t_e - t0) and arrivals_in > finished_in
    if not saturated:
        return none
    t_a = max(t_s, float(finish.min())) if len(finish) else t_e
    rate = float(((finish > t_a) & (finish <= t_e)).sum() / (t_e - t_a)) if t_e > t_a else math.nan
    return {"saturated": True, "saturated_since_s": t_s, "sustained_throughput_rps": rate}
