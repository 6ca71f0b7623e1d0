"""A real profiler: time one layer's kernels with PyTorch and write a PipeSim profile
(`ppsim profile collect`).

Needs the optional extra `profile` (PyTorch), imported lazily. For the model config's `tp` it times,
on one device, the per-GPU shard of one layer (no communication), like Vidur:

- over a token grid: the four GEMMs (QKV: hidden -> (q + 2 kv heads) x head_dim / tp; O:
  q heads x head_dim / tp -> hidden; gate+up: hidden -> 2 x intermediate / tp; down:
  intermediate / tp -> hidden), the gated SiLU, a RoPE-like rotation of the q and k heads, the two
  RMSNorms and the residual add (-> layer_nonattn.csv);
- prefill attention with `torch.nn.functional.scaled_dot_product_attention` over a chunk x prefix
  grid (causal, the prefix fully visible) and decode attention over a batch x context grid, then
  the attention model of FORMAT.md by least squares (-> attention.csv);
- only when several CUDA GPUs are present: NCCL all-reduce at num_workers = tp and send/recv
  between two GPUs over a message-size grid (-> comm.csv, `[comm] model = "table"`).

Each point is the median of `repeats` timed runs after warm-up (CUDA events on a GPU,
perf_counter on the CPU). BF16 on CUDA, float32 on the CPU (CPU BF16 GEMMs are not representative).
meta.toml records the device name, torch version, dtype, date and grids under [provenance], and
`[profile] source = "collected (ppsim profile collect)"` (so `--force` may replace it later).
The profile is written whole or not at all (`profile_io.write_profile` stages it).
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import time
from pathlib import Path

import pandas as pd

from sim.core.errors import PipeSimError
from sim.profiling.profile_io import fit_attention, read_model_config, write_profile

INSTALL_HINT = "PyTorch is needed for 'ppsim profile collect': pip install .[profile]"

GRIDS = {
    "full": dict(tokens=[1, 2, 4, 8] + list(range(16, 1025, 16)) + list(range(1088, 4097, 64)),
                 chunks=[64, 128, 256, 512, 1024, 2048], prefixes=[0, 512, 2048, 4096],
                 batches=[1, 8, 32, 64, 128], contexts=[256, 1024, 4096],
                 sizes=[2 ** k for k in range(11, 27)], warmup=3, repeats=10),
    "quick": dict(tokens=[1, 8, 16, 32, 64, 128], chunks=[16, 32, 64], prefixes=[0, 64],
                  batches=[1, 4], contexts=[64, 256], sizes=[2 ** k for k in range(11, 21, 3)],
                  warmup=1, repeats=3),
}


def import_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PipeSimError(INSTALL_HINT) from None
    return torch


class Timer:
    def __init__(self, torch, device: str, warmup: int, repeats: int) -> None:
        self.torch, self.device, self.warmup, self.repeats = torch, device, warmup, repeats

    def __call__(self, fn) -> float:
        """Median ms of fn() over `repeats` runs after `warmup`."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        times = []
        if self.device == "cuda":
            torch.cuda.synchronize()
            for _ in range(self.repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b))
        else:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return float(statistics.median(times))


