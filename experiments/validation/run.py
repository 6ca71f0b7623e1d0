#!/usr/bin/env python3
"""PipeSim against public real-hardware measurements (issue 31's validation suite).

    python experiments/validation/run.py                 # every case + the full-load study -> report.md, report.csv
    python experiments/validation/run.py --only B7,B8    # some cases, written to runs/validation/
    python experiments/validation/run.py --quick         # smoke run: <= 200 requests a case, runs/validation-quick/
    python experiments/validation/run.py --extract B1=FILE.json   # re-derive data/B1.csv from the original result file
    python experiments/validation/run.py --check-data    # the data files against cases.toml (lengths, totals)
    python experiments/validation/run.py --profiles aic --no-toggles   # the H100 cases on AIConfigurator-built
                                                          # profiles (profiles/aic/), written to runs/validation-aic/

Each case of `cases.toml` (source, engine and version that ran, GPU, model, TP, flags, workload, rate
and the published numbers, verbatim) is simulated once on seed 1 with the PipeSim engine that case
names; every published metric is compared with the same statistic computed the way the benchmark
client computes it (`client_metrics`). Nothing is fitted to these cases: the profiles and engines
are used as shipped, and misses are reported as found. Each case's kernel data (Vidur's or AIConfigurator's,
and the dtypes) is chosen as a plan by GPU name chooses it, for the era of the release that ran
(`case_profile`); the report says which per case.

The full-load study (`TOGGLES`) re-runs every offline case (rate inf) with one cost at a time
switched: CUDA-graph padding, the memory outside the KV pool, the per-request and per-iteration
host costs, the ground truth's variance, SGLang's overlap scheduler, and reports each one's effect
on the simulated throughput next to the real one.

Only the full run without --only/--quick writes the committed report (experiments/validation/);
every other run writes to --out (default runs/validation[-quick]/). Runs are deterministic: the
same command gives the same report.csv, byte for byte, with any --jobs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CASES_FILE = HERE / "cases.toml"
DATA_DIR = HERE / "data"
SEED = 1
QUICK_REQUESTS = 200
COMMAND = "python experiments/validation/run.py"

# The columns of report.csv, in order.
COLUMNS = ("case", "gpu", "sim_gpu", "kernel_data", "model", "tp", "real_engine", "sim_engine", "rate", "metric", "unit",
           "real", "simulated", "error_pct", "scored", "what_differs", "ran_version")
# The issue-43 goal for current-engine cases: this share of compared numbers within WITHIN_PCT, none beyond BEYOND_PCT.
GOAL_SHARE, WITHIN_PCT, BEYOND_PCT = 0.85, 15.0, 50.0
SILICON_SAMPLE = "aiconfigurator_core/systems/silicon_sample.csv"  # AIConfigurator's end-to-end measurements
# A what-if, not a fit: the silicon cases whose client is not published (fixed lengths assumed: H) re-run with
# the lengths SGLang's own client draws by default (`python/sglang/bench_serving.py` `sample_random_requests`,
# --random-range-ratio 0.0: input uniform on [1, ISL], output on [0, OSL], 0 becoming 1), to show what an
# unknown client's lengths do to a closed loop (fixed lengths keep identical clients in lock-step). Shown next to
# the case's numbers, never scored: which client ran is not known.
DRIFT = "SGLang bench_serving's default lengths"
# The GPU of a profile folder (profiles/built/<gpu>/<model>/tp<T>), as the report names it.
PROFILE_GPUS = {"a100-sxm-80gb": "A100-80GB SXM", "a100-pcie-40gb": "A100-40GB PCIe", "h100-sxm-80gb": "H100-80GB SXM",
                "h200-sxm": "H200-141GB SXM", "b200-sxm": "B200-180GB SXM"}

# metric -> (unit, statistic). Workload totals (total_*) are shown next to the simulated sample's but
# not scored: they say how far the replayed lengths are from the run's own, not how fast PipeSim is.
METRICS = {
    "mean_ttft_ms": ("ms", "mean TTFT"), "median_ttft_ms": ("ms", "median TTFT"), "p99_ttft_ms": ("ms", "P99 TTFT"),
    "median_tpot_ms": ("ms", "median TPOT"), "mean_tpot_ms": ("ms", "mean TPOT"), "median_itl_ms": ("ms", "median ITL"),
    "mean_e2e_ms": ("ms", "mean E2E"), "median_e2e_ms": ("ms", "median E2E"),
    "p95_ttft_ms": ("ms", "P95 TTFT"), "p95_tpot_ms": ("ms", "P95 TPOT"), "p95_e2e_ms": ("ms", "P95 E2E"),
    "p99_e2e_ms": ("ms", "P99 E2E"),
    "request_throughput": ("req/s", "request throughput"), "output_throughput": ("tok/s", "output throughput"),
    "input_throughput": ("tok/s", "input throughput"),
    "decode_ms_per_token": ("ms", "decode time per token (real: median ITL / 10)"),
    "median_decode_step_s": ("s", "median decode step"),
    "total_input_tokens": ("tokens", "workload: input tokens"),
    "total_output_tokens": ("tokens", "workload: output tokens"),
}
UNSCORED = ("total_input_tokens", "total_output_tokens")

# The full-load study: name -> (what it switches, engines it applies to or None for all).
TOGGLES = {
    "cuda_graphs off": ("[scheduler] cuda_graphs = false: no padding of decode batches to captured sizes", None),
    "kv pool x0.5": (("[scheduler] kv_tokens = half the modelled pool: twice the memory outside it (activations, "
                      "graphs, fragmentation) taken from the KV cache"), None),
    "mem_fraction -0.05": ("[scheduler] mem_fraction 0.05 lower: 4 GB more memory outside the KV pool per GPU", None),
    # the host-cost toggles price every step with the profile's host cost ([server] host_time = "profile"),
    # in place of the engine version's model where it has one (vLLM V1, SGLang 0.5: sim/engine/hosttime.py)
    "cpu_per_request_us 0": (("[latency.overrides] cpu_per_request_us = 0 with [server] host_time = \"profile\": "
                              "the profile's host cost without its per-request part"), None),
    "cpu_per_request_us 50": (("[latency.overrides] cpu_per_request_us = 50 (the top of its documented range; "
                               "profiles ship 5) with [server] host_time = \"profile\""), None),
    "cpu_ms 1": (("[latency.overrides] cpu_ms = 1 (bottom of its range; built profiles ship 2.0, the A100 PCIe 1.17) "
                  "with [server] host_time = \"profile\""), None),
    "cpu_ms 3": ("[latency.overrides] cpu_ms = 3 (top of its range) with [server] host_time = \"profile\"", None),
    "variance off": ("[latency] variance = false: no jitter or slow iterations", None),
    "overlap on": ("[scheduler] overlap = true: SGLang's overlap scheduler (0.4+) hides the host cost", ("sglang",)),
}


# ------------------------------------------------------------------------------------------- cases


def load_cases(path: Path = CASES_FILE) -> list[dict]:
    """The cases of `path` and, for the suite's own table, of its companion files `cases_*.toml` after it."""
    cases = []
    for p in [path] + (sorted(HERE.glob("cases_*.toml")) if path == CASES_FILE else []):
        with open(p, "rb") as fh:
            cases += tomllib.load(fh)["case"]
    seen = set()
    for c in cases:
        if c["id"] in seen:
            raise SystemExit(f"{path}: duplicate case id {c['id']}")
        seen.add(c["id"])
        for key in c["real"]:
            if key not in METRICS:
                raise SystemExit(f"{path}: case {c['id']}: unknown metric {key!r}; allowed: {', '.join(METRICS)}")
    for c in cases:
        c["sim"] = dict(c["sim"], **case_profile(c))
    if os.environ.get(PROFILES_ENV) == "aic":
        cases = [c for c in cases if aic_profile(c) is not None]
        for c in cases:
            c["sim"] = dict(c["sim"], profile=aic_profile(c), data=data_label(aic_profile(c)),
                            data_why=f"--profiles aic: the BF16 AIConfigurator twin of {c['sim']['profile']}")
    return cases


