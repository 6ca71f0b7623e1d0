"""The cluster model: nodes of GPUs joined by an inter-node network, where each rank of a deployment sits,
and what moving bytes between two ranks costs (issue 34's foundation; the engine and the planner use it).
A run reads it as it reads its profile (layer 1: it imports only sim/core and sim/latency/hardware.py).

What it models
- `NetworkSpec` (`profiles/networks/<name>.toml`, `load_network`): an inter-node fabric per NIC (line rate,
  the bandwidth NCCL achieves on it, one-way link latency) and how many NICs a node has, shared by GPUs or
  not. Every number cites its source in the file's `[sources]`; assumptions are named in `status`.
- `ClusterSpec` (a `[cluster]` table, `cluster_from_table` / `load_cluster`): nodes x GPUs per node, the GPU
  spec, the intra-node interconnect (`profiles/interconnects`) and the inter-node network.
- Placement (`place`, `place_replicas`): ranks of pools of instances (replicas x TP x PP; a disaggregated
  deployment is two pools) assigned to (node, local GPU) in order: a TP group is packed inside one node when
  it fits (else the next node is started; TP wider than a node spans whole nodes and is warned about), PP
  stages and instances follow one another over the nodes. No back-filling: a hole left by a TP group that did
  not fit is not used by a later, smaller one.
- Costs (`ClusterModel`, pure, seconds):
  - inside a node, the interconnect's alpha-beta model exactly as profiles use it
    (`sim.latency.hardware.comm_model`: measured NCCL fits for NVSwitch / NVLink pairs, fixed or calibrated
    values for PCIe);
  - across nodes, `alpha + bytes / (per-GPU share of the node's achievable NIC bandwidth)`, alpha = NCCL's
    Simple-protocol base and network-step latencies (8.4 + 14.0 us) + the file's link latency. A GPU's share
    is `nic_achievable_gbps x NICs per GPU` (the network file's `nics_per_node / reference_gpus_per_node`,
    or the cluster's `nics_per_node / gpus_per_node` when given): GPUs that share a NIC (AWS p4d: 2 per NIC)
    are assumed to use it at the same time, as the ranks of a pipeline or a KV transfer do; GPUs with several
    NICs (AWS p5: 4) stripe over them, as aws-ofi-nccl does;
  - a PP stage boundary (`stage_send_time_s`): each TP rank sends its 1/TP slice of the activation to its
    peer in the next stage, all at once, and the receiving TP group all-gathers the slices (vLLM's and
    SGLang's `send_tensor_dict(..., all_gather_group=<TP group>)`);
  - an all-reduce over ranks on several nodes follows NCCL's own cost model (NVIDIA/nccl
    src/graph/tuning.cc at commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2, `ncclTopoTuneModel` and
    `ncclTopoGetAlgoTime`) and takes, as NCCL's tuner does per message size, the fastest of the ring and
    tree algorithms, each with the LL, LL128 (NVLink nodes only) and Simple protocols
    (`allreduce_choice` says which):
    - ring: `baseLat + 2 nNodes x (hwLat[NET] + link latency) + (2(n-1) - 2 nNodes) x max(hwLat[NVLink or
      PCI], net overhead) + 2(n-1)/n x bytes / bus bandwidth`, the bus bandwidth the smaller of the
      intra-node fit and the group's NIC bandwidth on its thinnest node (n_g GPUs there x per-GPU share:
      8 x 24 = 192 GB/s on two DGX A100s, as NVIDIA measured, nccl issue 812), x 1/4 for LL (capped at
      `llMaxBws`) and x 0.92 for LL128;
    - tree (NCCL's double binary tree across nodes, a chain inside each): `baseLat[Tree] + 2 x ((n/nNodes - 1)
      x hwLat[Tree][NVLink or PCI] + log2(nNodes) x (hwLat[Tree][NET] + link latency)) + bytes / (0.5 x
      bus bandwidth x 0.92 x protocol factor x treeCorrectionFactor)`: the same bus bandwidth (NCCL starts
      both algorithms from one graph bandwidth on 2 nodes), x 0.92 for the tree, / 3.8 for LL (capped at
      `llMaxBws`), x 120/128 for LL128; the correction factor by message size (powers of two from 64 B)
      is NCCL's own. Small messages take the tree (its latency grows with log2 of the nodes, the ring's
      with every rank), large ones the ring (the tree's bandwidth term is 0.92 x its correction lower).
    Not taken over: the channel count (LL128's and the tree's per-channel bandwidth caps, the ring's
    1.4x "plateau" latency above 64 B per channel and rank), the tree's 0.85 for an unbalanced tree pattern,
    Simple's second link latency ("flush"), NVLS / NVLS-tree (NVLink SHARP) and CollNet (SHARP switches),
    which need switch features the network files do not describe. AIConfigurator's NCCL tables measure 2-8
    GPUs inside one node only, so they say nothing about the choice across nodes.
  - KV cache of a prompt (`kv_transfer_bytes`): K and V of every layer, `2 x layers x KV heads x head_dim
    x dtype_bytes x tokens`; each TP shard holds `kv_heads / tp` heads when `kv_heads >= tp`, else one head
    replicated `tp / kv_heads` times (as SGLang and vLLM shard it). `kv_transfer_time_s` sends each
    destination shard's heads from a source shard that holds them, all pairs in parallel, each GPU's link
    serialising its own flows (`ProfileModel`: a profile's `[model]` shapes, `model_of_profile`).

Each cost here is one transfer alone; the engine queues transfers on shared links (sim/engine/disagg.py
keeps each link's busy-until time). Not modelled: switch hops and oversubscription of the fabric,
congestion, GPUDirect-less staging through host memory.

Sources of the fixed constants below: NCCL's tuning model (above). The network numbers are in the files.
Readers raise `DataError` (network files) or `ConfigError` (a `[cluster]` table, a deployment that does not
fit), one line naming the field and what is allowed. Only `load_network`, `cluster_from_table` (it checks
names against the spec folders), `load_cluster`, `intra_node_link` and `load_cluster_model` read files; the
dataclasses and cost functions do no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from sim.core.errors import ConfigError, DataError
from sim.core.tomlio import read_toml
from sim.latency.hardware import (PROFILES, comm_model, family_meta, gpu_names, interconnect_names, load_gpu,
                                  load_interconnect)

NETWORKS_DIR = PROFILES / "networks"
NETWORK_KINDS = ("infiniband", "roce", "efa")
# the numbers a network file must give, each with a citation under [sources]
NETWORK_NUMBERS = ("nic_line_rate_gbit_s", "nic_achievable_gbps", "link_latency_us")
NETWORK_COUNTS = ("nics_per_node", "reference_gpus_per_node")
# Bounds of a network file's numbers: a line rate from 1 Gb/s to 3.2 Tb/s per NIC (today's largest is
# 800 Gb/s), a one-way latency up to 1 ms (EFA's is ~10 us); a NIC reaches at least 10% of its line rate
# with NCCL (the files' 85-96%); at most 8 NICs per GPU (AWS p5: 4) and 1024 per node. Beyond them a
# file is a typo, not a network: 1e-300 GB/s gave P90 TTFTs of 1e305 ms with status ok.
NETWORK_RANGES = {"nic_line_rate_gbit_s": (0.5, 3200.0), "nic_achievable_gbps": (0.0, 400.0),
                  "link_latency_us": (0.0, 1000.0)}
MIN_ACHIEVABLE_SHARE = 0.1
MAX_NICS_PER_GPU = 8
MAX_NETWORK_COUNT = 1024
NETWORK_CITED = (*NETWORK_NUMBERS, "nics_per_node")
CLUSTER_KEYS = ("nodes", "gpus_per_node", "gpu", "interconnect", "network", "nics_per_node")


# -- NCCL's cost model (tuning.cc, commit b6475625): latencies in us, per protocol -----------------------------

@dataclass(frozen=True)
class NcclProtocol:
    name: str
    base_us: float              # baseLat[Ring][p]: once per collective
    net_step_us: float          # hwLat[NET][Ring][p]: per step that crosses nodes
    nvlink_step_us: float       # hwLat[NVLINK][Ring][p]: per step inside a node over NVLink
    pci_step_us: float          # hwLat[PCI][Ring][p]: per step inside a node over PCIe
    busbw_factor: float         # multi-node ring all-reduce: LL moves 1/4 of the bus bandwidth, LL128 0.92
    net_overhead_x: float       # getNetOverhead (1 us on Intel x86) x this is a floor on a multi-node intra step
    needs_nvlink: bool          # NCCL enables LL128 only when the intra-node path is NVLink


NCCL_PROTOCOLS = (
    NcclProtocol("LL", 6.6, 2.7, 0.6, 1.0, 0.25, 1.0, False),
    NcclProtocol("LL128", 14.0, 4.0, 1.9, 2.5, 0.92, 1.0, True),
    NcclProtocol("Simple", 8.4, 14.0, 3.4, 5.7, 1.0, 3.0, False),
)
SIMPLE = NCCL_PROTOCOLS[2]
# Not taken over from tuning.cc: LL128's per-channel bandwidth caps (the channel count is not modelled) and the
# CollNet / NVLS algorithms; NCCL may pick those on 2 nodes, where its bus bandwidth can exceed line rate.
NCCL_NET_OVERHEAD_US = 1.0      # Intel x86 host (AMD: 2.0); the Intel value is an assumption about the host
# llMaxBws for an Intel host: LL's bus bandwidth cap on 2 nodes and on more (GB/s)
NCCL_LL_MAX_BUSBW_GBPS = {2: 39.0, 3: 20.4}


@dataclass(frozen=True)
class NcclTreeProtocol:
    name: str
    base_us: float              # baseLat[Tree][p]
    net_step_us: float          # hwLat[NET][Tree][p]: per tree level across nodes
    nvlink_step_us: float       # hwLat[NVLINK][Tree][p]: per chain step inside a node over NVLink
    pci_step_us: float          # hwLat[PCI][Tree][p]
    busbw_factor: float         # after the tree's 0.92: LL / 3.8, LL128 x 120/128 on several nodes
    correction: tuple[float, ...]   # treeCorrectionFactor[p]: x the bandwidth at 64 B, 128 B, ... 256 MiB
    needs_nvlink: bool


NCCL_TREE_PROTOCOLS = (
    NcclTreeProtocol("LL", 6.8, 5.0, 0.6, 1.0, 1 / 3.8,
                     (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
                      1.0), False),
    NcclTreeProtocol("LL128", 14.0, 8.5, 1.25, 1.9, 120 / 128,
                     (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
                      1.0), True),
    NcclTreeProtocol("Simple", 0.0, 28.0, 28.0, 28.0, 1.0,
                     (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
                     False),
)
NCCL_TREE_BUSBW_X = 0.92        # busBw * .92 for every tree protocol
NCCL_TREE_ALGBW_RATIO = 0.5     # a tree's algorithm bandwidth is half its bus bandwidth


def log2i(n: int) -> int:
    """NCCL's `log2i` (src/include/utils.h): floor(log2(n)), 0 for n <= 1."""
    return max(int(n), 1).bit_length() - 1


