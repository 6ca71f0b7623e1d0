"""The cluster model (sim/latency/cluster.py): network files, the [cluster] table, placement, and the cost
functions checked against hand calculations whose arithmetic is written out in the comments."""

from __future__ import annotations

import math
import tomllib

import pytest

from conftest import REPO
from sim.core.errors import ConfigError, DataError
from sim.latency.cluster import (NETWORK_CITED, ClusterModel, ClusterSpec, GpuSlot, IntraNodeLink, PoolShape,
                                   cluster_from_table, kv_flows, kv_heads_of_shard, kv_transfer_bytes,
                                   load_cluster, load_cluster_model, load_network, network_from_table,
                                   network_names, place, place_replicas, same_node)
from sim.profiling.specs import load_model

H100 = {"gpus_per_node": 8, "gpu": "h100-sxm-80gb", "interconnect": "nvswitch", "network": "ib-ndr"}


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def ndr2() -> ClusterModel:
    """2 nodes of 8 H100 SXM on NVSwitch, InfiniBand NDR between them (reads the files once)."""
    return load_cluster_model(cluster_from_table({"nodes": 2, **H100}))


def fake_model(network: str, nodes: int = 2, gpus_per_node: int = 8, **spec) -> ClusterModel:
    """A cluster model over a real network file and a made-up intra-node link (round numbers)."""
    intra = IntraNodeLink("nvswitch", p2p_alpha_us=10.0, p2p_bw_gbps=100.0,
                          allreduce=tuple((n, 20.0, 200.0) for n in range(2, gpus_per_node + 1)), nvlink=True)
    cs = ClusterSpec(nodes, gpus_per_node, "h100-sxm-80gb", "nvswitch", network, **spec)
    return ClusterModel(cs, load_network(network), intra)


# -- network files -----------------------------------------------------------------------------------------------

def test_every_network_file_loads_and_cites_its_numbers():
    names = network_names()
    assert {"ib-hdr", "ib-ndr", "roce-100g", "roce-200g", "roce-400g", "efa-p4d", "efa-p5"} <= set(names)
    for name in names:
        net = load_network(name)
        cites = dict(net.sources)
        assert net.source.strip() and net.status.strip(), name
        for key in NETWORK_CITED:
            assert cites[key].strip(), (name, key)
        assert 0 < net.efficiency <= 1, name
        assert net.gpus_share_nics == (net.nics_per_node < net.reference_gpus_per_node)


def test_network_numbers_as_published():
    hdr, ndr, p4d, p5 = (load_network(n) for n in ("ib-hdr", "ib-ndr", "efa-p4d", "efa-p5"))
    assert (hdr.nic_line_rate_gbit_s, hdr.nic_achievable_gbps, hdr.nics_per_node) == (200, 24.0, 8)
    assert (ndr.nic_line_rate_gbit_s, ndr.nic_achievable_gbps, ndr.nics_per_node) == (400, 47.0, 8)
    assert "ASSUMPTION" in ndr.status and "link_latency_us" in ndr.status
    # p4d: 4 NICs for 8 GPUs (shared); p5: 32 NICs, 4 per GPU; 32 x 100 Gb/s = 3.2 Tb/s
    assert (p4d.nics_per_node, p4d.gpus_share_nics) == (4, True)
    assert (p5.nics_per_node, p5.gpus_share_nics, p5.nics_per_node * p5.nic_line_rate_gbit_s) == (32, False, 3200)
    for name in ("roce-100g", "roce-200g", "roce-400g"):
        assert "ASSUMPTION" in load_network(name).status


def test_unknown_network_lists_the_allowed_ones():
    with pytest.raises(DataError) as exc:
        load_network("myrinet")
    assert "allowed: efa-p4d, efa-p5, ib-hdr, ib-ndr" in one_line(exc)


def _net_file(**over) -> dict:
    with open(REPO / "profiles" / "networks" / "ib-ndr.toml", "rb") as f:
        cfg = tomllib.load(f)
    for key, value in over.items():
        if key == "sources":
            cfg["sources"] = value
        elif value is None:
            cfg["network"].pop(key)
        else:
            cfg["network"][key] = value
    return cfg


