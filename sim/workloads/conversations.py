"""Workloads whose prompts share prefixes: multi-turn conversations and a shared system prompt.

Each request carries its prompt's identity as pieces (`RequestSpec.prefix`, see
sim/engine/prefix_cache.py), so an engine with a prefix cache serves the shared part from KV.

- `conversation`: `num_sessions` chat sessions starting as Poisson arrivals at `rate_rps`
  (sessions per second). A session has a number of turns (1 + geometric, mean `turns_mean`);
  turn k's prompt is the whole conversation so far (every earlier user message and reply, as
  chat serving re-sends it) plus a new user message; its output is the reply. Message and
  reply lengths come from a `[lengths]` source (sim/workloads/lengths.py; the `sharegpt` source
  by default: ShareGPT's first-turn lengths). Turn k + 1 arrives `think_time_s` (exponential
  mean) after turn k's arrival plus `reply_time_s` (the reply's expected generation time):
  arrivals are fixed before the run (open loop), so a reply slower than that is not yet in the
  cache when the next turn asks for it (the hit is then the shorter prefix, as on a real server
  answering a client that did not wait). The context grows until `max_context_tokens`, where the
  session ends.
  With `file` (a ShareGPT JSON file: a list of `{"conversations": [{"from", "value"}, ...]}`),
  the sessions are the file's first `num_sessions` conversations as they are: their turn
  counts and each message's and reply's length (characters / `chars_per_token`, 4 by default,
  as `ppsim run --trace` estimates ShareGPT lengths without a tokenizer); `turns_mean` and
  `[lengths]` are then not used.
- `shared-prefix`: Poisson arrivals at `rate_rps`; every request's prompt starts with one of
  `num_prefixes` system prompts of `prefix_tokens` tokens (each equally likely) with
  probability `reuse`, followed by its own text of the `[lengths]` source's prompt length.

Piece ids: a conversation's messages and replies, a system prompt, get ids no trace uses
(hashes of the seed and their position, in [2^62, 2^63)); a reply is named by the id the
engines give a request's output (sim/engine/schedulers/cached.py `output_piece`), so the cache
holds what the server generated, as a real server does.
"""

from __future__ import annotations

from typing import Any, Mapping

from sim.core.errors import ConfigError
from sim.core.lazy import lazy
from sim.core.rng import stream
from sim.workloads.base import (MAX_REQUEST_TOKENS, RequestSpec, output_piece, poisson_arrivals, require,
                                said_change, workload_kinds)
from sim.workloads.lengths import sample_lengths

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

CONVERSATION_KEYS = ("rate_rps", "num_sessions", "turns_mean", "think_time_s", "reply_time_s",
                     "max_context_tokens", "lengths", "file", "chars_per_token")
SHARED_KEYS = ("rate_rps", "num_requests", "prefix_tokens", "num_prefixes", "reuse", "lengths")
_BASE = 1 << 62


def _piece_id(seed: int, *key: int) -> int:
    """A piece id in [2^62, 2^63) for (seed, key...): ids of different roles never meet."""
    h = hash((seed, *key)) & ((1 << 62) - 1)
    return _BASE | h


def _check(params: Mapping[str, Any], allowed: tuple[str, ...], kind: str, where: str) -> None:
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r} for kind {kind!r}; allowed: {', '.join(sorted(allowed))}")


def _number(params, key, default, where, lo, hi, integer=False):
    from sim.core.checks import number

    return number(params.get(key, default), where, f"field {key!r}", lo, hi, integer=integer)


@workload_kinds.register("conversation")
def build_conversation(params: Mapping[str, Any], *, seed: int, where: str) -> list[RequestSpec]:
    _check(params, CONVERSATION_KEYS, "conversation", where)
    rate = require(params, "rate_rps", float, where, positive=True)
    sessions = _number(params, "num_sessions", None, where, 1, 10**6, integer=True)
    turns_mean = _number(params, "turns_mean", 3.0, where, 1, 1000)
    think = _number(params, "think_time_s", 30.0, where, 0, 1e6)
    reply = _number(params, "reply_time_s", 5.0, where, 0, 1e6)
    max_ctx = _number(params, "max_context_tokens", 16384, where, 2, MAX_REQUEST_TOKENS, integer=True)
    from sim.core.limits import check_drawn, check_sessions

    # the memory bound num_requests has (sim/core/limits.py), before any session is drawn
    check_sessions(sessions, 1.0 if params.get("file") is not None else turns_mean, where)
    rng = stream(seed, "sessions")
    if params.get("file") is not None:
        convs = _sharegpt_sessions(params, sessions, where)
        sessions = len(convs)
        turns = np.array([len(c) for c in convs])
        msgs = [m for c in convs for m, _r in c]
        replies = [r for c in convs for _m, r in c]
    else:
        # 1 + geometric: mean turns_mean (p = 1 / turns_mean)
        turns = rng.geometric(1.0 / turns_mean, size=sessions) if turns_mean > 1 else np.ones(sessions, dtype=int)
        total = int(turns.sum())
        check_drawn(total, where)
        lengths = params.get("lengths", {"source": "sharegpt"})
        msgs, replies = sample_lengths(lengths, total, stream(seed, "lengths"), where)
    starts = poisson_arrivals(sessions, rate, stream(seed, "arrivals"))
    rows = []  # (arrival, session, turn, prompt pieces before the reply ids are known, message, reply)
    k = 0
    for s in range(sessions):
        t = float(starts[s])
        for turn in range(int(turns[s])):
            rows.append((t, s, turn, int(msgs[k]), int(replies[k])))
            k += 1
            t += reply + (float(rng.exponential(think)) if think > 0 else 0.0)
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i))
    rid_of = {order[j]: j for j in range(len(order))}
    history: dict[int, list] = {}  # session -> its conversation's pieces so far
    specs: list[RequestSpec | None] = [None] * len(rows)
    ended: set[int] = set()
    for i, (t, s, turn, msg, out) in enumerate(rows):
        if s in ended:
            continue
        pieces = list(history.get(s, []))
        pieces.append((_piece_id(seed, s, turn), msg))
        prompt = sum(n for _p, n in pieces)
        if prompt + out > max_ctx:
            ended.add(s)  # the conversation outgrew the context: the session ends
            continue
        rid = rid_of[i]
        specs[rid] = RequestSpec(rid, t, prompt, out, tuple(pieces))
        history[s] = pieces + [(output_piece(rid), out)]
    kept = [sp for sp in specs if sp is not None]
    if not kept:  # (a run of no request would report NaN percentiles as "ok")
        raise ConfigError(f"{where}: max_context_tokens = {max_ctx}: no session's first turn (message + reply) fits, "
                          f"so the workload yields no request; allowed: a max_context_tokens above its first turns")
    if params.get("file") is not None and len(kept) < len(rows):
        # the file's turns past the context are not sent (the session ends there): said, as a change of the file
        said_change(f"{params.get('file')}: {len(rows) - len(kept)} turn(s) of {len(ended)} conversation(s) past "
                    f"max_context_tokens = {max_ctx} not sent (the session ends)")
    # renumber in arrival order (ended sessions leave gaps): a reply's piece id names its
    # request's final id, so the ids are assigned again and the pieces rewritten to match
    return _renumber(kept)


