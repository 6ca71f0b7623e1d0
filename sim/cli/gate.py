"""`ppsim gate`: run a baseline and a candidate policy on paired seeds and judge the candidate
with the statistics of `sim.studies.gate` (for CI: exit 0 when the expectation holds, 1 when not).

A side is a scheme name (`sim.core.schemes`: TP, PP_<c>, DCP_greedy, DCP_pred, DCP_pred+DS) or a
TOML overlay that sets `[scheduler]` (chunk policy, rebalancer, launch chunk), and optionally
`[parallel]`, `[latency]` and `[plugins]`, on top of the gate's CONFIG. A side's rebalancer
comes only from the side (CONFIG's is dropped) and a chunk policy the side sets replaces
CONFIG's whole (its params are not merged). Both sides share everything else (seed, workload, SLO), so seed i gives both the
same arrivals and the same latency draws. Results are not cached: a plug-in's code may
change between calls while its config stays the same.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import time
from pathlib import Path

from sim.cli.common import SEEDS, TOL, jobs
from sim.core.errors import ConfigError

EPILOG = """examples:
  ppsim gate experiments/configs/default.toml --baseline PP_2048 --candidate DCP_pred --metric goodput --seeds 5
  ppsim gate examples/ci/gate.toml --plugin examples/ci/tpot_guard.py --baseline PP_2048 \\
      --candidate examples/ci/candidate.toml --metric goodput --expect better --seeds 5 --jobs 2
  ppsim gate experiments/configs/default.toml --baseline DCP_pred --candidate DCP_pred+DS \\
      --metric p90_ttft --expect no-worse --margin 10% --workload azure-conv-synth --workload sharegpt
Exit code: 0 the expectation holds, 1 it does not, 2 bad input. Writes OUT/gate.md and OUT/gate.json.
"""

OVERLAY_KEYS = ("parallel", "scheduler", "latency", "plugins", "label")
PAIRED_KEYS = ("seed", "workload", "slo", "horizon_s")


def add_commands(sub) -> None:
    from sim.studies.gate import EXPECTATIONS, METRICS

    p = sub.add_parser("gate", help="statistical A/B gate of two policies on paired seeds (for CI)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="run config (TOML) both sides share: deployment, workload, SLO, seed")
    p.add_argument("--baseline", required=True, metavar="SIDE",
                   help="scheme name, TOML overlay, or engine:NAME (the config under another engine's scheduler)")
    p.add_argument("--candidate", required=True, metavar="SIDE",
                   help="scheme name, TOML overlay, or engine:NAME (e.g. engine:vllm-v1)")
    p.add_argument("--metric", required=True, choices=list(METRICS))
    p.add_argument("--expect", default="better", choices=list(EXPECTATIONS), help="default: better")
    p.add_argument("--margin", default="5%", help="non-inferiority margin, %% of the baseline mean (default 5%%)")
    p.add_argument("--seeds", type=SEEDS, default=5, help="paired seeds (default 5; the config's seed and up)")
    p.add_argument("--workload", action="append", default=[], metavar="W",
                   help="workload name (workloads/); repeatable; default: the config's workload")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--rates", default="2:10:2",
                   help="goodput: integer rates to climb, LO:HI[:STEP] (default 2:10:2; bisection refines)")
    p.add_argument("--tol", type=TOL, default=0.25, help="goodput: bisection tolerance in req/s (default 0.25)")
    p.add_argument("--jobs", type=jobs, default=1, help="parallel simulation processes (default 1)")
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    p.add_argument("--out", default="runs/gate", help="folder for gate.md and gate.json (default runs/gate)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_gate)


def parse_margin(text: str) -> float:
    """'5%' -> 0.05; '0.05' -> 0.05."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ConfigError(f"--margin {text!r}: expected a percentage like 5% (or a fraction like 0.05)") from None
    if not 0 <= value < 1:
        raise ConfigError(f"--margin {text!r}: must be in [0%, 100%)")
    return value


