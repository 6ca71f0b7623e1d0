"""Pipeline timelines: a Chrome/Perfetto trace and a Gantt chart of a run.

`timeline.json` (open it in ui.perfetto.dev or chrome://tracing) has one process per replica
and one track per stage; every micro-batch is a slice on each stage it crossed (name: mode
and slot; args: tokens, prefill tokens, decode requests, chunk size), and controller
decisions and rebalancer moves are instant events on a "scheduler" track. A disaggregated run
names its processes after the instances ("prefill 0", "decode 1") and adds a "KV transfers" process,
one track per decode instance, each transfer a slice from its start to the KV's arrival (args: request,
prefill instance, bytes). `timeline.png` draws the stages of a chosen time window as a Gantt chart: white
gaps are pipeline bubbles (and, for a prefill instance, its KV transfers on a row below).
"""

from __future__ import annotations

from sim.core.lazy import lazy, lazy_pyplot

import json
from pathlib import Path

plt = lazy_pyplot()
np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

MODE_COLORS = {"extend": "#d62728", "mixed": "#ff7f0e", "decode": "#1f77b4"}


def stage_slices(result):
    """(replica, stage, start_s, end_s, entry) for every stage busy period; `entry` is the
    index of the iteration at which the micro-batch entered stage 0."""
    it = result.iterations
    replicas = it.get("replica", [0] * len(it["iteration"]))
    host = it.get("host_s", getattr(result, "host_s", None))
    host = list(host) if host is not None else []
    out = []
    first_of_replica: dict[int, int] = {}
    for row, rep in enumerate(replicas):
        first_of_replica.setdefault(rep, row)
        start = it["start_s"][row] + (host[row] if row < len(host) else result.iteration_overhead_s)
        for s, busy in enumerate(result.stage_busy[row]):
            if busy <= 0:
                continue
            entry = row - s  # rows of one replica are consecutive iterations
            if entry < first_of_replica[rep]:
                continue
            out.append((rep, s, start, start + busy, entry))
    return out


