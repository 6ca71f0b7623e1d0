"""`ppsim --help` and `ppsim list` start without the heavy libraries (pandas, matplotlib, scipy,
numpy, ray, simpy): they are imported on first use (sim/core/lazy.py), so both commands are instant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.core.lazy import lazy

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "matplotlib", "scipy", "numpy", "ray", "simpy")

PROBE = """
import contextlib, io, sys
from sim.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main({argv!r})
    except SystemExit as exc:
        code = exc.code
assert code == 0, code
print(",".join(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["run", "--help"]])
def test_instant_commands_import_no_heavy_module(argv):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"ppsim {' '.join(argv)} imported: {out.stdout.strip()}"


def test_lazy_module_imports_on_first_attribute():
    calls = []
    mod = lazy("colorsys", setup=lambda: calls.append(1))
    assert calls == []
    assert mod.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert mod.rgb_to_hsv is mod.rgb_to_hsv and calls == [1]  # set up once, then cached


def test_profile_loaded_once_per_process(tmp_path):
    import shutil

    from sim.engine.run import load_profile_cached

    src = ROOT / "profiles/a100-pcie-40gb/qwen2.5-32b/tp1"
    a = load_profile_cached(src)
    assert load_profile_cached(src) is a
    copy = tmp_path / "tp1"
    shutil.copytree(src, copy)
    b = load_profile_cached(copy)
    assert b is not a and b.layer_ms.tolist() == a.layer_ms.tolist()
    meta = copy / "meta.toml"
    meta.write_text(meta.read_text())  # touched: read again
    import os

    os.utime(meta, ns=(meta.stat().st_mtime_ns + 10**9, meta.stat().st_mtime_ns + 10**9))
    assert load_profile_cached(copy) is not b
