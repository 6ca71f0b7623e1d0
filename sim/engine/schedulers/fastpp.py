"""The FastPP / SGLang 0.4.1 scheduler step, without a clock.

`Scheduler.form_batch(slot, now_s)` does what `get_next_batch_to_run` does for one micro-batch
slot (fastpp-system-model.md sections 1.4-1.9): retire the slot's previous micro-batch, try a
prefill/mixed batch under the chunk budget (at most one request being chunked, its chunks
moving through consecutive slots), else a decode-only batch with the only OOM retraction.
`Scheduler.process_result(mb, now_s)` emits tokens when a micro-batch leaves the last stage.
The clock (SimPy) lives in `sim.engine.pipeline`; this module only moves tokens and KV.

A KV allocation failure in a prefill/mixed batch (possible because admission does not reserve
for requests inside in-flight micro-batches) ends the run with `on_kv_exhausted = "exit"`, as
the real server exits; with `"retract"` the prefill part is dropped (admitted requests stay
queued, the chunked request keeps its prefix) and the slot runs a decode batch, which retracts
and requeues as on a decode OOM; a decode batch whose last request cannot get its slot
requeues that request too, where the artifact exits.
"""

from __future__ import annotations

from array import array
from itertools import islice
from operator import itemgetter
from typing import Any, Final

from sim.engine.state import DECODE, EXTEND, FINISHED, MIXED, RUNNING, WAITING, MicroBatch, Req, lengths
from sim.engine.waiting import WaitingQueue

# SGLang / FastPP constants (python/sglang/global_config.py, schedule_policy.py).
# (Final: compiled, they are constants, not a lookup in the module's dictionary at every use)
CLIP_MAX_NEW_TOKENS: Final = 4096
RETRACT_DECODE_STEPS: Final = 20
INIT_NEW_TOKEN_RATIO: Final = 0.7
MIN_NEW_TOKEN_RATIO: Final = 0.7 * 0.14
NEW_TOKEN_RATIO_DECAY: Final = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600

CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"


class RunFailed(Exception):
    """The real server would exit here (e.g. KV allocation failure in a prefill batch)."""


class Slot:
    """Per-slot state: `running` is SGLang's running_batch (None while a mixed/extend
    micro-batch of this slot is in flight), `last` the micro-batch last launched."""

    __slots__ = ("index", "running", "last", "cycle_start_s", "sampled", "summary", "times", "holes", "stalled")

    def __init__(self, index: int) -> None:
        self.index = index
        self.running: list[Req] | None = None
        self.last: MicroBatch | None = None
        self.cycle_start_s: float | None = None  # previous result time of this slot's batch
        # What the token emission of the slot's last micro-batch learnt about the running list
        # it left (a decode batch's `decodes`, the very list object, or the list `_retire` made
        # of a prefill/mixed batch): `summary` = (summed context of the requests that did not
        # finish, how many finished, summed tokens left, most tokens left). Valid only while
        # `running is sampled` (every change to the running list makes a new list or clears
        # `sampled`), so the next batch and the admission tests need no walk over it.
        self.sampled: list[Req] | None = None
        self.summary: tuple[int, int, int, int] = (0, 0, 0, 0)
        # the result time of each of the slot's micro-batches: the token times of the
        # requests decoding in it (their decode segments, state.Req)
        self.times = array("d")
        # the entries of `times` that were stalls (a prefill-only step that left the running
        # requests out: cached.py `stall`), ascending: no token of the requests then decoding here
        self.holes = array("q")
        self.stalled = False  # the micro-batch in flight stalls the running requests


