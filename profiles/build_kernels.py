"""Re-derive the kernel cost models (profiles/kernels/) from Vidur's measured kernel data.

Usage (from the repository root):

    python profiles/build_kernels.py              # write profiles/kernels/<family>.toml and <family>-gemm.csv
    python profiles/build_kernels.py --check      # compare instead; exit 1 listing differing files
    python profiles/build_kernels.py --data ../shared/data --out profiles/kernels

For each GPU family (a100, h100, a40; Vidur's `compute/<family>/`), from every `mlp.csv` there:

* `<family>-gemm.csv`: the measured GEMM curves, one column `<N>x<K>` per distinct shape (QKV, O,
  gate-up and down projections of every model at TP 1, 2, 4, 8), median over duplicate token counts,
  median over models with the same shape, on the 259-point Vidur token grid (1..4096).
* `<family>.toml`: `[roofline]` effective FLOP/s (median 2MNK/t at 4096 tokens) and bytes/s (median
  weight bytes/t at 1 token) for the neighbour scaling, and the SM count (from the GPU TOMLs of
  profiles/gpus/ whose kernel_data is the family) for the wave phase of the GEMM prediction; `[elementwise.<op>]` a + b*bytes fits;
  `[attention]` prefill/decode fits (a100: fitted to the Llama-2-7B attention.csv and the Llama-3-8B
  transcribed points; h100/a40: the a100 fit times measured ratios, status "scaled"); `[comm.<ic>]`
  alpha-beta fits of the measured NCCL tables; `[validation]` the leave-one-model-out GEMM errors.
  Every coefficient lists the data files it came from.

It also writes the leave-one-model-out table into profiles/README.md (between the `kernels-loo`
markers). Only numpy, pandas, scipy and the standard library are used; floats have fixed formats, so the
output is byte-stable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sim.core import tomlio  # noqa: E402
from sim.profiling.kernels import (Arch, elementwise_bytes_per_token, fit_attention_points,  # noqa: E402
                                 fit_elementwise, gemm_shapes, layer_errors, leave_one_model_out,
                                 level_oracle_errors, rel_err_summary, VIDUR_OP,
                                 ELEMENTWISE_OPS)
from sim.profiling.profile_io import fit_alpha_beta  # noqa: E402
from sim.latency.hardware import gpu_names, load_gpu  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data"
DEFAULT_OUT = REPO / "profiles" / "kernels"
README = REPO / "profiles" / "README.md"
FAMILIES = ("a100", "h100", "a40")
GRID_MAX = 4096
ORACLE_EDGES = (65, 257, 1025)  # token ranges 1-64, 65-256, 257-1024, 1025-4096
LLAMA2_ATTN = "vidur-profiles/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"
LLAMA3_ATTN = "vidur-profiles-llama3-8b-attention-excerpt/llama3-8b_a100_attention_points_transcribed.csv"
# Interconnect -> Vidur network folder per family (None: not measured for that family).
NETWORK = {"nvswitch": {"a100": "a100_dgx", "h100": "h100_dgx"},
           "pcie-nvlink-pairs": {"a100": "a100_pairwise_nvlink", "h100": "h100_pairwise_nvlink",
                                 "a40": "a40_pairwise_nvlink"}}
COMM_HIDDEN = (4096, 8192)     # message sizes fitted: 1..4096 tokens of hidden 4096..8192, bf16


def rel(path: Path, data: Path) -> str:
    return "data/" + str(path.relative_to(data))


def read_mlp(path: Path) -> pd.DataFrame:
    raw = pd.read_csv(path)
    cols = [c for c in raw.columns if c.startswith("time_stats.") and c.endswith(".median")]
    return raw.groupby(["num_tensor_parallel_workers", "num_tokens"])[cols].median(), raw.iloc[0]


def arch_of(row) -> Arch:
    return Arch(hidden_size=int(row["n_embd"]), intermediate_size=int(row["n_expanded_embd"]),
                num_q_heads=int(row["n_head"]), num_kv_heads=int(row["n_kv_head"]),
                head_dim=int(row["n_embd"]) // int(row["n_head"]), gated_mlp=bool(row["use_gated_mlp"]))


def common_grid(files: list[Path]) -> np.ndarray:
    grids = [set(pd.read_csv(f, usecols=["num_tokens"])["num_tokens"]) for f in files]
    return np.array(sorted(set.intersection(*grids)), dtype=np.int64)


def collect(data: Path, family: str):
    """GEMM points and element-wise points of every mlp.csv of a family."""
    files = sorted((data / "vidur-profiles" / "compute" / family).glob("*/*/mlp.csv"))
    if not files:
        raise SystemExit(f"{data}/vidur-profiles/compute/{family}: no mlp.csv files")
    grid = common_grid(files)
    gemm, ew = [], []
    for f in files:
        g, row = read_mlp(f)
        a, model = arch_of(row), f.parent.name
        for tp in sorted(g.index.get_level_values(0).unique()):
            sub = g.loc[tp].reindex(grid)
            for op, (n, k) in gemm_shapes(a, tp).items():
                ms = sub[f"time_stats.{VIDUR_OP[op]}.median"].to_numpy(float)
                gemm.append({"model": model, "file": rel(f, data), "tp": int(tp), "op": op, "N": n, "K": k, "ms": ms})
            bpt = elementwise_bytes_per_token(a, tp)
            for op in ELEMENTWISE_OPS:
                cols = ["input_layernorm", "post_attention_layernorm"] if op == "rmsnorm" else [VIDUR_OP[op]]
                for c in cols:
                    if f"time_stats.{c}.median" not in sub.columns:     # phi-2: one norm (parallel block)
                        continue
                    ew.append(pd.DataFrame({"op": op, "file": rel(f, data), "bytes": bpt[op] * grid,
                                            "ms": sub[f"time_stats.{c}.median"].to_numpy(float)}))
    return grid, gemm, pd.concat(ew, ignore_index=True), [rel(f, data) for f in files]


def gemm_table(grid: np.ndarray, gemm: list[dict]):
    """Distinct shapes (sorted), their median curves, owners (model names) and sources."""
    by_shape: dict[tuple[int, int], list[dict]] = {}
    for g in gemm:
        by_shape.setdefault((g["N"], g["K"]), []).append(g)
    keys = sorted(by_shape)
    table = np.array([np.median(np.vstack([g["ms"] for g in by_shape[k]]), axis=0) for k in keys])
    owners = [{g["model"] for g in by_shape[k]} for k in keys]
    sources = {f"{n}x{k}": sorted({f"{g['file']} tp{g['tp']} {VIDUR_OP[g['op']]}" for g in by_shape[(n, k)]})
               for n, k in keys}
    return np.array(keys, dtype=float), table, owners, sources


def sm_count(family: str) -> tuple[int, list[str]]:
    """SMs of the GPUs whose kernel data is `family` (profiles/gpus/*.toml; they must agree)."""
    gpus = [load_gpu(g) for g in gpu_names()]
    counts = {g.sm_count for g in gpus if g.kernel_data == family}
    if len(counts) != 1 or 0 in counts:
        raise SystemExit(f"profiles/gpus: kernel_data {family!r} needs one positive sm_count, got {sorted(counts)}")
    return counts.pop(), sorted(f"profiles/gpus/{g.name}.toml" for g in gpus if g.kernel_data == family)


def roofline(grid, shapes, table, family: str) -> dict:
    n, k = shapes[:, 0], shapes[:, 1]
    top = len(grid) - 1
    flops = np.median(2 * grid[top] * n * k / (table[:, top] / 1e3))
    bw = np.median(2 * n * k / (table[:, 0] / 1e3))
    sms, gpu_files = sm_count(family)
    return {"flops": float(f"{flops:.4g}"), "bytes_per_s": float(f"{bw:.4g}"), "sm_count": sms,
            "method": f"median over the measured shapes of 2*M*N*K/t at M = {int(grid[top])} (flops) and of "
                      "2*N*K/t at M = 1 (bytes/s); used only for the ratio between neighbouring shapes. sm_count "
                      "(wave phase of predicted GEMMs) from " + ", ".join(gpu_files)}


def attention_a100(data: Path) -> tuple[dict, dict, dict, list[str]]:
    l2 = pd.read_csv(data / LLAMA2_ATTN)
    l2 = l2[l2["num_tensor_parallel_workers"] == 1]
    d = 128
    pre = l2[l2["is_prefill"]]
    dec = l2[~l2["is_prefill"]]
    pre_pts = [pd.DataFrame({"batch": pre["batch_size"], "chunk": pre["prefill_chunk_size"],
                             "prefix": pre["kv_cache_size"], "q_dims": pre["n_q_head"] * d,
                             "ms": pre["time_stats.attn_prefill.median"]})]
    dec_pts = [pd.DataFrame({"batch": dec["batch_size"], "context": dec["kv_cache_size"],
                             "kv_dims": dec["n_kv_head"] * d, "ms": dec["time_stats.attn_decode.median"]})]
    ex = pd.read_csv(data / LLAMA3_ATTN)
    p3 = ex[ex["kind"] == "prefill"]
    d3 = ex[ex["kind"] == "decode"]
    pre_pts.append(pd.DataFrame({"batch": p3["batch_size"], "chunk": p3["prefill_chunk_size"],
                                 "prefix": p3["kv_cache_size"], "q_dims": 32 // p3["tp"] * d, "ms": p3["time_ms"]}))
    dec_pts.append(pd.DataFrame({"batch": d3["batch_size"], "context": d3["kv_cache_size"],
                                 "kv_dims": 8 // d3["tp"] * d, "ms": d3["time_ms"]}))
    # Each source file carries the same total weight, so the 672 Llama-2-7B decode points do not drown
    # the 225 Llama-3-8B ones (the GQA shape most models have).
    for pts in (pre_pts, dec_pts):
        for i, df in enumerate(pts):
            pts[i] = df.assign(weight=1.0 / len(df))
    pre_df = pd.concat(pre_pts).dropna()
    dec_df = pd.concat(dec_pts).dropna()
    pre_df = pre_df[pre_df["ms"] > 0]
    dec_df = dec_df[dec_df["ms"] > 0]
    p, dd, q = fit_attention_points(pre_df, dec_df)
    # the ranges the fit saw (a profile's [measured]; beyond them the fitted FLOP and byte rates hold)
    measured = {"prefill_chunk": [int(pre_df["chunk"].min()), int(pre_df["chunk"].max())],
                "prefill_context": [int((pre_df["chunk"] + pre_df["prefix"]).min()),
                                    int((pre_df["chunk"] + pre_df["prefix"]).max())],
                "decode_batch": [int(dec_df["batch"].min()), int(dec_df["batch"].max())],
                "decode_context": [int(dec_df["context"].min()), int(dec_df["context"].max())]}
    q = dict(q, measured=measured)
    return p, dd, q, ["data/" + LLAMA2_ATTN, "data/" + LLAMA3_ATTN]


def comm_fits(data: Path, family: str) -> dict:
    out = {}
    lo, hi = 1 * COMM_HIDDEN[0] * 2, 4096 * COMM_HIDDEN[1] * 2
    for ic, dirs in NETWORK.items():
        if family not in dirs:
            continue
        ndir = data / "vidur-profiles" / "network" / dirs[family]
        parts, files = [], []
        for op in ("all_reduce", "send_recv"):
            f = ndir / f"{op}.csv"
            if not f.is_file():
                continue
            df = pd.read_csv(f)
            keep = (df["devices_per_node"] == df["num_workers"]) if op == "all_reduce" else \
                (df["num_workers"] == 2) & (df["devices_per_node"] == 2)
            df = df[keep]
            parts.append(pd.DataFrame({"op": op, "num_workers": df["num_workers"], "bytes": df["size"],
                                       "ms": df[f"time_stats.{op}.median"]}))
            files.append(rel(f, data))
        comm = pd.concat(parts).groupby(["op", "num_workers", "bytes"], as_index=False)["ms"].median()
        entry: dict = {"sources": files}
        sr = fit_alpha_beta(comm, "send_recv", 2, lo, hi)
        if sr:
            entry["send_recv"] = {"alpha_us": round(sr[0], 2), "bw_gbps": round(sr[1], 2)}
        for n in sorted(comm[comm["op"] == "all_reduce"]["num_workers"].unique()):
            ar = fit_alpha_beta(comm, "all_reduce", int(n), lo, hi)
            if ar:
                entry[f"all_reduce_{int(n)}"] = {"alpha_us": round(ar[0], 2), "busbw_gbps": round(ar[1], 2)}
        entry["method"] = (f"t = alpha + f*bytes/BW (f = 2(n-1)/n for all_reduce, 1 for send_recv), non-negative "
                           f"least squares in relative error over {lo}..{hi} bytes; all_reduce on one node "
                           "(devices_per_node = num_workers), send_recv between 2 GPUs of one node; median column")
        out[ic] = entry
    return out


def build_family(data: Path, family: str, a100_ref: dict | None):
    grid, gemm, ew, files = collect(data, family)
    shapes, table, owners, sources = gemm_table(grid, gemm)
    layers: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for g in gemm:
        layers.setdefault((g["model"], g["tp"]), []).append((g["N"], g["K"]))
    meta: dict = {"family": family, "grid_tokens": f"{len(grid)} token counts {grid[0]}..{grid[-1]}",
                  "sources": files, "roofline": roofline(grid, shapes, table, family)}
    meta["elementwise"] = {}
    for op in ELEMENTWISE_OPS:
        pts = ew[ew["op"] == op].dropna()
        a, b, err = fit_elementwise(pts)
        med, p90 = rel_err_summary(err)
        meta["elementwise"][op] = {"a_ms": float(f"{a:.5g}"), "b_ms_per_byte": float(f"{b:.5g}"),
                                   "points": int(len(pts)), "median_rel_err": round(med, 4),
                                   "p90_rel_err": round(p90, 4),
                                   "sources": f"time_stats.{'input_layernorm+post_attention_layernorm' if op == 'rmsnorm' else VIDUR_OP[op]}.median of every mlp.csv above, every TP degree"}
    if family == "a100":
        pre, dec, q, att_src = attention_a100(data)
        measured = q.pop("measured")
        meta["attention"] = {"status": "fitted", "sources": att_src,
                             "prefill": {k: float(f"{v:.5g}") for k, v in pre.items()},
                             "decode": {k: float(f"{v:.5g}") for k, v in dec.items()},
                             "measured": measured,
                             "quality": {c: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in qq.items()}
                                         for c, qq in q.items()},
                             "method": "non-negative least squares in relative error; prefill b-terms per 32 x 128 "
                                       "query dims (FLOPs), decode b_ctx per 1024 KV dims (bytes)"}
    else:
        ref_shapes, ref_table = a100_ref["shapes"], a100_ref["table"]
        common = [(i, j) for i, s in enumerate(shapes) for j, r in enumerate(ref_shapes) if tuple(s) == tuple(r)]
        comp = float(np.median([table[i, -1] / ref_table[j, -1] for i, j in common]))
        mem = float(np.median([table[i, 0] / ref_table[j, 0] for i, j in common]))
        att = a100_ref["attention"]
        meta["attention"] = {
            "status": "scaled", "sources": att["sources"] + files + a100_ref["files"],
            "compute_ratio": round(comp, 4), "memory_ratio": round(mem, 4),
            "prefill": {k: float(f"{v * (mem if k == 'a_ms' else comp):.5g}") for k, v in att["prefill"].items()},
            "decode": {k: float(f"{v * mem:.5g}") for k, v in att["decode"].items()},
            "measured": att["measured"],
            "method": (f"no attention data for {family}: the a100 fit x measured {family}/a100 time ratios, median over "
                       f"the {len(common)} GEMM shapes measured on both: prefill x {comp:.3f} (at "
                       f"{int(grid[-1])} tokens, compute bound; its floor a_ms x {mem:.3f}), decode x {mem:.3f} (at 1 token, "
                       "memory bound)")}
    meta["comm"] = comm_fits(data, family)
    loo = leave_one_model_out(grid.astype(float), shapes, table, owners, meta["roofline"]["flops"],
                              meta["roofline"]["bytes_per_s"], meta["roofline"]["sm_count"], GRID_MAX)
    med, p90 = rel_err_summary(loo["rel_err"])
    lay = layer_errors(loo, layers)
    lmed, lp90 = rel_err_summary(lay["rel_err"])
    meta["validation"] = {"loo_median_rel_err": round(med, 4), "loo_p90_rel_err": round(p90, 4),
                          "points": int(len(loo)), "method": "leave-one-model-out: each model's GEMM shapes predicted "
                          "from the shapes no held-out model has, token counts 1..4096",
                          "layer_median_rel_err": round(lmed, 4), "layer_p90_rel_err": round(lp90, 4),
                          "layer_points": int(len(lay)),
                          "layer_method": "the same predictions summed over the four projections of each (model, "
                          "TP degree) per token count (the per-layer GEMM time a stage is built from)"}
    meta["gemm_sources"] = sources
    csv = render_gemm_csv(grid, shapes, table)
    text = "# Written by profiles/build_kernels.py from ../shared/data; do not edit by hand.\n" + tomlio.dumps(meta)
    ref = {"shapes": shapes, "table": table, "attention": meta["attention"], "files": files}
    return text, csv, (loo, lay), ref


def render_gemm_csv(grid, shapes, table) -> str:
    cols = [f"{int(n)}x{int(k)}" for n, k in shapes]
    lines = [",".join(["num_tokens"] + cols)]
    for j, m in enumerate(grid):
        lines.append(",".join([str(int(m))] + [f"{table[i, j]:.5g}" for i in range(len(shapes))]))
    return "\n".join(lines) + "\n"


def loo_markdown(loos: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> str:
    lines = ["| GPU data | model held out | shapes | GEMM median \\|error\\| | GEMM P90 \\|error\\| "
             "| layer GEMM sum median \\|error\\| | layer GEMM sum P90 \\|error\\| |", "|---|---|---|---|---|---|---|"]
    for fam, (loo, lay) in loos.items():
        for model, g in loo.groupby("model"):
            med, p90 = rel_err_summary(g["rel_err"])
            lmed, lp90 = rel_err_summary(lay[lay["model"] == model]["rel_err"])
            lines.append(f"| {fam} | {model} | {g[['N', 'K']].drop_duplicates().shape[0]} | {med:.1%} | {p90:.1%} "
                         f"| {lmed:.1%} | {lp90:.1%} |")
        med, p90 = rel_err_summary(loo["rel_err"])
        lmed, lp90 = rel_err_summary(lay["rel_err"])
        lines.append(f"| **{fam}** | **all** | | **{med:.1%}** | **{p90:.1%}** | **{lmed:.1%}** | **{lp90:.1%}** |")
    band = ["", "By token range (all families together):", "",
            "| tokens | GEMM median \\|error\\| | GEMM P90 \\|error\\| | layer GEMM sum median | layer GEMM sum P90 |",
            "|---|---|---|---|---|"]
    allloo = pd.concat([x[0] for x in loos.values()])
    alllay = pd.concat([x[1] for x in loos.values()])
    for lo, hi in ((1, 64), (65, 256), (257, 1024), (1025, 4096)):
        g = allloo[(allloo["num_tokens"] >= lo) & (allloo["num_tokens"] <= hi)]
        h = alllay[(alllay["num_tokens"] >= lo) & (alllay["num_tokens"] <= hi)]
        med, p90 = rel_err_summary(g["rel_err"])
        lmed, lp90 = rel_err_summary(h["rel_err"])
        band.append(f"| {lo}-{hi} | {med:.1%} | {p90:.1%} | {lmed:.1%} | {lp90:.1%} |")
    floor = ["", "With each held-out shape's own level divided out (`level_oracle_errors`: not a predictor, it reads "
             "the measured answer; what is left is the step pattern's error, a floor for any method that got every "
             "unmeasured shape's level exactly right):", "",
             "| GPU data | GEMM P90 \\|error\\| as predicted | level per shape | level per token range (1-64, 65-256, "
             "257-1024, 1025-4096) |", "|---|---|---|---|"]
    for fam, (loo, _lay) in loos.items():
        p90s = [rel_err_summary(e)[1] for e in (loo["rel_err"], level_oracle_errors(loo),
                                                level_oracle_errors(loo, ORACLE_EDGES))]
        floor.append(f"| {fam} | {p90s[0]:.1%} | {p90s[1]:.1%} | {p90s[2]:.1%} |")
    return "\n".join(lines + band + floor) + "\n"


def replace_section(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- BEGIN {name} (generated) -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body}{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = ap.parse_args(argv)
    files: dict[Path, str] = {}
    loos, ref = {}, None
    for fam in FAMILIES:
        text, csv, loo, r = build_family(args.data, fam, ref)
        if fam == "a100":
            ref = r
        files[args.out / f"{fam}.toml"] = text
        files[args.out / f"{fam}-gemm.csv"] = csv
        loos[fam] = loo
        (gm, gp), (lm, lp) = rel_err_summary(loo[0]["rel_err"]), rel_err_summary(loo[1]["rel_err"])
        print(f"{fam}: LOO GEMM median {gm:.1%}, P90 {gp:.1%}; layer GEMM sum median {lm:.1%}, P90 {lp:.1%}")
    readme = README.read_text()
    files[README] = replace_section(readme, "kernels-loo", loo_markdown(loos))
    if args.check:
        bad = [str(p) for p, t in files.items() if not p.is_file() or p.read_text() != t]
        if bad:
            print("differs: " + ", ".join(bad))
            return 1
        print("kernel data up to date")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for p, t in files.items():
        p.write_text(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
