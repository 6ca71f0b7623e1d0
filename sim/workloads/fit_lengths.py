"""Re-derive the committed length models in `sim/data/` from the shared data sets.

    python -m sim.workloads.fit_lengths --data ../shared/data --force     # rewrite sim/data
    python -m sim.workloads.fit_lengths --data ../shared/data --out DIR     # new files elsewhere

Model (one CSV per data set, `lengths_<name>.csv`): a rank-binned joint quantile table.

- `u`: a probability grid, 0 to 1 in steps of 0.0025, refined in both tails (0.0005, 0.001,
  0.999, 0.9995) because the tails carry much of the mean (Azure prompts reach 14,050 tokens).
- `prompt`: the prompt-length quantile at `u` (numpy's default linear interpolation).
- `output`: the marginal output-length quantile at `u` (used when `joint = false`).
- `output_b<k>`: the output-length quantile at `u` among the requests whose prompt rank falls
  in the k-th of 10 equal-mass bins (requests sorted by prompt length, ties in file order).

Sampling draws u for the prompt, takes its bin's conditional output quantiles at a second
uniform draw. That keeps the prompt/output dependence (ShareGPT's Spearman correlation is
-0.41, Azure conv's +0.07) with a file of a few tens of KB instead of the data itself, and it
reproduces the means to within 0.3%. The output is a pure function of the input files, so the
test suite checks this script reproduces the committed files byte for byte.

Writes cannot destroy (sim/core/fsio.py): an existing output file is replaced only with
`--force` (the committed files in sim/data too), every target is checked before any is written,
and each file is written to a temporary sibling and renamed into place once complete. Errors are
one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from sim.core import fsio
from sim.core.errors import DataError, PipeSimError
from sim.workloads.lengths import DATA_DIR

NUM_BINS = 10
GRID = np.unique(np.round(np.concatenate([np.linspace(0, 1, 401), [0.0005, 0.001, 0.999, 0.9995]]), 6))

# name -> (file under --data, reader). The Azure trace goes through the trace reader so the
# same validation applies; ShareGPT lengths are already filtered as the artifact filters them.
SOURCES = {
    "azure-conv": "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
    "sharegpt": "sharegpt-v3-token-lengths/sharegpt_v3_first_turn_lengths_qwen2.5_tokenizer.csv",
}


def read_pairs(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: not found (--data names the shared data folder, e.g. ../shared/data)")
    if path.name.startswith("AzureLLMInferenceTrace"):
        from sim.workloads.trace import read_trace

        trace = read_trace(path)
        return trace.prompts, trace.outputs
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    return data[:, 0], data[:, 1]


def fit_table(prompts: np.ndarray, outputs: np.ndarray) -> str:
    """The CSV text of the joint quantile table of (prompts, outputs)."""
    n = len(prompts)
    order = np.argsort(prompts, kind="stable")
    out_sorted = outputs[order]
    rank_bin = (np.arange(n) * NUM_BINS) // n
    cols = [np.quantile(prompts, GRID), np.quantile(outputs, GRID)]
    cols += [np.quantile(out_sorted[rank_bin == b], GRID) for b in range(NUM_BINS)]
    header = ["u", "prompt", "output"] + [f"output_b{b}" for b in range(NUM_BINS)]
    lines = [",".join(header)]
    for i, u in enumerate(GRID):
        lines.append(",".join([f"{u:.4f}"] + [f"{c[i]:.2f}" for c in cols]))
    return "\n".join(lines) + "\n"


def fit_all(data_dir: Path, out_dir: Path, force: bool = False) -> list[Path]:
    """Write `lengths_<name>.csv` for every data set into `out_dir`; returns the paths."""
    targets = {name: out_dir / f"lengths_{name}.csv" for name in SOURCES}
    # Refuse before reading or writing anything, so a refused run changes no file.
    for path in targets.values():
        fsio.check_new_file(path, force, "--out")
    # Every table is fitted before the first is written, so a bad input file costs no output.
    texts = {name: fit_table(*read_pairs(data_dir / rel)) for name, rel in SOURCES.items()}
    for name, path in targets.items():
        fsio.write_text(path, texts[name])
    return list(targets.values())


def main(argv: list[str] | None = None) -> int:
    prog = "python -m sim.workloads.fit_lengths"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the shared data folder (../shared/data)")
    ap.add_argument("--out", type=Path, default=DATA_DIR, help=f"output folder (default {DATA_DIR})")
    ap.add_argument("--force", action="store_true", help="replace existing lengths_*.csv files in --out")
    args = ap.parse_args(argv)
    try:
        written = fit_all(args.data, args.out, args.force)
    except PipeSimError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
