"""What the planner is asked (``Job``): one training job, its deadline or budget, candidate hardware.

Its own module so that the search (planner/search.py) and the candidates it evaluates
(planner/candidates.py) both read it without importing each other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainledger.estimate.options import CostOptions, TimeOptions
from trainledger.load.plan import PlanInputs
from trainledger.spec.base import Spec
from trainledger.spec.recipe import Attention, Method, Optimizer, Precision
from trainledger.spec.runtime import Framework, ModelLoading, MoeDispatcher

__all__ = ["EXAMPLE_JOB", "DeadlineQuantile", "Job", "RankBy"]

RankBy = Literal["time", "cost", "gpus"]
DeadlineQuantile = Literal["estimate", "p50", "p90"]

#: the job fields the planner shares with ``PlanInputs``: declared there once, reused here as they are
_SHARED = PlanInputs.model_fields


class Job(Spec):
    """What the planner is asked: one training job, its deadline or budget, candidate hardware.

    The fields that describe the job itself (model, method, precision, ...) are the ``PlanInputs``
    fields of the same name — one declaration, one unit, one help text; the rest are the planner's.
    """

    model: str = _SHARED["model"]
    framework: Framework = _SHARED["framework"]
    liger_kernel: bool = _SHARED["liger_kernel"]
    moe_dispatcher: MoeDispatcher = _SHARED["moe_dispatcher"]
    model_loading: ModelLoading | None = _SHARED["model_loading"]
    moe_capacity_factor: float | None = _SHARED["moe_capacity_factor"]
    moe_pad_to_capacity: bool = _SHARED["moe_pad_to_capacity"]
    method: Method = _SHARED["method"]
    precision: Precision | None = _SHARED["precision"]
    optimizer: Optimizer | None = _SHARED["optimizer"]
    attention: Attention = _SHARED["attention"]
    seq_len: int = _SHARED["seq_len"]
    doc_len: int | None = _SHARED["doc_len"]
    global_batch: int | None = Field(None, gt=0, description="samples per optimizer step over all replicas [~1M tokens]")
    tokens: float | None = _SHARED["tokens"]
    deadline_days: float | None = Field(None, gt=0, description="wall-clock deadline in days")
    deadline_quantile: DeadlineQuantile = Field(
        "estimate", description="the run time the deadline is checked against: the estimate, p50 (the "
        "estimate corrected by the median of the accuracy suite's residuals for the plan's stack and "
        "GPU family) or p90, the upper end of its interval: a plan then meets the deadline unless the "
        "model is off by more than 9 runs in 10")
    max_gpus: int = Field(1024, gt=0, le=1_000_000, description="GPU budget (largest count searched)")
    gpus: tuple[str, ...] = Field((), description="candidate GPU types [all catalog GPUs]")
    gpus_per_node: tuple[int, ...] = Field((), description="node sizes [8]")
    networks: tuple[str, ...] = Field((), description="inter-node networks [ib-ndr]")
    lora_rank: int = _SHARED["lora_rank"]
    headroom: float = _SHARED["headroom"]
    host_ram_gib: float | None = _SHARED["host_ram_gib"]
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