# -- inter-node networks -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NetworkSpec:
    name: str
    description: str
    kind: str                       # one of NETWORK_KINDS
    node: str                       # the node type nics_per_node was read from
    nic_line_rate_gbit_s: float     # per NIC, gigabits/s (as links are sold)
    nic_achievable_gbps: float      # per NIC, gigabytes/s that NCCL reaches on large messages
    link_latency_us: float          # one-way, hardware and transport (added to NCCL's per-step latency)
    nics_per_node: int
    reference_gpus_per_node: int
    gpus_share_nics: bool
    source: str
    status: str                     # what is measured, what is assumed
    sources: tuple[tuple[str, str], ...] = ()   # (field, citation), one per number

    @property
    def efficiency(self) -> float:
        """Achievable over line rate (bytes vs bits)."""
        return self.nic_achievable_gbps * 8 / self.nic_line_rate_gbit_s


def network_names() -> list[str]:
    return sorted(p.stem for p in NETWORKS_DIR.glob("*.toml"))


def network_from_table(name: str, cfg: dict, where: str) -> NetworkSpec:
    """A `NetworkSpec` from a parsed network file (`where` names it in errors)."""
    net = cfg.get("network")
    if not isinstance(net, dict):
        raise DataError(f"{where}: missing table [network]")
    w = f"{where} [network]"
    nums = {}
    for key in NETWORK_NUMBERS:
        v = net.get(key)
        lo, hi = NETWORK_RANGES[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v <= hi:
            raise DataError(f"{w}: field {key!r} must be a finite number in ({lo:g}, {hi:g}], got {v!r}")
        nums[key] = float(v)
    counts = {}
    for key in NETWORK_COUNTS:
        v = net.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_NETWORK_COUNT:
            raise DataError(f"{w}: field {key!r} must be an integer in [1, {MAX_NETWORK_COUNT}], got {v!r}")
        counts[key] = v
    if counts["nics_per_node"] > MAX_NICS_PER_GPU * counts["reference_gpus_per_node"]:
        raise DataError(f"{w}: field 'nics_per_node' ({counts['nics_per_node']}) is more than {MAX_NICS_PER_GPU} "
                        f"NICs per GPU of the reference node ({counts['reference_gpus_per_node']} GPUs)")
    kind = net.get("kind")
    if kind not in NETWORK_KINDS:
        raise DataError(f"{w}: field 'kind' must be one of {', '.join(NETWORK_KINDS)}, got {kind!r}")
    share = net.get("gpus_share_nics")
    if not isinstance(share, bool):
        raise DataError(f"{w}: field 'gpus_share_nics' must be true or false, got {share!r}")
    # the flag documents the layout; it must agree with the counts it describes
    if share != (counts["nics_per_node"] < counts["reference_gpus_per_node"]):
        raise DataError(f"{w}: field 'gpus_share_nics' is {str(share).lower()} but nics_per_node = "
                        f"{counts['nics_per_node']} and reference_gpus_per_node = "
                        f"{counts['reference_gpus_per_node']}; allowed: true exactly when there are fewer NICs "
                        f"than GPUs")
    if nums["nic_achievable_gbps"] * 8 > nums["nic_line_rate_gbit_s"]:
        raise DataError(f"{w}: field 'nic_achievable_gbps' ({nums['nic_achievable_gbps']:g} GB/s) exceeds the line "
                        f"rate ({nums['nic_line_rate_gbit_s']:g} Gb/s = {nums['nic_line_rate_gbit_s'] / 8:g} GB/s)")
    if nums["nic_achievable_gbps"] * 8 < MIN_ACHIEVABLE_SHARE * nums["nic_line_rate_gbit_s"]:
        raise DataError(f"{w}: field 'nic_achievable_gbps' ({nums['nic_achievable_gbps']:g} GB/s) is under "
                        f"{MIN_ACHIEVABLE_SHARE:.0%} of the line rate ({nums['nic_line_rate_gbit_s'] / 8:g} GB/s); "
                        f"allowed: [{MIN_ACHIEVABLE_SHARE * nums['nic_line_rate_gbit_s'] / 8:g}, "
                        f"{nums['nic_line_rate_gbit_s'] / 8:g}] GB/s")
    texts = {}
    for key in ("description", "node", "source", "status"):
        v = net.get(key)
        if not isinstance(v, str) or not v.strip():
            raise DataError(f"{w}: field {key!r} must be a non-empty string (cite where the numbers come from; "
                            f"say which are assumptions)")
        texts[key] = v
    cites = cfg.get("sources")
    if not isinstance(cites, dict):
        raise DataError(f"{where}: missing table [sources] (one citation per number)")
    for key in NETWORK_CITED:
        if not isinstance(cites.get(key), str) or not cites[key].strip():
            raise DataError(f"{where} [sources]: field {key!r} must cite a URL or repo+path")
    return NetworkSpec(name=name, description=texts["description"], kind=kind, node=texts["node"],
                       nic_line_rate_gbit_s=nums["nic_line_rate_gbit_s"],
                       nic_achievable_gbps=nums["nic_achievable_gbps"], link_latency_us=nums["link_latency_us"],
                       nics_per_node=counts["nics_per_node"],
                       reference_gpus_per_node=counts["reference_gpus_per_node"], gpus_share_nics=share,
                       source=texts["source"], status=texts["status"],
                       sources=tuple(sorted((k, str(v)) for k, v in cites.items())))


def load_network(name: str) -> NetworkSpec:
    path = NETWORKS_DIR / f"{name}.toml"
    if not path.is_file():
        raise DataError(f"--network {name!r}: unknown network; allowed: {', '.join(network_names())}")
    return network_from_table(name, read_toml(path, DataError), str(path))


# -- the cluster -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int
    gpu: str                        # profiles/gpus/<gpu>.toml
    interconnect: str               # inside a node: profiles/interconnects/<interconnect>.toml
    network: str                    # between nodes: profiles/networks/<network>.toml
    nics_per_node: int | None = None    # None: as many per GPU as the network file's reference node

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _count(table: dict, key: str, where: str) -> int:
    v = table.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        # inf, nan and 2.0 land here too: counts are TOML integers
        raise ConfigError(f"{where}: {key} must be an integer >= 1; got {v!r}")
    return v


def _choice(table: dict, key: str, where: str, allowed: list[str]) -> str:
    v = table.get(key)
    if v not in allowed:
        what = "missing" if v is None else f"{v!r} is unknown"
        raise ConfigError(f"{where}: {key} {what}; allowed: {', '.join(allowed)}")
    return v


def cluster_from_table(table: Any, where: str = "[cluster]") -> ClusterSpec:
    """A `ClusterSpec` from a `[cluster]` table; `interconnect` defaults to the GPU's own."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table with {', '.join(CLUSTER_KEYS)}")
    unknown = sorted(set(table) - set(CLUSTER_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(CLUSTER_KEYS)}")
    nodes = _count(table, "nodes", where)
    gpn = _count(table, "gpus_per_node", where)
    gpu_name = _choice(table, "gpu", where, gpu_names())
    gpu = load_gpu(gpu_name)
    ic_name = table.get("interconnect", gpu.default_interconnect)
    ic_name = _choice({"interconnect": ic_name}, "interconnect", where, interconnect_names())
    ic = load_interconnect(ic_name)
    if ic.families and gpu.kernel_data not in ic.families:
        ok = [n for n in interconnect_names()
              if not load_interconnect(n).families or gpu.kernel_data in load_interconnect(n).families]
        raise ConfigError(f"{where}: interconnect {ic_name!r} has no data for {gpu_name}; allowed for this GPU: "
                          f"{', '.join(ok)}")
    network = _choice(table, "network", where, network_names())
    nics = _count(table, "nics_per_node", where) if "nics_per_node" in table else None
    return ClusterSpec(nodes=nodes, gpus_per_node=gpn, gpu=gpu_name, interconnect=ic_name, network=network,
                       nics_per_node=nics)


def load_cluster(path: str | Path) -> ClusterSpec:
    """The `[cluster]` table of a TOML file."""
    cfg = read_toml(path, ConfigError)
    if "cluster" not in cfg:
        raise ConfigError(f"{path}: missing table [cluster] ({', '.join(CLUSTER_KEYS)})")
    return cluster_from_table(cfg["cluster"], f"{path} [cluster]")


# -- placement ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class GpuSlot:
    node: int
    local_gpu: int


def same_node(a: GpuSlot, b: GpuSlot) -> bool:
    return a.node == b.node


@dataclass(frozen=True)
class PoolShape:
    """`instances` copies of one TP x PP instance (co-located replicas, or a prefill or decode pool)."""
    name: str
    instances: int
    tp: int
    pp: int

    @property
    def gpus(self) -> int:
        return self.instances * self.tp * self.pp

    def describe(self) -> str:
        return f"{self.name}: {self.instances} x TP{self.tp} x PP{self.pp}"


@dataclass(frozen=True)
class RankPlacement:
    rank: int                   # global, in placement order: pool, instance, stage, TP rank
    pool: str
    instance: int
    stage: int
    tp_rank: int
    slot: GpuSlot


@dataclass(frozen=True)
class Placement:
    spec: ClusterSpec
    pools: tuple[PoolShape, ...]
    ranks: tuple[RankPlacement, ...]
    warnings: tuple[str, ...]   # one line each: TP groups that span nodes

    def group(self, pool: str, instance: int, stage: int) -> tuple[GpuSlot, ...]:
        """The TP group of one stage of one instance, in TP-rank order."""
        out = tuple(r.slot for r in self.ranks if (r.pool, r.instance, r.stage) == (pool, instance, stage))
        if not out:
            raise ConfigError(f"placement: no stage {stage} of instance {instance} in pool {pool!r}; pools: "
                              f"{', '.join(p.describe() for p in self.pools)}")
        return out

    def slot(self, rank: int) -> GpuSlot:
        if not 0 <= rank < len(self.ranks):
            raise ConfigError(f"placement: rank {rank} out of range; allowed: 0..{len(self.ranks) - 1}")
        return self.ranks[rank].slot

    def same_node(self, rank_a: int, rank_b: int) -> bool:
        return same_node(self.slot(rank_a), self.slot(rank_b))

    @property
    def nodes_used(self) -> int:
        return len({r.slot.node for r in self.ranks})

    @property
    def gpus_used(self) -> int:
        return len(self.ranks)

    def stage_crossings(self, pool: str, instance: int) -> int:
        """How many stage-to-stage sends of one instance cross nodes (first ranks compared)."""
        shape = next(p for p in self.pools if p.name == pool)
        firsts = [self.group(pool, instance, s)[0] for s in range(shape.pp)]
        return sum(not same_node(a, b) for a, b in itertools.pairwise(firsts))


def _check_pools(pools: Sequence[PoolShape]) -> tuple[PoolShape, ...]:
    if not pools:
        raise ConfigError("placement: no pools; allowed: one or more PoolShape(name, instances, tp, pp)")
    names = [p.name for p in pools]
    for p in pools:
        if not isinstance(p.name, str) or not p.name:
            raise ConfigError(f"placement: pool name must be a non-empty string; got {p.name!r}")
        for key in ("instances", "tp", "pp"):
            _count({key: getattr(p, key)}, key, f"placement pool {p.name!r}")
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise ConfigError(f"placement: pool name {dup[0]!r} given twice; allowed: distinct names")
    return tuple(pools)


def _lay_out(gpn: int, pools: tuple[PoolShape, ...]) -> list[tuple[PoolShape, int, int, list[GpuSlot]]]:
    """(pool, instance, stage, TP group slots) on unbounded nodes of `gpn` GPUs, in order."""
    node, used = 0, 0           # the next free GPU is (node, used)
    out = []
    for pool in pools:
        for inst in range(pool.instances):
            for stage in range(pool.pp):
                tp = pool.tp
                if tp <= gpn:
                    if used + tp > gpn:         # keep the TP group inside one node: start the next one
                        node, used = node + 1, 0
                    slots = [GpuSlot(node, used + r) for r in range(tp)]
                    used += tp
                else:
                    if used:                    # a group wider than a node takes whole nodes from a fresh one
                        node, used = node + 1, 0
                    slots = [GpuSlot(node + r // gpn, r % gpn) for r in range(tp)]
                    node, used = node + tp // gpn, tp % gpn
                if used == gpn:
                    node, used = node + 1, 0
                out.append((pool, inst, stage, slots))
    return out


def place(spec: ClusterSpec, pools: Sequence[PoolShape]) -> Placement:
    """Every rank of `pools` on (node, local GPU), or a one-line ConfigError when the cluster is too small."""
    shapes = _check_pools(pools)
    gpn = spec.gpus_per_node
    layout = _lay_out(gpn, shapes)
    need = sum(p.gpus for p in shapes)
    nodes_needed = max(s.node for *_, slots in layout for s in slots) + 1
    what = "; ".join(p.describe() for p in shapes)
    have = f"{spec.nodes} nodes x {gpn} GPUs"
    if need > spec.total_gpus:
        raise ConfigError(f"placement: the deployment needs {need} GPUs ({what}) but the cluster has "
                          f"{spec.total_gpus} ({have}); allowed: at most {spec.total_gpus} GPUs, or "
                          f"nodes >= {nodes_needed} (GPUs: each pool's instances x tp x pp)")
    if nodes_needed > spec.nodes:
        raise ConfigError(f"placement: the deployment's {need} GPUs ({what}) do not fit {have} with each TP group "
                          f"inside one node (groups that do not fill a node leave GPUs idle); allowed: "
                          f"nodes >= {nodes_needed}")
    ranks: list[RankPlacement] = []
    warnings: list[str] = []
    for pool, inst, stage, slots in layout:
        nodes = sorted({s.node for s in slots})
        if len(nodes) > 1:
            warnings.append(f"{pool.name} instance {inst} stage {stage}: TP{pool.tp} spans nodes "
                            f"{nodes[0]}-{nodes[-1]} ({gpn} GPUs per node): its all-reduces cross the "
                            f"{spec.network} network")
        for tp_rank, slot in enumerate(slots):
            ranks.append(RankPlacement(len(ranks), pool.name, inst, stage, tp_rank, slot))
    return Placement(spec, shapes, tuple(ranks), tuple(warnings))


def place_replicas(spec: ClusterSpec, replicas: int, tp: int, pp: int, pool: str = "colocated") -> Placement:
    """A co-located deployment: `replicas` instances of TP x PP."""
    return place(spec, [PoolShape(pool, replicas, tp, pp)])


# -- KV cache ----------------------------------------------------------------------------------------------------

def allowed_tps_of(num_q_heads: int, num_kv_heads: int, candidates: Sequence[int] = (1, 2, 4, 8)) -> list[int]:
    """The TP degrees that divide the query heads and divide or are a multiple of the KV heads."""
    return [t for t in candidates if not num_q_heads % t and (not num_kv_heads % t or not t % num_kv_heads)]


def check_tp_of(name: str, num_q_heads: int, num_kv_heads: int, tp: int, where: str = "--tp") -> None:
    """TP must divide the query heads, and divide or be a multiple of the KV heads (SGLang replicates)."""
    if tp < 1 or num_q_heads % tp or (num_kv_heads % tp and tp % num_kv_heads):
        raise DataError(f"{where} {tp}: does not divide the heads of {name} ({num_q_heads} q / "
                        f"{num_kv_heads} kv heads); allowed: "
                        f"{', '.join(str(t) for t in allowed_tps_of(num_q_heads, num_kv_heads))}")


class KvModel(Protocol):
    """What KV transfers need of a model: a profile's `[model]` (`ProfileModel`) or a model file
    (`sim.profiling.specs.ModelArch`)."""
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def kv_bytes(self) -> int: ...

    def check_tp(self, tp: int, where: str = "--tp") -> None: ...


def _check_tp(model: KvModel, tp: int, where: str) -> None:
    # check_tp raises DataError; a bad TP here is a bad deployment, reported the same way
    model.check_tp(tp, where)


def _layers(model: KvModel, num_layers: int | None) -> int:
    if num_layers is None:
        return model.num_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= model.num_layers:
        raise ConfigError(f"KV transfer: num_layers must be an integer in [1, {model.num_layers}] "
                          f"({model.name}); got {num_layers!r}")
    return num_layers


def _tokens(num_tokens: int) -> int:
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ConfigError(f"KV transfer: num_tokens must be an integer >= 0; got {num_tokens!r}")
    return num_tokens


def kv_heads_of_shard(model: KvModel, tp: int, tp_rank: int) -> range:
    """The KV heads TP rank `tp_rank` holds: a 1/tp slice when kv_heads >= tp, else one head that
    tp / kv_heads ranks hold alike (replicated)."""
    h = model.num_kv_heads
    if h >= tp:
        per = h // tp
        return range(tp_rank * per, (tp_rank + 1) * per)
    head = tp_rank // (tp // h)
    return range(head, head + 1)


def kv_transfer_bytes(model: KvModel, num_tokens: int, tp: int, num_layers: int | None = None) -> int:
    """Bytes of K and V that ONE TP shard holds for `num_tokens` tokens over `num_layers` layers (default all):
    2 x layers x (kv_heads / tp, or 1 when kv_heads < tp: replicated) x head_dim x KV bytes per element (kv_dtype_bytes, else dtype_bytes) x tokens."""
    _check_tp(model, tp, "KV transfer tp")
    heads = len(kv_heads_of_shard(model, tp, 0))
    return 2 * _layers(model, num_layers) * heads * model.head_dim * model.kv_bytes * _tokens(num_tokens)


def kv_flows(model: KvModel, num_tokens: int, src_tp: int, dst_tp: int,
             num_layers: int | None = None) -> dict[tuple[int, int], int]:
    """{(source TP rank, destination TP rank): bytes}: each destination shard gets its heads from a source
    shard that holds them (replicated heads from the holders in turn, to spread the load)."""
    _check_tp(model, src_tp, "KV transfer source tp")
    _check_tp(model, dst_tp, "KV transfer destination tp")
    per_head = 2 * _layers(model, num_layers) * model.head_dim * model.kv_bytes * _tokens(num_tokens)
    holders: dict[int, list[int]] = {}
    for i in range(src_tp):
        for h in kv_heads_of_shard(model, src_tp, i):
            holders.setdefault(h, []).append(i)
    flows: dict[tuple[int, int], int] = {}
    for j in range(dst_tp):
        for h in kv_heads_of_shard(model, dst_tp, j):
            i = holders[h][j % len(holders[h])]
            flows[(i, j)] = flows.get((i, j), 0) + per_head
    return flows


# -- costs -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IntraNodeLink:
    """The interconnect inside a node as profiles cost it (alpha-beta per group size)."""
    interconnect: str
    p2p_alpha_us: float
    p2p_bw_gbps: float
    allreduce: tuple[tuple[int, float, float], ...]   # (GPUs, alpha_us, busbw_gbps) for 2..gpus_per_node
    nvlink: bool                # NCCL's per-step latencies: NVLink (nvswitch) or PCIe (the rest)
    how: str = ""

    def allreduce_fit(self, n: int) -> tuple[float, float]:
        """(alpha_us, busbw_gbps) of an n-GPU all-reduce inside a node."""
        for size, alpha, bw in self.allreduce:
            if size == n:
                return alpha, bw
        raise ConfigError(f"intra-node all-reduce of {n} GPUs: no fit; allowed: "
                          f"{', '.join(str(s) for s, _, _ in self.allreduce)} GPUs")


def intra_node_link(gpu: str, interconnect: str, gpus_per_node: int) -> IntraNodeLink:
    """Read the interconnect's alpha-beta values for `gpu` (measured fits or fixed values), group sizes
    2..gpus_per_node: the function profiles are built with, on profiles/kernels/<family>.toml."""
    family = load_gpu(gpu).kernel_data
    meta = family_meta(family)
    ic = load_interconnect(interconnect)
    fits, how = [], ""
    p2p = (0.0, 1.0)
    for n in range(2, max(2, gpus_per_node) + 1):
        vals, how, _ = comm_model(ic, family, n, meta)
        fits.append((n, float(vals["allreduce_alpha_us"]), float(vals["allreduce_busbw_gbps"])))
        p2p = (float(vals["p2p_alpha_us"]), float(vals["p2p_bw_gbps"]))
    return IntraNodeLink(interconnect, p2p[0], p2p[1], tuple(fits), nvlink=interconnect == "nvswitch", how=how)


@dataclass(frozen=True)
class ClusterModel:
    """Everything the cost functions need, already read; the functions are pure."""
    spec: ClusterSpec
    network: NetworkSpec
    intra: IntraNodeLink

    @property
    def nics_per_gpu(self) -> float:
        """NICs per GPU: the cluster's `nics_per_node` when given, else the network file's reference node's
        ratio (8 NICs for 8 GPUs is one per GPU on a 4-GPU node too)."""
        if self.spec.nics_per_node:
            return self.spec.nics_per_node / self.spec.gpus_per_node
        return self.network.nics_per_node / self.network.reference_gpus_per_node

    @property
    def nic_gbps_per_gpu(self) -> float:
        """A GPU's share of its node's achievable NIC bandwidth (GB/s), every GPU sending at once."""
        return self.network.nic_achievable_gbps * self.nics_per_gpu

    @property
    def inter_p2p_alpha_us(self) -> float:
        """One cross-node send: NCCL's Simple-protocol base and per-network-step latencies (the protocol of
        MB-sized messages) plus the file's one-way link latency. NCCL keeps its step latency the same for
        every fabric, so the link term is what tells EFA from InfiniBand; on InfiniBand it may double count
        about 1 us."""
        return SIMPLE.base_us + SIMPLE.net_step_us + self.network.link_latency_us

    def _check_slot(self, s: GpuSlot) -> None:
        if not (isinstance(s, GpuSlot) and 0 <= s.node < self.spec.nodes
                and 0 <= s.local_gpu < self.spec.gpus_per_node):
            raise ConfigError(f"cluster: rank {s!r} is not a GPU of the cluster; allowed: GpuSlot(node in "
                              f"0..{self.spec.nodes - 1}, local_gpu in 0..{self.spec.gpus_per_node - 1})")

    @staticmethod
    def _check_bytes(nbytes: float) -> float:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) \
                or nbytes < 0:
            raise ConfigError(f"cluster: bytes must be a finite number >= 0; got {nbytes!r}")
        return float(nbytes)

    def _pair(self, src: GpuSlot, dst: GpuSlot) -> tuple[float, float]:
        """(alpha seconds, bandwidth bytes/s) of the link a send from src to dst uses."""
        if same_node(src, dst):
            return self.intra.p2p_alpha_us * 1e-6, self.intra.p2p_bw_gbps * 1e9
        return self.inter_p2p_alpha_us * 1e-6, self.nic_gbps_per_gpu * 1e9

    def p2p_time_s(self, nbytes: float, src: GpuSlot, dst: GpuSlot) -> float:
        """One send of `nbytes` from src to dst: the interconnect's model inside a node, else
        alpha + bytes / the GPU's NIC share."""
        nbytes = self._check_bytes(nbytes)
        self._check_slot(src)
        self._check_slot(dst)
        if src == dst:
            return 0.0
        alpha, bw = self._pair(src, dst)
        return alpha + nbytes / bw

    def stage_send_time_s(self, nbytes: float, src: Sequence[GpuSlot], dst: Sequence[GpuSlot]) -> float:
        """A PP stage boundary carrying an activation of `nbytes` (every TP rank holds all of it after the
        stage's last all-reduce), sent as vLLM and SGLang send it: `send_tensor_dict(..., all_gather_group=
        <the TP group>)` (vllm `vllm/v1/worker/gpu_model_runner.py` with `get_tp_group()`, sglang
        `python/sglang/srt/managers/scheduler_pp_mixin.py` with `self.attn_tp_group`; the slicing is
        `GroupCoordinator.send_tensor_dict` / `recv_tensor_dict` in both engines' `distributed/parallel_state.py`):

        1. TP rank i of one stage sends its 1/TP slice, `nbytes / TP`, to TP rank i of the next, all pairs at
           once, each over its own link (across nodes: its GPU's share of the node's NICs, `p2p_time_s`);
        2. the receiving stage's TP group all-gathers the slices into the whole activation: a ring
           all-gather of `nbytes`, costed as `allreduce_time_s` of half the bytes (a ring all-gather moves
           half a ring all-reduce's bytes: alpha + (TP-1)/TP x nbytes / bus bandwidth; inside a node the
           interconnect's all-reduce fit, as the profiles cost the logits all-gather).

        TP1: the whole activation, no gather. (The engines send whole tensors whose size is not a multiple
        of TP; hidden size x tokens always is here.)"""
        if len(src) != len(dst) or not src:
            raise ConfigError(f"cluster: a stage send pairs TP ranks; got {len(src)} source and {len(dst)} "
                              f"destination ranks; allowed: the same number, at least 1")
        nbytes = self._check_bytes(nbytes)
        tp = len(src)
        send = max(self.p2p_time_s(nbytes / tp, a, b) for a, b in zip(src, dst, strict=True))
        return send + (self.allreduce_time_s(nbytes / 2, dst) if tp > 1 else 0.0)

    def allreduce_time_s(self, nbytes: float, ranks: Sequence[GpuSlot]) -> float:
        """An all-reduce of `nbytes` over `ranks`: NCCL's fastest algorithm and protocol (module docstring)."""
        return self.allreduce_choice(nbytes, ranks)[2]

    def allreduce_choice(self, nbytes: float, ranks: Sequence[GpuSlot]) -> tuple[str, str, float]:
        """(algorithm, protocol, seconds) of an all-reduce of `nbytes` over `ranks`: inside one node the
        interconnect's measured fit ("fit", ""); across nodes the fastest of NCCL's ring and tree with each
        protocol ("ring" or "tree", "LL" / "LL128" / "Simple"); ("none", "", 0.0) for one rank."""
        nbytes = self._check_bytes(nbytes)
        for s in ranks:
            self._check_slot(s)
        n = len(ranks)
        if len(set(ranks)) != n:
            raise ConfigError(f"cluster: all-reduce ranks must be distinct GPUs; got {list(ranks)}")
        if n <= 1:
            return "none", "", 0.0
        per_node = Counter(s.node for s in ranks)
        k = len(per_node)
        moved = 2 * (n - 1) / n * nbytes
        if k == 1:
            alpha, busbw = self.intra.allreduce_fit(n)
            return "fit", "", alpha * 1e-6 + moved / (busbw * 1e9)
        # the ring crosses the network on every node's NICs at once: the thinnest node bounds it
        busbw = min(per_node.values()) * self.nic_gbps_per_gpu
        widest = max(per_node.values())
        if widest >= 2:
            busbw = min(busbw, self.intra.allreduce_fit(widest)[1])
        steps = 2 * (n - 1)
        inter = min(2 * k, steps)       # NCCL: nInterSteps = 2 x nNodes for an all-reduce
        link_us = self.network.link_latency_us
        ll_cap = NCCL_LL_MAX_BUSBW_GBPS[min(k, 3)]
        best = ("ring", "", math.inf)
        for p in NCCL_PROTOCOLS:
            if p.needs_nvlink and not self.intra.nvlink:
                continue
            intra_step = max(p.nvlink_step_us if self.intra.nvlink else p.pci_step_us,
                             NCCL_NET_OVERHEAD_US * p.net_overhead_x)
            lat_us = p.base_us + inter * (p.net_step_us + link_us) + (steps - inter) * intra_step
            bw = busbw * p.busbw_factor
            if p.name == "LL":
                bw = min(bw, ll_cap)
            t = lat_us * 1e-6 + moved / (bw * 1e9)
            if t < best[2]:
                best = ("ring", p.name, t)
        # the tree: a chain of n/nNodes ranks inside each node (C's integer division), log2(nNodes) levels across
        ppn, levels = n // k, log2i(k)
        size_class = log2i(int(nbytes) >> 6)
        for q in NCCL_TREE_PROTOCOLS:
            if q.needs_nvlink and not self.intra.nvlink:
                continue
            intra_step = q.nvlink_step_us if self.intra.nvlink else q.pci_step_us
            lat_us = q.base_us + 2 * ((ppn - 1) * intra_step + levels * (q.net_step_us + link_us))
            bw = busbw * NCCL_TREE_BUSBW_X * q.busbw_factor
            if q.name == "LL":
                bw = min(bw, ll_cap)
            bw *= NCCL_TREE_ALGBW_RATIO
            if size_class < len(q.correction):
                bw *= q.correction[size_class]
            t = lat_us * 1e-6 + nbytes / (bw * 1e9)
            if t < best[2]:
                best = ("tree", q.name, t)
        return best

    def kv_transfer_time_s(self, model: KvModel, num_tokens: int, src: Sequence[GpuSlot],
                           dst: Sequence[GpuSlot], num_layers: int | None = None) -> float:
        """Ship the KV of `num_tokens` tokens (over `num_layers` layers, default all) from the TP group `src`
        to the TP group `dst` (TP-rank order; the two TP degrees may differ). All pairs move in parallel;
        each GPU's link serialises its own flows; one alpha (the largest) is paid."""
        for s in list(src) + list(dst):
            self._check_slot(s)
        flows = kv_flows(model, num_tokens, len(src), len(dst), num_layers)
        busy: dict[tuple[str, GpuSlot], float] = {}
        alpha = 0.0
        for (i, j), nbytes in flows.items():
            a, b = src[i], dst[j]
            if a == b or not nbytes:
                continue
            pa, bw = self._pair(a, b)
            alpha = max(alpha, pa)
            busy[("out", a)] = busy.get(("out", a), 0.0) + nbytes / bw
            busy[("in", b)] = busy.get(("in", b), 0.0) + nbytes / bw
        return alpha + max(busy.values(), default=0.0)

    def link(self, src: GpuSlot, dst: GpuSlot) -> tuple[float, float, str]:
        """(alpha seconds, bytes/s, "intra" or "net") of the link a send from src to dst uses."""
        self._check_slot(src)
        self._check_slot(dst)
        alpha, bw = self._pair(src, dst)
        return alpha, bw, "intra" if same_node(src, dst) else "net"

    def kv_transfer_links(self, model: KvModel, num_tokens: int, src: Sequence[Sequence[GpuSlot]],
                          dst: Sequence[Sequence[GpuSlot]], src_layers: Sequence[int],
                          dst_layers: Sequence[int]) -> tuple[float, dict[tuple[str, GpuSlot, str], float]]:
        """The KV of `num_tokens` tokens from one pipeline instance to another: `src[s]` is the TP group of
        source stage s holding `src_layers[s]` consecutive layers (likewise `dst`). Each destination stage
        gets the layers it holds from the source stages that hold them (`kv_flows` per overlapping layer
        range). Returns (alpha seconds: the largest of the links used, {(direction "out"/"in", GPU, link
        kind "intra"/"net"): seconds that link is busy}); the transfer takes alpha + the busiest link's
        seconds (`kv_transfer_time_s` for one stage on each side)."""
        if len(src) != len(src_layers) or len(dst) != len(dst_layers) or not src or not dst:
            raise ConfigError(f"cluster: KV transfer stages and layer counts must pair up; got {len(src)} source "
                              f"stages for {len(src_layers)} layer counts, {len(dst)} for {len(dst_layers)}")
        if sum(src_layers) != sum(dst_layers):
            raise ConfigError(f"cluster: KV transfer source and destination hold different layer counts "
                              f"({sum(src_layers)} and {sum(dst_layers)}); allowed: the same model on both sides")
        starts_s = list(itertools.accumulate([0, *src_layers]))
        starts_d = list(itertools.accumulate([0, *dst_layers]))
        busy: dict[tuple[str, GpuSlot, str], float] = {}
        alpha = 0.0
        for s, group_s in enumerate(src):
            for t, group_d in enumerate(dst):
                overlap = min(starts_s[s + 1], starts_d[t + 1]) - max(starts_s[s], starts_d[t])
                if overlap <= 0:
                    continue
                for (i, j), nbytes in kv_flows(model, num_tokens, len(group_s), len(group_d), overlap).items():
                    a, b = group_s[i], group_d[j]
                    if a == b or not nbytes:
                        continue
                    pa, bw, kind = self.link(a, b)
                    alpha = max(alpha, pa)
                    busy[("out", a, kind)] = busy.get(("out", a, kind), 0.0) + nbytes / bw
                    busy[("in", b, kind)] = busy.get(("in", b, kind), 0.0) + nbytes / bw
        return alpha, busy