def _sharegpt_sessions(params: Mapping[str, Any], num: int, where: str) -> list[list[tuple[int, int]]]:
    """The first `num` conversations of a ShareGPT file with at least one (message, reply) pair,
    each as its (message tokens, reply tokens) turns (lengths estimated from characters)."""
    import json
    import math

    from sim.core.errors import DataError
    from sim.core.textio import read_text
    from sim.workloads.trace import resolve_trace_file

    path = resolve_trace_file(params.get("file"), where)
    cpt = _number(params, "chars_per_token", 4.0, where, 0.1, 100)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    out = []
    skipped = cut = 0  # conversations without a (message, reply) pair; turns left unused
    for i, item in enumerate(data):
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list):
            raise DataError(f"{path}: item {i}: field 'conversations' must be a list of turns")
        turns = []
        for j in range(0, len(conv) - 1, 2):
            m, r = conv[j], conv[j + 1]
            if not (isinstance(m, dict) and isinstance(r, dict) and isinstance(m.get("value"), str)
                    and isinstance(r.get("value"), str)):
                raise DataError(f"{path}: item {i}: turn {j}: each turn needs a string 'value'")
            a, b = math.ceil(len(m["value"]) / cpt), math.ceil(len(r["value"]) / cpt)
            if a < 1 or b < 1:
                break  # an empty message or reply ends the usable conversation
            turns.append((a, b))
        if turns:
            out.append(turns)
            cut += len(conv) - 2 * len(turns)  # a last message without a reply, turns after an empty one
        else:
            skipped += 1
        if len(out) == num:
            break
    if not out:
        raise DataError(f"{path}: no conversation with a message and a reply")
    if skipped:
        said_change(f"{path}: {skipped} conversation(s) without a message and a reply skipped")
    if cut:
        said_change(f"{path}: {cut} message(s) without a reply (or after an empty one) not sent")
    if len(out) < num:
        said_change(f"{path}: num_sessions = {num} but the file holds {len(out)} usable conversation(s); "
                    f"{len(out)} session(s) run")
    return out


def _renumber(specs: list[RequestSpec]) -> list[RequestSpec]:
    new_id = {sp.req_id: j for j, sp in enumerate(specs)}
    old_piece = {output_piece(old): output_piece(new) for old, new in new_id.items()}
    out = []
    for j, sp in enumerate(specs):
        pieces = tuple((old_piece.get(p, p), n) for p, n in sp.prefix) if sp.prefix else sp.prefix
        out.append(RequestSpec(j, sp.arrival_s, sp.prompt_tokens, sp.output_tokens, pieces))
    return out


@workload_kinds.register("shared-prefix")
def build_shared_prefix(params: Mapping[str, Any], *, seed: int, where: str) -> list[RequestSpec]:
    _check(params, SHARED_KEYS, "shared-prefix", where)
    rate = require(params, "rate_rps", float, where, positive=True)
    num = _number(params, "num_requests", None, where, 1, 10**8, integer=True)
    prefix = _number(params, "prefix_tokens", 1024, where, 1, MAX_REQUEST_TOKENS, integer=True)
    groups = _number(params, "num_prefixes", 1, where, 1, 10**6, integer=True)
    reuse = _number(params, "reuse", 1.0, where, 0, 1)
    prompts, outputs = sample_lengths(params.get("lengths", {"source": "sharegpt"}), num, stream(seed, "lengths"),
                                      where)
    rng = stream(seed, "prefixes")
    shared = rng.random(num) < reuse
    which = rng.integers(0, groups, size=num)
    arrivals = poisson_arrivals(num, rate, stream(seed, "arrivals"))
    specs = []
    for i in range(num):
        own = (_piece_id(seed, -1, i), int(prompts[i]))
        pieces = ((_piece_id(seed, -2, int(which[i])), prefix), own) if shared[i] else (own,)
        total = sum(n for _p, n in pieces)
        specs.append(RequestSpec(i, float(arrivals[i]), total, int(outputs[i]), pieces))
    return specs