@pytest.mark.parametrize("over, match", [
    ({"nic_achievable_gbps": math.inf}, r"'nic_achievable_gbps' must be a finite number in \(0, 400\], got inf"),
    ({"link_latency_us": -1}, r"'link_latency_us' must be a finite number in \(0, 1000\]"),
    ({"nic_achievable_gbps": 60.0}, r"exceeds the line rate \(400 Gb/s = 50 GB/s\)"),
    ({"nics_per_node": 0}, r"'nics_per_node' must be an integer in \[1, 1024\], got 0"),
    ({"gpus_share_nics": True}, r"'gpus_share_nics' is true but nics_per_node = 8 .* allowed: true exactly"),
    ({"kind": "myrinet"}, r"'kind' must be one of infiniband, roce, efa"),
    ({"source": None}, r"field 'source' must be a non-empty string"),
    ({"status": ""}, r"field 'status' must be a non-empty string"),
    ({"sources": {"nic_line_rate_gbit_s": "x"}}, r"\[sources\]: field 'nic_achievable_gbps' must cite"),
])
def test_bad_network_files_fail_in_one_line(over, match):
    with pytest.raises(DataError, match=match) as exc:
        network_from_table("bad", _net_file(**over), "bad.toml")
    one_line(exc)


# -- the [cluster] table -----------------------------------------------------------------------------------------

def test_cluster_table_and_file(tmp_path):
    cs = cluster_from_table({"nodes": 2, "gpus_per_node": 8, "gpu": "h100-sxm-80gb", "network": "ib-ndr"})
    assert cs == ClusterSpec(2, 8, "h100-sxm-80gb", "nvswitch", "ib-ndr")   # the GPU's own interconnect
    assert cs.total_gpus == 16
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\nnodes = 4\ngpus_per_node = 8\ngpu = "a100-sxm-80gb"\nnetwork = "efa-p4d"\n'
                    'nics_per_node = 4\n')
    assert load_cluster(path) == ClusterSpec(4, 8, "a100-sxm-80gb", "nvswitch", "efa-p4d", nics_per_node=4)


@pytest.mark.parametrize("over, match", [
    ({"nodes": 0}, r"nodes must be an integer >= 1; got 0"),
    ({"nodes": -2}, r"nodes must be an integer >= 1; got -2"),
    ({"gpus_per_node": math.inf}, r"gpus_per_node must be an integer >= 1; got inf"),
    ({"nodes": math.nan}, r"nodes must be an integer >= 1; got nan"),
    ({"nodes": True}, r"nodes must be an integer >= 1; got True"),
    ({"gpus_per_node": "8"}, r"gpus_per_node must be an integer >= 1; got '8'"),
    ({"nics_per_node": 0}, r"nics_per_node must be an integer >= 1; got 0"),
    ({"network": "myrinet"}, r"network 'myrinet' is unknown; allowed: efa-p4d, efa-p5, ib-hdr, ib-ndr, roce-100g"),
    ({"network": None}, r"network missing; allowed: efa-p4d"),
    ({"interconnect": "ethernet"},
     r"interconnect 'ethernet' is unknown; allowed: nvswitch, pcie-nvlink-pairs, pcie-p2p-disabled"),
    ({"gpu": "a40-48gb"},
     r"interconnect 'nvswitch' has no data for a40-48gb; allowed for this GPU: pcie-nvlink-pairs, pcie-p2p-disabled"),
    ({"gpu": "tpu-v5"}, r"gpu 'tpu-v5' is unknown; allowed: a100-pcie-40gb"),
    ({"racks": 2}, r"unknown field 'racks'; allowed: nodes, gpus_per_node, gpu, interconnect, network"),
])
def test_bad_cluster_tables_fail_in_one_line(over, match):
    table = {"nodes": 2, **H100, **over}
    table = {k: v for k, v in table.items() if v is not None}
    with pytest.raises(ConfigError, match=match) as exc:
        cluster_from_table(table, "c.toml [cluster]")
    assert one_line(exc).startswith("c.toml [cluster]: ")