class Scheduler:
    def __init__(self, num_slots: int, kv_tokens: int, max_running_requests: int, chunk_size: int,
                 on_kv_exhausted: str = "exit") -> None:
        self.num_slots = num_slots
        self.retract_on_kv_exhausted = on_kv_exhausted == "retract"
        self.kv_exhausted_events = 0  # batches dropped or requests requeued for lack of KV ("retract")
        self.kv_capacity = kv_tokens
        self.kv_free = kv_tokens
        self.max_running = max_running_requests
        self.chunk_size = chunk_size
        self.slots = [Slot(i) for i in range(num_slots)]
        self.waiting = WaitingQueue()
        self.chunked: Req | None = None
        self.batch_is_full = False
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.num_active = 0  # admitted, not finished, not retracted (paused ones included)
        self.num_launched = 0
        self.pending: list[Req] = []  # paused by the rebalancer; they keep their KV
        # (arrival time, prompt tokens) of every request the scheduler has seen, in arrival
        # order, as typed columns: the requests themselves leave when they finish
        self.arrived_s = array("d")
        self.arrived_prompt = array("q")
        self.on_finish: Any = None  # called with each request as it finishes (the run's RequestTable)
        # Append-only samples the controllers read (server-side signals, system model 2.2):
        # TTFT from scheduler arrival, and per-slot cycle times (the artifact's "TPOT").
        self.ttft_samples = array("d")  # compact: one per request / per iteration
        self.tpot_samples = array("d")
        self.num_finished = 0
        self.retractions = 0
        # Whether the chunk budget ever shaped a batch (a prompt cut, or admission stopped by the
        # budget), and the smallest budget that would have formed every batch alike: a static-
        # chunk run that was never bound is exactly the run of any chunk >= chunk_need.
        self.chunk_bound = False
        self.chunk_need = 0
        # SGLang 0.4.1 resets the token ratio whenever no batch is formed (on_idle); 0.5.23 only
        # when fully idle (the pipeline reads this)
        self.reset_ratio_on_empty_batch = True
        self.overlap_host = False  # SGLang's overlap scheduler hides host time (sglang.py)
        self.host_cost: Any = None  # the engine version's host time model (sim/engine/hosttime.py); None: the profile's

    # ------------------------------------------------------------------ helpers
    def add_waiting(self, req: Req) -> None:
        self.waiting.append(req)
        self.arrived_s.append(req.arrival_s)
        self.arrived_prompt.append(req.prompt_len)

    def kv_used(self) -> int:
        return self.kv_capacity - self.kv_free

    def kv_evictable(self) -> int:
        """Tokens counted as used that an allocation can take back (a prefix cache's unpinned tokens,
        cached.py): none without a cache."""
        return 0

    def _alloc(self, req: Req, tokens: int, what: str, now_s: float) -> None:
        if tokens > self.kv_free:
            raise RunFailed(
                f"KV allocation failed at t={now_s:.3f}s in a {what} batch: request {req.rid} needs "
                f"{tokens} tokens, {self.kv_free} of {self.kv_capacity} free (the real server exits)"
            )
        self.kv_free -= tokens
        req.kv_base += tokens

    def _live(self, slot: Slot) -> tuple[list[Req], tuple[int, int, int] | None]:
        """The slot's running requests that have not finished, and their (summed context,
        summed tokens left, most tokens left), None: unknown, to be summed. After the slot's
        micro-batch was sampled both are known (`Slot.sampled`): the list itself when nothing
        finished, else a filtered copy (a finished request has no tokens left)."""
        running = slot.running
        assert running is not None  # (callers check; the compiled module needs it said)
        if running is slot.sampled:
            ctx, done, left, top = slot.summary
            if done == 0:
                return running, (ctx, left, top)
            return [r for r in running if not r.finished], (ctx, left, top)
        return [r for r in running if not r.finished], None

    def _drop_finished(self, slot: Slot) -> list[Req]:
        """The slot's running requests without the finished ones (`_live`); when some finished, the
        batch is no longer full (a request left) and the list's sampled summary moves to the copy."""
        assert slot.running is not None
        live, known = self._live(slot)
        if len(live) < len(slot.running):
            self.batch_is_full = False
            if known is not None:  # (the finished ones had no context or tokens left)
                slot.sampled = live
                slot.summary = (known[0], 0, known[1], known[2])
        return live

    def _alloc_decode(self, reqs: list[Req], what: str, now_s: float,
                      known: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
        """One KV slot per decode request (prepare_for_decode), checked once for the batch.
        Returns the requests' (summed context (prompt + output), summed tokens left, most
        tokens left): the batch stats need the first, the token emission the others (`known`
        when the caller knows them already)."""
        if len(reqs) > self.kv_free:
            raise RunFailed(
                f"KV allocation failed at t={now_s:.3f}s in a {what} batch: {len(reqs)} decode tokens "
                f"needed, {self.kv_free} of {self.kv_capacity} free (the real server exits)"
            )
        self.kv_free -= len(reqs)
        # NOTE: each request's own count (kv_held) takes the slot when its token comes back
        # (process_result, counted by its decode segment).
        return known if known is not None else lengths(reqs)

    def _free(self, req: Req) -> None:
        req.settle()
        self.kv_free += req.kv_base
        req.kv_base = 0

    def is_idle(self) -> bool:
        return self.num_active == 0 and not self.waiting and self.chunked is None

    # ------------------------------------------------------------------ one step
    def form_batch(self, slot_idx: int, now_s: float, rebalance=None) -> MicroBatch | None:
        """Form the next micro-batch of `slot_idx` (None: the slot has nothing to run).

        `rebalance(slot_idx)`, if given, is the batch rebalancer: it runs after the slot's
        previous micro-batch is merged and before admission, and returns `Move`s to apply.
        """
        slot = self.slots[slot_idx]
        self._retire(slot)
        if rebalance is not None and (slot.running or self.pending):
            if slot.running:
                slot.running = self._drop_finished(slot)
            for move in rebalance(slot_idx):
                self._apply_move(slot, move)
        mb = self._prefill_batch(slot, now_s)
        if mb is None:
            mb = self._decode_batch(slot, now_s)
        slot.last = mb
        if mb is not None:
            self.num_launched += 1
        return mb

    def _apply_move(self, slot: Slot, move) -> None:
        """Pause a running request of `slot` into the pending list, or resume one into it."""
        if slot.running is not None:  # (a copy: the list may be an earlier batch's decodes)
            slot.running = list(slot.running)
        slot.sampled = None
        if move.to_pending:
            assert slot.running is not None
            req = next(r for r in slot.running if r.rid == move.req_id)
            req.settle()  # (its next token comes from another slot, or after a gap)
            slot.running.remove(req)
            self.pending.insert(0, req) if move.at_head else self.pending.append(req)
        else:
            req = next(r for r in self.pending if r.rid == move.req_id)
            self.pending.remove(req)
            if slot.running is None:
                slot.running = []
            slot.running.insert(0, req) if move.at_head else slot.running.append(req)
            req.slot = slot.index

    def _retire(self, slot: Slot) -> None:
        """Step 1 of get_next_batch_to_run: a finished prefill/mixed micro-batch becomes the
        slot's running batch, without the request whose chunks moved on."""
        last = slot.last
        if last is None or last.mode == DECODE:
            return
        chunked = last.chunked
        kept = [p[0] for p in last.prefill if p[0] is not chunked and not p[0].finished]
        # what the emission left of the decodes, plus the prefilled requests that stay
        assert last.after is not None
        ctx, done, total, top = last.after
        ctx, total, top = lengths(kept, ctx, total, top)
        kept += last.decodes if done == 0 else [r for r in last.decodes if not r.finished]
        # (the request being chunked is never a decode)
        if len(kept) < sum(1 for p in last.prefill if p[0] is not chunked) + len(last.decodes):
            self.batch_is_full = False
        running = slot.running
        # a running list that sat out a prefill-only step (its requests stalled: cached.py) keeps its
        # summary, and the requests this batch prefilled add theirs
        stalled = running is not None and running is slot.sampled and not last.decodes
        slot.sampled = None
        if kept:
            if running is None:
                slot.running = kept
                slot.sampled = kept
                slot.summary = (ctx, 0, total, top)
            else:  # (the running list grows in place)
                running.extend(kept)
                if stalled:
                    c0, d0, t0, p0 = slot.summary
                    slot.sampled = running
                    slot.summary = (c0 + ctx, d0, t0 + total, p0 if p0 > top else top)
        elif stalled:
            slot.sampled = running
        slot.last = None

    def _reserved_output_tokens(self) -> float:
        total = 0
        for s in self.slots:
            if s.running:
                for r in s.running:
                    left = r.max_new - r.out_len
                    total += left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS
        return total * self.new_token_ratio

    def _prefill_batch(self, slot: Slot, now_s: float) -> MicroBatch | None:
        chunked = self.chunked
        if (self.batch_is_full or not self.waiting) and chunked is None:
            return None
        running_bs = len(slot.running) if slot.running else 0
        if running_bs >= self.max_running:
            self.batch_is_full = True
            return None
        adder = PrefillAdder(self, running_bs)
        if chunked is not None:
            adder.add_chunked(chunked)
        admitted = 0
        for req in self.waiting:
            if running_bs + len(adder.can_run) >= self.max_running:
                self.batch_is_full = True
                break
            res = adder.add_one(req)
            admitted += adder.admitted_last
            if res is not CONTINUE:
                if res is NO_TOKEN:
                    self.batch_is_full = True
                break
        if adder.bound:
            self.chunk_bound = True
        if not adder.can_run:
            return None
        # one token of budget to spare, or the budget itself would have ended the admission
        self.chunk_need = max(self.chunk_need, self.chunk_size - adder.rem_chunk + 1)
        if self.retract_on_kv_exhausted:
            need = sum(new for _req, new in adder.can_run)
            if slot.running is not None:
                need += sum(1 for r in slot.running if not r.finished)
            if need > self.kv_free:
                # Nothing was popped or allocated yet: dropping the adder leaves the queue as
                # it was; _decode_batch then retracts if even the decodes do not fit.
                self.kv_exhausted_events += 1
                return None
        for _ in range(admitted):
            req = self.waiting.popleft()
            req.state = RUNNING
            req.slot = slot.index
            if req.admit_s is None:
                req.admit_s = now_s
            self.num_active += 1
        # Allocation: prefill tokens first (prepare_for_extend), then one per decode.
        prefill = []
        for req, new in adder.can_run:
            self._alloc(req, new, "prefill", now_s)
            prefill.append((req, new, req.prefix_len))
            req.prefix_len += new
            req.num_chunks += 1
            req.slot = slot.index
        self.chunked = adder.new_chunked
        decodes: list[Req] = []
        mode = EXTEND
        known = (0, 0, 0)
        if slot.running is not None:
            live, summary = self._live(slot)
            if live:
                known = self._alloc_decode(live, "mixed", now_s, summary)
                decodes = live
                mode = MIXED
            slot.running = None
        return MicroBatch(self.num_launched, slot.index, mode, prefill, decodes, adder.new_chunked, self.chunk_size,
                          decode_ctx=known[0], decode_left=known[1:])

    def _decode_batch(self, slot: Slot, now_s: float) -> MicroBatch | None:
        """update_running_batch: filter, retract on OOM, allocate one slot per request."""
        if slot.running is None:
            return None
        before = len(slot.running)
        live, known = self._live(slot)
        if not live:
            self.batch_is_full = False
            slot.running = None
            slot.cycle_start_s = None
            return None
        if len(live) < before:
            self.batch_is_full = False
        if self.kv_free < len(live):
            live = self._retract(live)
            known = None  # (fewer requests now)
            self.batch_is_full = False
            if self.retract_on_kv_exhausted and self.kv_free < len(live):
                # the last request cannot decode either (the artifact exits): requeue it too
                self.kv_exhausted_events += 1
                for req in live:
                    self._requeue(req)
                self.retractions += len(live)
                self.waiting.extend(live)
                slot.running = None
                slot.cycle_start_s = None
                return None
        else:
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        known = self._alloc_decode(live, "decode", now_s, known)
        slot.running = live
        return MicroBatch(self.num_launched, slot.index, DECODE, [], live, None, self.chunk_size,
                          decode_ctx=known[0], decode_left=known[1:])

    def _retract(self, live: list[Req]) -> list[Req]:
        """retract_decode: drop the requests with the fewest generated tokens (ties: the
        longest prompt) until 20 decode steps of room remain; they re-queue at the tail."""
        order = sorted(live, key=lambda r: (r.out_len, -r.prompt_len), reverse=True)
        retracted = []
        first = True
        while self.kv_free < len(order) * RETRACT_DECODE_STEPS or first:
            if len(order) == 1:
                break
            first = False
            req = order.pop()
            self._requeue(req)
            retracted.append(req)
        self.retractions += len(retracted)
        decoded = sum(r.out_len for r in order)
        max_new = sum(r.max_new for r in order)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / max_new)
        self.waiting.extend(retracted)
        keep = set(id(r) for r in order)
        return [r for r in live if id(r) in keep]

    def _requeue(self, req: Req) -> None:
        """Free a retracted request's KV; it re-prefills prompt + generated tokens later."""
        self._free(req)
        req.prefix_len = 0
        req.fill_len = req.prompt_len + req.out_len
        req.state = WAITING
        req.num_retractions += 1
        self.num_active -= 1

    # ------------------------------------------------------------------ results
    def process_result(self, mb: MicroBatch, now_s: float) -> None:
        """Sample one token for every request of `mb` except a cut chunk (artifact 1.6)."""
        slot = self.slots[mb.slot]
        times = slot.times
        j = len(times)
        times.append(now_s)
        if slot.stalled:  # (one micro-batch of a slot is in flight at a time: this one)
            slot.holes.append(j)
            slot.stalled = False
        # NOTE: a batch carrying the slot's running requests continues its cycle; a fresh
        # extend batch starts one (SGLang copies cur_time on merge; a new batch has none).
        if mb.mode != EXTEND and slot.cycle_start_s is not None:
            self.tpot_samples.append(now_s - slot.cycle_start_s)
        slot.cycle_start_s = now_s
        chunked = mb.chunked
        for req, _new, _prefix in mb.prefill:
            if req is not chunked:
                self._emit(req, now_s, slot, j)
        # the hot loop: a request in its decode segment of this slot only counts its token
        # (state.Req: the gap and the KV slot are settled when the segment ends)
        decodes = mb.decodes
        done = done_ctx = 0
        for req in decodes:
            out = req.out_len + 1
            req.out_len = out
            if out >= req.max_new or req.seg_times is not times:
                req.out_len = out - 1
                req.kv_base += 1  # the KV slot allocated when the batch was formed (_alloc_decode)
                self._emit(req, now_s, slot, j)
                if req.finished:
                    done += 1
                    done_ctx += req.prompt_len + req.out_len
        # every decode request's context grew by one and its tokens left fell by one; the
        # finished ones leave (with none left)
        n = len(decodes)
        after = (mb.stats.sum_decode_ctx + n - done_ctx, done, mb.left_sum - n, mb.left_top - 1 if n else 0)
        if decodes is slot.running:  # a decode batch: its list is the slot's running list
            slot.sampled = decodes
            slot.summary = after
        else:  # a prefill/mixed batch: `_retire` makes the running list
            mb.after = after

    def _emit(self, req: Req, now_s: float, slot: Slot, j: int) -> None:
        """A token sampled at `slot.times[j]` (= `now_s`) outside a decode segment's run: the
        first, the last, or one that starts a segment in this slot."""
        times = slot.times
        if req.seg_times is not None:
            # its previous token was the slot's previous result if it was decoding here
            req.settle(j - 1 if req.seg_times is times else None)
        req.out_len += 1
        if req.first_token_s is None:
            req.first_token_s = now_s
            self.ttft_samples.append(now_s - req.arrival_s)
        else:
            req.itls.append(now_s - req.last_token_s)
        req.last_token_s = now_s
        if req.out_len >= req.max_new:
            req.finished = True
            req.state = FINISHED
            req.finish_s = now_s
            self._free(req)
            self.num_active -= 1
            self.num_finished += 1
            if self.on_finish is not None:
                self.on_finish(req)
        else:
            req.seg_times = times
            req.seg_idx = j
            req.seg_holes = slot.holes


