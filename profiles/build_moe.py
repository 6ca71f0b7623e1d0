"""Build the MoE profile library, profiles/moe/, from the installed aiconfigurator-core (issue 44).

Usage (from the repository root; needs the optional extra: pip install -e '.[aic]'):

    python profiles/build_moe.py            # (re)write every profile under profiles/moe/
    python profiles/build_moe.py --check    # rebuild into a temporary folder and compare byte for byte; exit 1
                                            # listing the differing files

What it builds (sim/profiling/moe.py; format profiles/FORMAT.md, `[moe]`): for each GPU of `GPUS`, each MoE
model of profiles/models/ (a `[moe]` table), each weight dtype of `DTYPES` and each TP degree in {1, 2, 4, 8}
that divides the heads and the expert FFN and holds the weights on at most 8 GPUs, one profile with experts
sharded by TP and balanced routing in profiles/moe/<gpu>/vllm/<model>-<weights>-kv<kv>/tp<T>/ (and one at
AIConfigurator's skewed routing in <model>-<weights>-kv<kv>-power_law_1.2/tp<T>/, `ROUTINGS`), plus
profiles/moe/index.csv: one row per profile with its expert kernel and its roofline ratio.

Expert-parallel layouts (`EP_GPUS`, `EPS`; sim/core/ep.py): ep = tp, moe_tp = 1, attention TP-sharded, in
<model>-<weights>-kv<kv>[-power_law_1.2]/tp<T>-ep<T>/, from the table's (moe_tp 1, ep) rows.

The A100 (`A100_GPUS`, BF16) is built by `build_moe_profile_a100`: Vidur's A100 data for the dense parts, the
A100 MoE table of `sim.profiling.moe.A100_MOE_TABLE` (or Frontier's reduced table,
profiles/moe/sources/frontier_a100_mixtral_8x7b_moe.csv, where `FRONTIER_USED` says) for the experts, at the TPs
the table has rows for. `--check` leaves profiles/moe/README.md and profiles/moe/sources/ (inputs) alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from build_aic import compare  # noqa: E402
from sim.profiling.aic import SYSTEMS, AicData, package_version  # noqa: E402
from sim.profiling.build import TPS  # noqa: E402
from sim.profiling.moe import (A100_GPUS, A100_MOE_TABLE, FRONTIER_USED, MOE_DIR, a100_moe_table,  # noqa: E402
                               build_moe_profile, build_moe_profile_a100, moe_dir)
from sim.latency.hardware import load_gpu  # noqa: E402
from sim.profiling.specs import allowed_tps, fits_somewhere, load_model, model_names  # noqa: E402

GPUS = ("h100-sxm-80gb", "h200-sxm")
# BF16 only: the table's per-tensor FP8 MoE rows (vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts) are
# slower than their BF16 twins at the same shape (Qwen3-30B-A3B TP1 on H100: 1.9x at 1 token, 2.9x at 16, 1.7x at
# 4096; Mixtral alike at few tokens), 2.6-19x their roofline floor; suspect rows, not what FP8 buys. FP8 MoE
# profiles wait for a deployable FP8 kernel's rows (build_moe_profile(weight_dtype="fp8") still builds one).
DTYPES = (("bf16", "bf16"),)
ENGINE = "vllm"
INPUTS = ("README.md", "sources")       # files of profiles/moe/ that the build reads or documents, not writes
# Routings shipped (sim/latency/moe_routing.py): balanced, and the skewed power law AIConfigurator prices Mixtral-
# and Qwen3-style MoE models at by default (alpha 1.2, aiconfigurator_core sdk/models/moe.py `_power_law_alpha`),
# in sibling folders <model>-<weights>-kv<kv>-power_law_1.2/; a run picks one by its profile path. Not for the
# A100 (model, TP) pairs whose balanced curve is Frontier's (it has no skewed rows).
ROUTINGS = ("balanced", "power_law_1.2")
# Expert parallelism at data-parallel attention 1 (ep = tp; sim/core/ep.py), where AIConfigurator's vLLM table has
# (moe_tp 1, ep) rows for the model: the H100, EP 2, 4 and 8
EP_GPUS = ("h100-sxm-80gb",)
EPS = (2, 4, 8)
# (model, ep, routing) EP profiles not built, and why. Qwen3-235B-A22B ep 2 balanced fails `ppsim profile check`: its
# layer grows 1.555x from 4,096 to 8,192 tokens (bound 1.6x; the table's ep 2 rows flatten there). The others: the
# table's 1-token row is faster than the roofline floor of
# the busiest rank under the collector's power law as sim/latency/moe_routing.py draws it (7.3 of the 8 slots on
# one rank at 1 token, 37.7 MB per Qwen3-235B expert), so data_checks refuses them: 0.76x at ep 4, 0.60x at ep 8
# (aiconfigurator-core 0.12.0, h100_sxm vLLM 0.24.0 moe_perf). The balanced twins and ep 2 are built.
EP_NOT_BUILT = {("qwen3-235b-a22b", 2, "balanced"): "fails profile check: 1.555x growth from 4096 to 8192 tokens",
                ("qwen3-235b-a22b", 4, "power_law_1.2"): "1-token row 0.76x the busiest rank's roofline floor",
                ("qwen3-235b-a22b", 8, "power_law_1.2"): "1-token row 0.60x the busiest rank's roofline floor"}


def jobs():
    for g in GPUS:
        gpu = load_gpu(g)
        for m in model_names():
            model = load_model(m)
            if model.moe is None:
                continue
            for w, kv in DTYPES:
                sized = dataclasses.replace(model, dtype_bytes=1 if w == "fp8" else 2)
                for tp in allowed_tps(model, TPS):
                    if not model.moe.expert_intermediate_size % tp and fits_somewhere(sized, gpu, tp):
                        for dist in ROUTINGS:
                            yield gpu, model, w, kv, tp, dist, 1
    rows, _ = a100_moe_table()
    _, _, _, ks, md = A100_MOE_TABLE
    for g in A100_GPUS:
        gpu = load_gpu(g)
        for m in model_names():
            model = load_model(m)
            if model.moe is None:
                continue
            mo = model.moe
            shape = rows[(rows.kernel_source == ks) & (rows.moe_dtype == md) & (rows.hidden_size == model.hidden_size)
                         & (rows.inter_size == mo.expert_intermediate_size) & (rows.topk == mo.top_k)
                         & (rows.num_experts == mo.num_experts) & (rows.moe_ep_size == 1)]
            for tp in allowed_tps(model, TPS):
                if mo.expert_intermediate_size % tp or not fits_somewhere(model, gpu, tp):
                    continue
                for dist in ROUTINGS:
                    frontier = (model.name, tp) in FRONTIER_USED
                    if (dist == "balanced" and frontier) or (
                            not frontier and tp in set(shape[shape.distribution == dist].moe_tp_size.astype(int))):
                        yield gpu, model, "bf16", "bf16", tp, dist, 1
    yield from ep_jobs()


def ep_jobs():
    for g in EP_GPUS:
        gpu = load_gpu(g)
        for m in model_names():
            model = load_model(m)
            if model.moe is None:
                continue
            for w, kv in DTYPES:
                for ep in EPS:
                    if (ep in allowed_tps(model, TPS) and not model.moe.num_experts % ep
                            and fits_somewhere(model, gpu, ep)):
                        for dist in ROUTINGS:
                            if (model.name, ep, dist) not in EP_NOT_BUILT:
                                yield gpu, model, w, kv, ep, dist, ep


def build(root: Path) -> list[Path]:
    from tqdm import tqdm

    written, rows, data = [], [], {}
    for gpu, model, w, kv, tp, dist, ep in tqdm(list(jobs()), desc="build_moe", unit="profile"):
        out = moe_dir(root, gpu, ENGINE, model.name, w, kv, tp, dist, ep)
        if gpu.name in A100_GPUS:
            prof = build_moe_profile_a100(model, gpu, tp, out, distribution=dist, compact=True)
        else:
            aic = data.setdefault(gpu.name, AicData(SYSTEMS[gpu.name], ENGINE))
            prof = build_moe_profile(model, gpu, tp, out, engine=ENGINE, weight_dtype=w, kv_dtype=kv,
                                     distribution=dist, compact=True, aic=aic, ep=ep)
        p, fe = prof.meta["profile"], prof.meta["fit_errors"]
        rows.append(",".join([gpu.name, model.name, w, kv, str(tp), str(out.relative_to(root)), p["moe_kernel"],
                              p["moe_distribution"], f"{fe['moe_roofline_ratio_min']:.3f}", str(ep)]))
        written.append(out)
    header = "gpu,model,weight_dtype,kv_dtype,tp,folder,moe_kernel,distribution,moe_roofline_ratio_min,ep"
    (root / "index.csv").write_text(f"# aiconfigurator-core {package_version()}; python profiles/build_moe.py\n"
                                    + header + "\n" + "\n".join(rows) + "\n")
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare a fresh build with profiles/moe/")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp))
            diff = [d for d in compare(Path(tmp), MOE_DIR) if Path(d).parts[0] not in INPUTS]
        for d in diff:
            print(f"differs: profiles/moe/{d}")
        print(f"{len(diff)} differing files")
        return 1 if diff else 0
    written = build(MOE_DIR)
    print(f"wrote {len(written)} profiles under {MOE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
