"""Run outputs: per-request and per-iteration frames, then summaries.

Three layers, kept apart: the engine appends records; `requests_frame`/`iterations_frame`
turn them into tidy DataFrames (columns documented below); `summarize` computes tallies
(TTFT, TPOT, E2E, per-iteration latency) and time-weighted levels (KV usage, queue).

requests.csv: req_id, status (finished | running | waiting | failed | not_arrived), arrival_s,
admit_s, first_token_s, finish_s, prompt_tokens, output_tokens (requested), max_new_tokens
(after the context clip), generated_tokens, ttft_ms, tpot_ms = (e2e - ttft)/(output - 1),
e2e_ms, num_chunks, num_retractions, slot, truncated_prompt, clipped_output, replica,
max_itl_ms (longest gap between two of its tokens), meets_ttft, meets_tpot, (meets_e2e when the SLO has
an E2E objective), meets_slo.

summary.json also carries the serving benchmarks' names with their definitions (vLLM's
`mean_ttft_ms`, `median_tpot_ms`, `p99_itl_ms`, `mean_e2el_ms`, `request_throughput`,
`request_goodput`, ...; SGLang's `mean_e2e_latency_ms`, `concurrency`): see `sim.bench_metrics`.
`throughput_rps` = finished requests / arrival window (first to last arrival, `arrival_window_s`):
the offered rate when every request finishes, less when a horizon leaves some unserved;
`throughput_drain_rps` = finished / `duration_s` (first arrival to the end of the run, the drain
included), which is vLLM's `request_throughput` for a drained run.

iterations.csv: iteration, slot, start_s, end_s, iter_ms, host_ms (scheduler CPU, token broadcast
and host stalls, before the stages start), mode (decode | extend | mixed |
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

from sim.bench_metrics import bench_metrics, pooled_itls_ms
from sim.config import SLOConfig
from sim.saturation import saturation
from sim.slo import pkey
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
        max_itl = max(r.itls) * 1e3 if r.itls else math.nan
        rows.append((r.rid, status, r.arrival_s, r.admit_s, r.first_token_s, r.finish_s, r.orig_prompt_len,
                     r.orig_output_len, r.max_new, r.out_len, ttft, tpot, e2e, r.num_chunks,
                     r.num_retractions, r.slot, r.truncated_prompt, r.clipped_output, r.replica, max_itl))
    df = pd.DataFrame(rows, columns=[
        "req_id", "status", "arrival_s", "admit_s", "first_token_s", "finish_s", "prompt_tokens",
        "output_tokens", "max_new_tokens", "generated_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
        "num_chunks", "num_retractions", "slot", "truncated_prompt", "clipped_output", "replica", "max_itl_ms"])
    done = df["status"] == "finished"
    df["meets_ttft"] = done & (df["ttft_ms"] <= slo.ttft_ms)
    # NOTE: a one-token output has no TPOT (the artifact omits it); it cannot violate it.
    df["meets_tpot"] = done & (df["tpot_ms"].isna() | (df["tpot_ms"] <= slo.tpot_ms))
    df["meets_slo"] = df["meets_ttft"] & df["meets_tpot"]
    if slo.e2e_ms is not None:
        df["meets_e2e"] = done & (df["e2e_ms"] <= slo.e2e_ms)
        df["meets_slo"] &= df["meets_e2e"]
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
    if "host_s" in df.columns:
        overhead = df["host_s"].to_numpy(dtype=float)
        df.insert(5, "host_ms", overhead * 1e3)
        df = df.drop(columns=["host_s"])
    else:
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


LATE_FRACTION = 0.25  # the late arrivals: the last quarter of the arrival window


def late_arrivals(arrived: pd.DataFrame, fraction: float = LATE_FRACTION) -> pd.DataFrame:
    """Requests that arrived in the last `fraction` of the arrival window [first, last arrival]."""
    if len(arrived) < 2:
        return arrived.iloc[0:0]
    t0, t1 = float(arrived["arrival_s"].min()), float(arrived["arrival_s"].max())
    return arrived[arrived["arrival_s"] >= t1 - fraction * (t1 - t0)]


def meets_slo(summary: dict, slo, tpot_ms: float | None = None) -> bool:
    """The goodput criterion on a summary (from `summarize`, or read back from a sweep cache):
    `slo.meets(summary)` (sim.slo: every request finished and each percentile the SLO names
    meets its threshold). `meets_slo(summary, ttft_ms, tpot_ms)` is the paper's P90/P90."""
    if not isinstance(slo, SLOConfig):
        slo = SLOConfig(ttft_ms=slo, tpot_ms=tpot_ms)
    return slo.meets(summary)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _stats(prefix: str, values, extra: tuple[float, ...] = ()) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    out = {f"mean_{prefix}": float(v.mean()) if len(v) else math.nan}
    for q in sorted({50.0, 90.0, 99.0, *extra}):
        out[f"p{q:g}_{prefix}"] = _pct(v, q)
    return out


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
    slo = result.config.slo
    for name in ("ttft", "tpot", "e2e"):  # with the percentiles the SLO names (e.g. p95)
        out.update(_stats(f"{name}_ms", fin[f"{name}_ms"], (getattr(slo, f"{name}_percentile"),)))
    # the late arrivals at the SLO's percentiles: the goodput criterion's sustainability check
    late = late_arrivals(arrived)
    late_fin = late[late["status"] == "finished"]
    out["num_late_requests"] = int(len(late))
    for name, q, _ in slo.objectives():
        v = late_fin[f"{name}_ms"].to_numpy(dtype=float)
        v = v[~np.isnan(v)]
        out["late_" + pkey(q, name)] = _pct(v, q)
    n = max(len(arrived), 1)
    out["slo_attainment"] = float(arrived["meets_slo"].sum() / n)
    out["ttft_attainment"] = float(arrived["meets_ttft"].sum() / n)
    out["tpot_attainment"] = float(arrived["meets_tpot"].sum() / n)
    out["slo_ttft_ms"] = slo.ttft_ms
    out["slo_tpot_ms"] = slo.tpot_ms
    out["slo_e2e_ms"] = slo.e2e_ms
    out["slo"] = slo.describe()
    # NOTE: the name is historical: it is the configured percentiles' criterion.
    out["meets_p90_slo"] = out["meets_slo"] = meets_slo(out, slo)
    t0 = float(arrived["arrival_s"].min()) if len(arrived) else 0.0
    duration = result.end_s - t0
    out["duration_s"] = duration
    last_arrival = float(arrived["arrival_s"].max()) if len(arrived) else 0.0
    window = last_arrival - t0
    out["arrival_window_s"] = window
    out["throughput_rps"] = len(fin) / window if window > 0 else math.nan
    out["throughput_drain_rps"] = len(fin) / duration if duration > 0 else math.nan
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
    out.update(saturation(req_df, it_df, result.end_s))  # saturated, sustained_throughput_rps
    extras = getattr(result, "extras", {}) or {}
    out["num_kv_exhausted"] = int(extras.get("num_kv_exhausted", 0))
    out["stage_layers"] = list(extras.get("stage_layers", []))
    done = set(fin["req_id"])
    itls = pooled_itls_ms(r.itls for r in result.requests if r.rid in done)
    out.update(bench_metrics(arrived, itls, duration, slo.ttft_ms, slo.tpot_ms))
    from sim.latency.provenance import profile_source

    out["profile_source"] = profile_source(result.config)
    return out
