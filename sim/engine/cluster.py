"""Multi-node runs (issue 34): a run config's `[cluster]` table, the deployment placed on its nodes, and
the communication each instance's stages pay where their ranks sit.

The deployment (`[parallel]` replicas x TP x PP, or the two pools of `[disaggregation]`) is placed with
`sim.latency.cluster.place`: each TP group inside one node when it fits, stages and instances one after
another over the nodes. Each instance then gets its own latency model, whose communication is costed by
where its ranks sit (`InstanceComm`, the `placement` hook of `sim.latency.profiled.ProfiledLatencyModel`):

- a PP activation send to a stage on another node: `ClusterModel.stage_send_time_s` (TP rank i sends its
  1/TP slice to TP rank i, all at once, each over its GPU's share of the node's NICs; the receiving TP group
  then all-gathers the slices, as vLLM and SGLang do);
- the two all-reduces per layer of a TP group spanning nodes: `ClusterModel.allreduce_time_s` (NCCL's ring
  over the network), and the logits all-gather of such a group as an all-reduce of half the bytes (as the
  profiles cost it); the run says so in a warning line (stderr and summary.json `warnings`);
- everything inside one node: the profile's own costs, unchanged. A deployment that fits one node is the
  run without `[cluster]`, bit for bit.

Not modelled across nodes: the token broadcast of the last stage (the profile's value), switch hops,
congestion of a fabric shared with other jobs.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.latency.cluster import (ClusterModel, ClusterSpec, GpuSlot, Placement, PoolShape, cluster_from_table,
                                   load_cluster_model, place, profile_hardware)


class InstanceComm:
    """The `placement` of one pipeline instance: its stages' TP groups on the cluster (stage order)."""

    __slots__ = ("cluster", "groups", "one_node", "crosses", "key")

    def __init__(self, cluster: ClusterModel, groups: tuple[tuple[GpuSlot, ...], ...]) -> None:
        self.cluster = cluster
        self.groups = groups
        self.one_node = tuple(len({s.node for s in g}) == 1 for g in groups)
        self.crosses = tuple(any(a.node != b.node for a, b in zip(g, h)) for g, h in zip(groups, groups[1:]))
        spec = cluster.spec
        shape = tuple(tuple(sorted(Counter(s.node for s in g).values())) for g in groups)
        # what the costs depend on: the same key gives the same stage times (the profile's token-part cache)
        self.key = (spec.gpu, spec.interconnect, spec.network, spec.gpus_per_node, spec.nics_per_node, shape,
                    self.crosses)

    @property
    def spans_nodes(self) -> bool:
        return not all(self.one_node)

    def allreduce_s(self, stage: int, nbytes: float, default: float) -> float:
        if self.one_node[stage]:
            return default
        return self.cluster.allreduce_time_s(nbytes, self.groups[stage])

    def send_s(self, stage: int, nbytes: float, default: float) -> float:
        if not self.crosses[stage]:
            return default
        return self.cluster.stage_send_time_s(nbytes, self.groups[stage], self.groups[stage + 1])

    def gather_s(self, nbytes: float, default: float) -> float:
        if self.one_node[-1]:
            return default
        return self.cluster.allreduce_time_s(nbytes / 2, self.groups[-1])


@lru_cache(maxsize=32)
def cluster_model(spec: ClusterSpec) -> ClusterModel:
    """`load_cluster_model`, once per process for each spec (it reads the network and kernel files)."""
    return load_cluster_model(spec)


def cluster_spec(table: dict, profile_meta: dict, profile_dir: str | Path, where: str = "config [cluster]") -> ClusterSpec:
    """The `[cluster]` table as a `ClusterSpec`; `gpu` and `interconnect` default to the profile's. Inside a
    node the profile's own costs apply, so a GPU or interconnect other than the profile's is refused."""
    table = dict(table)
    gpu, ic = profile_hardware(profile_meta, profile_dir)
    for key, own in (("gpu", gpu), ("interconnect", ic)):
        if key not in table:
            if own is None:
                raise ConfigError(f"{where}: {key} missing and the profile {profile_dir} does not name its {key}; "
                                  f"allowed: a name of profiles/{'gpus' if key == 'gpu' else 'interconnects'}/")
            table[key] = own
        elif own is not None and table[key] != own:
            raise ConfigError(f"{where}: {key} {table[key]!r} differs from the profile's ({profile_dir} was built for "
                              f"{own!r}; inside a node the profile's own costs apply); allowed: {own!r}")
    return cluster_from_table(table, where)


class PlacedRun:
    """A run's deployment on its cluster: the placement and one `InstanceComm` per instance of each pool."""

    def __init__(self, spec: ClusterSpec, placement: Placement) -> None:
        self.spec = spec
        self.placement = placement
        self.model = cluster_model(spec)
        self.comms: dict[str, list[InstanceComm]] = {}
        for pool in placement.pools:
            self.comms[pool.name] = [InstanceComm(self.model, tuple(placement.group(pool.name, i, s)
                                                                    for s in range(pool.pp)))
                                     for i in range(pool.instances)]

    @property
    def warnings(self) -> list[str]:
        return list(self.placement.warnings)

    def describe(self) -> dict[str, Any]:
        """What summary.json's `cluster` says: the cluster, and each instance's stages on their nodes."""
        spec = self.spec
        instances = []
        for pool in self.placement.pools:
            for i, comm in enumerate(self.comms[pool.name]):
                instances.append({"pool": pool.name, "instance": i, "tp": pool.tp, "pp": pool.pp,
                                  "stage_nodes": [sorted({s.node for s in g}) for g in comm.groups],
                                  "stage_crossings": sum(comm.crosses), "tp_spans_nodes": comm.spans_nodes})
        return {"nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node, "gpu": spec.gpu,
                "interconnect": spec.interconnect, "network": spec.network, "nics_per_node": spec.nics_per_node,
                "nodes_used": self.placement.nodes_used, "gpus_used": self.placement.gpus_used,
                "instances": instances}


def place_pools(cfg, pools: list[PoolShape], profile_meta: dict, profile_dir: str | Path) -> PlacedRun:
    """Place `pools` on the run's `[cluster]` (one-line ConfigError when they do not fit)."""
    spec = cluster_spec(cfg.cluster, profile_meta, profile_dir)
    return PlacedRun(spec, place(spec, pools))


def place_run(cfg, base_latency, build) -> tuple[PlacedRun, list]:
    """A co-located run's replicas on its cluster: (the placement, one latency model per replica; replicas
    placed alike share one). `build(placement)` makes a latency model with that placement hook."""
    if cfg.latency.kind != "profile":
        raise ConfigError("config [cluster]: a cluster costs communication by where ranks sit, which needs a "
                          "profiled latency model; allowed: [latency] kind = \"profile\"")
    prof = base_latency.profile
    par = cfg.parallel
    placed = place_pools(cfg, [PoolShape("colocated", par.replicas, par.tp, par.pp)], prof.meta, prof.path)
    by_key: dict[tuple, Any] = {}
    latencies = []
    for comm in placed.comms["colocated"]:
        if comm.key not in by_key:   # (all inside one node: no hook, the profile's costs and caches as they are)
            by_key[comm.key] = build(comm if comm.spans_nodes or any(comm.crosses) else None)
        latencies.append(by_key[comm.key])
    return placed, latencies