def test_a_nan_in_the_file_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\nnodes = nan\ngpus_per_node = 8\ngpu = "h100-sxm-80gb"\nnetwork = "ib-ndr"\n')
    with pytest.raises(ConfigError, match=r"c.toml \[cluster\]: nodes must be an integer >= 1; got nan"):
        load_cluster(path)
    path.write_text("[other]\n")
    with pytest.raises(ConfigError, match=r"missing table \[cluster\]"):
        load_cluster(path)


# -- placement ---------------------------------------------------------------------------------------------------

def test_tp8_pp2_puts_the_stages_on_two_nodes():
    cs = cluster_from_table({"nodes": 2, **H100})
    pl = place_replicas(cs, replicas=1, tp=8, pp=2)
    assert pl.group("colocated", 0, 0) == tuple(GpuSlot(0, g) for g in range(8))
    assert pl.group("colocated", 0, 1) == tuple(GpuSlot(1, g) for g in range(8))
    assert pl.warnings == ()
    assert pl.same_node(0, 7) and not pl.same_node(0, 8)        # ranks 0-7 stage 0, 8-15 stage 1
    assert (pl.nodes_used, pl.gpus_used, pl.stage_crossings("colocated", 0)) == (2, 16, 1)


def test_tp16_spans_two_nodes_and_is_flagged():
    cs = cluster_from_table({"nodes": 2, **H100})
    pl = place_replicas(cs, 1, 16, 1)
    assert [s.node for s in pl.group("colocated", 0, 0)] == [0] * 8 + [1] * 8
    assert len(pl.warnings) == 1
    assert "TP16 spans nodes 0-1 (8 GPUs per node): its all-reduces cross the ib-ndr network" in pl.warnings[0]


def test_tp_groups_stay_inside_a_node_and_stages_follow_in_order():
    cs = cluster_from_table({"nodes": 2, **H100})
    # 2 replicas of TP4 x PP2: replica 0 fills node 0 (stages on GPUs 0-3, 4-7), replica 1 node 1
    pl = place_replicas(cs, 2, 4, 2)
    assert pl.group("colocated", 0, 1) == tuple(GpuSlot(0, g) for g in range(4, 8))
    assert pl.group("colocated", 1, 0) == tuple(GpuSlot(1, g) for g in range(4))
    assert pl.stage_crossings("colocated", 0) == 0
    # TP4 x PP4: stages 0-1 on node 0, 2-3 on node 1
    pl = place_replicas(cs, 1, 4, 4)
    assert [pl.group("colocated", 0, s)[0].node for s in range(4)] == [0, 0, 1, 1]
    # TP3: two groups per node, GPUs 6-7 idle; the third group starts node 1
    pl = place_replicas(cs, 3, 3, 1)
    assert pl.group("colocated", 2, 0) == (GpuSlot(1, 0), GpuSlot(1, 1), GpuSlot(1, 2))
    # TP12 then TP4 on 3 nodes: 12 = node 0 + half of node 1 (flagged), the TP4 takes the other half
    cs3 = cluster_from_table({"nodes": 3, **H100})
    pl = place(cs3, [PoolShape("a", 1, 12, 1), PoolShape("b", 1, 4, 1)])
    assert pl.group("a", 0, 0)[-1] == GpuSlot(1, 3) and pl.group("b", 0, 0)[0] == GpuSlot(1, 4)
    assert len(pl.warnings) == 1


def test_disaggregated_pools_are_placed_in_order():
    cs = cluster_from_table({"nodes": 2, **H100})
    pl = place(cs, [PoolShape("prefill", 2, 4, 1), PoolShape("decode", 1, 8, 1)])
    assert {s.node for i in range(2) for s in pl.group("prefill", i, 0)} == {0}
    assert {s.node for s in pl.group("decode", 0, 0)} == {1}
    assert [r.pool for r in pl.ranks] == ["prefill"] * 8 + ["decode"] * 8
    assert same_node(pl.group("prefill", 1, 0)[0], pl.group("prefill", 0, 0)[0])