def case_profile(case: dict) -> dict:
    """The profile a case runs on and the kernel data behind it: {profile, data, data_why}.

    The case's `profile` names its GPU, model, TP and dtypes (`profiles/built/<gpu>/<model>/tp<T>`: BF16;
    `profiles/aic/<gpu>/vllm/<model>-<w>-kv<kv>/tp<T>`); the source is chosen as a run or plan by GPU name
    chooses it (sim.profiling.library.choose_profile), for the era of the engine that ran: a case of a current
    release (`current_engine`) takes the default of its PipeSim engine (AIConfigurator's data for vllm-v1 and
    sglang where the AIC library has the shape, else Vidur's), a 2024 release Vidur's 2024 kernels (`kernel_data =
    "vidur"`), whatever PipeSim scheduler replays it, as its other flags follow that release; `[case.sim]
    kernel_data` overrides. Where Vidur's data is chosen the case's own built profile is kept."""
    from sim.core.errors import PipeSimError
    from sim.profiling.library import choose_profile, default_kernel_data

    sim, prof = case["sim"], case["sim"]["profile"]
    parts = Path(prof).parts
    if parts[:2] == ("profiles", "built"):
        gpu, model, tp, w, kv = parts[2], parts[3], parts[4], "bf16", "bf16"
    elif parts[:3] == ("profiles", "aic", parts[2]) and len(parts) == 6:
        gpu, tp = parts[2], parts[5]
        model, w, kv = parts[4].rsplit("-", 2)
        kv = kv.removeprefix("kv")
    elif parts[:2] == ("profiles", "moe"):  # the MoE library: one source per shape (profiles/moe/README.md)
        return {"profile": prof, "data": "MoE library (Vidur dense, measured experts) " + data_label(prof).split(" ", 1)[1],
                "data_why": "the MoE library's profile (its sources: profiles/moe/README.md)"}
    else:
        raise SystemExit(f"{CASES_FILE}: case {case['id']}: profile {prof!r} is not a library profile "
                         f"(profiles/built/..., profiles/aic/... or profiles/moe/...)")
    era = sim.get("kernel_data") or ("" if case.get("current_engine") else "vidur")
    where = f"{CASES_FILE.name} case {case['id']} kernel_data"
    kw = dict(engine=sim["engine"], weight_dtype=w, kv_dtype=kv, where=where)
    try:
        choice = choose_profile(model, gpu, int(tp[2:]), kernel_data=era, **kw)
        default = choose_profile(model, gpu, int(tp[2:]), **kw)
    except PipeSimError as exc:  # a bad kernel_data in cases.toml: one line, no traceback
        raise SystemExit(str(exc)) from None
    path = prof if choice.kernel_data == "vidur" else str(choice.path.relative_to(REPO))
    if sim.get("kernel_data"):
        why = "set in cases.toml"
    elif era:
        why = "the release that ran is of 2024 (Vidur's kernel era)"
    else:
        why = f"the default for {sim['engine']}" + (f" ({choice.note})" if choice.note else "")
        if choice.kernel_data == "vidur" and default_kernel_data(sim["engine"]) == "aic" and not choice.note:
            why += f" on a GPU the AIC library lacks ({gpu})"
    if default.kernel_data != choice.kernel_data:
        why += f"; PipeSim's {sim['engine']} would default to {default.kernel_data}"
    return {"profile": path, "data": data_label(path), "data_why": why}


def data_label(profile: str) -> str:
    """'Vidur BF16' or 'AIC FP8 (KV FP8)': the kernel data and dtypes of a profile (its meta.toml)."""
    meta = tomllib.loads((REPO / profile / "meta.toml").read_text())
    p = meta["profile"]
    w, kv = p.get("weight_dtype", "bf16").upper(), p.get("kv_dtype", "bf16").upper()
    src = "AIC" if p.get("kernel_data") == "aic" else "Vidur"
    return f"{src} {w}" + ("" if kv == w else f" (KV {kv})")


PROFILES_ENV = "PIPESIM_VALIDATION_PROFILES"   # "aic": the cases with an AIConfigurator-built twin, on it


def aic_profile(case: dict) -> str | None:
    """The AIConfigurator-built BF16 twin (profiles/aic/<gpu>/vllm/<model>-bf16-kvbf16/tp<T>) of a case's
    Vidur-built profile, or None where the AIC library has none (A100s)."""
    parts = Path(case["sim"]["profile"]).parts
    if parts[:2] != ("profiles", "built"):
        return None
    gpu, model, tp = parts[2], parts[3], parts[4]
    twin = Path("profiles", "aic", gpu, "vllm", f"{model}-bf16-kvbf16", tp)
    return str(twin) if (REPO / twin / "meta.toml").is_file() else None


def load_refused(path: Path = CASES_FILE) -> list[dict]:
    """The published current-engine measurements PipeSim cannot replay, each with its reason."""
    with open(path, "rb") as fh:
        refused = tomllib.load(fh).get("refused", [])
    for r in refused:
        missing = [k for k in ("id", "what", "rows", "reason") if k not in r]
        if missing:
            raise SystemExit(f"{path}: refused entry {r.get('id', '?')}: missing {', '.join(missing)}")
    return refused


