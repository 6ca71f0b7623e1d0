"""The `profile` command group: show, check, plot, build, import-vidur, collect.

`add_commands(subparsers)` plugs the group into the main `ppsim` parser; each handler
raises `PipeSimError` for bad input (the main CLI prints it as one line and exits 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.core.errors import DataError, PipeSimError

RAW = argparse.RawDescriptionHelpFormatter
PROFILE = "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"

EPILOG_GROUP = f"""examples:
  ppsim profile build --model llama-3.1-8b --gpu h100-sxm-80gb --tp 2 --out /tmp/l8
  ppsim profile show {PROFILE} --pp 4
  ppsim profile check {PROFILE}
  ppsim profile plot {PROFILE} --out plots/
  ppsim profile import-vidur vidur/compute/a100/internlm/internlm-20b --model internlm.toml --out profiles/x
  ppsim profile collect --model qwen.toml --out profiles/mine --device cuda
"""

EPILOG_SHOW = f"""The split is for ONE stage of a PP=P pipeline: stage 1 (a middle stage: no embedding, no
LM head, but the activation send) when P > 1, stage 0 when P = 1; --stage picks another.
overhead_ms = the stage's own extras (embedding, sampling) + the per-iteration CPU overhead +
token broadcast, so total_ms is what one lock-step iteration costs when this stage is the
slowest. A prefill row is one prompt of that many tokens (no prefix); with --decode a row is
a decode micro-batch of that many requests at --context tokens each.

examples:
  ppsim profile show {PROFILE} --pp 4
  ppsim profile show {PROFILE} --pp 4 --tokens 96,128,160 --decode --context 1400
  ppsim profile show profiles/a100-pcie-40gb/qwen2.5-32b/tp4 --pp 1 --tokens 128,2048 --json
"""

EPILOG_PLOT = f"""Writes <out>/<name>-stage.png (stage time vs tokens: the step function, prefill and decode),
<out>/<name>-attention.png (per-layer prefill attention vs chunk at several prefixes, decode
attention vs batch at several contexts) and <out>/<name>-comm.png (PP send and TP all-reduce
vs tokens). <name> is the profile path joined with '-'.

examples:
  ppsim profile plot {PROFILE} --out plots/
  ppsim profile plot {PROFILE} --out plots/ --pp 2 --max-tokens 1024
"""

EPILOG_IMPORT = """DIR holds Vidur CSVs: mlp.csv (required), attention.csv (optional; else a roofline
estimate), all_reduce.csv / send_recv.csv (optional; or in --network). CONFIG is a TOML file:

  tp = 1
  [model]
  num_layers = 60
  hidden_size = 5120
  num_q_heads = 40
  num_kv_heads = 40
  head_dim = 128
  vocab_size = 103168
  intermediate_size = 13824
  [profile]          # optional: gpu, model (the id); gpu_spec (profiles/gpus/) and interconnect
                     #   (profiles/interconnects/) give it [roofline]: the physics floor and profile check
  [memory]           # optional: gpu_mem_gib, m_init_gib (default A100-80GB)
  [overhead]         # optional: terms Vidur does not simulate, added on top of the measured layers
  cpu_ms = 2.0       #   per iteration, scheduler CPU time on the critical path (default 2.0, assumed)
  lm_head_ms = 1.0   #   last stage, per iteration, split over TP (default 1.0, assumed)
  embedding_ms = 0.1 #   first stage (default 0.1, assumed)
  sample_ms = 0.2    #   last stage (default 0.2, assumed)
  broadcast_us = 30  #   token-id broadcast per iteration when PP > 1 (default 30, assumed)

Every overhead term is printed with its value and status (default / user-supplied / off).
--overhead key=value overrides one term (repeatable); --no-overheads sets all five to 0 for a
like-for-like comparison with Vidur (then --overhead can add single terms back).