def time_layer(torch, timer: Timer, m: dict, tp: int, tokens: list[int], device: str, dtype) -> pd.DataFrame:
    h, d, ffn = m["hidden_size"], m["head_dim"], m.get("intermediate_size") or 4 * m["hidden_size"]
    qh, kvh = m["num_q_heads"] // tp, max(1, m["num_kv_heads"] // tp)
    F = torch.nn.functional
    kw = dict(device=device, dtype=dtype)
    w_qkv = torch.randn(h, (qh + 2 * kvh) * d, **kw) * 0.02
    w_o = torch.randn(qh * d, h, **kw) * 0.02
    w_gu = torch.randn(h, 2 * ffn // tp, **kw) * 0.02
    w_down = torch.randn(ffn // tp, h, **kw) * 0.02
    norm_w = torch.ones(h, **kw)
    rows = []
    with torch.inference_mode():
        for T in tokens:
            x = torch.randn(T, h, **kw)
            a_o = torch.randn(T, qh * d, **kw)
            gu = torch.randn(T, 2 * ffn // tp, **kw)
            a_d = torch.randn(T, ffn // tp, **kw)
            qk = torch.randn(T, (qh + kvh), d, **kw)
            cos, sin = torch.randn(T, 1, d // 2, **kw), torch.randn(T, 1, d // 2, **kw)

            def rope():
                x1, x2 = qk[..., : d // 2], qk[..., d // 2:]
                return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

            def norm():
                v = x.float()
                v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
                return v.to(dtype) * norm_w

            g, u = gu[:, : ffn // tp], gu[:, ffn // tp:]
            r = {"num_tokens": T,
                 "qkv_proj": timer(lambda: x @ w_qkv),
                 "o_proj": timer(lambda: a_o @ w_o),
                 "gate_up_proj": timer(lambda: x @ w_gu),
                 "down_proj": timer(lambda: a_d @ w_down),
                 "act": timer(lambda: F.silu(g) * u),
                 "rope": timer(rope),
                 "rmsnorm_x2": 2 * timer(norm),
                 "residual_add": timer(lambda: x + x)}
            rows.append(r)
    df = pd.DataFrame(rows).set_index("num_tokens")
    df["linear_ms"] = df[["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]].sum(axis=1)
    df["layer_nonattn_ms"] = df[["linear_ms", "act", "rope", "rmsnorm_x2", "residual_add"]].sum(axis=1)
    return df


def time_attention(torch, timer: Timer, m: dict, tp: int, grid: dict, device: str, dtype):
    d = m["head_dim"]
    qh = m["num_q_heads"] // tp
    F = torch.nn.functional
    kw = dict(device=device, dtype=dtype)
    pre, dec = [], []
    with torch.inference_mode():
        for c in grid["chunks"]:
            for p in grid["prefixes"]:
                q = torch.randn(1, qh, c, d, **kw)
                k = torch.randn(1, qh, p + c, d, **kw)     # KV heads expanded to q heads beforehand
                v = torch.randn(1, qh, p + c, d, **kw)
                if p == 0:
                    ms = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                else:
                    mask = torch.ones(c, p + c, dtype=torch.bool, device=device).tril(diagonal=p)
                    ms = timer(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
                pre.append({"batch": 1, "chunk": c, "prefix": p, "ms": ms})
        for b in grid["batches"]:
            for ctx in grid["contexts"]:
                q = torch.randn(b, qh, 1, d, **kw)
                k = torch.randn(b, qh, ctx, d, **kw)
                v = torch.randn(b, qh, ctx, d, **kw)
                dec.append({"batch": b, "context": ctx,
                            "ms": timer(lambda: F.scaled_dot_product_attention(q, k, v))})
    return pd.DataFrame(pre), pd.DataFrame(dec)


def _comm_worker(rank: int, world: int, sizes: list[int], tp: int, port: int, out: str, warmup: int,
                 repeats: int) -> None:  # pragma: no cover - needs several GPUs
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    timer = Timer(torch, "cuda", warmup, repeats)
    rows = []
    for size in sizes:
        buf = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        if tp > 1:
            group = dist.new_group(list(range(tp)))
            if rank < tp:
                ms = timer(lambda: dist.all_reduce(buf, group=group))
                rows.append(("all_reduce", tp, size, ms))
            dist.barrier()
        if rank < 2:
            pair = dist.new_group([0, 1])

            def sr():
                if rank == 0:
                    dist.send(buf, 1, group=pair)
                else:
                    dist.recv(buf, 0, group=pair)
            ms = timer(sr)
            rows.append(("send_recv", 2, size, ms))
        dist.barrier()
    if rank == 0:
        from sim.core import fsio

        fsio.write_frame(pd.DataFrame(rows, columns=["op", "num_workers", "bytes", "ms"]), out, index=False)
    dist.destroy_process_group()


def time_comm(torch, tp: int, grid: dict, tmp: Path) -> pd.DataFrame | None:  # pragma: no cover - GPUs
    n = torch.cuda.device_count()
    if n < 2:
        return None
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp / "comm_raw.csv"
    world = max(2, tp if tp <= n else 2)
    mp.spawn(_comm_worker, args=(world, grid["sizes"], tp if tp <= n else 1, port, str(out), grid["warmup"],
                                 grid["repeats"]), nprocs=world, join=True)
    return pd.read_csv(out)


def collect(model_cfg: str | Path, out: str | Path, device: str = "cpu", quick: bool = False,
            log=print):
    """Profile the model config's layer on `device` and write a profile at `out`. Returns the Profile."""
    if device not in ("cpu", "cuda"):
        raise PipeSimError(f"--device must be cpu or cuda, got {device!r}")
    cfg = read_model_config(model_cfg)
    torch = import_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise PipeSimError("--device cuda: no CUDA device visible to PyTorch (use --device cpu)")
    grid = GRIDS["quick" if quick else "full"]
    tp, m = cfg["tp"], cfg["model"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    timer = Timer(torch, device, grid["warmup"], grid["repeats"])
    torch.manual_seed(0)
    log(f"timing one layer (tp {tp}) at {len(grid['tokens'])} token counts on {device}")
    layer = time_layer(torch, timer, m, tp, grid["tokens"], device, dtype)
    layer["layer_nonattn_ms"] = layer["layer_nonattn_ms"].clip(lower=1e-6)
    log("timing attention")
    pts_pre, pts_dec = time_attention(torch, timer, m, tp, grid, device, dtype)
    pre, dec, q = fit_attention(pts_pre, pts_dec)
    comm = None
    if device == "cuda":
        # The workers' raw table goes to a private temporary folder, never into `out`: the profile
        # folder is written only by write_profile, whole (staged, then swapped in).
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ppsim-collect-") as tmp:
            comm = time_comm(torch, tp, grid, Path(tmp))
    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else cpu_name()
    provenance = {
        "tool": "ppsim profile collect" + (" --quick" if quick else ""),
        "device": device, "device_name": dev_name, "torch_version": torch.__version__,
        "dtype": str(dtype).replace("torch.", ""), "date": _dt.date.today().isoformat(),
        "token_grid": grid["tokens"], "prefill_chunks": grid["chunks"], "prefill_prefixes": grid["prefixes"],
        "decode_batches": grid["batches"], "decode_contexts": grid["contexts"],
        "timing": f"median of {grid['repeats']} runs after {grid['warmup']} warm-up runs",
        "communication": "measured with NCCL" if comm is not None else
        "not measured (needs several CUDA GPUs); alpha-beta defaults",
    }
    derivation = {
        "layer_nonattn": "timed per op with PyTorch on one device (the tp shard of one layer, no communication)",
        "attention": "SDPA timings fitted by non-negative least squares in relative error: "
                     + "; ".join(f"{c} {v['points']} points, median |rel err| {v['median_rel_err']:.1%}"
                                 for c, v in q.items()),
    }
    prof = write_profile(out, cfg=cfg, layer=layer, prefill=pre, decode=dec, comm=comm,
                         gpu=dev_name, base_hardware=f"{dev_name} (measured by ppsim profile collect)",
                         sources=[f"measured: {dev_name}, torch {torch.__version__}"],
                         derivation=derivation, provenance=provenance,
                         source="collected (ppsim profile collect)")
    log(f"wrote {out}")
    return prof


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
