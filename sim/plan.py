"""`ppsim plan`: what-if capacity planning. Which deployment of N GPUs serves a workload best?

It enumerates every deployment: `replicas` x (TP x PP) splits of the GPUs for which a
profile exists and the KV pool holds at least one full-context request, behind a
round-robin or least-loaded router when there are several replicas, and every chunk policy
(static 256/512/1024/2048, greedy, predictive, predictive + delay scheduling). Each one's
goodput (the highest rate meeting P90 TTFT and P90 TPOT) comes from the sweep runner.

Pruning (reported): a split is *dominated* when a quick screen (a coarse goodput search with
a fixed chunk) puts it below `--prune-below` (default 50%) of the best split's screen; such
splits are not searched per policy. Splits that do not fit in memory are listed too.
"""

from __future__ import annotations

from sim.lazy import lazy, lazy_pyplot

import argparse
import copy
import math
from pathlib import Path

plt = lazy_pyplot()
pd = lazy("pandas")  # imported on first use (sim/lazy.py)

from sim.config import REPO_ROOT  # noqa: E402
from sim.errors import ConfigError  # noqa: E402
from sim.latency.profiled import Profile, kv_capacity_tokens  # noqa: E402
from sim.sweep import Runner, Search, goodput_searches, with_rate  # noqa: E402
from sim.workloads import resolve_workload  # noqa: E402

INTERCONNECTS = {"pcie": "a100-pcie-40gb", "nvlink": "a100-sxm-80gb-nvswitch"}
POLICIES = {
    "static-256": ({"name": "static"}, 256, None),
    "static-512": ({"name": "static"}, 512, None),
    "static-1024": ({"name": "static"}, 1024, None),
    "static-2048": ({"name": "static"}, 2048, None),
    "greedy": ({"name": "greedy"}, 128, None),
    "predictive": ({"name": "predictive"}, 128, None),
    "predictive+DS": ({"name": "predictive"}, 128, {"name": "delay-scheduling"}),
}
RATES = [0.5, 1, 2, 4, 8, 16, 32, 64]
EPILOG = """examples:
  ppsim plan --model qwen2.5-32b --gpus 4 --workload azure-conv-synth
  ppsim plan --model qwen2.5-14b --gpus 4 --workload sharegpt --price-per-gpu-hour 1.8 --jobs 2
  ppsim plan --model qwen2.5-32b --interconnect both --workload azure-conv-synth --quick
  ppsim plan --model qwen2.5-32b --workload my_trace.toml --slo-ttft-ms 1500 --slo-tpot-ms 150
"""


def family_dir(gpu: str) -> Path:
    p = Path(gpu)
    if not p.is_dir():
        p = REPO_ROOT / "profiles" / gpu
    if not p.is_dir():
        known = sorted(d.name for d in (REPO_ROOT / "profiles").iterdir() if d.is_dir() and not d.name.startswith("_"))
        raise ConfigError(f"--gpu {gpu!r}: no such profile family; allowed: {', '.join(known)} or a folder path")
    return p


def splits(family: Path, model: str, gpus: int, mem_fraction: float = 0.9, context: int = 16384):
    """(replicas, tp, pp, profile dir, kv tokens or None, prune reason or '') for every split."""
    mdir = family / model
    if not mdir.is_dir():
        known = sorted(d.name for d in family.iterdir() if d.is_dir())
        raise ConfigError(f"--model {model!r}: no profile in {family}; allowed: {', '.join(known)}")
    tps = sorted(int(d.name[2:]) for d in mdir.glob("tp*") if (d / "meta.toml").is_file())
    out = []
    for replicas in (r for r in range(1, gpus + 1) if gpus % r == 0):
        per = gpus // replicas
        for tp in tps:
            if per % tp:
                continue
            pp = per // tp
            prof = Profile.load(mdir / f"tp{tp}")
            if pp > prof.shape().num_layers:
                continue
            kv = kv_capacity_tokens(prof, pp, mem_fraction)
            reason = "" if kv >= context else f"does not fit: KV pool {max(kv, 0)} tokens < one {context}-token request"
            out.append((replicas, tp, pp, str((mdir / f"tp{tp}").relative_to(REPO_ROOT)
                                              if (mdir / f"tp{tp}").is_relative_to(REPO_ROOT) else mdir / f"tp{tp}"),
                        kv, reason))
    return out


