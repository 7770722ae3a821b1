"""The planner: enumerate layouts and hardware for a job, keep what fits, rank it (issue 4).

For every candidate GPU type × node size × network and every GPU count (1, 2, 4 ... a node,
then whole nodes doubling up to ``max_gpus``) the search walks tensor-parallel degrees (within a
node) and pipeline degrees (ascending, stopping at the first that fits), and for each tries the
memory-saving knobs in order of cost — ZeRO-1, full recomputation, ZeRO-3, optimizer offload —
with the largest micro-batch that fits. Pruning:

* a lower bound of the model states (16-bit weights + fp32 master/Adam states, fully sharded over
  all n GPUs) rejects GPU counts that cannot hold the model before any layout is built;
* memory grows with the micro-batch, so micro-batches are bisected;
* if the most memory-saving setting does not fit, the (TP, PP) pair is dropped at once.

Every infeasible candidate comes back as ``Rejected(plan, reason)``. The GPU count of a job is
the larger of the memory bound (fewest GPUs that hold it) and the deadline bound (fewest that finish
the token budget in time, counting the expected interruptions, checkpoints and restarts of
``estimate/goodput.py``); both are reported.
"""

from __future__ import annotations

import math
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from trainledger.spec.base import Spec
from trainledger.load.catalog import load_gpu, load_network, names
from trainledger.spec.cluster import Cluster, GpuSpec, NetworkSpec
from trainledger.errors import CatalogError, PlanError, TrainledgerError
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.options import CostOptions, MemoryOptions, TimeOptions
from trainledger.estimate.time import ComputeEstimate, TimeEstimate, estimate_compute, estimate_time
from trainledger.load.hf import load_model
from trainledger.spec.layout import Layout
from trainledger.spec.model import ModelSpec
from trainledger.spec.plan import Plan
from trainledger.load.plan import PlanInputs
from trainledger.spec.recipe import Attention, Method, Optimizer, Precision, Recipe
from trainledger.spec.runtime import Framework
from trainledger.units import GIB, SECONDS_PER_DAY

RankBy = Literal["time", "cost", "gpus"]

#: thresholds of the risks a recommended plan lists (issue 4)
RISK_HEADROOM = 0.15
#: within this share of capacity the caching allocator starts to retry (cudaMalloc retries)
RISK_ALLOCATOR = 0.03
RISK_BUBBLE = 0.20
RISK_EXPOSED_COMM = 0.30

_KNOBS: tuple[tuple[int, str, str], ...] = (  # (zero, recompute, offload), cheapest first
    (1, "none", "none"), (1, "full", "none"), (3, "none", "none"), (3, "full", "none"),
    (3, "full", "optimizer"),
)


#: the job fields the planner shares with ``PlanInputs``: declared there once, reused here as they are
_SHARED = PlanInputs.model_fields


class Job(Spec):
    """What the planner is asked: one training job, its deadline or budget, candidate hardware.

    The fields that describe the job itself (model, method, precision, ...) are the ``PlanInputs``
    fields of the same name — one declaration, one unit, one help text; the rest are the planner's.
    """

    model: str = _SHARED["model"]
    framework: Framework = _SHARED["framework"]
    method: Method = _SHARED["method"]
    precision: Precision | None = _SHARED["precision"]
    optimizer: Optimizer = _SHARED["optimizer"]
    attention: Attention = _SHARED["attention"]
    seq_len: int = _SHARED["seq_len"]
    global_batch: int | None = Field(None, gt=0, description="samples per optimizer step over all replicas [~1M tokens]")
    tokens: float | None = _SHARED["tokens"]
    deadline_days: float | None = Field(None, gt=0, description="wall-clock deadline in days")
    max_gpus: int = Field(1024, gt=0, le=1_000_000, description="GPU budget (largest count searched)")
    gpus: tuple[str, ...] = Field((), description="candidate GPU types [all catalog GPUs]")
    gpus_per_node: tuple[int, ...] = Field((), description="node sizes [8]")
    networks: tuple[str, ...] = Field((), description="inter-node networks [ib-ndr]")
    lora_rank: int = _SHARED["lora_rank"]
    headroom: float = _SHARED["headroom"]
    rank_by: RankBy = Field("time", description="rank plans by time, cost or GPU count")
    top: int = Field(10, gt=0, le=1000, description="plans to show")
    time_options: TimeOptions = TimeOptions()
    cost_options: CostOptions = CostOptions()
    batch_rounding: float = Field(
        0.25, ge=0.0, le=0.5, description="the planner may round the global batch to a multiple of "
        "micro-batch x DP by up to this share, so that any whole-node GPU count can run the job "
        "(0 = exactly the batch given)")
    frameworks: tuple[Framework, ...] = Field(
        (), description="software stacks the planner compares (a layout is a stack plus degrees) "
        "[the job's framework]")


