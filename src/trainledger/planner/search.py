"""The planner: enumerate layouts and hardware for a job, keep what fits, rank it (issue 4).

For every candidate GPU type × node size × network and every GPU count (1, 2, 4 ... a node,
then whole nodes doubling up to ``max_gpus``) the search walks tensor-parallel degrees (within a
node) and pipeline degrees (ascending; once a depth fits without ZeRO-3 or offload, deeper ones
only while each is faster than the one before: a deeper pipeline adds bubble but splits the
replica's parameters, and with them its data-parallel traffic), and for each tries the
memory-saving knobs in order of cost — ZeRO-1, full recomputation, ZeRO-3, optimizer offload —
with the largest micro-batch that fits. Pruning:

* a lower bound of the model states (16-bit weights + fp32 master/Adam states, fully sharded over
  all n GPUs) rejects GPU counts that cannot hold the model before any layout is built;
* memory grows with the micro-batch, so micro-batches are bisected;
* if the most memory-saving setting does not fit, the (TP, PP) pair is dropped at once.

Every infeasible candidate comes back as ``Rejected(plan, reason)``. The GPU count of a job is
the larger of the memory bound (fewest GPUs that hold it) and the deadline bound (fewest that finish
the token budget in time, counting the expected interruptions, checkpoints and restarts of
``estimate/run/goodput.py``); both are reported. The deadline bound is any whole-node count, not a
grid point: between the last grid count that misses and the first that meets, whole-node counts
are bisected; then every layout family the search met is bisected over the whole-node counts it can
run below that (``space._by_family``), because a family runs only where its replica divides the
count and its rounded batch stays within ``batch_rounding`` — time is not monotone in the count.
"""

from __future__ import annotations

import math
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


from trainledger.load.catalog import load_gpu, load_network, names
from trainledger.errors import PlanError
from trainledger.load.hf import load_model
from trainledger.spec.model import ModelSpec
from trainledger.spec.recipe import Recipe
from trainledger.spec.runtime import stack_limits, stack_optimizer
from trainledger.units import SECONDS_PER_DAY
from trainledger.planner.candidates import Candidate, Rejected, deadline_s
from trainledger.planner.job import EXAMPLE_JOB, Job, RankBy
from trainledger.planner.space import Space, run_search

@dataclass
class SearchResult:
    """Ranked plans, rejected candidates, GPU-count bounds and search statistics."""

    job: Job
    plans: list[Candidate]
    rejected: list[Rejected]
    evaluated: int
    elapsed_s: float
    gpu_count: list[dict[str, Any]]
    #: ranking by cost: plans on GPUs without a price, listed (by GPU and count), never ranked
    unpriced: list[Candidate] = field(default_factory=list)
    #: no plan fits under the searched stacks and their missing parallelisms may be why: the same
    #: job searched under each stack that runs every layout (``alternatives``)
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job.model_dump(mode="json"), "plans": [p.to_dict() for p in self.plans],
                "unpriced": [p.to_dict() for p in self.unpriced],
                "unpriced_gpus": sorted({p.plan.cluster.gpu.name for p in self.unpriced}),
                "rejected": [r.to_dict() for r in self.rejected], "evaluated": self.evaluated,
                "elapsed_s": self.elapsed_s, "gpu_count": self.gpu_count,
                "plans_per_s": self.evaluated / self.elapsed_s if self.elapsed_s else None,
                # what each searched stack cannot run: layouts with it were not searched
                "stack_limits": {fw: stack_limits(fw) for fw in (self.job.frameworks or (self.job.framework,))},
                "alternatives": self.alternatives}

    def __repr__(self) -> str:  # notebook views: trainledger.format
        from trainledger.format import search_repr

        return search_repr(self)

    def _repr_html_(self) -> str:
        from trainledger.format import search_html

        return search_html(self)

    def to_pandas(self) -> Any:
        """One row per ranked plan (needs pandas)."""
        from trainledger.format import search_frame

        return search_frame(self)


def default_global_batch(job: Job) -> int:
    """About 1M tokens per step (4M for pre-training), as a power of two number of samples."""
    target = (4 if job.method == "pretrain" else 1) * 2**20 / job.seq_len
    return 2 ** max(0, round(math.log2(max(1.0, target))))