def deployment_table(workload: dict, profile: str, replicas: int, tp: int, pp: int, router: str, policy: str,
                     slo: tuple[float, float], seed: int = 1) -> dict:
    chunk_policy, chunk, rebalancer = POLICIES[policy]
    table = {
        "seed": seed,
        "parallel": {"pp": pp, "tp": tp, "replicas": replicas, "router": router},
        "scheduler": {"chunk_size_tokens": chunk, "chunk_policy": copy.deepcopy(chunk_policy)},
        "latency": {"kind": "profile", "profile": profile},
        # goodput searches only need pass or fail: stop a run once its P90 certainly misses
        "slo": {"ttft_ms": slo[0], "tpot_ms": slo[1], "stop_when_violated": True},
        "workload": copy.deepcopy(workload),
    }
    if rebalancer:
        table["scheduler"]["rebalancer"] = copy.deepcopy(rebalancer)
    return table


def plan_workload(name: str, overrides: dict, quick: bool) -> dict:
    table = {"name": name, **overrides}
    merged, _ = resolve_workload(table)
    if merged.get("kind") == "trace" and merged.get("arrivals", "poisson") != "poisson":
        # NOTE: goodput needs a rate knob: a replayed trace becomes Poisson over its rows.
        table["arrivals"] = "poisson"
        table.pop("window_minutes", None)
        table.setdefault("num_requests", 400)
    if quick:
        table["num_requests"] = min(int(merged.get("num_requests", 150) or 150), 150)
    return table


