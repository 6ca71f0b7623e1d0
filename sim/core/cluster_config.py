"""The run config's `[cluster]` and `[disaggregation]` sections (issue 34), checked on load.

`[cluster]` places the deployment on nodes joined by a network (sim/engine/cluster.py places it and
costs every stage-to-stage send and all-reduce by where its ranks sit):

    [cluster]
    nodes = 2                 # integer >= 1
    gpus_per_node = 8         # integer >= 1
    network = "ib-ndr"        # profiles/networks/<name>.toml
    interconnect = "nvswitch" # optional: inside a node (default: the profile's interconnect)
    gpu = "h100-sxm-80gb"     # optional: profiles/gpus/<name>.toml (default: the profile's GPU)
    nics_per_node = 8         # optional (default: the network file's NICs per GPU)

Here only its shape is checked (the keys, the counts, that the names are strings): the names are checked
against the spec folders by `sim.latency.cluster.cluster_from_table` when the run starts (this layer
reads no spec files).

`[disaggregation]` splits the deployment into a prefill pool and a decode pool (sim/engine/disagg.py):

    [disaggregation]
    kv_transfer = "after_prefill"   # or "layerwise" (streamed, the tail exposed), "chunked" (SGLang's sends)
    first_token = "decode"          # or "prefill", "transfer" (who emits token 1; see sim/engine/disagg.py)
    decode_reserve_tokens = 512     # KV a decode instance keeps free per request it holds (SGLang's default)
    [disaggregation.prefill]
    instances = 1, tp = 4, pp = 1, router = "round-robin" | "least-loaded",
    profile = "..." ("": the [latency] profile's sibling folder tp<tp>), chunk_size_tokens (0: [scheduler]'s),
    chunk_policy = {name, params} (empty: [scheduler]'s), kv_tokens (0: from the profile), max_running_requests
    [disaggregation.decode]
    the same keys (its chunk settings apply to requests it re-prefills after a retraction)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from sim.core.checks import number
from sim.core.errors import ConfigError

CLUSTER_KEYS = ("nodes", "gpus_per_node", "gpu", "interconnect", "network", "nics_per_node")
CLUSTER_COUNTS = ("nodes", "gpus_per_node", "nics_per_node")
CLUSTER_NAMES = ("gpu", "interconnect", "network")
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
KV_TRANSFERS = ("after_prefill", "layerwise", "chunked")  # (chunked: SGLang's chunk-by-chunk sends)
FIRST_TOKEN = ("decode", "prefill", "transfer")
POOL_ROUTERS = ("round-robin", "least-loaded")
MAX_TOKENS = 1 << 20


def _bounded(default, lo=None, hi=None, *, integer: bool = False, lo_open: bool = False):
    """A field checked by the config's one gate for numbers (the metadata `sim.core.config` reads)."""
    return field(default=default, metadata={"range": (lo, hi, integer, lo_open)})


def check_cluster_table(table: Any, where: str) -> None:
    """One-line ConfigError unless `table` has the shape of a [cluster] table (see the module docstring)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: [cluster] must be a table with {', '.join(CLUSTER_KEYS)}; got {table!r}")
    unknown = sorted(set(table) - set(CLUSTER_KEYS))
    if unknown:
        raise ConfigError(f"{where}: [cluster] unknown key {unknown[0]!r}; allowed: {', '.join(CLUSTER_KEYS)}")
    for key in ("nodes", "gpus_per_node", "network"):
        if key not in table:
            raise ConfigError(f"{where}: [cluster] {key} missing; required: nodes, gpus_per_node, network")
    hi = {"nodes": MAX_NODES, "gpus_per_node": MAX_GPUS_PER_NODE, "nics_per_node": 1024}
    for key in CLUSTER_COUNTS:
        if key in table:
            number(table[key], where, f"[cluster] {key}", 1, hi[key], integer=True)
            if isinstance(table[key], float):   # TOML 2.0: counts are integers
                raise ConfigError(f"{where}: [cluster] {key} must be an integer in [1, {hi[key]}]; got {table[key]!r}")
    for key in CLUSTER_NAMES:
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise ConfigError(f"{where}: [cluster] {key} must be a name (a string); got {table[key]!r}")


@dataclass(frozen=True)
class PoolConfig:
    """One pool of a disaggregated deployment: `instances` copies of one TP x PP instance."""

    instances: int = _bounded(1, 1, 1024, integer=True)
    tp: int = _bounded(1, 1, 64, integer=True)
    pp: int = _bounded(1, 1, 256, integer=True)
    profile: str = ""  # "": the [latency] profile's sibling folder for this pool's TP (tp<tp>)
    router: str = "round-robin"
    chunk_size_tokens: int = _bounded(0, 0, MAX_TOKENS, integer=True)  # 0: [scheduler] chunk_size_tokens
    chunk_policy: Mapping[str, Any] = field(default_factory=dict)  # {}: [scheduler] chunk_policy
    kv_tokens: int = _bounded(0, 0, 1 << 34, integer=True)  # 0: [scheduler] kv_tokens (0 there: the profile's)
    max_running_requests: int = _bounded(0, 0, 1 << 24, integer=True)  # 0: [scheduler]'s (0 there: SGLang's)

    def validate(self, where: str, name: str) -> None:
        if self.router not in POOL_ROUTERS:
            raise ConfigError(f"{where}: [disaggregation.{name}] router must be one of: {', '.join(POOL_ROUTERS)}; "
                              f"got {self.router!r}")
        cp = self.chunk_policy
        if cp:
            extra = sorted(set(cp) - {"name", "params"})
            if extra or not isinstance(cp.get("name"), str) or not isinstance(cp.get("params", {}), Mapping):
                raise ConfigError(f"{where}: [disaggregation.{name}] chunk_policy must be a table "
                                  f"{{name = \"...\", params = {{...}}}}; got {dict(cp)!r}")

    @property
    def gpus(self) -> int:
        return self.instances * self.tp * self.pp


@dataclass(frozen=True)
class DisaggConfig:
    """A prefill pool and a decode pool, the prompt's KV cache shipped from one to the other."""

    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    kv_transfer: str = "after_prefill"
    first_token: str = "decode"
    # SGLang's decode server keeps this much KV free per request it holds before it pre-allocates the
    # next one (`--num-reserved-decode-tokens`, default 512; sglang/srt/disaggregation/decode.py)
    decode_reserve_tokens: int = _bounded(512, 0, MAX_TOKENS, integer=True)

    def validate(self, where: str) -> None:
        if self.kv_transfer not in KV_TRANSFERS:
            raise ConfigError(f"{where}: [disaggregation] kv_transfer must be one of: {', '.join(KV_TRANSFERS)}; "
                              f"got {self.kv_transfer!r}")
        if self.first_token not in FIRST_TOKEN:
            raise ConfigError(f"{where}: [disaggregation] first_token must be one of: {', '.join(FIRST_TOKEN)}; "
                              f"got {self.first_token!r}")
        self.prefill.validate(where, "prefill")
        self.decode.validate(where, "decode")

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus
