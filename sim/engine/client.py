"""The benchmark client as a SimPy process: sends depend on completions.

A closed loop (`[workload] concurrency = N`) or a capped open loop (`max_concurrency = N`,
sim/workloads/client.py) sends request i at the first time when (a) it is ready (t = 0 in a
closed loop, its arrival time otherwise), (b) request i - 1 has been sent (the list is consumed
in order; vLLM and SGLang queue their tasks on one FIFO `asyncio.Semaphore`) and (c) fewer than
N requests are in flight. A request leaves the client's count when it finishes, or when the
client gives up on it (`request_timeout_s`), plus the think time drawn for it. The send time
becomes the request's `arrival_s` (the clients start a request's clock when they send it).

With a frontend (sim/latency/frontend.py) the scheduler sees a request later than it was sent
(the API server receives and tokenizes it, one prompt at a time), and the client sees the
finish later than the engine's last token (the last chunk's way back): the slot is freed then.

Only this process and the pipelines touch the clock (sim/engine/run.py wires them).
"""

from __future__ import annotations

from typing import Callable

import simpy

from sim.engine.requests import RequestTable
from sim.engine.state import Req


class Client:
    def __init__(self, env: simpy.Environment, table: RequestTable, ready_s, think_s, slots: int,
                 timeout_s: float | None, send: Callable[[Req], None], close: Callable[[], None],
                 frontend=None) -> None:
        self.env = env
        self.table = table
        self.ready_s = ready_s
        self.think_s = think_s
        self.free = slots
        self.timeout_s = timeout_s
        self.send = send
        self.close = close
        self.frontend = frontend
        self.in_server = 0  # sent, not yet handed to the scheduler (the frontend's way in)
        self.all_sent = False
        self.open: set[int] = set()  # rows sent, neither finished nor given up
        self._wake: simpy.Event | None = None
        self.proc = env.process(self._run())

    def finished(self, req: Req) -> None:
        """A request finished on the server (the scheduler's on_finish, after the table recorded it)."""
        if self.frontend is None:
            self._release(req.row)
            return
        seen = float(self.table.columns["finish_s"][req.row])  # the last chunk reaches the client then
        self.env.timeout(max(seen - self.env.now, 0.0)).callbacks.append(lambda _ev, row=req.row: self._release(row))

    def _release(self, row: int) -> None:
        if row not in self.open:
            return  # already given up on (its slot was freed then)
        self.open.discard(row)
        think = float(self.think_s[row])
        if think > 0:
            self.env.timeout(think).callbacks.append(lambda _ev: self._free_slot())
        else:
            self._free_slot()

    def _free_slot(self) -> None:
        self.free += 1
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        env, table = self.env, self.table
        sent = table.columns["arrival_s"]  # the client's send times: unsent rows hold inf
        server = table.arrival_s  # when the scheduler sees them (the same array without a frontend)
        fe = self.frontend
        for row in range(len(table)):
            while self.free == 0:
                self._wake = env.event()
                yield self._wake
            ready = float(self.ready_s[row])
            if ready > env.now:
                yield env.timeout(ready - env.now)
            sent[row] = env.now
            if fe is not None:
                server[row] = fe.server_arrival(env.now, int(table.inputs.prompt_tokens[row]))
            self.free -= 1
            self.open.add(row)
            if self.timeout_s is not None:
                env.timeout(self.timeout_s).callbacks.append(lambda _ev, row=row: self._release(row))
            if fe is None:
                self.send(table.make(row))
            else:
                self.in_server += 1
                env.timeout(server[row] - env.now).callbacks.append(lambda _ev, row=row: self._hand_over(row))
        self.all_sent = True
        if self.in_server == 0:
            self.close()

    def _hand_over(self, row: int) -> None:
        """The frontend passes a request to the scheduler (rows in order: the tokenizer is FIFO)."""
        self.in_server -= 1
        self.send(self.table.make(row))
        if self.all_sent and self.in_server == 0:
            self.close()
