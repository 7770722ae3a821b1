"""Checkpoints: size of a full training checkpoint and of a weights-only export, write time,
storage for K checkpoints, and the share of training time spent writing them.

Glossary:
    N     trainable parameters (all of them, or the LoRA adapters)
    w, m, o  bytes per parameter of weights, master copy, optimizer states (precision policy)
    t, p  tensor- and pipeline-parallel degrees    d  ZeRO shard group (dp · cp)
    N_e   routed-expert parameters (MoE)           e, t_e, d_e  expert-parallel, expert-TP and
          expert-data-parallel degrees (Layout.ep, expert_tp, expert_dp)
    B_w   storage write bandwidth per node         n_w  nodes that write
    δ     write time of one checkpoint             M    mean time between failures of the job

    full      = N · (w + m + o)           (one replica; DP replicas hold copies, not parts)
    per shard = N·w / (t·p·[d if ZeRO-3]) + N·(m + o) / (t·p·[d if ZeRO ≥ 1])
                (MoE with e > 1: the routed experts' N_e apart, split by t_e·e·p and sharded over
                d_e instead of d, as each rank holds E/e experts: Megatron-Core MoE parallel
                folding, arXiv:2504.14960 §3; DeepSpeed-MoE expert parallelism)
    δ         = full / (n_w · B_w)        (training paused while writing: synchronous save)
    share     = δ / (interval + δ)
    Young's optimal interval ≈ sqrt(2 · δ · M)  (Young 1974, CACM 17(9), "A first order
    approximation to the optimum checkpoint interval restart dumps")

Check: BLOOM-176B, bf16 weights + fp32 master + fp32 Adam states = 14 bytes/param
→ 2.47e12 bytes; the BigScience README reports 2.3 TB for the checkpoint with optimizer states
(github:bigscience-workshop/bigscience train/tr11-176B-ml).
"""

from __future__ import annotations

import math
from typing import Any

from trainledger.spec.plan import Plan
from trainledger.units import GB
from trainledger.estimate.run.common import Section, run_figures, state_bytes_per_param, trainable_params
from trainledger.estimate.options import CostOptions
from trainledger.estimate.run.prices import PriceCatalog, load_prices
from trainledger.estimate.terms import Term

#: Llama 3 pre-training: 419 unexpected interruptions in a 54-day snapshot on up to 16,384 H100s
#: (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, §3.3.4, Table 5).
LLAMA3_INTERRUPTIONS = 419
LLAMA3_SNAPSHOT_HOURS = 54 * 24
LLAMA3_GPUS = 16_384
FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_SNAPSHOT_HOURS * LLAMA3_GPUS)


def checkpoint_bytes(n_params: float, weight_bytes: float, master_bytes: float, optimizer_bytes: float) -> float:
    """Full training checkpoint (one replica): N · (w + m + o) bytes."""
    return n_params * (weight_bytes + master_bytes + optimizer_bytes)


def shard_bytes(n_params: float, weight_bytes: float, state_bytes: float, *, tp: int = 1, pp: int = 1,
                zero: int = 0, zero_shards: int = 1) -> float:
    """Bytes one rank writes: weights split by t·p (and d under ZeRO-3), states by t·p (and d under ZeRO ≥ 1)."""
    mp = tp * pp
    w = n_params * weight_bytes / (mp * (zero_shards if zero >= 3 else 1))
    s = n_params * state_bytes / (mp * (zero_shards if zero >= 1 else 1))
    return w + s


def moe_shard_bytes(n_params: float, n_experts: float, weight_bytes: float, state_bytes: float, *,
                    tp: int = 1, pp: int = 1, zero: int = 0, zero_shards: int = 1, ep: int = 1,
                    etp: int | None = None, expert_dp: int = 1) -> float:
    """Bytes one rank writes when ``n_experts`` of the ``n_params`` are routed experts split over
    ``ep`` expert-parallel ranks (each with ``etp``-way expert TP) and sharded by ZeRO over the
    expert-data-parallel group: the dense rest as :func:`shard_bytes`, the experts by their layout."""
    dense = shard_bytes(n_params - n_experts, weight_bytes, state_bytes, tp=tp, pp=pp, zero=zero,
                        zero_shards=zero_shards)
    experts = shard_bytes(n_experts, weight_bytes, state_bytes, tp=(etp or tp) * ep, pp=pp, zero=zero,
                          zero_shards=expert_dp)
    return dense + experts


