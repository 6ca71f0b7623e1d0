"""Run outputs: per-request and per-iteration frames, then summaries.

Three layers, kept apart: the engine appends records (typed columns: sim/engine/requests.py,
sim/engine/records.py); `requests_frame`/`iterations_frame` turn them into tidy DataFrames
(columns documented below) for the CSV files; `summarize` computes tallies (TTFT, TPOT, E2E,
per-iteration latency) and time-weighted levels (KV usage, queue) from the columns themselves,
one at a time, with the same numpy operations the frames would take (so the same numbers,
without a frame's memory on a long run).

requests.csv: req_id, status (finished | running | waiting | failed | not_arrived | timed_out: the
client gave up, `request_timeout_s` | ignored: the engine dropped it, vLLM 0.6.3's FINISHED_IGNORED,
sim/engine/schedulers/vllm_v0.py), arrival_s,
admit_s, first_token_s, finish_s, prompt_tokens, output_tokens (requested), max_new_tokens
(after the context clip), generated_tokens, ttft_ms, tpot_ms = (e2e - ttft)/(output - 1),
e2e_ms, num_chunks, num_retractions, slot, truncated_prompt, clipped_output, replica,
max_itl_ms (longest gap between two of its tokens), cached_tokens (engines with a prefix cache:
tokens its first admission found cached), (a disaggregated run: prefill_instance, decode_instance,
kv_tokens, kv_bytes, prefill_end_s, kv_ready_s, kv_wait_ms, kv_link_wait_ms, kv_transfer_ms;
sim/engine/disagg.py), meets_ttft, meets_tpot, (meets_e2e when the SLO has an E2E objective), meets_slo.

summary.json also carries the serving benchmarks' names with their definitions (vLLM's
`mean_ttft_ms`, `median_tpot_ms`, `p99_itl_ms`, `mean_e2el_ms`, `request_throughput`,
`request_goodput`, ...; SGLang's `mean_e2e_latency_ms`, `concurrency`): see `sim.outputs.bench_metrics`.
`throughput_rps` = finished requests / arrival window (first to last arrival, `arrival_window_s`):
the offered rate when every request finishes, less when a horizon leaves some unserved;
`throughput_drain_rps` = finished / `duration_s` (first arrival to the end of the run, the drain
included), which is vLLM's `request_throughput` for a drained run. `kv_peak_tokens` is the pool's peak
less its free tokens; `kv_peak_active_tokens` leaves a prefix cache's evictable tokens out too (what the
requests held: vLLM's kv_cache_usage, SGLang's token_usage), the one a KV headroom reads.

iterations.csv: iteration, slot, start_s, end_s, iter_ms, host_ms (scheduler CPU, token broadcast
and host stalls, before the stages start), mode (decode | extend | mixed |
idle), num_tokens, prefill_tokens, num_prefill, num_decode, chunk_size, kv_used_tokens,
num_waiting, num_running, replica, an MoE run's moe_mean_rank_slots and moe_busiest_rank_slots (routed
token slots per MoE layer on the mean and the busiest expert-parallel rank: sim/outputs/moe.py), and per stage
s: stage{s}_start_s, stage{s}_end_s, stage{s}_busy_ms, stage{s}_idle_ms (idle = the bubble: iteration length
minus busy time).
"""

from __future__ import annotations

from sim.core.lazy import lazy

import math
from array import array

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.outputs.bench_metrics import bench_metrics_of
from sim.core.config import SLOConfig
from sim.outputs.saturation import load_window, replica_window, saturation_of
from sim.core.slo import LATE_FRACTION, late_from_s, pkey
from sim.engine.records import ModeColumn, StageBusy


STATUSES = ("finished", "not_arrived", "failed", "running", "waiting", "timed_out", "ignored")
FINISHED, NOT_ARRIVED, FAILED, RUNNING, WAITING, TIMED_OUT, IGNORED = range(len(STATUSES))


def timed_out(result, arrival, finish) -> "np.ndarray | None":
    """The requests the client gave up on (`[workload] request_timeout_s`, sim/workloads/client.py):
    sent, with their timeout passed before the run's end, and not finished within it; None
    when the run's client has no timeout."""
    spec = (getattr(result, "extras", None) or {}).get("client")
    limit = getattr(spec, "request_timeout_s", None)
    if limit is None:
        return None
    with np.errstate(invalid="ignore"):
        due = np.isfinite(arrival) & (arrival + limit <= result.end_s)
        return due & ~(finish - arrival <= limit)


