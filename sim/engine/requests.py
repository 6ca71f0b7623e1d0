"""A run's requests as compact columns: the workload's inputs, the `Req` objects only while a
request is in the server, and every request's outcome once it finishes (or the run ends).

A long run has about a million requests and two hundred million tokens; a `Req` object with
its per-token gaps costs about a kilobyte plus 8 bytes a token. So the run keeps the workload
as four typed arrays (`RequestArrays`), makes a request's `Req` when its arrival comes up
(`RequestTable.make`, called by the inbox or the router), and when it finishes copies what the
outputs need into one typed column per field (`finish`) and lets the `Req` go; at the end of
the run the requests still inside are copied as they stand (`close`). `RequestTable` is what
`RunResult.requests` holds: it iterates and indexes like the list of requests it replaces,
yielding read-only `RequestRecord`s with the `Req` field names.

The per-token inter-token latencies of finished requests (vLLM's pooled `itls`) go to an
`ItlPool`: float64 samples, exact, while there are at most `ItlPool.EXACT_LIMIT` of them;
beyond that, sorted distinct values with their counts (see `ItlPool`).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from sim.core.lazy import lazy

from sim.engine.state import FINISHED, IGNORED, RUNNING, WAITING, Req

STATES = (WAITING, RUNNING, FINISHED, IGNORED)
_STATE_CODE = {s: i for i, s in enumerate(STATES)}

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)


@dataclass(frozen=True)
class RequestArrays:
    """A workload as four typed arrays (one row per request, in arrival order)."""

    req_id: np.ndarray  # int64
    arrival_s: np.ndarray  # float64
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    # each request's prompt identity for prefix caching ((piece id, tokens) pairs; None for a
    # request without one), or None when no request has one (sim/engine/prefix_cache.py)
    pieces: tuple | None = None

    @classmethod
    def of(cls, specs) -> "RequestArrays":
        """From a list of `RequestSpec` (or a `RequestArrays`, returned as is)."""
        if isinstance(specs, RequestArrays):
            return specs
        n = len(specs)
        pieces = tuple(getattr(s, "prefix", None) for s in specs)
        return cls(np.fromiter((s.req_id for s in specs), np.int64, n),
                   np.fromiter((s.arrival_s for s in specs), np.float64, n),
                   np.fromiter((s.prompt_tokens for s in specs), np.int64, n),
                   np.fromiter((s.output_tokens for s in specs), np.int64, n),
                   pieces if any(p is not None for p in pieces) else None)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, i: int):
        from sim.workloads import RequestSpec

        return RequestSpec(int(self.req_id[i]), float(self.arrival_s[i]), int(self.prompt_tokens[i]),
                           int(self.output_tokens[i]), None if self.pieces is None else self.pieces[i])


class ItlPool:
    """The finished requests' per-token gaps (seconds), pooled as the benchmark clients pool them.

    Exact mode: every sample, float64, appended in finish order with each request's (offset,
    count), so `pooled_ms` gives them back in request order: numpy's statistics on that array
    are the ones a list of per-request arrays gave. Past `EXACT_LIMIT` samples (a long run has
    ~200 per request), the pool switches to counts: the sorted distinct values with how often
    each occurs (a decode micro-batch's requests share one gap, so there are about as many
    distinct values as iterations). Percentiles and the maximum stay exact; the mean and
    standard deviation are then summed in another order, so they may differ in the last bits
    from numpy's pairwise sum over the pooled array.
    """

    EXACT_LIMIT = 1 << 22  # samples (32 MiB of float64): ~20,000 requests of azure-conv
    MERGE_MIN = 1 << 20  # counts mode: samples pending before they are folded into the table

    def __init__(self, num_requests: int, max_out: array | None = None) -> None:
        self.values = array("d")  # exact mode: samples in finish order; counts mode: not yet merged
        # `max_out[row]` gets each added row's largest sample (the table's max_itl_s column), computed
        # for many rows at once (`write_max`): a numpy maximum per request cost about 4 us. `_rows` and
        # `_lens` are the added rows (with samples) whose maximum is not written yet, their samples
        # in `values` from `_start` on, one row after another.
        self.max_out = max_out
        self._rows = array("q")
        self._lens = array("q")
        self._start = 0
        # each row's (offset, count) in `values` (exact mode): arrays stored into by `add`, read as
        # numpy views of the same memory (see RequestTable's outcome columns)
        self._offset: array | None = array("q", [-1]) * num_requests
        self._count: array | None = array("i", [0]) * num_requests
        self.offset = np.frombuffer(self._offset, dtype=np.int64)
        self.count = np.frombuffer(self._count, dtype=np.int32)
        self.exact = True
        # counts mode: sorted (distinct values, how many samples have each) tables, largest first;
        # `_table()` folds them into one (see `_merge`)
        self._tables: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, row: int, itls: array) -> None:
        if self.max_out is not None and len(itls):
            self._rows.append(row)
            self._lens.append(len(itls))
        if self.exact:
            self._offset[row] = len(self.values)
            self._count[row] = len(itls)
            self.values.extend(itls)
            if len(self.values) > self.EXACT_LIMIT:
                self.exact = False
                self.offset = self.count = None
                self._offset = self._count = None
                self._merge()
            return
        self.values.extend(itls)
        if len(self.values) >= self.MERGE_MIN:
            self._merge()

    def write_max(self) -> None:
        """Write the pending rows' largest samples into `max_out` (numpy's maximum of each row's
        samples: the same float as the builtin max over them)."""
        if not len(self._rows):
            return
        src = np.frombuffer(self.values, dtype=np.float64)[self._start:]
        lens = np.frombuffer(self._lens, dtype=np.int64)
        starts = np.cumsum(lens) - lens
        out = np.frombuffer(self.max_out, dtype=np.float64)
        out[np.frombuffer(self._rows, dtype=np.int64)] = np.maximum.reduceat(src, starts)
        self._start = len(self.values)
        self._rows = array("q")
        self._lens = array("q")

    def _merge(self) -> None:
        """Turn the pending samples into a sorted (distinct, counts) table on the stack of tables,
        then fold the top two together while the newer is at least half the older's size (a
        binary counter: a value is copied about log2(blocks) times; folding every block into one
        growing table copied the whole table, millions of values, at each block). The tables
        folded in any order give the same final table: the sorted distinct values and their counts."""
        self.write_max()  # (before the pending samples are folded in: they hold each row's own)
        new, counts = np.unique(np.frombuffer(self.values, dtype=np.float64), return_counts=True)
        self.values = array("d")
        self._start = 0
        tables = self._tables
        tables.append((new, counts.astype(np.int64)))
        while len(tables) > 1 and 2 * len(tables[-1][0]) >= len(tables[-2][0]):
            newer = tables.pop()
            tables.append(_fold(tables.pop(), newer))

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        """Every merged sample as one sorted (distinct values, counts) table."""
        if self.values:
            self._merge()
        tables = self._tables
        while len(tables) > 1:
            newer = tables.pop()
            tables.append(_fold(tables.pop(), newer))
        return tables[0] if tables else (np.zeros(0), np.zeros(0, dtype=np.int64))

    def of_row(self, row: int) -> np.ndarray | None:
        """A finished request's samples (exact mode), else None."""
        if not self.exact or self.offset[row] < 0:
            return None
        a = self.offset[row]
        return np.frombuffer(self.values, dtype=np.float64)[a:a + self.count[row]]

    def pooled_ms(self, rows: np.ndarray):
        """The samples of `rows` (finished requests, in order), in ms: an array in exact mode,
        else `ItlCounts` over every finished request."""
        if not self.exact:
            distinct, counts = self._table()
            return ItlCounts(distinct * 1e3, counts)
        src = np.frombuffer(self.values, dtype=np.float64)
        counts = self.count[rows].astype(np.int64)
        out = np.empty(int(counts.sum()), dtype=np.float64)
        pos = 0
        for a, k in zip(self.offset[rows].tolist(), counts.tolist()):
            out[pos:pos + k] = src[a:a + k]
            pos += k
        out *= 1e3
        return out


