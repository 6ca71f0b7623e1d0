"""Output folders of `ppsim run`: never mix the files of two runs.

A run writes a fixed set of files; re-running into a folder that holds another run's files
would leave stale ones beside the new (an old 4-stage timeline.json next to a PP=1 config). So
a non-empty folder is refused unless it holds only run files and `--force` is given, which
clears it first; a folder holding anything else is never cleared.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sim.core.errors import ConfigError

RUN_FILES = frozenset({
    "summary.json", "requests.csv", "iterations.csv", "requests.npz", "iterations.npz", "config.toml",
    "decisions.csv", "moves.csv",
    "timeline.json", "timeline.png", "report.md", "report.png",
})


def prepare_out(out: Path, force: bool) -> None:
    """Create `out`, or clear it (`force`) when it holds another run; refuse anything else."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if entries:
        foreign = [e for e in entries if e not in RUN_FILES]
        if foreign:
            raise ConfigError(f"--out {out}: folder is not empty and holds files that are not a run's "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); choose a new folder")
        if not force:
            raise ConfigError(f"--out {out}: holds another run ({', '.join(entries[:3])}"
                              f"{', ...' if len(entries) > 3 else ''}); add --force to replace it, or choose a new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