def request_columns(result, slo: SLOConfig | None = None) -> dict:
    """The requests.csv columns as numpy arrays (`status` as codes into STATUSES), computed
    column by column from the run's request table (sim/engine/requests.py)."""
    slo = slo or result.config.slo
    c = result.requests.columns
    arrival, admit, first, finish = c["arrival_s"], c["admit_s"], c["first_token_s"], c["finish_s"]
    max_new = c["max_new_tokens"]
    finished = c["state"] == 2  # FINISHED in sim.engine.requests.STATES
    status = np.full(len(arrival), WAITING, dtype=np.int8)
    status[~np.isnan(admit) & (c["state"] != 0)] = RUNNING
    if result.status == "failed":
        status[:] = FAILED
    status[arrival > result.end_s] = NOT_ARRIVED
    status[finished] = FINISHED
    # ended by the engine without its output (IGNORED in sim.engine.requests.STATES): out of every
    # latency and throughput metric, never meeting an SLO
    status[c["state"] == 3] = IGNORED
    gave_up = timed_out(result, arrival, finish)
    if gave_up is not None:
        # a client's failed request: out of every latency and throughput metric (success = False)
        status[gave_up] = TIMED_OUT
        finished = finished & ~gave_up
    ttft = (first - arrival) * 1e3
    e2e = (finish - arrival) * 1e3
    has_tpot = finished & (max_new > 1)
    tpot = np.full(len(arrival), np.nan)
    np.divide(e2e - ttft, max_new - 1, out=tpot, where=has_tpot)
    cols = {
        "req_id": c["req_id"], "status": status, "arrival_s": arrival, "admit_s": admit, "first_token_s": first,
        "finish_s": finish, "prompt_tokens": c["prompt_tokens"], "output_tokens": c["output_tokens"],
        "max_new_tokens": max_new, "generated_tokens": c["generated_tokens"], "ttft_ms": ttft, "tpot_ms": tpot,
        "e2e_ms": e2e, "num_chunks": c["num_chunks"], "num_retractions": c["num_retractions"], "slot": c["slot"],
        "truncated_prompt": c["truncated_prompt"], "clipped_output": c["clipped_output"], "replica": c["replica"],
        "max_itl_ms": c["max_itl_s"] * 1e3,
    }
    if (getattr(result, "extras", None) or {}).get("prefix_cache") is not None:
        cols["cached_tokens"] = c["cached_tokens"]  # served from the prefix cache at its first admission
    # a disaggregated run's pools and KV transfer per request (sim/engine/disagg.py)
    cols.update((getattr(result, "extras", None) or {}).get("request_columns", {}))
    cols["meets_ttft"] = finished & (ttft <= slo.ttft_ms)
    # NOTE: a one-token output has no TPOT (the artifact omits it); it cannot violate it.
    cols["meets_tpot"] = finished & (np.isnan(tpot) | (tpot <= slo.tpot_ms))
    cols["meets_slo"] = cols["meets_ttft"] & cols["meets_tpot"]
    if slo.e2e_ms is not None:
        cols["meets_e2e"] = finished & (e2e <= slo.e2e_ms)
        cols["meets_slo"] = cols["meets_slo"] & cols["meets_e2e"]
    return cols


def requests_frame(result, slo: SLOConfig | None = None) -> pd.DataFrame:
    cols = request_columns(result, slo)
    cols["status"] = np.array(STATUSES, dtype=object)[cols["status"]]
    return pd.DataFrame(cols)


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
    from sim.outputs.moe import iteration_columns

    for name, values in iteration_columns(result, df["num_tokens"]).items():  # an MoE run's (sim/outputs/moe.py)
        df[name] = values
    for s in range(busy.shape[1]):
        start = df["start_s"] + overhead
        df[f"stage{s}_start_s"] = start
        df[f"stage{s}_end_s"] = start + busy[:, s]
        df[f"stage{s}_busy_ms"] = busy[:, s] * 1e3
        df[f"stage{s}_idle_ms"] = np.maximum(df["iter_ms"] - busy[:, s] * 1e3, 0.0)
    return df


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def late_arrivals(arrived: pd.DataFrame, fraction: float = LATE_FRACTION) -> pd.DataFrame:
    """Requests that arrived in the last `fraction` of the arrival window [first, last arrival]."""
    if len(arrived) < 2:
        return arrived.iloc[0:0]
    t0, t1 = float(arrived["arrival_s"].min()), float(arrived["arrival_s"].max())
    return arrived[arrived["arrival_s"] >= t1 - fraction * (t1 - t0)]