def test_a_deployment_larger_than_the_cluster_fails_in_one_line():
    cs = cluster_from_table({"nodes": 2, **H100})
    with pytest.raises(ConfigError, match=r"needs 24 GPUs \(colocated: 3 x TP8 x PP1\) but the cluster has 16 "
                                          r"\(2 nodes x 8 GPUs\); allowed: at most 16 GPUs, or nodes >= 3") as exc:
        place_replicas(cs, 3, 8, 1)
    one_line(exc)
    # 15 GPUs fit 16 by count, but five TP3 groups need 3 nodes when each stays inside a node
    with pytest.raises(ConfigError, match=r"15 GPUs .* do not fit 2 nodes x 8 GPUs with each TP group inside "
                                          r"one node .*allowed: nodes >= 3") as exc:
        place_replicas(cs, 5, 3, 1)
    one_line(exc)
    with pytest.raises(ConfigError, match=r"pool 'x': tp must be an integer >= 1; got 0"):
        place(cs, [PoolShape("x", 1, 0, 1)])
    with pytest.raises(ConfigError, match=r"pool name 'p' given twice"):
        place(cs, [PoolShape("p", 1, 2, 1), PoolShape("p", 1, 2, 1)])
    with pytest.raises(ConfigError, match=r"rank 16 out of range; allowed: 0..15"):
        place_replicas(cs, 1, 8, 2).same_node(0, 16)


# -- KV bytes ----------------------------------------------------------------------------------------------------

def test_kv_bytes_by_hand():
    m8 = load_model("llama-3.1-8b")
    # K and V x 32 layers x 8 KV heads x 128 x 2 B x 1000 tokens = 131,072,000 B, all on one GPU at TP1
    assert kv_transfer_bytes(m8, 1000, 1) == 2 * 32 * 8 * 128 * 2 * 1000 == 131_072_000
    assert kv_transfer_bytes(m8, 1000, 2) == 65_536_000          # 4 heads per shard
    assert kv_transfer_bytes(m8, 1000, 16) == 16_384_000         # 16 > 8 heads: one head per shard, replicated
    assert kv_transfer_bytes(m8, 1000, 1, num_layers=16) == 65_536_000   # one of two PP stages
    m405 = load_model("llama-3.1-405b")
    # 2 x 126 x 8 x 128 x 2 = 516,096 B per token; TP8: one head per GPU, 64,512 B; TP16 replicates it
    assert kv_transfer_bytes(m405, 1, 1) == 516_096
    assert kv_transfer_bytes(m405, 1, 8) == kv_transfer_bytes(m405, 1, 16) == 64_512
    with pytest.raises(DataError, match=r"KV transfer tp 3: does not divide the heads of llama-3.1-8b "
                                        r"\(32 q / 8 kv heads\)"):
        kv_transfer_bytes(m8, 10, 3)
    with pytest.raises(ConfigError, match=r"num_tokens must be an integer >= 0; got -1"):
        kv_transfer_bytes(m8, -1, 1)
    with pytest.raises(ConfigError, match=r"num_layers must be an integer in \[1, 32\]"):
        kv_transfer_bytes(m8, 1, 1, num_layers=33)


def test_kv_shards_and_flows():
    m8 = load_model("llama-3.1-8b")
    assert list(kv_heads_of_shard(m8, 2, 1)) == [4, 5, 6, 7]
    assert list(kv_heads_of_shard(m8, 16, 5)) == [2]             # ranks 4 and 5 hold head 2
    per_head = 2 * 32 * 128 * 2 * 100
    # TP2 -> TP4: destination j needs heads 2j, 2j+1, held by source j // 2
    assert kv_flows(m8, 100, 2, 4) == {(0, 0): 2 * per_head, (0, 1): 2 * per_head,
                                       (1, 2): 2 * per_head, (1, 3): 2 * per_head}
    # TP16 -> TP4: heads replicated on two sources each; destinations take them from both holders in turn
    flows = kv_flows(m8, 100, 16, 4)
    assert sum(flows.values()) == 8 * per_head and len(flows) == 8
    # every destination shard gets exactly its own bytes
    for src_tp, dst_tp in ((1, 8), (8, 1), (2, 16), (16, 2), (8, 8)):
        got = kv_flows(m8, 7, src_tp, dst_tp)
        for j in range(dst_tp):
            assert sum(b for (_, d), b in got.items() if d == j) == kv_transfer_bytes(m8, 7, dst_tp)


