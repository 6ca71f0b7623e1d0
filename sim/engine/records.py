"""Compact per-iteration records: typed columns instead of Python objects.

A long run has millions of lock-step iterations; a row of Python ints, floats and tuples costs
about 600 bytes, the same row in typed columns (the `array` module) about 100. `IterationLog`
is what a pipeline appends to and what `RunResult.iterations` / `RunResult.stage_busy` hold:
`iterations[name]` is a column that indexes, iterates and converts with `np.asarray` like the
list it replaces (`mode` gives its strings back), and `stage_busy[row]` is one iteration's tuple
of per-stage busy seconds.

With `spill=True` (`ppsim run --no-iterations`: no iterations.csv to write) the log keeps only
what the summary reads (`SUMMARY_COLUMNS` and the stage busy times) and appends each block of
rows to one binary file per column in a temporary folder, so a run's memory does not grow with
its iterations; `columns` and `stage_busy` then read the files back, one column at a time.
"""

from __future__ import annotations

import struct
from array import array
from pathlib import Path
from typing import Any

MODES = ("idle", "decode", "extend", "mixed")
_MODE_CODE = {m: i for i, m in enumerate(MODES)}

# column -> array typecode ('q': 64-bit int, 'd': float); `mode` is stored as a 1-byte code
COLUMNS = {
    "iteration": "q", "slot": "q", "start_s": "d", "end_s": "d", "mode": "b", "num_tokens": "q",
    "prefill_tokens": "q", "num_prefill": "q", "num_decode": "q", "chunk_size": "q", "kv_used_tokens": "q",
    "num_waiting": "q", "num_running": "q", "host_s": "d",
}

# the columns `sim.outputs.metrics.summarize` reads (besides the stage busy times and the replica)
SUMMARY_COLUMNS = ("start_s", "end_s", "mode", "prefill_tokens", "kv_used_tokens", "num_waiting")
# (IterationLog.record's spilling branch appends these positions of COLUMNS)
assert [list(COLUMNS).index(c) for c in SUMMARY_COLUMNS] == [2, 3, 4, 6, 10, 11]


class ModeColumn:
    """The `mode` column: one byte per iteration, read back as the mode's name."""

    __slots__ = ("codes",)

    def __init__(self, codes: array | None = None) -> None:
        self.codes = codes if codes is not None else array("b")

    def append(self, mode: str) -> None:
        self.codes.append(_MODE_CODE[mode])

    def extend(self, other: "ModeColumn") -> None:
        self.codes.extend(other.codes)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [MODES[c] for c in self.codes[i]]
        return MODES[self.codes[i]]

    def __iter__(self):
        return (MODES[c] for c in self.codes)

    def tolist(self) -> list[str]:
        return [MODES[c] for c in self.codes]


class StageBusy:
    """Per-iteration busy seconds of every stage, one flat float column (row-major)."""

    __slots__ = ("flat", "num_stages")

    def __init__(self, num_stages: int) -> None:
        self.flat = array("d")
        self.num_stages = num_stages

    def append(self, busy) -> None:
        self.flat.extend(busy)

    def extend(self, other: "StageBusy") -> None:
        self.flat.extend(other.flat)

    def __len__(self) -> int:
        return len(self.flat) // self.num_stages if self.num_stages else 0

    def __getitem__(self, row):
        n = len(self)
        if isinstance(row, slice):
            return [self[r] for r in range(*row.indices(n))]
        if row < 0:
            row += n
        if not 0 <= row < n:
            raise IndexError(row)
        p = self.num_stages
        return tuple(self.flat[row * p:(row + 1) * p])

    def __iter__(self):
        for row in range(len(self)):
            yield self[row]

    def to_numpy(self):
        import numpy as np

        return np.array(self.flat, dtype=float).reshape(len(self), self.num_stages)

    def stage(self, s: int):
        """Stage s's busy seconds, one per iteration (a numpy view)."""
        import numpy as np

        return np.frombuffer(self.flat, dtype=np.float64).reshape(len(self), self.num_stages)[:, s]