def _fold(older: tuple, newer: tuple) -> tuple:
    """Two sorted (distinct, counts) tables as one: `newer`'s counts added in place where `older`
    has the value, its other values inserted (one copy of `older`, which this consumes)."""
    distinct, counts = older
    new, new_counts = newer
    if not len(distinct):
        return newer
    at = np.searchsorted(distinct, new)
    hit = at < len(distinct)
    hit[hit] = distinct[at[hit]] == new[hit]
    counts[at[hit]] += new_counts[hit]  # distinct positions: `new` has no repeats
    miss = ~hit
    if miss.any():
        distinct = np.insert(distinct, at[miss], new[miss])
        counts = np.insert(counts, at[miss], new_counts[miss])
    return distinct, counts


class ItlCounts:
    """A pooled sample given as sorted distinct values and their counts (see `ItlPool`)."""

    def __init__(self, values: np.ndarray, counts: np.ndarray) -> None:
        self.values = values
        self.counts = counts

    def __len__(self) -> int:
        return int(self.counts.sum())

    def percentile(self, q: float) -> float:
        """numpy's default (linear) percentile of the expanded sample: the order statistics
        at floor and ceil of (n - 1) q / 100, interpolated as numpy does."""
        n = len(self)
        h = (n - 1) * (q / 100.0)
        lo = math.floor(h)
        cum = np.cumsum(self.counts)
        a = float(self.values[np.searchsorted(cum, lo, side="right")])
        b = float(self.values[np.searchsorted(cum, min(lo + 1, n - 1), side="right")])
        # numpy's _lerp (numpy/lib/_function_base_impl.py), same operations in the same order
        t = h - lo
        diff = b - a
        return b - diff * (1 - t) if t >= 0.5 else a + diff * t

    def mean(self) -> float:
        return math.fsum((self.values * self.counts).tolist()) / len(self)

    def std(self) -> float:
        m = self.mean()
        return math.sqrt(math.fsum((self.counts * (self.values - m) ** 2).tolist()) / len(self))

    def max(self) -> float:
        return float(self.values[-1])


