"""Run outputs: per-request and per-iteration frames, then summaries.

Three layers, kept apart: the engine appends records; `requests_frame`/`iterations_frame`
turn them into tidy DataFrames (columns documented below); `summarize` computes tallies
(TTFT, TPOT, E2E, per-iteration latency) and time-weighted levels (KV usage, queue).

requests.csv: req_id, status (finished | running | waiting | failed | not_arrived), arrival_s,
admit_s, first_token_s, finish_s, prompt_tokens, output_tokens (requested), max_new_tokens
(after the context clip), generated_tokens, ttft_ms, tpot_ms = (e2e - ttft)/(output - 1),
e2e_ms, num_chunks, num_retractions, slot, truncated_prompt, clipped_output, replica, meets_ttft,
meets_tpot, meets_slo.

iterations.csv: iteration, slot, start_s, end_s, iter_ms, mode (decode | extend | mixed |
idle), num_tokens, prefill_tokens, num_prefill, num_decode, chunk_size, kv_used_tokens,
num_waiting, num_running, replica, and per stage s: stage{s}_start_s, stage{s}_end_s, stage{s}_busy_ms,
stage{s}_idle_ms (idle = the bubble: iteration length minus busy time).
"""

from __future__ import annotations

from sim.lazy import lazy

import math
from array import array

np = lazy("numpy")  # imported on first use (sim/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/lazy.py)

from sim.config import SLOConfig
from sim.engine.records import ModeColumn, StageBusy


def requests_frame(result, slo: SLOConfig | None = None) -> pd.DataFrame:
    slo = slo or result.config.slo
    end = result.end_s
    rows = []
    for r in result.requests:
        if r.finished:
            status = "finished"
        elif r.arrival_s > end:
            status = "not_arrived"
        elif result.status == "failed":
            status = "failed"
        elif r.admit_s is not None and r.state != "waiting":
            status = "running"
        else:
            status = "waiting"
        ttft = (r.first_token_s - r.arrival_s) * 1e3 if r.first_token_s is not None else math.nan
        e2e = (r.finish_s - r.arrival_s) * 1e3 if r.finish_s is not None else math.nan
        tpot = (e2e - ttft) / (r.max_new - 1) if r.finished and r.max_new > 1 else math.nan
        rows.append((r.rid, status, r.arrival_s, r.admit_s, r.first_token_s, r.finish_s, r.orig_prompt_len,
                     r.orig_output_len, r.max_new, r.out_len, ttft, tpot, e2e, r.num_chunks,
                     r.num_retractions, r.slot, r.truncated_prompt, r.clipped_output, r.replica))
    df = pd.DataFrame(rows, columns=[
        "req_id", "status", "arrival_s", "admit_s", "first_token_s", "finish_s", "prompt_tokens",
        "output_tokens", "max_new_tokens", "generated_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
        "num_chunks", "num_retractions", "slot", "truncated_prompt", "clipped_output", "replica"])
    done = df["status"] == "finished"
    df["meets_ttft"] = done & (df["ttft_ms"] <= slo.ttft_ms)
    # NOTE: a one-token output has no TPOT (the artifact omits it); it cannot violate it.
    df["meets_tpot"] = done & (df["tpot_ms"].isna() | (df["tpot_ms"] <= slo.tpot_ms))
    df["meets_slo"] = df["meets_ttft"] & df["meets_tpot"]
    return df


def iterations_frame(result) -> pd.DataFrame:
    # typed columns (sim/engine/records.py) convert without a Python object per value
    df = pd.DataFrame({c: (v.tolist() if isinstance(v, ModeColumn) else np.asarray(v) if isinstance(v, array) else v)
                       for c, v in result.iterations.items()})
    if df.empty:
        return df
    df.insert(4, "iter_ms", (df["end_s"] - df["start_s"]) * 1e3)
    sb = result.stage_busy
    busy = sb.to_numpy() if isinstance(sb, StageBusy) else np.asarray(sb, dtype=float).reshape(len(df), -1)
    overhead = getattr(result, "iteration_overhead_s", 0.0)
    for s in range(busy.shape[1]):
        start = df["start_s"] + overhead
        df[f"stage{s}_start_s"] = start
        df[f"stage{s}_end_s"] = start + busy[:, s]
        df[f"stage{s}_busy_ms"] = busy[:, s] * 1e3
        df[f"stage{s}_idle_ms"] = np.maximum(df["iter_ms"] - busy[:, s] * 1e3, 0.0)
    return df


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def meets_slo(summary: dict, ttft_ms: float, tpot_ms: float) -> bool:
    """The goodput criterion on a summary (from `summarize`, or read back from a sweep cache):
    the run completed every request, and P90 TTFT and P90 TPOT meet the SLOs (a run without a
    TPOT, every output one token long, meets it)."""
    if summary.get("status") != "ok" or summary.get("num_finished") != summary.get("num_requests"):
        return False
    ttft, tpot = summary.get("p90_ttft_ms"), summary.get("p90_tpot_ms")
    return not _missing(ttft) and ttft <= ttft_ms and (_missing(tpot) or tpot <= tpot_ms)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _stats(prefix: str, values) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return {
        f"mean_{prefix}": float(v.mean()) if len(v) else math.nan,
        f"p50_{prefix}": _pct(v, 50),
        f"p90_{prefix}": _pct(v, 90),
        f"p99_{prefix}": _pct(v, 99),
    }