def meets_slo(summary: dict, slo, tpot_ms: float | None = None) -> bool:
    """The goodput criterion on a summary (from `summarize`, or read back from a sweep cache):
    `slo.meets(summary)` (sim.core.slo: every request finished and each percentile the SLO names
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


def _iteration_summary(result, duration: float, load: tuple[float, float] | None) -> tuple[dict, list]:
    """The per-iteration part of the summary, read one column at a time from the run's
    iteration columns (in memory, or spilled to files: sim/engine/records.py), with the same
    numpy operations on the same arrays as the iterations.csv frame, so the same numbers.
    Also returns each replica's saturated phase (`sim.outputs.saturation.replica_window`) under the
    load window `load`."""
    cols = result.iterations
    n = len(cols["start_s"]) if "start_s" in cols else 0
    out: dict = {}
    prefill = float(_np(cols["prefill_tokens"]).sum()) if n else 0.0
    out["prefill_tokens_per_s"] = prefill / duration if duration > 0 else math.nan
    out["num_iterations"] = int(n)
    if not n:
        return out, []
    start, end = _np(cols["start_s"]), _np(cols["end_s"])
    iter_ms = (end - start) * 1e3
    busy_rows = _np(cols["mode"]) != 0  # MODES[0] is "idle"
    out.update(_stats("iter_ms", iter_ms[busy_rows]))
    windows = []
    if load is not None:
        waiting = _np(cols["num_waiting"])
        replica = _np(cols["replica"]) if "replica" in cols else None
        if replica is None or replica[0] == replica[-1]:  # one replica (rows are in replica order)
            windows = [replica_window(start, end, waiting, *load, result.end_s)]
        else:
            windows = [replica_window(start[m], end[m], waiting[m], *load, result.end_s)
                       for m in (replica == r for r in np.unique(replica))]
        del waiting, replica
    del start, end
    # the stages' busy (then idle) ms, laid out as the frame's to_numpy() gives them
    sb = result.stage_busy
    num_stages = sb.num_stages
    stage_ms = np.empty((n, num_stages), order="F")
    for st in range(num_stages):
        np.multiply(sb.stage(st), 1e3, out=stage_ms[:, st])
    total = iter_ms.sum() * num_stages
    out["bubble_fraction"] = float(1 - stage_ms.sum() / total) if total > 0 else math.nan
    for st in range(num_stages):  # idle = the bubble: iteration length minus busy time
        np.maximum(iter_ms - stage_ms[:, st], 0.0, out=stage_ms[:, st])
    # bubble per busy iteration: idle stage time summed over stages (ms)
    per_iter = stage_ms.sum(axis=1)[busy_rows]
    out["bubble_ms_per_iter"] = float(per_iter.mean()) if len(per_iter) else math.nan
    del per_iter
    out["total_bubble_s"] = float(stage_ms.sum() / 1e3)
    del stage_ms
    out["kv_used_mean_tokens"] = _time_weighted(_np(cols["kv_used_tokens"]), iter_ms)
    out["queue_mean"] = _time_weighted(_np(cols["num_waiting"]), iter_ms)
    return out, windows


def _np(column):
    """A typed column (sim/engine/records.py) as a numpy array, without copying."""
    if isinstance(column, ModeColumn):
        return np.frombuffer(column.codes, dtype=np.int8) if len(column.codes) else np.zeros(0, dtype=np.int8)
    return np.asarray(column)


def summarize(result) -> dict:
    """Summary of one run: percentiles (numpy's default), SLO attainment, throughput, bubbles.

    Computed column by column from the run's request table and iteration columns, without the
    requests.csv / iterations.csv frames (a 10^6-request run would need several GB for them)."""
    slo = result.config.slo
    req = request_columns(result, slo)
    status = req["status"]
    arrived = status != NOT_ARRIVED
    fin = status == FINISHED
    num_arrived = int(arrived.sum())
    num_fin = int(fin.sum())
    out = {
        "status": result.status,
        "reason": result.reason,
        "num_requests": num_arrived,
        "num_finished": num_fin,
        "num_running": int((status == RUNNING).sum()),
        "num_waiting": int((status == WAITING).sum()),
        "num_failed": int((status == FAILED).sum()),
        "num_retractions": int(req["num_retractions"][arrived].sum()),
        "num_truncated_prompts": int(req["truncated_prompt"][arrived].sum()),
        "num_clipped_outputs": int(req["clipped_output"][arrived].sum()),
    }
    num_ignored = int((status == IGNORED).sum())
    eng = (getattr(result, "extras", None) or {}).get("engine")
    if num_ignored or (eng is not None and eng.engine == "vllm-v0"):
        out["num_ignored"] = num_ignored  # the engines that drop never-fitting prompts (vLLM 0.6.3)
    if timed_out(result, req["arrival_s"], req["finish_s"]) is not None:
        out["num_timed_out"] = int((status == TIMED_OUT).sum())
    for name in ("ttft", "tpot", "e2e"):  # with the percentiles the SLO names (e.g. p95)
        out.update(_stats(f"{name}_ms", req[f"{name}_ms"][fin], (getattr(slo, f"{name}_percentile"),)))
    # the late arrivals at the SLO's percentiles: the goodput criterion's sustainability check
    arrival = req["arrival_s"]
    arrived_at = arrival[arrived]
    late = np.zeros(len(arrival), dtype=bool)
    if num_arrived >= 2:
        t0, t1 = float(arrived_at.min()), float(arrived_at.max())
        late = arrived & (arrival >= late_from_s(t0, t1))
    late_fin = late & fin
    out["num_late_requests"] = int(late.sum())
    for name, q, _ in slo.objectives():
        v = req[f"{name}_ms"][late_fin].astype(float)
        v = v[~np.isnan(v)]
        out["late_" + pkey(q, name)] = _pct(v, q)
    n = max(num_arrived, 1)
    out["slo_attainment"] = float(req["meets_slo"][arrived].sum() / n)
    out["ttft_attainment"] = float(req["meets_ttft"][arrived].sum() / n)
    out["tpot_attainment"] = float(req["meets_tpot"][arrived].sum() / n)
    out["slo_ttft_ms"] = slo.ttft_ms
    out["slo_tpot_ms"] = slo.tpot_ms
    out["slo_e2e_ms"] = slo.e2e_ms
    out["slo"] = slo.describe()
    # NOTE: the name is historical: it is the configured percentiles' criterion.
    out["meets_p90_slo"] = out["meets_slo"] = meets_slo(out, slo)
    t0 = float(arrived_at.min()) if num_arrived else 0.0
    duration = result.end_s - t0
    out["duration_s"] = duration
    last_arrival = float(arrived_at.max()) if num_arrived else 0.0
    window = last_arrival - t0
    out["arrival_window_s"] = window
    out["throughput_rps"] = num_fin / window if window > 0 else math.nan
    out["throughput_drain_rps"] = num_fin / duration if duration > 0 else math.nan
    out["output_tokens_per_s"] = float(req["generated_tokens"][fin].sum() / duration) if duration > 0 else math.nan
    it_out, windows = _iteration_summary(result, duration, load_window(arrival, result.end_s))
    out.update(it_out)
    out["kv_capacity_tokens"] = result.kv_capacity_tokens
    out["kv_peak_tokens"] = result.kv_peak_tokens
    # what the requests held at the peak: a prefix cache's evictable tokens not counted (sim/engine/pipeline.py)
    out["kv_peak_active_tokens"] = result.kv_peak_active_tokens
    out["max_running_requests"] = result.max_running_requests
    out["num_chunk_decisions"] = len(result.decisions)
    out["num_rebalancer_moves"] = len(result.moves)
    # saturated, sustained_throughput_rps
    out.update(saturation_of(arrival, req["finish_s"], windows, result.end_s))
    extras = getattr(result, "extras", {}) or {}
    out["num_kv_exhausted"] = int(extras.get("num_kv_exhausted", 0))
    out["stage_layers"] = list(extras.get("stage_layers", []))
    eng = extras.get("engine")
    if eng is not None:
        out["engine"] = f"{eng.engine} ({eng.version})"
        out["prefix_cache"] = bool(eng.prefix_cache)
        out["token_budget_tokens"] = int(eng.token_budget)
    fe = extras.get("frontend")
    if fe is not None:  # the API server's share (sim/latency/frontend.py), only where it is on
        out["frontend"] = fe.describe()
    cache = extras.get("prefix_cache")
    if cache is not None:
        # tokens served from the cache at first admissions / those requests' prompt tokens
        denom = cache["admitted_prompt_tokens"]
        out["prefix_hit_rate"] = cache["hit_tokens"] / denom if denom else 0.0
        out["prefill_tokens_saved"] = int(cache["saved_tokens"])  # every admission, re-admissions too
        out["cache_evicted_tokens"] = int(cache["evicted_tokens"])
    # a run that kept no inter-token gaps (`run(itls=False)`) has no ITL statistics
    itls = result.requests.itls.pooled_ms(np.flatnonzero(fin)) if getattr(result.requests, "keep_itls", True) else None
    finished = {k: req[k][fin] for k in ("generated_tokens", "prompt_tokens", "ttft_ms", "tpot_ms", "e2e_ms")}
    out.update(bench_metrics_of(finished, itls, duration, slo.ttft_ms, slo.tpot_ms))
    if "num_timed_out" in out:
        out["failed"] = out["num_timed_out"]  # vLLM's and SGLang's count of requests with success = False
    from sim.profiling.provenance import profile_source

    out["profile_source"] = profile_source(result.config)
    from sim.outputs.cluster import cluster_summary

    out.update(cluster_summary(result))  # multi-node and disaggregated runs only (sim/outputs/cluster.py)
    return out
