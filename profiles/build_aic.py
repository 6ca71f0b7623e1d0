"""Build the AIConfigurator-derived profile library, profiles/aic/, from the installed aiconfigurator-core.

Usage (from the repository root; needs the optional extra: pip install -e '.[aic]'):

    python profiles/build_aic.py            # (re)write every profile under profiles/aic/
    python profiles/build_aic.py --check    # rebuild into a temporary folder and compare byte for byte; exit 1
                                            # listing the differing files

What it builds (sim/profiling/aic.py; format profiles/FORMAT.md): for each GPU of `GPUS`, each shipped model
(profiles/models/), each (weight dtype, KV dtype) of `DTYPES` and each TP degree in {1, 2, 4, 8} that divides
the heads and holds the weights on at most 8 GPUs, one profile in
profiles/aic/<gpu>/<engine>/<model>-<weights>-kv<kv>/tp<T>/ (compact layer table, attention fit, comm.csv of
the engine's all-reduce choice), plus profiles/aic/index.csv: one row per profile with its data source, fit
errors and the suspect FP8 rows it found.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.profiling.aic import AIC_DIR, SYSTEMS, AicData, aic_dir, build_aic_profile, package_version  # noqa: E402
from sim.profiling.build import TPS  # noqa: E402
from sim.latency.hardware import load_gpu  # noqa: E402
from sim.profiling.specs import allowed_tps, fits_somewhere, load_model, model_names  # noqa: E402

GPUS = ("h100-sxm-80gb", "h200-sxm", "b200-sxm")
DTYPES = (("bf16", "bf16"), ("fp8", "fp8"))
ENGINE = "vllm"


def jobs():
    for g in GPUS:
        gpu = load_gpu(g)
        for m in model_names():
            model = load_model(m)
            if model.moe is not None:     # MoE models: profiles/build_moe.py
                continue
            for w, kv in DTYPES:
                sized = dataclasses.replace(model, dtype_bytes=1 if w == "fp8" else 2)
                for tp in allowed_tps(model, TPS):
                    if fits_somewhere(sized, gpu, tp):
                        yield gpu, model, w, kv, tp


def build(root: Path) -> list[Path]:
    from tqdm import tqdm

    written, rows, data = [], [], {}
    todo = list(jobs())
    for gpu, model, w, kv, tp in tqdm(todo, desc="build_aic", unit="profile"):
        aic = data.setdefault(gpu.name, AicData(SYSTEMS[gpu.name], ENGINE))
        out = aic_dir(root, gpu, ENGINE, model.name, w, kv, tp)
        prof = build_aic_profile(model, gpu, tp, out, engine=ENGINE, weight_dtype=w, kv_dtype=kv, compact=True,
                                 aic=aic)
        fe, d = prof.meta["fit_errors"], prof.meta["derivation"]
        rows.append(",".join([gpu.name, model.name, w, kv, str(tp), str(out.relative_to(root)),
                              f"{fe['attention_prefill_median_rel_err']:.3f}", f"{fe['attention_prefill_p90_rel_err']:.3f}",
                              f"{fe['attention_decode_median_rel_err']:.3f}", f"{fe['attention_decode_p90_rel_err']:.3f}",
                              " ".join(fe["gemm_interpolated_ops"]) or "-",
                              d["suspect_rows"].split(" (")[0].split(";")[0].replace(",", "")]))
        written.append(out)
    header = ("gpu,model,weight_dtype,kv_dtype,tp,folder,attention_prefill_median_rel_err,attention_prefill_p90_rel_err,"
              "attention_decode_median_rel_err,attention_decode_p90_rel_err,gemm_interpolated_ops,suspect_fp8_rows")
    (root / "index.csv").write_text(f"# aiconfigurator-core {package_version()}; python profiles/build_aic.py\n"
                                    + header + "\n" + "\n".join(rows) + "\n")
    return written


def compare(a: Path, b: Path) -> list[str]:
    diff = []
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    for rel in sorted(files_a | files_b):
        if rel not in files_a or rel not in files_b or not filecmp.cmp(a / rel, b / rel, shallow=False):
            diff.append(str(rel))
    return diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare a fresh build with profiles/aic/")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp))
            diff = compare(Path(tmp), AIC_DIR)
        for d in diff:
            print(f"differs: profiles/aic/{d}")
        print(f"{len(diff)} differing files")
        return 1 if diff else 0
    written = build(AIC_DIR)
    print(f"wrote {len(written)} profiles under {AIC_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
