"""Interconnect sanity: bytes each GPU sends per step for the layout's collectives, the bandwidth
that would hide them within one step, and the bandwidth the links offer.

A first-order check beside the time model's comm model (``estimate/time/comm.py``), whose exposed and
hidden communication seconds are shown next to it when present.

Glossary (per GPU, per optimizer step):
    P     parameters held per model-parallel rank (N / (t·p))    d   data-parallel group (dp·cp)
    m     micro-batches per step (gradient accumulation)         t   TP degree   b, s, h  batch, seq, hidden
    L_s   layers per pipeline stage                              β   bytes per element on the wire

    DP, ZeRO 0-2  ring all-reduce of gradients: 2(d−1)/d · P · β_grad
    DP, ZeRO-3    all-gather fwd + bwd per micro-batch, reduce-scatter once: (2m + 1)(d−1)/d · P · β
    TP            4 all-reduces per layer per micro-batch (2 fwd, 2 bwd) of b·s·h: 4·L_s·m · 2(t−1)/t · b·s·h·β
    PP            one activation send and one gradient send per micro-batch: 2·m · b·s·h·β

Ring all-reduce moves 2(d−1)/d of the buffer per rank (Patarasuk & Yuan 2009, J. Parallel Distrib.
Comput. 69(2)); TP volumes follow Shoeybi et al. 2019 (arXiv:1909.08053, §3: two all-reduces in
forward and two in backward per layer) and Korthikanti et al. 2022 (arXiv:2205.05198, §4.2.2:
sequence parallelism keeps the same volume as reduce-scatter + all-gather); ZeRO-3 volume 1.5×
DDP's (Rajbhandari et al. 2020, arXiv:1910.02054, §7.2.2) for m = 1.
"""

from __future__ import annotations

from typing import Any

from trainledger.spec.plan import Plan
from trainledger.units import DTYPE_BYTES
from trainledger.estimate.time.comm import ranks_per_node
from trainledger.estimate.time.dispatch import token_copies
from trainledger.estimate.run.common import Section, run_figures, trainable_params
from trainledger.estimate.stage import Stage
from trainledger.estimate.options import CostOptions
from trainledger.estimate.terms import Term


