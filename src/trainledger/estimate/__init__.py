"""estimate(plan) -> Estimate: the whole ledger of one Plan, section by section.

Sections: memory (issue 3), compute/time/comm (issue 4), energy, cost, io, host, checkpoint
(issue 5). Each section is an object with ``to_dict()``; reports, JSON, the web app and
``compare`` all read the same Estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..plan import Plan
from ..precision import policy_text
from .options import EstimateOptions
from .terms import Term

__all__ = ["Estimate", "EstimateOptions", "Term", "estimate", "plan_summary"]


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The plan's inputs, flat, for JSON output and reports."""
    r, lay, c = plan.recipe, plan.layout, plan.cluster
    return {
        "model": plan.model.name,
        "model_source": plan.model.source,
        "params": plan.model.params.total,
        "method": r.method, "precision": r.precision, "precision_policy": policy_text(plan),
        "optimizer": r.optimizer,
        "seq_len": r.seq_len, "micro_batch": r.micro_batch, "grad_accum": r.grad_accum,
        "global_batch": plan.global_batch, "recompute": r.recompute, "attention": r.attention,
        "lora_rank": r.lora_rank if r.method in ("lora", "qlora") else None,
        "tokens": r.train_tokens,
        "gpu": c.gpu.name, "gpus": c.world_size, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
        "intra": c.intra.name, "inter": c.inter.name if c.inter else None,
        "dp": lay.dp_size, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp,
        "vp": lay.vp, "zero": lay.zero, "offload": lay.offload,
        "framework": plan.runtime.framework, "runtime": plan.runtime.summary(),
    }


@dataclass(frozen=True)
class Estimate:
    """The ledger of one plan. Sections not computed for this plan are None."""

    plan: Plan
    options: EstimateOptions
    memory: Any
    compute: Any = None
    time: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"plan": plan_summary(self.plan), "memory": self.memory.to_dict()}
        if self.compute is not None:
            d["compute"] = self.compute.to_dict()
        if self.time is not None:
            d["time"] = self.time.to_dict()
        for k, v in self.extra.items():
            d[k] = v.to_dict() if hasattr(v, "to_dict") else v
        return d


def estimate(plan: Plan, options: EstimateOptions | None = None) -> Estimate:
    """Estimate every section of the ledger for ``plan``."""
    from .memory import estimate_memory

    options = options or EstimateOptions()
    mem = estimate_memory(plan, options.memory)
    from .time import estimate_compute, estimate_time, scaling_curve

    comp = estimate_compute(plan, options.time)
    curve = scaling_curve(plan, options.time) if options.time.scaling else None
    tm = estimate_time(plan, comp, curve)
    from .sections import ledger_sections  # energy, cost, io, checkpoint, host, interconnect

    extra = dict(ledger_sections(plan, options.cost, mem, comp, tm))
    return Estimate(plan=plan, options=options, memory=mem, compute=comp, time=tm, extra=extra)
