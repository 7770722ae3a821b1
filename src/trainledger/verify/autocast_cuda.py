"""CUDA's autocast policy, emulated on top of CPU autocast (for cpu and fake measurements).

``torch.autocast("cpu")`` and ``torch.autocast("cuda")`` share the list of ops that run in lower
precision (matmuls, linear, SDPA) but not the list of ops that run in fp32. CUDA casts the inputs
of these ops to fp32 (so their outputs are fp32 and take twice the memory), CPU leaves them in
bf16. Source of the CUDA lists: ATen/autocast_mode.h in torch 2.13, ``AT_FORALL_FP32`` (inputs
cast to fp32) and ``AT_FORALL_FP32_SET_OPT_DTYPE`` (run with ``dtype=float32`` unless the caller
gave a dtype); checked on CPU: layer_norm, softmax, log_softmax, pow, sum, exp and rsqrt of a
bf16 tensor stay bf16 under CPU autocast.

:class:`CudaAutocastPolicy` is a ``TorchFunctionMode`` that applies CUDA's two fp32 policies to
the Python-level calls of those ops while CPU autocast is on. Calls made from inside C++
composite ops (e.g. the softmax inside SDPA's math fallback) are not seen: the emulation covers
what model code calls directly, which is where transformers' models use these ops.
"""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode

_LOWER = None  # set lazily: (torch.bfloat16, torch.float16)


def _fp32_funcs() -> set[Any]:
    """Python entry points of ATen ops in CUDA's AT_FORALL_FP32 list (the LLM-relevant ones)."""
    import torch
    import torch.nn.functional as F

    T = torch.Tensor
    names = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
             "reciprocal", "rsqrt", "sinh", "tan", "pow", "logsumexp", "dist", "renorm")
    funcs: set[Any] = set()
    for n in names:
        for owner in (torch, T):
            f = getattr(owner, n, None)
            if f is not None:
                funcs.add(f)
    funcs |= {T.__pow__, T.__rpow__, torch.layer_norm, torch.group_norm, torch.cdist, torch.pdist,
              torch.cosine_similarity, F.layer_norm, F.group_norm, F.softplus, F.nll_loss, F.kl_div,
              F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.mse_loss, F.cosine_similarity,
              F.binary_cross_entropy_with_logits, F.margin_ranking_loss, F.poisson_nll_loss,
              F.cosine_embedding_loss, F.hinge_embedding_loss, F.soft_margin_loss,
              F.multilabel_margin_loss, F.triplet_margin_loss, F.multi_margin_loss}
    if hasattr(F, "rms_norm"):
        funcs |= {F.rms_norm, torch.rms_norm}
    return funcs


def _opt_dtype_funcs() -> set[Any]:
    """Python entry points of CUDA's AT_FORALL_FP32_SET_OPT_DTYPE ops."""
    import torch
    import torch.nn.functional as F

    T = torch.Tensor
    funcs = {F.softmax, F.log_softmax}
    for n in ("softmax", "log_softmax", "prod", "cumprod", "cumsum", "sum"):
        funcs |= {getattr(torch, n), getattr(T, n)}
    funcs |= {torch.linalg.vector_norm, torch.linalg.matrix_norm}
    return funcs


class CudaAutocastPolicy(TorchFunctionMode):
    """Make CPU autocast behave like CUDA autocast for CUDA's fp32 op lists (see module doc)."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.fp32 = _fp32_funcs()
        self.opt_dtype = _opt_dtype_funcs()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        import torch

        kwargs = kwargs or {}
        if not torch.is_autocast_enabled(self.device_type):
            return func(*args, **kwargs)
        if func in self.fp32:
            args = tuple(_to_fp32(a) for a in args)
            kwargs = {k: _to_fp32(v) for k, v in kwargs.items()}
        elif func in self.opt_dtype and kwargs.get("dtype") is None and _first_is_lower(args):
            if func in (torch.nn.functional.softmax, torch.nn.functional.log_softmax) and len(args) > 3:
                pass  # dtype passed positionally (F.softmax(x, dim, _stacklevel, dtype))
            else:
                kwargs = dict(kwargs, dtype=torch.float32)
        return func(*args, **kwargs)


def _lower() -> tuple[Any, ...]:
    global _LOWER
    if _LOWER is None:
        import torch

        _LOWER = (torch.bfloat16, torch.float16)
    return _LOWER


def _to_fp32(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor) and x.dtype in _lower():
        return x.to(torch.float32)
    if isinstance(x, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in x):
        return type(x)(_to_fp32(t) for t in x)
    return x


def _first_is_lower(args: tuple) -> bool:
    import torch

    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].dtype in _lower()
