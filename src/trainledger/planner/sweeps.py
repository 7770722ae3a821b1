"""What-if sweeps for reports and the web page: the estimator called on modified plan inputs.

Every number here comes from :func:`trainledger.estimate.estimate` (or its memory section) run on
a copy of the user's inputs with one thing changed — the GPU model, the sequence length, the
micro-batch, the GPU count. Renderers only draw these results; they compute nothing.

A point whose plan cannot be built (e.g. tp does not divide a GPU count) is kept with its reason,
never dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from trainledger.errors import TrainledgerError
from trainledger.estimate import EstimateOptions, estimate
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.options import MemoryOptions
from trainledger.spec.model import ModelSpec
from trainledger.spec.plan import Plan
from trainledger.load.plan import PlanInputs, build_plan

#: candidate GPUs of the comparison chart when the user names none (a spread of memory sizes).
DEFAULT_COMPARE_GPUS = ("h100-sxm", "h200", "a100-sxm-80gb", "l40s", "rtx-4090")
#: token budget assumed for the time/cost curve when the plan has none (stated on the chart).
ASSUMED_TOKENS = 1e9

_MEM_OPTS = MemoryOptions(suggestions=False)


def quiet_options(options: EstimateOptions | None) -> EstimateOptions:
    """The user's options without the slow extras a sweep does not show (suggestions, scaling)."""
    o = options or EstimateOptions()
    return o.model_copy(update={"memory": o.memory.model_copy(update={"suggestions": False}),
                                "time": o.time.model_copy(update={"scaling": False})})


def variant(inputs: PlanInputs, model: ModelSpec | None = None, **update: Any) -> Plan:
    """The plan of ``inputs`` with some fields replaced (validated like any plan)."""
    return build_plan(inputs.model_copy(update=update), model)


def memory_row(plan: Plan, options: EstimateOptions | None = None) -> dict[str, Any]:
    """Per-GPU memory of one plan: breakdown terms, runtime terms, totals and the fit verdict."""
    mo = (options.memory if options else _MEM_OPTS).model_copy(update={"suggestions": False})
    m = estimate_memory(plan, mo, suggest=False).to_dict()
    return {
        "breakdown": dict(m.get("breakdown") or {}), "runtime": dict(m.get("runtime") or {}),
        "peak_allocated_bytes": m.get("peak_allocated_bytes"),
        "device_total_bytes": m.get("device_total_bytes"), "usable_bytes": m.get("usable_bytes"),
        "budget_bytes": m.get("budget_bytes"), "fits": bool(m.get("fits")),
        "peak_phase": m.get("peak_phase"),
    }


def gpu_comparison(inputs: PlanInputs, gpus: Sequence[str], model: ModelSpec | None = None,
                   options: EstimateOptions | None = None) -> list[dict[str, Any]]:
    """The same job on each candidate GPU (same count and layout): memory by term and step time."""
    out = []
    opts = quiet_options(options)
    for g in gpus:
        row: dict[str, Any] = {"gpu": g}
        try:
            plan = variant(inputs, model, gpu=g)
            row["display_name"] = plan.cluster.gpu.display_name
            row.update(memory_row(plan, opts))
            est = estimate(plan, opts).to_dict()
            row["step_time_s"] = (est.get("compute") or {}).get("step_time_s")
            row["total_s"] = (est.get("time") or {}).get("total_s")
            row["cost_usd"] = (est.get("cost") or {}).get("cloud_usd")
        except TrainledgerError as exc:
            row["error"] = str(exc)
        out.append(row)
    return out


def _doubling(lo: int, hi: int, also: int) -> list[int]:
    vals, v = set(), lo
    while v <= hi:
        vals.add(v)
        v *= 2
    vals.add(also)
    return sorted(vals)


def seq_len_values(current: int) -> list[int]:
    """512 ... 4x the plan's sequence length (at least 32k), doubling, plus the plan's own."""
    return _doubling(512, max(32768, 4 * current), current)


def micro_batch_values(current: int) -> list[int]:
    """1 ... 4x the plan's micro-batch (at least 32), doubling, plus the plan's own."""
    return _doubling(1, max(32, 4 * current), current)


def memory_sweep(inputs: PlanInputs, field: str, values: Iterable[int], gpus: Sequence[str],
                 model: ModelSpec | None = None,
                 options: EstimateOptions | None = None) -> dict[str, Any]:
    """Per-GPU peak memory (device total) as ``field`` (seq_len or micro_batch) takes ``values``.

    For each GPU: the bytes at each value (None where the plan is invalid), the usable capacity,
    the headroom budget, and ``limit`` = the largest swept value that still fits (None if none).
    """
    if field not in ("seq_len", "micro_batch"):
        raise ValueError(f"sweep field must be seq_len or micro_batch, not {field}")
    xs = list(values)
    series: dict[str, dict[str, Any]] = {}
    for g in gpus:
        ys: list[int | None] = []
        fits: list[bool | None] = []
        cap = budget = None
        for x in xs:
            update: dict[str, Any] = {"gpu": g, field: x}
            if field == "micro_batch":
                update["global_batch"] = None
            try:
                row = memory_row(variant(inputs, model, **update), options)
            except TrainledgerError:
                ys.append(None)
                fits.append(None)
                continue
            ys.append(row["device_total_bytes"])
            fits.append(row["fits"])
            cap, budget = row["usable_bytes"], row["budget_bytes"]
        ok = [x for x, f in zip(xs, fits) if f]
        first_bad = next((x for x, f in zip(xs, fits) if f is False), None)
        series[g] = {"bytes": ys, "fits": fits, "usable_bytes": cap, "budget_bytes": budget,
                     "limit": max(ok) if ok else None, "runs_out_at": first_bad}
    return {"field": field, "values": xs, "current": getattr(inputs, field), "gpus": series}


