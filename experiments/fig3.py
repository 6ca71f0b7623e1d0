"""fig3: the step function of one PP=4 stage vs token count, decode latency vs batch size, and
the pipeline bubble of a 2048-token prefill followed by a 128-token one (Qwen2.5-32B).

The first two panels evaluate the ground-truth latency model of the shipped profile; the
bubble is simulated: two requests (2048 and 128 prompt tokens, one output token) arrive
together with chunk 2048, so they enter the pipeline as consecutive micro-batches. Bubble
definition: the idle time the 128-token micro-batch's stages spend waiting behind the
2048-token one (iteration length minus its own stage time), summed over the stages where the
two share an iteration.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, savefig  # noqa: E402
from sim.core.config import config_from_table  # noqa: E402
from sim.engine.run import build_latency, run  # noqa: E402
from sim.latency.base import BatchStats  # noqa: E402
from sim.core.schemes import profile_dir  # noqa: E402
from sim.workloads import RequestSpec  # noqa: E402

MODEL = "qwen2.5-32b"
PP = 4
CONTEXT = 1400


def _config(chunk: int = 2048):
    return config_from_table({
        "parallel": {"pp": PP, "tp": 1},
        "scheduler": {"chunk_size_tokens": chunk},
        "latency": {"profile": profile_dir(MODEL, 1)},
        "workload": {"kind": "poisson", "rate_rps": 1.0, "lengths": {"source": "pairs", "prompt_tokens": [1], "output_tokens": [1]}},
    })


def bubble_rows() -> list[dict]:
    cfg = _config()
    res = run(cfg, requests=[RequestSpec(0, 0.0, 2048, 1), RequestSpec(1, 0.0, 128, 1)])
    it = res.iterations
    busy = res.stage_busy
    rows = []
    total = 0.0
    # the 128-token micro-batch entered stage 0 at iteration 1; at iteration 1 + s it is at stage s
    for s in range(PP):
        k = 1 + s
        length = it["end_s"][k] - it["start_s"][k]
        own = busy[k][s]
        wait = (length - res.iteration_overhead_s - own) if s < PP - 1 else 0.0
        total += wait
        rows.append({"panel": "bubble", "x": s, "series": "idle_behind_2048_ms", "value_ms": wait * 1e3})
    rows.append({"panel": "bubble", "x": -1, "series": "total_bubble_ms", "value_ms": total * 1e3})
    return rows


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    lat = build_latency(_config())
    stage = 1  # a middle stage: no embedding, no LM head
    rows = []
    grid = list(range(1, 129)) + list(range(136, 4097, 8))
    if ctx.quick:
        grid = grid[::8]
    for t in grid:
        st = lat.stage_time(BatchStats.prefill(t), stage)
        rows.append({"panel": "prefill_step", "x": t, "series": "stage_ms", "value_ms": st.total_s * 1e3})
        rows.append({"panel": "prefill_step", "x": t, "series": "linear_ms", "value_ms": st.linear_s * 1e3})
    for b in range(1, 257):
        st = lat.stage_time(BatchStats.decode(b, CONTEXT), stage)
        rows.append({"panel": "decode_batch", "x": b, "series": f"stage_ms_ctx{CONTEXT}", "value_ms": st.total_s * 1e3})
    rows += bubble_rows()
    df = pd.DataFrame(rows)
    ctx.write(df, "fig3.csv")
    return {"fig3.csv": df}


def plot(ctx: Context) -> None:
    df = ctx.read("fig3.csv")
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    p = df[df["panel"] == "prefill_step"]
    for series, g in p.groupby("series"):
        axes[0].plot(g["x"], g["value_ms"], label=series, lw=1)
    axes[0].set_xlabel("tokens in the micro-batch")
    axes[0].set_ylabel("stage time (ms)")
    axes[0].set_title("one PP=4 stage, prefill")
    axes[0].legend(fontsize=7)
    d = df[df["panel"] == "decode_batch"]
    axes[1].plot(d["x"], d["value_ms"])
    axes[1].set_xlabel(f"decode batch size (context {CONTEXT})")
    axes[1].set_ylabel("stage time (ms)")
    axes[1].set_title("one PP=4 stage, decode")
    b = df[(df["panel"] == "bubble") & (df["x"] >= 0)]
    total = df[(df["panel"] == "bubble") & (df["x"] < 0)]["value_ms"].iloc[0]
    axes[2].bar(b["x"].astype(int).astype(str), b["value_ms"])
    axes[2].set_xlabel("stage")
    axes[2].set_ylabel("idle behind the 2048-token micro-batch (ms)")
    axes[2].set_title(f"P-P bubble: {total:.0f} ms in total")
    savefig(fig, ctx.out_dir / "fig3.png")
