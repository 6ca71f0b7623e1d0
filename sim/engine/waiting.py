"""The scheduler's waiting queue: a deque of requests with the columns the policies read.

Kept out of sim/engine/schedulers/fastpp.py because that module may be compiled (sim/native.py), and a
compiled class cannot subclass `deque`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine.state import Req


class WaitingQueue(deque):
    """The waiting queue (a deque of `Req`s), with what the controllers read of it at every
    decision kept beside it: the sum of the prompt tokens, and the arrival times, prefixes and
    remaining tokens in queue order (`columns`). Under overload the queue is thousands long;
    a waiting request's fields do not change while it waits (it is cut or allocated only once
    admitted, and requeued with its new lengths). Only the mutators the scheduler uses exist."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt_tokens = 0
        self.arrival_s: deque[float] = deque()
        self.prefix_tokens: deque[int] = deque()
        self.remaining_tokens: deque[int] = deque()

    # (the deque's own methods are called as deque.append(self, ...): super() made an object per call,
    # and append/popleft run once per request)
    def append(self, req: Req) -> None:
        deque.append(self, req)
        self.prompt_tokens += req.prompt_len
        self.arrival_s.append(req.arrival_s)
        self.prefix_tokens.append(req.prefix_len)
        self.remaining_tokens.append(req.fill_len - req.prefix_len)

    def extend(self, reqs) -> None:
        for req in reqs:
            self.append(req)

    def popleft(self) -> Req:
        req = deque.popleft(self)
        self.prompt_tokens -= req.prompt_len
        self.arrival_s.popleft()
        self.prefix_tokens.popleft()
        self.remaining_tokens.popleft()
        return req

    def appendleft(self, req: Req) -> None:
        """To the head of the queue (vLLM puts a preempted request there)."""
        super().appendleft(req)
        self.prompt_tokens += req.prompt_len
        self.arrival_s.appendleft(req.arrival_s)
        self.prefix_tokens.appendleft(req.prefix_len)
        self.remaining_tokens.appendleft(req.fill_len - req.prefix_len)

    def remove(self, req: Req) -> None:
        """Take `req` out wherever it is (SGLang's admission under a cache-aware policy)."""
        i = next(k for k, r in enumerate(self) if r is req)
        super().__delitem__(i)
        self.prompt_tokens -= req.prompt_len
        del self.arrival_s[i]
        del self.prefix_tokens[i]
        del self.remaining_tokens[i]

    def clear(self) -> None:
        super().clear()
        self.prompt_tokens = 0
        self.arrival_s.clear()
        self.prefix_tokens.clear()
        self.remaining_tokens.clear()

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("WaitingQueue keeps its columns: use append/extend/popleft/clear")

    extendleft = pop = insert = rotate = __setitem__ = __delitem__ = __iadd__ = _unsupported
