"""One candidate of the planner: build its cluster and layout, estimate it, list its risks.

The search (:mod:`trainledger.planner.search`) and the enumeration of layouts
(:mod:`trainledger.planner.space`) both build on this module: a candidate is a ``Plan`` that fits
(:class:`Candidate`, with its memory, step time, run time, price and risks) or one that does not
(:class:`Rejected`, with the reason, naming its runtime).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainledger.errors import CatalogError, TrainledgerError
from trainledger.estimate.memory import estimate_memory, fit_bytes
from trainledger.estimate.options import CostOptions, MemoryOptions
from trainledger.estimate.run.cost import usd_per_gpu_hour
from trainledger.estimate.stage import pipeline_role
from trainledger.estimate.time import ComputeEstimate, TimeEstimate, estimate_compute, estimate_time
from trainledger.load.plan import host_ram, own_link
from trainledger.spec.cluster import Cluster, GpuSpec, NetworkSpec
from trainledger.spec.layout import Layout
from trainledger.spec.plan import Plan
from trainledger.units import GIB, SECONDS_PER_DAY

if TYPE_CHECKING:
    from trainledger.planner.job import Job

#: thresholds of the risks a recommended plan lists (issue 4)
RISK_HEADROOM = 0.15
#: within this share of capacity the caching allocator starts to retry (cudaMalloc retries)
RISK_ALLOCATOR = 0.03
RISK_BUBBLE = 0.20
RISK_EXPOSED_COMM = 0.30

KNOBS: tuple[tuple[int, str, str], ...] = (  # (zero, recompute, offload), cheapest first
    (1, "none", "none"), (1, "selective", "none"), (1, "full", "none"),
    (2, "none", "none"), (2, "selective", "none"), (2, "full", "none"),
    # ZeRO-Offload's own setting (Ren et al. 2021, arXiv:2101.06840: ZeRO-2 with the optimizer on
    # the host): the 16-bit parameters stay whole, so wherever they fit there are no per-layer
    # gathers as with ZeRO-3 and offload (4 L40S, a 13B: 2.6% faster, bench/plan_optimality.py)
    (2, "none", "optimizer"), (2, "selective", "optimizer"), (2, "full", "optimizer"),
    (3, "none", "none"), (3, "selective", "none"), (3, "full", "none"),
    (3, "none", "optimizer"), (3, "selective", "optimizer"), (3, "full", "optimizer"),
)


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
    compute: ComputeEstimate
    time: TimeEstimate | None
    usd_per_gpu_hour: float | None
    risks: list[str] = field(default_factory=list)
    pareto: bool = False
    wall_factor: float | None = None  # T_w / T_s with interruptions (estimate/run/goodput.py), set by the deadline check
    #: the plan's memory estimate, built when first read (``memory``): a search measures thousands
    #: of candidates, decides and ranks them by their fit figures and step times, and shows a few
    memory_estimate: Any = field(default=None, repr=False)

    @property
    def memory(self) -> Any:
        """The plan's full memory estimate (terms, phases, timeline, notes)."""
        if self.memory_estimate is None:
            with pipeline_role(None):  # the whole plan (the busier stage), wherever it is read
                self.memory_estimate = estimate_memory(self.plan, memory_options(), suggest=False)
        return self.memory_estimate

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
            "framework": self.plan.runtime.framework, "optimizer": self.plan.recipe.optimizer,
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


def layout_dict(plan: Plan) -> dict[str, Any]:
    lay, r = plan.layout, plan.recipe
    return {"framework": plan.runtime.framework, "global_batch": plan.global_batch, "dp": lay.dp_size, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "vp": lay.vp,
            "zero": lay.zero, "offload": lay.offload, "micro_batch": r.micro_batch,
            "grad_accum": r.grad_accum, "recompute": r.recompute, "sp": lay.sp}


def plan_risks(plan: Plan, device_total: int, comp: ComputeEstimate) -> list[str]:
    """Risks of a plan that fits (``device_total``: its device bytes, ``MemoryEstimate.
    device_total_bytes``): thin headroom, TP over slow links, Ethernet, bubble, comm."""
    out = []
    cl, lay = plan.cluster, plan.layout
    left = 1 - device_total / cl.gpu.usable_bytes
    if left < RISK_ALLOCATOR:
        out.append(f"headroom {100 * left:.1f}% < {100 * RISK_ALLOCATOR:.0f}%: the caching allocator "
                   "will retry (free its cache and synchronize); FSDP steps measured 38% slower with "
                   "46 cudaMalloc retries (pytorch/pytorch#104509) - the step time does not include it")
    elif left < RISK_HEADROOM:
        out.append(f"headroom {100 * left:.1f}% < {100 * RISK_HEADROOM:.0f}%: allocator fragmentation "
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


def cluster_for(gpu: GpuSpec, per_node: int, n: int, net: NetworkSpec,
                host_ram_gib: float | None = None) -> Cluster:
    size = min(per_node, n)
    nodes = n // size
    intra = own_link(gpu, size)
    return Cluster(gpu=gpu, gpus_per_node=size, nodes=nodes, intra=intra,
                   inter=net if nodes > 1 else None, nics_per_node=min(size, 8),
                   **host_ram(gpu, host_ram_gib))


#: the planner's memory options (frozen: one instance serves every plan it measures)
_MEMORY_OPTIONS = MemoryOptions(suggestions=False)


def memory_options() -> MemoryOptions:
    return _MEMORY_OPTIONS


def evaluate(plan: Plan, job: Job, device_total: int | None = None) -> Candidate:
    """Estimate one plan that fits: compute, time, price, risks (its memory estimate when read).
    ``device_total``: the device bytes its memory estimate reports, when the caller has them."""
    total = fit_bytes(plan, memory_options())[1] if device_total is None else device_total
    comp = estimate_compute(plan, job.time_options)
    tm = estimate_time(plan, comp)
    return Candidate(plan=plan, compute=comp, time=tm,
                     usd_per_gpu_hour=cached_usd_per_gpu_hour(plan.cluster.gpu.name, job.cost_options),
                     risks=plan_risks(plan, total, comp))


_USD: dict[tuple[str, CostOptions], float | None] = {}


def cached_usd_per_gpu_hour(gpu: str, opts: CostOptions) -> float | None:
    if (gpu, opts) not in _USD:
        _USD[(gpu, opts)] = usd_per_gpu_hour(gpu, opts)
    return _USD[(gpu, opts)]


def deadline_s(job: Job) -> float | None:
    return job.deadline_days * SECONDS_PER_DAY if job.deadline_days else None


def deadline_wall_s(c: Candidate, job: Job) -> float | None:
    """The run's wall time with interruptions that the job's deadline is checked against: the
    estimate's, or with ``Job.deadline_quantile`` p50 / p90 the median / upper end of its interval
    (the time estimate's ``interval``, estimate/time/intervals.py). None without a token budget."""
    wall = c.wall_s(job.cost_options)
    iv = c.time.interval if c.time is not None else None
    if wall is None or job.deadline_quantile == "estimate" or not iv:
        return wall
    return wall * iv[f"factor_{job.deadline_quantile}"]


def layout_for(tp: int, pp: int, dp: int, zero: int, offload: str, vp: int = 1, cp: int = 1,
            ep: int = 1) -> Layout:
    return Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, zero=zero, offload=offload, sp=tp > 1,
                  pp_schedule="interleaved" if vp > 1 else "1f1b")


def catalog_error_reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, (CatalogError, TrainledgerError)) else repr(exc)