#: the built-in example job (README main job; ``trainledger plan`` with no arguments)
EXAMPLE_JOB = Job(model="llama-3.1-8b", method="full", tokens=20e9, deadline_days=7.0,
                  seq_len=4096, global_batch=256, max_gpus=64, rank_by="cost")


@dataclass(frozen=True)
class Rejected:
    """A candidate that cannot run, and why (the plan is None when none could be built)."""

    plan: Plan | None
    reason: str
    gpu: str = ""
    gpus: int = 0
    framework: str = ""

    def to_dict(self) -> dict[str, Any]:
        fw = self.framework or (self.plan.runtime.framework if self.plan is not None else "")
        d: dict[str, Any] = {"gpu": self.gpu, "gpus": self.gpus, "framework": fw,
                             "reason": f"{fw}: {self.reason}" if fw else self.reason}
        if self.plan is not None:
            d["layout"] = layout_dict(self.plan)
        return d


@dataclass
class Candidate:
    """A plan that fits, with its estimate summary and risks."""

    plan: Plan
    memory: Any
    compute: ComputeEstimate
    time: TimeEstimate | None
    usd_per_gpu_hour: float | None
    risks: list[str] = field(default_factory=list)
    pareto: bool = False
    wall_factor: float | None = None  # T_w / T_s with interruptions (estimate/goodput.py), set by the deadline check

    @property
    def total_s(self) -> float | None:
        return self.time.total_s if self.time else None

    def wall_s(self, options: CostOptions | None = None) -> float | None:
        """Goodput-adjusted wall-clock time of the run: failure-free time × T_w/T_s (Daly 2006)."""
        if self.total_s is None:
            return None
        if self.wall_factor is None:
            from trainledger.estimate.run.goodput import wall_factor

            self.wall_factor = wall_factor(self.plan, options)
        return self.total_s * self.wall_factor

    @property
    def cost_usd(self) -> float | None:
        if self.usd_per_gpu_hour is None or self.time is None:
            return None
        return self.time.gpu_hours * self.usd_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        c, m = self.compute, self.memory
        d: dict[str, Any] = {
            "gpu": self.plan.cluster.gpu.name, "gpus": self.plan.cluster.world_size,
            "framework": self.plan.runtime.framework,
            "nodes": self.plan.cluster.nodes, "network": self.plan.cluster.inter.name
            if self.plan.cluster.inter else None,
            "layout": layout_dict(self.plan),
            "estimate": {
                "memory_gib": m.device_total_bytes / GIB, "usable_gib": m.usable_bytes / GIB,
                "headroom_left": 1 - m.device_total_bytes / m.usable_bytes,
                "step_time_s": c.step_time_s, "tokens_per_s": c.tokens_per_s,
                "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "mfu": c.mfu, "hfu": c.hfu,
                "bubble_fraction": c.bubble_fraction, "exposed_comm_fraction": c.exposed_comm_fraction,
                "breakdown": c.breakdown,
            },
            "risks": list(self.risks), "pareto": self.pareto,
        }
        if self.time is not None:
            d["estimate"].update(total_s=self.time.total_s, days=self.time.days,
                                 gpu_hours=self.time.gpu_hours)
            if self.wall_factor is not None:
                d["estimate"].update(goodput=1 / self.wall_factor, days_with_failures=self.time.days * self.wall_factor)
            if self.time.interval:
                lo, hi = self.time.interval["factor_p10"], self.time.interval["factor_p90"]
                d["estimate"]["days_interval"] = [self.time.days * lo, self.time.days * hi]
                if self.cost_usd is not None:
                    d["estimate"]["cost_usd_interval"] = [self.cost_usd * lo, self.cost_usd * hi]
                d["estimate"]["mfu_interval"] = [c.mfu / hi, c.mfu / lo]
                d["estimate"]["interval_basis"] = self.time.interval["basis"]
        if self.usd_per_gpu_hour is not None:
            d["estimate"]["usd_per_gpu_hour"] = self.usd_per_gpu_hour
            d["estimate"]["cost_usd"] = self.cost_usd
        return d


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

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job.model_dump(mode="json"), "plans": [p.to_dict() for p in self.plans],
                "unpriced": [p.to_dict() for p in self.unpriced],
                "unpriced_gpus": sorted({p.plan.cluster.gpu.name for p in self.unpriced}),
                "rejected": [r.to_dict() for r in self.rejected], "evaluated": self.evaluated,
                "elapsed_s": self.elapsed_s, "gpu_count": self.gpu_count,
                "plans_per_s": self.evaluated / self.elapsed_s if self.elapsed_s else None}

    def __repr__(self) -> str:  # notebook views: trainledger.report.notebook
        from trainledger.report.notebook import search_repr

        return search_repr(self)

    def _repr_html_(self) -> str:
        from trainledger.report.notebook import search_html

        return search_html(self)

    def to_pandas(self) -> Any:
        """One row per ranked plan (needs pandas)."""
        from trainledger.report.notebook import search_frame

        return search_frame(self)