def silicon_rows() -> dict[str, dict] | None:
    """AIConfigurator's silicon sample by row id (None where aiconfigurator-core is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]).parent / SILICON_SAMPLE
    if not path.is_file():
        return None
    with open(path, newline="") as fh:
        return {r["id"]: r for r in csv.DictReader(fh)}


def case_by_id(cases: list[dict]) -> dict[str, dict]:
    return {c["id"]: c for c in cases}


def is_offline(case: dict) -> bool:
    return case["workload"]["rate"] == "inf"


def in_full_load_study(case: dict) -> bool:
    """Offline (rate inf, no client loop) with a published throughput: the cases of the full-load study."""
    return (is_offline(case) and "concurrency" not in case["workload"]
            and any(k in case["real"] for k in ("request_throughput", "output_throughput")))


# ------------------------------------------------------------------------ data files (result logs)

# The scalar fields of a vLLM benchmark_serving result kept in a data file's header, verbatim.
LOG_FIELDS = ("date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "duration", "completed",
              "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput",
              "output_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
              "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms",
              "p99_itl_ms", "mean_latency_ms", "median_latency_ms", "std_latency_ms", "p99_latency_ms")
# where a case's metric is in a result file (decode_ms_per_token is derived: median ITL / 10)
LOG_METRIC_KEYS = {"request_throughput": "request_throughput", "output_throughput": "output_throughput",
                   "mean_ttft_ms": "mean_ttft_ms", "median_ttft_ms": "median_ttft_ms",
                   "median_tpot_ms": "median_tpot_ms", "median_e2e_ms": "median_latency_ms"}


def extract_log(record: dict, source: str) -> str:
    """The data file of a vLLM `benchmark_serving.py --save-result` JSON: a header naming the source
    and holding the run's scalar fields verbatim, then one `input_len,output_len` row per request in
    the file's order (the order the client sent them)."""
    ins, outs = record.get("input_lens"), record.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
        raise SystemExit("the result file has no per-request input_lens/output_lens of equal length")
    if (sum(ins) != record.get("total_input_tokens", sum(ins))
            or sum(outs) != record.get("total_output_tokens", sum(outs))):
        raise SystemExit("input_lens/output_lens do not add up to total_input_tokens/total_output_tokens")
    head = {k: record[k] for k in LOG_FIELDS if k in record}
    buf = io.StringIO()
    buf.write("# PipeSim validation data: the per-request lengths of a vLLM benchmark_serving result file\n")
    buf.write(f"# source: {source}\n")
    buf.write(f"# re-derive: {COMMAND} --extract ID=FILE (FILE: that JSON; the source line is kept)\n")
    buf.write(f"# output_len 0: no text came back (ttft 0.0 in the file; most likely an immediate EOS): "
              f"{sum(1 for o in outs if o == 0)} of {len(outs)}\n")
    buf.write("# aggregates: " + json.dumps(head) + "\n")
    buf.write("input_len,output_len\n")
    for a, b in zip(ins, outs):
        buf.write(f"{int(a)},{int(b)}\n")
    return buf.getvalue()


def read_log_data(path: Path) -> tuple[dict, list[int], list[int], str]:
    """(aggregates, input lengths, output lengths, source line) of a data file."""
    agg: dict = {}
    source = ""
    ins, outs = [], []
    with open(path) as fh:
        for line in fh:
            if line.startswith("# aggregates: "):
                agg = json.loads(line[len("# aggregates: "):])
            elif line.startswith("# source: "):
                source = line[len("# source: "):].strip()
            elif line.startswith(("#", "input_len")):
                continue
            elif line.strip():
                a, b = line.strip().split(",")
                ins.append(int(a))
                outs.append(int(b))
    return agg, ins, outs, source


def check_data(cases: list[dict]) -> list[str]:
    """Problems of the data files: totals against the header, header against cases.toml's numbers."""
    problems = []
    silicon = silicon_rows() if any("silicon_row" in c for c in cases) else None
    for c in cases:
        wl = c["workload"]
        if "silicon_row" in c and silicon is not None:
            row = silicon.get(c["silicon_row"])
            if row is None:
                problems.append(f"{c['id']}: silicon row {c['silicon_row']} not in {SILICON_SAMPLE}")
            else:
                want = {"mean_ttft_ms": float(row["silicon_ttft_ms"]), "mean_tpot_ms": float(row["silicon_tpot_ms"]),
                        "input": int(row["isl"]), "output": int(row["osl"]), "concurrency": int(row["batch_size"]),
                        "tp": int(row["tp_size"])}
                have = dict(c["real"], input=wl.get("input"), output=wl.get("output"),
                            concurrency=wl.get("concurrency"), tp=c["tp"])
                for key, val in want.items():
                    if have.get(key) != val:
                        problems.append(f"{c['id']}: {key} = {have.get(key)} in cases.toml, {val} in the silicon row")
        if wl["source"] != "log":
            continue
        path = HERE / wl["file"]
        if not path.is_file():
            problems.append(f"{c['id']}: {path} missing")
            continue
        agg, ins, outs, _ = read_log_data(path)
        if sum(ins) != agg.get("total_input_tokens") or sum(outs) != agg.get("total_output_tokens"):
            problems.append(f"{c['id']}: lengths do not add up to the header's totals")
        if len(ins) != agg.get("completed"):
            problems.append(f"{c['id']}: {len(ins)} rows, header says {agg.get('completed')} completed")
        for key, real in c["real"].items():
            src = LOG_METRIC_KEYS.get(key)
            if src is not None and agg.get(src) != real:
                problems.append(f"{c['id']}: {key} = {real} in cases.toml, {agg.get(src)} in {path.name}")
            if key == "decode_ms_per_token" and not math.isclose(agg.get("median_itl_ms", math.nan) / 10, real):
                problems.append(f"{c['id']}: decode_ms_per_token is not the header's median_itl_ms / 10")
    return problems


def cmd_extract(specs: list[str], cases: dict[str, dict]) -> int:
    for spec in specs:
        cid, sep, file = spec.partition("=")
        if not sep or cid not in cases or cases[cid]["workload"]["source"] != "log":
            raise SystemExit(f"--extract {spec!r}: expected ID=FILE with ID a case whose workload is a log "
                             f"({', '.join(k for k, c in cases.items() if c['workload']['source'] == 'log')})")
        with open(file) as fh:
            record = json.load(fh)
        out = HERE / cases[cid]["workload"]["file"]
        source = cases[cid]["source"]
        text = extract_log(record, source)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"{cid}: {out.relative_to(REPO)} ({len(record['input_lens'])} requests) from {file}")
    return 0


# --------------------------------------------------------------------------------- one simulation


def _lengths(case: dict, quick: bool) -> tuple[dict, list | None]:
    """The [workload] table of the case (with its client loop: `concurrency`, sim/workloads/client.py),
    and the log's output lengths (None: not a log)."""
    table, outs = _lengths_only(case, quick)
    if "concurrency" in case["workload"]:
        table["concurrency"] = int(case["workload"]["concurrency"])
    return table, outs