def _state_bytes_lower_bound(model: ModelSpec, recipe: Recipe) -> float:
    """Bytes of the whole model that no searched layout moves off the GPUs (sharded perfectly,
    nothing else): the weights and, training all of them, their gradients, each at 2 bytes at
    least (4 in fp32). The optimizer states and fp32 master weights are not counted: the planner's
    last memory knob offloads them to host memory (ZeRO-3 with optimizer offload)."""
    p = model.params.total
    if recipe.method in ("lora", "qlora"):
        return p * (0.5 if recipe.method == "qlora" else 2.0)
    if not recipe.is_training:
        return p * 2.0
    return p * 8.0 if recipe.precision == "fp32" else p * 4.0



__all__ = ["Job", "EXAMPLE_JOB", "Rejected", "Candidate", "SearchResult", "search", "Space"]


def search(job: Job, progress: Callable[[int, int], None] | None = None,
           model: ModelSpec | None = None, with_alternatives: bool = True) -> SearchResult:
    """Plan ``job``: enumerate, prune, estimate, rank (see the module docstring).

    ``model`` replaces ``job.model`` (e.g. a config.json the web app parsed from a request body).
    ``with_alternatives``: when nothing fits, also search the stacks that run every layout
    (``alternatives``).
    """
    t0 = time.perf_counter()
    asked_job = job  # as given (its precision and optimizer unresolved): the alternatives' job
    model = model or load_model(job.model)
    gb = job.global_batch or default_global_batch(job)
    try:
        from trainledger.spec.precision import default_precision  # None: the method's default, as estimate resolves it

        precision = job.precision or default_precision(job.method, model, None)[0]
        asked = job.optimizer  # None: each searched stack's default (spec.runtime.stack_optimizer)
        optimizer = stack_optimizer(asked, job.framework)
        # the result states the policy and the optimizer used (each plan its own where the searched
        # stacks' defaults differ)
        used = {stack_optimizer(asked, fw) for fw in (job.frameworks or (job.framework,))}
        job = job.model_copy(update={"precision": precision,
                                     "optimizer": used.pop() if len(used) == 1 else None})
        recipe = Recipe(method=job.method, precision=precision, optimizer=optimizer,
                        seq_len=job.seq_len, doc_len=job.doc_len, micro_batch=1, global_batch=gb,
                        attention=job.attention, lora_rank=job.lora_rank, train_tokens=job.tokens,
                        moe_capacity_factor=job.moe_capacity_factor, moe_pad_to_capacity=job.moe_pad_to_capacity)
    except Exception as exc:  # pydantic validation of the job's recipe fields
        raise PlanError(f"plan: {exc}") from None
    if recipe.capacity_problem:
        raise PlanError(field="moe_pad_to_capacity", message=recipe.capacity_problem)
    gpus = [load_gpu(g) for g in (job.gpus or tuple(names("gpus")))]
    nets = [load_network(n) for n in (job.networks or ("ib-ndr",))]
    sizes = job.gpus_per_node or (8,)
    space = Space(job=job, model=model, recipe=recipe, global_batch=gb,
                  lower_bound=_state_bytes_lower_bound(model, recipe), optimizer=asked)
    configs = [(g, s, n, fw) for g in gpus for s in sizes for n in nets
               for fw in (job.frameworks or (job.framework,))]
    cands, rejected, evaluated, counts = run_search(space, configs, progress)
    unpriced: list[Candidate] = []
    if job.rank_by == "cost":  # no price is no rank: list those plans apart instead of ranking them by time
        unpriced = sorted((c for c in cands if c.cost_usd is None),
                          key=lambda c: (c.plan.cluster.gpu.name, c.plan.cluster.world_size))
        cands = [c for c in cands if c.cost_usd is not None]
    ranked = rank(cands, job)
    for c in ranked[: job.top] + unpriced[: job.top]:
        c.risks += deadline_risks(c, job)
    elapsed = time.perf_counter() - t0  # of this search (the alternatives' own searches excluded)
    alts = alternatives(asked_job, model) if not ranked and not unpriced and with_alternatives else []
    return SearchResult(job=job, plans=ranked[: job.top], rejected=rejected, evaluated=evaluated,
                        elapsed_s=elapsed, gpu_count=counts, unpriced=unpriced[: job.top],
                        alternatives=alts)