def parse_rates(text: str) -> list[int]:
    """'2:10:2' -> [2, 4, 6, 8, 10]; STEP defaults to 1."""
    try:
        parts = [int(x) for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3):
        raise ConfigError(f"--rates {text!r}: expected LO:HI or LO:HI:STEP integers, e.g. 2:10:2")
    lo, hi, step = parts[0], parts[1], parts[2] if len(parts) == 3 else 1
    if not (0 < lo <= hi and step >= 1):
        raise ConfigError(f"--rates {text!r}: need 0 < LO <= HI and STEP >= 1")
    return list(range(lo, hi + 1, step))


def side_table(spec: str, base: dict, flag: str) -> tuple[str, dict]:
    """(label, config table) of one side on top of the shared `base` table."""
    from sim.core.config import config_from_table
    from sim.core.plugins import add_to_table, load_all, resolve_table_paths
    from sim.core.schemes import _merge

    table = copy.deepcopy(base)
    table.setdefault("scheduler", {}).pop("rebalancer", None)
    path = Path(spec)
    if spec.startswith("engine:"):  # the serving engine as the axis: the same config, another scheduler
        table["scheduler"]["engine"] = spec.split(":", 1)[1]
        from sim.engine.schedulers import engine

        engine(table["scheduler"]["engine"], where=flag)
        label, where = spec, flag
    elif spec.endswith(".toml") or path.is_file():
        from sim.core.tomlio import read_toml

        overlay = read_toml(path, ConfigError, f"{flag}: overlay file not found")
        bad = [k for k in overlay if k not in OVERLAY_KEYS]
        if bad:
            paired = " (the gate pairs seeds, workloads and SLOs: both sides take them from CONFIG)" \
                if any(k in PAIRED_KEYS for k in bad) else ""
            raise ConfigError(f"{path}: {flag} overlay may not set {', '.join(bad)}{paired}; "
                              f"allowed: {', '.join(OVERLAY_KEYS)}")
        overlay = resolve_table_paths(overlay, path.parent, str(path))
        label = str(overlay.pop("label", path.stem))
        if "chunk_policy" in overlay.get("scheduler", {}):
            table["scheduler"].pop("chunk_policy", None)  # replaced whole, params not merged
        side_plugins = overlay.pop("plugins", {}).get("modules", [])
        _merge(table, overlay)
        add_to_table(table, side_plugins)  # added to CONFIG's and --plugin's, not replacing them
        load_all(side_plugins)
        where = str(path)
    else:
        table = _merge_scheme(spec, table, flag)
        label, where = spec, flag
    config_from_table(table, where)  # one-line errors name the overlay or the flag
    return label, table


def _merge_scheme(scheme: str, table: dict, flag: str) -> dict:
    from sim.core.schemes import GPU, MODELS, _merge, scheme_table

    par = table.get("parallel", {})
    pp, tp = par.get("pp", 1), par.get("tp", 1)
    lat = table.get("latency", {})
    m = re.fullmatch(r"profiles/([^/]+)/([^/]+)/tp(\d+)", str(lat.get("profile", "")).rstrip("/")) \
        if lat.get("kind", "profile") == "profile" else None
    gpu, model = (m.group(1), m.group(2)) if m and m.group(2) in MODELS else (GPU, None)
    try:
        st = scheme_table(scheme, model or MODELS[0], table.get("workload", {}), num_gpus=pp * tp, gpu=gpu)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {scheme!r}: not a .toml overlay file, and {exc}") from None
    overlay = {"parallel": st["parallel"], "scheduler": st["scheduler"]}
    if st["parallel"]["tp"] != tp:
        if model is None:
            raise ConfigError(f"{flag} {scheme!r}: changes tp to {st['parallel']['tp']}, but CONFIG's latency is not a "
                              f"shipped profile (profiles/GPU/MODEL/tpN) to switch; use a TOML overlay with [latency]")
        overlay["latency"] = {"profile": st["latency"]["profile"]}
    table["scheduler"].pop("chunk_policy", None)
    _merge(table, overlay)
    return table


def workload_tables(base: dict, names: list[str]) -> list[tuple[str, dict]]:
    wl = base.get("workload", {})
    if not names:
        return [(str(wl.get("name", wl.get("kind", "workload"))), copy.deepcopy(wl))]
    keep = {k: wl[k] for k in ("rate_rps", "num_requests") if k in wl}
    from sim.workloads import load_workload_file

    out = []
    for n in names:
        if load_workload_file(n).get("kind") == "conversation" and keep:
            # a conversation workload counts sessions, not requests (num_sessions, rate_rps in sessions/s):
            # the config's request count and rate mean something else there, so its own are used
            from sim.cli.common import warn

            warn(f"--workload {n}: a conversation workload; the config's {', '.join(sorted(keep))} (requests) "
                 f"are not carried over, its own num_sessions and rate_rps (sessions/s) are used")
            out.append((n, {"name": n}))
        else:
            out.append((n, {"name": n, **keep}))
    return out