def writer_nodes(nodes: int, gpus_per_node: int, tp: int, pp: int, zero: int, ep_ranks: int = 1) -> int:
    """Nodes holding a part of the checkpoint: all of them under ZeRO ≥ 1, else those of replica 0
    (tp·pp ranks, or pp·max(tp, ``ep_ranks``) when the routed experts are split over ``ep_ranks`` =
    etp·ep ranks: one replica of the model then spans the expert-parallel group)."""
    if zero >= 1:
        return nodes
    return max(1, min(nodes, math.ceil(pp * max(tp, ep_ranks) / gpus_per_node)))


def plan_writer_nodes(plan: Plan) -> int:
    """:func:`writer_nodes` of ``plan``'s cluster and layout."""
    c, lay = plan.cluster, plan.layout
    return writer_nodes(c.nodes, c.gpus_per_node, lay.tp, lay.pp, lay.zero, expert_split(plan)[1])


def rank_share(plan: Plan, n_params: float, weight_bytes: float, state_bytes: float) -> float:
    """Bytes of ``n_params`` trainable parameters' weights and states one rank holds under
    ``plan``'s layout (:func:`moe_shard_bytes` with the plan's expert split)."""
    lay = plan.layout
    n_exp, _ = expert_split(plan)
    return moe_shard_bytes(n_params, n_exp, weight_bytes, state_bytes, tp=lay.tp, pp=lay.pp, zero=lay.zero,
                           zero_shards=lay.zero_shards, ep=lay.ep, etp=lay.expert_tp, expert_dp=lay.expert_dp)


def write_time_s(total_bytes: float, n_writer_nodes: int, write_bytes_per_s_per_node: float) -> float:
    """Seconds to write ``total_bytes`` spread evenly over ``n_writer_nodes`` at the per-node bandwidth."""
    return total_bytes / (n_writer_nodes * write_bytes_per_s_per_node)


def checkpoint_time_share(write_s: float, interval_s: float) -> float:
    """Share of wall-clock time spent writing synchronous checkpoints every ``interval_s`` of training."""
    return write_s / (interval_s + write_s)


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's first-order optimal checkpoint interval sqrt(2 δ M) (Young 1974, CACM 17(9))."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def _default(options_value: Any, prices: PriceCatalog, key: str, flag: str) -> tuple[float, str]:
    if options_value is not None:
        return options_value, f"user ({flag})"
    d = prices.default(key)
    return d.value, d.source


def expert_split(plan: Plan) -> tuple[float, int]:
    """(routed-expert parameters among the trainable ones, ranks they are split over: etp·ep);
    (0, 1) for dense models, ep = 1, and LoRA (its adapters are left with the dense split)."""
    lay, m = plan.layout, plan.model
    if m.moe is None or lay.ep <= 1 or plan.recipe.method not in ("full", "pretrain"):
        return 0.0, 1
    return float(m.params.breakdown.get("experts", 0)), lay.expert_tp * lay.ep


def full_checkpoint_bytes(plan: Plan) -> float:
    """N·(w + m + o) of ``plan``: its trainable parameters under its precision and optimizer."""
    b = state_bytes_per_param(plan)
    return checkpoint_bytes(trainable_params(plan), b["weights"], b["master"], b["optimizer"])


def _sizes(plan: Plan, prices: PriceCatalog) -> dict[str, Any]:
    """Trainable parameters, bytes per parameter, full/shard/export sizes of one checkpoint."""
    n_train = trainable_params(plan)
    b = state_bytes_per_param(plan)
    export_b, export_src = _default(None, prices, "export_dtype_bytes", "")
    return {"n_train": n_train, "b": b, "export_b": export_b, "export_src": export_src,
            "full": checkpoint_bytes(n_train, b["weights"], b["master"], b["optimizer"]),
            "shard": rank_share(plan, n_train, b["weights"], b["master"] + b["optimizer"]),
            "export": n_train * export_b, "merged": plan.model.params.total * export_b}


