"""Predicted scaling efficiency of a plan over GPU counts (strong scaling, same global batch)."""

from __future__ import annotations

from trainledger.errors import TrainledgerError
from trainledger.load.catalog import load_network
from trainledger.spec.plan import Plan
from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time.step import ComputeEstimate, point_figures
from trainledger.estimate.time.compute import FlopCount
from trainledger.estimate.time.work import StageWork


def scaling_curve(plan: Plan, opts: TimeOptions | None = None,
                  factors: tuple[float, ...] = (0.25, 0.5, 1, 2, 4, 8),
                  own: ComputeEstimate | None = None) -> list[dict[str, float]]:
    """Predicted strong scaling: the same global batch over dp·factor replicas.

    Scaling efficiency = tokens/s per GPU relative to the smallest GPU count shown (1.0 = linear).
    Points whose data-parallel degree does not divide the global batch are skipped.
    ``own``: ``estimate_compute(plan, opts)`` when the caller has it; the point that rebuilds the
    plan itself (same dp, nodes, network and accumulation) reads it instead of estimating again.
    """
    opts = opts or TimeOptions()
    lay, r, cl = plan.layout, plan.recipe, plan.cluster
    gb = plan.global_batch
    mp = lay.tp * lay.pp * lay.cp
    rows: list[dict[str, float]] = []
    # one micro-batch's compute on the busiest stage is the same at every point: only dp, the
    # accumulation and the nodes change (``step.estimate_compute``'s ``shared_work``)
    shared: list[StageWork] = []
    # and so are the step's FLOPs (the same global batch of the same model): the plan's own when given
    flops: list[FlopCount] = [own.flops] if own is not None else []
    for f in factors:
        dp = int(round(lay.dp_size * f))
        if dp < 1 or gb % (dp * r.micro_batch) or (dp * lay.cp) % lay.ep:
            continue
        world = dp * mp
        per_node = min(cl.gpus_per_node, world)
        if world % per_node:
            continue
        nodes = world // per_node
        inter = cl.inter or (load_network("ib-ndr") if nodes > 1 else None)
        if (own is not None and dp == lay.dp and per_node == cl.gpus_per_node and nodes == cl.nodes
                and inter is cl.inter and gb // (dp * r.micro_batch) == r.grad_accum):
            # the plan's own point: the copy below would differ from ``plan`` only in naming its
            # global batch explicitly (``plan.global_batch`` already returns that value)
            rows.append(_row(world, dp, own))
            continue
        try:
            p = plan.updated({  # ``model_copy(update=...)`` without pydantic's copy machinery
                "cluster": cl.updated({"gpus_per_node": per_node, "nodes": nodes, "inter": inter}),
                "layout": lay.updated({"dp": dp}),
                "recipe": r.updated({"grad_accum": gb // (dp * r.micro_batch), "global_batch": gb}),
            })
            figures = point_figures(p, opts, shared, flops)  # estimate_compute's figures, without its notes
        except TrainledgerError:
            continue
        rows.append({"gpus": world, "dp": dp, **figures})
    if rows:
        base = rows[0]["tokens_per_s_per_gpu"]
        for row in rows:
            row["scaling_efficiency"] = row["tokens_per_s_per_gpu"] / base
    return rows


def _row(world: int, dp: int, c: ComputeEstimate) -> dict[str, float]:
    return {"gpus": world, "dp": dp, "step_time_s": c.step_time_s, "tokens_per_s": c.tokens_per_s,
            "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "mfu": c.mfu}