class PrefillAdder:
    """SGLang's PrefillAdder for ignore-EOS requests with FastPP's pipeline margin.

    Budgets (section 1.5): the chunk budget counts one token per decode request of the slot;
    the memory test (section 1.8) walks the running requests of every slot whose running
    batch is visible, sorted by tokens left, and refuses a request that could run the pool dry.
    """

    def __init__(self, sched: Scheduler, running_bs: int) -> None:
        self.sched = sched
        free = sched.kv_free
        chunk = sched.chunk_size
        self.rem_chunk = chunk - running_bs
        self.rem_input = chunk - running_bs
        self.cur_rem = free - running_bs
        # rem_total needs a walk over every running request; it is computed when first read
        # (many batches never read it), replaying the deductions made until then in order.
        self._free_bs = free - running_bs
        self._rem_total: float | None = None
        self._taken: list[int] = []
        self.margin = sched.num_slots - 1
        self.can_run: list[tuple[Req, int]] = []
        self.new_chunked: Req | None = None
        self._totals: tuple[int, int, int] | None = None  # see `running_totals`
        # The memory test's sorted states are built only when a cheap bound cannot decide
        # (`_passes_memory_test`); until then it keeps what building them needs.
        self.states: list[tuple[int, int]] | None = None
        self._first: Req | None = None  # the request of the first test
        self._first_can_run = 0  # how many pieces were in can_run then
        self._later: list[Req] = []  # the requests tested since, in order
        self._left_sum = 0  # the states' tokens left: their sum and maximum
        self._left_max = 0
        self._unsorted = False  # a later state was inserted by the quirk (`_passes_memory_test`)
        self.admitted_last = 0
        self.bound = False  # the chunk budget cut a prompt or ended the admission

    def running_totals(self) -> tuple[int, int, int]:
        """One walk over every slot's visible running requests (finished ones still in the
        lists included, as both readers see them): the sum and the maximum of their tokens
        left (max_new - out_len), and how many they are."""
        if self._totals is None:
            total = top = n = 0
            for s in self.sched.slots:
                running = s.running
                if running:
                    n += len(running)
                    if running is s.sampled:  # (known from its emission: Slot.summary)
                        _ctx, _done, left, most = s.summary
                        total += left
                        top = max(top, most)
                    else:
                        _ctx, total, top = lengths(running, 0, total, top)
            self._totals = (total, top, n)
        return self._totals

    @property
    def rem_total(self) -> float:
        if self._rem_total is None:
            total, top, _n = self.running_totals()
            # (the reservation clips each request's tokens left; with none over the clip the
            # sum is the walk's, the same integer times the same ratio)
            reserved = (total * self.sched.new_token_ratio if top <= CLIP_MAX_NEW_TOKENS
                        else self.sched._reserved_output_tokens())
            rem: float = self._free_bs - reserved
            for taken in self._taken:
                rem -= taken
            self._rem_total = rem
        return self._rem_total

    def _take(self, new: int, reserve: int) -> None:
        if self._rem_total is None:
            self._taken.append(new + reserve)
        else:
            self._rem_total -= new + reserve
        self.cur_rem -= new
        self.rem_input -= new
        self.rem_chunk -= new

    def budget_state(self) -> str:
        if self.rem_total <= 0 or self.cur_rem <= 0:
            return NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            self.bound = True
            return OTHER
        return CONTINUE

    def add_chunked(self, req: Req) -> None:
        """add_inflight_req: the request being chunked continues first, in this slot."""
        remaining = req.fill_len - req.prefix_len
        # NOTE: with more decodes than the chunk budget the artifact would compute a
        # non-positive extend; the chunk then waits for a later slot (0 tokens here).
        new = max(0, min(remaining, self.rem_chunk))
        truncated = remaining > new
        self.bound = True  # (a request is being chunked: the budget cut it)
        self._take(new, 0 if truncated else min(req.max_new, CLIP_MAX_NEW_TOKENS))
        if new > 0:
            self.can_run.append((req, new))
        self.new_chunked = req if truncated else None

    def _state(self, r: Req) -> tuple[int, int] | None:
        left = r.max_new - r.out_len + self.margin
        return (left, r.prompt_len + r.out_len) if left > 0 else None

    def _passes_memory_test(self, req: Req) -> bool:
        # The walk below fails only if some room - left_i * k <= 0. Sorted by tokens left, the
        # k - 1 states after i each have at least left_i, so left_i * k <= (the lefts from i on)
        # + max(left); and room only grows (contexts are >= 0). So once room exceeds the sum of
        # the lefts still ahead plus the largest, every remaining check passes: tested first
        # with all the states (no need to build and sort them), then at every step of the walk.
        # After the insertion quirk (a new largest lands before the last) all but the last
        # state stay sorted, and the same argument holds with twice the largest.
        margin = self.margin
        if self._first is None:
            self._first = req
            self._first_can_run = len(self.can_run)
            total, top, n = self.running_totals()
            lefts = [r.max_new - r.out_len + margin for r in [req] + [p[0] for p in self.can_run]]
            if margin > 0:
                total += margin * n
            else:  # (states with no tokens left are left out; with margin 0 they add nothing)
                lefts = [v for v in lefts if v > 0]
            self._left_sum = total + sum(lefts)
            self._left_max = max([top + margin] + lefts)
        else:
            left = req.max_new - req.out_len + margin
            if left > 0:
                if left > self._left_max:
                    self._unsorted = self._unsorted or self._left_sum > 0  # (the quirk: see above)
                    self._left_max = left
                self._left_sum += left
            if self.states is None:
                self._later.append(req)
            else:
                self._insert_state(req)
        room = self.cur_rem - req.prompt_len  # rem + the context freed so far
        slack = 2 * self._left_max if self._unsorted else self._left_max
        if room > self._left_sum + slack:
            return True
        if self.states is None:
            self._build_states()
        states = self.states
        if not states:
            return True
        # Walk the requests in order of tokens left: after request i finishes, the ones behind
        # it have freed their tokens, and the n - i still running need left[i + 1] more each
        # (the test fails if rem + freed_i - left[i + 1] * (n - i) <= 0). All integers, so this
        # exact form equals the artifact's float arithmetic.
        k = len(states)  # n - i
        ahead = self._left_sum - states[0][0]  # the lefts from i + 1 on
        ctx_prev = states[0][1]
        for left, ctx in islice(states, 1, None):
            if room > ahead + slack:
                return True
            if room - left * k <= 0:
                return False
            room += ctx_prev
            ctx_prev = ctx
            ahead -= left
            k -= 1
        return room - states[-1][0] > 0

    def _build_states(self) -> None:
        """The states as the artifact builds them at the first test (that request, the
        running requests, the pieces already admitted; stable-sorted by tokens left), then
        each later request inserted in turn."""
        margin = self.margin
        assert self._first is not None
        reqs = [self._first]
        for s in self.sched.slots:
            if s.running:
                reqs.extend(s.running)
        reqs.extend(r for r, _ in self.can_run[:self._first_can_run])
        # (states with no tokens left are left out; with a margin every state has some)
        states = [(left, r.prompt_len + r.out_len) for r in reqs if (left := r.max_new - r.out_len + margin) > 0]
        states.sort(key=itemgetter(0))
        self.states = states
        for r in self._later:
            self._insert_state(r)

    def _insert_state(self, req: Req) -> None:
        st = self._state(req)
        if st is not None:
            # NOTE: SGLang's insertion loop leaves i = len-1 when no element is larger,
            # so a new largest entry lands before the last one; kept for fidelity.
            assert self.states is not None
            i = 0
            for i in range(len(self.states)):
                if st[0] <= self.states[i][0]:
                    break
            self.states.insert(i, st)

    def add_one(self, req: Req) -> str:
        """add_one_req_ignore_eos; sets `admitted_last` to 1 if `req` joined the batch."""
        self.admitted_last = 0
        if not self._passes_memory_test(req):
            return NO_TOKEN
        new = req.fill_len - req.prefix_len
        if new <= self.rem_chunk:
            self.can_run.append((req, new))
            self._take(new, min(req.max_new, CLIP_MAX_NEW_TOKENS))
        else:
            self.bound = True
            if self.rem_chunk <= 0:
                return OTHER
            cut = self.rem_chunk
            self.can_run.append((req, cut))
            self.new_chunked = req
            self._take(cut, 0)
        self.admitted_last = 1
        return self.budget_state()


