"""Shared pieces of the energy, cost, io, host and checkpoint sections (issue 5).

* :class:`Section` — the JSON shape of each section: headline values (canonical units), the
  inputs they came from, the terms with their sources, and notes on what is not modeled.
* :func:`run_figures` — the few figures these sections read from the time model (step time,
  run length, GPU-hours), whatever object the time model returns.
* :func:`state_bytes_per_param` and :func:`trainable_params` — bytes of training state per
  parameter under the recipe's precision policy and optimizer, and the trainable parameter count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainledger.spec.plan import Plan
from trainledger.estimate.optimizers import state_bytes_per_param as optimizer_state_per_param
from trainledger.units import DTYPE_BYTES, SECONDS_PER_HOUR
from trainledger.estimate.terms import Term
from trainledger.estimate.memo import last_call


@dataclass
class Section:
    """One section of the ledger: ``values`` hold the headline figures (also top-level JSON keys)."""

    values: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)
    terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.values)
        d["inputs"] = dict(self.inputs)
        d["terms"] = [t.to_dict() for t in self.terms]
        if self.notes:
            d["notes"] = list(self.notes)
        return d


def _num(obj: Any, *names: str) -> float | None:
    """First finite number among ``obj.<name>`` (a Term's ``.value`` is unwrapped)."""
    if obj is None:
        return None
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if v is not None and hasattr(v, "value"):
            v = v.value
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            return float(v)
    return None


@dataclass(frozen=True)
class RunFigures:
    """What the time model says about the run, in canonical units (None: not known)."""

    step_time_s: float | None
    tokens_per_s: float | None  # whole cluster
    run_s: float | None
    gpu_hours: float | None
    mfu: float | None
    busy_fraction: float
    busy_source: str

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def run_figures(plan: Plan, compute: Any = None, time: Any = None) -> RunFigures:
    """The run figures of (plan, compute, time), derived once: every section of one ledger asks
    for them with the same three objects (see :func:`_run_figures`). Only immutable inputs (the
    time model's frozen dataclasses, or None) are remembered; anything else is derived anew."""
    if not (_frozen(compute) and _frozen(time)):
        return _run_figures.__wrapped__(plan, compute, time)
    return _run_figures(plan, compute, time)


def _frozen(obj: Any) -> bool:
    params = getattr(type(obj), "__dataclass_params__", None)
    return obj is None or (params is not None and params.frozen)


@last_call
def _run_figures(plan: Plan, compute: Any = None, time: Any = None) -> RunFigures:
    """Step time, cluster tokens/s, run seconds and GPU-hours from the time model's results.

    Reads ``compute.step_time_s`` (or ``time.step_time_s``), ``compute.mfu`` and ``time.total_s``
    / ``time.gpu_hours``. When the time model gives only a step time, the run length is
    tokens / (tokens per step) × step time. The GPUs' busy fraction (used for power) is
    :func:`_busy_fraction`.
    """
    step = _num(compute, "step_time_s") or _num(time, "step_time_s")
    tokens_per_s = plan.tokens_per_step / step if step else None
    run_s = _num(time, "total_s", "run_s", "wall_s")
    tokens = plan.recipe.train_tokens
    if run_s is None and step and tokens:
        run_s = math.ceil(tokens / plan.tokens_per_step) * step
    gpu_hours = _num(time, "gpu_hours")
    if gpu_hours is None and run_s is not None:
        gpu_hours = run_s * plan.cluster.world_size / SECONDS_PER_HOUR
    busy, src = _busy_fraction(compute, step)
    return RunFigures(step, tokens_per_s, run_s, gpu_hours, _num(compute, "mfu"),
                      min(busy or 1.0, 1.0), src)


#: Parts of the time model's step breakdown during which the GPUs wait rather than compute.
IDLE_PARTS = ("comm_", "bubble", "data", "offload")


def _busy_fraction(compute: Any, step: float | None) -> tuple[float, str]:
    """Share of the step the GPUs run kernels: 1 − (exposed comm + bubble + data + offload) / step.

    Read from the time model's step breakdown (``compute.breakdown``); every other part (compute,
    optimizer, overlap contention) counts as busy. ``compute.busy_fraction`` wins when given;
    without either, 1.
    """
    given = _num(compute, "busy_fraction", "gpu_busy_fraction")
    if given:
        return min(given, 1.0), "time model (busy_fraction)"
    bd = getattr(compute, "breakdown", None)
    if isinstance(bd, dict) and step:
        idle = sum(v for k, v in bd.items() if k.startswith(IDLE_PARTS))
        return max(0.0, min(1.0 - idle / step, 1.0)), \
            "time model step breakdown: 1 - (exposed comm + bubble + data + offload) / step"
    return 1.0, "assumed 1: GPUs busy for the whole step"


def state_bytes_per_param(plan: Plan) -> dict[str, float]:
    """Bytes per trainable parameter of weights, master copy and optimizer states.

    Dtypes come from the recipe's precision policy (``recipe.PRECISION_POLICY``): e.g.
    bf16-mixed keeps fp32 weights and fp32 AdamW states (4 + 8 = 12 bytes/param), fp8-mixed
    keeps bf16 weights, an fp32 master copy and fp32 states (2 + 4 + 8 = 14 bytes/param).
    """
    pol = plan.recipe.policy
    weights = DTYPE_BYTES[pol["weights"]]
    master = 0.0 if pol["master"] == "none" else DTYPE_BYTES[pol["master"]]
    states_dtype = pol["states"]
    if plan.recipe.method in ("lora", "qlora"):  # peft keeps adapters and their states in fp32
        weights, master, states_dtype = DTYPE_BYTES["fp32"], 0.0, "fp32"  # (autocast_adapter_dtype=True)
    states = optimizer_state_per_param(plan.recipe.optimizer, states_dtype)
    return {"weights": float(weights), "master": float(master), "optimizer": float(states)}


def trainable_params(plan: Plan) -> int:
    """Parameters the optimizer updates: all of them, or the LoRA adapters.

    LoRA adds A (r × in) and B (out × r) per wrapped linear layer (Hu et al. 2021,
    arXiv:2106.09685, §4.1); the count over the model's modules is ``modules.lora_params``
    (exact for every family, fused projections and MoE experts included). Inference trains nothing.
    """
    r, m = plan.recipe, plan.model
    if r.method == "inference":
        return 0
    if r.method not in ("lora", "qlora"):
        return m.params.total
    return m.lora_params(tuple(r.lora_targets), r.lora_rank)  # spec.layers.lora_params, cached per model