def layout_dict(plan: Plan) -> dict[str, Any]:
    lay, r = plan.layout, plan.recipe
    return {"framework": plan.runtime.framework, "global_batch": plan.global_batch, "dp": lay.dp_size, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "vp": lay.vp,
            "zero": lay.zero, "offload": lay.offload, "micro_batch": r.micro_batch,
            "grad_accum": r.grad_accum, "recompute": r.recompute, "sp": lay.sp}


def plan_risks(plan: Plan, mem: Any, comp: ComputeEstimate) -> list[str]:
    """Risks of a plan that fits: thin headroom, TP over slow links, Ethernet, bubble, comm."""
    out = []
    cl, lay = plan.cluster, plan.layout
    left = 1 - mem.device_total_bytes / mem.usable_bytes
    if left < RISK_ALLOCATOR:
        out.append(f"headroom {100 * left:.1f}% < {100 * RISK_ALLOCATOR:.0f}%: the caching allocator "
                   "will retry (free its cache and synchronize); FSDP steps measured 38% slower with "
                   "46 cudaMalloc retries (pytorch/pytorch#104509) - the step time does not include it")
    elif left < RISK_HEADROOM:
        out.append(f"headroom {100 * left:.0f}% < {100 * RISK_HEADROOM:.0f}%: allocator fragmentation "
                   "or a longer sample can run out of memory")
    if lay.tp > cl.gpus_per_node:
        out.append(f"TP={lay.tp} spans nodes: every layer's collectives cross the network")
    elif lay.tp > 1 and cl.intra.kind == "pcie":
        out.append(f"TP={lay.tp} over PCIe without NVLink: per-layer all-reduces are slow")
    if cl.nodes > 1 and cl.inter is not None and cl.inter.kind == "ethernet":
        out.append(f"multi-node over Ethernet ({cl.inter.name}) without RDMA")
    if comp.bubble_fraction > RISK_BUBBLE:
        out.append(f"pipeline bubble {100 * comp.bubble_fraction:.0f}% of the step > "
                   f"{100 * RISK_BUBBLE:.0f}%")
    if comp.exposed_comm_fraction > RISK_EXPOSED_COMM:
        out.append(f"exposed communication {100 * comp.exposed_comm_fraction:.0f}% of the step > "
                   f"{100 * RISK_EXPOSED_COMM:.0f}%")
    return out


def default_global_batch(job: Job) -> int:
    """About 1M tokens per step (4M for pre-training), as a power of two number of samples."""
    target = (4 if job.method == "pretrain" else 1) * 2**20 / job.seq_len
    return 2 ** max(0, round(math.log2(max(1.0, target))))


def _usd_per_gpu_hour(gpu: str, opts: CostOptions | None = None) -> float | None:
    """Price per GPU-hour from the cost flags, else the cheapest catalog on-demand price."""
    from trainledger.estimate.run.cost import usd_per_gpu_hour

    return usd_per_gpu_hour(gpu, opts)


