"""Multi-node runs (issue 34): a `[cluster]` table places the deployment, and every cross-node PP send and
all-reduce of a TP group spanning nodes is costed over the network, checked against hand calculations;
inside one node nothing changes, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from sim.core.config import config_from_table
from sim.core.errors import ConfigError
from sim.engine.cluster import InstanceComm, cluster_model, cluster_spec
from sim.engine.run import build_latency, run
from sim.latency.base import BatchStats
from sim.outputs.metrics import requests_frame, summarize
from sim.latency.cluster import GpuSlot, place_replicas

L8 = "profiles/built/h100-sxm-80gb/llama-3.1-8b"
L405 = "profiles/built/h100-sxm-80gb/llama-3.1-405b/tp8"
NDR = {"network": "ib-ndr"}


def table(tp=2, pp=1, replicas=1, cluster=None, n=60, rate=4.0, profile=None, **extra) -> dict:
    t = {"seed": 3, "parallel": {"tp": tp, "pp": pp, "replicas": replicas},
         "scheduler": {"chunk_size_tokens": 512, "context_length_tokens": 8192},
         "latency": {"profile": profile or f"{L8}/tp{tp}"},
         "workload": {"name": "azure-conv-synth", "num_requests": n, "rate_rps": rate}, **extra}
    if cluster is not None:
        t["cluster"] = cluster
    return t


def one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_one_node_cluster_is_the_run_without_it():
    # 2 replicas of TP2 x PP2 fit one 8-GPU node: every send and all-reduce stays inside, bit for bit
    plain = run(config_from_table(table(tp=2, pp=2, replicas=2)))
    placed = run(config_from_table(table(tp=2, pp=2, replicas=2, cluster={"nodes": 1, "gpus_per_node": 8, **NDR})))
    a, b = requests_frame(plain), requests_frame(placed)
    assert a.equals(b)
    sa, sb = summarize(plain), summarize(placed)
    extra = {"cluster", "gpus", "nodes_used", "placement_warnings", "mode"}
    assert set(sb) - set(sa) == extra
    assert {k: v for k, v in sb.items() if k not in extra} == sa
    assert sb["mode"] == "colocated" and sb["gpus"] == 8 and sb["nodes_used"] == 1 and sb["placement_warnings"] == []
    # more nodes than needed change nothing either (the placement packs the first node)
    more = run(config_from_table(table(tp=2, pp=2, replicas=2, cluster={"nodes": 4, "gpus_per_node": 8, **NDR})))
    assert requests_frame(more).equals(a)


def _latency(tp, pp, nodes, gpn, tokens=512):
    cfg = config_from_table(table(tp=tp, pp=pp, cluster={"nodes": nodes, "gpus_per_node": gpn, **NDR},
                                  latency={"profile": f"{L8}/tp{tp}", "variance": False}))
    base = build_latency(cfg)
    spec = cluster_spec(cfg.cluster, base.profile.meta, base.profile.path)
    pl = place_replicas(spec, 1, tp, pp)
    comm = InstanceComm(cluster_model(spec), tuple(pl.group("colocated", 0, s) for s in range(pp)))
    return base, build_latency(cfg, comm), comm


def test_cross_node_pp_send_by_hand():
    # Llama-3.1-8B TP8 x PP2 on two 8-GPU H100 nodes: stage 0 on node 0, stage 1 on node 1.
    base, placed, comm = _latency(8, 2, 2, 8)
    assert comm.crosses == (True,) and comm.one_node == (True, True)
    st = BatchStats(512)
    # the activation of 512 tokens: 16,384 B per token (hidden 4096 x 2 B x 2, the profile's
    # activation_bytes_per_token) x 512 = 8,388,608 B; each of the 8 GPUs sends its 1/8 slice, 1,048,576 B,
    # to its peer over its own NDR NIC: alpha 8.4 + 14.0 + 0.6 = 23.0 us, + 1,048,576 / 47.0e9 s = 22.310 us;
    # node 1's TP8 group then all-gathers the slices over NVSwitch (8-GPU fit 28.55 us, 338.78 GB/s):
    # 28.55 + 7/8 x 8,388,608 / 338.78e9 s = 50.216 us -> 95.526 us
    cross = 23.0e-6 + 1_048_576 / 47.0e9 + 28.55e-6 + 7 / 8 * 8_388_608 / 338.78e9
    assert cross == pytest.approx(95.526e-6, abs=1e-9)
    d0 = placed.stage_time(st, 0).comm_s - base.stage_time(st, 0).comm_s
    assert d0 == pytest.approx(cross - base.p2p_s(512), rel=1e-12)
    # the last stage sends nothing; its all-reduces stay inside node 1: unchanged
    assert placed.stage_time(st, 1).comm_s == base.stage_time(st, 1).comm_s
    # and the engine's cached per-batch times agree with stage_time
    assert placed.stage_times(st)[0] == pytest.approx(placed.stage_time(st, 0).total_s, rel=1e-12)


def test_tp_spanning_nodes_all_reduces_over_the_network():
    # TP8 on nodes of 4 GPUs: the group spans nodes 0-1; each of the 32 layers' two all-reduces of
    # 512 x 4096 x 2 B = 4,194,304 B runs NCCL's fastest algorithm over NDR (sim/latency/cluster.py, hand-checked in
    # tests/test_cluster.py): its cost replaces the profile's NVSwitch all-reduce
    base, placed, comm = _latency(8, 1, 2, 4)
    assert comm.one_node == (False,) and comm.spans_nodes
    group = comm.groups[0]
    assert [s.node for s in group] == [0] * 4 + [1] * 4
    ar = cluster_model(comm.cluster.spec).allreduce_time_s(4_194_304, group)
    st = BatchStats(512)
    expect = base.stage_time(st, 0).comm_s - 2 * 32 * base.allreduce_s(512) + 2 * 32 * ar
    assert placed.stage_time(st, 0).comm_s == pytest.approx(expect, rel=1e-12)
    assert ar > base.allreduce_s(512)   # the network is slower than NVSwitch
    # the logits all-gather of 3 sequences: an all-reduce of half of 3 x 128256 x 2 B over the group
    assert placed.logits_gather_s(3) == pytest.approx(cluster_model(comm.cluster.spec).allreduce_time_s(
        3 * 128256 * 2 / 2, group))


def test_spanning_tp_is_warned_in_the_summary_and_on_stderr(tmp_path):
    cfg = tmp_path / "c.toml"
    t = table(tp=8, cluster={"nodes": 2, "gpus_per_node": 4, **NDR}, n=20)
    from sim.core import tomlio

    cfg.write_text(tomlio.dumps(t))
    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(cfg), "--no-iterations", "--out",
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "ppsim: warning: colocated instance 0 stage 0: TP8 spans nodes 0-1 (4 GPUs per node): its " \
           "all-reduces cross the ib-ndr network" in proc.stderr
    summ = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any("TP8 spans nodes 0-1" in w for w in summ["warnings"])
    assert summ["cluster"]["instances"][0]["tp_spans_nodes"] is True
    assert "# cluster:" in proc.stdout and "ib-ndr between" in proc.stdout


def test_llama_405b_tp8_pp2_on_two_h100_nodes():
    # 812 GB of BF16 weights: TP8 x PP2 over two 8-GPU nodes, the stage boundary over InfiniBand NDR
    t = table(tp=8, pp=2, profile=L405, n=12, rate=0.5, cluster={"nodes": 2, "gpus_per_node": 8, **NDR})
    res = run(config_from_table(t))
    s = summarize(res)
    assert res.status == "ok" and s["num_finished"] == 12
    inst = s["cluster"]["instances"][0]
    assert inst["stage_nodes"] == [[0], [1]] and inst["stage_crossings"] == 1 and s["gpus"] == 16
    assert s["stage_layers"] == [63, 63]
    # one node of 8 cannot hold it: the weights do not fit at PP1
    with pytest.raises(ConfigError, match=r"does not fit in GPU memory at pp = 1, tp = 8 \(profile .*llama-3.1-405b"):
        run(config_from_table(table(tp=8, pp=1, profile=L405, n=4, cluster={"nodes": 1, "gpus_per_node": 8, **NDR})))


@pytest.mark.parametrize("cluster, match", [
    ({"nodes": 0, "gpus_per_node": 8, **NDR}, r"c.toml: \[cluster\] nodes must be an integer in \[1, 4096\]; got 0"),
    ({"nodes": 2.0, "gpus_per_node": 8, **NDR}, r"\[cluster\] nodes must be an integer in \[1, 4096\]; got 2.0"),
    ({"nodes": float("nan"), "gpus_per_node": 8, **NDR}, r"\[cluster\] nodes must be an integer in \[1, 4096\]; got nan"),
    ({"nodes": 2, "gpus_per_node": 8, "racks": 2, **NDR}, r"\[cluster\] unknown key 'racks'; allowed: nodes, "
                                                          r"gpus_per_node, gpu, interconnect, network, nics_per_node"),
    ({"nodes": 2, "gpus_per_node": 8}, r"\[cluster\] network missing; required: nodes, gpus_per_node, network"),
    ({"nodes": 2, "gpus_per_node": 8, "network": 5}, r"\[cluster\] network must be a name \(a string\); got 5"),
])
def test_bad_cluster_tables_fail_on_load(cluster, match):
    with pytest.raises(ConfigError, match=match) as exc:
        config_from_table(table(cluster=cluster), "c.toml")
    one_line(exc)


@pytest.mark.parametrize("cluster, match", [
    ({"nodes": 2, "gpus_per_node": 8, "network": "myrinet"},
     r"config \[cluster\]: network 'myrinet' is unknown; allowed: efa-p4d, efa-p5, ib-hdr, ib-ndr"),
    ({"nodes": 2, "gpus_per_node": 8, "interconnect": "pcie-p2p-disabled", **NDR},
     r"interconnect 'pcie-p2p-disabled' differs from the profile's .* allowed: 'nvswitch'"),
    ({"nodes": 2, "gpus_per_node": 8, "gpu": "a100-sxm-80gb", **NDR},
     r"gpu 'a100-sxm-80gb' differs from the profile's .* allowed: 'h100-sxm-80gb'"),
    ({"nodes": 1, "gpus_per_node": 4, **NDR},
     r"the deployment needs 8 GPUs \(colocated: 2 x TP2 x PP2\) but the cluster has 4 .* nodes >= 2"),
])
def test_cluster_errors_when_the_run_starts(cluster, match):
    with pytest.raises(ConfigError, match=match) as exc:
        run(config_from_table(table(tp=2, pp=2, replicas=2, cluster=cluster, n=4)))
    one_line(exc)


def test_hand_built_profiles_know_their_hardware():
    # the paper's PCIe box: a100-pcie-40gb with the P2P-disabled PCIe model; a network between two of them
    t = table(tp=4, pp=1, profile="profiles/a100-pcie-40gb/qwen2.5-32b/tp4", n=10, rate=1.0,
              cluster={"nodes": 2, "gpus_per_node": 4, "network": "roce-100g"}, parallel={"tp": 4, "replicas": 2})
    s = summarize(run(config_from_table(t)))
    assert s["cluster"]["gpu"] == "a100-pcie-40gb" and s["cluster"]["interconnect"] == "pcie-p2p-disabled"
    assert [i["stage_nodes"] for i in s["cluster"]["instances"]] == [[[0]], [[1]]]
    assert GpuSlot(1, 0).node == 1


@pytest.mark.parametrize("name", ["llama405b_tp8pp2.toml", "disagg_70b.toml"])
def test_shipped_cluster_configs_run(name):
    from sim.core.config import load_config

    cfg = load_config(REPO / "experiments" / "configs" / name, ["workload.num_requests=8"])
    res = run(cfg)
    s = summarize(res)
    assert res.status == "ok" and s["num_finished"] == 8 and "cluster" in s