def run_plan(args) -> pd.DataFrame:
    families = []
    if args.gpu:
        families = [(args.gpu, family_dir(args.gpu))]
    else:
        names = list(INTERCONNECTS) if args.interconnect == "both" else [args.interconnect]
        for n in names:
            if n not in INTERCONNECTS:
                raise ConfigError(f"--interconnect {n!r}: allowed: pcie, nvlink, both")
            families.append((n, family_dir(INTERCONNECTS[n])))
    slo = (args.slo_ttft_ms, args.slo_tpot_ms)
    if slo[0] <= 0 or slo[1] <= 0 or args.gpus < 1:
        raise ConfigError("--slo-ttft-ms, --slo-tpot-ms and --gpus must be positive")
    overrides = {}
    for text in args.set:
        if "=" not in text or not text.startswith("workload."):
            raise ConfigError(f"--set {text!r}: plan accepts workload.KEY=VALUE overrides only")
        from sim.config import parse_override

        path, value = parse_override(text)
        overrides[path[1]] = value
    workload = plan_workload(args.workload, overrides, args.quick)
    out = Path(args.out)
    runner = Runner(out / "cache.jsonl", jobs=args.jobs, executor=args.executor, address=args.address,
                    progress=not args.no_progress)
    tol = 0.25 if args.quick else 0.05
    rows, screens = [], []
    for fam_name, fam in families:
        for replicas, tp, pp, profile, kv, reason in splits(fam, args.model, args.gpus):
            routers = ["round-robin", "least-loaded"] if replicas > 1 else ["single"]
            for router in routers:
                base = {"interconnect": fam_name, "replicas": replicas, "tp": tp, "pp": pp, "router": router,
                        "profile": profile, "kv_tokens": kv}
                if reason:
                    rows.append({**base, "policy": "-", "goodput_rps": math.nan, "pruned": reason})
                    continue
                screen_policy = "static-512" if pp > 1 else "static-2048"
                table = deployment_table(workload, profile, replicas, tp, pp,
                                         "round-robin" if router == "single" else router, screen_policy, slo)
                screens.append((base, Search(dict(base), table, RATES, *slo)))
    screen_res = goodput_searches(runner, [s for _, s in screens], tol=0.5, desc="plan: screen")
    best_screen = {}
    for (base, _), res in zip(screens, screen_res):
        best_screen[base["interconnect"]] = max(best_screen.get(base["interconnect"], 0.0), res["goodput_rps"])
    searches = []
    for (base, _), res in zip(screens, screen_res):
        cut = args.prune_below * best_screen[base["interconnect"]]
        if res["goodput_rps"] < cut:
            rows.append({**base, "policy": "-", "goodput_rps": math.nan,
                         "pruned": f"dominated: screen goodput {res['goodput_rps']:.2f} < {args.prune_below:.0%} "
                                   f"of the best split's {best_screen[base['interconnect']]:.2f} req/s"})
            continue
        for policy in POLICIES:
            table = deployment_table(workload, base["profile"], base["replicas"], base["tp"], base["pp"],
                                     "round-robin" if base["router"] == "single" else base["router"], policy, slo)
            searches.append(Search({**base, "policy": policy}, table, RATES, *slo))
    found = goodput_searches(runner, searches, tol=tol, desc="plan: goodput")
    at80 = [with_rate(s.table, max(0.8 * f["goodput_rps"], 0.05)) for s, f in zip(searches, found)]
    for t in at80:  # full runs: their P90s and KV peak are reported
        t["slo"]["stop_when_violated"] = False
    at80_res = runner.run(at80, desc="plan: at 80% of goodput")
    for s, f, r in zip(searches, found, at80_res):
        g = f["goodput_rps"]
        cost = (args.price_per_gpu_hour * args.gpus / 3600 / g * 1e6
                if args.price_per_gpu_hour and g > 0 else math.nan)
        headroom = (1 - r["kv_peak_tokens"] / r["kv_capacity_tokens"]) if r.get("kv_capacity_tokens") else math.nan
        rows.append({**s.label, "goodput_rps": g, "goodput_per_gpu": g / args.gpus,
                     "cost_per_million_requests": cost, "p90_ttft_ms_at_80pct": r["p90_ttft_ms"],
                     "p90_tpot_ms_at_80pct": r["p90_tpot_ms"], "kv_headroom_at_80pct": headroom,
                     "flag": f["flag"], "pruned": ""})
    df = pd.DataFrame(rows)
    df.insert(0, "deployment", [_label(r) for r in df.to_dict("records")])
    ranked = df[df["pruned"] == ""].sort_values(["goodput_rps", "kv_headroom_at_80pct"], ascending=False)
    df = pd.concat([ranked, df[df["pruned"] != ""]], ignore_index=True)
    df.insert(1, "rank", list(range(1, len(ranked) + 1)) + [None] * (len(df) - len(ranked)))
    return df


def _label(r: dict) -> str:
    split = f"TP{r['tp']}xPP{r['pp']}"
    if r["replicas"] > 1:
        split = f"{r['replicas']}x({split}) {r['router']}"
    return f"{r['interconnect']}: {split} {r['policy']}"


def recommend(df: pd.DataFrame, slo: tuple[float, float]) -> str:
    ranked = df[df["pruned"] == ""]
    if ranked.empty or not ranked["goodput_rps"].max() > 0:
        return "No deployment meets the SLOs at any simulated rate; relax the SLOs or add GPUs."
    lines = []
    for fam, g in ranked.groupby("interconnect", sort=False):
        top = g.iloc[0]
        nxt = g[g["deployment"] != top["deployment"]]
        why = (f"the highest goodput, {top['goodput_rps']:.2f} req/s with P90 TTFT <= {slo[0]:g} ms and "
               f"P90 TPOT <= {slo[1]:g} ms")
        if len(nxt):
            gap = (1 - nxt.iloc[0]["goodput_rps"] / top["goodput_rps"]) * 100 if top["goodput_rps"] else 0
            why += f"; the runner-up ({nxt.iloc[0]['deployment']}) is {gap:.0f}% lower"
        if not math.isnan(top.get("kv_headroom_at_80pct", math.nan)):
            why += f"; at 80% of that load it keeps {top['kv_headroom_at_80pct']:.0%} of its KV cache free"
        lines.append(f"[{fam}] recommended: {top['deployment']} - {why}.")
        tp_only = g[(g["pp"] == 1) & (g["replicas"] == 1)]
        pp_only = g[g["pp"] > 1]
        if len(tp_only) and len(pp_only):
            t, p = tp_only["goodput_rps"].max(), pp_only["goodput_rps"].max()
            lines.append(f"[{fam}] best pure TP {t:.2f} req/s vs best with PP {p:.2f} req/s: "
                         f"{'TP' if t > p else 'PP'} wins on this interconnect.")
    return "\n".join(lines)


