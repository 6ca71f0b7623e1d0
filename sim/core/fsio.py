"""Writes that cannot destroy: atomic files and PipeSim's own output folders.

- **Atomic files.** Every output file is written to a temporary sibling (`.NAME.tmp-PID`) and
  renamed over `NAME` only once complete (`os.replace`, atomic on one file system), so a reader
  never sees half a file and a crash or Ctrl-C leaves the old file (or none), never a fragment.
- **Marked folders.** Every output folder PipeSim creates holds a marker file `.pipesim` naming
  its kind (`run`, `goodput`, `plan`, `compare`, `gate`, `results`, `profile`, ...). A command
  writes into a folder only when the folder is new or empty, or is marked with the command's
  own kind; a folder of another kind, a folder of someone else's files, the project's root and
  its ancestors, the home folder and `/` are refused (`--force` never clears those).
- **Runs replaced only after success.** `ppsim run --force` writes the new run into a staging
  sibling and swaps it in once every file is written (`Staged`); a refused or failed new run
  leaves the old one as it was. Profile folders (`ppsim profile build/import-vidur/collect`) are
  staged the same way (`StagedFolder`, without the run checks: sim/cli/profile.py decides what
  may be replaced, from meta.toml, and profiles carry no marker so their format is unchanged).

- **One writer per folder.** `claim` and `Staged` lock the output folder for the rest of the
  command (`lock_out`: an advisory `flock` on `.NAME.lock` beside it, removed when the command
  ends, sim/cli/__init__.py): a second command into the same `--out` while the first runs is
  refused at once, naming the first one's process, instead of both writing and one run being lost.

- **Nothing left behind.** A command ended by SIGINT, SIGTERM or SIGHUP removes its staging
  folders, temporary files and spill folders (sim/cli/__init__.py turns the signal into an
  interrupt that unwinds, `temp_folder`'s folders are removed by worker processes too); what a
  SIGKILLed process left (`.NAME.partial-PID`, `.NAME.old-PID` beside an output folder,
  `ppsim-*-PID-*` in $TMPDIR) is swept by the next command that stages beside it or spills,
  once that PID is no longer alive.

- **A full disk is said.** A write that fails for want of space (ENOSPC, EDQUOT) is a one-line
  `DiskFull` naming the path and the space left on its file system (`disk_full`); the file being
  written is removed and the earlier one, if any, kept.

Run folders written before the marker existed (holding only a run's files) count as `run`.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from sim.core.errors import ConfigError, DiskFull

MARKER = ".pipesim"
RUN_FILES = frozenset({
    "summary.json", "requests.csv", "iterations.csv", "requests.npz", "iterations.npz", "requests.parquet",
    "iterations.parquet", "config.toml", "decisions.csv", "moves.csv", "timeline.json", "timeline.png",
    "report.md", "report.png", MARKER,
})
REPO_ROOT = Path(__file__).resolve().parents[2]


def _tmp_sibling(path: Path, tag: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts as gone; one of another user's as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def sweep_stale(path: Path, tags: tuple[str, ...] = ("partial", "old", "tmp")) -> None:
    """Remove the staging siblings of `path` (`.NAME.TAG-PID`) whose process has died: what a
    SIGKILLed command (or a power cut) left behind. A live process's siblings are kept."""
    parent = path.parent
    if not parent.is_dir():
        return
    for tag in tags:
        start = f".{path.name}.{tag}-"
        for sib in parent.glob(f".{glob.escape(path.name)}.{tag}-*"):
            pid = sib.name[len(start):]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                _remove(sib)


# ---------------------------------------------------------------- temporary folders ($TMPDIR)

_TEMP: set[str] = set()  # this process's temporary folders (removed on a signal: remove_temp_folders)
_SWEPT: set[str] = set()  # prefixes whose dead processes' folders this process has swept


def temp_folder(prefix: str):
    """A `tempfile.TemporaryDirectory` named `{prefix}{PID}-...` in $TMPDIR, removed when it is
    collected, at exit, on a signal (`remove_temp_folders`); the first one of each prefix in a
    process sweeps the folders of that prefix that processes no longer alive left behind."""
    import tempfile
    import weakref

    if prefix not in _SWEPT:
        _SWEPT.add(prefix)
        with contextlib.suppress(OSError):
            for old in Path(tempfile.gettempdir()).glob(f"{glob.escape(prefix)}*-*"):
                pid = old.name[len(prefix):].split("-", 1)[0]
                if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                    shutil.rmtree(old, ignore_errors=True)
    tmp = tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")
    _TEMP.add(tmp.name)
    weakref.finalize(tmp, _TEMP.discard, tmp.name)
    return tmp


def remove_temp_folders() -> None:
    """Remove this process's temporary folders now (a signal handler's clean-up before exiting)."""
    for name in list(_TEMP):
        shutil.rmtree(name, ignore_errors=True)
        _TEMP.discard(name)