examples:
  ppsim profile import-vidur ../shared/data/vidur-profiles/compute/a100/internlm/internlm-20b \\
      --network ../shared/data/vidur-profiles/network/a100_dgx --model internlm20b.toml --out /tmp/ilm
  ppsim profile import-vidur my-vidur-run/ --model llama.toml --out profiles/h100/llama/tp1
  ppsim profile import-vidur my-vidur-run/ --model llama.toml --out /tmp/v --no-overheads
  ppsim profile import-vidur my-vidur-run/ --model llama.toml --out /tmp/v --overhead cpu_ms=0 --overhead sample_ms=0.1
"""

EPILOG_COLLECT = """Times one layer's GEMMs over a token grid, prefill/decode attention with PyTorch SDPA
(fitted by least squares) and, with several CUDA GPUs, NCCL all-reduce and send/recv. Needs
PyTorch: pip install .[profile]. CONFIG is the same TOML as for import-vidur.

examples:
  ppsim profile collect --model qwen2.5-32b.toml --out profiles/h100/qwen2.5-32b/tp1 --device cuda
  ppsim profile collect --model tiny.toml --out /tmp/tiny --device cpu --quick
"""


def _tokens(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PipeSimError(f"--tokens {text!r}: expected comma-separated integers, e.g. 96,128,256") from None
    if not vals or any(v < 1 for v in vals):
        raise PipeSimError(f"--tokens {text!r}: token counts must be integers >= 1")
    return vals


def _profile_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "meta.toml").is_file():
        from sim.core.config import REPO_ROOT

        if (REPO_ROOT / p / "meta.toml").is_file():
            return REPO_ROOT / p
        raise DataError(f"{p}: not a profile directory (meta.toml missing)")
    return p


def show_rows(profile: str | Path, pp: int, tokens: list[int], decode: bool = False, context: int = 1400,
              stage: int | None = None) -> list[dict]:
    from sim.latency.analysis import load_model, split_ms
    from sim.latency.base import BatchStats

    if context < 1:
        raise PipeSimError(f"--context must be >= 1, got {context}")
    model = load_model(_profile_dir(str(profile)), pp)
    rows = []
    for t in tokens:
        st = BatchStats.decode(t, context) if decode else BatchStats.prefill(t)
        rows.append(split_ms(model, st, stage))
    return rows


def cmd_show(args) -> int:
    rows = show_rows(args.profile, args.pp, _tokens(args.tokens), args.decode, args.context, args.stage)
    if args.json:
        print(json.dumps([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
                         indent=2))
        return 0
    from sim.latency.analysis import default_stage

    stage = default_stage(args.pp) if args.stage is None else args.stage
    what = f"decode at context {args.context}" if args.decode else "prefill"
    print(f"{args.profile}: PP={args.pp}, stage {stage}, {what} (ms)")
    head = ("requests" if args.decode else "tokens", "linear", "attention", "comm", "overhead", "total")
    print("{:>9} {:>9} {:>10} {:>8} {:>9} {:>9}".format(*head))
    for r in rows:
        print(f"{r['tokens']:>9} {r['linear_ms']:>9.2f} {r['attention_ms']:>10.2f} {r['comm_ms']:>8.2f} "
              f"{r['overhead_ms']:>9.2f} {r['total_ms']:>9.2f}")
    return 0


def plot_profile(profile: str | Path, out: str | Path, pp: int = 4, max_tokens: int = 4096) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from sim.core import fsio
    from sim.latency.analysis import load_model, split_ms
    from sim.latency.base import BatchStats

    pdir = _profile_dir(str(profile))
    if max_tokens < 2:
        raise PipeSimError(f"--max-tokens must be >= 2, got {max_tokens}")
    model = load_model(pdir, pp)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = "-".join(Path(profile).parts[-3:]).replace("/", "-")
    files = []

    toks = np.arange(1, max_tokens + 1)
    pre = [split_ms(model, BatchStats.prefill(int(t)))["total_ms"] for t in toks]
    dec = [split_ms(model, BatchStats.decode(int(t), 1400))["total_ms"] for t in toks]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.step(toks, pre, where="post", label="prefill (no prefix)")
    ax.step(toks, dec, where="post", label="decode requests, context 1400")
    for b in range(128, max_tokens + 1, 128):
        ax.axvline(b, color="0.9", lw=0.5, zorder=0)
    ax.set_xlabel("tokens in the micro-batch")
    ax.set_ylabel("iteration time of the stage (ms)")
    ax.set_title(f"{'/'.join(Path(profile).parts[-3:])}, PP={pp}, stage {min(1, pp - 1)} (mode {model.mode})")
    ax.legend()
    fig.tight_layout()
    files.append(out / f"{name}-stage.png")
    fsio.save_figure(fig, files[-1], dpi=120)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    chunks = np.arange(16, max_tokens + 1, 16)
    for p in (0, 1024, 4096, 8192):
        a1.plot(chunks, [model.attention_s(BatchStats.prefill(int(c), p)) * 1e3 for c in chunks], label=f"prefix {p}")
    a1.set_xlabel("prefill chunk (tokens)")
    a1.set_ylabel("attention per layer (ms, scaled)")
    a1.legend()
    batches = np.arange(1, 257)
    for ctx in (256, 1024, 4096):
        a2.plot(batches, [model.attention_s(BatchStats.decode(int(b), ctx)) * 1e3 for b in batches],
                label=f"context {ctx}")
    a2.set_xlabel("decode requests")
    a2.legend()
    fig.suptitle("attention model")
    fig.tight_layout()
    files.append(out / f"{name}-attention.png")
    fsio.save_figure(fig, files[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    ctoks = np.unique(np.geomspace(1, max_tokens, 200).astype(int))
    ax.loglog(ctoks, [model.p2p_s(int(t)) * 1e3 for t in ctoks], label="PP activation send")
    if model.tp > 1:
        ax.loglog(ctoks, [model.allreduce_s(int(t)) * 1e3 for t in ctoks], label=f"all-reduce (tp {model.tp})")
        ax.loglog(ctoks, [2 * model.shape.num_layers * model.allreduce_s(int(t)) * 1e3 for t in ctoks],
                  label="all-reduces per forward")
    ax.set_xlabel("tokens")
    ax.set_ylabel("ms")
    ax.set_title(f"communication ({model.comm_model})")
    ax.legend()
    fig.tight_layout()
    files.append(out / f"{name}-comm.png")
    fsio.save_figure(fig, files[-1], dpi=120)
    plt.close(fig)
    return files


# Profiles PipeSim writes (`profile build`, `import-vidur`, `collect`): `--force` may replace them.
# Any other profile (the hand-calibrated ones it ships) is never replaced. The first word of
# `[profile] source` counts ("imported (ppsim profile import-vidur)" is "imported").
WRITABLE_SOURCES = ("built", "imported", "collected")


def profile_out(out: str, force: bool, flag: str = "--out") -> str:
    """A profile folder a command may write: new or empty, or (with `force`) one holding a
    profile PipeSim built, imported or collected and nothing else; never the project's root, a
    folder of other files or a calibrated profile PipeSim ships. The writers replace the folder
    whole, after success (sim.profiling.profile_io.write_profile, sim.profiling.build)."""
    from sim.core import fsio
    from sim.core.errors import ConfigError
    from sim.core.tomlio import read_toml
    from sim.studies.inputs import PROFILE_FILES

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {out}: exists and is not a folder")
    why = fsio._protected(path) if path.exists() else None
    if why:
        raise ConfigError(f"{flag} {out}: is {why}; allowed: a new or empty folder")
    if path.is_dir() and any(path.iterdir()):
        meta = path / "meta.toml"
        if not meta.is_file():
            raise ConfigError(f"{flag} {out}: a folder of other files (no meta.toml); allowed: a new or empty folder")
        source = str(read_toml(meta, ConfigError).get("profile", {}).get("source", ""))
        if source.split(" ", 1)[0] not in WRITABLE_SOURCES:
            raise ConfigError(f"{flag} {out}: holds a profile PipeSim did not build (source {source!r}, e.g. a "
                              f"calibrated one it ships); allowed: a new or empty folder")
        # The new profile replaces the folder whole: other files in it would be lost, so refuse.
        foreign = sorted(p.name for p in path.iterdir() if p.name not in PROFILE_FILES)
        if foreign:
            raise ConfigError(f"{flag} {out}: holds files that are not a profile's ({', '.join(foreign[:3])}"
                              f"{', ...' if len(foreign) > 3 else ''}); allowed: a new or empty folder, or one "
                              f"holding only a profile PipeSim wrote (with --force)")
        source = source.split(" ", 1)[0]
        if not force:
            raise ConfigError(f"{flag} {out}: holds a profile PipeSim {source}; add --force to replace it, or choose a new folder")
    return out


def cmd_plot(args) -> int:
    from sim.core import fsio

    fsio.claim(args.out, "plots")
    for f in plot_profile(args.profile, args.out, args.pp, args.max_tokens):
        print(f)
    return 0


def cmd_import_vidur(args) -> int:
    from sim.profiling.vidur_import import import_vidur, parse_overrides

    profile_out(args.out, args.force)
    prof, report = import_vidur(args.dir, args.model, args.out, network=args.network,
                                overrides=parse_overrides(args.overhead), no_overheads=args.no_overheads)
    print("\n".join(report))
    _print_check(prof)
    return 0


def _print_check(prof) -> None:
    """The physics check of a profile just written (`profile check`), when it has GPU bounds."""
    if prof.bounds() is None:
        print("  physics: no [roofline] (give [profile] gpu_spec in the model config to check and floor it)")
        return
    from sim.latency.physics import check_profile, summary_line

    rep = check_profile(prof)
    print("  physics: " + summary_line(rep))
    for p in rep.problems[:10]:
        print(p.line("    "))
    if len(rep.problems) > 10:
        print(f"    ... {len(rep.problems) - 10} more (ppsim profile check {prof.path})")


def cmd_collect(args) -> int:
    from sim.profiling.collect import collect

    profile_out(args.out, args.force)
    collect(args.model, args.out, device=args.device, quick=args.quick)
    return 0


EPILOG_BUILD = """Builds a profile in the format of profiles/FORMAT.md from the kernel cost model of the GPU's
kernel-data family (profiles/kernels/, fitted offline from Vidur's measured kernels by
profiles/build_kernels.py), the model's architecture and the interconnect's alpha-beta model.
Nothing is downloaded. meta.toml says source = "built", names the data files and records the fit
errors; attention on GPUs without attention data of their own (h100, a40) is marked "scaled".

