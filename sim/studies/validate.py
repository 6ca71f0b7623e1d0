"""Check the simulator against a real serving benchmark: SGLang `bench_serving`, vLLM
`benchmark_serving.py` / `vllm bench serve` result files.

Formats read (field names as the tools write them; see `sim.outputs.bench_metrics` for the definitions):

- SGLang `python/sglang/bench_serving.py --output-file F [--output-details]`: JSONL, one JSON
  object appended per benchmark run. Aggregates: `request_rate` (a number; `Infinity` for inf),
  `completed`, `duration`, `mean/median/std/p99_ttft_ms`, `..._tpot_ms`, `..._itl_ms` (+ `p95`),
  `mean/median/std/p99_e2e_latency_ms`, `request_throughput`, `output_throughput`. With
  `--output-details`, per request: `input_lens`, `output_lens`, `ttfts` (s), `itls` (a list of
  per-token gaps per request, s), `errors` ("" for success).
- vLLM `benchmarks/benchmark_serving.py --save-result [--save-detailed]` and
  `vllm bench serve`: one JSON object with the same per-request lists, `request_rate` (a number
  or "inf"), `burstiness`, `max_concurrency`, and `mean/median/std/pNN_{ttft,tpot,itl,e2el}_ms`.
- The FastPP artifact's fork writes `ttfts`, `tpots`, `e2es` lists (s; `--units ms` for ms).
- NVIDIA genai-perf's `*_genai_perf.json` export: aggregates and a concurrency stimulus, replayed
  as a closed loop of that many clients on `--workload NAME` (sim/studies/genai_perf.py).

For each result the simulator replays the log's own requests: the successful requests'
(input_lens[i], output_lens[i]) in the log's order (failed ones, with an error or 0 output
tokens, are left out and counted), sent as the tools send them (sim/studies/bench_client.py):
vLLM's gamma gaps of shape `burstiness` rescaled to end at n / rate, SGLang's Poisson from t=0,
all at t=0 for inf, from the run seed's `arrivals` stream (the real run's own draws are not in
the log), with the log's `max_concurrency` as the client's cap on in-flight requests and its ramp-up
(`ramp_up_strategy`) as vLLM draws it; SGLang's trace timestamps are refused. A log without per-request
lengths needs `--workload NAME` for them. Compared: mean, P50, P90, P99 of TTFT, TPOT, ITL
and E2E (from the per-request lists where present, else the aggregates the log has), and the
request and output throughputs. E2E per request is ttft + sum(itls) (vLLM's latency exactly;
SGLang's latency also counts the closing [DONE] chunk, a few ms).
The engine replayed is the one the log's `backend` names, at the release its `engine_version`
(or `vllm_version` / `sglang_version`) key names, e.g. from `vllm bench serve --metadata
engine_version=0.11.0`; a release PipeSim does not model is refused (`engine_for_log`).
"""

from __future__ import annotations

from sim.core.lazy import lazy

import json
import math
from pathlib import Path
from typing import Any

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.core.checks import number
from sim.core.errors import ConfigError, DataError
from sim.workloads.trace import json_lines

STATS = (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))
METRICS = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el"))
# Aggregate names in the logs: SGLang calls E2E `e2e_latency`, vLLM `e2el`.
AGG_ALIASES = {"e2el": ("e2el", "e2e_latency")}
THROUGHPUTS = ("request_throughput", "output_throughput")


def _num_list(path: Path, line: int, rec: dict, key: str, *, nested: bool = False) -> list | None:
    vals = rec.get(key)
    if vals is None:
        return None
    def num(x) -> bool:  # a finite number >= 0: a latency or a length (NaN, inf, negatives refused)
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

    ok = isinstance(vals, list) and all(
        (isinstance(v, list) and all(num(x) for x in v)) if nested else num(v) for v in vals)
    if not ok:
        what = ("a list of lists of finite numbers >= 0 (one list of per-token gaps per request)" if nested
                else "a list of finite numbers >= 0")
        raise DataError(f"{path}: line {line}: field {key!r} must be {what}")
    return vals


