"""MoE token dispatch: how many copies of a token cross NVLink and the network (issue 15).

Expert parallelism moves each routed token to the ranks holding its experts (dispatch) and the
expert outputs back (combine). What a rank sends depends on the dispatcher:

* ``alltoall`` — one copy per routed expert. Megatron-Core's ``MoEAlltoAllTokenDispatcher``
  permutes the tokens into one row per (token, expert) pair before its all-to-all, and
  torchtitan's standard ``ExpertParallel`` all-to-alls the top-k-replicated tokens: a token with
  two experts on one rank travels there twice. Of its k copies, (g-1)/n go to the other ranks of
  the node and (n-g)/n across the network (n EP ranks, g of them per node).
* ``allgather`` — Megatron-Core's ``MoEAllGatherTokenDispatcher`` (its ``--moe-token-dispatcher-type``
  default): every rank all-gathers all tokens of the TP×EP group, keeps the ones its experts take,
  and reduce-scatters the outputs back: n-1 copies of each token whatever the routing, the routing
  imbalance playing no part in the collective. Megatron recommends alltoall with expert
  parallelism; allgather moves more once the group exceeds top-k.
* ``deepep`` — DeepEP's normal (high-throughput) kernels (github:deepseek-ai/DeepEP, docs/
  legacy.md; DeepSeek-V3 report, arXiv:2412.19437 §3.2.2): a token goes once to every *rank* that
  holds one of its experts, and across the network once per *node*: RDMA to the rank of the same
  local index on the target node, which forwards it over NVLink to the target ranks there. Per
  token that is R = nodes hit less the own node over the network and D·(1-1/g) over NVLink (D
  ranks hit; by symmetry 1/g of them are the forwarder or the sender itself, which need no NVLink
  copy). Combine returns the same copies, reduced where they were forwarded.
* ``hybridep`` — NVIDIA's Hybrid-EP (DeepEP's hybrid-ep branch, docs/README_Hybrid-EP.md): the same
  hierarchy, RDMA between NVLink domains and TMA copies over NVLink inside one, with the domain the
  unit (``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``: a whole NVL72 rack, or an 8-GPU node): priced
  with DeepEP's copies, the node standing for the NVLink domain.

D and R are expectations under uniform routing (the same assumption as
``work.routing_imbalance``), with DeepSeek's group-limited routing (``MoESpec.num_groups``,
``topk_groups``: a token's k experts lie in ``topk_groups`` of the ``num_groups`` expert groups):
when a group holds whole ranks or nodes, or they whole groups, the count of a token's groups
touching a unit is hypergeometric and its k experts are drawn from the chosen groups only. The
DeepSeek-V3 configuration (256 experts, 8 groups, 4 per token, top-8) on 8-GPU nodes sends each
token over the network to about 3.2 other nodes instead of 7: the traffic limit the report's §3.2.2
designs for ("each token will be dispatched to at most 4 nodes").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb

from trainledger.spec.cluster import Cluster
from trainledger.spec.model import MoESpec
from trainledger.spec.plan import Plan
from trainledger.spec.runtime import DEEPEP_CONFIGS, DEEPEP_STACKS, HIERARCHICAL_DISPATCHERS
from trainledger.estimate.time.comm import Group, all_gather_s, all_to_all_s, nic_bytes_per_s, topology
from trainledger.estimate.time.efficiency import LinkEfficiency, link_efficiency


@dataclass(frozen=True, slots=True)
class Copies:
    """Copies of one token a rank sends per dispatch (or combine): over NVLink, over the network."""

    nvlink: float
    network: float

    @property
    def total(self) -> float:
        return self.nvlink + self.network


@lru_cache(maxsize=512)
def units_hit(experts: int, units: int, k: int, groups: int = 1, topk_groups: int = 1) -> float:
    """Expected number of ``units`` (equal contiguous blocks of the ``experts``: ranks or nodes)
    holding at least one of a token's ``k`` experts, drawn uniformly without replacement from the
    ``topk_groups`` of ``groups`` equal expert groups the token is routed to (all of them without
    group-limited routing, or when groups and units do not nest)."""
    u = experts // units                 # experts per unit
    s = experts // groups                # experts per group
    if groups <= 1 or topk_groups >= groups or (s % u and u % s) or k > topk_groups * s:
        return units * (1.0 - comb(experts - u, k) / comb(experts, k))
    m = max(1, u // s)                   # groups touching one unit
    touch = min(s, u)                    # experts a chosen touching group puts in the unit
    pool = topk_groups * s               # the token's candidate experts
    total = comb(groups, topk_groups)
    miss = 0.0
    for j in range(0, min(m, topk_groups) + 1):  # j of the unit's groups chosen: hypergeometric
        w = comb(m, j) * comb(groups - m, topk_groups - j) / total
        miss += w * comb(pool - j * touch, k) / comb(pool, k)
    return units * (1.0 - miss)


def token_copies(moe: MoESpec, n: int, per_node: int, dispatcher: str) -> Copies:
    """Copies of one token that one of ``n`` EP ranks (``per_node`` of them on each node) sends
    per dispatch under ``dispatcher`` (see the module docstring)."""
    if n <= 1:
        return Copies(0.0, 0.0)
    k, g = moe.top_k, per_node
    nodes = max(1, n // g)
    if dispatcher == "allgather":
        return Copies(float(g - 1), float(n - g))
    if dispatcher not in HIERARCHICAL_DISPATCHERS:
        return Copies(k * (g - 1) / n, k * (n - g) / n)
    E, G, tg = moe.num_experts, moe.num_groups, moe.topk_groups
    if E % n or E < n:           # experts do not split evenly over the ranks: ungrouped, per rank
        ranks = n * (1.0 - (1.0 - 1.0 / n) ** k)
        node_hits = nodes * (1.0 - (1.0 - 1.0 / nodes) ** k)
    else:
        ranks = units_hit(E, n, k, G, tg)
        node_hits = units_hit(E, nodes, k, G, tg)
    return Copies(ranks * (1.0 - 1.0 / g), node_hits * (1.0 - 1.0 / nodes))


def dispatch_s(grp: Group, moe: MoESpec, dispatcher: str, token_bytes: float, cluster: Cluster,
               links: LinkEfficiency | None = None, imbalance: float = 1.0) -> float:
    """Seconds of one dispatch (or combine) of ``token_bytes`` (tokens on the rank × bytes per
    token) over the EP group ``grp``, the busiest rank's share (``imbalance``, which the
    all-gather's fixed volume does not see): the NVLink and network copies of
    :func:`token_copies` run at once, the slower sets the time, plus one latency per peer
    (the all-to-all's n-1; DeepEP's RDMA peers are the other nodes and its NVLink peers the other
    ranks of the node, addressed in parallel); the all-gather (reduce-scatter) as a ring."""
    n = grp.n
    if n <= 1 or token_bytes <= 0:
        return 0.0
    if dispatcher == "allgather":
        return all_gather_s(grp, n * token_bytes)
    token_bytes *= imbalance
    if dispatcher not in HIERARCHICAL_DISPATCHERS:   # one copy per routed expert: the plain all-to-all
        return all_to_all_s(grp, token_bytes * moe.top_k, cluster, links)
    links = links or link_efficiency()
    c = token_copies(moe, n, grp.per_node, dispatcher)
    local = c.nvlink * token_bytes / links.bytes_per_s(cluster.intra)
    remote = 0.0
    if grp.nodes > 1 and cluster.inter is not None:
        remote = c.network * token_bytes / nic_bytes_per_s(cluster, links)
    latency = grp.ring_latency(grp.nodes - 1 + grp.per_node - 1, grp.nodes - 1)
    return max(local, remote) / links.dispatcher_efficiency(dispatcher) + latency


def dispatch_note(plan: Plan, links: LinkEfficiency | None = None) -> str | None:
    """What each token's dispatch sends in ``plan`` (and, for an all-to-all across nodes on a stack
    that has DeepEP, what DeepEP would send instead), or None without expert parallelism."""
    m, lay, cl = plan.model, plan.layout, plan.cluster
    if m.moe is None or lay.ep <= 1:
        if plan.runtime.moe_dispatcher != "alltoall":
            return (f"--moe-dispatcher {plan.runtime.moe_dispatcher}: no effect without routed experts and "
                    "expert parallelism (--ep > 1)")
        return None
    topo = topology(cl, lay.tp, lay.cp, lay.ep, lay.dp_size, lay.pp, links or link_efficiency(), lay.expert_tp)
    grp, k = topo.ep, m.moe.top_k
    a2a = token_copies(m.moe, grp.n, grp.per_node, "alltoall")
    where = f"{a2a.nvlink:.1f} over {cl.intra.name}" + (
        f", {a2a.network:.1f} over {cl.inter.name}" if grp.nodes > 1 and cl.inter is not None else "")
    if plan.runtime.moe_dispatcher in HIERARCHICAL_DISPATCHERS:
        c = token_copies(m.moe, grp.n, grp.per_node, plan.runtime.moe_dispatcher)
        net = f", and goes to {c.network:.1f} other nodes once each over {cl.inter.name}" if (
            grp.nodes > 1 and cl.inter is not None) else ""
        groups = (f", {m.moe.topk_groups} of {m.moe.num_groups} expert groups per token"
                  if m.moe.num_groups > 1 and m.moe.topk_groups < m.moe.num_groups else "")
        name = "DeepEP" if plan.runtime.moe_dispatcher == "deepep" else "Hybrid-EP"
        extra = "" if plan.runtime.moe_dispatcher == "deepep" else (
            "; Hybrid-EP's own buffers are not in the memory estimate")
        return (f"MoE dispatch via {name}: each token makes {c.nvlink:.1f} copies over {cl.intra.name} (one per "
                f"target rank, forwarded inside the target nodes){net}, per dispatch and per combine (uniform "
                f"routing{groups}); an all-to-all sends one copy per routed expert (top-{k}: {where}){extra}")
    if plan.runtime.moe_dispatcher == "allgather":
        return (f"MoE dispatch by all-gather (Megatron's allgather dispatcher): every rank receives all "
                f"{grp.n} ranks' tokens and reduce-scatters the outputs, {grp.n - 1} copies of each token, where "
                f"an all-to-all sends one per routed expert (top-{k}: {where}; --moe-dispatcher alltoall, "
                "Megatron's recommendation with expert parallelism)")
    if grp.nodes > 1 and plan.runtime.framework in DEEPEP_STACKS and grp.n in DEEPEP_CONFIGS:
        c = token_copies(m.moe, grp.n, grp.per_node, "deepep")
        return (f"MoE all-to-all: one copy of each token per routed expert (top-{k}: {where}); DeepEP "
                f"(--moe-dispatcher deepep, {plan.runtime.framework}) sends one per destination node instead: "
                f"{c.network:.1f} over {cl.inter.name}")
    return None
