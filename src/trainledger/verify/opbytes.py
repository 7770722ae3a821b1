"""HBM bytes of the ops torch dispatches, counted from their schemas (needs torch).

The time model's streaming terms are byte counts; this mode recounts them on the installed torch,
transformers and peft: each op reads its tensor arguments (each distinct tensor once) and writes the
arguments its schema marks mutable and the fresh tensors it returns. Views (returns aliasing an
input, no mutation) and ops that make no tensor move nothing. Used by ``bench/elementwise_bytes.py``
and by the tests that hold the model's byte constants to torch.

    with OpBytes() as ob:
        ob.phase = "forward"
        ...
    ob.by_op["mul (forward)"], ob.total("elementwise")
"""

from __future__ import annotations

from typing import Any

from trainledger.verify.build import require

#: GEMMs: the matmul term, not streaming bytes
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
#: ops whose schema returns no alias annotation but which return a view (no kernel runs)
NO_COPY_OPS = frozenset({"_unsafe_view", "_reshape_alias", "lift_fresh"})
LOSS_OPS = frozenset({"_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
                      "nll_loss2d_forward", "nll_loss2d_backward"})
EMBEDDING_OPS = frozenset({"embedding", "embedding_dense_backward"})


def term_of(op: str, phase: str) -> str:
    """The time model's term an op's bytes belong to."""
    if phase in ("optimizer", "zero_grad"):
        return "optimizer"
    if op in GEMM_OPS:
        return "matmul"
    if "scaled_dot_product" in op or "flash_attention" in op or "efficient_attention" in op:
        return "attention"
    if op in LOSS_OPS:
        return "loss"
    if op in EMBEDDING_OPS:
        return "embedding"
    return "elementwise"


def _mode_base() -> Any:
    require("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class OpBytes(_mode_base()):  # type: ignore[misc]
    """A dispatch mode that sums each op's bytes by term and by ``"op (phase)"``."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.on = True
        self.terms: dict[str, float] = {}
        self.by_op: dict[str, float] = {}

    def total(self, term: str) -> float:
        return self.terms.get(term, 0.0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's protocol)
        import torch

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.on:
            return out
        schema = func._schema
        rets = schema.returns
        name = schema.name.split("::")[-1]
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        outs = out if isinstance(out, (list, tuple)) and len(rets) > 1 else [out]
        fresh = [o for r, o in zip(rets, outs) if r.alias_info is None and isinstance(o, torch.Tensor)]
        if not mutates and (not fresh or name in NO_COPY_OPS):
            return out

        def tensors(v: Any) -> list[Any]:
            vs = v if isinstance(v, (list, tuple)) else [v]
            return [t for t in vs if isinstance(t, torch.Tensor)]

        given = {a.name: (args[i] if i < len(args) else kwargs.get(a.name)) for i, a in enumerate(schema.arguments)}
        reads = {id(t): t.numel() * t.element_size() for a in schema.arguments for t in tensors(given[a.name])}
        written = sum(t.numel() * t.element_size() for a in schema.arguments
                      if a.alias_info is not None and a.alias_info.is_write for t in tensors(given[a.name]))
        written += sum(t.numel() * t.element_size() for t in fresh)
        total = sum(reads.values()) + written
        term = term_of(name, self.phase)
        self.terms[term] = self.terms.get(term, 0.0) + total
        if term == "elementwise":
            key = f"{name} ({self.phase})"
            self.by_op[key] = self.by_op.get(key, 0.0) + total
        return out