def _rate(path: Path, line: int, rec: dict) -> float:
    rate = rec.get("request_rate")
    if isinstance(rate, str) and rate.lower() in ("inf", "infinity"):
        rate = math.inf
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise DataError(f"{path}: line {line}: field 'request_rate' must be a positive number or \"inf\", got {rate!r}")
    return float(rate)


def parse_result(path: Path, line: int, rec: Any, scale: float) -> dict:
    """One benchmark result -> rate, per-request arrays (ms) and the log's aggregates."""
    if not isinstance(rec, dict):
        raise DataError(f"{path}: line {line}: expected a JSON object")
    from sim.studies import bench_client

    bench_client.refuse_unreproducible(path, line, rec)  # client settings PipeSim cannot replay
    out: dict[str, Any] = {"line": line, "request_rate": _rate(path, line, rec), "aggregates": {},
                           "client": bench_client.client_of(rec), "ramp": bench_client.ramp_of(rec)}
    burst = rec.get("burstiness", 1.0)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not burst > 0:
        raise DataError(f"{path}: line {line}: field 'burstiness' must be a positive number, got {burst!r}")
    out["burstiness"] = float(burst)
    backend = rec.get("backend")
    out["backend"] = backend if isinstance(backend, str) else None
    out["max_concurrency"] = bench_client.max_concurrency(path, line, rec)
    # the engine's release, when the log names it (`vllm bench serve --metadata engine_version=0.11.0`)
    version = next((rec[k] for k in VERSION_KEYS if isinstance(rec.get(k), (str, int, float))
                    and not isinstance(rec.get(k), bool)), None)
    out["engine_version"] = str(version) if version is not None else None
    for name, key in METRICS:
        for stat, word in STATS:
            for alias in AGG_ALIASES.get(key, (key,)):
                v = rec.get(f"{word}_{alias}_ms")
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out["aggregates"][(name, stat)] = float(number(v, f"{path}: line {line}", f"field "
                                                                   f"'{word}_{alias}_ms'", 0, None, error=DataError))
                    break
    for key in THROUGHPUTS:
        if isinstance(rec.get(key), (int, float)) and not isinstance(rec.get(key), bool):
            out["aggregates"][(key, "value")] = float(number(rec[key], f"{path}: line {line}", f"field {key!r}", 0,
                                                             None, error=DataError))
    ttfts = _num_list(path, line, rec, "ttfts")
    ins, outs = _num_list(path, line, rec, "input_lens"), _num_list(path, line, rec, "output_lens")
    itls = _num_list(path, line, rec, "itls", nested=True)
    if ttfts is not None and "e2es" in rec:  # the FastPP fork's lists
        tpots, e2es = _num_list(path, line, rec, "tpots"), _num_list(path, line, rec, "e2es")
        if tpots is None or e2es is None or not ttfts or len(e2es) != len(ttfts):
            raise DataError(f"{path}: line {line}: 'ttfts', 'tpots' and 'e2es' must be lists, "
                            "'ttfts' and 'e2es' non-empty and of equal length")
        out["per_request"] = {"ttft": np.asarray(ttfts) * scale, "tpot": np.asarray(tpots) * scale,
                              "e2e": np.asarray(e2es) * scale}
        out["completed"] = int(rec.get("completed", len(ttfts)))
    elif ttfts is not None:
        n = len(ttfts)
        for key, vals in (("itls", itls), ("input_lens", ins), ("output_lens", outs)):
            if vals is None or len(vals) != n:
                raise DataError(f"{path}: line {line}: field {key!r} must be a list as long as 'ttfts' ({n}); "
                                f"got {'none' if vals is None else len(vals)}")
        errors = rec.get("errors") or [""] * n
        if not isinstance(errors, list) or len(errors) != n:
            raise DataError(f"{path}: line {line}: field 'errors' must be a list as long as 'ttfts' ({n})")
        ok = np.array([not e and o > 0 for e, o in zip(errors, outs)], dtype=bool)
        for i, (a, b) in enumerate(zip(ins, outs)):
            if ok[i] and not (float(a).is_integer() and a > 0 and float(b).is_integer()):
                raise DataError(f"{path}: line {line}: field 'input_lens'/'output_lens' item {i}: "
                                f"token counts must be positive integers, got {a!r}/{b!r}")
        for i, (g, o) in enumerate(zip(itls, outs)):
            # one gap per token after the first; a streaming engine may batch tokens into fewer
            # chunks (vLLM's multi-step scheduling), never more
            if ok[i] and len(g) > max(int(o) - 1, 0):
                raise DataError(f"{path}: line {line}: field 'itls' item {i}: {len(g)} gaps for {int(o)} output "
                                f"tokens; allowed: at most output_lens - 1 = {max(int(o) - 1, 0)}")
        if not ok.any():
            raise DataError(f"{path}: line {line}: no successful request (every one has an error or 0 output tokens)")
        ttft = np.asarray(ttfts, dtype=float)[ok] * scale
        gaps = [np.asarray(g, dtype=float) * scale for g, good in zip(itls, ok) if good]
        e2e = ttft + np.array([g.sum() for g in gaps])
        olen = np.asarray(outs, dtype=float)[ok]
        tpot = np.where(olen > 1, (e2e - ttft) / np.maximum(olen - 1, 1), np.nan)
        out["per_request"] = {"ttft": ttft, "tpot": tpot, "e2e": e2e,
                              "itl": np.concatenate(gaps) if gaps else np.zeros(0)}
        out["lengths"] = (np.asarray(ins, dtype=np.int64)[ok], olen.astype(np.int64))
        out["failed"] = int((~ok).sum())
        out["completed"] = int(ok.sum())
    elif not out["aggregates"]:
        raise DataError(f"{path}: line {line}: neither per-request lists ('ttfts', 'itls', 'input_lens', "
                        "'output_lens') nor aggregates ('mean_ttft_ms', ...) found")
    else:
        c = rec.get("completed")
        if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
            raise DataError(f"{path}: line {line}: field 'completed' must be a positive integer, got {c!r}")
        out["completed"] = c
    return out