# a write that failed for want of room: no space left on the device, or the user's quota exceeded
NO_ROOM = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_full(path: str | Path, exc: OSError | None = None, what: str = "") -> DiskFull:
    """The one-line error for a write to `path` that found no room: the path, the reason and
    the space left on its file system."""
    # a staging folder's file is named as the output it becomes (.NAME.partial-PID/x: NAME/x)
    path = Path(*[re.sub(r"^\.(.+)\.(?:partial|tmp)-\d+$", r"\1", part) for part in Path(path).parts])
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        usage = shutil.disk_usage(where)
        room = f"{_size(usage.free)} free of {_size(usage.total)} on its file system"
    except OSError:
        room = "free space unknown"
    why = "disk quota exceeded" if exc is not None and exc.errno != errno.ENOSPC else "no space left on the device"
    return DiskFull(f"{path}{what}: cannot be written: {why} ({room}); free some space or write elsewhere "
                    f"(earlier outputs are kept as they were)")


@contextlib.contextmanager
def no_room_named(path: str | Path, what: str = "") -> Iterator[None]:
    """Turn a write's ENOSPC/EDQUOT inside the block into `disk_full(path)` (`what`: words after it)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in NO_ROOM:
            raise disk_full(path, exc, what) from None
        raise


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write; on success it is renamed to `path`,
    on any error (or interrupt) it is removed and `path` is untouched. A full disk is a
    one-line `DiskFull` naming `path`."""
    path = Path(path)
    tmp = _tmp_sibling(path)
    try:
        with no_room_named(path):
            yield tmp
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def marker_kind(folder: Path) -> str | None:
    """The kind a PipeSim output folder is marked with; "run" for a pre-marker run folder
    (holding only a run's files); None for any other folder."""
    mark = folder / MARKER
    if mark.is_file():
        try:
            text = mark.read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "kind":
                return value.strip().strip('"') or None
        return None
    entries = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if entries and entries <= RUN_FILES and "summary.json" in entries:
        return "run"
    return None


def _protected(folder: Path) -> str | None:
    """Why `folder` may never be an output folder, or None."""
    f = folder.resolve()
    if f == Path(f.anchor):
        return "the file system's root"
    with contextlib.suppress(RuntimeError, KeyError):
        if f == Path.home().resolve():
            return "the home folder"
    if f == REPO_ROOT or f in REPO_ROOT.parents:
        return "the project's root (or a folder above it)"
    if (f / ".git").exists() or (f / "pyproject.toml").is_file():
        return "a project's root (it holds .git or pyproject.toml)"
    return None


def _mkdir(folder: Path, flag: str, target: Path | None = None) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, FileExistsError) or (exc.filename and Path(exc.filename).is_file()):
            why = f"{exc.filename} is a file (Not a directory)"
        raise ConfigError(f"{flag} {target or folder}: cannot be created: {why}") from None


def mark(folder: Path, kind: str) -> None:
    write_text(folder / MARKER, f'kind = "{kind}"\n# written by PipeSim: this folder holds its {kind} outputs\n')


# the output folders this process has locked: path -> (open lock file, lock file's path)
_LOCKS: dict[Path, tuple] = {}


def lock_out(folder: str | Path, flag: str = "--out") -> None:
    """Hold the lock of output folder `folder` until `release_locks()` (the end of the command):
    a ConfigError naming the holder when another process holds it. The lock is a `flock` on the
    file `.NAME.lock` beside the folder, which holds the holder's PID; the holder removes it."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: no lock, as before)
        return
    given, folder = folder, Path(os.path.abspath(folder))
    if folder in _LOCKS:
        return
    _mkdir(folder.parent, flag, folder)
    path = folder.with_name(f".{folder.name}.lock")
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"{flag} {folder}: cannot take its lock {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise ConfigError(f"{flag} {given}: another ppsim command (process {holder}) is writing into it; "
                              f"allowed: wait for it to end, or choose another folder") from None
        # the lock file may have been removed (by its former holder) between open and flock: then
        # this lock guards nothing and the file is opened again
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _LOCKS[folder] = (fd, path)
            return
        os.close(fd)
    raise ConfigError(f"{flag} {folder}: cannot take its lock {path} (it keeps changing)")


def release_locks() -> None:
    """Release (and remove) every output-folder lock this process holds (end of a command)."""
    while _LOCKS:
        _, (fd, path) = _LOCKS.popitem()
        with contextlib.suppress(OSError):
            path.unlink()  # (before the unlock: a waiting opener sees the file gone and opens anew)
        with contextlib.suppress(OSError):
            os.close(fd)


def claim(folder: str | Path, kind: str, flag: str = "--out") -> Path:
    """Make `folder` PipeSim's `kind` output folder (see the module docstring); returns it.
    A new or empty folder is created and marked; a folder marked `kind` is reused (its files
    are replaced one by one, atomically); anything else is a one-line ConfigError. The folder
    stays locked against other commands until this one ends (`lock_out`)."""
    _claim_checks(Path(folder), kind, flag, make=False)
    lock_out(folder, flag)
    return _claim_checks(Path(folder), kind, flag, make=True)  # (again, under the lock)


def _claim_checks(folder: Path, kind: str, flag: str, make: bool) -> Path:
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {folder}: exists and is not a folder")
    why = _protected(folder) if folder.exists() else None
    if why:
        raise ConfigError(f"{flag} {folder}: is {why}; allowed: a new folder, or one PipeSim made for {kind} outputs")
    if folder.is_dir() and any(folder.iterdir()):
        found = marker_kind(folder)
        if found != kind:
            what = f"a PipeSim {found} folder" if found else "a folder of other files"
            raise ConfigError(f"{flag} {folder}: is {what}; allowed: a new or empty folder, or a PipeSim {kind} "
                              f"folder (choose another folder)")
        if make and not (folder / MARKER).is_file():
            mark(folder, kind)
        return folder
    if make:
        _mkdir(folder, flag)
        mark(folder, kind)
    return folder


def check_new_file(path: str | Path, force: bool, flag: str, owner_kinds: tuple[str, ...] = ()) -> Path:
    """A single output file (`--json PATH`, `fidelity --out FILE`): refused when it exists,
    unless `force` or its folder is a PipeSim folder of one of `owner_kinds`."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; allowed: a file path")
    if path.exists() and not force and marker_kind(path.parent) not in owner_kinds:
        raise ConfigError(f"{flag} {path}: exists and PipeSim did not write it here; add --force to replace it, "
                          f"or choose a new path")
    why = _protected(path.parent) if path.parent.exists() and path.exists() and not force else None
    if why:
        raise ConfigError(f"{flag} {path}: is in {why}; add --force to replace it")
    _mkdir(path.parent, flag, path)
    return path


