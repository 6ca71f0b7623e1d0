"""What a sweep point depends on beyond its config table, and how fast its load could go.

- `input_digest(table)`: a hash of the contents of every file the point reads: the latency
  profile's tables and metadata (a disaggregated point's pool profiles too), the named workload's
  TOML, its trace file, the source of every plug-in it loads, and a `[cluster]`'s network file (and
  its named interconnect and GPU specs). A point's cache identity (sim/studies/sweep.py) includes it, so an
  input edited in place at the same path is simulated again instead of served stale. It does
  not cover PipeSim's own code: after changing the simulator, start a new cache.
- `ceiling_rps(table)`: a rate no deployment can sustain: the one whose tokens alone (prompt
  and output, at the workload's mean lengths) need the deployment's whole dense BF16 peak
  (every GPU's `bf16_tflops`, 2 FLOPs per parameter per token; attention, memory traffic and
  every overhead not even counted). A goodput search extends upward until a rate fails; it stops at this ceiling.

Both read files, so they are memoised per (path, size, mtime).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from sim.core.errors import PipeSimError

PROFILE_FILES = ("meta.toml", "layer_nonattn.csv", "attention.csv", "comm.csv")


@lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes ("missing" when there is none)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError:
        return "missing"
    return _file_digest(str(p.resolve()), st.st_size, st.st_mtime_ns)


def input_files(table: dict) -> list[Path]:
    """Every file the point `table` reads (see the module docstring), in a fixed order."""
    from sim.core.config import REPO_ROOT

    files: list[Path] = []
    lat = table.get("latency") if isinstance(table.get("latency"), dict) else {}
    if lat.get("kind", "profile") == "profile":
        prof = Path(str(lat.get("profile", "profiles/a100-pcie-40gb/qwen2.5-32b/tp1")))
        prof = prof if prof.is_absolute() else REPO_ROOT / prof
        files += [prof / f for f in PROFILE_FILES]
        # a disaggregated run's pools may run other profiles (sim/engine/disagg.py: sibling_profile)
        dg = table.get("disaggregation") if isinstance(table.get("disaggregation"), dict) else {}
        for name in ("prefill", "decode"):
            pool = dg.get(name) if isinstance(dg.get(name), dict) else None
            if pool is None:
                continue
            from sim.engine.disagg import sibling_profile

            pp_ = Path(str(pool.get("profile") or sibling_profile(str(prof), int(pool.get("tp", 1) or 1))))
            pp_ = pp_ if pp_.is_absolute() else REPO_ROOT / pp_
            files += [pp_ / f for f in PROFILE_FILES]
    cl = table.get("cluster") if isinstance(table.get("cluster"), dict) else None
    if cl is not None:  # the network's numbers, the interconnect's and GPU's specs (sim/latency/cluster.py)
        from sim.latency.hardware import PROFILES

        files.append(PROFILES / "networks" / f"{cl.get('network')}.toml")
        for key, folder in (("interconnect", "interconnects"), ("gpu", "gpus")):
            if isinstance(cl.get(key), str):
                files.append(PROFILES / folder / f"{cl[key]}.toml")
    wl = table.get("workload") if isinstance(table.get("workload"), dict) else {}
    merged = dict(wl)
    if "name" in wl and "kind" not in wl:
        from sim.workloads import workload_path

        name = str(wl["name"])
        wfile = Path(name) if name.endswith(".toml") else workload_path(name)
        files.append(wfile)
        try:
            from sim.workloads import resolve_workload

            merged, _ = resolve_workload(wl)
        except PipeSimError:
            pass  # the run itself reports it
    if isinstance(merged.get("file"), str):
        try:
            from sim.workloads.trace import resolve_trace_file

            files.append(resolve_trace_file(merged["file"], "workload"))
        except PipeSimError:
            files.append(Path(merged["file"]))
    plugins = table.get("plugins") if isinstance(table.get("plugins"), dict) else {}
    for spec in plugins.get("modules", []) or []:
        if isinstance(spec, str) and (spec.endswith(".py") or "/" in spec):
            files.append(Path(spec))
        elif isinstance(spec, str):
            try:
                found = importlib.util.find_spec(spec)
            except (ImportError, ValueError):
                found = None
            if found is not None and found.origin:
                files.append(Path(found.origin))
    return files


@lru_cache(maxsize=1024)
def _input_files_of(sections: str) -> tuple[Path, ...]:
    return tuple(input_files(json.loads(sections)))


def input_digest(table: dict) -> str:
    """A digest of the contents of `input_files(table)` (each file re-hashed when its size or
    modification time changes)."""
    sections = json.dumps({k: table.get(k) for k in ("latency", "workload", "plugins", "cluster", "disaggregation")},
                          sort_keys=True)
    h = hashlib.sha256()
    for f in _input_files_of(sections):
        h.update(f"{f}\0{file_digest(f)}\n".encode())
    return h.hexdigest()[:16]


def _gpu_peak_flops(meta: dict) -> float | None:
    from sim.latency.hardware import gpu_names, load_gpu

    prof = meta.get("profile", {})
    name = prof.get("gpu_spec")
    if not name:
        by_display = {load_gpu(n).display: n for n in gpu_names()}
        name = by_display.get(prof.get("gpu"))
    return load_gpu(name).bf16_tflops * 1e12 if name else None


@lru_cache(maxsize=64)
def _deployment_peak_tokens_per_s(profile: str, gpus: int) -> float | None:
    from sim.latency.profiled import Profile

    meta = Profile.load(profile).meta
    model = meta.get("model", {})
    params = model.get("num_layers", 0) * model.get("layer_params", 0) + model.get("embedding_params", 0)
    peak = _gpu_peak_flops(meta)
    if not params or not peak:
        return None
    # `params` is the whole model's (its layers and the LM head; the profile's tables are per TP
    # shard, its [model] is not): each token needs 2 FLOPs per parameter wherever it runs
    return gpus * peak / (2.0 * params)


def ceiling_rps(table: dict) -> float:
    """The rate whose tokens alone need the deployment's whole BF16 peak (module docstring);
    inf when the profile does not say which GPU or model it is."""
    from sim.core.config import config_from_table
    from sim.workloads import build_workload

    cfg = config_from_table(table)
    if cfg.latency.kind != "profile":
        return math.inf
    gpus = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.replicas
    if cfg.disaggregation is not None:  # prefill and decode pools (the same model on the same GPU)
        gpus = cfg.disaggregation.gpus
    peak = _deployment_peak_tokens_per_s(str(cfg.latency.profile_path()), gpus)
    if peak is None:
        return math.inf
    reqs = build_workload(cfg.workload, seed=cfg.seed)
    ctx = cfg.scheduler.context_length_tokens
    mean_tokens = sum(min(r.prompt_tokens + r.output_tokens, ctx) for r in reqs) / max(1, len(reqs))
    return peak / max(1.0, mean_tokens)


__all__: list[Any] = ["ceiling_rps", "file_digest", "input_digest", "input_files"]