class IterationLog:
    """The iterations of one pipeline (or of several replicas, merged): `columns` holds the
    typed columns by name (plus `replica` after a merge), `stage_busy` the busy times."""

    BLOCK = 4096  # rows buffered in one Python list per column (the per-iteration hot path)

    def __init__(self, num_stages: int, spill: bool = False) -> None:
        self._columns: dict = {c: (ModeColumn() if t == "b" else array(t)) for c, t in COLUMNS.items()}
        self._stage_busy = StageBusy(num_stages)
        # the buffered rows, a list per column in COLUMNS order plus the stages' busy seconds
        # (row-major): appending to lists makes no object per row for the garbage collector
        self._buf: list[list] = [[] for _ in COLUMNS]
        self._busy: list[float] = []
        self._n = 0
        self.num_stages = num_stages
        self.spill = spill
        self._spill: SpillFiles | None = None  # made at the first flush (no I/O here)

    def record(self, k: int, slot: int, start_s: float, end_s: float, mode: str, num_tokens: int,
               prefill_tokens: int, num_prefill: int, num_decode: int, chunk_size: int, kv_used_tokens: int,
               num_waiting: int, num_running: int, host_s: float, busy: list) -> None:
        """Append one iteration: the values of COLUMNS in order, then the stages' busy seconds."""
        b = self._buf
        if self.spill:  # only what the files keep (SUMMARY_COLUMNS, at their COLUMNS positions)
            b[2].append(start_s)
            b[3].append(end_s)
            b[4].append(mode)
            b[6].append(prefill_tokens)
            b[10].append(kv_used_tokens)
            b[11].append(num_waiting)
            self._busy.extend(busy)
            self._n += 1
            if self._n >= self.BLOCK:
                self._flush()
            return
        b[0].append(k)
        b[1].append(slot)
        b[2].append(start_s)
        b[3].append(end_s)
        b[4].append(mode)
        b[5].append(num_tokens)
        b[6].append(prefill_tokens)
        b[7].append(num_prefill)
        b[8].append(num_decode)
        b[9].append(chunk_size)
        b[10].append(kv_used_tokens)
        b[11].append(num_waiting)
        b[12].append(num_running)
        b[13].append(host_s)
        self._busy.extend(busy)
        self._n += 1
        if self._n >= self.BLOCK:
            self._flush()

    def _flush(self) -> None:
        n = self._n
        if not n:
            return
        # a block goes to the typed columns as packed bytes (the same 8-byte values; `struct`
        # converts a list several times faster than `array.extend`, which parses every item)
        blocks: dict = {}
        for (name, code), values in zip(COLUMNS.items(), self._buf):
            if self.spill and name not in SUMMARY_COLUMNS:  # (files hold only what the summary reads)
                continue
            if code == "b":
                values = [_MODE_CODE[m] for m in values]
            blocks[name] = struct.pack(f"{n}{code}", *values)
        busy = struct.pack(f"{len(self._busy)}d", *self._busy)
        if self.spill:
            if self._spill is None:
                self._spill = SpillFiles(self.num_stages)
            self._spill.append(blocks, busy, n)
        else:
            for name, col in self._columns.items():
                (col.codes if isinstance(col, ModeColumn) else col).frombytes(blocks[name])
            self._stage_busy.flat.frombytes(busy)
        self._buf = [[] for _ in COLUMNS]
        self._busy = []
        self._n = 0

    @property
    def columns(self) -> Any:
        self._flush()
        if self.spill:
            return SpilledColumns([self._spill], self.num_stages)
        return self._columns

    @property
    def stage_busy(self) -> Any:
        self._flush()
        if self.spill:
            return SpilledColumns([self._spill], self.num_stages).stage_busy
        return self._stage_busy

    def __len__(self) -> int:
        if self.spill:
            return (self._spill.rows if self._spill is not None else 0) + self._n
        return len(self._columns["iteration"]) + self._n

    @classmethod
    def merge(cls, logs: list["IterationLog"], num_stages: int):
        """The replicas' logs one after another, with a `replica` column (spilled logs: a
        `SpilledColumns` over their files)."""
        if any(log.spill for log in logs):
            for log in logs:
                log._flush()
            return SpilledColumns([log._spill for log in logs], num_stages)
        out = cls(num_stages)
        columns = out.columns
        columns["replica"] = array("q")
        for i, log in enumerate(logs):
            for name, col in log.columns.items():
                columns[name].extend(col)
            columns["replica"].extend(array("q", [i]) * len(log))
            out.stage_busy.extend(log.stage_busy)
        return out


