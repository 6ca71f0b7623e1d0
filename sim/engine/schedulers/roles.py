"""The engines' schedulers in the two roles of disaggregated serving (sim/engine/disagg.py): FastPP's,
SGLang 0.5.23's and vLLM V1's (0.10.1.1).

In their own module, beside the scheduler they extend, because that scheduler may be compiled
(sim/native.py) and a compiled class is subclassed only by compiled classes: this module is
compiled with it.
"""

from __future__ import annotations

from typing import Any

from sim.engine.schedulers.fastpp import Scheduler
from sim.engine.schedulers.sglang import SGLangScheduler
from sim.engine.schedulers.vllm_v1 import VllmV1Scheduler
from sim.engine.state import RUNNING, Req
from sim.policies.base import Move


class PrefillScheduler(Scheduler):
    """FastPP's scheduler on a prefill instance; it tells `on_start` when a request's first chunk is
    scheduled, and `on_chunk` each chunk (its requests are one-token shadows of the real ones)."""

    on_start: Any = None
    on_chunk: Any = None

    def form_batch(self, slot_idx: int, now_s: float, rebalance=None):
        mb = super().form_batch(slot_idx, now_s, rebalance)
        _announce(self, mb, now_s)
        return mb


class DecodeScheduler(Scheduler):
    """FastPP's scheduler on a decode instance. Requests reach it only with their KV in its pool
    (`add_waiting` is their way in from the inbox): they are held in its paused list and join the
    running requests of the next slot it schedules (at most `max_running` per slot), as decodes."""

    def add_waiting(self, req: Req) -> None:
        self.pending.append(req)
        self.num_active += 1
        req.state = RUNNING
        self.arrived_s.append(req.arrival_s)
        self.arrived_prompt.append(req.prompt_len)

    def form_batch(self, slot_idx: int, now_s: float, rebalance=None):
        return super().form_batch(slot_idx, now_s, self._join if self.pending else rebalance)

    def _join(self, slot_idx: int) -> list[Move]:
        slot = self.slots[slot_idx]
        room = self.max_running - (len(slot.running) if slot.running else 0)
        return [Move(r.rid, False, False) for r in self.pending[:max(room, 0)]]


# -- SGLang's and vLLM V1's schedulers in the two roles -------------------------------------------------------
# The same two roles on the engines' own schedulers (sim/engine/disagg.py says whose hand-off each follows).


def _announce(sched: Any, mb: Any, now_s: float) -> None:
    """Tell the disaggregated run a request's first chunk was scheduled (`on_start`), and each chunk's size
    (`on_chunk`: a prompt's KV ships chunk by chunk in SGLang)."""
    if mb is None:
        return
    for req, new, prefix in mb.prefill:
        if sched.on_chunk is not None:
            sched.on_chunk(req, new, now_s)
        if prefix == 0 and req.num_chunks == 1 and sched.on_start is not None:
            sched.on_start(req, now_s)


class SGLangPrefillScheduler(SGLangScheduler):
    """SGLang 0.5.23's scheduler on a prefill server (`disaggregation/prefill.py`
    `SchedulerDisaggregationPrefillMixin`: the same prefill-first steps; its requests are one-token shadows)."""

    on_start: Any = None
    on_chunk: Any = None

    def form_batch(self, slot_idx: int, now_s: float, rebalance: Any = None) -> Any:
        mb = super().form_batch(slot_idx, now_s, rebalance)
        _announce(self, mb, now_s)
        return mb


class SGLangDecodeScheduler(SGLangScheduler):
    """SGLang 0.5.23's scheduler on a decode server: a request whose KV has landed joins the running batch
    of the next micro-batch it schedules, at most `max_running_requests` less those running (per micro-batch
    with PP), without a forward pass of its own (`disaggregation/decode.py` `_get_new_prebuilt_batch`:
    `num_not_used_batch = batch_size - curr_batch_size`; `prepare_for_prebuilt`)."""

    def add_waiting(self, req: Req) -> None:
        self.pending.append(req)
        self.num_active += 1
        req.state = RUNNING
        self.arrived_s.append(req.arrival_s)
        self.arrived_prompt.append(req.prompt_len)

    def form_batch(self, slot_idx: int, now_s: float, rebalance: Any = None) -> Any:
        return super().form_batch(slot_idx, now_s, self._join if self.pending else rebalance)

    def _join(self, slot_idx: int) -> list[Move]:
        slot = self.slots[slot_idx]
        room = self.max_per_slot - (len(slot.running) if slot.running else 0)
        return [Move(r.rid, False, False) for r in self.pending[:max(room, 0)]]


class VllmV1PrefillScheduler(VllmV1Scheduler):
    """vLLM V1's scheduler on a prefill instance (the proxy's `max_tokens = 1` request with
    `do_remote_decode`; its blocks are freed when the decode side has read them:
    `kv_connector/v1/nixl_connector.py` `NixlConnectorScheduler.request_finished` returns
    `delay_free_blocks`)."""

    on_start: Any = None
    on_chunk: Any = None

    def form_batch(self, slot_idx: int, now_s: float, rebalance: Any = None) -> Any:
        mb = super().form_batch(slot_idx, now_s, rebalance)
        _announce(self, mb, now_s)
        return mb


class VllmV1DecodeScheduler(VllmV1Scheduler):
    """vLLM V1's scheduler on a decode instance. A request whose KV has arrived becomes schedulable again
    with all but its last prompt token computed (`v1/core/sched/scheduler.py`
    `_update_waiting_for_remote_kv`: `num_computed_tokens = num_tokens - 1`); its first step computes that
    one token, which costs what a decode step of one token at its context costs, and emits token 1: it
    joins the running requests as a decode, while fewer than `max_num_seqs` run."""

    def add_waiting(self, req: Req) -> None:
        self.pending.append(req)
        self.num_active += 1
        req.state = RUNNING
        self.arrived_s.append(req.arrival_s)
        self.arrived_prompt.append(req.prompt_len)

    def form_batch(self, slot_idx: int, now_s: float, rebalance: Any = None) -> Any:
        if self.pending:
            slot = self.slots[slot_idx]
            room = self.max_running - (self.num_active - len(self.pending))  # (running: admitted, not pending)
            for r in self.pending[:max(room, 0)]:
                self._apply_move(slot, Move(r.rid, False, False))
        return super().form_batch(slot_idx, now_s, rebalance)


ROLES = {("sglang", "prefill"): SGLangPrefillScheduler, ("sglang", "decode"): SGLangDecodeScheduler,
         ("vllm-v1", "prefill"): VllmV1PrefillScheduler, ("vllm-v1", "decode"): VllmV1DecodeScheduler}


def build_role(engine: str, role: str, settings: Any, num_slots: int, kv_tokens: int, max_running: int,
               chunk_size: int, on_kv_exhausted: str, sc: Any) -> Any:
    """An engine's scheduler in a role, set up as its engine's `build` sets it (sglang.py `SGLangEngine.build`,
    vllm_v1.py `VllmV1Engine.build`), its prefix cache off (module docstring of sim/engine/disagg.py)."""
    cls = ROLES[engine, role]
    if engine == "sglang":
        sched = cls(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted, False, sc.max_prefill_tokens,
                    sc.ignore_eos, sc.schedule_policy)
    else:
        sched = cls(num_slots, kv_tokens, max_running, chunk_size, on_kv_exhausted, False, sc.block_size_tokens,
                    sc.long_prefill_token_threshold)
        sched.pad_total = True
    sched.capture_sizes = settings.capture_sizes
    sched.overlap_host = settings.overlap
    return sched