class RequestRecord:
    """One request's final state, read from the table's columns (`Req`'s field names)."""

    __slots__ = ("rid", "arrival_s", "orig_prompt_len", "orig_output_len", "prompt_len", "max_new", "out_len",
                 "state", "finished", "admit_s", "first_token_s", "finish_s", "num_chunks", "num_retractions",
                 "slot", "truncated_prompt", "clipped_output", "replica", "kv_held", "prefix_len", "itls")

    def __repr__(self) -> str:
        return f"RequestRecord({self.rid}, out={self.out_len}/{self.max_new}, {self.state})"


# The outcome columns a request's hand-off writes: array typecode and initial value (int8, int32
# and float64 as numpy reads them, see _DTYPE); NaN: not reached (no token, not admitted)
OUTCOME_COLUMNS = {
    "state": ("b", 0), "admit_s": ("d", math.nan), "first_token_s": ("d", math.nan), "finish_s": ("d", math.nan),
    "generated_tokens": ("i", 0), "num_chunks": ("i", 0), "num_retractions": ("i", 0), "slot": ("i", -1),
    "replica": ("i", 0), "kv_held": ("i", 0), "prefix_len": ("i", 0), "max_itl_s": ("d", math.nan),
    "cached_tokens": ("i", 0),
}
assert array("i").itemsize == 4 and array("b").itemsize == 1 and array("q").itemsize == 8
_DTYPE = {"b": "int8", "i": "int32", "d": "float64", "q": "int64"}


def _filled(code: str, n: int, fill) -> array:
    return array(code, [fill]) * n


def _opt(v: float):
    return None if v != v else v