def deadline_risks(c: Candidate, job: Job) -> list[str]:
    """A plan meets the deadline by its step-time estimate; the risk that it does not, from the
    interval around that estimate (the accuracy suite's p10/p90 residuals for its stack and GPU
    family, ``estimate.time.intervals``): the run with interruptions at the interval's upper end
    past the deadline, or its whole interval past it (a family the model predicts too fast)."""
    deadline = deadline_s(job)
    wall = c.wall_s(job.cost_options)
    iv = c.time.interval if c.time is not None else None
    if not deadline or wall is None or not iv:
        return []
    lo, hi = wall * iv["factor_p10"], wall * iv["factor_p90"]
    if hi <= deadline:
        return []
    span = f"{lo / SECONDS_PER_DAY:.1f}-{hi / SECONDS_PER_DAY:.1f} days with interruptions"
    if lo > deadline:
        return [f"deadline likely missed: the run takes {span} at p10-p90 ({iv['basis']}), all "
                f"past the {job.deadline_days:g}-day deadline (--deadline-quantile p90 plans for it)"]
    return [f"deadline at risk: the run takes {span} at p10-p90 ({iv['basis']}); the "
            f"{job.deadline_days:g}-day deadline sits at about p{_share_within(lo, hi, deadline):.0f} "
            "(--deadline-quantile p90 plans for the upper end)"]


def _share_within(lo: float, hi: float, deadline: float) -> float:
    """The percentile of the interval at the deadline, reading p10..p90 as linear in between."""
    return 10 + 80 * (deadline - lo) / (hi - lo) if hi > lo else 50


#: the stacks that run every layout the planner searches (spec.runtime: no stack limits)
FULL_STACKS = ("megatron-core", "fsdp2")


def alternatives(job: Job, model: ModelSpec) -> list[dict[str, Any]]:
    """When no plan fits under the job's stacks and some of them lack a parallelism (hf: no PP ...):
    the same job under each stack that runs them all, as the fastest plan found within the budget
    and the GPU count bounds (a deadline past the budget included). Empty when every searched
    stack runs every layout (another stack would not spread the job further)."""
    searched = job.frameworks or (job.framework,)
    if not any(stack_limits(fw) for fw in searched):
        return []
    out = []
    for fw in FULL_STACKS:
        if fw in searched:
            continue
        res = search(job.model_copy(update={"framework": fw, "frameworks": ()}), model=model,
                     with_alternatives=False)
        best = (res.plans or res.unpriced or [None])[0]
        out.append({"framework": fw, "plan": best.to_dict() if best is not None else None,
                    "gpu_count": res.gpu_count})
    return out


def _key(c: Candidate, by: RankBy) -> tuple:
    t = c.total_s if c.total_s is not None else c.compute.step_time_s / c.compute.tokens_per_step
    cost = c.cost_usd if c.cost_usd is not None else math.inf
    n = c.plan.cluster.world_size
    if by == "cost":
        return (cost, t, n)
    if by == "gpus":
        return (n, t, cost)
    return (t, n, cost)


def rank(cands: list[Candidate], job: Job) -> list[Candidate]:
    """Sort by the job's criterion and mark the Pareto front over (GPUs, time, cost)."""
    out = sorted(cands, key=lambda c: _key(c, job.rank_by))
    pts = [(c.plan.cluster.world_size, _key(c, "time")[0],
            c.cost_usd if c.cost_usd is not None else math.inf) for c in out]
    for i, c in enumerate(out):
        c.pareto = not any(
            all(b <= a for a, b in zip(pts[i], q)) and q != pts[i] for q in pts
        )
    return out


class _CallableModule(types.ModuleType):
    """Lets ``trainledger.planner.search`` be both this module and the function ``search(job)``."""

    def __call__(self, job: Job, progress: Callable[[int, int], None] | None = None) -> SearchResult:
        return search(job, progress)


sys.modules[__name__].__class__ = _CallableModule
