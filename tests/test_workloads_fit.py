"""The committed fitted length models: reproducible from shared data, and faithful to it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.workloads import fit_lengths
from sim.workloads.lengths import DATA_DIR, load_quantile_table

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent, so the length models cannot be re-derived")
def test_fit_reproduces_committed_files_byte_for_byte(tmp_path):
    assert fit_lengths.main(["--data", str(SHARED), "--out", str(tmp_path)]) == 0
    for name in fit_lengths.SOURCES:
        fname = f"lengths_{name}.csv"
        assert (tmp_path / fname).read_bytes() == (DATA_DIR / fname).read_bytes(), fname


@pytest.mark.parametrize(
    "table, prompt_mean, output_mean",
    [("azure-conv", 1154.7, 211.1), ("sharegpt", 219.6, 202.9)],
)
def test_committed_model_means(table, prompt_mean, output_mean):
    # The mean of a piecewise-linear quantile function is its integral over u.
    m = load_quantile_table(table)
    assert m.u[0] == 0 and m.u[-1] == 1 and np.all(np.diff(m.u) > 0)
    assert np.trapezoid(m.prompt, m.u) == pytest.approx(prompt_mean, rel=0.005)
    assert np.trapezoid(m.output, m.u) == pytest.approx(output_mean, rel=0.005)
    assert np.mean([np.trapezoid(c, m.u) for c in m.cond]) == pytest.approx(output_mean, rel=0.005)
    for col in (m.prompt, m.output, *m.cond):
        assert np.all(np.diff(col) >= 0)  # quantile functions never decrease
