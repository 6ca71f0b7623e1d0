"""Measure the kernels of one model's layers on the GPU this runs on (the H200 device check of issue 42).

Llama-3.1-8B at TP1 (hidden 4096, FFN 14336, 32 q / 8 KV heads of 128): the four projections' GEMMs at
several token counts, BF16 (torch.nn.functional.linear, cuBLAS) and FP8 (torch._scaled_mm, e4m3, per-tensor
scales, BF16 out: the per-tensor FP8 path vLLM's CutlassFP8ScaledMMLinearKernel serves), and attention
through torch's scaled_dot_product_attention (flash backend: FlashAttention-2 in PyTorch, not vLLM's FA3):
causal prefill of a batch of prompts, and decode (one query per request over a KV cache of `ctx` tokens).

Each kernel is timed with CUDA events over `REPS` calls after warm-up, cycling through enough weight /
KV copies that the working set is several times the 60 MB L2 (a serving GPU reads weights from HBM);
INNER calls run back to back between two events (launch gaps hidden, as in a served step), and the
median over REPS of the mean per call is written. Usage: python measure_h200.py OUT_DIR (writes kernels.csv and env.txt).
"""
import csv
import os
import sys

import torch
import torch.nn.functional as F

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
REPS = 30
INNER = 20
L2_BYTES = 60e6
HIDDEN, FFN, QH, KVH, D = 4096, 14336, 32, 8, 128
SHAPES = {"qkv_proj": ((QH + 2 * KVH) * D, HIDDEN), "o_proj": (HIDDEN, QH * D),
          "gate_up_proj": (2 * FFN, HIDDEN), "down_proj": (HIDDEN, FFN)}
TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
dev = "cuda"


def timed(fn, n_inputs):
    for i in range(3):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    times = []
    for r in range(REPS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for j in range(INNER):     # back-to-back calls: the launch gap is hidden as in a served step
            fn((r * INNER + j) % n_inputs)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / INNER)
    times.sort()
    return times[len(times) // 2]


def copies(nbytes):
    return max(2, int(4 * L2_BYTES // max(nbytes, 1)) + 1)


rows = []
fp8 = hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
for op, (n, k) in SHAPES.items():
    nw = min(copies(n * k * 2), 16)
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(nw)]
    w8 = [w.to(torch.float8_e4m3fn) for w in ws] if fp8 else []
    one = torch.ones((), device=dev, dtype=torch.float32)
    for m in TOKENS:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ms = timed(lambda i: F.linear(x, ws[i]), nw)
        rows.append(("gemm", op, "bf16", m, n, k, 0, ms))
        if fp8:
            x8 = x.to(torch.float8_e4m3fn)
            try:
                ms = timed(lambda i: torch._scaled_mm(x8, w8[i].t(), scale_a=one, scale_b=one,
                                                      out_dtype=torch.bfloat16), nw)
                rows.append(("gemm", op, "fp8", m, n, k, 0, ms))
            except Exception as exc:   # noqa: BLE001 - record why, keep measuring
                print("fp8 failed", op, m, exc, flush=True)
    del ws, w8
    torch.cuda.empty_cache()
    print("done", op, flush=True)

# Attention (one layer): prefill of `b` prompts of `s` tokens (causal), decode of `b` requests over `ctx`.
for b, s in ((1, 512), (1, 2048), (1, 8192), (4, 2048), (16, 1024)):
    q = torch.randn(b, QH, s, D, device=dev, dtype=torch.bfloat16)
    kv = [(torch.randn(b, KVH, s, D, device=dev, dtype=torch.bfloat16),
           torch.randn(b, KVH, s, D, device=dev, dtype=torch.bfloat16)) for _ in range(2)]
    ms = timed(lambda i: F.scaled_dot_product_attention(q, kv[i][0], kv[i][1], is_causal=True, enable_gqa=True), 2)
    rows.append(("attention", "prefill", "bf16", b, s, 0, s, ms))
for b, ctx in ((1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 2048), (64, 4096), (128, 1024), (256, 2048)):
    kv_bytes = 2 * b * KVH * ctx * D * 2
    nk = min(copies(kv_bytes), 8)
    q = torch.randn(b, QH, 1, D, device=dev, dtype=torch.bfloat16)
    kv = [(torch.randn(b, KVH, ctx, D, device=dev, dtype=torch.bfloat16),
           torch.randn(b, KVH, ctx, D, device=dev, dtype=torch.bfloat16)) for _ in range(nk)]
    ms = timed(lambda i: F.scaled_dot_product_attention(q, kv[i][0], kv[i][1], enable_gqa=True), nk)
    rows.append(("attention", "decode", "bf16", b, 1, 0, ctx, ms))
    del kv
    torch.cuda.empty_cache()

with open(os.path.join(OUT, "kernels.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["kind", "op", "dtype", "m_or_batch", "n_or_seq", "k", "context", "ms"])
    w.writerows(rows)
with open(os.path.join(OUT, "env.txt"), "w") as f:
    f.write(f"torch {torch.__version__}, cuda {torch.version.cuda}, device {torch.cuda.get_device_name()}, "
            f"sm {torch.cuda.get_device_capability()}, reps {REPS} x {INNER} back-to-back calls, median of the "
            "per-call mean\n")
print("rows", len(rows))
