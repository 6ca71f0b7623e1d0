"""The serving benchmarks' metric names and definitions, computed from a simulated run.

vLLM's `benchmarks/benchmark_serving.py` (and `vllm bench serve`, `vllm/benchmarks/serve.py`)
and SGLang's `python/sglang/bench_serving.py` compute, in `calculate_metrics`, over the
*successful* requests only:

- TTFT: time from sending a request to its first token; `mean/median/std/pNN_ttft_ms`.
- TPOT (time per output token, excluding the first): (latency - ttft) / (output_len - 1) for
  each request with output_len > 1; `mean/median/std/pNN_tpot_ms`.
- ITL (inter-token latency): every gap between consecutive streamed tokens of every request,
  pooled into one list (`itls += output.itl`); `mean/median/std/pNN_itl_ms` (SGLang adds
  `p95_itl_ms`, `max_itl_ms`). A request's ITLs sum to latency - ttft.
- E2EL (end-to-end latency, vLLM) = E2E latency (SGLang): `mean/median/std/pNN_e2el_ms`,
  SGLang's `mean/median/std/p99_e2e_latency_ms`.
- Throughputs over the benchmark duration (first request sent to the last one completed, so
  drain-inclusive): `request_throughput` = completed / duration, `output_throughput` = generated
  tokens / duration, `total_token_throughput` = (input + generated tokens) / duration, SGLang's
  `input_throughput` and `concurrency` = sum of E2E latencies / duration.
- `request_goodput` (vLLM `--goodput ttft:MS tpot:MS`) = requests with TTFT <= the TTFT SLO and
  TPOT <= the TPOT SLO (a one-token output counts TPOT 0) / duration; here the run's [slo].

Percentiles are numpy's (linear interpolation), as both tools use `np.percentile`. Where the
tools write 0 for an empty list (`np.mean(ttfts or 0)`), this writes NaN (null in JSON): a run
with no finished request has no latency.
"""

from __future__ import annotations

import math
from typing import Iterable

from sim.core.lazy import lazy
np = lazy("numpy")
pd = lazy("pandas")

PERCENTILES = (50, 90, 95, 99)


def _dist(prefix: str, values_ms, *, sglang: str | None = None) -> dict[str, float]:
    """`values_ms`: an array, or an `ItlCounts` (distinct values and counts, sim/engine/requests.py)."""
    from sim.engine.requests import ItlCounts

    v = values_ms if isinstance(values_ms, ItlCounts) else values_ms[~np.isnan(values_ms)]
    if not len(v):
        stats = dict.fromkeys(("mean", "median", "std", "max", *(f"p{q}" for q in PERCENTILES)), math.nan)
    elif isinstance(v, ItlCounts):
        stats = {"mean": v.mean(), "median": v.percentile(50), "std": v.std(), "max": v.max()}
        stats.update({f"p{q}": v.percentile(q) for q in PERCENTILES})
    else:
        stats = {"mean": float(v.mean()), "median": float(np.median(v)), "std": float(v.std()), "max": float(v.max())}
        stats.update({f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES})
    out = {f"{k}_{prefix}_ms": val for k, val in stats.items()}
    if sglang:
        out.update({f"{k}_{sglang}_ms": stats[k] for k in ("mean", "median", "std", "p99")})
    return out


def pooled_itls_ms(itl_lists: Iterable) -> np.ndarray:
    """Every request's per-token gaps (seconds) pooled into one array in ms (vLLM's `itls`)."""
    arrays = [np.frombuffer(a, dtype=np.float64) if not isinstance(a, np.ndarray) else a for a in itl_lists]
    return np.concatenate(arrays) * 1e3 if arrays else np.zeros(0)


def bench_metrics(req_df: pd.DataFrame, itls_ms: np.ndarray, duration_s: float,
                  slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, float]:
    """The benchmark names over the finished rows of a `requests_frame` and their pooled ITLs."""
    fin = req_df[req_df["status"] == "finished"]
    return bench_metrics_of({k: fin[k].to_numpy() for k in fin.columns}, itls_ms, duration_s, slo_ttft_ms,
                            slo_tpot_ms)


def bench_metrics_of(fin: dict, itls_ms, duration_s: float, slo_ttft_ms: float,
                     slo_tpot_ms: float) -> dict[str, float]:
    """The benchmark names from the finished requests' columns (generated_tokens, prompt_tokens,
    ttft_ms, tpot_ms, e2e_ms arrays) and their pooled ITLs (an array or an `ItlCounts`; None:
    no `*_itl_ms` names)."""
    completed = len(fin["ttft_ms"])
    tokens_out = float(fin["generated_tokens"].sum())
    tokens_in = float(fin["prompt_tokens"].sum())
    ttft = np.asarray(fin["ttft_ms"], dtype=float)
    tpot = np.asarray(fin["tpot_ms"], dtype=float)  # NaN for one-token outputs, as the tools skip them
    e2e = np.asarray(fin["e2e_ms"], dtype=float)
    good = (ttft <= slo_ttft_ms) & (np.nan_to_num(tpot, nan=0.0) <= slo_tpot_ms)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: math.nan)
    out: dict[str, float] = {
        "completed": completed,
        "total_input_tokens": int(tokens_in),
        "total_output_tokens": int(tokens_out),
        "benchmark_duration_s": duration_s,
        "request_throughput": per_s(completed),
        "request_goodput": per_s(float(good.sum())),
        "output_throughput": per_s(tokens_out),
        "input_throughput": per_s(tokens_in),
        "total_token_throughput": per_s(tokens_in + tokens_out),
        "concurrency": per_s(float(e2e.sum()) / 1e3),
    }
    out.update(_dist("ttft", ttft))
    out.update(_dist("tpot", tpot))
    if itls_ms is not None:
        out.update(_dist("itl", itls_ms if hasattr(itls_ms, "percentile") else np.asarray(itls_ms, dtype=float)))
    out.update(_dist("e2el", e2e, sglang="e2e_latency"))
    return out