# -- costs -------------------------------------------------------------------------------------------------------

def test_cross_node_pp_send_over_ndr_by_hand(ndr2):
    # A 4096-hidden BF16 activation for 512 tokens: 4096 x 512 x 2 B = 4,194,304 B.
    # ib-ndr.toml: 47.0 GB/s per NIC, 8 NICs per 8 GPUs -> 47.0 GB/s per GPU; link latency 0.6 us.
    # alpha = NCCL Simple base 8.4 + network step 14.0 + link 0.6 = 23.0 us
    # time  = 23.0 us + 4,194,304 / 47.0e9 s = 23.0 + 89.2405 = 112.2405 us
    nbytes = 4096 * 512 * 2
    t = ndr2.p2p_time_s(nbytes, GpuSlot(0, 3), GpuSlot(1, 3))
    assert t == pytest.approx(23.0e-6 + 4_194_304 / 47.0e9, rel=1e-12)
    assert t == pytest.approx(112.2405e-6, abs=1e-10)
    # inside the node: H100 NVSwitch send_recv fit 7.64 us + 358.02 GB/s (profiles/kernels/h100.toml)
    assert ndr2.p2p_time_s(nbytes, GpuSlot(0, 3), GpuSlot(0, 4)) == pytest.approx(7.64e-6 + nbytes / 358.02e9)
    assert ndr2.p2p_time_s(nbytes, GpuSlot(0, 3), GpuSlot(0, 3)) == 0.0
    # a stage boundary of TP1 -> TP1 is that one send, the whole activation
    assert ndr2.stage_send_time_s(nbytes, [GpuSlot(0, 3)], [GpuSlot(1, 3)]) == pytest.approx(t, rel=1e-12)
    # TP8 -> TP8, as vLLM and SGLang send it (send_tensor_dict with the TP group as all_gather_group): each
    # rank sends its 1/8 slice, 524,288 B, on its own NIC, all at once: 23.0 + 524,288 / 47.0e9 s = 34.1551 us;
    # then node 1's 8 GPUs all-gather the slices over NVSwitch (the 8-GPU all-reduce fit of
    # profiles/kernels/h100.toml, 28.55 us and 338.78 GB/s bus bandwidth): 28.55 + 7/8 x 4,194,304 / 338.78e9
    # = 39.3830 us; in all 73.5381 us (not 112.24 us: every rank sending the whole activation)
    src = [GpuSlot(0, g) for g in range(8)]
    dst = [GpuSlot(1, g) for g in range(8)]
    send = 23.0e-6 + 524_288 / 47.0e9
    gather = 28.55e-6 + 7 / 8 * 4_194_304 / 338.78e9
    assert ndr2.stage_send_time_s(nbytes, src, dst) == pytest.approx(send + gather, rel=1e-12)
    assert ndr2.stage_send_time_s(nbytes, src, dst) == pytest.approx(73.5381e-6, abs=1e-10)