def plot_plan(df: pd.DataFrame, path: Path) -> None:
    ranked = df[df["pruned"] == ""]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(ranked) + 1.5))
    colors = {"pcie": "tab:blue", "nvlink": "tab:green"}
    ax.barh(ranked["deployment"], ranked["goodput_rps"],
            color=[colors.get(f, "tab:gray") for f in ranked["interconnect"]])
    ax.invert_yaxis()
    ax.set_xlabel("goodput (req/s)")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("goodput per deployment")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def cmd_plan(args) -> int:
    from sim.context import describe_workload, format_header

    source, rate = describe_workload({"name": args.workload})
    print(format_header({
        "model": args.model, "gpus": f"{args.gpus} ({args.gpu or args.interconnect}); every TP x PP x replicas split",
        "chunk policy": f"each of {', '.join(POLICIES)}", "workload": source,
        "rate": f"goodput search (Poisson), {rate} in the workload file", "seed": "1",
        "slo": f"TTFT {args.slo_ttft_ms:g} ms, TPOT {args.slo_tpot_ms:g} ms (P90)",
    }), flush=True)
    df = run_plan(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "plan.csv", index=False, float_format="%.6g")
    plot_plan(df, out / "plan.png")
    cols = ["rank", "deployment", "goodput_rps", "goodput_per_gpu", "cost_per_million_requests",
            "p90_ttft_ms_at_80pct", "p90_tpot_ms_at_80pct", "kv_headroom_at_80pct"]
    ranked = df[df["pruned"] == ""][cols]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(ranked.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    pruned = df[df["pruned"] != ""]
    if len(pruned):
        print("\npruned before simulating every policy:")
        for r in pruned.itertuples():
            print(f"  {r.deployment.replace(' -', '')}: {r.pruned}")
    text = recommend(df, (args.slo_ttft_ms, args.slo_tpot_ms))
    print("\n" + text)
    (out / "recommendation.txt").write_text(text + "\n")
    print(f"\nwrote {out}/plan.csv, plan.png, recommendation.txt")
    return 0


def add_plan_commands(sub) -> None:
    p = sub.add_parser("plan", help="find the best deployment of N GPUs for a workload", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-32b", help="model id (a folder of the profile family)")
    p.add_argument("--gpu", default=None, help="profile family under profiles/ or a folder (overrides --interconnect)")
    p.add_argument("--interconnect", default="pcie", help="pcie (a100-pcie-40gb), nvlink (a100-sxm-80gb-nvswitch) or both")
    p.add_argument("--gpus", type=int, default=4, help="number of GPUs (default 4)")
    p.add_argument("--workload", default="azure-conv-synth", help="workload name or a workload TOML file")
    p.add_argument("--set", action="append", default=[], metavar="workload.KEY=VALUE", help="workload override")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=200.0)
    p.add_argument("--price-per-gpu-hour", type=float, default=None, help="for cost per million requests")
    p.add_argument("--prune-below", type=float, default=0.5, help="prune splits below this share of the best screen")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None, help="Ray cluster address")
    p.add_argument("--quick", action="store_true", help="fewer requests and a coarser search")
    p.add_argument("--out", default="runs/plan", help="output folder (default runs/plan)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_plan)
