"""Scheduling policies: chunk-size controllers and batch rebalancers (plug-ins by name)."""

from sim.policies.base import API_VERSION, ChunkDecision, ChunkPolicy, Move, PolicyContext, Rebalancer, chunk_policies, rebalancers  # noqa: F401
from sim.policies import static as _static  # noqa: F401,E402  (registers "static")
from sim.policies import greedy as _greedy  # noqa: F401,E402  (registers "greedy")
from sim.policies import predictive as _predictive  # noqa: F401,E402  (registers "predictive")
from sim.policies import delay as _delay  # noqa: F401,E402  (registers "delay-scheduling")