def ring_all_reduce_bytes(buffer_bytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``buffer_bytes`` over ``n`` ranks."""
    return 2.0 * (n - 1) / n * buffer_bytes if n > 1 else 0.0


def zero3_bytes(param_bytes: float, n: int, micro_batches: int) -> float:
    """ZeRO-3/FSDP: all-gather in forward and backward of every micro-batch, one reduce-scatter."""
    return (2 * micro_batches + 1) * (n - 1) / n * param_bytes if n > 1 else 0.0


def tp_bytes(layers: int, micro_batches: int, b: int, s: int, h: int, t: int, elem_bytes: float) -> float:
    """Megatron TP: 4 all-reduces of b·s·h per layer per micro-batch."""
    return 4 * layers * micro_batches * ring_all_reduce_bytes(b * s * h * elem_bytes, t)


def pp_bytes(micro_batches: int, b: int, s: int, h: int, elem_bytes: float) -> float:
    """Pipeline: one activation and one gradient of b·s·h per micro-batch per stage boundary."""
    return 2 * micro_batches * b * s * h * elem_bytes


_SOURCES = {
    "dp": "ring all-reduce 2(d-1)/d (Patarasuk & Yuan 2009); ZeRO-3 (2m+1)(d-1)/d (Rajbhandari et al. 2020, §7.2.2)",
    "tp": "4 all-reduces of b·s·h per layer per micro-batch (Shoeybi et al. 2019, §3)",
    "pp": "one activation + one gradient of b·s·h per micro-batch (Narayanan et al. 2021, §2.2)",
    "edp": "expert gradients over the expert-data-parallel group EDP = tp·cp·dp/(etp·ep), ring 2(d-1)/d "
           "(Megatron-Core MoE parallel folding, arXiv:2504.14960 §3)",
    "ep": "token dispatch + combine all-to-all of b·s·k·h/tp per MoE layer, forward and backward "
          "(Lepikhin et al. 2020, GShard §2.2)",
}


def _link(plan: Plan, n: int, stride: int) -> tuple[str, float]:
    """Per-rank bandwidth of a ring over ``n`` ranks spaced ``stride`` apart (rank order).

    Inside one node: the GPU link. Across nodes, only the ring's node-boundary hops use the NICs,
    one ring (NCCL channel) per NIC, so the ``k`` ranks a node holds share k NIC-shares:
    β = min(intra, k · NIC bandwidth per GPU) (NCCL ring algorithm; the same rule as
    ``estimate/time/comm.py: group``).
    """
    c = plan.cluster
    g = c.gpus_per_node
    per_node = ranks_per_node(g, n, stride)
    if n <= per_node or c.inter is None:
        return c.intra.name, c.intra.bytes_per_s
    nic_per_gpu = c.inter.bytes_per_s * c.nics_per_node / g
    return c.inter.name, min(c.intra.bytes_per_s, per_node * nic_per_gpu)


def _groups(plan: Plan) -> dict[str, tuple[float, int, int]]:
    """Bytes per GPU per step, group size and rank stride of each collective group.

    Rank order: TP fastest, then CP, then DP, PP outermost (Megatron-LM's default order).
    """
    m, lay, r = plan.model, plan.layout, plan.recipe
    act = DTYPE_BYTES.get(r.policy["compute"], 2)
    grad = DTYPE_BYTES[r.policy["grads"]]
    p_rank = trainable_params(plan) / (lay.tp * lay.pp)
    d, mb = lay.zero_shards, r.grad_accum
    dp = zero3_bytes(p_rank * act, d, mb) if lay.zero >= 3 else ring_all_reduce_bytes(p_rank * grad, d)
    st = Stage.of(plan)
    s_local, layers = r.seq_len // lay.cp, st.layers
    stage = lay.tp * lay.cp * lay.dp_size
    out = {
        "dp": (dp, d, lay.tp),
        "tp": (tp_bytes(layers, mb, r.micro_batch, s_local, m.hidden_size, lay.tp, act), lay.tp, 1),
        "pp": (pp_bytes(mb, r.micro_batch, s_local, m.hidden_size, act) if lay.pp > 1 else 0.0, 2, stage),
    }
    folded = lay.ep > 1 or lay.expert_tp != lay.tp
    if m.moe is not None and folded and r.method in ("pretrain", "full"):
        # experts: E/(ep·etp) per rank, their gradients synchronized over EDP only; the dense rest
        # over the data-parallel group as before
        x = m.params.breakdown.get("experts", 0)
        p_dense = (trainable_params(plan) - x) / (lay.tp * lay.pp)
        p_exp = x / (lay.pp * lay.ep * lay.expert_tp)
        e = lay.expert_dp
        out["dp"] = (zero3_bytes(p_dense * act, d, mb) if lay.zero >= 3 else ring_all_reduce_bytes(p_dense * grad, d),
                     d, lay.tp)
        out["edp"] = (zero3_bytes(p_exp * act, e, mb) if lay.zero >= 3 else ring_all_reduce_bytes(p_exp * grad, e),
                      e, lay.expert_tp * lay.ep)
        moe_layers = st.moe_layers
        a2a = 4 * moe_layers * mb * r.micro_batch * s_local * m.moe.top_k * m.hidden_size * act / lay.tp
        sent = a2a * (lay.ep - 1) / lay.ep
        dispatcher = plan.runtime.moe_dispatcher
        if dispatcher != "alltoall":  # DeepEP: per rank and node, not per expert; all-gather: to every rank
            copies = token_copies(m.moe, lay.ep, ranks_per_node(plan.cluster.gpus_per_node, lay.ep, lay.expert_tp), dispatcher)
            sent = a2a / m.moe.top_k * copies.total
        out["ep"] = (sent, lay.ep, lay.expert_tp)
    return out


def interconnect_section(plan: Plan, options: CostOptions | None = None, memory: Any = None,
                         compute: Any = None, time: Any = None, prices: Any = None) -> Section:
    """The ``interconnect`` section: per collective group, bytes/step, required and offered bandwidth."""
    run = run_figures(plan, compute, time)
    groups: dict[str, Any] = {}
    terms, notes = [], []
    for name, (nbytes, n, stride) in _groups(plan).items():
        if not nbytes:
            continue
        link, avail = _link(plan, n, stride)
        g: dict[str, Any] = {"bytes_per_step": nbytes, "link": link, "available_bytes_per_s": avail,
                             "time_at_link_s": nbytes / avail, "required_bytes_per_s": None, "utilization": None}
        if run.step_time_s:
            g["required_bytes_per_s"] = nbytes / run.step_time_s
            g["utilization"] = g["required_bytes_per_s"] / avail
            if g["utilization"] > 1:
                notes.append(f"{name}: {nbytes / 1e9:.2f} GB per GPU per step needs "
                             f"{g['required_bytes_per_s'] / 1e9:.1f} GB/s to fit in the step; {link} offers "
                             f"{avail / 1e9:.1f} GB/s per GPU: communication cannot be hidden")
        groups[name] = g
        terms.append(Term(f"{name}_bytes_per_step", nbytes, "bytes", _SOURCES[name]))
    bd = getattr(compute, "breakdown", None)
    v: dict[str, Any] = {"groups": groups, "ok": not notes}
    if isinstance(bd, dict):
        v["time_model_exposed_comm_s"] = {k: x for k, x in bd.items() if k.startswith("comm_")}
        v["time_model_hidden_comm_s"] = dict(getattr(compute, "hidden_comm", {}) or {})
    inputs = {"step_time_s": run.step_time_s, "gpus_per_node": plan.cluster.gpus_per_node,
              "nics_per_node": plan.cluster.nics_per_node, "zero": plan.layout.zero,
              "grad_accum": plan.recipe.grad_accum}
    return Section(values=v, inputs=inputs, terms=terms, notes=notes)
