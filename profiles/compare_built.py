"""Compare built profiles with the shipped hand-built (calibrated) ones; write the table into README.md.

Usage (from the repository root):

    python profiles/compare_built.py            # build into a temporary folder, compare, rewrite the README section
    python profiles/compare_built.py --no-write # print only

For Qwen2.5-32B and -14B on a100-pcie-40gb at TP 1, 2, 4: `ppsim profile build` output against
`profiles/a100-pcie-40gb/<model>/tp<T>/` (both carry the calibrated lookup mode, s_mem, s_comp, cpu_ms
and all-reduce bandwidth of profiles/fits*.toml). Compared: the stage time of a PP=1 run (the whole
model on one TP group: every layer, all-reduces, LM head, sampling) for prefills of every grid token
count 1..2048 and decode micro-batches of 1..256 requests at contexts 1024, 2048 and 4096.
`compare()` is also what tests/test_profile_build.py guards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sim.latency.base import BatchStats  # noqa: E402
from sim.profiling.build import build_profile  # noqa: E402
from sim.latency.profiled import Profile, ProfiledLatencyModel  # noqa: E402
from sim.latency.hardware import load_gpu, load_interconnect  # noqa: E402
from sim.profiling.specs import load_model  # noqa: E402

MODELS = ("qwen2.5-32b", "qwen2.5-14b")
TPS = (1, 2, 4)
GPU = "a100-pcie-40gb"
CONTEXTS = (1024, 2048, 4096)
TOLERANCE = 0.10


def batches(model: ProfiledLatencyModel) -> list[tuple[str, BatchStats]]:
    grid = [int(t) for t in model.profile.grid if t <= 2048]
    out = [("prefill", BatchStats.prefill(t)) for t in grid]
    out += [(f"decode ctx {c}", BatchStats.decode(b, c)) for c in CONTEXTS for b in range(1, 257)]
    return out


def compare_one(built: Path, hand: Path) -> pd.DataFrame:
    mb = ProfiledLatencyModel(Profile.load(built), 1)
    mh = ProfiledLatencyModel(Profile.load(hand), 1)
    rows = []
    for kind, st in batches(mh):
        sb, sh = mb.stage_time(st, 0), mh.stage_time(st, 0)
        cb, ch = sb.linear_s + sb.attention_s, sh.linear_s + sh.attention_s
        rows.append((kind.split()[0], kind, st.num_tokens, sb.total_s * 1e3, sh.total_s * 1e3,
                     sb.total_s / sh.total_s - 1, cb / ch - 1))
    return pd.DataFrame(rows, columns=["kind", "case", "tokens", "built_ms", "hand_ms", "rel_err", "compute_rel_err"])


def compare(root: Path) -> pd.DataFrame:
    """Build every compared profile under `root` and return one row per (model, tp, case)."""
    gpu = load_gpu(GPU)
    ic = load_interconnect(gpu.default_interconnect)
    parts = []
    for m in MODELS:
        arch = load_model(m)
        for tp in TPS:
            out = root / m / f"tp{tp}"
            build_profile(arch, gpu, ic, tp, out)
            df = compare_one(out, REPO / "profiles" / GPU / m / f"tp{tp}")
            parts.append(df.assign(model=m, tp=tp))
    return pd.concat(parts, ignore_index=True)


def markdown(df: pd.DataFrame) -> str:
    lines = ["| model | TP | prefill median / P90 / max \\|error\\| | worst prefill (tokens: built / hand-built ms) | "
             "decode median / P90 / max \\|error\\| | worst decode (requests, context: built / hand-built ms) | "
             "compute only (layers + attention + LM head): max \\|error\\| |",
             "|---|---|---|---|---|---|---|"]
    for (m, tp), g in df.groupby(["model", "tp"], sort=False):
        cells = []
        for kind in ("prefill", "decode"):
            k = g[g["kind"] == kind]
            e = k["rel_err"].abs()
            w = k.loc[e.idxmax()]
            where = f"{int(w.tokens)}" + (f", {w.case.split()[-1]}" if kind == "decode" else "")
            cells += [f"{e.median():.1%} / {e.quantile(0.9):.1%} / {e.max():.1%}",
                      f"{where}: {w.built_ms:.2f} / {w.hand_ms:.2f} ({w.rel_err:+.1%})"]
        cells.append(f"{g['compute_rel_err'].abs().max():.1%}")
        lines.append(f"| {m} | {tp} | " + " | ".join(cells) + " |")
    e = df["rel_err"].abs()
    lines.append(f"\nAll {len(df)} cases: median {e.median():.1%}, P90 {e.quantile(0.9):.1%}, max {e.max():.1%}; "
                 f"{(e > TOLERANCE).mean():.1%} beyond the {TOLERANCE:.0%} tolerance.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true", help="print the table, leave README.md alone")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        df = compare(Path(tmp))
    text = markdown(df)
    print(text)
    if not args.no_write:
        from build_kernels import README, replace_section

        README.write_text(replace_section(README.read_text(), "built-vs-hand", text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
