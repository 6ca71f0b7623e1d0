"""Engine speed: simulated requests per wall-second and iterations per second.

An azure-conv-like load (the `azure-conv-synth` length model, Poisson arrivals) of 400 and
10,000 requests at 4 and 8 req/s, at PP=4 (chunk 512) and TP=4 (chunk 2048), Qwen2.5-32B on
the A100-40GB PCIe profile. Workload generation is excluded from the timing (it is done once
per run, before the simulation, as in every sweep).

Run: `python benchmarks/engine.py [--quick] [--repeats N] [--baseline REF] [--policies] [--engines]`.

`--engines` times the serving engines' schedulers (sim/engine/schedulers/) side by side on the
same points and prints each one's wall time over FastPP's (the issue's bound: 1.5x): PP=4 for
fastpp, sglang and vllm-v1; TP=4 for all four (vllm-v0 runs pp = 1 only, with its own budget,
max(context, 2048): its steps are whole prompts); and PP=4 on the shared-system-prompt workload,
where the prefix caches are on and hit. `--rounds N` repeats them all N times in alternation and
prints medians.

`--policies` times, instead, the dynamic chunk controllers on an overloaded server (the runs a
goodput search makes just above the goodput, where the waiting queue grows to thousands):
DCP_pred and DCP_pred+DS on azure-conv at 10 req/s, 4,000 requests, Qwen2.5-32B PP=4 (needs the
Azure trace: `PIPESIM_CACHE`, set to /work/shared/data/azure-llm-inference-2023 when unset).

With `--baseline REF` (a commit, e.g. 950d8b4) the same points also run on REF, checked out in
a temporary `git worktree`: every measurement is a fresh subprocess importing `sim` from one
tree, the two trees alternate round by round (so a busy machine slows both alike), and the
table shows the median of each tree's rounds and the speed-up (baseline time / this tree's),
in wall time and in the process's CPU time (steadier on a machine shared with other work).
The `engines` column says which engine each tree ran: `compiled` (this tree after `make native`,
sim/native.py) or `python` (the sources; a commit before the compiled engine, a tree without a
fresh build, or `PIPESIM_PURE=1`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYOUTS = {
    "PP=4": {"parallel": {"pp": 4, "tp": 1}, "scheduler": {"chunk_size_tokens": 512},
             "latency": {"profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"}},
    "TP=4": {"parallel": {"pp": 1, "tp": 4}, "scheduler": {"chunk_size_tokens": 2048},
             "latency": {"profile": "profiles/a100-pcie-40gb/qwen2.5-32b/tp4"}},
}


POLICY_LAYOUTS = ("DCP_pred", "DCP_pred+DS")  # `--policies`: schemes on azure-conv (sim.core.schemes)


# `--engines` also times a prefix-reuse point: the shipped shared-system-prompt workload (90% of
# prompts behind one of 4 system prompts of 1,024 tokens), where SGLang's radix cache and vLLM's
# block hash chain are on (their defaults) and do their work every step.
PREFIX_WORKLOAD = "shared-system-prompt"


def _table(layout: str, num: int, rate: float, engine: str | None = None) -> dict:
    if layout in POLICY_LAYOUTS:
        import os

        from sim.core.schemes import scheme_table

        os.environ.setdefault("PIPESIM_CACHE", "/work/shared/data/azure-llm-inference-2023")
        return scheme_table(layout, "qwen2.5-32b", {"name": "azure-conv", "num_requests": num, "rate_rps": rate},
                            seed=1)
    import copy

    base, _, variant = layout.partition(" ")
    wl = PREFIX_WORKLOAD if variant == "prefix" else "azure-conv-synth"
    table = {"seed": 1, **copy.deepcopy(LAYOUTS[base]),
             "workload": {"name": wl, "rate_rps": rate, "num_requests": num}}
    if engine is not None:
        table["scheduler"]["engine"] = engine
        if engine == "vllm-v0":
            table["scheduler"]["chunk_size_tokens"] = 0  # its own default: no chunking
    return table


def bench(layout: str, num: int, rate: float, repeats: int, engine: str | None = None) -> dict:
    """Best of `repeats` timed runs of one point, with the `sim` package found on sys.path."""
    from sim.core.config import config_from_table
    from sim.engine.run import run
    from sim.workloads import build_workload

    cfg = config_from_table(_table(layout, num, rate, engine))
    reqs = build_workload(cfg.workload, seed=cfg.seed)
    # untimed warm-up: a short run imports what a run needs (lazily imported libraries too)
    run(cfg, requests=reqs[:20])
    best = best_cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = run(cfg, requests=reqs)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    iters = len(res.iterations["iteration"])
    try:  # (commits before the compiled engine have no sim.native)
        from sim import native
        engine = "compiled" if native.active() else "python"
    except ImportError:
        engine = "python"
    return {"engine": engine, "scheduler": cfg.scheduler.engine, "layout": layout, "requests": num, "rate_rps": rate, "status": res.status,
            "wall_s": round(best, 3), "cpu_s": round(best_cpu, 3), "sim_s": round(res.end_s, 1), "iterations": iters,
            "requests_per_s": round(num / best), "iterations_per_s": round(iters / best)}


def _point_in(tree: Path, layout: str, num: int, rate: float) -> dict:
    """One timed run of a point in a subprocess that imports `sim` from `tree`."""
    code = (f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'benchmarks')!r});"
            f"import engine; print(json.dumps(engine.bench({layout!r}, {num}, {rate}, 1)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"benchmark point failed in {tree}:\n{out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(ref: str, points: list[tuple], rounds: int) -> list[dict]:
    import pandas as pd

    tmp = Path(tempfile.mkdtemp(prefix="ppsim-baseline-"))
    base = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), ref],
                   check=True, capture_output=True)
    rows = []
    try:
        for layout, num, rate in points:
            wall: dict[str, list[float]] = {"base": [], "this": []}
            cpu: dict[str, list[float]] = {"base": [], "this": []}
            engines = {}
            for r in range(rounds):
                order = [("base", base), ("this", ROOT)] if r % 2 == 0 else [("this", ROOT), ("base", base)]
                for name, tree in order:
                    res = _point_in(tree, layout, num, rate)
                    wall[name].append(res["wall_s"])
                    cpu[name].append(res["cpu_s"])
                    engines[name] = res["engine"]
            b, t = statistics.median(wall["base"]), statistics.median(wall["this"])
            bc, tc = statistics.median(cpu["base"]), statistics.median(cpu["this"])
            rows.append({"layout": layout, "requests": num, "rate_rps": rate, "iterations": res["iterations"],
                         "engines": f"{engines['base']}/{engines['this']}",
                         f"{ref}_wall_s": b, "this_wall_s": t, f"{ref}_req_per_s": round(num / b),
                         "this_req_per_s": round(num / t), "speedup": round(b / t, 2),
                         f"{ref}_cpu_s": bc, "this_cpu_s": tc, "cpu_speedup": round(bc / tc, 2)})
            print(rows[-1], flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
    print(pd.DataFrame(rows).to_string(index=False))
    return rows


ENGINE_POINTS = (("PP=4", ("fastpp", "sglang", "vllm-v1")), ("TP=4", ("fastpp", "sglang", "vllm-v1", "vllm-v0")),
                 ("PP=4 prefix", ("fastpp", "sglang", "vllm-v1")))


def engines_table(num: int, rates: list[float], repeats: int, rounds: int = 1) -> None:
    """Each engine's wall time over FastPP's on the same point, measured `rounds` times in
    alternation (a busy spell slows every engine of a round alike); the table shows each
    engine's median wall time and the median and range of its per-round ratios."""
    import statistics

    import pandas as pd

    rows = []
    for rnd in range(rounds):
        for layout, engines in ENGINE_POINTS:
            for rate in rates:
                base = None
                for eng in engines:
                    res = bench(layout, num, rate, repeats if num <= 400 else 1, eng)
                    base = res["wall_s"] if eng == "fastpp" else base
                    res["vs_fastpp"] = round(res["wall_s"] / base, 2)
                    rows.append({**res, "round": rnd})
                    print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    keys = ["scheduler", "layout", "requests", "rate_rps"]
    out = df.groupby(keys, sort=False).agg(
        status=("status", lambda x: ",".join(sorted(set(x)))), wall_s=("wall_s", statistics.median),
        iterations=("iterations", "first"), vs_fastpp=("vs_fastpp", statistics.median),
        vs_min=("vs_fastpp", "min"), vs_max=("vs_fastpp", "max")).reset_index()
    out["requests_per_s"] = (out["requests"] / out["wall_s"]).round().astype(int)
    # the simulator's own speed: a point where an engine's server takes more (smaller) steps, e.g.
    # because prefix hits make its steps shorter, costs more wall time for the same requests
    out["us_per_iter"] = (1e6 * out["wall_s"] / out["iterations"]).round(1)
    base = out[out["scheduler"] == "fastpp"].set_index(["layout", "rate_rps"])["us_per_iter"]
    out["per_iter_vs_fastpp"] = [round(u / base[(lay, r)], 2)
                                 for u, lay, r in zip(out["us_per_iter"], out["layout"], out["rate_rps"])]
    print(f"median of {rounds} round(s); vs_fastpp = the engine's wall time over FastPP's in the same round")
    print(out[keys + ["status", "wall_s", "iterations", "requests_per_s", "vs_fastpp", "vs_min", "vs_max",
               "us_per_iter", "per_iter_vs_fastpp"]]
          .to_string(index=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the 400-request points")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per point (rounds with --baseline)")
    ap.add_argument("--baseline", metavar="REF", help="also time commit REF (git worktree) and print the ratio")
    ap.add_argument("--rate", type=float, action="append", help="arrival rates (default 4 and 8 req/s)")
    ap.add_argument("--layout", choices=list(LAYOUTS), action="append", help="layouts (default both)")
    ap.add_argument("--engines", action="store_true",
                    help="time the engines' schedulers side by side (ratio to fastpp)")
    ap.add_argument("--rounds", type=int, default=1, help="with --engines: rounds of every engine, in alternation")
    ap.add_argument("--policies", action="store_true",
                    help="time DCP_pred and DCP_pred+DS on an overloaded azure-conv server instead")
    args = ap.parse_args()
    sizes = [400] if args.quick else [400, 10_000]
    points = [(layout, num, rate) for layout in (args.layout or list(LAYOUTS)) for num in sizes
              for rate in (args.rate or [4.0, 8.0])]
    if args.policies:
        points = [(layout, 4_000, 10.0) for layout in POLICY_LAYOUTS]
    if args.baseline:
        compare(args.baseline, points, args.repeats)
        return
    sys.path.insert(0, str(ROOT))
    import pandas as pd

    if args.engines:
        engines_table(sizes[-1], args.rate or [4.0], args.repeats, args.rounds)
        return

    rows = []
    for layout, num, rate in points:
        rows.append(bench(layout, num, rate, args.repeats if num <= 400 else 1))
        print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
