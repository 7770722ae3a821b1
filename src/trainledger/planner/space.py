"""The planner's enumeration with pruning (see :mod:`trainledger.planner.search` for the rules)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainledger.spec.cluster import GpuSpec, NetworkSpec
from trainledger.errors import TrainledgerError
from trainledger.estimate.memory import fit_bytes, fit_or_misfit
from trainledger.spec.model import ModelSpec
from trainledger.spec.plan import Plan
from trainledger.spec.recipe import Recipe
from trainledger.spec.runtime import (
    DEEPEP_STACKS,
    LIGER_STACKS,
    NO_CONTEXT_PARALLEL, NO_EXPERT_PARALLEL, NO_INTERLEAVING, NO_PIPELINE, NO_ZERO2_SEARCH,
    SELECTIVE_SEARCH, Runtime, stack_optimizer, stack_zero_max,
)
from trainledger.estimate.run.host import host_shortfall
from trainledger.units import GIB, SECONDS_PER_DAY
from trainledger.planner.candidates import (
    KNOBS, Rejected, cluster_for, deadline_s, deadline_wall_s, evaluate, gpu_counts, layout_for, memory_options,
)

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
    framework: str = ""   # the stack searched ('' = the job's framework)
    optimizer: str | None = None  # the job's --optimizer; None: the searched stack's default


@dataclass
class _State:
    evaluated: int = 0


def _tp_values(space: Space, gpu: GpuSpec, per_node: int, rejected: list, n_gpus: int) -> list[int]:
    from trainledger.load.catalog import load_network
    m = space.model
    out = []
    pcie = load_network(gpu.link).kind == "pcie"
    for tp in _TP:
        if m.num_heads % tp or tp > n_gpus:
            continue
        if tp > per_node:
            rejected.append(Rejected(None, f"TP={tp} would span nodes of {per_node} GPUs",
                                     gpu.name, n_gpus, space.framework or space.job.framework))
            continue
        if pcie and tp >= 4:
            rejected.append(Rejected(None, f"TP={tp} across PCIe without NVLink ({gpu.link}): "
                                     "per-layer all-reduces through the host bridge", gpu.name, n_gpus, space.framework or space.job.framework))
            continue
        out.append(tp)
    return out


def _stack(space: Space) -> str:
    """The stack searched: the planner enumerates only the layouts it runs (spec.runtime's table)."""
    return space.framework or space.job.framework


def _knobs(space: Space, pp: int, tp: int) -> list[tuple[int, str, str]]:
    """The memory knobs (zero, recompute, offload) tried, cheapest first, with the ZeRO stages the
    stack runs at this depth and TP degree (DeepSpeed's PipelineEngine: ZeRO-1 at most; its AutoTP:
    ZeRO-2; spec.runtime.stack_zero_max)."""
    zmax = stack_zero_max(_stack(space), pp, tp)
    out: list[tuple[int, str, str]] = []
    for z, rc, off in KNOBS:
        if z == 2 and _stack(space) in NO_ZERO2_SEARCH:
            continue
        if rc == "selective" and _stack(space) not in SELECTIVE_SEARCH:
            continue
        k = (min(z, zmax), rc, off)
        if k not in out:
            out.append(k)
    return out


def _make_plan(space: Space, cluster, tp: int, pp: int, dp: int, zero: int, recompute: str,
               offload: str, mb: int, vp: int = 1, cp: int = 1, ep: int = 1) -> Plan | None:
    gb = _global_batch(space.global_batch, _batch_unit(mb, dp, pp, vp), _tolerance(space))
    if gb is None:
        return None
    rec = space.recipe.model_copy(update={"micro_batch": mb, "recompute": recompute,
                                          "grad_accum": gb // (mb * dp), "global_batch": gb})
    try:
        return Plan(model=space.model, recipe=rec, layout=layout_for(tp, pp, dp, zero, offload, vp, cp, ep),
                    cluster=cluster, headroom=space.job.headroom,
                    runtime=_runtime(space))
    except TrainledgerError:
        return None



def _runtime(space: Space) -> Runtime:
    """The searched stack with the job's Liger kernels where the stack runs transformers' modules
    (Megatron stacks compared beside them run their own fused layers), and the job's MoE dispatcher
    where the stack has it (DeepEP: Megatron-Core and torchtitan; the others all-to-all), and how
    the job loads its model when stated (else each stack's own way)."""
    fw = space.framework or space.job.framework
    dispatcher = space.job.moe_dispatcher if fw in DEEPEP_STACKS else "alltoall"
    return Runtime(framework=fw, liger_kernel=space.job.liger_kernel and fw in LIGER_STACKS,
                   moe_dispatcher=dispatcher, model_loading=space.job.model_loading)

def _batch_unit(mb: int, dp: int, pp: int, vp: int) -> int:
    """What the global batch must be a multiple of: micro-batch × DP, and with an interleaved
    schedule micro-batches in multiples of the pipeline depth (Megatron-LM schedules.py,
    ``forward_backward_pipelining_with_interleaving``: the number of micro-batches must divide
    by the pipeline-parallel size)."""
    return mb * dp * (pp if vp > 1 else 1)


def _global_batch(gb: int, unit: int, tolerance: float = 0.0) -> int | None:
    """``gb`` if ``unit`` divides it, else the nearest multiple of ``unit`` within ``tolerance``.

    A GPU count whose DP degree does not divide the global batch may round the batch to the nearest
    multiple of micro-batch × DP (``Job.batch_rounding``): any whole-node GPU count, not only powers
    of two, can then run the job; the token budget is unchanged and the plan states the batch used.
    """
    if gb % unit == 0:
        return gb
    near = max(unit, round(gb / unit) * unit)
    return near if abs(near - gb) <= tolerance * gb else None


def _tolerance(space: "Space") -> float:
    return float(getattr(space.job, "batch_rounding", 0.0))


def _cp_values(space: Space, room: int) -> list[int]:
    """Context parallelism only for long sequences (>= 32k tokens), where activations dominate."""
    if space.recipe.seq_len < 32768 or _stack(space) in NO_CONTEXT_PARALLEL:
        return [1]
    return [c for c in (1, 2, 4, 8) if c <= room and space.recipe.seq_len % c == 0]


def _ep_values(space: Space, dp_cp: int) -> list[int]:
    """No EP, and every power-of-two EP (<= 64) that divides the experts and DP·CP: the step is
    not monotone in EP (a wider EP shards more expert weights, so less ZeRO traffic, memory for a
    larger micro-batch or no recomputation, but a wider all-to-all, across nodes beyond one),
    so an EP between none and the widest can be the fastest (bench/plan_optimality.py)."""
    moe = space.model.moe
    if moe is None or _stack(space) in NO_EXPERT_PARALLEL:
        return [1]
    return [1] + [e for e in (2, 4, 8, 16, 32, 64) if moe.num_experts % e == 0 and dp_cp % e == 0]


def _fits(plan: Plan, st: _State, host: bool = True) -> int | None:
    """The device total of ``plan`` if it fits, else None: the device total and budget that
    ``estimate_memory`` reports, from the memory walk alone (``fit_or_misfit``: no terms, timeline,
    notes or allocator note, and no walk at all where the resident states or the forward-end moment
    already exceed the budget); a candidate builds its full memory estimate when it is read.
    ``host``: a plan with CPU offload must also hold its offloaded states in the node's host RAM
    (``_host_fits``)."""
    st.evaluated += 1
    fit = fit_or_misfit(plan, memory_options())
    if fit is None or fit[1] > fit[2]:
        return None
    return fit[1] if not host or _host_fits(plan) else None


def _host_fits(plan: Plan) -> bool:
    """Whether the node's installed host RAM holds the plan's offloaded states and its model while
    it loads (the host section's ``host_shortfall``; the rest of its RAM need, workers, pinned
    batches and checkpoint staging, is a few GiB to a few tens of GiB per node and is left to that
    section)."""
    return host_shortfall(plan) is None


def _fit_figures(plan: Plan, st: _State) -> tuple[int, int, int]:
    """(peak, device total, budget) of ``plan``, a miss included (``fit_bytes``): for reporting why
    the most economical setting of a layout does not fit."""
    st.evaluated += 1
    return fit_bytes(plan, memory_options())


def _best_for(space: Space, cluster, tp: int, pp: int, dp: int, st: _State,
              last_fail: list, cp: int = 1, ep: int = 1, host_fails: list | None = None) -> list:
    """Fitting candidates of one (TP, PP, CP, EP, DP): per memory knob, the largest micro-batch.
    ``last_fail`` collects the layouts that do not fit the GPUs even with the most memory-saving
    knob, ``host_fails`` the offload plans whose states do not fit the node's host RAM."""
    host_fails = host_fails if host_fails is not None else []
    gb = space.global_batch
    mbs = [b for b in _MB if _global_batch(gb, b * dp, _tolerance(space)) is not None]
    if not mbs:
        return []
    knobs = _knobs(space, pp, tp)
    z, rc, off = knobs[-1]
    probe = _make_plan(space, cluster, tp, pp, dp, _zero_for(z, off, dp * cp), rc, off, 1, 1, cp, ep)
    if probe is None:
        return []
    if _fits(probe, st, host=False) is None:  # its figures are derived only if the count is rejected (below)
        last_fail.append(probe)
        return []
    out = []
    reached: list[tuple[tuple[int, str, str], int, bool]] = []  # (knob, top mb index, capped)
    for knob in knobs:
        zero, recompute, offload = knob
        zero = _zero_for(zero, offload, dp * cp)
        # a knob that saves memory at a cost over one already fitted (more ZeRO, recomputation,
        # offload: _costlier) can only beat it with a larger micro-batch: it starts above the
        # largest micro-batch that one reached, and is not tried at all when that one was not
        # capped by memory
        below = [(top, capped) for k, top, capped in reached if _costlier(knob, k)]
        if any(not capped for _, capped in below):
            continue
        floor = max((top + 1 for top, _ in below), default=0)
        lo_plan = _make_plan(space, cluster, tp, pp, dp, zero, recompute, offload, mbs[floor], 1, cp, ep)
        if lo_plan is None:
            continue
        if not _host_fits(lo_plan):  # (the offloaded states do not depend on the micro-batch)
            host_fails.append(lo_plan)
            continue
        lo_total = _fits(lo_plan, st, host=False)  # (host RAM checked above)
        if lo_total is None:
            continue
        best_plan, best_total, top = lo_plan, lo_total, floor
        capped = False  # memory stopped the micro-batch below the largest one the batch allows
        for i in range(floor + 1, len(mbs)):
            p = _make_plan(space, cluster, tp, pp, dp, zero, recompute, offload, mbs[i], 1, cp, ep)
            if p is None:
                break
            total = _fits(p, st, host=False)
            if total is None:
                capped = True
                break
            best_plan, best_total, top = p, total, i
        reached.append((knob, top, capped))
        out.append(evaluate(best_plan, space.job, best_total))
        if pp > 1 and best_plan is not lo_plan:  # more, smaller micro-batches shrink the bubble
            out.append(evaluate(lo_plan, space.job, lo_total))
    return out


def _zero_for(zero: int, offload: str, shards: int) -> int:
    """The ZeRO stage a knob runs at with ``shards`` data-parallel ranks: none on one rank (nothing
    to shard over), except where the optimizer is offloaded, which happens inside the ZeRO
    optimizer (ZeRO-Offload on one GPU; spec.runtime.stack_layout_problem)."""
    return zero if shards > 1 or offload != "none" else 0


_RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}
_OFFLOAD_RANK = {"none": 0, "optimizer": 1, "params": 2}


def _costlier(knob: tuple[int, str, str], than: tuple[int, str, str]) -> bool:
    """Whether memory knob ``knob`` saves memory at a cost over ``than``: at least as much ZeRO
    sharding, recomputation and offload, and not the same knob. At one micro-batch such a knob
    adds communication, recomputed FLOPs or host traffic, so it only pays through the larger
    micro-batch the memory it frees allows."""
    (z, rc, off), (z0, rc0, off0) = knob, than
    return (knob != than and z >= z0 and _RECOMPUTE_RANK[rc] >= _RECOMPUTE_RANK[rc0]
            and _OFFLOAD_RANK[off] >= _OFFLOAD_RANK[off0])


def cheapest(cands: list) -> bool:
    """Whether a candidate list holds a plan without ZeRO-3, offload or recomputation: a deeper
    pipeline has nothing left to drop, so one that is not faster than the depth before ends the
    search. (A depth whose plans recompute goes on: a deeper one splits the layers' activations
    further and may fit without it, e.g. a 13B under DeepSpeed on 8 H100: tp1 pp2 and pp4 recompute,
    slower than pp1, where pp8 fits without and is 10% faster.)"""
    return any(c.plan.layout.zero <= 1 and c.plan.layout.offload == "none" and c.plan.recipe.recompute == "none"
               for c in cands)


def _interleaved(space: Space, cand, st: _State):
    """The same layout with an interleaved schedule (v = 2, 4, 8 virtual stages), best of them."""
    p = cand.plan
    lay = p.layout
    L = space.model.num_layers
    best = None
    if lay.pp == 1 or p.runtime.framework in NO_INTERLEAVING:
        return None
    stage = math.ceil(L / lay.pp)
    if p.runtime.framework in ("megatron-core", "megatron-deepspeed"):
        # Megatron-LM's --num-layers-per-virtual-pipeline-stage must divide each stage's layers
        # (the vendor tables' vp 5, 6, 10, 20: divisors of the stage depth); the loop below stops
        # at the first v that is no faster
        if L % lay.pp:
            return None
        tried = [v for v in range(2, stage + 1) if stage % v == 0]
    else:
        tried = [v for v in (2, 4, 8) if v <= stage]
    # the deepest chunk sets the bubble (estimate/time/step.py chunk_share): a v that leaves it as
    # deep as a smaller v did only adds point-to-point transfers
    depths = [math.ceil(stage / v) for v in tried]
    for v in [v for i, v in enumerate(tried) if i == 0 or depths[i] < depths[i - 1]]:
        q = _make_plan(space, p.cluster, lay.tp, lay.pp, lay.dp_size, lay.zero, p.recipe.recompute,
                       lay.offload, p.recipe.micro_batch, vp=v, cp=lay.cp, ep=lay.ep)
        if q is None:
            break
        # the first stage's in-flight activations fall as v grows (stage.inflight_microbatches: the warm-up holds
        # 2(p-1) + (v-1)p + 1 chunks of 1/v of the stage: 5.5 stages at p = 4, v = 2; 4.75 at v = 4),
        # so a v that does not fit does not end the walk
        total = _fits(q, st)
        if total is None:
            continue
        c = evaluate(q, space.job, total)
        if best is not None and c.compute.step_time_s >= best.compute.step_time_s:
            break
        best = c
    return best


def _count_search(space: Space, gpu: GpuSpec, per_node: int, net: NetworkSpec, n: int,
                  st: _State, rejected: list) -> list:
    budget = gpu.usable_bytes * (1 - space.job.headroom)
    if space.lower_bound / n > budget:
        full = space.recipe.method not in ("lora", "qlora", "inference")
        what = "weights and gradients" if full else "weights"
        how = " with the optimizer offloaded" if full else ""
        rejected.append(Rejected(None, f"needs at least {space.lower_bound / n / GIB:.0f} GiB of {what} "
                                 f"per GPU even fully sharded over {n}{how}, has {budget / GIB:.0f}",
                                 gpu.name, n, space.framework or space.job.framework))
        return []
    cluster = cluster_for(gpu, per_node, n, net, space.job.host_ram_gib)
    found: list = []
    fails: list = []
    host_fails: list = []
    shapes = [(tp, cp) for tp in _tp_values(space, gpu, per_node, rejected if n == per_node else [], n)
              for cp in _cp_values(space, n // tp)]
    for tp, cp in shapes:
        fitted = 0
        prev_best = None  # step time of the fastest plan of the previous pipeline depth
        cheap_seen = False
        for pp in _PP:
            if tp * pp * cp > n or n % (tp * pp * cp) or pp > space.model.num_layers:
                continue
            if pp > 1 and _stack(space) in NO_PIPELINE:
                break
            dp = n // (tp * pp * cp)
            got = []
            for ep in _ep_values(space, dp * cp):
                got += _best_for(space, cluster, tp, pp, dp, st, fails, cp, ep, host_fails)
            if got:
                found += got
                best = min(got, key=lambda c: c.compute.step_time_s)
                inter = _interleaved(space, best, st) if pp > 1 else None
                if inter is not None:
                    found.append(inter)
                step = min(best.compute.step_time_s, inter.compute.step_time_s if inter is not None else math.inf)
                fitted += 1
                # a depth whose plans need neither ZeRO-3, offload nor recomputation (cheapest):
                # deeper pipelines add bubble,
                # but they also split the replica's parameters, so the data-parallel traffic per GPU
                # (and the TP traffic) shrinks; go on while a depth is faster than the one before
                if fitted >= 5 or (cheap_seen and prev_best is not None and step >= prev_best):
                    break
                cheap_seen = cheap_seen or cheapest(got)
                prev_best = step
    if not found:
        if host_fails:
            plan, (what, need) = min(((p, host_shortfall(p)) for p in host_fails), key=lambda f: f[1][1])
            rejected.append(Rejected(plan, f"needs {need / GIB:,.0f} GiB of host RAM per node for {what}, has "
                                     f"{plan.cluster.host_ram_bytes / GIB:,.0f}", gpu.name, n,
                                     space.framework or space.job.framework))
        elif fails:
            plan, (_, total, budget) = min(((p, _fit_figures(p, st)) for p in fails), key=lambda f: f[1][1])
            rejected.append(Rejected(plan, f"needs {total / GIB:.1f} GiB per GPU "
                                     f"with the most memory-saving layout tried, has "
                                     f"{budget / GIB:.1f} usable", gpu.name, n, space.framework or space.job.framework))
        else:
            rejected.append(Rejected(None, f"no layout divides global batch {space.global_batch} "
                                     f"over {n} GPUs", gpu.name, n, space.framework or space.job.framework))
    return found


def run_search(space: Space, configs: list[tuple[GpuSpec, int, NetworkSpec]],
               progress: Callable[[int, int], None] | None = None):
    """Search every hardware config; return (candidates, rejected, evaluated, gpu-count bounds)."""
    import dataclasses

    st = _State()
    cands: list = []
    rejected: list = []
    bounds: list[dict[str, Any]] = []
    deadline = deadline_s(space.job)
    base_space = space
    for i, (gpu, per_node, net, *fw) in enumerate(configs):
        space = dataclasses.replace(base_space, framework=fw[0] if fw else base_space.framework)
        if space.framework:  # each stack runs its own default optimizer unless the job names one
            space.recipe = space.recipe.model_copy(
                update={"optimizer": stack_optimizer(space.optimizer, space.framework)})
        mem_bound = time_bound = None
        missed = 0  # largest whole-node count tried that ran but missed the deadline
        seen: list = []  # every fitting candidate of this config: the layout families of _by_family
        for n in gpu_counts(per_node, space.job.max_gpus):
            found = _count_search(space, gpu, per_node, net, n, st, rejected)
            if not found:
                continue
            seen += found
            mem_bound = mem_bound or n
            best = min(found, key=lambda c: c.compute.step_time_s)
            wall = deadline_wall_s(best, space.job) if deadline else None
            if deadline and wall is not None and wall > deadline:
                rejected.append(Rejected(best.plan, _missed_reason(best, space.job, wall), gpu.name, n,
                                         space.framework))
                missed = max(missed, n)
                continue
            if deadline and time_bound is None and missed >= per_node and n - missed > per_node:
                hit = _refine(space, gpu, per_node, net, missed, n, deadline, st, rejected)
                if hit is not None:
                    cands.append(hit)
                    time_bound = hit.plan.cluster.world_size
            time_bound = time_bound or n
            cands.append(best)
        if deadline and seen and (time_bound is None or time_bound > per_node):
            # below the count found, or anywhere within the budget when no count tried met it
            top = time_bound or (space.job.max_gpus // per_node + 1) * per_node
            hit = _by_family(space, gpu, per_node, net, top, deadline, st, seen)
            if hit is not None:
                cands.append(hit)
                time_bound = hit.plan.cluster.world_size
        bounds.append(_bound_row(gpu, per_node, net, mem_bound, time_bound, deadline))
        if deadline and time_bound is None and missed >= per_node:
            bounds[-1]["deadline_beyond_budget_gpus"] = _beyond_budget(space, gpu, per_node, net, missed,
                                                                       deadline, st)
        bounds[-1]["framework"] = space.framework
        if progress:
            progress(i + 1, len(configs))
    return cands, rejected, st.evaluated, bounds


#: how far past --max-gpus the deadline bound is looked for (a guide for the budget, not a plan)
BEYOND_BUDGET_FACTOR = 64


def _beyond_budget(space: Space, gpu: GpuSpec, per_node: int, net: NetworkSpec, missed: int,
                   deadline: float, st: _State) -> int | None:
    """Smallest whole-node count past the budget that meets the deadline, when none within does: the
    budget's own grid continued (whole nodes doubling, up to BEYOND_BUDGET_FACTOR × the largest
    count tried), then the bisection of :func:`_refine` between the last miss and the first hit —
    the count the search would answer with --max-gpus at that grid point. Its plans are not
    candidates (the budget excludes them); None when no count up to that factor meets it."""
    lo = missed
    for n in gpu_counts(per_node, missed * BEYOND_BUDGET_FACTOR):
        if n <= missed:
            continue
        found = _count_search(space, gpu, per_node, net, n, st, [])
        if _meeting(found, space.job, deadline):
            hit = _refine(space, gpu, per_node, net, lo, n, deadline, st, []) if n - lo > per_node else None
            return hit.plan.cluster.world_size if hit is not None else n
        if found:
            lo = n
    return None


def _meeting(cands: list, job: Any, deadline: float) -> list:
    """The candidates whose wall time with interruptions (at the job's deadline quantile:
    ``candidates.deadline_wall_s``) is within the deadline."""
    return [c for c in cands if (w := deadline_wall_s(c, job)) is not None and w <= deadline]


def _missed_reason(c: Any, job: Any, wall: float) -> str:
    d = SECONDS_PER_DAY
    days = f"misses the {job.deadline_days:g}-day deadline: {wall / d:.1f} days with interruptions"
    if job.deadline_quantile == "estimate":
        return f"{days} ({c.total_s / d:.1f} without)"
    return f"{days} at the {job.deadline_quantile} of its interval ({c.wall_s(job.cost_options) / d:.1f} estimated)"


def _refine(space: Space, gpu: GpuSpec, per_node: int, net: NetworkSpec, lo: int, hi: int,
            deadline: float, st: _State, rejected: list):
    """Smallest whole-node count in (lo, hi) that meets the deadline with interruptions (bisection on
    node counts; time falls as nodes are added). ``lo`` missed it, ``hi`` met it. None if only ``hi`` does."""
    best = None
    a, b = lo // per_node, hi // per_node
    while b - a > 1:
        mid = (a + b) // 2
        found = _count_search(space, gpu, per_node, net, mid * per_node, st, [])
        ok = _meeting(found, space.job, deadline)
        if ok:
            best, b = min(ok, key=lambda c: deadline_wall_s(c, space.job)), mid
        else:
            a = mid
    return best


def _by_family(space: Space, gpu: GpuSpec, per_node: int, net: NetworkSpec, bound: int, deadline: float,
               st: _State, seen: list):
    """A plan on fewer whole nodes than ``bound`` that meets the deadline, when one of the layout
    families the search met can run there; None if none can.

    Step time is not monotone in the GPU count: a family (TP, PP, CP, EP, virtual stages, ZeRO,
    recompute, offload, micro-batch) runs only where its replica divides the count, where the
    rounded global batch stays within ``Job.batch_rounding`` of the job's, and (interleaved) where
    the accumulation steps divide into the stages — so a count can miss the deadline while a smaller
    one meets it, and neither the grid nor the bisection of :func:`_refine` can tell. Within one
    family the wall time falls as data parallelism grows (the step's work is split over more
    replicas; its collectives per rank do not grow), so each family is bisected over the
    whole-node counts it can run below the best count so far and above the largest count it missed
    on, after one check at the largest of them (a family that misses there cannot meet below).
    Families are tried in order of the GPU time they took where the search met them, so the bound
    shrinks early. The answer's count is then searched in full for its fastest plan."""
    job = space.job
    fams: dict[tuple, Any] = {}
    missed: dict[tuple, int] = {}  # the largest count each family missed on: it misses below too
    for c in sorted(seen, key=lambda c: c.plan.cluster.world_size * (deadline_wall_s(c, job) or float("inf"))):
        lay, r = c.plan.layout, c.plan.recipe
        key = (lay.tp, lay.pp, lay.cp, lay.ep, lay.vp, lay.zero, lay.offload, r.recompute, r.micro_batch)
        fams.setdefault(key, c)
        w = deadline_wall_s(c, job)
        if w is None or w > deadline:
            missed[key] = max(missed.get(key, 0), c.plan.cluster.world_size)
    tol = _tolerance(space)
    best = None

    def meets(key: tuple, dp: int):
        tp, pp, cp, ep, vp, zero, off, rc, mb = key
        n = dp * tp * pp * cp
        plan = _make_plan(space, cluster_for(gpu, per_node, n, net, job.host_ram_gib), tp, pp, dp, zero, rc, off,
                          mb, vp, cp, ep)
        if plan is None:
            return None
        total = _fits(plan, st)
        if total is None:
            return None
        c = evaluate(plan, space.job, total)
        return c if _meeting([c], job, deadline) else None

    for key in fams:
        tp, pp, cp, ep, vp, _, _, _, mb = key
        width = tp * pp * cp
        dps = []
        # whole-node counts above the largest missed one that the replica divides: the multiples
        # of lcm(node, replica) from there
        step = math.lcm(per_node, width)
        start = per_node * (missed.get(key, 0) // per_node + 1)
        # past this DP degree the batch unit exceeds the global batch by more than the rounding
        # allows (``_global_batch``: no multiple of the unit is near enough): no count above runs it
        dp_cap = int(space.global_batch * (1 + tol) / _batch_unit(mb, 1, pp, vp) + 1e-9)
        for n in range(math.ceil(start / step) * step, min(bound, dp_cap * width + 1), step):
            dp = n // width
            if (dp * cp) % ep:
                continue
            if _global_batch(space.global_batch, _batch_unit(mb, dp, pp, vp), tol) is None:
                continue
            dps.append(dp)
        if not dps:
            continue
        top = meets(key, dps[-1])
        if top is None:
            continue
        lo, hi, hit = -1, len(dps) - 1, top
        while hi - lo > 1:
            mid = (lo + hi) // 2
            c = meets(key, dps[mid])
            if c is not None:
                hi, hit = mid, c
            else:
                lo = mid
        best, bound = hit, hit.plan.cluster.world_size
    if best is None:
        return None
    found = _count_search(space, gpu, per_node, net, bound, st, [])
    return min(_meeting(found, job, deadline) + [best], key=lambda c: deadline_wall_s(c, job))


def _bound_row(gpu, per_node, net, mem_bound, time_bound, deadline) -> dict[str, Any]:
    need = None
    if mem_bound is not None and (time_bound is not None or not deadline):
        need = max(mem_bound, time_bound or mem_bound)
    return {"gpu": gpu.name, "gpus_per_node": per_node, "network": net.name,
            "memory_bound_gpus": mem_bound, "deadline_bound_gpus": time_bound if deadline else None,
            "gpus_needed": need}
