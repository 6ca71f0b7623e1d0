"""What a run simulated, in words: the header of `ppsim run`, `goodput`, `plan` and `validate`.

`describe(cfg)` returns an ordered dict (model, GPU, interconnect, deployment TP x PP x replicas,
chunk policy, workload and its source, rate, seed, profile provenance); `format_header` turns
it into `# key: value` lines. Given the built request list, the workload line also states how
many requests arrived over how long (the offered rate as simulated, not only as configured).
Reading the profile's meta.toml and the trace file (cached by its reader) are the only I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from sim.core.errors import PipeSimError


def _fmt_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def describe_profile(profile_dir: Path, label: str | None = None) -> dict[str, str]:
    """Model, GPU, interconnect and provenance from a profile's meta.toml (`label`: its name)."""
    from sim.latency.profiled import read_meta

    meta = read_meta(profile_dir)  # (checked: a damaged meta.toml is its one-line error, not a crash here)
    prof, comm = meta.get("profile", {}), meta.get("comm", {})
    fits = meta.get("fit", [])
    fitted = [str(f.get("param", "?")) for f in fits if str(f.get("status", "")).startswith("fitted")]
    prov = f"{label or profile_dir}, derived from {prof.get('base_hardware', '?')}"
    prov += f"; {len(prof.get('sources', []))} source files"
    if fitted:
        prov += f"; fitted: {', '.join(fitted)}"
    return {
        "model": str(prof.get("model", "?")),
        "gpu": str(prof.get("gpu", "?")),
        "interconnect": (f"P2P {comm.get('p2p_alpha_us', '?')} us + {comm.get('p2p_bw_gbps', '?')} GB/s; all-reduce "
                         f"{comm.get('allreduce_alpha_us', '?')} us + {comm.get('allreduce_busbw_gbps', '?')} GB/s bus "
                         f"({comm.get('model', '?')})"),
        "profile": prov,
    }


def describe_workload(table: Mapping[str, Any], requests: Sequence | None = None) -> tuple[str, str]:
    """(workload and its source, rate) of a [workload] table; `requests` adds what was built."""
    from sim.workloads import resolve_workload
    from sim.workloads.trace import resolve_trace_file, trace_formats

    merged, where = resolve_workload(table)
    kind = merged.get("kind", "?")
    name = table.get("name") or "inline"
    src = f"{name} ({kind}"
    if kind == "trace":
        fmt = merged.get("format", "auto")
        try:
            path = resolve_trace_file(merged.get("file"), where)
            note = trace_formats.get(str(fmt))(path, merged, where).source
        except PipeSimError:
            path, note = merged.get("file"), "file not readable"
        src = f"{'trace file' if name == 'inline' else name} {path} ({note}"
        if "limit" in merged:
            src += f", first {merged['limit']} rows (--limit)"
    elif kind == "poisson":
        src += f", lengths {merged.get('lengths', {}).get('source', '?')}"
        if "table" in merged.get("lengths", {}):
            src += f" {merged['lengths']['table']}"
    elif kind == "synthetic-uniform":
        src += f", input {merged.get('input_range')}, output {merged.get('output_range')}"
    src += ")"
    if merged.get("arrivals") == "timestamps":
        speed = merged.get("timestamp_speedup", 1.0)
        rate = "recorded arrival times" + (f" / {speed:g} (timestamp_speedup)" if speed != 1.0 else "")
        if "window_minutes" in merged:
            rate += f", minutes {merged.get('window_start_minutes', 0):g}-" \
                    f"{merged.get('window_start_minutes', 0) + merged['window_minutes']:g}"
    elif kind == "bench" and merged.get("arrivals", "poisson") != "poisson":
        process = merged["arrivals"]
        rate = (f"staged {merged.get('stages')}" if process == "staged" else
                f"{process} {merged.get('rate_rps', 'inf')} req/s"
                + (f", burstiness {merged['burstiness']:g}" if "burstiness" in merged else ""))
    else:
        rate = f"Poisson {merged.get('rate_rps', 'inf' if kind == 'bench' else '?')} req/s"
    from sim.workloads.client import client_of

    client = client_of(merged, where)
    if client is not None and client.concurrency is not None:
        think = (f", think time {client.think_distribution} mean {client.think_mean_s:g} s"
                 if client.think_mean_s > 0 else "")
        rate = f"closed loop of {client.concurrency} clients{think} (each sends when its previous request finishes)"
        requests = None  # the send times are made during the run
    elif client is not None and client.max_concurrency is not None:
        rate += f"; at most {client.max_concurrency} in flight (max_concurrency, first come first served)"
        requests = None
    if client is not None and client.request_timeout_s is not None:
        rate += f"; client timeout {client.request_timeout_s:g} s"
    if requests:
        span = requests[-1].arrival_s - requests[0].arrival_s
        rate += f"; {len(requests)} requests over {span:.1f} s"
        if span > 0:
            rate += f" ({len(requests) / span:.3g} req/s offered: count / span, as `workload stats`)"
    return src, rate


