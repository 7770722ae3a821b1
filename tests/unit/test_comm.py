"""Alpha-beta collectives on the topology (estimate/time/comm.py)."""

from __future__ import annotations

import pytest

from trainledger.load.catalog import load_gpu, load_network
from trainledger.spec.cluster import Cluster
from trainledger.estimate.time.comm import (
    Group,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    group,
    p2p_s,
    topology,
)
from trainledger.estimate.time.efficiency import link_efficiency


def cluster(nodes=4, gpu="h100-sxm", net="ib-ndr", per_node=8):
    g = load_gpu(gpu)
    return Cluster(gpu=g, gpus_per_node=per_node, nodes=nodes, intra=load_network(g.link),
                   inter=load_network(net) if nodes > 1 else None, nics_per_node=8)


def test_ring_all_reduce_formula():
    g = Group(n=8, per_node=8, nodes=1, beta=100e9, alpha=0.0, link="x")
    S = 1e9
    assert all_reduce_s(g, S) == pytest.approx(2 * 7 / 8 * S / 100e9)
    assert all_gather_s(g, S) == pytest.approx(7 / 8 * S / 100e9)


def test_latency_dominates_small_messages_and_tree_caps_steps():
    g = Group(n=1024, per_node=8, nodes=128, beta=50e9, alpha=5e-6, link="x")
    t = all_reduce_s(g, 8.0)
    assert t == pytest.approx((2 * 10 + 2) * 5e-6, rel=1e-3)  # tree: 2·log2(n) steps, not 2(n-1)


def test_group_inside_a_node_runs_at_nvlink():
    c = cluster()
    eff = link_efficiency()
    tp = group(c, 8, 1)
    assert tp.intra_node
    assert tp.beta == pytest.approx(eff.bytes_per_s(c.intra))


def test_group_across_nodes_is_limited_by_the_nics():
    c = cluster()
    eff = link_efficiency()
    nic = eff.bytes_per_s(c.inter)  # 8 NICs for 8 GPUs: one NIC per GPU
    dp_tp8 = group(c, 4, 8)  # one member per node (TP=8 inside)
    assert dp_tp8.nodes == 4 and dp_tp8.beta == pytest.approx(nic)
    dp_tp1 = group(c, 32, 1)  # all 8 GPUs of each node in the ring: NICs of all 8 add up
    assert dp_tp1.beta == pytest.approx(min(eff.bytes_per_s(c.intra), 8 * nic))
    assert all_reduce_s(dp_tp8, 1e9) > all_reduce_s(group(c, 4, 1), 1e9)


def test_slow_network_slows_cross_node_collectives():
    fast, slow = cluster(net="ib-ndr"), cluster(net="eth-100")
    S = 4e9
    assert all_reduce_s(group(slow, 4, 8), S) > 3 * all_reduce_s(group(fast, 4, 8), S)


def test_pcie_is_slower_than_nvlink_inside_a_node():
    nv = cluster(nodes=1, gpu="h100-sxm")
    pcie = cluster(nodes=1, gpu="h100-pcie")
    S = 1e9
    assert all_reduce_s(group(pcie, 8, 1), S) > 3 * all_reduce_s(group(nv, 8, 1), S)


def test_all_to_all_and_p2p():
    c = cluster()
    g = group(c, 16, 1)  # spans 2 nodes
    t = all_to_all_s(g, 1e9, c)
    nic = link_efficiency().bytes_per_s(c.inter)
    assert t >= (16 - 8) / 16 * 1e9 / nic  # half of the data leaves the node through the GPU's NIC
    assert p2p_s(c, 1e9, True) > p2p_s(c, 1e9, False)


def test_topology_orders_tp_innermost():
    c = cluster(nodes=4)
    topo = topology(c, tp=8, cp=1, ep=1, dp=2, pp=2)
    assert topo.tp.intra_node and not topo.dp.intra_node and topo.pp_crosses_node


def test_remembered_groups_follow_every_input_they_read():
    """``group`` remembers groups by the node shape, the links and the size and stride: a cluster
    that differs in any of them gets its own group, equal to one derived afresh (``_group``)."""
    from trainledger.estimate.time import comm

    eff = link_efficiency()
    base = cluster(nodes=4)
    variants = [base, cluster(nodes=4, net="roce-400"), cluster(nodes=4, per_node=4),
                base.updated({"nics_per_node": 2}), base.updated({"intra": load_network("pcie5-x16")}),
                base.updated({"inter": None, "nodes": 1})]
    for c in variants:
        for n, stride in ((8, 1), (16, 8), (4, 2), (32, 1)):
            first = group(c, n, stride, eff)
            assert first == comm._group(c, n, stride, eff)
            assert group(c, n, stride, eff) is first  # the second ask is the remembered group
    betas = {group(c, 16, 8, eff).beta for c in variants[:4]}
    assert len(betas) > 1  # the network and the NICs per node change a cross-node group