# ---------------------------------------------------------------- the engine (sim/engine/schedulers/__init__.py)

VERSIONS = {"fastpp": "FastPP (fork of SGLang 0.4.1, radix cache off)"}  # `[scheduler] engine_version`
DEFAULT_VERSION = "fastpp"
VERSION = VERSIONS[DEFAULT_VERSION]


class FastPPEngine:
    """The FastPP artifact's scheduler, PipeSim's default and calibrated engine."""

    name = "fastpp"
    versions = VERSIONS  # `[scheduler] engine_version` keys -> the release

    def settings(self, sc: Any, hw: Any) -> Any:
        from sim.core.errors import ConfigError
        from sim.engine.schedulers import EngineSettings, pick_version

        pick_version(self.name, VERSIONS, DEFAULT_VERSION, sc.engine_version)
        if sc.prefix_cache:
            raise ConfigError("config [scheduler] prefix_cache = true with engine 'fastpp': the artifact runs with "
                              "the radix cache off and PipeSim models it so; allowed: false (or engine 'sglang')")
        if sc.cuda_graphs:
            raise ConfigError("config [scheduler] cuda_graphs = true with engine 'fastpp': its profiles were calibrated "
                              "on the artifact's own runs, whatever graphs those replayed; allowed: false (or the "
                              "sglang / vllm engines, whose padding is modelled)")
        return EngineSettings(engine="fastpp", token_budget=sc.chunk_size_tokens, max_running=sc.max_running_requests,
                              prefix_cache=False, cuda_graphs=False, overlap=False, capture_sizes=(),
                              version=VERSION, note="radix cache off")

    def build(self, settings: Any, num_slots: int, kv_tokens: int, max_running: int, chunk_size: int,
              on_kv_exhausted: str, sc: Any) -> Scheduler:
        return Scheduler(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted)


def _register() -> None:
    from sim.engine.schedulers import schedulers

    schedulers.register("fastpp")(FastPPEngine)


_register()