def _lengths_only(case: dict, quick: bool) -> tuple[dict, list | None]:
    wl = case["workload"]
    rate = math.inf if wl["rate"] == "inf" else float(wl["rate"])
    src = wl["source"]
    n = wl.get("num_requests")
    if quick and n is not None:
        n = min(n, QUICK_REQUESTS)
    if src == "sharegpt":
        return {"name": "sharegpt", "num_requests": n, "rate_rps": rate}, None
    if src == "uniform":
        return {"kind": "synthetic-uniform", "num_requests": n, "rate_rps": rate,
                "input_range": list(wl["input_range"]), "output_range": list(wl["output_range"])}, None
    if src == "fixed":
        return {"kind": "synthetic-uniform", "num_requests": n, "rate_rps": rate,
                "input_range": [wl["input"], wl["input"]], "output_range": [wl["output"], wl["output"]]}, None
    if src == "random":  # a benchmark client's random dataset (sim/workloads/bench.py), its range_ratio as it ran
        return {"kind": "bench", "dataset": "random", "num_requests": n, "rate_rps": rate, "input_len": wl["input"],
                "output_len": wl["output"], "range_ratio": float(wl["range_ratio"]),
                "range_ratio_definition": wl["range_ratio_definition"]}, None
    if src == "log":
        _, ins, outs, _ = read_log_data(HERE / wl["file"])
        if quick:
            ins, outs = ins[:QUICK_REQUESTS], outs[:QUICK_REQUESTS]
        # a request that produced no text still had its prompt prefilled and one (EOS) token sampled
        table = {"kind": "poisson", "num_requests": len(ins), "rate_rps": rate,
                 "lengths": {"source": "pairs", "prompt_tokens": ins, "output_tokens": [max(o, 1) for o in outs]}}
        return table, outs
    raise SystemExit(f"case {case['id']}: unknown workload source {src!r}")


def config_table(case: dict, quick: bool = False, toggle: str | None = None, kv_tokens: int | None = None) -> dict:
    sim = case["sim"]
    sched = dict(sim.get("scheduler", {}))
    sched["engine"] = sim["engine"]
    latency = {"profile": sim["profile"]}
    if toggle == "cuda_graphs off":
        sched["cuda_graphs"] = False
    elif toggle == "mem_fraction -0.05":
        sched["mem_fraction"] = round(sched.get("mem_fraction", 0.9) - 0.05, 4)
    elif toggle == "kv pool x0.5":
        sched["kv_tokens"] = kv_tokens // 2
    elif toggle == "overlap on":
        sched["overlap"] = True
    elif toggle == "variance off":
        latency["variance"] = False
    elif toggle == DRIFT:
        pass  # the client's lengths, below
    elif toggle is not None and toggle.startswith(("cpu_per_request_us ", "cpu_ms ")):
        key, val = toggle.split()
        latency["overrides"] = {key: float(val)}
    elif toggle is not None:
        raise SystemExit(f"unknown toggle {toggle!r}")
    workload, _ = _lengths(case, quick)
    if toggle == DRIFT:
        wl = case["workload"]
        workload = {"kind": "bench", "dataset": "random", "num_requests": wl["num_requests"], "rate_rps": math.inf,
                    "input_len": wl["input"], "output_len": wl["output"], "range_ratio": 0.0,
                    "range_ratio_definition": "sglang", "concurrency": int(wl["concurrency"])}
    # real servers retract or preempt when the KV cache runs out; none exits
    server = {"on_kv_exhausted": "retract"}
    if toggle is not None and toggle.startswith(("cpu_per_request_us ", "cpu_ms ")):
        server["host_time"] = "profile"  # (the engine's modelled host time would ignore the override)
    return {"seed": SEED, "parallel": {"tp": int(case["tp"])}, "scheduler": sched, "latency": latency,
            "server": server, "workload": workload}


def modelled_kv_tokens(cfg) -> int:
    """The KV pool the engine sizes for this config (sim.engine.run.pool_sizes, as `run` does)."""
    from sim.engine.run import build_latency, hardware, pool_sizes
    from sim.engine.schedulers import engine as engine_for

    latency = build_latency(cfg)
    hw = hardware(cfg, latency)
    eng = engine_for(cfg.scheduler.engine)
    settings = eng.settings(cfg.scheduler, hw)
    return pool_sizes(cfg, latency, eng, settings, hw)[0]


def client_metrics(result, log_outputs: list | None) -> dict:
    """The benchmark client's statistics of a simulated run (vLLM benchmark_serving / SGLang
    bench_serving `calculate_metrics`): TTFT and E2E per request, TPOT = (E2E - TTFT) / (output - 1)
    over outputs > 1 token, ITL pooled per token, throughputs over first send to last completion.
    A log's 0-token outputs (simulated as 1 token) are measured as the client saw them: TTFT 0 (no
    text came), no TPOT, 0 output tokens; their E2E is the simulated one."""
    import numpy as np

    from sim.outputs.metrics import FINISHED, request_columns

    c = request_columns(result)
    fin = c["status"] == FINISHED
    idx = np.flatnonzero(fin)
    ttft = c["ttft_ms"].astype(float).copy()
    tpot = c["tpot_ms"].astype(float).copy()
    gen = c["generated_tokens"].astype(float).copy()
    if log_outputs is not None:
        empty = np.zeros(len(ttft), dtype=bool)
        # requests are built in the log's order (all arrive at t = 0; make_requests keeps ties in order)
        empty[: len(log_outputs)] = np.asarray(log_outputs) == 0
        ttft[empty] = 0.0
        tpot[empty] = np.nan
        gen[empty] = 0.0
    e2e = c["e2e_ms"].astype(float)
    t0 = float(c["arrival_s"].min())
    duration = float(c["finish_s"][fin].max()) - t0 if fin.any() else math.nan
    out = {"completed": int(fin.sum()), "num_requests": len(fin), "duration_s": duration}

    def f(v):  # the finished requests' values, NaN (no TPOT) left out
        return v[idx][~np.isnan(v[idx])]

    out["mean_ttft_ms"] = float(f(ttft).mean())
    out["median_ttft_ms"] = float(np.median(f(ttft)))
    out["p99_ttft_ms"] = float(np.percentile(f(ttft), 99))
    out["median_tpot_ms"] = float(np.median(f(tpot))) if len(f(tpot)) else math.nan
    out["mean_tpot_ms"] = float(f(tpot).mean()) if len(f(tpot)) else math.nan
    # numpy's linear percentiles (vLLM's and SGLang's clients, and the G cases' own `pct`, interpolate so)
    out["p95_ttft_ms"] = float(np.percentile(f(ttft), 95))
    out["p95_tpot_ms"] = float(np.percentile(f(tpot), 95)) if len(f(tpot)) else math.nan
    out["p95_e2e_ms"] = float(np.percentile(f(e2e), 95))
    out["p99_e2e_ms"] = float(np.percentile(f(e2e), 99))
    out["mean_e2e_ms"] = float(f(e2e).mean())
    out["median_e2e_ms"] = float(np.median(f(e2e)))
    out["request_throughput"] = out["completed"] / duration
    out["output_throughput"] = float(gen[idx].sum()) / duration
    out["input_throughput"] = float(c["prompt_tokens"][idx].sum()) / duration
    itls = result.requests.itls.pooled_ms(idx)
    med_itl = float(itls.percentile(50)) if hasattr(itls, "percentile") else float(np.median(itls))
    out["median_itl_ms"] = med_itl
    out["decode_ms_per_token"] = med_itl
    out["median_decode_step_s"] = med_itl / 1e3
    out["total_input_tokens"] = int(c["prompt_tokens"].sum())
    out["total_output_tokens"] = int(gen.sum())
    out["kv_capacity_tokens"] = int(result.kv_capacity_tokens)
    out["kv_peak_tokens"] = int(result.kv_peak_tokens)
    out["max_running_requests"] = int(result.max_running_requests)
    out["num_retractions"] = int(c["num_retractions"].sum())
    out["status"] = result.status
    return out


