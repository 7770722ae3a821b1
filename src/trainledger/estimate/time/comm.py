"""Collectives on the real topology: an alpha-beta (latency-bandwidth) model (issue 4).

A collective over a group of n GPUs moving S bytes costs t = steps·α + volume/β (Hockney 1994;
Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in MPICH",
IJHPCA 19(1), Table 1):

    ring all-reduce        2(n-1)/n · S/β + 2(n-1)·α     (tree: same bandwidth term, 2·log2(n)·α)
    all-gather / reduce-scatter   (n-1)/n · S/β + (n-1)·α   (S = the gathered / reduced size)
    all-to-all             (n-1)/n · S/β + (n-1)·α       (S = what one rank sends in total)
    point-to-point         S/β + α

β is the *bus bandwidth* the group sees (nccl-tests PERFORMANCE.md). Ranks are placed the
Megatron-Core way — TP innermost, then CP, then DP (with EP inside DP), PP outermost — so a group is
described by its size and its stride in rank order. A group inside one node runs at the intra-node
link (NVLink, Infinity Fabric or PCIe). A group that spans nodes is limited by the NICs: with g of
its members on each node, NCCL's rings use the NICs of those g GPUs, β = min(intra, g · NIC per GPU),
where NIC per GPU = nics_per_node · NIC bandwidth / gpus_per_node (the other GPUs of the node run
their own groups at the same time). Link efficiencies come from catalog/efficiency/interconnect.yaml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainledger.spec.cluster import Cluster
from trainledger.estimate.memo import KeyedMemo
from trainledger.estimate.time.efficiency import LinkEfficiency, link_efficiency


@dataclass(frozen=True, slots=True)
class Group:
    """A communicator: n ranks, ``per_node`` of them on each node it spans, its β and α."""

    n: int
    per_node: int
    nodes: int
    beta: float
    alpha: float
    link: str
    alpha_intra: float | None = None   # latency of a ring step that stays inside a node

    def ring_latency(self, steps: int, inter_steps: int) -> float:
        """Latency of a ring of ``steps`` steps, ``inter_steps`` of them between nodes.

        NCCL's tuning model charges each ring step the latency of the link it crosses: intra-node
        steps the NVLink latency, the (nodes-1) steps between nodes the network latency
        (src/graph/tuning.cc, ncclTopoTuneModel: ring latency = (nsteps - nInterSteps)·intraLat +
        nInterSteps·interLat).
        """
        if self.alpha_intra is None or self.nodes <= 1:
            return steps * self.alpha
        inter = min(steps, inter_steps)
        return (steps - inter) * self.alpha_intra + inter * self.alpha

    @property
    def intra_node(self) -> bool:
        return self.nodes <= 1


#: the groups derived lately, by what ``_group`` reads: the node shape, the links (by identity;
#: each entry keeps them alive, so no other object can take their ids while it is stored), the
#: size and stride. One estimate asks for the same TP, CP and EP groups at every point of its
#: scaling curve (only the data-parallel group changes there). Groups are frozen.
_GROUPS = KeyedMemo(256)


def ranks_per_node(gpus_per_node: int, n: int, stride: int) -> int:
    """Members of a group of ``n`` ranks spaced ``stride`` apart in rank order on one node."""
    g = gpus_per_node
    return max(1, min(n, g // stride)) if stride < g else 1


def nic_bytes_per_s(cluster: Cluster, links: LinkEfficiency) -> float:
    """One GPU's share of its node's network bandwidth (the node's NICs over its GPUs)."""
    return links.bytes_per_s(cluster.inter) * cluster.nics_per_node / cluster.gpus_per_node


def group(cluster: Cluster, n: int, stride: int, links: LinkEfficiency | None = None) -> Group:
    """The communicator of ``n`` ranks spaced ``stride`` apart in rank order on ``cluster``."""
    links = links or link_efficiency()
    intra, inter = cluster.intra, cluster.inter
    key = (n, stride, cluster.gpus_per_node, cluster.nics_per_node, id(intra), id(inter), id(links))
    return _GROUPS.get(key, lambda: (intra, inter, links, _group(cluster, n, stride, links)))[3]


def _group(cluster: Cluster, n: int, stride: int, links: LinkEfficiency) -> Group:
    g = cluster.gpus_per_node
    intra_bw = links.bytes_per_s(cluster.intra)
    if n <= 1:
        return Group(1, 1, 1, intra_bw, 0.0, cluster.intra.name)
    per_node = ranks_per_node(g, n, stride)
    nodes = math.ceil(n / per_node)
    if nodes <= 1 or cluster.inter is None:
        return Group(n, n, 1, intra_bw, cluster.intra.latency_s, cluster.intra.name)
    nic_per_gpu = nic_bytes_per_s(cluster, links)
    beta = min(intra_bw, per_node * nic_per_gpu) if per_node > 1 else nic_per_gpu
    return Group(n, per_node, nodes, beta, cluster.inter.latency_s, cluster.inter.name,
                 alpha_intra=cluster.intra.latency_s if per_node > 1 else None)


def all_reduce_s(grp: Group, size: float) -> float:
    """Ring bandwidth term, with the latency of the faster of ring and tree (NCCL picks)."""
    n = grp.n
    if n <= 1 or size <= 0:
        return 0.0
    ring = grp.ring_latency(2 * (n - 1), 2 * (grp.nodes - 1))
    tree = (2 * math.ceil(math.log2(n)) + 2) * grp.alpha
    return 2.0 * (n - 1) / n * size / grp.beta + min(ring, tree)


def all_gather_s(grp: Group, size: float) -> float:
    """All-gather (or reduce-scatter) where ``size`` is the full, gathered tensor."""
    n = grp.n
    if n <= 1 or size <= 0:
        return 0.0
    return (n - 1) / n * size / grp.beta + grp.ring_latency(n - 1, grp.nodes - 1)


reduce_scatter_s = all_gather_s


def all_to_all_s(grp: Group, size: float, cluster: Cluster,
                 links: LinkEfficiency | None = None) -> float:
    """All-to-all where each rank sends ``size`` bytes in total, spread evenly over the group.

    The share bound for other nodes goes through this GPU's NIC share, the rest over the
    intra-node link; both run at once, so the slower one sets the time.
    """
    n = grp.n
    if n <= 1 or size <= 0:
        return 0.0
    links = links or link_efficiency()
    intra = links.bytes_per_s(cluster.intra)
    local = (grp.per_node - 1) / n * size / intra
    remote = 0.0
    if grp.nodes > 1 and cluster.inter is not None:
        nic = nic_bytes_per_s(cluster, links)
        remote = (n - grp.per_node) / n * size / nic
    return max(local, remote) + (n - 1) * grp.alpha


def p2p_s(cluster: Cluster, size: float, crosses_node: bool,
          links: LinkEfficiency | None = None) -> float:
    """Point-to-point send of ``size`` bytes to a neighbour (pipeline stages)."""
    if size <= 0:
        return 0.0
    links = links or link_efficiency()
    if crosses_node and cluster.inter is not None:
        nic = nic_bytes_per_s(cluster, links)
        return size / nic + cluster.inter.latency_s
    return size / links.bytes_per_s(cluster.intra) + cluster.intra.latency_s


@dataclass(frozen=True, slots=True)
class Topology:
    """The communicators of one layout: TP, CP, EP, DP (grad sync, incl. CP) and PP neighbours."""

    tp: Group
    cp: Group
    ep: Group
    dp: Group
    pp_crosses_node: bool


def topology(cluster: Cluster, tp: int, cp: int, ep: int, dp: int, pp: int,
             links: LinkEfficiency | None = None, etp: int | None = None) -> Topology:
    """Groups of a tp·cp·dp·pp layout, ranks ordered tp-cp-dp-pp (Megatron-Core default).

    Expert ranks are ordered etp-ep-edp over the same ranks (Megatron-Core MoE parallel folding,
    arXiv:2504.14960 §3): an EP group strides by the expert TP degree ``etp`` (tp when not given).
    """
    links = links or link_efficiency()
    return Topology(
        tp=group(cluster, tp, 1, links),
        cp=group(cluster, cp, tp, links),
        ep=group(cluster, ep, etp or tp, links),
        dp=group(cluster, dp * cp, tp, links),
        pp_crosses_node=pp > 1 and tp * cp * dp >= cluster.gpus_per_node,
    )
