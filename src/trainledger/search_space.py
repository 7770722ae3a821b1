"""The planner's enumeration with pruning (see :mod:`trainledger.search` for the rules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cluster import GpuSpec, NetworkSpec
from .errors import TrainledgerError
from .estimate.memory import estimate_memory
from .model import ModelSpec
from .plan import Plan
from .recipe import Recipe
from .units import GIB

_PP = (1, 2, 4, 8, 16, 32, 64, 128)
_TP = (1, 2, 4, 8)
_MB = (1, 2, 4, 8, 16)


@dataclass
class Space:
    """What stays fixed during one search."""

    job: Any
    model: ModelSpec
    recipe: Recipe
    global_batch: int
    lower_bound: float


@dataclass
class _State:
    evaluated: int = 0


def _tp_values(space: Space, gpu: GpuSpec, per_node: int, rejected: list, n_gpus: int) -> list[int]:
    from .catalog import load_network
    from .search import Rejected

    m = space.model
    out = []
    pcie = load_network(gpu.link).kind == "pcie"
    for tp in _TP:
        if m.num_heads % tp or tp > n_gpus:
            continue
        if tp > per_node:
            rejected.append(Rejected(None, f"TP={tp} would span nodes of {per_node} GPUs",
                                     gpu.name, n_gpus))
            continue
        if pcie and tp >= 4:
            rejected.append(Rejected(None, f"TP={tp} across PCIe without NVLink ({gpu.link}): "
                                     "per-layer all-reduces through the host bridge", gpu.name, n_gpus))
            continue
        out.append(tp)
    return out


def _make_plan(space: Space, cluster, tp: int, pp: int, dp: int, zero: int, recompute: str,
               offload: str, mb: int, vp: int = 1, cp: int = 1, ep: int = 1) -> Plan | None:
    from .search import _layout

    gb = space.global_batch
    if gb % (mb * dp):
        return None
    rec = space.recipe.model_copy(update={"micro_batch": mb, "recompute": recompute,
                                          "grad_accum": gb // (mb * dp)})
    try:
        return Plan(model=space.model, recipe=rec, layout=_layout(tp, pp, dp, zero, offload, vp, cp, ep),
                    cluster=cluster, headroom=space.job.headroom)
    except TrainledgerError:
        return None


def _cp_values(space: Space, room: int) -> list[int]:
    """Context parallelism only for long sequences (>= 32k tokens), where activations dominate."""
    if space.recipe.seq_len < 32768:
        return [1]
    return [c for c in (1, 2, 4, 8) if c <= room and space.recipe.seq_len % c == 0]


def _ep_values(space: Space, dp_cp: int) -> list[int]:
    """No EP, and the widest power-of-two EP (<= 64) that divides the experts and DP·CP."""
    moe = space.model.moe
    if moe is None:
        return [1]
    wide = [e for e in (2, 4, 8, 16, 32, 64) if moe.num_experts % e == 0 and dp_cp % e == 0]
    return [1] + wide[-1:]


def _fits(plan: Plan, st: _State):
    from .search import memory_options

    st.evaluated += 1
    mem = estimate_memory(plan, memory_options(), suggest=False)
    return mem.fits, mem


def _best_for(space: Space, cluster, tp: int, pp: int, dp: int, st: _State,
              last_fail: list, cp: int = 1, ep: int = 1) -> list:
    """Fitting candidates of one (TP, PP, CP, EP, DP): per memory knob, the largest micro-batch."""
    from .search import _KNOBS, evaluate

    gb = space.global_batch
    mbs = [b for b in _MB if gb % (b * dp) == 0]
    if not mbs:
        return []
    z, rc, off = _KNOBS[-1]
    probe = _make_plan(space, cluster, tp, pp, dp, z if dp * cp > 1 else 0, rc, off, 1, 1, cp, ep)
    if probe is None:
        return []
    ok, mem = _fits(probe, st)
    if not ok:
        last_fail.append((probe, mem))
        return []
    out = []
    for zero, recompute, offload in _KNOBS:
        zero = zero if dp * cp > 1 else 0
        lo_plan = _make_plan(space, cluster, tp, pp, dp, zero, recompute, offload, 1, 1, cp, ep)
        if lo_plan is None:
            continue
        ok, mem = _fits(lo_plan, st)
        if not ok:
            continue
        best_plan, best_mem = lo_plan, mem
        for b in mbs[1:]:
            p = _make_plan(space, cluster, tp, pp, dp, zero, recompute, offload, b, 1, cp, ep)
            if p is None:
                break
            ok, mem = _fits(p, st)
            if not ok:
                break
            best_plan, best_mem = p, mem
        out.append(evaluate(best_plan, space.job, best_mem))
        if pp > 1 and best_plan is not lo_plan:  # more, smaller micro-batches shrink the bubble
            out.append(evaluate(lo_plan, space.job, mem if best_plan is lo_plan else None))
        if recompute == "none" and offload == "none":
            break  # the cheapest knobs fit: the costlier ones only add time
    return out


def cheapest(cands: list) -> bool:
    """Whether a candidate list holds a plan without ZeRO-3 or offload (deeper PP won't beat it)."""
    return any(c.plan.layout.zero <= 1 and c.plan.layout.offload == "none" for c in cands)


def _interleaved(space: Space, cand, st: _State):
    """The same layout with an interleaved schedule (v = 2, 4, 8 virtual stages), best of them."""
    from .search import evaluate

    p = cand.plan
    lay = p.layout
    L = space.model.num_layers
    best = None
    for v in (2, 4, 8):
        if lay.pp == 1 or L < lay.pp * v or p.recipe.grad_accum % lay.pp:
            break
        q = _make_plan(space, p.cluster, lay.tp, lay.pp, lay.dp_size, lay.zero, p.recipe.recompute,
                       lay.offload, p.recipe.micro_batch, vp=v, cp=lay.cp, ep=lay.ep)
        if q is None:
            break
        ok, mem = _fits(q, st)
        if not ok:
            break
        c = evaluate(q, space.job, mem)
        if best is not None and c.compute.step_time_s >= best.compute.step_time_s:
            break
        best = c
    return best


def _count_search(space: Space, gpu: GpuSpec, per_node: int, net: NetworkSpec, n: int,
                  st: _State, rejected: list) -> list:
    from .search import Rejected, _cluster

    budget = gpu.usable_bytes * (1 - space.job.headroom)
    if space.lower_bound / n > budget:
        rejected.append(Rejected(None, f"needs at least {space.lower_bound / n / GIB:.0f} GiB of weights "
                                 f"and optimizer states per GPU even fully sharded over {n}, has "
                                 f"{budget / GIB:.0f}", gpu.name, n))
        return []
    cluster = _cluster(gpu, per_node, n, net)
    found: list = []
    fails: list = []
    shapes = [(tp, cp) for tp in _tp_values(space, gpu, per_node, rejected if n == per_node else [], n)
              for cp in _cp_values(space, n // tp)]
    for tp, cp in shapes:
        fitted = 0
        for pp in _PP:
            if tp * pp * cp > n or n % (tp * pp * cp) or pp > space.model.num_layers:
                continue
            dp = n // (tp * pp * cp)
            got = []
            for ep in _ep_values(space, dp * cp):
                got += _best_for(space, cluster, tp, pp, dp, st, fails, cp, ep)
            if got:
                found += got
                best = min(got, key=lambda c: c.compute.step_time_s)
                inter = _interleaved(space, best, st) if pp > 1 else None
                if inter is not None:
                    found.append(inter)
                fitted += 1
                if cheapest(got) or fitted >= 5:
                    break  # deeper pipelines only add bubble from here on
    if not found:
        if fails:
            plan, mem = min(fails, key=lambda f: f[1].device_total_bytes)
            rejected.append(Rejected(plan, f"needs {mem.device_total_bytes / GIB:.1f} GiB per GPU "
                                     f"with the most memory-saving layout tried, has "
                                     f"{mem.budget_bytes / GIB:.1f} usable under {plan.runtime.framework}",
                                     gpu.name, n))
        else:
            rejected.append(Rejected(None, f"no layout divides global batch {space.global_batch} "
                                     f"over {n} GPUs", gpu.name, n))
    return found


def run_search(space: Space, configs: list[tuple[GpuSpec, int, NetworkSpec]],
               progress: Callable[[int, int], None] | None = None):
    """Search every hardware config; return (candidates, rejected, evaluated, gpu-count bounds)."""
    from .search import Rejected, _deadline_s, gpu_counts

    st = _State()
    cands: list = []
    rejected: list = []
    bounds: list[dict[str, Any]] = []
    deadline = _deadline_s(space.job)
    for i, (gpu, per_node, net) in enumerate(configs):
        mem_bound = time_bound = None
        for n in gpu_counts(per_node, space.job.max_gpus):
            found = _count_search(space, gpu, per_node, net, n, st, rejected)
            if not found:
                continue
            mem_bound = mem_bound or n
            best = min(found, key=lambda c: c.compute.step_time_s)
            if deadline and best.total_s is not None and best.total_s > deadline:
                rejected.append(Rejected(best.plan, f"misses the {space.job.deadline_days:g}-day "
                                         f"deadline: {best.total_s / 86400:.1f} days", gpu.name, n))
                continue
            time_bound = time_bound or n
            cands.append(best)
        bounds.append(_bound_row(gpu, per_node, net, mem_bound, time_bound, deadline))
        if progress:
            progress(i + 1, len(configs))
    return cands, rejected, st.evaluated, bounds


def _bound_row(gpu, per_node, net, mem_bound, time_bound, deadline) -> dict[str, Any]:
    need = None
    if mem_bound is not None and (time_bound is not None or not deadline):
        need = max(mem_bound, time_bound or mem_bound)
    return {"gpu": gpu.name, "gpus_per_node": per_node, "network": net.name,
            "memory_bound_gpus": mem_bound, "deadline_bound_gpus": time_bound if deadline else None,
            "gpus_needed": need}
