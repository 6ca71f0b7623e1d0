"""`static`: a fixed chunk size (the TP, PP_2048, PP_<c> and PP_static schemes)."""

from __future__ import annotations

from sim.core.errors import ConfigError
from sim.policies.base import chunk_policies


@chunk_policies.register("static")
class StaticChunk:
    """Keeps the launch chunk size for the whole run (the controller never fires)."""

    never_decides = True  # lets the engine skip building a view for `decide` each iteration

    def __init__(self, chunk_size_tokens: int, context=None) -> None:
        if isinstance(chunk_size_tokens, bool) or not isinstance(chunk_size_tokens, int) or chunk_size_tokens < 1:
            raise ConfigError(f"chunk policy 'static': chunk_size_tokens must be an integer >= 1, got {chunk_size_tokens!r}")
        self.chunk = chunk_size_tokens

    def initial_chunk(self) -> int:
        return self.chunk

    def decide(self, view):
        return None
