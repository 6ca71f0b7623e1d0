"""disagg_vllm: vLLM's disaggregated-prefill benchmark, co-located chunked prefill against one prefill and
one decode instance on the same eight H100s (issue 34).

The published setup (vllm-project/vllm `benchmarks/disagg_benchmarks/disagg_performance_benchmark.sh`):
Llama-3.1-70B-Instruct on 8 x H100 in one node; (a) chunked prefill: two TP4 instances behind a round-robin
proxy; (b) disaggregated: one TP4 prefill instance and one TP4 decode instance behind vLLM's proxy (the
prefill instance runs each request with `max_tokens = 1`, the client streams the decode instance's
output); `--gpu-memory-utilization 0.8`, `--max-model-len 30000`; the sonnet dataset at 2048 input tokens
(50 of them a shared prefix) and 10 output tokens, 400 prompts, Poisson at 2, 4, 6 and 8 QPS (the committed
`results/chunk_vs_disagg.yaml` also has 16, and an output-length sweep of 5-80 tokens at QPS 4). The
published numbers, mean TTFT and mean ITL (ms), are quoted in experiments/README.md ("disagg_vllm"); this
module never reads them.

Simulated here: Llama-3.1-70B in BF16 on the built H100 SXM profiles (profiles/built/h100-sxm-80gb), TP4,
`mem_fraction = 0.8`, context 30,000 tokens, fixed lengths (2048 in, 10 out; the output sweep 5, 10, 20,
40, 80 at QPS 4), 400 requests (120 with --quick), the same seeds for both setups. Chunked prefill: FastPP's
scheduler with a 512-token budget (vLLM V0's default `max_num_batched_tokens` when chunked prefill is on);
the disaggregated prefill instance is not chunked (a whole prompt per step, budget 8192), its KV goes to the
decode instance over NVSwitch inside the node (`[cluster]` 1 node x 8, `kv_transfer = "after_prefill"`,
`first_token = "decode"`: vLLM's accounting). ITL is the mean TPOT (every output has the same length, so
the mean gap between tokens is the TPOT's mean). Not modelled: the shared 50-token prefix (prefix caching),
vLLM's own scheduler (both setups run FastPP's), its HTTP proxy hop.

Outputs: disagg_vllm.csv (setup, sweep, qps, output_len, mean and P99 TTFT, mean TPOT, mean KV transfer,
each the mean over seeds with a 95% CI) and disagg_vllm.png.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.common import Context, fold_seeds, savefig, statuses  # noqa: E402

PROFILE = "profiles/built/h100-sxm-80gb/llama-3.1-70b/tp4"
QPS = (2, 4, 6, 8, 16)
OUTPUT_LENS = (5, 10, 20, 40, 80)
SETUPS = ("chunked prefill 2 x TP4", "disaggregated 1P TP4 + 1D TP4")


def table(setup: str, qps: float, out_len: int, n: int, seed: int) -> dict:
    t = {"seed": seed,
         "scheduler": {"chunk_size_tokens": 512, "mem_fraction": 0.8, "context_length_tokens": 30000},
         "latency": {"profile": PROFILE},
         "workload": {"kind": "synthetic-uniform", "rate_rps": float(qps), "num_requests": n,
                      "input_range": [2048, 2048], "output_range": [out_len, out_len]}}
    if setup == SETUPS[0]:
        t["parallel"] = {"tp": 4, "replicas": 2, "router": "round-robin"}
    else:
        t["cluster"] = {"nodes": 1, "gpus_per_node": 8, "network": "ib-ndr"}
        t["disaggregation"] = {"kv_transfer": "after_prefill", "first_token": "decode",
                               "prefill": {"tp": 4, "chunk_size_tokens": 8192}, "decode": {"tp": 4}}
    return t


def compute(ctx: Context) -> dict[str, pd.DataFrame]:
    n = 120 if ctx.quick else 400
    qps = QPS[:3] if ctx.quick else QPS
    lens = OUTPUT_LENS[::2] if ctx.quick else OUTPUT_LENS
    points = [("qps", q, 10) for q in qps] + [("output_len", 4, o) for o in lens]
    tables, labels = [], []
    for setup in SETUPS:
        for sweep, q, o in points:
            for seed in ctx.seeds:
                tables.append(table(setup, q, o, n, seed))
                labels.append((setup, sweep, q, o, seed))
    res = ctx.runner.run(tables, desc="disagg_vllm")
    per = []
    for (setup, sweep, q, o, seed), r in zip(labels, res):
        per.append({"setup": setup, "sweep": sweep, "qps": q, "output_len": o, "seed": seed,
                    "mean_ttft_ms": r["mean_ttft_ms"], "p99_ttft_ms": r["p99_ttft_ms"],
                    "mean_tpot_ms": r["mean_tpot_ms"], "mean_kv_transfer_ms": r.get("mean_kv_transfer_ms"),
                    "status": r["status"]})
    rows = []
    for key, g in pd.DataFrame(per).groupby(["setup", "sweep", "qps", "output_len"], sort=False):
        g = g.assign(mean_kv_transfer_ms=g["mean_kv_transfer_ms"].astype(float))
        rows.append({**dict(zip(("setup", "sweep", "qps", "output_len"), key)),
                     **fold_seeds(g, ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_kv_transfer_ms"),
                                  ci={"mean_ttft_ms": ("ttft_ci_lo_ms", "ttft_ci_hi_ms"),
                                      "mean_tpot_ms": ("tpot_ci_lo_ms", "tpot_ci_hi_ms")}),
                     "num_seeds": len(g), "status": statuses(g)})
    df = pd.DataFrame(rows)
    ctx.write(df, "disagg_vllm.csv")
    return {"disagg_vllm.csv": df}


def plot(ctx: Context) -> None:
    df = ctx.read("disagg_vllm.csv")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for i, (sweep, x, xlabel) in enumerate((("qps", "qps", "request rate (QPS), 2048 in / 10 out"),
                                            ("output_len", "output_len", "output tokens, at QPS 4"))):
        for j, (metric, lo, hi, ylabel) in enumerate((("mean_ttft_ms", "ttft_ci_lo_ms", "ttft_ci_hi_ms", "mean TTFT (ms)"),
                                                      ("mean_tpot_ms", "tpot_ci_lo_ms", "tpot_ci_hi_ms",
                                                       "mean ITL = mean TPOT (ms)"))):
            ax = axes[i, j]
            for setup, marker in zip(SETUPS, ("o", "s")):
                sub = df[(df["sweep"] == sweep) & (df["setup"] == setup)].sort_values(x)
                ax.errorbar(sub[x], sub[metric], yerr=[sub[metric] - sub[lo], sub[hi] - sub[metric]], marker=marker,
                            capsize=3, label=setup)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            if metric == "mean_ttft_ms" and sweep == "qps":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("vLLM's disaggregated-prefill benchmark, simulated: Llama-3.1-70B, 8 x H100 "
                 "(mean over seeds, 95% CI)", fontsize=10)
    fig.tight_layout()
    savefig(fig, ctx.out_dir / "disagg_vllm.png")
