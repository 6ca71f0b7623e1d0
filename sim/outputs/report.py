"""`ppsim report DIR`: a one-page summary of a run's outputs (`ppsim run ... --out DIR`).

Writes `DIR/report.md` (summary tables) and `DIR/report.png` (latency CDFs, chunk size over
time, KV usage and queue length over time, per-stage busy fraction), from the CSVs alone.
A failed, stopped or saturated run says so first: a banner at the top of report.md, a red
title on report.png, and the saturated phase shaded on the time plots.
"""

from __future__ import annotations

from sim.core.lazy import lazy, lazy_pyplot

from pathlib import Path

plt = lazy_pyplot()
np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.core.fsio import save_figure, write_text  # noqa: E402



def make_report(run_dir: str | Path) -> tuple[Path, Path]:
    from sim.outputs.runfolder import ITERATION_COLUMNS, read_iterations, read_requests, read_run_table, read_summary

    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    req = read_requests(run_dir, summary)
    # a run made with --no-iterations has no iterations table: its plots and busy table are skipped
    it = read_iterations(run_dir, summary)
    no_it = it is None
    if no_it:
        it = pd.DataFrame({c: pd.Series(dtype=float) for c in ITERATION_COLUMNS})
    decisions = read_run_table(run_dir, "decisions", ("time_s", "slot", "old_chunk", "new_chunk"), optional=True)
    decisions = pd.DataFrame() if decisions is None else decisions

    banner = run_banner(summary)
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    fin = req[req["status"] == "finished"]
    for ax, metric, slo in ((axes[0, 0], "ttft_ms", summary.get("slo_ttft_ms")),
                            (axes[0, 1], "tpot_ms", summary.get("slo_tpot_ms"))):
        v = np.sort(fin[metric].dropna().to_numpy())
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v))
        if slo:
            ax.axvline(slo, color="k", ls="--", lw=0.8, label="SLO")
        ax.set_xlabel(metric.replace("_", " "))
        ax.set_ylabel("CDF")
        ax.set_title(f"{metric.split('_')[0].upper()} CDF (finished requests)")
        ax.legend(fontsize=7)
    busy_it = it[it["mode"] != "idle"]
    v = np.sort(busy_it["iter_ms"].to_numpy())
    if len(v):
        axes[0, 2].plot(v, np.arange(1, len(v) + 1) / len(v))
    axes[0, 2].set_xlabel("per-iteration latency (ms)")
    axes[0, 2].set_ylabel("CDF")
    axes[0, 2].set_title("iteration latency CDF (busy iterations)")
    ax = axes[1, 0]
    ax.step(it["start_s"], it["chunk_size"], where="post")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("chunk size (tokens)")
    ax.set_title(f"chunk size over time ({len(decisions)} changes)")
    if summary.get("saturated") and summary.get("saturated_since_s") is not None:
        for ax in (axes[1, 0], axes[1, 1]):
            ax.axvspan(summary["saturated_since_s"], summary.get("saturated_until_s") or it["end_s"].max(),
                       color="tab:red", alpha=0.08, label="saturated phase")
    ax = axes[1, 1]
    ax.plot(it["start_s"], it["kv_used_tokens"], lw=0.8, label="KV used (tokens)")
    ax.axhline(summary.get("kv_capacity_tokens", np.nan), color="k", ls="--", lw=0.8, label="KV capacity")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("tokens")
    ax2 = ax.twinx()
    ax2.plot(it["start_s"], it["num_waiting"], color="tab:red", lw=0.8, label="queue length")
    ax2.set_ylabel("waiting requests")
    ax.set_title("KV usage and queue length")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="upper right", fontsize=7)
    busy_cols = sorted((c for c in it.columns if c.endswith("_busy_ms")), key=lambda c: int(c[5:-8]))
    total_ms = it["iter_ms"].sum()
    busy_frac = [it[c].sum() / total_ms if total_ms else np.nan for c in busy_cols]
    axes[1, 2].bar([c[:-8] for c in busy_cols], busy_frac)
    axes[1, 2].set_ylim(0, 1)
    axes[1, 2].set_ylabel("busy fraction")
    axes[1, 2].set_title("per-stage busy fraction (1 - bubbles)")
    if banner:
        fig.suptitle(f"PipeSim run: {run_dir}\n{banner}", fontsize=12, color="tab:red", fontweight="bold")
    else:
        fig.suptitle(f"PipeSim run: {run_dir}", fontsize=11)
    fig.tight_layout()
    png = run_dir / "report.png"
    save_figure(fig, png, dpi=100, bbox_inches="tight")
    plt.close(fig)

    keys = ["status", "num_requests", "num_finished", "slo_attainment", "ttft_attainment", "tpot_attainment",
            "throughput_rps", "output_tokens_per_s", "bubble_fraction", "kv_capacity_tokens", "kv_peak_tokens",
            "num_retractions", "num_chunk_decisions", "num_rebalancer_moves", "duration_s", "saturated",
            "saturated_since_s", "saturated_until_s", "sustained_throughput_rps", "num_kv_exhausted", "stage_layers",
            "engine", "prefix_cache", "prefix_hit_rate", "prefill_tokens_saved", "cache_evicted_tokens"]
    lines = [f"# Run report: {run_dir}", ""]
    if banner:
        lines += [f"> **{banner}**", ""]
    lines += ["## Summary", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(summary.get(k))} |" for k in keys if k in summary]
    # the SLO and any percentile it names beyond P50/P90/P99 (e.g. p95_ttft_ms)
    lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items()
              if k in ("slo", "meets_slo") or (k[:1] == "p" and k.endswith("_ms") and k.split("_")[0] not in
                                               ("p50", "p90", "p99") and k.split("_")[1] in ("ttft", "tpot", "e2e"))]
    if summary.get("reason"):
        lines.append(f"| reason | {summary['reason']} |")
    if summary.get("profile_source"):
        lines.append(f"| latency profile | {summary['profile_source']} |")
    lines += ["", "## Latency (ms)", "", "| metric | mean | P50 | P90 | P99 |", "|---|---|---|---|---|"]
    for m in ("ttft", "tpot", "e2e", "iter"):
        lines.append(f"| {m} | " + " | ".join(_fmt(summary.get(f"{s}_{m}_ms")) for s in ("mean", "p50", "p90", "p99")) + " |")
    lines += ["", "## Per-stage busy fraction", "", "| stage | busy |", "|---|---|"]
    lines += [f"| {c[5:-8]} | {_fmt(f)} |" for c, f in zip(busy_cols, busy_frac)]
    if no_it:
        lines += ["", "(no iterations table: the run was made with --no-iterations; the summary above "
                  "still covers every iteration)"]
    lines += ["", "## Requests by status", "", "| status | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in req["status"].value_counts().items()]
    lines += ["", "![report](report.png)", ""]
    md = run_dir / "report.md"
    write_text(md, "\n".join(lines))
    return md, png


def run_banner(summary: dict) -> str:
    """One line for a run that did not simply finish: failed, stopped early, or saturated."""
    parts = []
    status = summary.get("status", "ok")
    if status != "ok":
        parts.append(f"RUN {str(status).upper()}: {summary.get('reason') or 'no reason recorded'}")
    if summary.get("saturated"):
        rate = summary.get("sustained_throughput_rps")
        since = summary.get("saturated_since_s")
        parts.append("SATURATED: the queue kept growing" + (f" from t={since:.1f}s" if since is not None else "")
                     + (f"; sustained throughput {rate:.3g} req/s (the capacity at this load)" if rate is not None else ""))
    return " | ".join(parts)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "n/a" if v is None else str(v)