def load_cluster_model(spec: ClusterSpec) -> ClusterModel:
    """Read the network file and the interconnect's values for `spec`."""
    net = load_network(spec.network)
    # [cluster] nics_per_node: no more NICs per GPU than the network's reference node has (its cited
    # layout; at least one per GPU): 1,024 NICs on a node made crossing nodes faster than NVSwitch
    ratio = max(1.0, net.nics_per_node / net.reference_gpus_per_node)
    most = int(ratio * spec.gpus_per_node)
    if spec.nics_per_node and spec.nics_per_node > most:
        raise ConfigError(f"config [cluster] nics_per_node = {spec.nics_per_node}: more NICs per GPU than network "
                          f"{spec.network!r} describes ({net.nics_per_node} NICs for {net.reference_gpus_per_node} "
                          f"GPUs); allowed: 1 to {most} for {spec.gpus_per_node} GPUs per node")
    return ClusterModel(spec, net, intra_node_link(spec.gpu, spec.interconnect, spec.gpus_per_node))


# -- a latency profile's hardware and model (what a run's [cluster] defaults to) --------------------------------

# Hand-built profile families (profiles/<family>/) and the GPU spec / interconnect they were measured on
# (sim.profiling.library.HAND_BUILT, the other way round).
HAND_BUILT_HARDWARE = {"a100-pcie-40gb": ("a100-pcie-40gb", "pcie-p2p-disabled"),
                       "a100-sxm-80gb-nvswitch": ("a100-sxm-80gb", "nvswitch")}