def max_fitting(inputs: PlanInputs, field: str, hi: int, model: ModelSpec | None = None,
                options: EstimateOptions | None = None, step: int = 1) -> int | None:
    """Largest value of ``field`` (a multiple of ``step``, <= hi) at which the plan still fits.

    Memory grows with sequence length and micro-batch, so a bisection finds the edge.
    """
    def fits(v: int) -> bool:
        upd: dict[str, Any] = {field: v}
        if field == "micro_batch":
            upd["global_batch"] = None
        try:
            return memory_row(variant(inputs, model, **upd), options)["fits"]
        except TrainledgerError:
            return False

    lo_k, hi_k = 1, max(1, hi // step)
    if not fits(lo_k * step):
        return None
    if fits(hi_k * step):
        return hi_k * step
    while hi_k - lo_k > 1:
        mid = (lo_k + hi_k) // 2
        if fits(mid * step):
            lo_k = mid
        else:
            hi_k = mid
    return lo_k * step


def gpu_count_values(current: int, per_node: int) -> list[int]:
    """GPU counts around the plan's: 1, 2, 4 ... a node, then whole nodes doubling to 8x the plan."""
    top = max(8 * current, per_node)
    vals, n = {current}, 1
    while n <= top:
        vals.add(n)
        n *= 2
    return sorted(v for v in vals if v <= top)


def _count_point(inputs: PlanInputs, n: int, model: ModelSpec | None,
                 opts: EstimateOptions, tokens: float) -> dict[str, Any]:
    per_node = inputs.gpus_per_node or 8
    upd: dict[str, Any] = {"gpus": n, "dp": None, "tokens": tokens,
                           "gpus_per_node": min(n, per_node)}
    pt: dict[str, Any] = {"gpus": n}
    try:
        plan = variant(inputs, model, **upd)
        est = estimate(plan, opts).to_dict()
    except TrainledgerError as exc:
        return {**pt, "error": str(exc)}
    mem, comp, tm = est["memory"], est.get("compute") or {}, est.get("time") or {}
    cost = est.get("cost") or {}
    return {**pt, "fits": bool(mem.get("fits")), "total_s": tm.get("total_s"),
            "gpu_hours": tm.get("gpu_hours"), "cost_usd": cost.get("cloud_usd"),
            "step_time_s": comp.get("step_time_s"), "tokens_per_s": comp.get("tokens_per_s"),
            "mfu": comp.get("mfu"), "nodes": plan.cluster.nodes,
            "layout": {"dp": plan.layout.dp_size, "tp": plan.layout.tp, "pp": plan.layout.pp,
                       "zero": plan.layout.zero, "grad_accum": plan.recipe.grad_accum}}


def pareto_front(points: Sequence[dict[str, Any]], keys: tuple[str, str] = ("total_s", "cost_usd")
                 ) -> list[bool]:
    """Which points no other point beats on both keys (lower is better); missing values lose."""
    def val(p: dict[str, Any], k: str) -> float:
        v = p.get(k)
        return math.inf if v is None or not p.get("fits", True) or p.get("error") else float(v)

    pts = [(val(p, keys[0]), val(p, keys[1])) for p in points]
    out = []
    for i, a in enumerate(pts):
        if math.isinf(a[0]) or math.isinf(a[1]):
            out.append(False)
            continue
        dominated = any(b[0] <= a[0] and b[1] <= a[1] and b != a for j, b in enumerate(pts) if j != i)
        out.append(not dominated)
    return out


def gpu_count_sweep(inputs: PlanInputs, counts: Iterable[int] | None = None,
                    model: ModelSpec | None = None,
                    options: EstimateOptions | None = None) -> dict[str, Any]:
    """Run time and cloud cost of the job at each GPU count (same GPU, TP/PP, ZeRO), Pareto-marked.

    Without a token budget the curve is for :data:`ASSUMED_TOKENS` tokens (``tokens_assumed``);
    without a catalog price for the GPU the cost axis is GPU-hours (``cost_key``).
    """
    tokens = inputs.tokens or ASSUMED_TOKENS
    xs = list(counts) if counts is not None else gpu_count_values(inputs.gpus, inputs.gpus_per_node or 8)
    opts = quiet_options(options)
    pts = [_count_point(inputs, n, model, opts, tokens) for n in xs]
    ok = [p for p in pts if not p.get("error")]
    # without a catalog price for this GPU, cost is counted in GPU-hours
    cost_key = "cost_usd" if ok and all(p.get("cost_usd") is not None for p in ok) else "gpu_hours"
    for p, front in zip(pts, pareto_front(pts, ("total_s", cost_key))):
        p["pareto"] = front
    return {"tokens": tokens, "tokens_assumed": inputs.tokens is None, "current": inputs.gpus,
            "cost_key": cost_key, "points": pts}
