"""Engine speed: simulated requests per wall-second and iterations per second.

An azure-conv-like load (the `azure-conv-synth` length model, Poisson arrivals) of 400 and
10,000 requests at 4 and 8 req/s, at PP=4 (chunk 512) and TP=4 (chunk 2048), Qwen2.5-32B on
the A100-40GB PCIe profile. Workload generation is excluded from the timing (it is done once
per run, before the simulation, as in every sweep). Run: `python benchmarks/engine.py [--quick]`.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from sim.config import config_from_table
from sim.engine.run import run
from sim.workloads import build_workload

LAYOUTS = {
    "PP=4": {"parallel": {"pp": 4, "tp": 1}, "scheduler": {"chunk_size_tokens": 512},
             "latency": {"profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"}},
    "TP=4": {"parallel": {"pp": 1, "tp": 4}, "scheduler": {"chunk_size_tokens": 2048},
             "latency": {"profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp4"}},
}


def bench(layout: str, num: int, rate: float, repeats: int) -> dict:
    table = {"seed": 1, **LAYOUTS[layout],
             "workload": {"name": "azure-conv-synth", "rate_rps": rate, "num_requests": num}}
    cfg = config_from_table(table)
    reqs = build_workload(cfg.workload, seed=cfg.seed)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = run(cfg, requests=reqs)
        best = min(best, time.perf_counter() - t0)
    iters = len(res.iterations["iteration"])
    return {"layout": layout, "requests": num, "rate_rps": rate, "status": res.status,
            "wall_s": round(best, 3), "sim_s": round(res.end_s, 1), "iterations": iters,
            "requests_per_s": round(num / best), "iterations_per_s": round(iters / best)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the 400-request points")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sizes = [400] if args.quick else [400, 10_000]
    rows = []
    for layout in LAYOUTS:
        for num in sizes:
            for rate in (4.0, 8.0):
                rows.append(bench(layout, num, rate, args.repeats if num <= 400 else 1))
                print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
