"""Named random streams: one seed per run, split into independent generators.

Every stochastic part of a run (arrivals, lengths, latency noise, ...) asks for a stream by
name. The stream depends only on the run seed and the name, so adding a new consumer never
shifts the numbers an existing one sees, and two policies compared under the same seed see
identical arrivals (common random numbers). No global RNG is used anywhere in PipeSim.
"""

from __future__ import annotations

from sim.core.lazy import lazy

import zlib

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)


def stream(seed: int, name: str) -> np.random.Generator:
    """Return the generator for stream `name` of a run seeded with `seed`."""
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence([int(seed), key]))
