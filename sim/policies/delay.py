"""`delay-scheduling`: FastPP's batch rebalancer (the "DS" of DCP_pred+DS).

fastpp-system-model.md section 5 (batch_rebalancer.py). Runs for the current slot after its
previous micro-batch is merged (and finished requests filtered) and before admission; it
pauses running requests into the global pending list, or resumes paused ones, so that each
micro-batch's decode count sits on the hardware's 128-request tiers.
"""

from __future__ import annotations

from sim.core.errors import ConfigError
from sim.policies.base import Move, rebalancers
from sim.policies.greedy import check_positive

MODES = ("auto", "tpot_first", "e2e_first")


@rebalancers.register("delay-scheduling")
class DelayScheduling:
    """Tiered rebalancing of request counts between the slot's running batch and pending.

    N = sum_s |last_batch[s]| (the current slot's running batch for the current slot) minus the
    other slots holding a cut chunk, plus |pending|. headroom = waiting prompt tokens > 1024 and
    kv_free > 0.10 (the controller's published metrics, else local values). base_th = 128 pp,
    th = base_th floor(N/base_th), limit = th/pp + 128, L = |running|.
      Case 1 (th > 0, N < th + alpha base_th, no headroom): target th/pp; preempt L - th/pp,
        or resume min(th/pp - L, |pending|).
      Case 2: need = floor(N/pp) - L: resume min(need, |pending|) if need > 0 and pending;
        else preempt min(L - limit, L) if no headroom and L > limit.
    Mode TPOT_FIRST (tpot_signal >= 0.9 SLO_TPOT in auto) preempts the running tail (oldest) and
    appends resumed requests; E2E_FIRST preempts the running head (newest) and prepends them.
    Both put preempted requests, in order, at the pending head and resume from the pending tail.

    Params (artifact defaults): base_unit 128, alpha 0.4, waiting_tok_threshold 1024,
    kv_free_threshold 0.10, mode "auto" | "tpot_first" | "e2e_first", tpot_first_ratio 0.9.
    """

    def __init__(self, context, base_unit: int = 128, alpha: float = 0.4, waiting_tok_threshold: int = 1024,
                 kv_free_threshold: float = 0.10, mode: str = "auto", tpot_first_ratio: float = 0.9) -> None:
        check_positive("base_unit", base_unit, integer=True)
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        if alpha < 0 or waiting_tok_threshold < 0 or kv_free_threshold < 0 or tpot_first_ratio < 0:
            raise ConfigError("alpha, waiting_tok_threshold, kv_free_threshold, tpot_first_ratio must be >= 0")
        self.pp = context.num_stages
        self.unit, self.alpha = base_unit, alpha
        self.wait_th, self.kv_th = waiting_tok_threshold, kv_free_threshold
        self.mode = mode
        self.tpot_first_s = tpot_first_ratio * context.slo_tpot_s
        self.last_case = ""  # diagnostics: "case1", "case2" or ""

    def signals(self, view) -> tuple[float, int, float]:
        if view.rebalance_metrics is not None:
            return view.rebalance_metrics
        return view.tpot_signal_s, view.waiting_prompt_tokens(), view.kv_free_tokens / view.kv_capacity_tokens

    def rebalance(self, view) -> list[Move]:
        size, num_pending = view.num_running(), view.num_pending()
        self.last_case = ""
        if not size and not num_pending:
            return []
        pp, cur = self.pp, view.slot
        n = size + num_pending
        for s, b in enumerate(view.last_batches()):
            if s != cur and b is not None:
                n += b.num_reqs - b.holds_cut_chunk
        tpot, wait_tok, kv_free = self.signals(view)
        headroom = wait_tok > self.wait_th and kv_free > self.kv_th
        tpot_first = self.mode == "tpot_first" or (self.mode == "auto" and tpot >= self.tpot_first_s)
        base_th = self.unit * pp
        th = base_th * (n // base_th)
        limit = th // pp + self.unit
        # (the request ids are read only when requests move)
        if th > 0 and n < th + self.alpha * base_th and not headroom:
            self.last_case = "case1"
            desired = th // pp
            if size > desired:
                return self._preempt(view.running_ids(), size - desired, tpot_first)
            if size < desired and num_pending:
                return self._resume(view.pending_ids(), min(desired - size, num_pending), tpot_first)
            return []
        self.last_case = "case2"
        need = n // pp - size
        if need > 0 and num_pending:
            return self._resume(view.pending_ids(), min(need, num_pending), tpot_first)
        if not headroom and size > limit and size > 0:
            return self._preempt(view.running_ids(), min(size - limit, size), tpot_first)
        return []

    @staticmethod
    def _preempt(running, k: int, tpot_first: bool) -> list[Move]:
        """Oldest (tail) or newest (head) k requests to the pending head, keeping their order:
        inserting at the head one by one, so the block goes in reverse."""
        block = running[len(running) - k:] if tpot_first else running[:k]
        return [Move(rid, True, True) for rid in reversed(block)]

    @staticmethod
    def _resume(pending, k: int, tpot_first: bool) -> list[Move]:
        """The k longest-paused (pending tail) requests: appended to the running tail
        (TPOT_FIRST) or prepended, in order, to its head (E2E_FIRST, LIFO)."""
        block = pending[len(pending) - k:]
        if tpot_first:
            return [Move(rid, False, False) for rid in block]
        return [Move(rid, False, True) for rid in reversed(block)]
