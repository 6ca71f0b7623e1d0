"""The harness of the fuzz suite (tests/test_fuzz.py): run `ppsim` in this process on a hostile
input and hold the result to the contract every command keeps.

The contract (issue 32): exit 0 with a valid result, or a one-line error on stderr and exit 2
(exit 1 only for a run that failed on allocation, with its complete outputs); never a hang (a
per-case timer), a traceback or an internal error, a write outside `--out`, or a change to a file
that existed before.

Writes are watched two ways around every case (`confined`): an audit hook records every file this
process opens for writing, renames, makes or removes, which must lie in the case's scratch folder
(its --out included); and the project's working tree (every file and folder, ignored ones too, but
the byte-code caches and tool folders) must keep its sizes and modification times.
PIPESIM_FUZZ_SHARED_TREE=1, for a checkout others edit while the suite runs, reports a change of
the tree this process made no write call for as a note instead of a failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

from sim.cli import main

# A case's budget: CPU seconds of this process (a busy loop: other processes competing for the
# machine do not count, so a legitimate large run on a loaded machine is no "hang"), and WALL_FACTOR
# times as many seconds of wall-clock time (a case blocked forever: a lock, a pipe, a child).
CASE_TIMEOUT_S = 60.0
WALL_FACTOR = 5


class Hang(BaseException):  # (not an Exception: no `except Exception` may swallow it)
    pass


def _alarm(_sig, _frame):
    raise Hang()


def invoke(argv: list[str], timeout_s: float = CASE_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ppsim argv`, run here under the two timers."""
    out, err = io.StringIO(), io.StringIO()
    old = {sig: signal.signal(sig, _alarm) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, timeout_s)
    signal.setitimer(signal.ITIMER_REAL, timeout_s * WALL_FACTOR)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except Hang:
        raise AssertionError(f"ppsim {' '.join(argv)}: no answer within {timeout_s:g} s of CPU time "
                             f"({timeout_s * WALL_FACTOR:g} s of wall-clock time): a hang") from None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Path -> SHA-256 of every file under `root` (except under `skip`)."""
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (skip is not None and (p == skip or skip in p.parents)):
            files[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files


# ---------------------------------------------------------------- writes outside --out

REPO = Path(__file__).resolve().parents[1]
# Not PipeSim's files: the interpreter's byte-code caches, the test tools' and the environment's.
TREE_SKIP = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"}
# A tree shared with people editing it meanwhile (a developer's checkout, not CI): a change there
# that this process made no write call for is reported as a note, not a failure. Writes this
# process made are always held to the contract.
SHARED_TREE = os.environ.get("PIPESIM_FUZZ_SHARED_TREE") == "1"


def tree_state(root: Path = REPO) -> dict[str, tuple[int, int]]:
    """Path -> (mtime_ns, size) of every file and folder under `root` (the project's working tree,
    ignored files included, without TREE_SKIP): taken around every case, so it walks with os.scandir
    and builds relative paths by hand (os.walk with os.path.relpath cost ~3x as much: ~40 ms a call
    on a 2,200-entry tree, 2/3 of the fuzz suite's time)."""
    state: dict[str, tuple[int, int]] = {}

    def walk(folder: str, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for e in entries:
                is_dir = e.is_dir(follow_symlinks=False)
                if is_dir and e.name in TREE_SKIP:
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                rel = prefix + e.name
                state[rel] = (0 if is_dir else st.st_mtime_ns, st.st_size)
                if is_dir:
                    walk(e.path, rel + os.sep)

    walk(str(root), "")
    return state


# The plotting library's own per-user font cache and configuration (made on its first import): not
# PipeSim's writes, and nobody's data
LIBRARY_CACHES = [os.path.expanduser(p) for p in ("~/.cache/matplotlib", "~/.config/matplotlib")] + \
    ([os.path.abspath(os.environ["MPLCONFIGDIR"])] if os.environ.get("MPLCONFIGDIR") else [])
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITES: list[str] | None = None  # while a case runs: every path this process wrote, made or removed


def _where(path, dir_fd=None) -> str | None:
    if isinstance(path, int):
        return None  # an open descriptor: its opening was seen
    path = os.fsdecode(path)
    if not os.path.isabs(path) and dir_fd is not None:
        with contextlib.suppress(OSError):
            return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.abspath(path)


def _audit(event: str, args: tuple) -> None:
    if _WRITES is None:
        return
    paths: tuple = ()
    if event == "open":
        path, mode, flags = args
        if (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE_FLAGS):
            paths = (_where(path),)
    elif event == "os.mkdir":
        path = _where(args[0], args[2])
        paths = () if path is None or os.path.isdir(path) else (path,)  # (an existing folder: nothing made)
    elif event in ("os.remove", "os.rmdir", "os.chmod", "os.utime", "os.truncate", "os.chown"):
        paths = (_where(args[0], args[-1] if event != "os.truncate" else None),)
    elif event == "os.rename":  # (os.replace too)
        paths = (_where(args[0], args[2]), _where(args[1], args[3]))
    elif event in ("os.link", "os.symlink"):  # (the source is not written)
        paths = (_where(args[1], args[3] if event == "os.link" else args[2]),)
    elif event == "shutil.rmtree":
        paths = (_where(args[0], args[1]),)
    elif event in ("shutil.copyfile", "shutil.copytree"):
        paths = (_where(args[1]),)
    elif event == "shutil.move":
        paths = (_where(args[0]), _where(args[1]))
    for path in paths:
        if path is not None and "__pycache__" not in path:
            _WRITES.append(path)


sys.addaudithook(_audit)


@contextlib.contextmanager
def confined(*allowed: Path, label: str = "", tree: Path | None = REPO):
    """Hold the body (one case) to "no write outside `allowed`, no change to the project's tree":
    every write, folder made or file removed by this process must lie under one of the `allowed`
    folders (the case's scratch folder and --out), and the working tree of the project (`tree`) must
    be the same before and after (files and folders, sizes and modification times). `tree=None`
    leaves the tree to the caller, who compares it around a batch of cases (`tree_unchanged`): a
    write this process makes there is still caught here, as outside `allowed`."""
    global _WRITES
    roots = [os.path.abspath(a) for a in allowed]
    before = tree_state(tree) if tree is not None else None
    _WRITES = []
    try:
        yield
    finally:
        writes, _WRITES = _WRITES, None
    # a scratch file in the system's temporary folder (the engine's spill of long tables) is no
    # write outside --out when it is gone once the command is done
    scratch = tempfile.gettempdir() + os.sep
    outside = sorted({w for w in writes if not any(w == r or w.startswith(r + os.sep) for r in roots + LIBRARY_CACHES)
                      and not (w.startswith(scratch) and not os.path.lexists(w))})
    assert not outside, f"{label}: wrote outside {', '.join(roots)}: {outside[:5]}"
    if before is not None:
        tree_unchanged(before, label, tree, writes)


def tree_unchanged(before: dict, label: str, tree: Path = REPO, writes=()) -> None:
    """The project's tree as `before` (tree_state), but for a change this process made no write call
    for, in a tree shared with people editing it (SHARED_TREE): a note then."""
    after = tree_state(tree)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    ours = [c for c in changed if str(tree / c) in writes]
    if changed and SHARED_TREE and not ours:
        print(f"note: the project's tree changed during {label}, not by this process: {changed[:5]}", file=sys.stderr)
        return
    assert not changed, f"{label}: changed the project's tree: {changed[:5]}"


def check(argv: list[str], code: int, out: str, err: str, *, run_dir: Path | None = None,
          names: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> str:
    """Hold one result to the contract; returns "ok" or "refused" (for the statistics). `names`: the
    refusal must name one of them; `sets`: the keys of the case's `--set KEY=VALUE` overrides (the
    only change to a valid config), so a refusal must blame one of them as `--set KEY`."""
    label = f"ppsim {' '.join(argv)}"
    assert "Traceback" not in err and "Traceback" not in out, f"{label}: a traceback:\n{err}"
    assert "internal error" not in err, f"{label}: {err.strip()}"
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith("ppsim: warning:")]
    if code == 2:
        assert len(errors) == 1 and errors[0].startswith("ppsim"), f"{label}: not one line:\n{err}"
        if names:
            assert any(n in errors[0] for n in names), f"{label}: the error names none of {names}: {errors[0]}"
        if sets:
            assert any(re.search(rf"--set '?{re.escape(k)}=", errors[0]) for k in sets), \
                f"{label}: the error blames no --set of {sets}: {errors[0]}"
        if run_dir is not None:
            assert not run_dir.exists() or not any(run_dir.iterdir()) or (run_dir / ".pipesim").is_file(), label
        return "refused"
    assert code in (0, 1), f"{label}: exit {code}: {err}"
    assert not errors or all("%" in e or "it/s" in e or "run/s" in e for e in errors), f"{label}: exit {code}:\n{err}"
    if run_dir is not None:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["num_requests"] >= 0
        assert code == 0 or summary["status"] != "ok", f"{label}: exit 1 for an ok run"
        for key in ("p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"):
            v = summary.get(key)
            assert v is None or (isinstance(v, (int, float)) and (math.isnan(v) or 0 <= v < 1e15)), (label, key, v)
    return "ok"


def toml_value(value) -> str:
    """`value` as the right-hand side of `--set KEY=VALUE` (TOML)."""
    import tomli_w

    return tomli_w.dumps({"v": value})[4:].strip()