class StagedFolder:
    """A folder written beside its destination `out` and swapped in whole once complete.

    No checks: the caller has decided that `out` may be replaced. `.path` is the staging folder
    to write into, `.commit()` swaps it in (removing the old folder only then), `.discard()`
    removes it. As a context manager it discards on an exception (or Ctrl-C) and leaves the
    commit to the caller, so a failed write leaves `out` as it was, or absent."""

    def __init__(self, out: str | Path, flag: str = "--out") -> None:
        self.out = Path(out)
        _mkdir(self.out.parent, flag, self.out)
        sweep_stale(self.out, ("partial", "old"))  # what killed processes left beside it
        self.path = _tmp_sibling(self.out, "partial")
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir()

    def commit(self) -> Path:
        old = None
        if self.out.exists():
            old = _tmp_sibling(self.out, "old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
        os.replace(self.path, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def commit_if_absent(self, complete: str) -> Path:
        """Swap the staging folder in unless `out` already holds a complete folder (one with the
        file `complete`); then discard it and keep `out`. For writers that build the same content
        (a profile cache that several sweep workers fill at once): the first complete folder wins
        and is never moved under a reader. An incomplete `out` is replaced as `commit` does."""
        try:
            os.rename(self.path, self.out)  # (fails on an existing non-empty folder)
        except OSError:
            if not (self.out / complete).is_file():
                return self.commit()
            self.discard()
        return self.out

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()


class Staged(StagedFolder):
    """A run folder written beside its destination and swapped in once complete.

    `Staged(out, force)` refuses at once what cannot be replaced (see `claim`; an existing run
    needs `force`), then stages as `StagedFolder` does, the staging folder marked `kind`."""

    def __init__(self, out: str | Path, force: bool, kind: str = "run", flag: str = "--out") -> None:
        self.out = Path(out)
        self.kind = kind
        self._check(force, flag)
        lock_out(self.out, flag)
        self._check(force, flag)  # (again, under the lock: what another command left meanwhile)
        super().__init__(self.out, flag)
        mark(self.path, kind)

    def _check(self, force: bool, flag: str) -> None:
        kind = self.kind
        if self.out.exists():
            if not self.out.is_dir():
                raise ConfigError(f"{flag} {self.out}: exists and is not a folder")
            why = _protected(self.out)
            if why:
                raise ConfigError(f"{flag} {self.out}: is {why}; allowed: a new folder")
            entries = sorted(p.name for p in self.out.iterdir())
            if entries:
                found = marker_kind(self.out)
                if found != kind:
                    foreign = [e for e in entries if e not in RUN_FILES]
                    what = (f"a PipeSim {found} folder" if found else
                            f"a folder of files that are not a run's ({', '.join(foreign[:3])}"
                            f"{', ...' if len(foreign) > 3 else ''})")
                    raise ConfigError(f"{flag} {self.out}: is {what}; choose a new folder")
                if not force:
                    shown = [e for e in entries if e != MARKER]
                    raise ConfigError(f"{flag} {self.out}: holds another run ({', '.join(shown[:3])}"
                                      f"{', ...' if len(shown) > 3 else ''}); add --force to replace it, or choose "
                                      f"a new folder")


def save_figure(fig, path: str | Path, **kwargs) -> None:
    """`fig.savefig(path)` through a temporary sibling (the format from `path`'s suffix)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **kwargs)


def write_frame(df, path: str | Path, **kwargs) -> None:
    """`df.to_csv(path, **kwargs)` through a temporary sibling."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, **kwargs)