def profile_hardware(meta: dict, folder: str | Path) -> tuple[str | None, str | None]:
    """(GPU spec, interconnect) a profile was built or measured for: a built profile's `[profile] gpu_spec`
    and `interconnect`, a hand-built one's family folder (profiles/<family>/<model>/tp<T>); None: unknown."""
    prof = meta.get("profile", {}) if isinstance(meta.get("profile"), dict) else {}
    gpu, ic = prof.get("gpu_spec"), prof.get("interconnect")
    fam = HAND_BUILT_HARDWARE.get(Path(folder).resolve().parent.parent.name)
    if fam is not None:
        gpu, ic = gpu or fam[0], ic or fam[1]
    return (gpu if isinstance(gpu, str) else None), (ic if isinstance(ic, str) else None)


@dataclass(frozen=True)
class ProfileModel:
    """A profile's `[model]` shapes: what a KV transfer and the check that two pools serve one model need."""
    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int = 0
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 0            # bytes per KV-cache element (0: dtype_bytes)

    @property
    def kv_bytes(self) -> int:
        return self.kv_dtype_bytes or self.dtype_bytes

    def check_tp(self, tp: int, where: str = "--tp") -> None:
        check_tp_of(self.name, self.num_q_heads, self.num_kv_heads, tp, where)


def model_of_profile(meta: dict, where: str) -> ProfileModel:
    """The model architecture a profile's `[model]` section describes (what KV transfers need)."""
    m = meta.get("model")
    if not isinstance(m, dict):
        raise DataError(f"{where}: missing section [model]")
    name = str(meta.get("profile", {}).get("model", "model")) if isinstance(meta.get("profile"), dict) else "model"
    vals = {}
    for key in ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "vocab_size"):
        v = m.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DataError(f"{where} [model]: field {key!r} must be an integer >= 1, got {v!r}")
        vals[key] = v
    return ProfileModel(name=name, intermediate_size=int(m.get("intermediate_size", 0) or 0),
                     dtype_bytes=int(m.get("dtype_bytes", 2)),
                     kv_dtype_bytes=int(m.get("kv_dtype_bytes", 0) or 0), **vals)

