"""Reduce the Frontier simulator's A100 Mixtral-8x7B MoE table to the curve PipeSim's A100 MoE profiles read
(issue 44): profiles/moe/sources/frontier_a100_mixtral_8x7b_moe.csv.

Usage (from the repository root; FILE: data/profiling/compute/a100/mixtral_8x7b_moe/moe.csv of NetX-lab/Frontier,
MIT License, at the commit named in SOURCE below):

    python profiles/derive_frontier_moe.py FILE            # (re)write the reduced table
    python profiles/derive_frontier_moe.py FILE --check    # compare with the committed one; exit 1 if it differs

The source times an MoE layer's parts apart (`time_stats.moe_gating`, `moe_shuffling`, `moe_grouped_gemm`, each
with its median over repetitions) per (num_tokens, num_tensor_parallel_workers), experts sharded by TP (ep 1),
top-2 of 8, hidden 4096, expert FFN 14336. The reduced table keeps, per (TP, tokens), the median over duplicate
rows of each part's median (ms) and their sum, `moe_ms`, as profiles/crosscheck_moe_a100.py sums them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "profiles" / "moe" / "sources" / "frontier_a100_mixtral_8x7b_moe.csv"
SOURCE = ("NetX-lab/Frontier data/profiling/compute/a100/mixtral_8x7b_moe/moe.csv @ "
          "a4b22df8211864bf229258ecdfbe680f048f2d77 (the file as last changed in "
          "68978196afee0ab8654b7a86351ff957c1520cc3); MIT License, Copyright (c) 2026 Frontier contributors")
PARTS = {"gating_ms": "time_stats.moe_gating.median", "shuffling_ms": "time_stats.moe_shuffling.median",
         "grouped_gemm_ms": "time_stats.moe_grouped_gemm.median"}
SHAPE = {"num_experts": 8, "router_topk": 2, "hidden_dim": 4096, "expert_hidden_dim": 14336,
         "expert_parallel_size": 1}


def derive(path: str) -> str:
    df = pd.read_csv(path)
    for col, val in SHAPE.items():
        if set(df[col].unique()) != {val}:
            raise SystemExit(f"{path}: {col} is {sorted(df[col].unique())}, expected only {val}")
    df = df.rename(columns={"num_tensor_parallel_workers": "tp"})
    med = df.groupby(["tp", "num_tokens"])[list(PARTS.values())].median().rename(
        columns={v: k for k, v in PARTS.items()})
    med["moe_ms"] = med[list(PARTS)].sum(axis=1)
    lines = ["# Frontier's A100 Mixtral-8x7B MoE layer, reduced by profiles/derive_frontier_moe.py (do not edit)",
             f"# source: {SOURCE}",
             "# per (tp, num_tokens): median over duplicate rows of each part's median, ms; moe_ms = their sum; "
             "experts sharded by TP (ep 1), top-2 of 8, hidden 4096, expert FFN 14336",
             "tp,num_tokens," + ",".join(PARTS) + ",moe_ms"]
    for (tp, t), row in med.iterrows():
        lines.append(f"{int(tp)},{int(t)}," + ",".join(f"{row[c]:.6g}" for c in [*PARTS, "moe_ms"]))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="Frontier's moe.csv")
    ap.add_argument("--check", action="store_true", help="compare with the committed table")
    args = ap.parse_args()
    text = derive(args.file)
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)}: {'identical' if same else 'differs'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
