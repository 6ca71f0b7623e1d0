"""Upfront resource checks: reject a run that would exhaust memory before it starts.

A run holds every request in memory (its arrival and lengths up front, its record until the
outputs are written): about `BYTES_PER_REQUEST` bytes each, measured on the default config
(50,000 requests of azure-conv-synth at PP=4 peaked at 540 MB). A run may use at most
`MEMORY_SHARE` of the machine's physical memory, and never more than `MAX_NUM_REQUESTS`.
"""

from __future__ import annotations

import os

from sim.core.errors import ConfigError

BYTES_PER_REQUEST = 11_000
MEMORY_SHARE = 0.5
MAX_NUM_REQUESTS = 10_000_000


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def max_num_requests(memory_bytes: int | None = None) -> int:
    """The largest `num_requests` a run may ask for on a machine with `memory_bytes` of memory."""
    memory_bytes = physical_memory_bytes() if memory_bytes is None else memory_bytes
    if not memory_bytes:
        return MAX_NUM_REQUESTS
    return max(1, min(MAX_NUM_REQUESTS, int(memory_bytes * MEMORY_SHARE // BYTES_PER_REQUEST)))


def check_num_requests(num: object, where: str, memory_bytes: int | None = None) -> None:
    """A one-line ConfigError if `num` requests would not fit (non-integers are left to the builder)."""
    if isinstance(num, bool) or not isinstance(num, int):
        return
    limit = max_num_requests(memory_bytes)
    if num > limit:
        need_gib = num * BYTES_PER_REQUEST / 2**30
        raise ConfigError(f"{where}: field 'num_requests' = {num} needs about {need_gib:.0f} GiB of memory; "
                          f"allowed: 1..{limit} on this machine (about {BYTES_PER_REQUEST // 1000} KB per request, "
                          f"at most {MEMORY_SHARE:.0%} of its memory)")


def check_sessions(sessions: int, turns_mean: float, where: str, memory_bytes: int | None = None) -> None:
    """`check_num_requests` for a conversation workload: its `num_sessions` x `turns_mean` requests
    (the expected count; the drawn one is checked again once drawn, `check_drawn`)."""
    limit = max_num_requests(memory_bytes)
    expected = sessions * turns_mean
    if expected > limit:
        raise ConfigError(f"{where}: num_sessions = {sessions} x turns_mean = {turns_mean:g} is about {expected:.3g} "
                          f"requests, needing about {expected * BYTES_PER_REQUEST / 2**30:.0f} GiB of memory; "
                          f"allowed: at most {limit} requests on this machine (num_sessions x turns_mean)")


def check_drawn(total: int, where: str, memory_bytes: int | None = None) -> None:
    """A workload's drawn request count against the same bound (a draw far above its mean)."""
    limit = max_num_requests(memory_bytes)
    if total > limit:
        raise ConfigError(f"{where}: the sessions drew {total} turns (requests), more than the {limit} this machine "
                          f"holds; allowed: a smaller num_sessions or turns_mean")
