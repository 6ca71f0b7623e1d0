"""`predictive`: FastPP's ALP dynamic chunk controller (DCP_pred).

fastpp-system-model.md section 4 (dynamic_chunk_controller.py `decide_chunk_alp` and the
candidate feature projection). The predictor (offline table + online RLS) is `sim.policies.rls`.
"""

from __future__ import annotations

import math
from operator import itemgetter

from sim.core.errors import ConfigError
from sim.policies.base import ChunkDecision, chunk_policies
from sim.policies.greedy import SignalWindow, check_positive, safety_guard, watermark_chunk
from sim.policies.rls import ALPPredictor, candidate_chunks


@chunk_policies.register("predictive")
class PredictiveChunk:
    """ALP: the smallest chunk whose predicted prefill capacity meets the required throughput
    while pp x T_hat(c) stays under the TPOT ceiling; every 2*pp batch-steps.

    Decision (section 4.5): nothing waiting and no chunked request -> no change, nothing drained
    ("idle"); else drain the signals; kv_free = max(0, free - sum_s r_s)/capacity with r_s the
    slot's last-batch size without its cut request; kv_free < 0.10 -> watermark ("watermark");
    else Req = coef_thr x (catch-up + lambda_tok) where catch-up = S_tok / (SLO_TTFT - w) over
    the backlog entries waiting >= fresh_epsilon x SLO_TTFT (w their mean wait; infinite when
    SLO_TTFT - w <= SLO_TPOT), lambda_tok = prompt tokens that arrived in the last 10 s / W',
    W' = min(10, now - system_start), system_start = first arrival - start_lead_s. Scan the
    candidates upwards: stop at the first with pp x T_hat(c) > coef_tpot x SLO_TPOT; the first
    safe c with (c - mean_s r_s)/T_hat(c) >= Req is "Optimal"; else the largest safe c
    ("Best_Effort"); none safe -> the smallest candidate ("Fail_SLO_ExecTime"); no table ->
    no change ("no_prediction"). Then the safety guard ("+safety_guard").

    Params (artifact defaults): min/max/step_chunk_tokens 128/2048/128, fresh_epsilon 0.25,
    tpot_coef 1.05, throughput_coef 1.0, window_s 10, start_lead_s 1.5 (the benchmark flushes,
    then sleeps 1.5 s), kv_free_threshold 0.10, and the RLS constants of `sim.policies.rls`
    (forget 0.9975, p0 1.25, clip 0.4, warmup_updates 16).
    Options (paper or pre-3c59fc8 variants): decide_every_steps (default 2*pp; the paper
    decides every iteration: 1), tpot_coef 1.08 with throughput_coef 0.92 (old coefficients),
    watermark_rule "artifact" | "paper", chunked_first_stage_only (default False: as the code,
    the active chunked request is projected into both the stage of its slot and the next one).
    """

    def __init__(self, context, min_chunk_tokens: int = 128, max_chunk_tokens: int = 2048,
                 step_chunk_tokens: int = 128, fresh_epsilon: float = 0.25, tpot_coef: float = 1.05,
                 throughput_coef: float = 1.0, window_s: float = 10.0, start_lead_s: float = 1.5,
                 kv_free_threshold: float = 0.10, decide_every_steps: int | None = None,
                 watermark_rule: str = "artifact", chunked_first_stage_only: bool = False,
                 forget: float = 0.9975, p0: float = 1.25, clip: float = 0.4, warmup_updates: int = 16) -> None:
        for n in ("min_chunk_tokens", "max_chunk_tokens", "step_chunk_tokens"):
            check_positive(n, locals()[n], integer=True)
        for n in ("tpot_coef", "throughput_coef", "window_s"):
            check_positive(n, locals()[n])
        if start_lead_s < 0 or fresh_epsilon < 0:
            raise ConfigError("start_lead_s and fresh_epsilon must be >= 0")
        watermark_chunk([0], watermark_rule)
        self.ctx = context
        self.pp = context.num_stages
        self.candidates = candidate_chunks(min_chunk_tokens, max_chunk_tokens, step_chunk_tokens)
        self.fresh_s = fresh_epsilon * context.slo_ttft_s
        self.tpot_ceiling_s = tpot_coef * context.slo_tpot_s
        self.thr_coef = throughput_coef
        self.window_s, self.lead_s = window_s, start_lead_s
        self.kv_th = kv_free_threshold
        self.every = decide_every_steps or 2 * self.pp
        check_positive("decide_every_steps", self.every, integer=True)
        self.watermark_rule = watermark_rule
        self.first_only = chunked_first_stage_only
        self.signals = SignalWindow(context.slo_ttft_s, context.slo_tpot_s)
        self.predictor = ALPPredictor.from_profile(context.startup_profile, self.candidates, forget=forget,
                                                   p0=p0, clip=clip, warmup_updates=warmup_updates)
        self.last_required_tok_s = 0.0  # for tests and diagnostics

    def initial_chunk(self) -> int:
        return self.ctx.launch_chunk_tokens

    @property
    def decides_every_steps(self) -> int:
        """`decide` returns None unless view.step is a multiple of this: the engine need not
        build a view for it at the other steps."""
        return self.every

    def observe(self, view, current, inflight, iteration_s: float) -> None:
        self.predictor.observe(current, inflight, iteration_s)

    # -- the decision --
    def decide(self, view) -> ChunkDecision | None:
        if view.step % self.every != 0:
            return None
        sig, c = self.signals, view.chunk_size
        # (the queue as columns: under overload it is thousands long, and is read every decision)
        arrivals, prefixes, remaining = view.waiting_columns()
        chunked = view.chunked()
        batches = view.last_batches()
        if chunked is not None and batches[chunked.slot] is None:
            chunked = None
        if not arrivals and chunked is None:
            return ChunkDecision(c, "idle", sig.ttft, sig.tpot)
        sig.drain(view)
        now = view.now_s
        counts = [b.num_reqs - b.holds_cut_chunk if b is not None else 0 for b in batches]
        kv_free = max(0, view.kv_free_tokens - sum(counts)) / view.kv_capacity_tokens
        if kv_free < self.kv_th:
            new, reason = watermark_chunk(counts, self.watermark_rule, self.candidates[0]), "watermark"
        else:
            backlog = list(zip([now - a for a in arrivals], remaining))
            if chunked is not None:
                backlog.append((now - chunked.arrival_s, chunked.remaining_tokens))
            required = self.required_throughput(view, backlog)
            self.last_required_tok_s = required
            queue = self.queue_head(prefixes, remaining)
            picked = self.select(view, required, sum(counts) / len(counts), batches, chunked, queue)
            if picked is None:
                return ChunkDecision(c, "no_prediction", sig.ttft, sig.tpot)
            new, reason = picked
        new, fired = safety_guard(new, batches, counts)
        if fired:
            reason += "+safety_guard"
        return ChunkDecision(new, reason, sig.ttft, sig.tpot)

    def arrival_rate(self, view) -> float:
        """Prompt tokens per second over the last window (the artifact's qps_queue)."""
        now = view.now_s
        span = min(self.window_s, now - (view.start_s - self.lead_s))
        if span <= 0:
            return 0.0
        return sum(tok for _t, tok in view.arrivals_since(now - self.window_s)) / span

    def required_throughput(self, view, backlog) -> float:
        slo_ttft, slo_tpot = self.ctx.slo_ttft_s, self.ctx.slo_tpot_s
        fresh_s = self.fresh_s
        stale = [entry for entry in backlog if entry[0] >= fresh_s]
        stale_tok = sum(map(itemgetter(1), stale))
        mean_wait = sum(map(itemgetter(0), stale)) / len(stale) if stale else 0.0
        budget = slo_ttft - mean_wait
        if stale_tok <= 0:
            catch_up = 0.0
        elif budget <= slo_tpot:
            return math.inf
        else:
            catch_up = stale_tok / budget
        return (catch_up + self.arrival_rate(view)) * self.thr_coef

    def queue_head(self, prefixes: list[int], remaining: list[int]) -> list[tuple[int, int]]:
        """(prefix, remaining tokens) of the waiting requests the projection can reach: each of
        the pp stages takes at most the largest candidate from the queue, so the requests
        after the first whose remaining tokens add up to pp x that are never read."""
        need = self.pp * max(self.candidates)
        head = tokens = 0
        for t in remaining:
            head += 1
            tokens += t
            if tokens >= need:
                break
        return list(zip(prefixes[:head], remaining[:head]))

    def select(self, view, required: float, avg_run: float, batches, chunked, queue):
        """Lazy scan of the candidates; (chunk, reason) or None when a prediction is missing.
        `queue`: (prefix, remaining tokens) of the waiting requests in order (`queue_head`)."""
        proj = self.projection(view, batches, chunked, queue)
        last_safe = None
        for cand in self.candidates:
            t = self.predictor.predict(cand, *proj(cand))
            if t is None:
                return None
            if t * self.pp > self.tpot_ceiling_s:
                break
            last_safe = cand
            if max(cand - avg_run, 0.0) / max(t, 1e-9) >= required:
                return cand, "Optimal"
        if last_safe is None:
            return self.candidates[0], "Fail_SLO_ExecTime"
        return last_safe, "Best_Effort"

    def projection(self, view, batches, chunked, queue):
        """Section 4.6: a function c -> mean (D, S, X) over the pp stages of the next cycle."""
        pp, cur = self.pp, view.slot
        order = [(cur + k) % pp for k in range(pp)]
        stages = []
        for k, s in enumerate(order):
            b = batches[s]
            dctx, mdec = (b.decode_ctx, b.num_decode) if b is not None else (0, 0)
            own = chunked is not None and (chunked.slot == s or (pp > 1 and chunked.slot == (s - 1) % pp))
            if own and self.first_only and k != 0:
                own = False
            ch = (chunked.prefix_tokens, chunked.remaining_tokens) if own else None
            stages.append((dctx, mdec, ch))

        def features(chunk: int) -> tuple[float, float, float]:
            qi = qoff = 0
            sum_d = sum_s = sum_x = 0.0
            for dctx, mdec, ch in stages:
                rem = max(chunk - mdec, 0)
                sq = px = 0
                if ch is not None and rem > 0:
                    prefix, left = ch
                    e = min(left, rem)
                    if e > 0:
                        sq += e * e
                        px += e * prefix
                        rem -= e
                    if e < left:  # the chunked request fills this stage
                        sum_d += dctx
                        sum_s += sq
                        sum_x += px
                        continue
                while qi < len(queue) and rem > 0:
                    prefix, left = queue[qi]
                    prefix, left = prefix + qoff, max(left - qoff, 0)
                    if left <= 0:
                        qi, qoff = qi + 1, 0
                        continue
                    e = min(left, rem)
                    sq += e * e
                    px += e * prefix
                    rem -= e
                    if e >= left:
                        qi, qoff = qi + 1, 0
                    else:
                        qoff += e
                        break
                sum_d += dctx
                sum_s += sq
                sum_x += px
            n = len(stages)
            return sum_d / n, sum_s / n, sum_x / n

        return features
