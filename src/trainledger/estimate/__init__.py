"""estimate(plan) -> Estimate: the whole ledger of one Plan, section by section.

Sections: memory (issue 3), compute/time/comm (issue 4), energy, cost, io, host, checkpoint
(issue 5). Each section is an object with ``to_dict()``; reports, JSON, the web app and
``compare`` all read the same Estimate.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainledger.spec.plan import Plan
from trainledger.spec.precision import policy_text
from trainledger.spec.runtime import stack_layout_note
from trainledger.estimate.options import EstimateOptions
from trainledger.estimate.stage import Stage
from trainledger.estimate.terms import Term

if TYPE_CHECKING:
    from trainledger.estimate.memory import MemoryEstimate
    from trainledger.estimate.time import ComputeEstimate, TimeEstimate

__all__ = ["Estimate", "EstimateOptions", "Term", "estimate", "estimate_job", "plan_summary"]


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The plan's inputs, flat, for JSON output and reports."""
    r, lay, c = plan.recipe, plan.layout, plan.cluster
    return {
        "model": plan.model.name,
        "model_source": plan.model.source,
        "params": plan.model.params.total,
        "method": r.method, "precision": r.precision, "precision_policy": policy_text(r, plan.model, plan.cluster.gpu),
        "optimizer": r.optimizer,
        "seq_len": r.seq_len, "doc_len": r.doc_len, "micro_batch": r.micro_batch, "grad_accum": r.grad_accum,
        "global_batch": plan.global_batch, "recompute": r.recompute, "attention": r.attention,
        "lora_rank": r.lora_rank if r.method in ("lora", "qlora") else None,
        "tokens": r.train_tokens,
        "gpu": c.gpu.name, "gpus": c.world_size, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes,
        "intra": c.intra.name, "inter": c.inter.name if c.inter else None,
        "dp": lay.dp_size, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp,
        "vp": lay.vp, "zero": lay.zero, "offload": lay.offload,
        "framework": plan.runtime.framework, "runtime": plan.runtime.summary(plan.layout.pp),
        # a layout the stack's drivers do not run (priced all the same): spec.runtime's table
        "stack_note": stack_layout_note(plan.runtime.framework, lay) if r.is_training else None,
        "generate_len": r.generate_len,
        "serving": plan.serving.model_dump(mode="json") if r.method == "inference" else None,
    }


@dataclass(frozen=True)
class Estimate:
    """The ledger of one plan. Sections not computed for this plan are None."""

    plan: Plan
    options: EstimateOptions
    memory: MemoryEstimate
    compute: ComputeEstimate | None = None
    time: TimeEstimate | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # run sections by name: energy, cost, io, ...
    stage: Stage | None = None  # the derived per-plan view every section read

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"plan": plan_summary(self.plan), "memory": self.memory.to_dict()}
        if self.compute is not None:
            d["compute"] = self.compute.to_dict()
        if self.time is not None:
            d["time"] = self.time.to_dict()
        for k, v in self.extra.items():
            d[k] = v.to_dict() if hasattr(v, "to_dict") else v
        return d

    def __repr__(self) -> str:  # notebook views: trainledger.format
        from trainledger.format import estimate_repr

        return estimate_repr(self)

    def _repr_html_(self) -> str:
        from trainledger.format import estimate_html

        return estimate_html(self)

    def to_pandas(self) -> Any:
        """Memory terms as a DataFrame (needs pandas); the summary is in ``df.attrs``."""
        from trainledger.format import estimate_frame

        return estimate_frame(self)


def estimate(plan: Plan, options: EstimateOptions | None = None) -> Estimate:
    """Estimate every section of the ledger for ``plan``."""
    from trainledger.estimate.memory import estimate_memory

    options = options or EstimateOptions()
    mem = estimate_memory(plan, options.memory)
    from trainledger.estimate.time import estimate_compute, estimate_time, scaling_curve

    comp = estimate_compute(plan, options.time)
    curve = scaling_curve(plan, options.time, own=comp) if options.time.scaling else None
    tm = estimate_time(plan, comp, curve)
    from trainledger.estimate.run.sections import ledger_sections  # energy, cost, io, checkpoint, host, interconnect

    extra = dict(ledger_sections(plan, options.cost, mem, comp, tm))
    if not plan.recipe.is_training:  # latency, throughput, concurrency, cost per token (issue 16)
        from trainledger.estimate.serving import serving_section

        extra["serving"] = serving_section(plan, None, options.cost)
    return Estimate(plan=plan, options=options, memory=mem, compute=comp, time=tm, extra=extra,
                    stage=Stage.of(plan))


def estimate_job(plan: Any = None, options: EstimateOptions | None = None, **fields: Any) -> Estimate:
    """``trainledger.estimate(...)``: a Plan, a PlanInputs, or PlanInputs fields as keywords.

    >>> est = trainledger.estimate(model="llama-3.1-8b", gpus=8, zero=3)   # doctest: +SKIP
    """
    from trainledger.load.plan import PlanInputs, build_plan, parse_inputs

    if plan is None:
        plan = parse_inputs(fields, "estimate")
    elif fields:
        raise TypeError("pass a Plan/PlanInputs or keyword fields, not both")
    if isinstance(plan, PlanInputs):
        plan = build_plan(plan)
    if not isinstance(plan, Plan):
        raise TypeError(f"estimate() takes a Plan or PlanInputs, not {type(plan).__name__}")
    return estimate(plan, options)


class _CallableModule(types.ModuleType):
    """Lets ``trainledger.estimate`` be both this package and the function (``estimate_job``)."""

    def __call__(self, plan: Any = None, options: EstimateOptions | None = None, **fields: Any) -> Estimate:
        return estimate_job(plan, options, **fields)


sys.modules[__name__].__class__ = _CallableModule