def _time_weighted(values: pd.Series, durations: pd.Series) -> float:
    total = durations.sum()
    return float((values * durations).sum() / total) if total > 0 else math.nan


def summarize(result, req_df: pd.DataFrame | None = None, it_df: pd.DataFrame | None = None) -> dict:
    """Summary of one run: percentiles (numpy's default), SLO attainment, throughput, bubbles."""
    req_df = requests_frame(result) if req_df is None else req_df
    it_df = iterations_frame(result) if it_df is None else it_df
    arrived = req_df[req_df["status"] != "not_arrived"]
    fin = arrived[arrived["status"] == "finished"]
    out = {
        "status": result.status,
        "reason": result.reason,
        "num_requests": int(len(arrived)),
        "num_finished": int(len(fin)),
        "num_running": int((arrived["status"] == "running").sum()),
        "num_waiting": int((arrived["status"] == "waiting").sum()),
        "num_failed": int((arrived["status"] == "failed").sum()),
        "num_retractions": int(arrived["num_retractions"].sum()),
        "num_truncated_prompts": int(arrived["truncated_prompt"].sum()),
        "num_clipped_outputs": int(arrived["clipped_output"].sum()),
    }
    for name in ("ttft", "tpot", "e2e"):
        out.update(_stats(f"{name}_ms", fin[f"{name}_ms"]))
    n = max(len(arrived), 1)
    out["slo_attainment"] = float(arrived["meets_slo"].sum() / n)
    out["ttft_attainment"] = float(arrived["meets_ttft"].sum() / n)
    out["tpot_attainment"] = float(arrived["meets_tpot"].sum() / n)
    slo = result.config.slo
    out["slo_ttft_ms"] = slo.ttft_ms
    out["slo_tpot_ms"] = slo.tpot_ms
    out["meets_p90_slo"] = meets_slo(out, slo.ttft_ms, slo.tpot_ms)
    t0 = float(arrived["arrival_s"].min()) if len(arrived) else 0.0
    duration = result.end_s - t0
    out["duration_s"] = duration
    out["throughput_rps"] = len(fin) / duration if duration > 0 else math.nan
    out["output_tokens_per_s"] = float(fin["generated_tokens"].sum() / duration) if duration > 0 else math.nan
    prefill = float(it_df["prefill_tokens"].sum()) if len(it_df) else 0.0
    out["prefill_tokens_per_s"] = prefill / duration if duration > 0 else math.nan
    busy_it = it_df[it_df["mode"] != "idle"] if len(it_df) else it_df
    out["num_iterations"] = int(len(it_df))
    if len(it_df):
        out.update(_stats("iter_ms", busy_it["iter_ms"]))
        busy_cols = [c for c in it_df.columns if c.endswith("_busy_ms")]
        total = it_df["iter_ms"].sum() * len(busy_cols)
        out["bubble_fraction"] = float(1 - it_df[busy_cols].to_numpy().sum() / total) if total > 0 else math.nan
        idle_cols = [c for c in it_df.columns if c.endswith("_idle_ms")]
        # bubble per busy iteration: idle stage time summed over stages (ms)
        out["bubble_ms_per_iter"] = float(busy_it[idle_cols].to_numpy().sum(axis=1).mean()) if len(busy_it) else math.nan
        out["total_bubble_s"] = float(it_df[idle_cols].to_numpy().sum() / 1e3)
        dur = it_df["iter_ms"]
        out["kv_used_mean_tokens"] = _time_weighted(it_df["kv_used_tokens"], dur)
        out["queue_mean"] = _time_weighted(it_df["num_waiting"], dur)
    out["kv_capacity_tokens"] = result.kv_capacity_tokens
    out["kv_peak_tokens"] = result.kv_peak_tokens
    out["max_running_requests"] = result.max_running_requests
    out["num_chunk_decisions"] = len(result.decisions)
    out["num_rebalancer_moves"] = len(result.moves)
    return out