def read_bench_log(path: str | Path, units: str = "s") -> list[dict]:
    """Every benchmark result in a vLLM JSON or SGLang JSONL file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: bench log not found")
    scale = {"s": 1e3, "ms": 1.0}.get(units)
    if scale is None:
        raise ConfigError(f"--units must be one of: s, ms; got {units!r}")
    from sim.core.textio import read_text

    text = read_text(path)  # compression sniffed, UTF-8 checked
    try:
        whole = json.loads(text)  # vLLM: one JSON object (possibly pretty-printed over many lines)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        from sim.studies import genai_perf

        if genai_perf.is_export(whole):  # NVIDIA genai-perf's *_genai_perf.json (sim/studies/genai_perf.py)
            return [genai_perf.parse_export(path, whole)]
        return [parse_result(path, 1, whole, scale)]
    runs = []
    for lineno, rec in json_lines(path, text.splitlines()):
        runs.append(parse_result(path, lineno, rec, scale))
    if not runs:
        raise DataError(f"{path}: no results in the file")
    return runs


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan
    return float(values.mean()) if stat == "mean" else float(np.percentile(values, int(stat[1:])))


def compare(real: dict, sim_summary: dict) -> list[dict]:
    """Rows (metric, stat, real, sim, error %) for every statistic the log has."""
    rows = []
    per = real.get("per_request", {})
    for name, key in METRICS:
        for stat, word in STATS:
            r = _stat(per[name], stat) if name in per else real["aggregates"].get((name, stat))
            if r is None:
                continue
            s = sim_summary.get(f"{stat if stat != 'p50' else 'median'}_{key}_ms", math.nan)
            rows.append({"line": real["line"], "metric": name, "stat": stat, "unit": "ms", "real": r, "sim": s})
    for key in THROUGHPUTS:
        r = real["aggregates"].get((key, "value"))
        if r is not None:
            rows.append({"line": real["line"], "metric": key, "stat": "value",
                         "unit": "req/s" if key.startswith("request") else "tok/s", "real": r, "sim": sim_summary[key]})
    for row in rows:
        r, s = row["real"], row["sim"]
        row["error_pct"] = (s - r) / r * 100 if r and not math.isnan(r) else math.nan
    return rows


def log_requests(real: dict, seed: int):
    """The log's successful requests at the log's rate (see the module docstring)."""
    from sim.core.rng import stream
    from sim.studies.bench_client import log_arrivals
    from sim.workloads.base import make_requests

    prompts, outputs = real["lengths"]
    arrivals = log_arrivals(real.get("client", "sglang"), len(prompts), real["request_rate"], real["burstiness"],
                            stream(seed, "arrivals"), real.get("ramp"))
    return make_requests(arrivals, prompts, outputs)


def assumptions(real: dict, path: Path, workload: str | None) -> tuple[str, str]:
    """The (workload, rate) lines of the header: what was replayed from the log."""
    from sim.studies.bench_client import describe

    arr = describe(real.get("client", "sglang"), real["request_rate"], real["burstiness"], real.get("max_concurrency"),
                   real.get("ramp"))
    if real.get("concurrency"):
        arr = f"a closed loop of {real['concurrency']} clients (genai-perf's concurrency stimulus)"
    if workload:
        src = f"workload {workload} (--workload), {real['completed']} requests"
    else:
        src = f"the log's own {real['completed']} successful requests ({path} line {real['line']}: input_lens, output_lens)"
        if real.get("failed"):
            src += f"; {real['failed']} failed request(s) left out"
    return src, arr


# The engine a log's `backend` names: vLLM's benchmark_serving / `vllm bench serve` write
# "vllm" (V1 is vLLM's engine since 0.8; `--engine vllm-v0` replays an older log), SGLang's
# bench_serving "sglang" (the current scheduler; the FastPP artifact's fork writes none).
BACKEND_ENGINES = {"vllm": "vllm-v1", "openai": "vllm-v1", "sglang": "sglang", "sglang-native": "sglang"}
# Where a log names the engine's release (vLLM's `--metadata KEY=VALUE` adds any key)
VERSION_KEYS = ("engine_version", "vllm_version", "sglang_version")


def _log_version(real: dict, path: Path, chosen: str) -> tuple[str, str]:
    """(engine, version key) for the release a log names: "0.11.0" is vllm-v1's "0.11"; a vLLM
    release V1 is not modelled for but V0 is (0.6) runs on vllm-v0. Unknown ones are refused."""
    import re

    from sim.engine.schedulers import engine as engine_of

    raw = real["engine_version"]
    m = re.match(r"v?(\d+)\.(\d+)", raw.strip())
    short = f"{m.group(1)}.{m.group(2)}" if m else raw
    family = ("vllm-v1", "vllm-v0") if chosen in ("vllm-v1", "vllm-v0") else (chosen,)
    known = []
    for name in family:
        versions = getattr(engine_of(name), "versions", {})
        if short in versions:
            return name, short
        known += [f"{name} {k}" for k in versions]
    raise DataError(f"{path}: line {real['line']}: engine version {raw!r} ({chosen}) is not modelled; known: "
                    f"{', '.join(known) or 'none'}")


def engine_for_log(real: dict, path: Path, engine: str | None) -> tuple[str | None, str | None, str]:
    """(engine to simulate, its version or None for the config's, why): `--engine` wins, else the
    one the log's backend names, else the config's; a release the log names picks the version
    (and between vLLM's V1 and V0 engines), and one not modelled is refused."""
    if engine:
        chosen, why = engine, "--engine"
    elif real.get("backend") in BACKEND_ENGINES:
        chosen = BACKEND_ENGINES[real["backend"]]
        why = f"the log's backend {real['backend']!r} ({path} line {real['line']})"
    elif real.get("backend") not in (None, ""):
        # a backend PipeSim has no scheduler for (TGI, TensorRT-LLM, ...): replaying it on the
        # config's engine would be a comparison with another server's measurement, unsaid
        raise ConfigError(f"{path}: line {real['line']}: backend {real['backend']!r} is not one PipeSim models; "
                          f"allowed: {', '.join(BACKEND_ENGINES)}, or --engine ENGINE to replay the log on one of "
                          f"PipeSim's engines anyway")
    else:
        return None, None, "the config's (the log names no backend)"
    if real.get("engine_version") is None:
        return chosen, None, why
    name, version = _log_version(real, path, chosen)
    return name, version, f"{why}, release {real['engine_version']!r}"


def validate(log_path, workload: str | None, config_path, overrides: list[str], units: str = "s",
             echo=print, engine: str | None = None) -> pd.DataFrame:
    """Simulate every result of the log and compare; `echo` gets each result's header. The
    scheduler is the engine the log names (`engine_for_log`), so a vLLM log runs a vLLM
    scheduler and says so."""
    from sim.core.config import load_config
    from sim.outputs.context import describe, format_header
    from sim.engine.run import run
    from sim.outputs.metrics import summarize
    from sim.workloads import build_workload_said

    path = Path(log_path)
    rows = []
    for real in read_bench_log(path, units):
        if workload is None and "lengths" not in real:
            raise ConfigError(f"{path}: line {real['line']}: the log has no per-request input_lens/output_lens "
                              "(run the benchmark with --output-details / --save-detailed), so give --workload NAME")
        chosen, version, why = engine_for_log(real, path, engine)
        if chosen is not None:
            overrides = [o for o in overrides if not o.strip().startswith("scheduler.engine")]
            overrides = list(overrides) + [f'scheduler.engine="{chosen}"']
            if version is not None:
                overrides.append(f'scheduler.engine_version="{version}"')
        for key in ("max_concurrency", "concurrency"):  # the client's loop (sim/workloads/client.py)
            if real.get(key):
                overrides = [o for o in overrides if not o.strip().startswith(f"workload.{key}=")]
                overrides = list(overrides) + [f"workload.{key}={real[key]}"]
        cfg = load_config(config_path, overrides)
        if workload is None and not any(o.strip().startswith("scheduler.context_length_tokens") for o in overrides):
            # the real server served every request of the log: a context that holds the longest one
            # (SGLang's max_req_input_len = context - 6), not a truncation counted as PipeSim's error
            need = max((int(p) + int(o) + 7 for p, o in zip(*real["lengths"])), default=0)
            if need > cfg.scheduler.context_length_tokens:
                echo(f"warning: {path} line {real['line']}: [scheduler] context_length_tokens raised from "
                     f"{cfg.scheduler.context_length_tokens} to {need} to hold the log's longest request (the real "
                     f"server served it)")
                overrides = list(overrides) + [f"scheduler.context_length_tokens={need}"]
                cfg = load_config(config_path, overrides)
        if workload:
            rate = "inf" if math.isinf(real["request_rate"]) else real["request_rate"]
            cfg = load_config(config_path, list(overrides) + [f'workload.name="{workload}"',
                                                              f"workload.num_requests={real['completed']}",
                                                              f"workload.rate_rps={rate}"])
            requests, changed = build_workload_said(cfg.workload, seed=cfg.seed)
        else:
            requests, changed = log_requests(real, cfg.seed), []
        ctx = describe(cfg, requests)
        ctx["workload"], ctx["rate"] = assumptions(real, path, workload)
        ctx["engine"] += f"; chosen by {why}"
        echo(format_header({"bench log": f"{path} line {real['line']}", **ctx}))
        for text in changed:  # what the workload's reader changed of its input
            echo(f"warning: {text}")
        result = run(cfg, requests)
        summary = summarize(result)
        cut = (summary.get("num_truncated_prompts") or 0, summary.get("num_clipped_outputs") or 0)
        if any(cut):  # (the KV pool, or a --set context, still cut some: the error below includes it)
            echo(f"warning: {cut[0]} prompt(s) truncated and {cut[1]} output(s) clipped to the simulated context "
                 f"length or KV pool ({cfg.scheduler.context_length_tokens} tokens, pool "
                 f"{summary.get('kv_capacity_tokens')}): the errors below include what that changed")
        rows += compare(real, summary)
    return pd.DataFrame(rows)