def run_gate(args) -> dict:
    from sim.core.config import config_from_table, load_table
    from sim.core.plugins import add_to_table
    from sim.studies.gate import METRICS, compare, overall
    from sim.studies.sweep import Runner, Search, goodput_searches

    margin = parse_margin(args.margin)
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    base = add_to_table(load_table(args.config, args.set), args.plugin)
    cfg = config_from_table(base, args.config)
    field_name, higher, unit = METRICS[args.metric]
    sides = [side_table(args.baseline, base, "--baseline"), side_table(args.candidate, base, "--candidate")]
    seeds = [cfg.seed + i for i in range(args.seeds)]
    workloads = workload_tables(base, args.workload)
    from sim.cli.common import say_workload_changes

    for name, wl in workloads:
        say_workload_changes(config_from_table(dict(base, workload=wl), f"--workload {name}").workload, seed=cfg.seed)
    runner = Runner(None, jobs=args.jobs, executor=args.executor, address=args.address,
                    progress=not args.no_progress)
    values: dict[tuple[str, int, int], float | None] = {}  # (workload, side, seed) -> value
    points = []  # (key, table)
    for wname, wl in workloads:
        for si, (_, st) in enumerate(sides):
            for seed in seeds:
                points.append(((wname, si, seed), dict(copy.deepcopy(st), seed=seed, workload=copy.deepcopy(wl))))
    if args.metric == "goodput":
        rates = parse_rates(args.rates)
        searches = []
        for key, t in points:
            # only pass/fail matters here: runs stop once P90 certainly misses the SLO
            t.setdefault("slo", {})["stop_when_violated"] = True
            searches.append(Search({"key": key}, t, rates, cfg.slo.ttft_ms, cfg.slo.tpot_ms))
        for r in goodput_searches(runner, searches, tol=args.tol, desc="gate", full_sweep=False):
            values[r["key"]] = r["goodput_rps"]
    else:
        for (key, _), summary in zip(points, runner.run([t for _, t in points], desc="gate")):
            values[key] = summary.get(field_name)
    rows = []
    for wname, _ in workloads:
        b = [values[(wname, 0, s)] for s in seeds]
        c = [values[(wname, 1, s)] for s in seeds]
        comp = compare(b, c, higher, args.expect, margin)
        rows.append({"workload": wname, "baseline_values": b, "candidate_values": c, "comparison": comp.to_dict(),
                     "_comp": comp})
    verdict, ok = overall([r.pop("_comp") for r in rows], args.expect)
    return {
        "metric": args.metric, "field": field_name, "unit": unit, "higher_is_better": higher,
        "expect": args.expect, "margin_pct": margin * 100, "seeds": len(seeds), "seed_list": seeds,
        "baseline": sides[0][0], "candidate": sides[1][0], "baseline_spec": args.baseline,
        "candidate_spec": args.candidate, "config": str(args.config), "plugins": base.get("plugins", {}).get("modules", []),
        "workloads": rows, "overall": {"verdict": verdict, "holds": ok}, "simulations": len(runner.cache),
    }


def cmd_gate(args) -> int:
    from sim.studies.gate import markdown

    t0 = time.perf_counter()
    result = run_gate(args)
    result["elapsed_s"] = round(time.perf_counter() - t0, 2)
    md = markdown(result) + f"\n({result['simulations']} simulations in {result['elapsed_s']:.1f} s, --jobs {args.jobs})\n"
    from sim.core import fsio

    out = fsio.claim(args.out, "gate")
    fsio.write_text(out / "gate.md", md)
    fsio.write_text(out / "gate.json", json.dumps(result, indent=2) + "\n")
    print(md, end="")
    print(f"written: {out / 'gate.md'}, {out / 'gate.json'}")
    return 0 if result["overall"]["holds"] else 1
