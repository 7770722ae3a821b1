"""Stage: what every section of the ledger needs, derived once per plan and handed down.

The memory, time and run sections all read the same few derived quantities: the tokens a rank
holds after context parallelism, the layers of the busiest pipeline stage, the micro-batches in
flight there, and the dtypes of the precision policy. They are computed here once per plan
(torchtitan's ``ParallelDims`` idea: resolve derived degrees once, in one typed object).

Glossary: b micro-batch, s sequence length, L layers, p pipeline degree, c context degree,
m micro-batches per step, v virtual stages.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from trainledger.spec.plan import Plan
from trainledger.units import DTYPE_BYTES


#: which pipeline rank an estimate describes: "first" (embedding, the most micro-batches in flight),
#: "last" (final norm, head, loss: one micro-batch in flight under 1F1B) or None (one stage holding
#: the worst of both, as a bound)
_ROLE: contextvars.ContextVar[str | None] = contextvars.ContextVar("trainledger_pipeline_role", default=None)


class pipeline_role:  # noqa: N801 - used as a function: ``with pipeline_role("first"):``
    """Estimate the given pipeline rank (see ``_ROLE``) inside this block. A class, not a
    ``contextlib`` generator: the memory walks enter it tens of thousands of times per search."""

    __slots__ = ("_role", "_token")

    def __init__(self, role: str | None) -> None:
        self._role = role

    def __enter__(self) -> None:
        self._token = _ROLE.set(self._role)

    def __exit__(self, *exc: object) -> None:
        _ROLE.reset(self._token)


def current_role(plan: Plan) -> str | None:
    """The pipeline rank being estimated (None without pipeline parallelism)."""
    return _ROLE.get() if plan.layout.pp > 1 else None


def inflight_microbatches(plan: Plan) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once.

    1F1B: min(p, m) (Narayanan et al. 2021, arXiv:2104.04473, §2.2.1); interleaved 1F1B with v
    chunks multiplies by 1 + (p-1)/(p·v) (Korthikanti et al. 2022, Eq. 5/6); GPipe keeps all m.
    """
    lay, r = plan.layout, plan.recipe
    p = lay.pp
    if p == 1:
        return 1.0
    m = lay.pp_microbatches or r.grad_accum
    if lay.pp_schedule == "gpipe":
        return float(m)
    if current_role(plan) == "last":
        # 1F1B: the last stage runs each backward right after its forward. Interleaved with v chunks
        # its warm-up holds (v-1)·p chunk forwards (Megatron-LM schedules.py
        # ``forward_backward_pipelining_with_interleaving``: num_warmup_microbatches =
        # (p - rank - 1)·2 + (v - 1)·p), each 1/v of the stage's layers, plus the one in flight
        if lay.pp_schedule == "interleaved" and lay.vp > 1:
            return min(float(m), ((lay.vp - 1) * p + 1) / lay.vp)
        return 1.0
    n = float(min(p, m))
    if lay.pp_schedule == "interleaved" and lay.vp > 1:
        # Megatron's warm-up holds min((p - rank - 1)·2 + (v - 1)·p, m·v) chunk forwards
        # (schedules.py ``forward_backward_pipelining_with_interleaving``): with few micro-batches
        # (m·v below the warm-up) every chunk of every micro-batch is in flight, m stages' worth
        n = min(n * (1 + (p - 1) / (p * lay.vp)), float(m))
    return n


@dataclass(frozen=True, slots=True)
class Stage:
    """Per-plan derived quantities of the busiest rank (first pipeline stage)."""

    seq_per_rank: float           # s / c: tokens of one sample on this rank
    tokens_per_micro_batch: float  # b · s / c
    layers: int                   # decoder layers on the busiest pipeline stage: ceil(L / p)
    moe_layers: int               # of which MoE layers
    inflight: float               # micro-batches alive at once on the first stage
    compute_bytes: float          # bytes per element of activations (compute dtype)
    weight_bytes: float
    grad_bytes: float

    @classmethod
    def of(cls, plan: Plan) -> "Stage":
        """The stage of ``plan`` (cached per plan object and pipeline role: the planner and the
        memory model ask many times, a pipeline plan for its first and its last stage in turn)."""
        key = (id(plan), current_role(plan))
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is plan:
            return hit[1]
        if len(_CACHE) > 4096:
            _CACHE.clear()
        st = cls._derive(plan)
        _CACHE[key] = (plan, st)
        return st

    @classmethod
    def _derive(cls, plan: Plan) -> "Stage":
        m, r, lay = plan.model, plan.recipe, plan.layout
        layers = -(-m.num_layers // lay.pp)
        n_moe_total = sum(m.moe_layer_mask) if m.moe else 0  # is_moe_layer(i) of every layer
        moe_layers = min(layers, -(-n_moe_total // lay.pp)) if n_moe_total else 0
        pol = r.policy
        return cls(seq_per_rank=r.seq_len / lay.cp, tokens_per_micro_batch=r.micro_batch * r.seq_len / lay.cp,
                   layers=layers, moe_layers=moe_layers, inflight=inflight_microbatches(plan),
                   compute_bytes=float(DTYPE_BYTES.get(pol["compute"], 2)),
                   weight_bytes=float(DTYPE_BYTES[pol["weights"]]), grad_bytes=float(DTYPE_BYTES[pol["grads"]]))


_CACHE: dict[tuple[int, str | None], tuple[Plan, Stage]] = {}


def layers_on_stage(plan: Plan) -> tuple[int, int]:
    """(decoder layers, MoE layers) on the busiest pipeline stage."""
    st = Stage.of(plan)
    return st.layers, st.moe_layers