class SpillFiles:
    """One pipeline's spilled iterations: a binary file per summary column and per stage,
    appended block by block, in a temporary folder removed when this object is collected."""

    def __init__(self, num_stages: int) -> None:
        from sim.core.fsio import temp_folder

        # (named by this process: removed on a signal, or swept by a later run once it has died)
        self._dir = temp_folder("ppsim-iterations-")
        self.path = Path(self._dir.name)
        self.num_stages = num_stages
        self.rows = 0

    def append(self, blocks: dict, busy: bytes, rows: int) -> None:
        """Append `rows` rows: `blocks[name]` holds a column's values as bytes (its typecode's
        8-byte or, for `mode`, 1-byte items), `busy` the stages' busy seconds row-major."""
        import numpy as np

        from sim.core.fsio import no_room_named

        # ($TMPDIR full: a one-line error naming it)
        with no_room_named(self.path.parent, " ($TMPDIR, where runs without iterations.csv spill them)"):
            for name in SUMMARY_COLUMNS:
                with open(self.path / name, "ab") as fh:
                    fh.write(blocks[name])
            flat = np.frombuffer(busy, dtype=np.float64).reshape(rows, self.num_stages)
            for s in range(self.num_stages):
                with open(self.path / f"stage{s}", "ab") as fh:
                    np.ascontiguousarray(flat[:, s]).tofile(fh)
        self.rows += rows

    def read(self, name: str):
        import numpy as np

        dtype = np.float64 if name.startswith("stage") else {"d": np.float64, "q": np.int64, "b": np.int8}[COLUMNS[name]]
        path = self.path / name
        return np.fromfile(path, dtype=dtype) if path.exists() else np.zeros(0, dtype=dtype)


class SpilledColumns:
    """The spilled iterations of one or more replicas (in replica order), read back one column
    at a time: `self[name]` is a numpy array (`mode` as its 1-byte codes, see MODES), `replica`
    the replica of each row (with more than one replica), `stage_busy.stage(s)` a stage's busy
    seconds. Only the columns of SUMMARY_COLUMNS exist."""

    def __init__(self, spills: list, num_stages: int) -> None:
        self.spills = spills
        self.num_stages = num_stages

    def _cat(self, read):
        import numpy as np

        parts = [read(sp) for sp in self.spills if sp is not None]
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0)

    def __getitem__(self, name: str):
        import numpy as np

        if name == "replica" and len(self.spills) > 1:
            return np.repeat(np.arange(len(self.spills)), [sp.rows if sp is not None else 0 for sp in self.spills])
        if name not in SUMMARY_COLUMNS:
            raise KeyError(f"{name}: not kept by a spilled iteration log (kept: {', '.join(SUMMARY_COLUMNS)})")
        return self._cat(lambda sp: sp.read(name))

    def __contains__(self, name: str) -> bool:
        return name in self.keys()

    def keys(self):
        # a `replica` column only behind a router (one replica: all zeros, 8 bytes an iteration)
        return (*SUMMARY_COLUMNS, "replica") if len(self.spills) > 1 else SUMMARY_COLUMNS

    def __len__(self) -> int:
        return sum(sp.rows for sp in self.spills if sp is not None)

    @property
    def columns(self) -> "SpilledColumns":  # what IterationLog.merge's caller reads
        return self

    @property
    def stage_busy(self) -> "SpilledColumns":
        return self

    def stage(self, s: int):
        return self._cat(lambda sp: sp.read(f"stage{s}"))
