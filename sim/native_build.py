"""Builds the compiled engine modules (sim/native.py) with mypyc: `python -m sim.native_build`.

`--if-stale` builds only when no fresh build exists; `--status` tells which modules a run uses.
Needs mypy (the `dev` extra), setuptools, a C compiler and the Python headers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sim.native import (FILES, GROUP, MODULES, OUT, ROOT, compiled_file, fresh_build, source, source_digests,
                        write_manifest)


def build(out: Path = OUT) -> None:
    """Compile MODULES with mypyc into `out` (needs mypy, a C compiler and the Python headers)."""
    paths = [str(source(m).relative_to(ROOT)) for m in MODULES]
    digests = source_digests()  # (before compiling: an edit meanwhile makes the build stale)
    with tempfile.TemporaryDirectory() as tmp:
        # (mypyc writes its C files to target_dir, mypy its cache to MYPY_CACHE_DIR: both in tmp)
        script = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"mods = mypycify(['--ignore-missing-imports', '--follow-imports=silent', *{paths!r}],\n"
            f"                group_name={GROUP!r}, target_dir={str(Path(tmp) / 'c')!r})\n"
            f"setup(name='pipesim-native', ext_modules=mods,\n"
            f"      script_args=['build_ext', '--build-lib', {str(Path(tmp) / 'lib')!r},\n"
            f"                   '--build-temp', {str(Path(tmp) / 'temp')!r}])\n"
        )
        env = {**os.environ, "MYPY_CACHE_DIR": str(Path(tmp) / "cache")}
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise SystemExit("sim.native_build: mypyc failed:\n" + "\n".join(tail))
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        lib = Path(tmp) / "lib"
        for module in FILES:
            f = compiled_file(module, lib)
            if f is None:
                raise SystemExit(f"sim.native_build: mypyc produced no compiled file for {module}")
            dest = out / f.relative_to(lib)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
    write_manifest(out, digests)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--if-stale"], ["--status"]):
        print("usage: python -m sim.native_build [--if-stale | --status]", file=sys.stderr)
        return 2
    fresh = fresh_build() is not None
    if argv == ["--status"]:
        print(f"fresh build in {OUT.relative_to(ROOT)}/: runs use it" if fresh
              else "no fresh build: runs use the Python sources")
        return 0
    if argv == ["--if-stale"] and fresh:
        return 0
    build()
    print(f"compiled {', '.join(MODULES)} into {OUT.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
