"""When a plan does not fit: the cheapest changes that make it fit, each with its new peak.

Every suggestion is computed by re-running the memory model on a modified plan (its peak and device
bytes only: ``.phases.fit_bytes``, the same figures ``estimate_memory`` reports); the order is
the usual order of cost (speed or quality given up): fused optimizer, Liger Kernel (the same
arithmetic, where the stack runs transformers' modules), smaller micro-batch with more
accumulation, full recomputation, 16-bit weights, ZeRO stages, 8-bit optimizer states, optimizer
offload, LoRA, QLoRA, then more GPUs with ZeRO-3.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from trainledger.errors import TrainledgerError
from trainledger.spec.plan import Plan
from trainledger.spec.runtime import liger_ops, offload_needs_zero
from trainledger.units import gib
from trainledger.estimate.memory.phases import fit_or_misfit
from trainledger.estimate.options import MemoryOptions

MAX_SUGGESTIONS = 6

#: (peak allocated, device total, budget) bytes of a variant plan (``phases.fit_bytes``)
Fit = tuple[int, int, int]
#: a variant plan known not to fit before all its figures were derived (``phases.fit_or_misfit``)
MISFIT = None


class _Current(Protocol):  # the MemoryEstimate being improved: only its device total is read
    device_total_bytes: int


def _with(plan: Plan, recipe: dict[str, Any] | None = None, layout: dict[str, Any] | None = None,
          gpus: int | None = None) -> Plan:
    # ``Plan.variant``: the changed parts are copies of validated specs (as ``model_copy`` makes
    # them); only the plan's own checks run again (tests/unit/test_variant_incremental.py)
    rec = plan.recipe.updated(recipe) if recipe else plan.recipe
    lay_upd = dict(layout or {})
    cluster = plan.cluster
    if gpus is not None:
        per_node = min(gpus, cluster.gpus_per_node)
        cluster = cluster.updated({"gpus_per_node": per_node, "nodes": gpus // per_node})
        lay_upd["dp"] = None
    lay = plan.layout.updated(lay_upd) if lay_upd else plan.layout
    return plan.variant(recipe=rec, layout=lay, cluster=cluster)


def _candidates(plan: Plan) -> Iterator[tuple[str, str, Callable[[], Plan]]]:
    """(setting changed, label, builder) of every single change, cheapest first. A later change of
    the same setting replaces an earlier one in a combined suggestion."""
    r, lay = plan.recipe, plan.layout
    training = r.is_training
    if training and r.optimizer == "adamw":
        yield "optimizer", "fused AdamW (--optimizer adamw-fused): no step temporaries", lambda: _with(
            plan, {"optimizer": "adamw-fused"})
    m, rt = plan.model, plan.runtime
    if training and not rt.liger_kernel and liger_ops(True, rt.framework, m.model_type, m.norm_type, m.mlp_type,
                                                      m.position_embedding, lay.tp) is not None:
        # the same arithmetic with fewer saved tensors and no whole logits (pip install liger-kernel)
        yield "liger", "Liger Kernel (--liger-kernel): fused norms and GLU, no logits held", lambda: plan.variant(
            runtime=rt.updated({"liger_kernel": True}))
    b = r.micro_batch
    while b > 1:
        b //= 2
        nb = b
        yield "micro_batch", f"micro-batch {nb} with grad-accum {r.grad_accum * (r.micro_batch // nb)}", (
            lambda nb=nb: _with(plan, {"micro_batch": nb, "global_batch": None,
                                       "grad_accum": r.grad_accum * (r.micro_batch // nb)}))
    if training and r.recompute != "full":
        yield "recompute", "full recomputation (--recompute full)", lambda: _with(plan, {"recompute": "full"})
    if training and r.precision in ("fp32", "bf16-mixed", "fp16-mixed") and r.method != "qlora":
        yield "precision", "16-bit weights, no autocast copies (--precision bf16)", lambda: _with(plan, {"precision": "bf16"})
    if training and lay.dp_size > 1:
        for z in range(lay.zero + 1, 4):
            yield "zero", f"ZeRO-{z} over {lay.zero_shards} ranks (--zero {z})", (
                lambda z=z: _with(plan, layout={"zero": z}))
    if training and r.optimizer in ("adamw", "adamw-fused"):
        yield "optimizer", "8-bit AdamW states (--optimizer adamw-8bit)", lambda: _with(plan, {"optimizer": "adamw-8bit"})
    if training and lay.offload == "none":
        if offload_needs_zero(plan.runtime.framework, lay.zero):  # offload runs in a ZeRO optimizer
            yield "offload", "CPU offload of optimizer states (--zero 1 --offload optimizer)", lambda: _with(
                plan, layout={"offload": "optimizer", "zero": 1})
        else:
            yield "offload", "CPU offload of optimizer states (--offload optimizer)", lambda: _with(
                plan, layout={"offload": "optimizer"})
    if r.method in ("full", "pretrain"):
        yield "method", f"LoRA rank {r.lora_rank} (--method lora)", lambda: _with(plan, {"method": "lora"})
        yield "method", "QLoRA (--method qlora)", lambda: _with(plan, {"method": "qlora"})
    if training:
        for k in (2, 4, 8, 16):
            n = plan.cluster.world_size * k
            yield "gpus", f"{n} GPUs with ZeRO-3 (--gpus {n} --zero 3)", (
                lambda n=n: _with(plan, layout={"zero": 3}, gpus=n))


def _row(change: str, fit: Fit, current: _Current) -> dict[str, Any]:
    peak, total, _ = fit
    return {"change": change, "peak_allocated_bytes": peak, "device_total_bytes": total,
            "peak_allocated_gib": round(gib(peak), 2),
            "saves_gib": round(gib(current.device_total_bytes - total), 2), "fits": True}


def suggestions(plan: Plan, opts: MemoryOptions, current: _Current) -> list[dict[str, Any]]:
    """The cheapest single changes that make ``plan`` fit (see module docstring)."""
    out: list[dict[str, Any]] = []
    seen_micro = seen_gpus = False
    tried: list[tuple[Plan, Fit | None] | None] = []  # every candidate, in order, while none fits
    for knob, label, build in _candidates(plan):
        if (knob == "micro_batch" and seen_micro) or (knob == "gpus" and seen_gpus):
            continue
        try:
            new = build()
        except (TrainledgerError, ValueError):
            tried.append(None)
            continue
        fit = fit_or_misfit(new, opts)
        tried.append((new, fit))
        if fit is MISFIT or fit[1] > fit[2]:
            continue
        seen_micro = seen_micro or knob == "micro_batch"
        seen_gpus = seen_gpus or knob == "gpus"
        out.append(_row(label, fit, current))
        if len(out) >= MAX_SUGGESTIONS:
            break
    if not out:  # nothing fit, nothing skipped: ``tried`` holds every candidate of ``plan``
        combo = _combined(plan, opts, current, tried)
        if combo:
            out.append(combo)
    return out


def _combined(plan: Plan, opts: MemoryOptions, current: _Current,
              first: list[tuple[Plan, Fit | None] | None]) -> dict[str, Any] | None:
    """No single change fits: apply changes in cost order, each one that saves at least 10%,
    until the plan fits (at most 8 rounds). ``first``: the candidates of ``plan`` already built
    and measured by ``suggestions`` (the first round reuses them; one left as ``MISFIT`` gets its
    full figures here)."""
    labels: list[tuple[str, str]] = []  # (setting, label) of the changes applied
    best_total = current.device_total_bytes
    for round_ in range(8):
        step = None
        for i, (knob, label, build) in enumerate(_candidates(plan)):
            if round_ == 0:
                if first[i] is None:
                    continue
                new, known = first[i]
                fit = fit_or_misfit(new, opts, 0.9 * best_total) if known is MISFIT else known
            else:
                try:
                    new = build()
                except (TrainledgerError, ValueError):
                    continue
                # None: its device total is known to exceed 0.9 x the best, without its walk
                fit = fit_or_misfit(new, opts, 0.9 * best_total)
            if fit is not MISFIT and fit[1] <= 0.9 * best_total:
                step = ((knob, label), new, fit)
                break
        if step is None:
            return None
        # a later change of the same setting replaces the earlier one (2 GPUs, then 4: "4 GPUs")
        labels = [kl for kl in labels if kl[0] != step[0][0]] + [step[0]]
        plan, fit = step[1], step[2]
        best_total = fit[1]
        if fit[1] <= fit[2]:
            return _row(" + ".join(label for _, label in labels), fit, current)
    return None