def simulate(job: tuple[str, str | None, bool]) -> tuple[str, str | None, dict]:
    """One run: (case id, toggle or None, quick) -> (case id, toggle, client metrics)."""
    case_id, toggle, quick = job
    from sim.core.config import config_from_table
    from sim.engine.run import run

    case = case_by_id(load_cases())[case_id]
    table = config_table(case, quick)
    kv = None
    if toggle == "kv pool x0.5":
        kv = modelled_kv_tokens(config_from_table(table, f"case {case_id}"))
    if toggle is not None:
        table = config_table(case, quick, toggle, kv)
    cfg = config_from_table(table, f"case {case_id}")
    _, log_outputs = _lengths(case, quick)
    t = time.perf_counter()
    result = run(cfg, keep_iterations=False)
    metrics = client_metrics(result, log_outputs)
    metrics["wall_s"] = time.perf_counter() - t
    if result.status != "ok":
        metrics["reason"] = result.reason
    return case_id, toggle, metrics


def toggles_for(case: dict) -> list[str]:
    return [name for name, (_, engines) in TOGGLES.items() if engines is None or case["sim"]["engine"] in engines]


# -------------------------------------------------------------------------------------- reporting


def fmt(v: float) -> str:
    """A value as the report writes it (6 significant digits: the same text from any run)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1e4:
        return str(int(v))
    return f"{v:.6g}"


def error_pct(real: float, sim: float) -> float:
    return (sim - real) / real * 100 if real and not math.isnan(sim) else math.nan


def report_rows(cases: list[dict], sims: dict) -> list[dict]:
    rows = []
    for c in cases:
        if c["id"] not in sims:
            continue
        m = sims[c["id"]]
        rate = c["workload"]["rate"]
        if "concurrency" in c["workload"]:  # a closed loop: its clients, not a rate
            n = c["workload"]["concurrency"]
            rate = f"{n} client{'s' if n != 1 else ''}"
        for key, real in c["real"].items():
            sim = m.get(key, math.nan)
            err = error_pct(real, sim)
            rows.append({
                "case": c["id"], "gpu": c["gpu"].split(" (")[0], "sim_gpu": sim_gpu(c), "kernel_data": c["sim"]["data"],
                "model": c["model"].split(" (")[0], "tp": c["tp"],
                "real_engine": c["real_engine"].split(",")[0], "sim_engine": c["sim"]["engine"],
                "rate": rate if rate == "inf" or str(rate).endswith(("client", "clients")) else fmt(float(rate)),
                "metric": key, "unit": METRICS[key][0],
                "real": fmt(real), "simulated": fmt(sim), "error_pct": "" if math.isnan(err) else f"{err:+.1f}",
                "scored": "no" if key in UNSCORED else "yes", "what_differs": "; ".join(c.get("differs", [])),
                "ran_version": c.get("ran_version", "") if c.get("current_engine") else "",
            })
        if "silicon_row" in c:
            rows.append(dict(rows[-1], **implied_e2e_row(c, m)))
    return rows


def mean_output_tokens(wl: dict) -> float:
    """The mean output length the case's client asks for: OSL, or with a random dataset's range_ratio r
    the mean of its uniform draw on the integers [int(OSL r), OSL] (both definitions, sim/workloads/bench.py,
    agree at r = 0.8)."""
    osl = int(wl["output"])
    if wl["source"] != "random":
        return float(osl)
    r = float(wl["range_ratio"])
    lo = max(int(osl * r), 1) if wl["range_ratio_definition"] == "sglang" else max(math.floor(osl * (1 - r)), 1)
    hi = osl if wl["range_ratio_definition"] == "sglang" else math.ceil(osl * (1 + r))
    return (lo + hi) / 2


def implied_e2e_row(case: dict, m: dict) -> dict:
    """The mean E2E a silicon row implies: with fixed lengths every request has OSL output tokens, so with TPOT
    the mean of (E2E - TTFT) / (OSL - 1), mean E2E = mean TTFT + (OSL - 1) x mean TPOT (and a closed loop's
    throughput is concurrency x OSL / mean E2E); with a random dataset's range_ratio, the client's mean output
    length stands for OSL (exact only if TPOT does not vary with the length). Derived from the published
    numbers, not published: shown, not scored."""
    osl = mean_output_tokens(case["workload"])
    real = case["real"]["mean_ttft_ms"] + (osl - 1) * case["real"]["mean_tpot_ms"]
    sim = m.get("mean_e2e_ms", math.nan)
    err = error_pct(real, sim)
    return {"metric": "mean_e2e_ms", "unit": "ms", "real": fmt(real), "simulated": fmt(sim),
            "error_pct": "" if math.isnan(err) else f"{err:+.1f}", "scored": "derived"}


def write_csv(rows: list[dict], path: Path) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())


def _median(vals: list[float]) -> float:
    vals = sorted(vals)
    n = len(vals)
    return math.nan if not n else (vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2)


def _group_stats(rows: list[dict], key) -> list[tuple[str, int, float, float, float]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["scored"] != "yes" or not r["error_pct"]:
            continue
        groups.setdefault(key(r), []).append(float(r["error_pct"]))
    out = []
    for name, errs in sorted(groups.items()):
        out.append((name, len(errs), _median([abs(e) for e in errs]), _median(errs),
                    sum(1 for e in errs if abs(e) <= 20) / len(errs) * 100))
    return out


def sim_gpu(case: dict) -> str:
    parts = Path(case["sim"]["profile"]).parts
    name = parts[2] if parts[:2] in (("profiles", "aic"), ("profiles", "moe")) else parts[-3]
    return PROFILE_GPUS.get(name, name)


def engine_family(case: dict) -> str:
    """SGLang or vLLM: the engine that ran."""
    return case["real_engine"].replace(",", " ").split()[0]


def throughput_key(case: dict) -> str:
    return "request_throughput" if "request_throughput" in case["real"] else "output_throughput"


def metric_class(key: str) -> str:
    if key.endswith("throughput"):
        return "throughput"
    if "ttft" in key:
        return "TTFT"
    if "tpot" in key or "itl" in key or "decode" in key:
        return "TPOT / ITL / decode step"
    return "E2E"


def goal_stats(errs: list[float]) -> tuple[int, float, int, float]:
    """(numbers, share within WITHIN_PCT, count beyond BEYOND_PCT, median |error|) of a list of errors in %."""
    n = len(errs)
    within = sum(1 for e in errs if abs(e) <= WITHIN_PCT) / n if n else math.nan
    return n, within, sum(1 for e in errs if abs(e) > BEYOND_PCT), _median([abs(e) for e in errs])


def current_engine_section(cases: list[dict], rows: list[dict], refused: list[dict], sims: dict | None = None,
                           toggles: dict | None = None) -> list[str]:
    """Issue 43's table: the current-engine cases' errors per engine version and metric, against the goal
    (GOAL_SHARE of the numbers within WITHIN_PCT, none beyond BEYOND_PCT), the misses, and what was refused."""
    by_id = case_by_id(cases)
    cur = [r for r in rows if r["ran_version"] and r["scored"] == "yes" and r["error_pct"]]
    L = ["", "## Current engines (vLLM >= 0.10, SGLang >= 0.4.6; measured 2025-2026)", ""]
    if not cur:
        return L + ["No current-engine case in this run.", ""]
    errs = [float(r["error_pct"]) for r in cur]
    n, within, beyond, mabs = goal_stats(errs)
    ncases = len({r["case"] for r in cur})
    met = within >= GOAL_SHARE and beyond == 0
    L.append(f"{ncases} cases, {n} compared numbers: {within * 100:.0f}% within {WITHIN_PCT:.0f}% (goal "
             f"{GOAL_SHARE * 100:.0f}%), {beyond} beyond {BEYOND_PCT:.0f}% (goal none), median |error| {mabs:.1f}%: "
             f"the goal is {'met' if met else 'not met'}. Per engine version (as it ran) and metric:")
    L.append("")
    L.append(f"| engine version (ran) | PipeSim engine | cases | GPUs | metric | numbers | median error | median "
             f"\\|error\\| | within {WITHIN_PCT:.0f}% | beyond {BEYOND_PCT:.0f}% |")
    L.append("|---|---|---:|---|---|---:|---:|---:|---:|---:|")
    versions: dict[str, list[dict]] = {}
    for r in cur:
        versions.setdefault(r["ran_version"], []).append(r)
    for ver in sorted(versions):
        vrows = versions[ver]
        ids = sorted({r["case"] for r in vrows}, key=lambda k: (k[0], int(k[1:]) if k[1:].isdigit() else 0))
        sim_eng = sorted({f"{by_id[k]['sim']['engine']} {by_id[k]['sim'].get('scheduler', {}).get('engine_version', '')}"
                          .strip() for k in ids})
        gpus = sorted({r["sim_gpu"] for r in vrows})
        groups = {"all": vrows}
        for r in vrows:
            groups.setdefault(METRICS[r["metric"]][1], []).append(r)
        first = True
        for name, grows in groups.items():
            e = [float(r["error_pct"]) for r in grows]
            k, w, b, m = goal_stats(e)
            head = (f"| {ver} | {', '.join(sim_eng)} | {len(ids)} ({ids[0]}-{ids[-1]}) | {', '.join(gpus)} |"
                    if first else "| | | | |")
            first = False
            L.append(f"{head} {name} | {k} | {_median(e):+.1f}% | {m:.1f}% | {w * 100:.0f}% | {b} |")
    L.append("")
    L.append("Per metric over all current-engine cases:")
    L.append("")
    L.append(f"| metric | numbers | median error | median \\|error\\| | within {WITHIN_PCT:.0f}% | beyond "
             f"{BEYOND_PCT:.0f}% |")
    L.append("|---|---:|---:|---:|---:|---:|")
    per_metric: dict[str, list[float]] = {}
    for r in cur:
        per_metric.setdefault(METRICS[r["metric"]][1], []).append(float(r["error_pct"]))
    for name, e in per_metric.items():
        k, w, b, m = goal_stats(e)
        L.append(f"| {name} | {k} | {_median(e):+.1f}% | {m:.1f}% | {w * 100:.0f}% | {b} |")
    derived = [float(r["error_pct"]) for r in rows if r["ran_version"] and r["scored"] == "derived" and r["error_pct"]]
    if derived:
        k, w, b, m = goal_stats(derived)
        L.append(f"| mean E2E implied by a silicon row (TTFT + (OSL - 1) x TPOT; derived, not in the counts above) | "
                 f"{k} | {_median(derived):+.1f}% | {m:.1f}% | {w * 100:.0f}% | {b} |")
    drift = [(c, toggles[c["id"]][DRIFT]) for c in cases if toggles and DRIFT in toggles.get(c["id"], {})]
    if drift and sims:
        L.append("")
        L.append("What-if (not scored, not a fit): the silicon cases whose client is not published run with fixed "
                 "lengths; their simulated clients start together and, with identical lengths, stay in lock-step, so "
                 "every round's prompts queue behind each other (TTFT high) and then decode undisturbed (TPOT low). "
                 "Re-run with the lengths SGLang's own client draws by default (bench_serving.py "
                 "sample_random_requests, --random-range-ratio 0.0: input on [1, ISL], output on [1, OSL]); which "
                 "client ran is not known:")
        L.append("")
        L.append("| case | concurrency | ISL/OSL | real TTFT | PipeSim TTFT | bench_serving lengths | real TPOT | "
                 "PipeSim TPOT | bench_serving lengths |")
        L.append("|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for c, m in drift:
            base, real, wl = sims[c["id"]], c["real"], c["workload"]
            L.append(f"| {c['id']} | {wl['concurrency']} | {wl['input']}/{wl['output']} | {fmt(real['mean_ttft_ms'])} | "
                     f"{fmt(base['mean_ttft_ms'])} ({error_pct(real['mean_ttft_ms'], base['mean_ttft_ms']):+.0f}%) | "
                     f"{fmt(m['mean_ttft_ms'])} ({error_pct(real['mean_ttft_ms'], m['mean_ttft_ms']):+.0f}%) | "
                     f"{fmt(real['mean_tpot_ms'])} | {fmt(base['mean_tpot_ms'])} "
                     f"({error_pct(real['mean_tpot_ms'], base['mean_tpot_ms']):+.0f}%) | {fmt(m['mean_tpot_ms'])} "
                     f"({error_pct(real['mean_tpot_ms'], m['mean_tpot_ms']):+.0f}%) |")
    misses = [r for r in cur if abs(float(r["error_pct"])) > BEYOND_PCT]
    L.append("")
    if misses:
        L.append(f"Beyond {BEYOND_PCT:.0f}% ({len(misses)}; why: the case notes' 'what differs' and the README): "
                 + "; ".join(f"{r['case']} {METRICS[r['metric']][1]} {r['error_pct']}%" for r in misses) + ".")
    else:
        L.append(f"No compared number is beyond {BEYOND_PCT:.0f}%.")
    if refused:
        L.append("")
        n_ref = sum(int(r["rows"]) for r in refused if not r.get("not_selected"))
        n_sel = sum(int(r["rows"]) for r in refused if r.get("not_selected"))
        L.append(f"Refused: {n_ref} published rows PipeSim cannot replay (not forced); not selected: {n_sel} "
                 f"replayable rows left out for run time:")
        L.append("")
        L.append("| id | what | rows | why |")
        L.append("|---|---|---:|---|")
        for r in refused:
            L.append(f"| {r['id']} | {r['what']} | {r['rows']} | {r['reason']} |")
    return L


def write_report(cases: list[dict], sims: dict, toggles: dict, rows: list[dict], path: Path, quick: bool,
                 only: bool) -> None:
    by_id = case_by_id(cases)
    ran = [c for c in cases if c["id"] in sims]
    L = []
    L.append("# PipeSim against public real-hardware measurements (validation suite, issue 31)")
    L.append("")
    L.append(f"Generated by `{COMMAND}{' --quick' if quick else ''}` from `cases.toml` (sources, flags, published "
             "numbers verbatim) and `data/` (per-request lengths of the result files). Do not edit; rerun. "
             "Nothing was fitted to these cases: profiles and engines as shipped, seed 1, misses as found.")
    if quick:
        L.append("")
        L.append(f"**Quick mode: at most {QUICK_REQUESTS} requests a case. Not comparable with the published "
                 "numbers.**")
    gpus = sorted({sim_gpu(c) for c in ran})
    engines = sorted({engine_family(c) for c in ran})
    L.append("")
    L.append(f"{len(ran)} cases, {len(rows)} compared numbers ({sum(r['scored'] == 'yes' for r in rows)} scored); "
             f"GPU types (profiles): {', '.join(gpus)}; engines that ran: {', '.join(engines)} (versions per case).")
    L.append("")
    L.append("Error = (simulated - real) / real. `report.csv` has every row with what differs between the run "
             "and its replay; the case notes below say it per case.")
    L.append("")
    L.append("Kernel data (`kernel data`, report.csv `kernel_data`): the source and dtypes of each case's profile, "
             "chosen as a run or plan by GPU name chooses them (`sim.profiling.library.choose_profile`) for the era "
             "of the engine that ran: a current release takes its PipeSim engine's default (AIConfigurator's tables "
             "for vllm-v1 and sglang where the AIC library has the GPU, model, TP and dtypes; Vidur's elsewhere), a "
             "2024 release Vidur's 2024 kernels whatever scheduler replays it. The case notes say why per case.")
    # ---- summary table
    L.append("")
    L.append("## Every compared number")
    L.append("")
    L.append("| case | GPU (profile) | kernel data | model | engine (real -> PipeSim) | rate | metric | real | simulated "
             "| error | what differs |")
    L.append("|---|---|---|---|---|---|---|---:|---:|---:|---|")
    shown = set()
    for r in rows:
        c = by_id[r["case"]]
        eng = f"{c['real_engine'].split(',')[0].split(' (')[0]} -> {c['sim']['engine']}"
        err = f"{r['error_pct']}%" if r["error_pct"] else ""
        if r["scored"] == "no":
            err = f"({err} workload)" if err else "(workload)"
        elif r["scored"] == "derived":
            err = f"({err} derived)"
        first = r["case"] not in shown
        shown.add(r["case"])
        head = (f"| {r['case']} | {r['sim_gpu']}{' (inferred)' if c.get('gpu_inferred') else ''} | "
                f"{r['kernel_data']} | {r['model']} x{r['tp']} | {eng} | {r['rate']} |") if first else "| | | | | | |"
        what = METRICS[r["metric"]][1] + (" (implied: TTFT + (OSL - 1) x TPOT)" if r["scored"] == "derived" else "")
        L.append(f"{head} {what} ({r['unit']}) | {r['real']} | {r['simulated']} | {err} | "
                 f"{c.get('differs_short', '') if first else ''} |")
    # ---- aggregates
    L.append("")
    L.append("## Errors by group (scored numbers)")
    L.append("")
    L.append("| group | numbers | median \\|error\\| | median error | within 20% |")
    L.append("|---|---:|---:|---:|---:|")
    # (PipeSim's engine follows the one that ran: SGLang -> sglang, vLLM -> vllm-v0)
    for title, key in (("engine that ran", lambda r: engine_family(by_id[r["case"]])),
                       ("load", lambda r: "offline (rate inf)" if r["rate"] == "inf" else
                        "closed loop (concurrency)" if r["rate"].endswith(("client", "clients")) else
                        "Poisson arrivals"),
                       ("metric", lambda r: metric_class(r["metric"])),
                       ("GPU", lambda r: r["sim_gpu"]),
                       ("kernel data", lambda r: r["kernel_data"])):
        for name, n, mabs, med, within in _group_stats(rows, key):
            L.append(f"| {title}: {name} | {n} | {mabs:.1f}% | {med:+.1f}% | {within:.0f}% |")
    L += current_engine_section(cases, rows, load_refused(), sims, toggles)
    # ---- full-load study (the length what-if runs are in the current-engine section)
    toggles = {cid: t for cid, t in toggles.items() if in_full_load_study(by_id[cid])}
    if toggles:
        L.append("")
        L.append("## Full load: offline throughput and the costs that grow with it")
        L.append("")
        L.append("Each offline case (rate inf) re-run with one cost switched (the rest as in the case). Columns: "
                 "the real throughput, PipeSim's as the case runs (error), then each toggle's change of the "
                 "simulated throughput in % of the case's own run. Toggles:")
        L.append("")
        for name, (what, engines) in TOGGLES.items():
            L.append(f"- **{name}**: {what}{' (' + ', '.join(engines) + ' only)' if engines else ''}.")
        L.append("")
        names = list(TOGGLES)
        L.append("| case | engine | metric | real | PipeSim | error | " + " | ".join(names) + " |")
        L.append("|---|---|---|---:|---:|---:|" + "---:|" * len(names))
        for c in ran:
            if c["id"] not in toggles:
                continue
            key = throughput_key(c)
            base = sims[c["id"]][key]
            real = c["real"][key]
            cells = []
            for n in names:
                m = toggles[c["id"]].get(n)
                cells.append("" if m is None else f"{(m[key] - base) / base * 100:+.1f}%")
            L.append(f"| {c['id']} | {c['sim']['engine']} | {key.replace('_throughput', '')} ({METRICS[key][0]}) | "
                     f"{fmt(real)} | {fmt(base)} | {error_pct(real, base):+.1f}% | " + " | ".join(cells) + " |")
        L.append("")
        errs = {c["id"]: error_pct(c["real"][throughput_key(c)], sims[c["id"]][throughput_key(c)])
                for c in ran if c["id"] in toggles}
        L.append(f"Offline throughput error over these {len(errs)} cases: median {_median(list(errs.values())):+.1f}%, "
                 f"median |error| {_median([abs(e) for e in errs.values()]):.1f}%; above +10% (optimistic): "
                 + (", ".join(f"{k} ({v:+.1f}%)" for k, v in errs.items() if v > 10) or "none")
                 + "; below -10% (pessimistic): "
                 + (", ".join(f"{k} ({v:+.1f}%)" for k, v in errs.items() if v < -10) or "none") + ".")
        L.append("")
        L.append("Median effect of each toggle over these cases (and its range): "
                 + "; ".join(f"{n} {_median(eff):+.1f}% ({min(eff):+.1f} to {max(eff):+.1f})"
                             for n in names for eff in [[(toggles[cid][n][throughput_key(by_id[cid])]
                                                          - sims[cid][throughput_key(by_id[cid])])
                                                         / sims[cid][throughput_key(by_id[cid])] * 100
                                                         for cid in toggles if n in toggles[cid]]] if eff) + ".")
        L.append("")
        L.append("KV pool and batch of the offline runs (as each case runs):")
        L.append("")
        L.append("| case | KV pool (tokens) | KV peak | max running | retractions / preemptions | simulated requests | "
                 "simulated in / out tokens |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for c in ran:
            if c["id"] not in toggles:
                continue
            m = sims[c["id"]]
            L.append(f"| {c['id']} | {m['kv_capacity_tokens']} | {m['kv_peak_tokens']} | {m['max_running_requests']} "
                     f"| {m['num_retractions']} | {m['num_requests']} | {m['total_input_tokens']} / "
                     f"{m['total_output_tokens']} |")
    # ---- per-case notes
    L.append("")
    L.append("## Cases")
    for c in ran:
        m = sims[c["id"]]
        L.append("")
        L.append(f"### {c['id']}: {c['title']}")
        L.append("")
        L.append(f"- source: {c['source']}")
        L.append(f"- ran: {c['real_engine']}; GPU {c['gpu']}; model {c['model']}, TP{c['tp']}")
        L.append(f"- server: `{c['server']}`")
        L.append(f"- client: `{c['client']}`")
        sched = ", ".join(f"{k} = {json.dumps(v)}" for k, v in c["sim"].get("scheduler", {}).items())
        L.append(f"- PipeSim: engine `{c['sim']['engine']}` ({c['sim']['engine_note']}); `{c['sim']['profile']}` "
                 f"({c['sim']['data']}: {c['sim']['data_why']}); {sched}")
        wl = c["workload"]
        desc = {"sharegpt": "PipeSim's ShareGPT length model", "log": f"the log's own lengths ({wl.get('file')})",
                "uniform": f"input U{wl.get('input_range')}, output U{wl.get('output_range')}",
                "fixed": f"fixed {wl.get('input')} in / {wl.get('output')} out",
                "random": f"random dataset, {wl.get('input')} in / {wl.get('output')} out with range_ratio "
                          f"{wl.get('range_ratio')} ({wl.get('range_ratio_definition')}'s definition, "
                          f"sim/workloads/bench.py)"}[wl["source"]]
        rate = "all at t = 0" if wl["rate"] == "inf" else f"Poisson {wl['rate']} req/s"
        if "concurrency" in wl:
            n = wl["concurrency"]
            rate = (f"a closed loop of {n} client{'s' if n != 1 else ''} (each sends its next request when "
                    f"one finishes)")
        plural = "s" if m["num_requests"] != 1 else ""
        L.append(f"- workload: {desc}, {m['num_requests']} request{plural}, {rate}; simulated totals "
                 f"{m['total_input_tokens']} in / {m['total_output_tokens']} out; "
                 f"KV pool {m['kv_capacity_tokens']} tokens "
                 f"(peak {m['kv_peak_tokens']}), {m['num_retractions']} retractions/preemptions, status {m['status']}")
        L.append("- what differs: " + "; ".join(c.get("differs", [])))
    if only:
        L.append("")
        L.append("(a partial run: `--only`)")
    path.write_text("\n".join(L) + "\n")


# ------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help=f"at most {QUICK_REQUESTS} requests a case; no toggles")
    ap.add_argument("--only", default=None, help="comma-separated case ids (e.g. B7,B8)")
    ap.add_argument("--out", default=None, help="output folder (default: experiments/validation/ for the full run, "
                                                "runs/validation[-quick]/ otherwise)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--no-toggles", action="store_true", help="skip the full-load study")
    ap.add_argument("--extract", action="append", default=[], metavar="ID=FILE",
                    help="re-derive data/<ID>.csv from the original vLLM result JSON")
    ap.add_argument("--check-data", action="store_true", help="check the data files against cases.toml and exit")
    ap.add_argument("--profiles", choices=("vidur", "aic"), default="vidur", help="aic: only the cases whose "
                    "profile has an AIConfigurator-built twin, run on it (default output runs/validation-aic/)")
    args = ap.parse_args(argv)
    if args.profiles == "aic":
        os.environ[PROFILES_ENV] = "aic"

    cases = load_cases()
    by_id = case_by_id(cases)
    if args.extract:
        return cmd_extract(args.extract, by_id)
    problems = check_data(cases)
    if args.check_data:
        print("\n".join(problems) if problems else f"data files agree with {CASES_FILE.name}")
        return 1 if problems else 0
    if problems:
        raise SystemExit("data files disagree with cases.toml:\n" + "\n".join(problems))
    if args.only:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [w for w in wanted if w not in by_id]
        if unknown:
            raise SystemExit(f"--only: unknown case(s) {', '.join(unknown)}; known: {', '.join(by_id)}")
        cases = [c for c in cases if c["id"] in wanted]
    partial = bool(args.only) or args.quick or args.profiles == "aic"
    if args.out:
        out = Path(args.out)
    elif args.profiles == "aic":
        out = REPO / "runs" / "validation-aic"
    elif partial:
        out = REPO / "runs" / ("validation-quick" if args.quick else "validation")
    else:
        out = HERE
    out.mkdir(parents=True, exist_ok=True)

    jobs: list[tuple[str, str | None, bool]] = [(c["id"], None, args.quick) for c in cases]
    if not args.quick and not args.no_toggles:
        jobs += [(c["id"], t, False) for c in cases if in_full_load_study(c) for t in toggles_for(c)]
        jobs += [(c["id"], DRIFT, False) for c in cases if "silicon_row" in c and c["workload"]["source"] == "fixed"]
    # the longest runs first, so two workers finish together
    weight = {c["id"]: (c["workload"].get("num_requests") or 320) * (10 if c["tp"] > 1 else 1) for c in cases}
    order = sorted(range(len(jobs)), key=lambda i: -weight[jobs[i][0]])
    t0 = time.perf_counter()
    n = max(1, min(args.jobs, os.cpu_count() or 1))
    results: dict[int, tuple] = {}
    if n == 1:
        for i in order:
            results[i] = simulate(jobs[i])
    else:
        with ProcessPoolExecutor(max_workers=n) as ex:
            futs = {i: ex.submit(simulate, jobs[i]) for i in order}
            for i, fut in futs.items():
                results[i] = fut.result()
    wall = time.perf_counter() - t0
    sims: dict[str, dict] = {}
    toggles: dict[str, dict] = {}
    for i in range(len(jobs)):
        cid, toggle, metrics = results[i]
        if toggle is None:
            sims[cid] = metrics
        else:
            toggles.setdefault(cid, {})[toggle] = metrics
    rows = report_rows(cases, sims)
    write_csv(rows, out / "report.csv")
    write_report(cases, sims, toggles, rows, out / "report.md", args.quick, bool(args.only))
    failed = [f"{cid}: {m.get('reason', m['status'])}" for cid, m in sims.items() if m["status"] != "ok"]
    for line in failed:
        print(f"warning: run not ok: {line}", file=sys.stderr)
    print(f"{len(cases)} cases, {len(jobs)} runs in {wall:.1f} s on {n} worker(s); wrote {out / 'report.md'} "
          f"and {out / 'report.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
