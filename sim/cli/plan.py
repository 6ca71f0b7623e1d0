"""`ppsim plan`: simulate every deployment of N GPUs for a load and SLOs, and rank them (sim/studies/plan.py)."""

from __future__ import annotations

import argparse
import json

from sim.cli.common import SEEDS, float_in, int_in, jobs, warn
from sim.core import fsio
from sim.core.lazy import lazy
from sim.core.slo import SLO, slo_from_specs
from sim.studies.plan import MAX_GPUS_EXHAUSTIVE, POLICIES, _jsonable, run_plan
from sim.studies.plan_plot import plot_plan

pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

EPILOG = """examples:
  ppsim plan --model qwen2.5-32b --gpus 8 --workload azure-conv --rate 6 --slo ttft:p99:2000 --slo tpot:p90:150
  ppsim plan --model qwen2.5-32b --gpus 4 --workload azure-conv-synth --jobs 2           # goodput ranking
  ppsim plan --model qwen2.5-14b --gpus 4 --workload sharegpt --rate 0.5 --price-per-gpu-hour 1.8
  ppsim plan --model qwen2.5-32b --interconnect both --rate 4 --price-per-gpu-hour pcie=1.6,nvlink=2.2
  ppsim plan --model qwen2.5-32b --trace my_requests.csv --slo ttft:p95:1500   # replay at its timestamps
  ppsim plan --model-config my-model/config.json --gpu h100-sxm-80gb --gpus 8 --rate 4
      # one's own model: every TP degree built into the cache ($PIPESIM_CACHE), nothing into the checkout
  ppsim plan --model /tmp/mine --gpus 2 --rate 1   # a profile folder (ppsim profile build --out): on its GPU
  ppsim plan --model llama-3.1-70b --gpu h100-sxm-80gb --max-gpus 16 --rate 8 --slo ttft:p90:1000 --slo tpot:p90:50
      # the fewest GPUs for 8 req/s: GPU counts up to 16 on 8-GPU nodes over InfiniBand NDR, co-located or
      # disaggregated (prefill:decode), TP x PP per pool, chunk policy (sim/studies/cluster_plan.py)
  ppsim plan --model qwen2.5-14b --gpus 2 --workload azure-conv-synth --concurrency 16 --slo tpot:p90:100
      # the deployment that holds 16 concurrent users (a closed loop, as vllm bench serve --max-concurrency 16)
"""



def _rule_text(meta: dict) -> str:
    from sim.studies.plan import COST_NOTE

    return f"ranking: {meta['rule']}.\n{meta.get('cost_note', COST_NOTE)}; in {meta.get('cost_unit', 'GPU-hours')}."


def _plan_text(df, meta: dict, cols: list[str]) -> str:
    """plan.txt: the load, the ranking rule and cost columns, every ranked candidate, the verdict, the
    --verify checks."""
    ranked = df[df["rank"].notna()]
    table = (ranked[[c for c in cols if c in df]].to_string(index=False, float_format=lambda v: f"{v:.4g}")
             if len(ranked) else "(no candidate qualifies)")
    return "\n".join([meta["load"] + f"; {meta['seeds']} paired seed(s); {meta['slo']}", _rule_text(meta), "",
                      table, "", meta["verdict"], *_verify_lines(meta), ""])


def _verify_lines(meta: dict) -> list[str]:
    from sim.studies.plan_verify import describe

    if "verification" not in meta:
        return []
    checks = meta["verification"]
    return ["", "verify (the first seed, run at length):", *("  " + line for line in describe(checks))] \
        if checks else ["", "verify: nothing to check (no candidate ranked or with a goodput)"]


def _policies_text(args) -> str:
    """The header's chunk policies: the paper's for fastpp, each other engine's own (sim.studies.plan
    policies_for)."""
    if args.max_gpus:
        return f"each of {', '.join(args.policies)}"
    from sim.studies.plan import policies_for

    return "; ".join(f"{e}: {', '.join(policies_for({'engine': e}, args.policies_asked))}"
                     for e in (args.engine or ("fastpp",)))


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas, e.g. 1,2,4") from None
    if not vals or any(not 1 <= v <= 256 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: each degree must be an integer in [1, 256]")
    return vals


def _engine_list(text: str) -> tuple[str, ...]:
    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    if not vals:
        raise argparse.ArgumentTypeError(f"{text!r}: expected engine names, e.g. fastpp,sglang,vllm-v1")
    twice = sorted({v for v in vals if vals.count(v) > 1})
    if twice:  # (each would plan every candidate again, as another one)
        raise argparse.ArgumentTypeError(f"{text!r}: {twice[0]} named twice; allowed: each engine once")
    return vals


def _name_list(text: str) -> tuple[str, ...]:
    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in vals if v not in POLICIES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown policy {bad[0] if bad else ''!r}; allowed: "
                                         f"{', '.join(POLICIES)}")
    return vals


