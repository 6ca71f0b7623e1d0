"""Fit the decode-attention wave structure of the ground truth from measured A100 decode points.

Decode attention is not linear in the context sum: FlashInfer's decode kernel runs one thread
block per (request, KV head), in waves over the GPU's SMs, so the measured time steps up where
requests x KV heads crosses a multiple of the SM count (reference/latency-profiles.md section 5:
jumps at batch 14, 28, 41 at 8 KV heads, context 1344). The ground truth models a fraction phi of
the context work as padded to full waves:

    t = a + b * [(1 - phi) * sum_ctx + phi * mean_ctx * ceil(n h / W) * W / h]

with h KV heads per GPU and W = 108 SMs (A100). This script fits one phi shared by every decode
series of the transcribed Llama-3-8B A100 profile (TP1: 8 KV heads per GPU, contexts 352 and 1344;
TP4: 2 KV heads per GPU, context 1344; a and b per TP degree), by least squares in relative error
over a grid of phi in [0, 1] step 0.01, and writes profiles/ground_truth.toml, which
profiles/build_a100.py copies into every A100 profile's `[ground_truth]` section.

    python profiles/fit_ground_truth.py [--data ../shared/data] [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "profiles" / "ground_truth.toml"
SOURCE = "vidur-profiles-llama3-8b-attention-excerpt/llama3-8b_a100_attention_points_transcribed.csv"
SM_COUNT = 108
KV_HEADS_PER_GPU = {1: 8, 4: 2}  # Llama-3-8B: 8 KV heads, split over TP


def padded_ctx(n: np.ndarray, ctx_sum: np.ndarray, h: int, phi: float, w: int = SM_COUNT) -> np.ndarray:
    pad = np.ceil(n * h / w) * w / h
    return (1 - phi) * ctx_sum + phi * (ctx_sum / n) * pad


def fit(points: pd.DataFrame) -> dict:
    """Shared phi, per-TP (a, b); returns the fit and the error of the wave and linear models."""
    series = []
    for tp, h in KV_HEADS_PER_GPU.items():
        g = points[points["tp"] == tp]
        n = g["batch_size"].to_numpy(float)
        series.append((tp, h, n, n * g["kv_cache_size"].to_numpy(float), g["time_ms"].to_numpy(float)))

    def solve(phi: float):
        coefs, rel = {}, []
        for tp, h, n, ctx, t in series:
            eff = padded_ctx(n, ctx, h, phi)
            a = np.c_[np.ones_like(eff), eff] / t[:, None]
            coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
            coefs[tp] = coef
            rel.append((coef[0] + coef[1] * eff) / t - 1)
        r = np.concatenate(rel)
        return float(np.sum(r ** 2)), coefs, np.abs(r)

    grid = np.round(np.arange(0.0, 1.0001, 0.01), 2)
    objs = [solve(p)[0] for p in grid]
    phi = float(grid[int(np.argmin(objs))])
    _, coefs, err = solve(phi)
    _, _, err0 = solve(0.0)
    return {"phi": phi, "coefs": coefs, "n_points": len(err),
            "wave": (float(np.median(err)), float(np.percentile(err, 90)), float(err.max())),
            "linear": (float(np.median(err0)), float(np.percentile(err0, 90)), float(err0.max()))}


def render(res: dict) -> str:
    w, l0 = res["wave"], res["linear"]
    lines = [
        "# Written by profiles/fit_ground_truth.py; read by profiles/build_a100.py. Do not edit by hand.",
        "[decode_wave]",
        f"decode_wave_fraction = {res['phi']}",
        f"sm_count = {SM_COUNT}",
        f'source = "data/{SOURCE} (decode points, TP1 8 KV heads per GPU and TP4 2 KV heads per GPU)"',
        f'method = "least squares in relative error; phi on a 0.01 grid shared by all series; a, b per TP degree; '
        f'{res["n_points"]} points"',
        f'achieved = "median |rel err| {w[0]:.1%}, P90 {w[1]:.1%}, max {w[2]:.1%} '
        f'(exactly linear in the context sum: {l0[0]:.1%}, {l0[1]:.1%}, {l0[2]:.1%})"',
    ]
    for tp, (a, b) in sorted(res["coefs"].items()):
        lines.append(f'fit_tp{tp} = "a {a:.4g} ms, b {b:.4g} ms per context token"')
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = ap.parse_args(argv)
    path = args.data / SOURCE
    if not path.is_file():
        print(f"fit_ground_truth: {path}: not found (pass --data)", file=sys.stderr)
        return 2
    pts = pd.read_csv(path)
    res = fit(pts[pts["kind"] == "decode"])
    text = render(res)
    print(text, end="")
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print("matches the committed file" if same else "DIFFERS from the committed file")
        return 0 if same else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
