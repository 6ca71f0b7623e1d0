"""`ppsim plan` speed: wall and CPU seconds of whole plans, each from an empty run cache.

Cases (Qwen2.5-32B, A100-40GB PCIe profiles, `--jobs 2`, 3 paired seeds):

- `4 GPUs at 4 req/s`: `azure-conv-synth`, `--rate 4`, P90 TTFT 2 s / P90 TPOT 200 ms;
- `8 GPUs at 6 req/s`: the issue's done-when command (`azure-conv`, `--rate 6`, P99 TTFT 2 s,
  P90 TPOT 150 ms; needs the Azure trace in $PIPESIM_CACHE, else skipped with the reason);
- `4 GPUs goodput` (with `--goodput`): no `--rate`, the goodput ranking;
- `up to 32 GPUs at 8 req/s` (with `--cluster`; issue 34): `--max-gpus 32`, Llama-3.1-70B on H100 SXM
  nodes of 8 over InfiniBand NDR, `azure-conv-synth`, P90 TTFT 1 s / P90 TPOT 50 ms: the fewest GPUs over
  GPU counts, node counts, co-located and disaggregated deployments, TP x PP per pool, two chunk policies
  (sim/studies/cluster_plan.py); target: within 2 minutes on 2 cores;
- `Qwen3-235B-A22B up to 32 GPUs at 16 req/s` (with `--moe`; issue 44): the fewest H100s for an MoE model, its
  TP x EP x PP instance shapes (tp4-ep4, tp8-ep8 beside the TP-sharded ones, profiles/moe/) among the
  co-located and disaggregated candidates, `--engine vllm-v1`, P90 TTFT 2 s / P90 TPOT 100 ms; the same target;
- `up to 32 GPUs, every engine, --verify` (with `--engines`; issue 45's done-when): the same plan over
  `--engine fastpp,sglang,vllm-v1,vllm-v0` with `--verify` (the recommendation and the three highest
  goodputs re-simulated with 5,000 requests); target: within 2 minutes on 2 cores.

CPU seconds are the plan process's and its workers' (user + system), the number that does not
depend on how loaded a shared machine is; on 2 idle cores the wall time is about CPU / 2.
Run: `python benchmarks/plan.py [--quick] [--goodput] [--cluster] [--moe] [--engines]`.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
MODEL = ["--model", "qwen2.5-32b"]
CASES = {
    "4 GPUs at 4 req/s": ["--gpus", "4", "--workload", "azure-conv-synth", "--rate", "4"],
    "8 GPUs at 6 req/s": ["--gpus", "8", "--workload", "azure-conv", "--rate", "6", "--slo", "ttft:p99:2000",
                          "--slo", "tpot:p90:150"],
    "4 GPUs goodput": ["--gpus", "4", "--workload", "azure-conv-synth"],
    "up to 32 GPUs at 8 req/s": ["--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--max-gpus", "32",
                                 "--workload", "azure-conv-synth", "--rate", "8", "--slo", "ttft:p90:1000",
                                 "--slo", "tpot:p90:50"],
    "Qwen3-235B-A22B up to 32 GPUs at 16 req/s": ["--model", "qwen3-235b-a22b", "--gpu", "h100-sxm-80gb",
                                                  "--max-gpus", "32", "--engine", "vllm-v1",
                                                  "--workload", "azure-conv-synth", "--rate", "16",
                                                  "--slo", "ttft:p90:2000", "--slo", "tpot:p90:100"],
}
CASES["up to 32 GPUs, every engine, --verify"] = [*CASES["up to 32 GPUs at 8 req/s"], "--engine",
                                                  "fastpp,sglang,vllm-v1,vllm-v0", "--verify"]


def trace_missing() -> str:
    cache = Path(os.environ.get("PIPESIM_CACHE", Path.home() / ".cache" / "pipesim"))
    f = cache / "AzureLLMInferenceTrace_conv.csv"
    return "" if f.is_file() else f"{f} not found (set PIPESIM_CACHE or run ppsim workload fetch azure-conv-2023)"


def bench(name: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = [] if "--model" in args else MODEL
        cmd = [sys.executable, "-m", "sim.cli", "plan", *model, *args, "--seeds", "3",
               "--jobs", "2", "--no-progress", "--out", tmp]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: ppsim plan failed: {proc.stderr.strip().splitlines()[-1]}")
        runs = sum(1 for _ in open(Path(tmp) / "cache.jsonl"))
        plan = pd.read_csv(Path(tmp) / "plan.csv")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"case": name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "runs": runs,
            "candidates": len(plan), "simulated": int((plan["status"] == "ok").sum()),
            "estimated": int((plan["status"] == "estimated").sum()), "pruned": int((plan["status"] == "pruned").sum()),
            "load_avg_1min": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the 4-GPU rate case")
    ap.add_argument("--goodput", action="store_true", help="also the 4-GPU goodput ranking")
    ap.add_argument("--cluster", action="store_true", help="also the --max-gpus 32 cluster plan")
    ap.add_argument("--moe", action="store_true", help="also the --max-gpus 32 plan of Qwen3-235B-A22B (MoE, EP)")
    ap.add_argument("--engines", action="store_true", help="also the --max-gpus 32 plan over every engine, --verify")
    args = ap.parse_args()
    names = ["4 GPUs at 4 req/s"] if args.quick else ["4 GPUs at 4 req/s", "8 GPUs at 6 req/s"]
    if args.goodput:
        names.append("4 GPUs goodput")
    if args.cluster:
        names.append("up to 32 GPUs at 8 req/s")
    if args.moe:
        names.append("Qwen3-235B-A22B up to 32 GPUs at 16 req/s")
    if args.engines:
        names.append("up to 32 GPUs, every engine, --verify")
    rows = []
    for name in names:
        if "azure-conv" in CASES[name] and trace_missing():
            print(f"skipped {name}: {trace_missing()}")
            continue
        rows.append(bench(name, CASES[name]))
        print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