def trace_events(result) -> dict:
    it = result.iterations
    events = []
    replicas = sorted(set(it.get("replica", [0])))
    num_stages = len(result.stage_busy[0]) if result.stage_busy else 0
    extras = getattr(result, "extras", None) or {}
    names = extras.get("instance_names")
    for rep in replicas:
        events.append({"ph": "M", "name": "process_name", "pid": rep,
                       "args": {"name": names[rep] if names else f"replica {rep}"}})
        for s in range(num_stages):
            events.append({"ph": "M", "name": "thread_name", "pid": rep, "tid": s, "args": {"name": f"stage {s}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rep, "tid": num_stages, "args": {"name": "scheduler"}})
    for rep, s, start, end, entry in stage_slices(result):
        events.append({
            "ph": "X", "pid": rep, "tid": s, "ts": round(start * 1e6, 3), "dur": round((end - start) * 1e6, 3),
            "name": f"{it['mode'][entry]} slot {it['slot'][entry]}",
            "args": {"iteration": it["iteration"][entry], "tokens": it["num_tokens"][entry],
                     "prefill_tokens": it["prefill_tokens"][entry], "decode_requests": it["num_decode"][entry],
                     "chunk": it["chunk_size"][entry]},
        })
    for d in result.decisions:
        events.append({"ph": "i", "s": "t", "pid": 0, "tid": num_stages, "ts": round(d[0] * 1e6, 3),
                       "name": f"chunk {d[2]} -> {d[3]}", "args": {"slot": d[1], "reason": d[4]}})
    for m in result.moves:
        events.append({"ph": "i", "s": "t", "pid": 0, "tid": num_stages, "ts": round(m[0] * 1e6, 3),
                       "name": f"{m[3]} req {m[2]}", "args": {"slot": m[1], "where": m[4]}})
    for t, slot, rid, what in (getattr(result, "extras", None) or {}).get("engine_events", []):
        # the engines' retractions and preemptions, and prefix-cache hits (sim/engine/schedulers/cached.py)
        events.append({"ph": "i", "s": "t", "pid": 0, "tid": num_stages, "ts": round(t * 1e6, 3),
                       "name": f"{what} req {rid}", "args": {"slot": slot}})
    transfers = extras.get("kv_transfers") or []
    if transfers:
        pid = (max(replicas) + 1) if replicas else 0
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "KV transfers"}})
        for d in sorted({t[2] for t in transfers}):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": d, "args": {"name": f"to decode {d}"}})
        for rid, p, d, start, end, nbytes in transfers:
            ev = {"cat": "kv", "id": int(rid), "pid": pid, "tid": d, "name": f"KV req {rid}"}
            events.append({**ev, "ph": "b", "ts": round(start * 1e6, 3),
                           "args": {"request": int(rid), "prefill": p, "decode": d, "bytes": int(nbytes)}})
            events.append({**ev, "ph": "e", "ts": round(end * 1e6, 3)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def default_window(result, length_s: float = 1.0) -> tuple[float, float]:
    """A window of `length_s` starting at the busiest point of the run's first half."""
    it = result.iterations
    if not it["start_s"]:
        return 0.0, length_s
    tokens = np.asarray(it["num_tokens"], dtype=float)
    half = max(1, len(tokens) // 2)
    k = int(np.argmax(np.convolve(tokens[:half], np.ones(min(50, half)), mode="same")))
    start = it["start_s"][k]
    return start, start + length_s


def gantt(result, window: tuple[float, float], path: Path, replica: int = 0) -> Path:
    t0, t1 = window
    slices = [x for x in stage_slices(result) if x[0] == replica and x[3] >= t0 and x[2] <= t1]
    num_stages = len(result.stage_busy[0]) if result.stage_busy else 1
    extras = getattr(result, "extras", None) or {}
    names = extras.get("instance_names")
    kv = [t for t in extras.get("kv_transfers") or [] if names and names[replica] == f"prefill {t[1]}"
          and t[4] >= t0 and t[3] <= t1]
    fig, ax = plt.subplots(figsize=(12, 0.6 * (num_stages + bool(kv)) + 1.5))
    it = result.iterations
    for _, s, start, end, entry in slices:
        mode = it["mode"][entry]
        ax.broken_barh([(start * 1e3, (end - start) * 1e3)], (s - 0.4, 0.8), color=MODE_COLORS.get(mode, "grey"),
                       edgecolor="black", linewidth=0.3)
        if (end - start) * 1e3 > (t1 - t0) * 1e3 / 60 and t0 <= (start + end) / 2 <= t1:
            ax.text((start + end) / 2 * 1e3, s, str(it["num_tokens"][entry]), ha="center", va="center", fontsize=6)
    for k, (rid, _p, d, start, end, _b) in enumerate(kv):  # this prefill instance's KV transfers
        ax.broken_barh([(start * 1e3, (end - start) * 1e3)], (num_stages - 0.4 + 0.2 * (k % 4), 0.2),
                       color="#2ca02c", edgecolor="black", linewidth=0.3)
    ax.set_xlim(t0 * 1e3, t1 * 1e3)
    ax.set_yticks(range(num_stages + bool(kv)), [f"stage {s}" for s in range(num_stages)] + (["KV out"] if kv else []))
    ax.invert_yaxis()
    ax.set_xlabel("time (ms); numbers are tokens per micro-batch; white gaps are bubbles")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in MODE_COLORS.values()]
    ax.legend(handles, list(MODE_COLORS), loc="upper right", fontsize=7, ncol=3)
    ax.set_title(f"pipeline timeline, {names[replica] if names else f'replica {replica}'}, {t0:.2f}-{t1:.2f} s")
    from sim.core.fsio import save_figure

    save_figure(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def iterations_in(result, window: tuple[float, float], replica: int = 0) -> int:
    """How many iterations of `replica` overlap `window` (0: the Gantt chart would be empty)."""
    it = result.iterations
    t0, t1 = window
    n = 0
    for start, end, rep in zip(it["start_s"], it["end_s"], it["replica"]):
        if rep == replica and start < t1 and end > t0:
            n += 1
    return n


def write_timeline(result, out_dir: Path, window: tuple[float, float] | None = None) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / "timeline.json"
    from sim.core.fsio import write_text

    write_text(trace, json.dumps(trace_events(result)))
    png = gantt(result, window or default_window(result), out_dir / "timeline.png")
    return [trace, png]