def test_kv_transfer_time_by_hand(ndr2):
    m8 = load_model("llama-3.1-8b")
    # Llama-3.1-8B, 1000 tokens, TP1 -> TP1 across nodes: 23.0 us + 131,072,000 / 47.0e9 = 2.81177 ms
    t = ndr2.kv_transfer_time_s(m8, 1000, [GpuSlot(0, 0)], [GpuSlot(1, 0)])
    assert t == pytest.approx(23.0e-6 + 131_072_000 / 47.0e9)
    assert t == pytest.approx(2.81177e-3, rel=1e-5)
    # TP2 -> TP4: each source sends 4 heads (2 to each of two destinations) = 65,536,000 B on its own NIC
    t = ndr2.kv_transfer_time_s(m8, 1000, [GpuSlot(0, 0), GpuSlot(0, 1)], [GpuSlot(1, g) for g in range(4)])
    assert t == pytest.approx(23.0e-6 + 65_536_000 / 47.0e9)
    # Llama-3.1-405B, 8192 tokens, TP8 -> TP8 rail to rail: 126 x 2 x 128 x 2 x 8192 = 528,482,304 B per GPU,
    # 23.0 us + 528,482,304 / 47.0e9 = 11.268 ms (the notes' "about 11 ms")
    m405 = load_model("llama-3.1-405b")
    src = [GpuSlot(0, g) for g in range(8)]
    dst = [GpuSlot(1, g) for g in range(8)]
    assert ndr2.kv_transfer_time_s(m405, 8192, src, dst) == pytest.approx(23.0e-6 + 528_482_304 / 47.0e9)
    # inside one node it goes over NVSwitch: 7.64 us + 131,072,000 / 358.02e9
    t = ndr2.kv_transfer_time_s(m8, 1000, [GpuSlot(0, 0)], [GpuSlot(0, 1)])
    assert t == pytest.approx(7.64e-6 + 131_072_000 / 358.02e9)


def test_allreduce_by_hand(ndr2):
    eight = [GpuSlot(0, g) for g in range(8)]
    sixteen = eight + [GpuSlot(1, g) for g in range(8)]
    # inside a node: H100 NVSwitch 8-GPU fit, 28.55 us + 2 x 7/8 x bytes / 338.78 GB/s
    assert ndr2.allreduce_time_s(1 << 20, eight) == pytest.approx(28.55e-6 + 1.75 * (1 << 20) / 338.78e9)
    assert ndr2.allreduce_time_s(1 << 20, eight[:1]) == 0.0
    # TP16 over two nodes, 1 GiB: bus bandwidth = min(8 GPUs x 47.0 = 376, NVSwitch 8-GPU 338.78) = 338.78 GB/s;
    # moved = 2 x 15/16 x 2^30 = 2,013,265,920 B; 30 steps, 4 of them across nodes (2 x 2 nodes).
    # Simple: 8.4 + 4 x (14.0 + 0.6) + 26 x 3.4 = 155.2 us, + 2,013,265,920 / 338.78e9 = 5.94270 ms -> 6.09790 ms
    # (LL128: 81.8 us + 2,013,265,920 / (0.92 x 338.78e9) = 6.541 ms; LL: capped at 39 GB/s, 51.7 ms)
    moved = 2 * 15 / 16 * (1 << 30)
    assert ndr2.allreduce_time_s(1 << 30, sixteen) == pytest.approx(155.2e-6 + moved / 338.78e9)
    assert ndr2.allreduce_choice(1 << 30, sixteen)[:2] == ("ring", "Simple")
    # (tree Simple: 2 x (7 x 28 + (28 + 0.6)) = 449.2 us + 2^30 / (0.5 x 0.92 x 338.78e9) = 7.339 ms: slower)
    # 8 KiB: NCCL's tree with LL wins (tuning.cc): 6.8 + 2 x (7 x 0.6 + log2(2) x (5.0 + 0.6)) = 26.4 us;
    # bandwidth min(338.78 x 0.92 / 3.8 = 82.02, llMaxBw 39) x 0.5 x treeCorrectionFactor[LL][log2(8192 / 64) = 7]
    # 0.7 = 13.65 GB/s -> 26.4 us + 8192 / 13.65e9 = 27.000 us; the best ring (LL) takes
    # 6.6 + 4 x (2.7 + 0.6) + 26 x max(0.6, 1.0) = 45.8 us + 15,360 / 39e9 = 46.19 us
    assert ndr2.allreduce_choice(8192, sixteen) == ("tree", "LL", pytest.approx(26.4e-6 + 8192 / 13.65e9))
    assert ndr2.allreduce_time_s(8192, sixteen) == pytest.approx(27.0e-6, abs=1e-9)
    assert ndr2.allreduce_choice(1 << 20, eight)[:2] == ("fit", "")      # one node: the measured fit
    # more expensive than inside one node
    assert ndr2.allreduce_time_s(1 << 20, sixteen) > ndr2.allreduce_time_s(1 << 20, eight)