def describe(cfg, requests: Sequence | None = None) -> dict[str, str]:
    """What `cfg` simulates, as ordered `name: text` pairs (see the module docstring)."""
    par, sc, lat = cfg.parallel, cfg.scheduler, cfg.latency
    out: dict[str, str] = {}
    if lat.kind == "profile":
        prof = describe_profile(lat.profile_path(), lat.profile)
        out.update(model=prof["model"], gpu=prof["gpu"], interconnect=prof["interconnect"])
    else:
        out.update(model="n/a", gpu=f"constant latency model ({lat.stage_ms} ms per stage, "
                                    f"{lat.overhead_ms} ms overhead)", interconnect="n/a")
    gpus = par.tp * par.pp * par.replicas
    ep = f" (EP{par.ep}: experts split whole over the TP group)" if (getattr(par, "ep", None) or 1) > 1 else ""
    dep = f"TP{par.tp}{ep} x PP{par.pp} x {par.replicas} replica{'s' if par.replicas > 1 else ''} = {gpus} GPUs"
    if par.replicas > 1:
        dep += f", {par.router} router"
    dg = getattr(cfg, "disaggregation", None)
    if dg is not None:
        pools = [f"{n} {p.instances} x TP{p.tp} x PP{p.pp}" + (f" ({p.router})" if p.instances > 1 else "")
                 for n, p in (("prefill", dg.prefill), ("decode", dg.decode))]
        dep = (f"disaggregated: {', '.join(pools)} = {dg.gpus} GPUs; KV {dg.kv_transfer.replace('_', ' ')}, "
               f"first token from the {dg.first_token} side")
    out["deployment"] = dep
    out["engine"] = describe_engine(sc)
    cl = getattr(cfg, "cluster", None)
    if cl is not None:
        out["cluster"] = (f"{cl['nodes']} node{'s' if cl['nodes'] > 1 else ''} x {cl['gpus_per_node']} GPUs, "
                          f"{cl.get('interconnect', 'the profile’s interconnect')} inside, {cl['network']} between")
    chunk = f"{sc.chunk_size_tokens} tokens" if sc.chunk_size_tokens else "the engine's default budget"
    policy = f"{sc.chunk_policy.name} (chunk {chunk}"
    policy += f", {_fmt_params(sc.chunk_policy.params)})" if sc.chunk_policy.params else ")"
    if sc.rebalancer:
        policy += f"; rebalancer {sc.rebalancer.name}"
    out["chunk policy"] = policy
    out["workload"], out["rate"] = describe_workload(cfg.workload, requests)
    out["seed"] = str(cfg.seed)
    out["slo"] = f"TTFT {cfg.slo.ttft_ms:g} ms, TPOT {cfg.slo.tpot_ms:g} ms"
    if cfg.horizon_s:
        out["horizon"] = f"{cfg.horizon_s:g} s"
    out["profile"] = prof["profile"] if lat.kind == "profile" else "n/a"
    if lat.kind == "profile" and lat.noise_cv:
        out["profile"] += f"; noise CV {lat.noise_cv:g}"
    return out


def describe_engine(sc) -> str:
    """The scheduler engine, its source version and whether its prefix cache is on."""
    import importlib

    from sim.engine.schedulers import pick_version

    module = {"fastpp": "fastpp", "sglang": "sglang", "vllm-v1": "vllm_v1", "vllm-v0": "vllm_v0"}.get(sc.engine)
    version = ""
    if module:
        mod = importlib.import_module(f"sim.engine.schedulers.{module}")
        # (an unknown engine_version is refused here, before the run starts)
        key = pick_version(sc.engine, mod.VERSIONS, mod.DEFAULT_VERSION, sc.engine_version)
        label = getattr(mod, "release_label", None)  # (vllm-v0: its mode depends on the context length)
        version = label(key, sc) if label is not None else mod.VERSIONS[key]
    cache = sc.prefix_cache if sc.prefix_cache is not None else sc.engine in ("sglang", "vllm-v1")
    return f"{sc.engine} ({version}); prefix cache {'on' if cache else 'off'}"


def format_header(ctx: Mapping[str, str]) -> str:
    width = max(len(k) for k in ctx)
    return "\n".join(f"# {k + ':':<{width + 1}} {v}" for k, v in ctx.items())
