"""Compact per-iteration records: typed columns instead of Python objects.

A long run has millions of lock-step iterations; a row of Python ints, floats and tuples costs
about 600 bytes, the same row in typed columns (the `array` module) about 100. `IterationLog`
is what a pipeline appends to and what `RunResult.iterations` / `RunResult.stage_busy` hold:
`iterations[name]` is a column that indexes, iterates and converts with `np.asarray` like the
list it replaces (`mode` gives its strings back), and `stage_busy[row]` is one iteration's tuple
of per-stage busy seconds.
"""

from __future__ import annotations

from array import array

MODES = ("idle", "decode", "extend", "mixed")
_MODE_CODE = {m: i for i, m in enumerate(MODES)}

# column -> array typecode ('q': 64-bit int, 'd': float); `mode` is stored as a 1-byte code
COLUMNS = {
    "iteration": "q", "slot": "q", "start_s": "d", "end_s": "d", "mode": "b", "num_tokens": "q",
    "prefill_tokens": "q", "num_prefill": "q", "num_decode": "q", "chunk_size": "q", "kv_used_tokens": "q",
    "num_waiting": "q", "num_running": "q", "host_s": "d",
}


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


class IterationLog:
    """The iterations of one pipeline (or of several replicas, merged): `columns` holds the
    typed columns by name (plus `replica` after a merge), `stage_busy` the busy times."""

    BLOCK = 4096  # rows buffered as tuples (the per-iteration hot path), then moved to the columns

    def __init__(self, num_stages: int) -> None:
        self._columns: dict = {c: (ModeColumn() if t == "b" else array(t)) for c, t in COLUMNS.items()}
        self._stage_busy = StageBusy(num_stages)
        self._rows: list[tuple] = []

    def record(self, row: tuple, busy) -> None:
        """Append one iteration: `row` holds the values of COLUMNS in order, `busy` the stages'."""
        rows = self._rows
        rows.append(row)
        self._stage_busy.flat.extend(busy)
        if len(rows) >= self.BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            for col, values in zip(self._columns.values(), zip(*self._rows)):
                if isinstance(col, ModeColumn):
                    col.codes.extend([_MODE_CODE[m] for m in values])
                else:
                    col.extend(values)
            self._rows = []

    @property
    def columns(self) -> dict:
        self._flush()
        return self._columns

    @property
    def stage_busy(self) -> StageBusy:
        self._flush()
        return self._stage_busy

    def __len__(self) -> int:
        return len(self._columns["iteration"]) + len(self._rows)

    @classmethod
    def merge(cls, logs: list["IterationLog"], num_stages: int) -> "IterationLog":
        """The replicas' logs one after another, with a `replica` column."""
        out = cls(num_stages)
        columns = out.columns
        columns["replica"] = array("q")
        for i, log in enumerate(logs):
            for name, col in log.columns.items():
                columns[name].extend(col)
            columns["replica"].extend(array("q", [i]) * len(log))
            out.stage_busy.extend(log.stage_busy)
        return out
