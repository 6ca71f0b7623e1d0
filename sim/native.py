"""The engine's hot modules compiled to C with mypyc: an optional build, same results.

The Python sources are the reference. `python -m sim.native_build` (run by `make native`) compiles
`MODULES` with mypyc into `build/native/` of the checkout and records each source's SHA-256 in
`build/native/manifest.txt`. `enable()`, called when `sim` is imported, makes `import
sim.engine.schedulers.fastpp` (and the others) load the compiled module only when the manifest's hashes
equal the sources on disk and a compiled file exists for this interpreter; otherwise the `.py`
sources load as usual, so an edited source is never shadowed by a stale build.
`PIPESIM_PURE=1` forces the sources (the test suite does, since some tests patch engine methods,
which compiled classes do not allow; tests/test_native.py checks that both give byte-identical
outputs). The compiled modules are the lock-step loop, the scheduler, the request and batch
state, the latency model's per-batch stage times (sim/latency/stagetimer.py) and batch summary
(sim/latency/batchstats.py), the variance draws
and ALP's predictor: the per-iteration Python that dominates a run (benchmarks/README.md).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "native"
MODULES = ("sim.engine.state", "sim.engine.schedulers.fastpp", "sim.engine.pipeline", "sim.engine.view", "sim.engine.records",
           "sim.latency.variance", "sim.latency.stagetimer", "sim.latency.batchstats", "sim.policies.rls", "sim.engine.prefix_cache",
           "sim.engine.schedulers.cached", "sim.engine.schedulers.sglang", "sim.engine.schedulers.vllm_v1",
           "sim.engine.schedulers.vllm_v0", "sim.engine.schedulers.roles")
GROUP = "pipesim_native"  # mypyc's shared library is the module GROUP + "__mypyc"
FILES = (*MODULES, GROUP + "__mypyc")  # the compiled files a build holds, by module name
MANIFEST = "manifest.txt"  # lines "module sha256" (json would cost every command its import)

_active: dict[str, Path] = {}


def source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_digests() -> dict[str, str]:
    """Module name -> SHA-256 of its source, for every compiled module."""
    return {m: digest(source(m)) for m in MODULES}


def write_manifest(folder: Path, digests: dict[str, str]) -> None:
    # Written last by sim.native_build, and atomically (a temporary sibling renamed into place, as
    # sim/core/fsio.py does; this layer may not import it): a build is used only once its whole
    # manifest exists, so an interrupted build is never mistaken for a fresh one.
    tmp = folder / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text("".join(f"{m} {d}\n" for m, d in digests.items()))
    os.replace(tmp, folder / MANIFEST)


def compiled_file(module: str, folder: Path = OUT) -> Path | None:
    """The compiled file of `module` for this interpreter (its ABI suffix), if built."""
    from importlib.machinery import EXTENSION_SUFFIXES

    base = folder.joinpath(*module.split("."))
    for suffix in EXTENSION_SUFFIXES:
        f = base.with_name(base.name + suffix)
        if f.is_file():
            return f
    return None


def fresh_build(folder: Path = OUT) -> dict[str, Path] | None:
    """Module name -> compiled file, when every module's build is present and its source
    unchanged since; None otherwise (then the sources are used)."""
    try:
        manifest = dict(line.split() for line in (folder / MANIFEST).read_text().splitlines())
    except (OSError, ValueError):
        return None
    files = {}
    for module in FILES:
        f = compiled_file(module, folder)
        if f is None:
            return None
        files[module] = f
    return files if manifest == source_digests() else None


class _Finder:
    """A meta-path finder that serves the compiled modules (and nothing else)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, name, path=None, target=None):
        f = self.files.get(name)
        if f is None:
            return None
        from importlib.util import spec_from_file_location

        return spec_from_file_location(name, f)


def enable() -> bool:
    """Load the compiled modules from now on, if a fresh build exists and PIPESIM_PURE is not
    set. Returns whether they are in use. Call before the engine is imported."""
    if os.environ.get("PIPESIM_PURE", "") not in ("", "0"):
        return False
    files = fresh_build()
    if files is None or any(m in sys.modules for m in MODULES):
        return False
    _active.update(files)
    sys.meta_path.insert(0, _Finder(files))
    return True


def active() -> bool:
    """Whether this process runs the compiled modules."""
    return bool(_active) and all(getattr(sys.modules.get(m), "__file__", "") == str(_active[m])
                                 for m in MODULES if m in sys.modules)