class RequestTable:
    """A run's requests: inputs (`RequestArrays`), the live `Req`s, the outcome columns.

    Row i is the i-th request of the workload. `make(i)` builds its `Req` (rows are made in
    order, when their arrival comes up); `finish(req)` records a finished one and forgets it;
    `close()` records the ones still live when the run ends. Rows never made (not yet arrived,
    or still in the inbox) keep their initial values: waiting, no token.
    """

    def __init__(self, requests: RequestArrays, max_req_input_len: int, max_req_len: int,
                 itls: bool = True, sent_s: "np.ndarray | None" = None, frontend=None) -> None:
        self.inputs = requests
        # with a frontend (sim/latency/frontend.py): `requests.arrival_s` is when the scheduler sees
        # each request and `sent_s` when the client sent it; the outcome columns are the client's
        # (arrival_s = sent, first_token_s and finish_s = the first and last chunk seen, ITLs as
        # the client records them), admit_s stays the scheduler's
        self.frontend = frontend
        # False: the requests keep no inter-token gaps (no ITL statistics, no max_itl_s), for
        # runs whose every reader needs none (sweeps): a gap per token is the costliest record
        self.keep_itls = itls
        self.max_req_input_len = max_req_input_len
        self.max_req_len = max_req_len
        n = len(requests)
        prompt, output = requests.prompt_tokens, requests.output_tokens
        # Req.__init__'s truncation and clip, for every row at once
        prompt_len = np.minimum(prompt, max_req_input_len)
        max_new = np.maximum(1, np.minimum(output, max_req_len - prompt_len - 1))
        self.next_row = 0  # rows below it have been made
        self.live: dict[int, Req] = {}  # row -> Req: made, not finished (in arrival order)
        # The outcome columns are `array`s that `_record` stores into (an item store on an array
        # costs a fraction of a numpy scalar store, and a request makes a dozen), read as numpy
        # views of the same memory (`columns`; the arrays are never resized, so the views stay valid)
        self._out = {name: _filled(code, n, fill) for name, (code, fill) in OUTCOME_COLUMNS.items()}
        outcome = {name: np.frombuffer(a, dtype=_DTYPE[a.typecode]) for name, a in self._out.items()}
        # (the finished requests' largest gaps: written by the pool, from the gaps it is handed)
        self.itls = ItlPool(n, self._out["max_itl_s"] if itls else None)
        self.columns: dict[str, np.ndarray] = {
            "req_id": requests.req_id, "arrival_s": requests.arrival_s if sent_s is None else sent_s,
            "prompt_tokens": prompt,
            "output_tokens": output, "prompt_len": prompt_len, "max_new_tokens": max_new,
            "truncated_prompt": prompt > max_req_input_len, "clipped_output": max_new < output,
            **outcome,
        }

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def arrival_s(self) -> np.ndarray:
        return self.inputs.arrival_s

    def make(self, row: int) -> Req:
        inp = self.inputs
        # (`item` gives the Python int or float itself, without a numpy scalar on the way)
        req = Req(inp.req_id.item(row), inp.arrival_s.item(row), inp.prompt_tokens.item(row),
                  inp.output_tokens.item(row), self.max_req_input_len, self.max_req_len)
        req.row = row
        req.keep_itls = self.keep_itls
        if inp.pieces is not None:
            req.pieces = inp.pieces[row]
        self.live[row] = req
        self.next_row = row + 1
        return req

    def _record(self, req: Req, gaps=None, pooled: bool = False) -> None:
        """Copy `req`'s outcome into the columns (`pooled`: its gaps go to the ITL pool, which
        writes their maximum)."""
        c, i = self._out, req.row
        c["state"][i] = _STATE_CODE[req.state]
        first, finish = req.first_token_s, req.finish_s
        fe = self.frontend
        if fe is not None and first is not None:
            seen_first, seen_last, gaps = fe.client_view(first, finish if finish is not None else first,
                                                         req.out_len, gaps)
            first, finish = seen_first, (seen_last if finish is not None else None)
        for name, v in (("admit_s", req.admit_s), ("first_token_s", first), ("finish_s", finish)):
            if v is not None:
                c[name][i] = v
        c["generated_tokens"][i] = req.out_len
        c["num_chunks"][i] = req.num_chunks
        c["num_retractions"][i] = req.num_retractions
        c["slot"][i] = req.slot
        c["replica"][i] = req.replica
        c["kv_held"][i] = req.kv_held
        c["prefix_len"][i] = req.prefix_len
        c["cached_tokens"][i] = req.cached_tokens
        if gaps is not None and len(gaps) and self.keep_itls and not pooled:
            c["max_itl_s"][i] = max(gaps)
        return gaps

    def finish(self, req: Req) -> None:
        """The hand-off of a finished request: its outcome to the columns, its gaps to the pool."""
        gaps = self._record(req, req.itls, pooled=self.keep_itls)
        if self.keep_itls:
            self.itls.add(req.row, gaps if isinstance(gaps, array) else array("d", gaps))
        req.itls = array("d")  # the pool has them; the scheduler may still hold the Req a while
        del self.live[req.row]

    def close(self) -> None:
        """The end of the run: record the requests still inside as they stand."""
        self.itls.write_max()  # (the finished requests' largest gaps still pending)
        for req in self.live.values():
            req.settle()  # (tokens of an open decode segment: state.Req)
            self._record(req, req.itls)
        self.live = {}

    def queue(self) -> "LazyQueue":
        return LazyQueue(self)

    # -- the list of requests it replaces --
    def __getitem__(self, i: int) -> RequestRecord:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        c = self.columns
        r = RequestRecord()
        r.rid = int(c["req_id"][i])
        r.arrival_s = float(c["arrival_s"][i])
        r.orig_prompt_len = int(c["prompt_tokens"][i])
        r.orig_output_len = int(c["output_tokens"][i])
        r.prompt_len = int(c["prompt_len"][i])
        r.max_new = int(c["max_new_tokens"][i])
        r.out_len = int(c["generated_tokens"][i])
        r.state = STATES[c["state"][i]]
        r.finished = r.state == FINISHED
        r.admit_s = _opt(float(c["admit_s"][i]))
        r.first_token_s = _opt(float(c["first_token_s"][i]))
        r.finish_s = _opt(float(c["finish_s"][i]))
        r.num_chunks = int(c["num_chunks"][i])
        r.num_retractions = int(c["num_retractions"][i])
        r.slot = int(c["slot"][i])
        r.truncated_prompt = bool(c["truncated_prompt"][i])
        r.clipped_output = bool(c["clipped_output"][i])
        r.replica = int(c["replica"][i])
        r.kv_held = int(c["kv_held"][i])
        r.prefix_len = int(c["prefix_len"][i])
        own = self.itls.of_row(i)
        r.itls = own.tolist() if own is not None else []
        return r

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class LazyQueue:
    """The not yet delivered rows of a table, as the deque of `Req`s the inbox used to hold:
    `queue[0]` makes the head's `Req` (once), `popleft()` hands it over."""

    __slots__ = ("table", "head", "n")

    def __init__(self, table: RequestTable) -> None:
        self.table = table
        self.head: Req | None = None
        self.n = len(table)  # (a table's rows are fixed: asked once, not at every arrival)

    def __len__(self) -> int:
        return self.n - self.table.next_row + (self.head is not None)

    def __bool__(self) -> bool:
        return self.head is not None or self.table.next_row < self.n

    def __getitem__(self, i: int) -> Req:
        if i != 0:
            raise IndexError("only the head of the inbox is visible")
        if self.head is None:
            t = self.table
            if t.next_row >= self.n:
                raise IndexError("empty inbox")
            self.head = t.make(t.next_row)
        return self.head

    def popleft(self) -> Req:
        req = self[0]
        self.head = None
        return req