def test_nic_sharing_and_overrides():
    # p4d: 4 NICs x 10.625 GB/s for 8 GPUs -> 5.3125 GB/s per GPU; p5: 32 x 11.1 / 8 = 44.4 GB/s
    assert fake_model("efa-p4d").nic_gbps_per_gpu == pytest.approx(5.3125)
    assert fake_model("efa-p5").nic_gbps_per_gpu == pytest.approx(44.4)
    # a 4-GPU node keeps the reference ratio (one NDR NIC per GPU) unless nics_per_node says otherwise
    assert fake_model("ib-ndr", gpus_per_node=4).nic_gbps_per_gpu == pytest.approx(47.0)
    assert fake_model("ib-ndr", gpus_per_node=4, nics_per_node=1).nic_gbps_per_gpu == pytest.approx(11.75)
    cm = fake_model("efa-p4d")
    # p4d cross-node send of 1 MB: (8.4 + 14.0 + 9.9) us + 1e6 / 5.3125e9 = 32.3 + 188.235 us
    assert cm.p2p_time_s(1e6, GpuSlot(0, 0), GpuSlot(1, 0)) == pytest.approx(32.3e-6 + 1e6 / 5.3125e9)
    # a 2-node ring of 1 GPU per node: the one NIC share bounds it (5.3125 GB/s), 2 steps both across nodes
    # Simple: 8.4 + 2 x (14.0 + 9.9) = 56.2 us + 2 x 1/2 x 1e9 / 5.3125e9
    assert cm.allreduce_time_s(1e9, [GpuSlot(0, 0), GpuSlot(1, 0)]) == pytest.approx(56.2e-6 + 1e9 / 5.3125e9)


def test_cost_inputs_are_checked(ndr2):
    with pytest.raises(ConfigError, match=r"bytes must be a finite number >= 0; got nan"):
        ndr2.p2p_time_s(math.nan, GpuSlot(0, 0), GpuSlot(1, 0))
    with pytest.raises(ConfigError, match=r"GpuSlot\(node=2, local_gpu=0\) is not a GPU of the cluster; "
                                          r"allowed: GpuSlot\(node in 0..1, local_gpu in 0..7\)"):
        ndr2.p2p_time_s(1, GpuSlot(0, 0), GpuSlot(2, 0))
    with pytest.raises(ConfigError, match=r"all-reduce ranks must be distinct"):
        ndr2.allreduce_time_s(1, [GpuSlot(0, 0), GpuSlot(0, 0)])
    with pytest.raises(ConfigError, match=r"got 2 source and 1 destination ranks"):
        ndr2.stage_send_time_s(1, [GpuSlot(0, 0), GpuSlot(0, 1)], [GpuSlot(1, 0)])


# -- Llama-3.1-405B ------------------------------------------------------------------------------------------------

def test_llama_405b_model_file():
    m = load_model("llama-3.1-405b")
    assert (m.num_layers, m.hidden_size, m.intermediate_size, m.num_q_heads, m.num_kv_heads, m.head_dim,
            m.vocab_size) == (126, 16384, 53248, 128, 8, 128, 128256)
    # 126 x 3,187,703,808 + 2 x 128256 x 16384 = 405,853,372,416 parameters, 811.7 GB in BF16
    assert m.num_layers * m.layer_params + 2 * m.embedding_params == 405_853_372_416
    with open(REPO / "profiles" / "models" / "llama-3.1-405b.toml", "rb") as f:
        assert tomllib.load(f)["model"]["context_length_tokens"] == 131072
