"""Outputs of ~12 varied runs, for byte-for-byte comparison of a refactor's before and after.

Run: `python benchmarks/identical.py --out DIR` (from the tree under test), once on the
untouched tree and once after a change, then `diff -r REF_DIR NEW_DIR`. Each case is written by
`ppsim run` (in this process) into DIR/CASE/: summary.json, requests.csv, iterations.csv,
decisions.csv, moves.csv, config.toml, and stdout.txt (the printed summary).

The cases cover PP=4 static / greedy / predictive / predictive + delay scheduling, TP=4, the
14B and 32B models, azure-conv / cnn-reversed / sharegpt / azure-conv-synth workloads, a run
that `slo.stop_when_violated` stops, and a tiny KV pool with `on_kv_exhausted = "retract"`.
Azure workloads need `PIPESIM_CACHE` (set to /work/shared/data/azure-llm-inference-2023 here
when unset).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {
    # name: (scheme, model, workload, extra)
    "pp512_32b_azconv": ("PP_512", "qwen2.5-32b", {"name": "azure-conv", "num_requests": 400, "rate_rps": 8.0}, None),
    "greedy_32b_cnnrev": ("DCP_greedy", "qwen2.5-32b", {"name": "cnn-reversed", "num_requests": 500, "rate_rps": 3.0}, None),
    "pred_32b_cnnrev": ("DCP_pred", "qwen2.5-32b", {"name": "cnn-reversed", "num_requests": 1000, "rate_rps": 5.0}, None),
    "pred_14b_cnnrev": ("DCP_pred", "qwen2.5-14b", {"name": "cnn-reversed", "num_requests": 600, "rate_rps": 1.0}, None),
    "predds_32b_azconv": ("DCP_pred+DS", "qwen2.5-32b", {"name": "azure-conv", "num_requests": 500, "rate_rps": 6.0}, None),
    "predds_14b_sharegpt": ("DCP_pred+DS", "qwen2.5-14b", {"name": "sharegpt", "num_requests": 500, "rate_rps": 6.0}, None),
    "tp_32b_sharegpt": ("TP", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 1000, "rate_rps": 10.0}, None),
    "tp_14b_azconv": ("TP", "qwen2.5-14b", {"name": "azure-conv", "num_requests": 500, "rate_rps": 8.0}, None),
    "greedy_14b_sharegpt": ("DCP_greedy", "qwen2.5-14b", {"name": "sharegpt", "num_requests": 500, "rate_rps": 5.0}, None),
    "pred_32b_stopped": ("DCP_pred", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 1000, "rate_rps": 30.0},
                         {"slo": {"ttft_ms": 300.0, "stop_when_violated": True}}),
    "pp512_retract": ("PP_512", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 400, "rate_rps": 8.0},
                      {"scheduler": {"kv_tokens": 6000}, "server": {"on_kv_exhausted": "retract"}}),
    "pred_retract": ("DCP_pred", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 300, "rate_rps": 6.0},
                     {"scheduler": {"kv_tokens": 8000}, "server": {"on_kv_exhausted": "retract"}}),
    "static_synth": ("PP_512", "qwen2.5-32b", {"name": "azure-conv-synth", "num_requests": 400, "rate_rps": 4.0}, None),
    # the other engines, replicas behind a router (their events interleave on one clock)
    "sglang_pp4": ("PP_512", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 400, "rate_rps": 4.0},
                   {"scheduler": {"engine": "sglang"}}),
    "vllm1_pp4": ("PP_512", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 400, "rate_rps": 4.0},
                  {"scheduler": {"engine": "vllm-v1"}}),
    "vllm0_tp4": ("TP", "qwen2.5-32b", {"name": "sharegpt", "num_requests": 400, "rate_rps": 6.0},
                  {"scheduler": {"engine": "vllm-v0", "chunk_size_tokens": 0}}),
    "sglang_prefix": ("PP_512", "qwen2.5-14b", {"name": "shared-system-prompt", "num_requests": 400, "rate_rps": 6.0},
                      {"scheduler": {"engine": "sglang"}}),
    "replicas2_ll": ("PP_512", "qwen2.5-14b", {"name": "sharegpt", "num_requests": 600, "rate_rps": 8.0},
                     {"parallel": {"pp": 2, "replicas": 2, "router": "least-loaded"}}),
}
# whole configs of experiments/configs/ (a cluster of nodes, disaggregated pools), quick sizes
CONFIGS = {
    "disagg_70b": ("experiments/configs/disagg_70b.toml", ["workload.num_requests=200"]),
    "cluster_405b": ("experiments/configs/llama405b_tp8pp2.toml", ["workload.num_requests=100"]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the cases' outputs")
    ap.add_argument("--only", nargs="*", default=None, help="run only these cases")
    args = ap.parse_args()
    os.environ.setdefault("PIPESIM_CACHE", "/work/shared/data/azure-llm-inference-2023")
    os.chdir(ROOT)
    from sim.core import tomlio
    from sim.cli import main as ppsim
    from sim.core.schemes import scheme_table

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name, (scheme, model, workload, extra) in CASES.items():
        if args.only and name not in args.only:
            continue
        table = scheme_table(scheme, model, workload, seed=1, extra=extra)
        cfg = out / f"{name}.toml"
        cfg.write_text(tomlio.dumps(table))
        shutil.rmtree(out / name, ignore_errors=True)  # (ppsim refuses a folder holding stdout.txt)
        buf = io.StringIO()
        t0 = time.process_time()
        with contextlib.redirect_stdout(buf):
            rc = ppsim(["run", str(cfg), "--out", str(out / name), "--force"])
        # (the output folder's name, printed at the end, is not part of the comparison)
        (out / name).mkdir(exist_ok=True)  # (absent when the run failed: its message is the output)
        (out / name / "stdout.txt").write_text(buf.getvalue().replace(str(out), "OUT"))
        print(f"{name:24s} rc={rc} {time.process_time() - t0:6.2f} CPU s", flush=True)
    for name, (path, sets) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        shutil.rmtree(out / name, ignore_errors=True)
        buf = io.StringIO()
        t0 = time.process_time()
        with contextlib.redirect_stdout(buf):
            rc = ppsim(["run", path, *[a for kv in sets for a in ("--set", kv)], "--out", str(out / name), "--force"])
        (out / name).mkdir(exist_ok=True)  # (absent when the run failed: its message is the output)
        (out / name / "stdout.txt").write_text(buf.getvalue().replace(str(out), "OUT"))
        print(f"{name:24s} rc={rc} {time.process_time() - t0:6.2f} CPU s", flush=True)


if __name__ == "__main__":
    main()