def _terms(z: dict[str, Any], wr_s: float, interval: float, i_src: str, kept: float, k_src: str,
           mtbf_s: float) -> list[Term]:
    return [
        Term("full_bytes", z["full"], "bytes", "N·(w + m + o), precision policy and optimizer of the recipe",
             "one replica; RNG, scheduler and data-loader state are a few KiB and left out", dict(z["b"])),
        Term("write_s", wr_s, "s", "full / (writer nodes × storage write bandwidth per node)",
             "synchronous save; all writer nodes stream at their full storage bandwidth"),
        Term("weights_export_bytes", z["export"], "bytes", z["export_src"], "weights only, for release or inference"),
        Term("interval_s", interval, "s", i_src), Term("checkpoints_kept", kept, "count", k_src),
        Term("mtbf_s", mtbf_s, "s", "Dubey et al. 2024 (Llama 3), §3.3.4: 419 unexpected interruptions "
             "in 54 days on 16,384 GPUs, scaled to this job's GPU count"),
    ]


def checkpoint_section(plan: Plan, options: CostOptions, memory: Any = None, compute: Any = None,
                       time: Any = None, prices: PriceCatalog | None = None) -> Section:
    """The ``checkpoint`` section: full and per-shard size, export size, write time, storage, share."""
    prices = prices or load_prices(options.prices_file)
    lay, c = plan.layout, plan.cluster
    z = _sizes(plan, prices)
    full, lora = z["full"], plan.recipe.method in ("lora", "qlora")
    write_gb = options.storage_write_gb_per_s or c.storage.write_gb_per_s
    n_w = plan_writer_nodes(plan)
    wr_s = write_time_s(full, n_w, write_gb * GB) if full else 0.0
    interval, i_src = _default(options.checkpoint_interval_s, prices, "checkpoint_interval_s", "--checkpoint-interval")
    kept, k_src = _default(options.checkpoints_kept, prices, "checkpoints_kept", "--checkpoints-kept")
    mtbf_s = 3600.0 / (FAILURES_PER_GPU_HOUR * c.world_size)
    run = run_figures(plan, compute, time)
    v: dict[str, Any] = {
        "full_bytes": full, "shard_bytes": z["shard"], "shards": _shards(plan), "bytes_per_writer_node": full / n_w,
        "weights_export_bytes": z["export"], "merged_export_bytes": z["merged"] if lora else None, "write_s": wr_s,
        "storage_bytes": int(kept) * full + z["export"], "checkpoints_kept": int(kept),
        "interval_s": interval, "time_share": checkpoint_time_share(wr_s, interval) if full else 0.0,
        "checkpoints_per_run": None, "run_write_s": None,
        "young_interval_s": young_interval_s(wr_s, mtbf_s) if wr_s else None, "mtbf_s": mtbf_s,
    }
    if run.run_s:
        v["checkpoints_per_run"] = math.floor(run.run_s / interval)
        v["run_write_s"] = v["checkpoints_per_run"] * wr_s
    inputs = {"trainable_params": z["n_train"], "bytes_per_param": z["b"], "tp": lay.tp, "pp": lay.pp,
              "zero": lay.zero, "zero_shards": lay.zero_shards, "writer_nodes": n_w,
              "storage_write_gb_per_s_per_node": write_gb, "export_dtype_bytes": z["export_b"], "run_s": run.run_s}
    notes = []
    if lora:
        notes.append("LoRA: the checkpoint holds the adapters and their optimizer states; the frozen base "
                     "weights are not rewritten (merged_export_bytes is the size after merging)")
    if plan.recipe.method == "inference":
        notes.append("inference: nothing is trained, no training checkpoint")
    return Section(values=v, inputs=inputs, terms=_terms(z, wr_s, interval, i_src, kept, k_src, mtbf_s), notes=notes)


def _shards(plan: Plan) -> int:
    """Distinct parts the checkpoint is saved in: under ZeRO ≥ 1 one per rank (tp·pp·dp·cp), else
    one per rank of replica 0 (tp·pp, or pp·max(tp, etp·ep) when the experts are split)."""
    lay = plan.layout
    if lay.zero >= 1:
        return lay.tp * lay.pp * lay.zero_shards
    return lay.pp * max(lay.tp, expert_split(plan)[1])
