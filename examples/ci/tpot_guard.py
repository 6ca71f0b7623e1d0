"""`tpot-guard`: an example chunk policy written outside PipeSim (the plug-in API of
sim/policies/API.md). Every `every_steps` launched micro-batches it reads the TPOT samples
that arrived since its last look: above `high` x the TPOT SLO it halves the chunk (decodes
wait less behind prefill), below `low` x the SLO with prompts queued it doubles it."""

from sim.policies import ChunkDecision, chunk_policies


@chunk_policies.register("tpot-guard")
class TpotGuard:
    def __init__(self, context, every_steps: int = 16, high: float = 0.8, low: float = 0.5,
                 min_chunk: int = 128, max_chunk: int = 2048) -> None:
        self.slo_tpot_s = context.slo_tpot_s
        self.every_steps, self.high, self.low = every_steps, high, low
        self.min_chunk = min_chunk
        self.max_chunk = min(max_chunk, context.context_length_tokens)
        self.chunk = max(min_chunk, min(context.launch_chunk_tokens, self.max_chunk))
        self.cursor = 0  # TPOT samples already seen (the engine's log is append-only)

    def initial_chunk(self) -> int:
        return self.chunk

    def decide(self, view):
        if view.step == 0 or view.step % self.every_steps:
            return None
        fresh = view.tpot_samples(self.cursor)
        self.cursor += len(fresh)
        if not fresh:
            return ChunkDecision(self.chunk, "no_tpot")
        tpot_s = sum(fresh) / len(fresh)
        if tpot_s > self.high * self.slo_tpot_s:
            self.chunk, reason = max(self.min_chunk, self.chunk // 2), "tpot_high"
        elif tpot_s < self.low * self.slo_tpot_s and view.num_waiting:
            self.chunk, reason = min(self.max_chunk, self.chunk * 2), "tpot_low"
        else:
            reason = "hold"
        return ChunkDecision(self.chunk, reason, tpot_signal_s=tpot_s)