def gpu_counts(per_node: int, max_gpus: int) -> list[int]:
    """The coarse grid: 1, 2, 4 ... up to a node (partial nodes for small jobs), then whole nodes
    doubling, and the largest whole-node count within ``max_gpus`` (so a budget of 800 is tried).

    The deadline bound is refined between two grid points at node granularity
    (:func:`trainledger.planner.space.run_search`), so any whole-node count can be the answer.
    """
    out, n = [], 1
    while n < per_node and n <= max_gpus:
        out.append(n)
        n *= 2
    n = per_node
    while n <= max_gpus:
        out.append(n)
        n *= 2
    top = (max_gpus // per_node) * per_node
    if top >= per_node and top not in out:
        out.append(top)
    return out


def _state_bytes_lower_bound(model: ModelSpec, recipe: Recipe) -> float:
    """Bytes of weights + trainable states of the whole model (sharded perfectly, nothing else)."""
    p = model.params.total
    if recipe.method in ("lora", "qlora"):
        return p * (0.5 if recipe.method == "qlora" else 2.0)
    if not recipe.is_training:
        return p * 2.0
    return p * 16.0 if recipe.precision.endswith("mixed") else p * 8.0


from trainledger.planner.space import Space, run_search  # noqa: E402  (the enumeration lives there)

__all__ = ["Job", "EXAMPLE_JOB", "Rejected", "Candidate", "SearchResult", "search", "Space"]


def search(job: Job, progress: Callable[[int, int], None] | None = None,
           model: ModelSpec | None = None) -> SearchResult:
    """Plan ``job``: enumerate, prune, estimate, rank (see the module docstring).

    ``model`` replaces ``job.model`` (e.g. a config.json the web app parsed from a request body).
    """
    t0 = time.perf_counter()
    model = model or load_model(job.model)
    gb = job.global_batch or default_global_batch(job)
    try:
        from trainledger.spec.precision import default_precision  # None: the method's default, as estimate resolves it

        precision = job.precision or default_precision(job.method, model, None)[0]
        job = job.model_copy(update={"precision": precision})  # the result states the policy used
        recipe = Recipe(method=job.method, precision=precision, optimizer=job.optimizer,
                        seq_len=job.seq_len, micro_batch=1, global_batch=gb,
                        attention=job.attention, lora_rank=job.lora_rank, train_tokens=job.tokens)
    except Exception as exc:  # pydantic validation of the job's recipe fields
        raise PlanError(f"plan: {exc}") from None
    gpus = [load_gpu(g) for g in (job.gpus or tuple(names("gpus")))]
    nets = [load_network(n) for n in (job.networks or ("ib-ndr",))]
    sizes = job.gpus_per_node or (8,)
    space = Space(job=job, model=model, recipe=recipe, global_batch=gb,
                  lower_bound=_state_bytes_lower_bound(model, recipe))
    configs = [(g, s, n, fw) for g in gpus for s in sizes for n in nets
               for fw in (job.frameworks or (job.framework,))]
    cands, rejected, evaluated, counts = run_search(space, configs, progress)
    unpriced: list[Candidate] = []
    if job.rank_by == "cost":  # no price is no rank: list those plans apart instead of ranking them by time
        unpriced = sorted((c for c in cands if c.cost_usd is None),
                          key=lambda c: (c.plan.cluster.gpu.name, c.plan.cluster.world_size))
        cands = [c for c in cands if c.cost_usd is not None]
    ranked = rank(cands, job)
    return SearchResult(job=job, plans=ranked[: job.top], rejected=rejected, evaluated=evaluated,
                        elapsed_s=time.perf_counter() - t0, gpu_count=counts, unpriced=unpriced[: job.top])


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


def _cluster(gpu: GpuSpec, per_node: int, n: int, net: NetworkSpec) -> Cluster:
    size = min(per_node, n)
    nodes = n // size
    intra = load_network(gpu.link)
    return Cluster(gpu=gpu, gpus_per_node=size, nodes=nodes, intra=intra,
                   inter=net if nodes > 1 else None, nics_per_node=min(size, 8))


def memory_options() -> MemoryOptions:
    return MemoryOptions(suggestions=False)


def evaluate(plan: Plan, job: Job, mem: Any | None = None) -> Candidate:
    """Estimate one plan that fits: memory, compute, time, price, risks."""
    mem = mem or estimate_memory(plan, memory_options(), suggest=False)
    comp = estimate_compute(plan, job.time_options)
    tm = estimate_time(plan, comp)
    return Candidate(plan=plan, memory=mem, compute=comp, time=tm,
                     usd_per_gpu_hour=_usd_cached(plan.cluster.gpu.name, job.cost_options),
                     risks=plan_risks(plan, mem, comp))


_USD: dict[tuple[str, CostOptions], float | None] = {}


def _usd_cached(gpu: str, opts: CostOptions) -> float | None:
    if (gpu, opts) not in _USD:
        _USD[(gpu, opts)] = _usd_per_gpu_hour(gpu, opts)
    return _USD[(gpu, opts)]


def _deadline_s(job: Job) -> float | None:
    return job.deadline_days * SECONDS_PER_DAY if job.deadline_days else None


def _layout(tp: int, pp: int, dp: int, zero: int, offload: str, vp: int = 1, cp: int = 1,
            ep: int = 1) -> Layout:
    return Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, zero=zero, offload=offload, sp=tp > 1,
                  pp_schedule="interleaved" if vp > 1 else "1f1b")


def _catalog_error_reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, (CatalogError, TrainledgerError)) else repr(exc)


class _CallableModule(types.ModuleType):
    """Lets ``trainledger.planner.search`` be both this module and the function ``search(job)``."""

    def __call__(self, job: Job, progress: Callable[[int, int], None] | None = None) -> SearchResult:
        return search(job, progress)


sys.modules[__name__].__class__ = _CallableModule