def add_commands(sub) -> None:
    p = sub.add_parser("plan", help="find the best deployment of N GPUs for a load and SLOs", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="model id (profiles/models/, default qwen2.5-32b), or a profile folder (ppsim profile build "
                        "--out, or tp<T>/ folders: its GPU is the plan's); TP degrees it lacks are built into the "
                        "cache ($PIPESIM_CACHE) from its model file or --model-config")
    p.add_argument("--model-config", default=None, metavar="PATH",
                   help="a Hugging Face config.json (dense, offline, as ppsim profile build reads it): plan your own "
                        "model; every TP degree is built into the cache, nothing into the checkout; needs --gpu")
    p.add_argument("--gpu", default=None,
                   help="profile family under profiles/ or a folder (overrides --interconnect); required unless the "
                        "model has a hand-built profile on the default GPU, the paper's a100-pcie-40gb (both "
                        "--gpus and --max-gpus), or --model is a profile folder (its GPU)")
    p.add_argument("--interconnect", default=None,
                   help="pcie (a100-pcie-40gb; the default without --gpu), nvlink (a100-sxm-80gb-nvswitch) or both "
                        "(like-for-like: only the communication model differs); not with --gpu or --max-gpus")
    p.add_argument("--gpus", type=int_in(1, MAX_GPUS_EXHAUSTIVE), default=None,
                   help=f"number of GPUs (default 4; at most {MAX_GPUS_EXHAUSTIVE}: every split is simulated; "
                        f"--max-gpus searches larger clusters)")
    p.add_argument("--max-gpus", type=int_in(1, 4096), default=None, metavar="N",
                   help="with --rate (or --concurrency): the fewest GPUs up to N that meet the SLOs, over nodes, "
                        "co-located and disaggregated deployments (on --gpu, as --gpus N)")
    p.add_argument("--gpus-per-node", type=int_in(1, 64), default=8,
                   help="GPUs per node (default 8): --max-gpus places every candidate on such nodes; --gpus N "
                        "larger than it places each split on them too (the plan's nodes column)")
    p.add_argument("--network", default="ib-ndr", help="the network between nodes, for --max-gpus and for --gpus N "
                                                        "beyond one node (profiles/networks/; default ib-ndr)")
    p.add_argument("--pp", type=_int_list, default=(1, 2, 4), metavar="1,2,4",
                   help="--max-gpus: the PP degrees searched per pool (default 1,2,4)")
    p.add_argument("--tp", type=_int_list, default=None, metavar="1,2,4,8",
                   help="--max-gpus: the TP degrees searched per pool (default: 1, 2, 4, ... up to the node's GPUs)")
    p.add_argument("--policies", type=_name_list, default=None, metavar="A,B",
                   help="the chunk policies searched (any of " + ", ".join(POLICIES) + "); --max-gpus default "
                        "static-512,static-2048; --gpus default: every one for fastpp, and each other engine its own "
                        "token budget (default, static-512, static-2048; vllm-v0: its default only); a paper policy "
                        "named here runs on sglang and vllm-v1 too, labelled what-if:NAME")
    p.add_argument("--confirm", type=int_in(1, 100), default=4,
                   help="--max-gpus: candidates simulated in full per round, fewest GPUs first (default 4)")
    p.add_argument("--kv-transfer", choices=("after_prefill", "layerwise"), default="after_prefill",
                   help="--max-gpus: how disaggregated pools ship the KV (default after_prefill)")
    p.add_argument("--first-token", choices=("decode", "prefill"), default="decode",
                   help="--max-gpus: which pool emits token 1 (decode: vLLM/SGLang/Dynamo; prefill: DistServe)")
    p.add_argument("--engine", type=_engine_list, default=("fastpp",), metavar="A,B",
                   help="serving engines to plan over, one more axis: any of fastpp (default), sglang, vllm-v1, "
                        "vllm-v0 (pp = 1 only), each with its own knobs (--policies; --max-gpus: sim/studies/cluster_plan.py)")
    p.add_argument("--kernel-data", choices=("vidur", "aic"), default=None,
                   help="the kernel data of the profiles found by --gpu: vidur or aic (default: by the engine's era: aic "
                        "for sglang and vllm-v1 where the AIC library has the shape, vidur for fastpp and vllm-v0; "
                        "profiles/README.md)")
    p.add_argument("--moe-routing", choices=("balanced", "power_law_1.2"), default="balanced",
                   help="an MoE model's routing, i.e. which of its profiles (profiles/moe/): balanced (default) or "
                        "power_law_1.2, AIConfigurator's skew for Qwen3/Mixtral-style models")
    p.add_argument("--workload", default="azure-conv-synth", help="workload name or a workload TOML file")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="a CSV trace (Azure columns by default) replayed at its timestamps (scaled to --rate if given)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override as ppsim run takes it: workload.KEY, scheduler.KEY, latency.KEY or server.KEY "
                        "(not what the plan chooses: parallel.*, scheduler.engine, the chunk settings, the profile)")
    p.add_argument("--rate", type=float_in(0, 1e6, lo_open=True), default=None,
                   help="the load in req/s: simulate every candidate at it (default: rank by goodput)")
    p.add_argument("--concurrency", type=int_in(1, 10**6), default=None, metavar="N",
                   help="the load in users: N closed-loop clients, each sending its next request when its previous "
                        "one finishes (as vllm bench serve --max-concurrency N); simulate every candidate at N "
                        "and rank as at a rate; not with --rate or --trace")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC:pQ:MS",
                   help="an SLO at any percentile, e.g. ttft:p99:2000 (ttft, tpot, e2e); default P90 TTFT 2000, "
                        "P90 TPOT 200")
    p.add_argument("--slo-ttft-ms", type=float_in(0, 1e10, lo_open=True), default=2000.0, help="P90 TTFT SLO (ms) unless --slo ttft:... is given")
    p.add_argument("--slo-tpot-ms", type=float_in(0, 1e10, lo_open=True), default=200.0, help="P90 TPOT SLO (ms) unless --slo tpot:... is given")
    p.add_argument("--seeds", type=SEEDS, default=3, help="paired seeds per candidate (default 3)")
    p.add_argument("--price-per-gpu-hour", default=None, metavar="PRICE",
                   help="$ per GPU-hour, one number or per interconnect (pcie=1.6,nvlink=2.2)")
    p.add_argument("--replicate-within", type=float_in(0, 10), default=0.25,
                   help="rate mode: run the other seeds only for candidates whose first-seed margin is within this "
                        "of 0 or of the best (default 0.25)")
    p.add_argument("--prune-below", type=float_in(0, 1), default=0.5,
                   help="goodput mode: prune splits below this share of the best screen (default 0.5)")
    p.add_argument("--jobs", type=jobs, default=1)
    p.add_argument("--executor", default="process", help="process (default) or ray")
    p.add_argument("--address", default=None, help="Ray cluster address")
    p.add_argument("--verify", action="store_true",
                   help="re-simulate the recommended deployment (at the rate) and the three highest goodputs (at "
                        "theirs) with 10x the probe's requests (at least 5,000) and say whether each holds")
    p.add_argument("--quick", action="store_true", help="at most 150 requests (more where a rate needs them to span the 30 s probe window) and a "
                        "coarser search")
    p.add_argument("--out", default="runs/plan", help="output folder (default runs/plan)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the plan as JSON to PATH (a new file)")
    p.add_argument("--force", action="store_true", help="let --json replace an existing file")
    p.add_argument("--top", type=int_in(1, 100000), default=15, help="ranked candidates printed (default 15)")
    p.add_argument("--all", action="store_true", help="print every simulated candidate")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    from sim.outputs.context import describe_workload, format_header

    from sim.studies.concurrency_plan import check_flags

    check_flags(args)  # --concurrency with --rate or --trace: one line, before the output folder is claimed
    # refused before the candidates are simulated, not after
    out = fsio.claim(args.out, "plan")
    if args.json:
        fsio.check_new_file(args.json, args.force, "--json")

    if args.max_gpus is not None and args.gpus is not None:
        from sim.core.errors import ConfigError

        raise ConfigError("--gpus N ranks the deployments of exactly N GPUs; --max-gpus N finds the fewest up to N; "
                          "allowed: one of them")
    if args.interconnect is not None and (args.gpu or args.max_gpus):
        from sim.core.errors import ConfigError

        raise ConfigError(f"--interconnect {args.interconnect} picks one of the A100 profile families; with "
                          f"{'--gpu ' + args.gpu if args.gpu else '--max-gpus (which plans on --gpu)'} "
                          f"the GPU's own profiles fix it; allowed: --interconnect without --gpu and --max-gpus")
    from sim.studies.plan import plan_gpu

    gpu = plan_gpu(args)  # (the default GPU, or --gpu required: a one-line error naming the GPUs with profiles)
    # which policies were asked for (None: each engine's own set) and the --max-gpus default
    args.policies_asked = args.policies
    if args.policies is None:
        args.policies = ("static-512", "static-2048") if args.max_gpus else tuple(POLICIES)
    source, rate = describe_workload({"name": args.workload})
    if getattr(args, "trace", None):  # (the trace replayed, not the --workload default)
        source = f"trace {args.trace}"
    slo_text = slo_from_specs(args.slo, SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)).describe()
    from sim.workloads import resolve_workload

    # a conversation workload's rate starts sessions (each several requests): its --rate is sessions/s
    unit = "sessions/s" if resolve_workload({"name": args.workload})[0].get("kind") == "conversation" else "req/s"
    load = f"{args.rate:g} {unit} (Poisson)" if getattr(args, "rate", None) else f"goodput search (Poisson), {rate} in the workload file"
    if getattr(args, "trace", None):
        load = f"the trace's own timestamps ({args.trace})"
    if getattr(args, "concurrency", None) is not None:
        load = f"{args.concurrency} concurrent clients (closed loop; the achieved req/s is each candidate's)"
    gpus_text = (f"up to {args.max_gpus} ({gpu}, {args.gpus_per_node} per node, "
                 f"{args.network} between nodes); co-located and disaggregated, TP x PP per pool"
                 if args.max_gpus else f"{args.gpus or 4} ({gpu}); every TP x PP x replicas split"
                 + (f", placed on nodes of {args.gpus_per_node} ({args.network} between them)"
                    if (args.gpus or 4) > args.gpus_per_node else ""))
    from sim.studies.plan_candidates import moe_of

    if moe_of(args.plan_model) is not None:  # an MoE model: its expert-parallel layouts and routing too
        gpus_text = gpus_text.replace("TP x PP", "TP x EP x PP") + f"; MoE routing {args.moe_routing}"
    print(format_header({
        "model": str(args.plan_model) + (f" (--model-config {args.model_config})" if args.model_config else ""),
        "gpus": gpus_text,
        "chunk policy": _policies_text(args), "workload": source, "rate": load,
        "seed": f"1-{args.seeds} (paired)" if args.seeds > 1 else "1", "slo": slo_text,
    }), flush=True)
    df, meta = run_plan(args)
    for text in meta.get("workload_warnings", []):  # (heard once in run_plan; the runs' workers are silent)
        warn(text)
    for text in meta.get("kernel_data_notes", []):  # a current engine on Vidur's data: not what it would expect
        warn(text)
    for text in meta.get("kv_refused", []):  # (plan.csv: status dropped, with the reason)
        warn(text)
    mode, slo = meta["mode"], slo_from_specs(args.slo, SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms))
    fsio.write_frame(df, out / "plan.csv", index=False, float_format="%.6g")
    doc = {**meta, "candidates": [{k: _jsonable(v) for k, v in r.items()} for r in df.to_dict("records")]}
    text = json.dumps(doc, indent=1, default=str) + "\n"
    fsio.write_text(out / "plan.json", text)
    if args.json:
        fsio.write_text(args.json, text)
    plot_plan(df, "rate" if mode == "concurrency" else mode, meta["slo"], out / "plan.png",
              out_tokens=meta.get("output_tokens_per_request"), rate=meta.get("rate_rps"), rule=meta.get("rule"))
    if args.max_gpus:
        return _print_cluster(df, meta, args, out, slo)
    print(meta["load"] + f"; {meta['seeds']} paired seed(s); {meta['slo']}")
    for line in meta["interconnect_notes"]:
        print(line)
    nodes = ["nodes"] if "nodes" in df and (df["nodes"].fillna(1) > 1).any() else []
    if mode == "concurrency":  # ranked as at a rate; each candidate's own req/s at N clients
        cols = ["rank", "deployment", *nodes, "concurrency", "achieved_rps", *slo.keys(), "p99_e2e_ms",
                "slo_attainment", "kv_headroom", "margin", "cost_per_hour", "cost_per_million_at_rate",
                "goodput_clients", "goodput_rps", "cost_per_million_at_goodput", "meets_slo", "tied_with_best"]
    elif mode == "rate":
        cols = ["rank", "deployment", *nodes, *slo.keys(), "p99_e2e_ms", "slo_attainment", "kv_headroom", "margin",
                "cost_per_hour", "cost_per_million_at_rate", "goodput_rps", "cost_per_million_at_goodput", "meets_slo",
                "tied_with_best"]
    else:
        cols = ["rank", "deployment", *nodes, "goodput_rps", "goodput_ci_lo", "goodput_ci_hi", "cost_per_hour",
                "cost_per_million_at_goodput", *[f"{k}_at_80pct" for k in slo.keys()], "kv_headroom_at_80pct",
                "tied_with_best"]
    print(_rule_text(meta))
    shown = df[df["status"] == "ok"]
    if not args.all:
        shown = shown[shown["rank"].notna()].head(args.top)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(shown[[c for c in cols if c in df]].to_string(index=False, float_format=lambda v: f"{v:.3g}")
              if len(shown) else "(no candidate qualifies)")
    left = int((df["status"] == "ok").sum()) - len(shown)
    if left > 0:
        print(f"... {left} more simulated candidate(s) in {out}/plan.csv (--all prints them)")
    skipped = df[df["status"] != "ok"]
    if len(skipped):
        print("\nnot simulated:")
        for r in skipped.itertuples():
            print(f"  {r.deployment.replace(' -', '')}: {r.status}, {r.reason}")
    flagged = df[(df["warnings"] != "") & df["rank"].notna()]
    if len(flagged):
        print("\nwarnings:")
        for r in flagged.itertuples():
            print(f"  {r.deployment}: {r.warnings}")
    for line in _verify_lines(meta):
        print(line)
    print("\n" + meta["verdict"])
    fsio.write_text(out / "recommendation.txt", meta["verdict"] + "\n")
    fsio.write_text(out / "plan.txt", _plan_text(df, meta, cols))
    print(f"\nwrote {out}/plan.csv, plan.json, plan.png, plan.txt, recommendation.txt" + (f" and {args.json}" if args.json else ""))
    return 0


