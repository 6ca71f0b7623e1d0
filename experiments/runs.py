"""Single-run evaluators for experiments that need distributions, not just summaries
(iteration-latency CDFs, per-request latency CDFs). They run through `sim.studies.sweep.Runner`,
so they are parallel and cached like the goodput sweeps."""

from __future__ import annotations

import numpy as np


QUANTILES = [round(q, 3) for q in np.linspace(0, 100, 101)]


def _q(values) -> list[float | None]:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return [float(x) for x in np.percentile(v, QUANTILES)] if len(v) else [None] * len(QUANTILES)


def evaluate_distributions(table: dict) -> dict:
    """Summary plus percentiles 0..100 of per-iteration latency (busy iterations) and of
    TTFT, TPOT and E2E, and per-request SLO outcomes needed by fig14."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.outputs.metrics import iterations_frame, requests_frame, summarize

    cfg = config_from_table(table)
    res = run(cfg)
    req = requests_frame(res)
    it = iterations_frame(res)
    summary = summarize(res)
    out = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
    out = {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in out.items()}
    busy = it[it["mode"] != "idle"]["iter_ms"] if len(it) else []
    fin = req[req["status"] == "finished"]
    out["iter_ms_q"] = _q(busy)
    out["ttft_ms_q"] = _q(fin["ttft_ms"])
    out["tpot_ms_q"] = _q(fin["tpot_ms"])
    out["e2e_ms_q"] = _q(fin["e2e_ms"])
    arrived = req[req["status"] != "not_arrived"]
    out["finished_within_60s"] = float(((arrived["status"] == "finished") & (arrived["e2e_ms"] <= 60_000)).mean())
    return out


def distribution_runner(ctx):
    """A sweep runner of `evaluate_distributions`, cached beside the summaries."""
    from sim.studies.sweep import Runner

    return Runner(ctx.out_dir / "cache" / "distributions.jsonl", jobs=ctx.jobs, executor=ctx.executor,
                  address=ctx.address, progress=ctx.progress, evaluate_fn=evaluate_distributions)