models:        profiles/models/<name>.toml, or --model-config PATH (a Hugging Face config.json of a
               dense Llama/Qwen/Mistral-style model; MoE and missing fields are refused)
GPUs:          profiles/gpus/<name>.toml
interconnects: profiles/interconnects/<name>.toml (default: the GPU's default_interconnect)

--all writes profiles/built/<gpu>[-<ic>]/<model>/tp<T>/ for every shipped model x GPU x TP in
{1, 2, 4, 8} that divides the heads and fits in memory on at most 8 GPUs.

--data aic builds from AIConfigurator's measured kernel database instead (the optional extra
pipesim[aic], package aiconfigurator-core; read offline from its installed files): GEMMs, attention
and the engine's all-reduce choice measured on the GPU itself (h100-sxm-80gb, h200-sxm, b200-sxm),
for one engine and version (--engine vllm: vLLM 0.24.0, the default; sglang: SGLang 0.5.14), with
--weight-dtype bf16|fp8 (the GEMM kernels and the bytes of the linear layers' weights) and
--kv-dtype bf16|fp8 (the attention kernels and the KV cache's bytes). meta.toml records the package
version, system, engine, kernels and dtypes.
The shipped AIC library is profiles/aic/ (python profiles/build_aic.py).

examples:
  ppsim profile build --model qwen2.5-32b --gpu a100-pcie-40gb --tp 1 --out /tmp/q32
  ppsim profile build --model-config my-model/config.json --gpu h100-sxm-80gb --tp 2 --out /tmp/mine
  ppsim profile build --model llama-3.1-70b --gpu a40-48gb --interconnect pcie-p2p-disabled --tp 8 --out /tmp/l70
  ppsim profile build --all
  ppsim profile build --data aic --model llama-3.1-70b --gpu h200-sxm --tp 4 --weight-dtype fp8 --kv-dtype fp8 --out /tmp/l70
"""


def cmd_build(args) -> int:
    from sim.profiling.build import BUILT_DIR, build_all, build_profile, resolve_model
    from sim.latency.hardware import load_gpu, load_interconnect

    if args.data != "aic" and (args.engine or args.weight_dtype or args.kv_dtype):
        raise PipeSimError("profile build: --engine, --weight-dtype and --kv-dtype need --data aic (the vidur "
                           "data is BF16 only)")
    if args.all:
        if args.model or args.model_config or args.gpu or args.out:
            raise PipeSimError("profile build --all: takes no --model/--model-config/--gpu/--out")
        if args.data == "aic":
            raise PipeSimError("profile build --all --data aic: the AIC library is built by python profiles/build_aic.py")
        written = build_all(Path(args.root) if args.root else BUILT_DIR)
        print(f"wrote {len(written)} profiles under {args.root or BUILT_DIR}")
        return 0
    for flag, val in (("--gpu", args.gpu), ("--out", args.out), ("--tp", args.tp)):
        if val is None:
            raise PipeSimError(f"profile build: {flag} is required (or --all)")
    profile_out(args.out, args.force)
    model = resolve_model(args.model, args.model_config)
    if args.name:
        from dataclasses import replace

        model = replace(model, name=args.name)
    gpu = load_gpu(args.gpu)
    if args.data == "aic":
        from sim.profiling.aic import build_aic_profile
        from sim.profiling.moe import build_moe_profile

        if args.interconnect and args.interconnect != gpu.default_interconnect:
            raise PipeSimError(f"profile build --data aic: --interconnect {args.interconnect!r}: the AIC tables are "
                               f"measured on one {gpu.default_interconnect} node; allowed: {gpu.default_interconnect}")
        # an MoE model: its experts from AIConfigurator's MoE tables (sim/profiling/moe.py, experts sharded by TP)
        build = build_moe_profile if model.moe is not None else build_aic_profile
        if args.ep is not None and model.moe is None:
            raise PipeSimError(f"profile build --ep {args.ep}: {model.name} is not a mixture-of-experts model")
        extra = {"ep": args.ep} if args.ep is not None else {}
        prof = build(model, gpu, args.tp, args.out, engine=args.engine or "vllm",
                     weight_dtype=args.weight_dtype or "bf16", kv_dtype=args.kv_dtype or "bf16", **extra)
        p, fe = prof.meta["profile"], prof.meta["fit_errors"]
        print(f"wrote {args.out}: {model.name} on {gpu.display}, TP{args.tp}; {p['data_source']}")
        print(f"  GEMMs measured: {', '.join(fe['gemm_measured_ops']) or 'none'}; interpolated: "
              f"{', '.join(fe['gemm_interpolated_ops']) or 'none'}; attention fit median / P90 error: prefill "
              f"{fe['attention_prefill_median_rel_err']:.1%} / {fe['attention_prefill_p90_rel_err']:.1%}, decode "
              f"{fe['attention_decode_median_rel_err']:.1%} / {fe['attention_decode_p90_rel_err']:.1%}")
        print(f"  suspect rows: {prof.meta['derivation']['suspect_rows']}")
        if "moe_checks" in prof.meta["derivation"]:
            print(f"  MoE: {prof.meta['derivation']['moe_checks']}")
        _print_check(prof)
        return 0
    if args.ep is not None:
        raise PipeSimError(f"profile build --ep {args.ep}: expert parallelism is built from AIConfigurator's "
                           f"tables; allowed: with --data aic")
    if gpu.kernel_data == "aic":
        raise PipeSimError(f"profile build --gpu {gpu.name}: no Vidur kernel data for this GPU; allowed: --data aic")
    ic = load_interconnect(args.interconnect or gpu.default_interconnect)
    prof = build_profile(model, gpu, ic, args.tp, args.out, physics=True)
    p = prof.meta["profile"]
    print(f"wrote {args.out}: {model.name} on {gpu.display} ({ic.name}), TP{args.tp}; {p['data_source']}")
    fe = prof.meta["fit_errors"]
    print(f"  GEMMs measured: {', '.join(fe['gemm_measured_ops']) or 'none'}; predicted: "
          f"{', '.join(fe['gemm_predicted_ops']) or 'none'} (leave-one-model-out error of the "
          f"{p['kernel_data']} data: median {fe['gemm_loo_median_rel_err']:.1%}, P90 {fe['gemm_loo_p90_rel_err']:.1%} "
          f"per GEMM; median {fe.get('gemm_layer_loo_median_rel_err', float('nan')):.1%}, "
          f"P90 {fe.get('gemm_layer_loo_p90_rel_err', float('nan')):.1%} per layer)")
    _print_check(prof)
    return 0


EPILOG_CHECK = """Checks that a profile obeys the hardware's physics at every size up to the model's context length
([model] context_length_tokens), on the GPU of its [roofline] section (profiles/FORMAT.md):

- the run-time model (scaled tables, their extrapolation, the roofline floor): achieved TFLOP/s and MFU
  of prefill per token count, HBM bandwidth utilisation of decode, link utilisation of communication, per
  part (linear layers, attention, LM head, communication); a violation is a part above 90% of the dense
  BF16 peak, 100% of the HBM bandwidth or 100% of the link bandwidth, or non-attention time that grows
  less than 1.6x from n to 2n tokens (n >= 4096);
- the data: a table point, fit or constant faster than the roofline of the GPU it was measured on.

Prints one line per problem, then the table (or one summary line per profile with --all); exits 1 when
there is any problem, 0 otherwise. Notes (not problems) name the parts where the run uses the floor.

examples:
  ppsim profile check profiles/a100-pcie-40gb/qwen2.5-32b/tp1
  ppsim profile check profiles/built/a100-sxm-80gb/llama-3.1-8b/tp1 --max-tokens 32768
  ppsim profile check --all
  ppsim profile check my-profile --gpu h100-sxm-80gb --interconnect nvswitch   # a profile without [roofline]
"""


def shipped_profile_dirs() -> list[Path]:
    """Every shipped profile: profiles/<gpu>/<model>/tp<T>/ and profiles/built/**/tp<T>/."""
    from sim.latency.hardware import PROFILES

    return sorted(p.parent for p in PROFILES.rglob("meta.toml") if p.parent.name.startswith("tp"))


def _check_one(path: Path, args):
    from sim.latency.physics import check_profile, with_roofline
    from sim.latency.profiled import Profile

    prof = Profile.load(path)
    if args.gpu:
        from sim.latency.hardware import load_gpu, load_interconnect
        from sim.profiling.specs import roofline_section

        gpu = load_gpu(args.gpu)
        ic = load_interconnect(args.interconnect or gpu.default_interconnect)
        prof = with_roofline(prof, roofline_section(gpu, ic, gpu.kernel_data))
    return check_profile(prof, max_tokens=args.max_tokens)


def cmd_check(args) -> int:
    from sim.latency.physics import fmt_table, summary_line

    if args.max_tokens is not None and args.max_tokens < 1:
        raise PipeSimError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.all == bool(args.profile):
        raise PipeSimError("profile check: give one PROFILE_DIR or --all")
    dirs = shipped_profile_dirs() if args.all else [_profile_dir(args.profile)]
    reports = [_check_one(d, args) for d in dirs]
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=1))
    elif args.all:
        from sim.latency.physics import tp_scaling_flags

        for r in reports:
            print(summary_line(r))
            for p in r.problems:
                print(p.line("  "))
            for s in r.slow:
                print("  " + s)
        flags = tp_scaling_flags(dirs)
        for s in flags:
            print(s)
        bad = sum(not r.ok for r in reports)
        slow = sum(bool(r.slow) for r in reports)
        print(f"{len(reports)} profiles checked up to their context length; {bad} with problems"
              + (f" ({slow} with slow rows, {len(flags)} TP groups flagged: flags, not problems)"
                 if slow or flags else ""))
    else:
        r = reports[0]
        for p in r.problems:
            print(p.line(f"{r.profile}: "))
        print(summary_line(r))
        print(f"  GPU {r.bounds.describe()}; tables measured on {r.base.describe()}; {r.context_note}")
        for n in r.notes:
            print(f"  note: {n}")
        for s in r.slow:
            print(f"  {s}")
        print("\n".join(fmt_table(r)))
    return 0 if all(r.ok for r in reports) else 1


def _pp(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def add_commands(subparsers) -> None:
    grp = subparsers.add_parser("profile", help="inspect, plot, import or measure latency profiles",
                                epilog=EPILOG_GROUP, formatter_class=RAW)
    sub = grp.add_subparsers(dest="profile_command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("show", help="per-stage time split for prefill or decode micro-batches",
                       epilog=EPILOG_SHOW, formatter_class=RAW)
    p.add_argument("profile", metavar="PROFILE_DIR")
    p.add_argument("--pp", type=_pp, default=4, help="pipeline stages (default 4)")
    p.add_argument("--stage", type=int, default=None, help="stage to report (default 1 if pp > 1, else 0)")
    p.add_argument("--tokens", default="96,128,129,160,256,2048",
                   help="comma-separated token counts (requests with --decode); default %(default)s")
    p.add_argument("--decode", action="store_true", help="decode micro-batches of N requests instead of prefill")
    p.add_argument("--context", type=int, default=1400, help="context per decode request (default 1400)")
    p.add_argument("--json", action="store_true", help="print a JSON list (tokens, linear_ms, attention_ms, "
                   "comm_ms, overhead_ms, total_ms)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("check", help="physical bounds: MFU, HBM and link utilisation up to the context length",
                       epilog=EPILOG_CHECK, formatter_class=RAW)
    p.add_argument("profile", metavar="PROFILE_DIR", nargs="?", default=None)
    p.add_argument("--all", action="store_true", help="every shipped profile (profiles/<gpu>/..., profiles/built/...)")
    p.add_argument("--max-tokens", type=int, default=None, help="check up to this many tokens (default: the "
                   "model's context length)")
    p.add_argument("--gpu", default=None, help="check against a GPU of profiles/gpus/ instead of [roofline]")
    p.add_argument("--interconnect", default=None, metavar="IC", help="with --gpu: an interconnect of "
                   "profiles/interconnects/ (default: the GPU's)")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plot", help="PNG plots: step function, attention, communication",
                       epilog=EPILOG_PLOT, formatter_class=RAW)
    p.add_argument("profile", metavar="PROFILE_DIR")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--pp", type=_pp, default=4, help="pipeline stages (default 4)")
    p.add_argument("--max-tokens", type=int, default=4096, help="x-axis end (default 4096)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("import-vidur", help="convert Vidur profiling CSVs into a PipeSim profile",
                       epilog=EPILOG_IMPORT, formatter_class=RAW)
    p.add_argument("dir", metavar="DIR", help="folder with mlp.csv (and attention.csv, network CSVs)")
    p.add_argument("--model", required=True, metavar="CONFIG", help="model TOML ([model] of FORMAT.md + tp)")
    p.add_argument("--network", default=None, metavar="NETDIR", help="folder with all_reduce.csv/send_recv.csv")
    p.add_argument("--out", required=True, help="profile directory to write")
    p.add_argument("--overhead", action="append", default=[], metavar="KEY=VALUE",
                   help="set one [overhead] term (cpu_ms, lm_head_ms, embedding_ms, sample_ms, broadcast_us); "
                   "repeatable")
    p.add_argument("--no-overheads", action="store_true", help="set every [overhead] term to 0 (Vidur has none)")
    p.add_argument("--force", action="store_true", help="replace a profile PipeSim built, imported or collected in --out")
    p.set_defaults(func=cmd_import_vidur)

    p = sub.add_parser("build", help="build a profile for any dense model on a GPU from shipped kernel data",
                       epilog=EPILOG_BUILD, formatter_class=RAW)
    p.add_argument("--model", default=None, metavar="NAME", help="a model of profiles/models/")
    p.add_argument("--model-config", default=None, metavar="PATH", help="a Hugging Face config.json (offline)")
    p.add_argument("--name", default=None, help="model id written into meta.toml (default: NAME or the "
                   "config.json's folder name)")
    p.add_argument("--gpu", default=None, help="a GPU of profiles/gpus/")
    p.add_argument("--interconnect", default=None, metavar="IC", help="an interconnect of "
                   "profiles/interconnects/ (default: the GPU's)")
    p.add_argument("--tp", type=_pp, default=None, help="tensor-parallel degree of the profile")
    p.add_argument("--ep", type=_pp, default=None, help="--data aic, an MoE model: expert-parallel size, 1 "
                   "(experts sharded by TP, default) or --tp (sim/core/ep.py)")
    p.add_argument("--out", default=None, help="profile directory to write")
    p.add_argument("--all", action="store_true", help="rebuild the shipped library profiles/built/")
    p.add_argument("--data", choices=("vidur", "aic"), default="vidur", help="kernel-data source: vidur (the "
                   "shipped kernel models, default) or aic (AIConfigurator's database, extra pipesim[aic])")
    p.add_argument("--engine", choices=("vllm", "sglang"), default=None, help="--data aic: the engine whose "
                   "tables and all-reduce choice are used: vllm (0.24.0, default) or sglang (0.5.14)")
    p.add_argument("--weight-dtype", choices=("bf16", "fp8"), default=None, help="--data aic: the linear "
                   "layers' weights (default bf16)")
    p.add_argument("--kv-dtype", choices=("bf16", "fp8"), default=None, help="--data aic: the KV cache "
                   "(default bf16)")
    p.add_argument("--force", action="store_true", help="replace a profile PipeSim built, imported or collected in --out")
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("collect", help="measure a profile with PyTorch (optional extra 'profile')",
                       epilog=EPILOG_COLLECT, formatter_class=RAW)
    p.add_argument("--model", required=True, metavar="CONFIG", help="model TOML ([model] of FORMAT.md + tp)")
    p.add_argument("--out", required=True, help="profile directory to write")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda", help="device to time (default cuda)")
    p.add_argument("--quick", action="store_true", help="tiny grids (smoke test)")
    p.add_argument("--force", action="store_true", help="replace a profile PipeSim built, imported or collected in --out")
    p.set_defaults(func=cmd_collect)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ppsim", formatter_class=RAW)
    add_commands(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PipeSimError as exc:
        print(f"ppsim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
