"""Plans built the slow, obvious way, for tests that check a faster path against them (not a test
module: pytest collects test_*.py only)."""

from __future__ import annotations

from trainledger.load.catalog import load_network
from trainledger.spec.plan import Plan


def plan_from_scratch(plan: Plan, recipe=None, layout=None, gpus=None) -> Plan:
    """``suggest._with`` as it was: pydantic copies of the parts, the whole plan validated by ``Plan(...)``."""
    rec = plan.recipe.model_copy(update=recipe) if recipe else plan.recipe
    lay_upd = dict(layout or {})
    cluster = plan.cluster
    if gpus is not None:
        per_node = min(gpus, cluster.gpus_per_node)
        cluster = cluster.model_copy(update={"gpus_per_node": per_node, "nodes": gpus // per_node})
        lay_upd["dp"] = None
    lay = plan.layout.model_copy(update=lay_upd) if lay_upd else plan.layout
    return Plan(model=plan.model, recipe=rec, layout=lay, cluster=cluster, runtime=plan.runtime,
                serving=plan.serving, headroom=plan.headroom)


def at_dp(plan: Plan, dp: int) -> Plan | None:
    """``plan`` with ``dp`` data-parallel ranks at its global batch (a scaling-curve point), built by
    pydantic copies; None when the batch, the experts or the nodes do not divide."""
    lay, r, cl = plan.layout, plan.recipe, plan.cluster
    gb = plan.global_batch
    if dp < 1 or gb % (dp * r.micro_batch) or (dp * lay.cp) % lay.ep:
        return None
    world = dp * lay.tp * lay.pp * lay.cp
    per_node = min(cl.gpus_per_node, world)
    if world % per_node:
        return None
    nodes = world // per_node
    return plan.model_copy(update={
        "cluster": cl.model_copy(update={"gpus_per_node": per_node, "nodes": nodes,
                                          "inter": cl.inter or (load_network("ib-ndr") if nodes > 1 else None)}),
        "layout": lay.model_copy(update={"dp": dp}),
        "recipe": r.model_copy(update={"grad_accum": gb // (dp * r.micro_batch), "global_batch": gb})})