def _print_cluster(df, meta, args, out, slo) -> int:
    """The --max-gpus plan on the console: ranked candidates, what was pruned and why, the verdict."""
    print(meta["load"] + f"; {meta['seeds']} paired seed(s); {meta['slo']}")
    print(_rule_text(meta))
    cols = ["rank", "deployment", "mode", "gpus", "nodes", "concurrency", "achieved_rps", *slo.keys(), "margin",
            "margin_ci_lo", "margin_ci_hi",
            "cost_per_hour", "cost_per_million_at_rate", "goodput_clients", "goodput_rps", "cost_per_million_at_goodput",
            "mean_kv_transfer_ms", "tied_with_best"]
    shown = df[df["status"] == "ok"]
    if not args.all:
        shown = shown[shown["rank"].notna()].head(args.top)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(shown[[c for c in cols if c in df]].to_string(index=False, float_format=lambda v: f"{v:.3g}")
              if len(shown) else "(no candidate qualifies)")
    est = df[df["status"] == "estimated"]
    if len(est):
        print(f"\n{len(est)} more candidate(s) estimated from their screens, not simulated in full (candidates with "
              f"fewer GPUs were): in {out}/plan.csv")
    skipped = df[df["status"].isin(["pruned", "dropped"])]
    if len(skipped):
        print("\npruned or dropped, and why:")
        for r in skipped.itertuples():
            print(f"  {r.deployment}: {r.status}, {r.reason}")
    flagged = df[(df["warnings"] != "") & df["rank"].notna()]
    if len(flagged):
        print("\nwarnings:")
        for r in flagged.itertuples():
            print(f"  {r.deployment}: {r.warnings}")
    if meta.get("by_mode_and_nodes"):
        print("\nbest by mode and node count:")
        for line in meta["by_mode_and_nodes"]:
            print("  " + line)
    for line in _verify_lines(meta):
        print(line)
    print("\n" + meta["verdict"])
    fsio.write_text(out / "recommendation.txt", meta["verdict"] + "\n")
    fsio.write_text(out / "plan.txt", _plan_text(df, meta, cols))
    print(f"\nwrote {out}/plan.csv, plan.json, plan.png, plan.txt, recommendation.txt" + (f" and {args.json}" if args.json else ""))
    return 0

