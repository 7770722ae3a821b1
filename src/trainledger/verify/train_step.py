"""Run training (or inference) steps of a built model the way the recipe says.

One training step = ``grad_accum`` × (forward, backward) + optimizer step + zero_grad, as the
Hugging Face Trainer does it:

* forward: ``model(input_ids=ids, labels=ids, use_cache=False)`` under the precision's autocast,
  so the loss path is transformers' own (``ForCausalLMLoss`` upcasts the logits to fp32); the
  outputs are dropped after taking the loss (Trainer keeps only the loss);
* backward: ``(loss / grad_accum).backward()`` (scaled by a GradScaler for fp16-mixed);
* optimizer: ``clip_grad_norm_(trainable, recipe.grad_clip, foreach=True)`` when clipping is on,
  then ``optimizer.step()``;
* zero_grad: ``optimizer.zero_grad(set_to_none=True)``.

Optimizers, each with CUDA's defaults forced on every device:
``adamw`` torch AdamW ``foreach=True`` (its step allocates sqrt(v) as large as the trainable
parameters); ``adamw-fused`` ``fused=True`` (torch >= 2.4 has a CPU kernel); ``adamw-loop``
``foreach=False`` (a per-tensor loop: two temporaries of one tensor at a time); ``sgd`` plain SGD
``foreach=True``; ``sgd-momentum`` momentum 0.9; ``adafactor`` transformers' Adafactor with
``scale_parameter=False, relative_step=False, lr=1e-3`` (what Trainer's ``optim="adafactor"`` uses);
``lion`` the update of Chen et al. 2023 (arXiv:2302.06675, Algorithm 2) written here, one
parameter at a time, with one temporary the size of the parameter (as lion-pytorch does);
``adamw-8bit`` bitsandbytes AdamW8bit (CUDA only).

Inference: one prefill forward of ``micro_batch × seq_len`` tokens under ``no_grad`` with a
DynamicCache and ``logits_to_keep=1`` (what ``generate`` does), then ``generate_len`` one-token
decode forwards; phases ``forward`` (prefill) and ``decode``.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainledger.errors import VerifyError
from trainledger.spec.recipe import Recipe
from trainledger.verify.build import BuiltModel, require

PhaseFn = Callable[[str], contextlib.AbstractContextManager]


@contextlib.contextmanager
def no_phase(_name: str) -> Iterator[None]:
    yield


class Lion:
    """Lion (Chen et al. 2023, arXiv:2302.06675, Algorithm 2), written for this measurement.

    State per parameter: one momentum buffer ``exp_avg`` of the parameter's dtype. The update
    ``sign(beta1·m + (1-beta1)·g)`` is built in one temporary of the parameter's size.
    """

    def __init__(self, params: list[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        import torch

        self._opt = torch.optim.Optimizer(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self.param_groups = self._opt.param_groups
        self.state = self._opt.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for group in self.param_groups:
                b1, b2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state[p]
                    if not st:
                        st["exp_avg"] = torch.zeros_like(p)
                    m = st["exp_avg"]
                    if group["weight_decay"]:
                        p.mul_(1 - group["lr"] * group["weight_decay"])
                    update = m.mul(b1).add_(p.grad, alpha=1 - b1).sign_()
                    p.add_(update, alpha=-group["lr"])
                    m.mul_(b2).add_(p.grad, alpha=1 - b2)
                    del update


def make_optimizer(recipe: Recipe, params: list[Any], device: str, notes: list[str]) -> Any:
    """The recipe's optimizer over ``params``, with CUDA's default implementation forced."""
    torch = require("torch")
    opt = recipe.optimizer
    if opt == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, foreach=True)
    if opt == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    if opt == "adamw-loop":
        return torch.optim.AdamW(params, lr=1e-5, foreach=False)
    if opt == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.0, foreach=True)
    if opt == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if opt == "adafactor":
        tr = require("transformers.optimization")
        return tr.Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False)
    if opt == "lion":
        notes.append("lion is trainledger's own implementation (one parameter-sized temporary at a time)")
        return Lion(params)
    if opt == "adamw-8bit":
        if device != "cuda":
            raise VerifyError("optimizer adamw-8bit needs bitsandbytes on a CUDA GPU; measure it with "
                              "--device cuda, or measure adamw here")
        bnb = require("bitsandbytes")
        return bnb.optim.AdamW8bit(params, lr=1e-5)
    raise VerifyError(f"optimizer {opt!r} is not supported by the measurement")


def host_step_counters(optimizer: Any) -> list[Any]:
    """Step-count tensors that torch keeps on the CPU in a CUDA run (non-fused, non-capturable Adam).

    They are not CUDA memory; a CPU or fake run drops them from the count to match CUDA.
    """
    out = []
    for group in getattr(optimizer, "param_groups", []):
        if group.get("fused") or group.get("capturable"):
            continue
        for p in group["params"]:
            st = optimizer.state.get(p, {}) if hasattr(optimizer, "state") else {}
            t = st.get("step") if isinstance(st, dict) else None
            if t is not None and hasattr(t, "untyped_storage"):
                out.append(t)
    return out


def optimizer_state_tensors(optimizer: Any) -> list[Any]:
    import torch

    out = []
    for st in getattr(optimizer, "state", {}).values():
        if isinstance(st, dict):
            out.extend(v for v in st.values() if isinstance(v, torch.Tensor))
    return out


def cache_tensors(cache: Any) -> list[Any]:
    """The key/value tensors a transformers Cache holds (DynamicCache layers or legacy lists)."""
    import torch

    out: list[Any] = []
    for layer in getattr(cache, "layers", []) or []:
        out.extend(v for v in vars(layer).values() if isinstance(v, torch.Tensor))
    for name in ("key_cache", "value_cache"):
        for t in getattr(cache, name, []) or []:
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def autocast_context(recipe: Recipe, device_type: str, cuda_policy: bool = False) -> contextlib.ExitStack:
    """torch.autocast for the mixed policies (nothing otherwise).

    ``cuda_policy`` (CPU only) adds :class:`~trainledger.verify.autocast_cuda.CudaAutocastPolicy`
    so CPU autocast runs CUDA's fp32 op lists in fp32, as a CUDA run would.
    """
    import torch

    stack = contextlib.ExitStack()
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(recipe.precision)
    if dtype is None:
        return stack
    if cuda_policy and device_type == "cpu":
        from trainledger.verify.autocast_cuda import CudaAutocastPolicy

        stack.enter_context(CudaAutocastPolicy(device_type))
    stack.enter_context(torch.autocast(device_type, dtype=dtype))
    return stack


class StepRunner:
    """Runs the recipe's steps on a built model; ``phase(name)`` wraps each phase."""

    def __init__(self, built: BuiltModel, recipe: Recipe, seed: int = 0, cuda_autocast: bool = True) -> None:
        import torch

        self.built, self.recipe = built, recipe
        self.cuda_autocast = cuda_autocast
        self.model = built.model
        self.notes: list[str] = []
        self.params = built.trainable()
        self.optimizer = None
        self.scaler = None
        if recipe.is_training:
            if not self.params:
                raise VerifyError("the model has no trainable parameters for this recipe")
            self.optimizer = make_optimizer(recipe, self.params, built.tensor_device, self.notes)
            if recipe.precision == "fp16-mixed":
                self.scaler = torch.amp.GradScaler(built.tensor_device)
        self._gen = torch.Generator().manual_seed(seed)
        self.on_grads: Callable[[list[Any]], None] = lambda grads: None
        self.on_states: Callable[[Any], None] = lambda opt: None
        self.on_cache: Callable[[list[Any]], None] = lambda tensors: None

    def _ids(self, length: int) -> Any:
        import torch

        r = self.recipe
        if self.built.device == "fake":
            return torch.empty((r.micro_batch, length), dtype=torch.long, device="cpu")
        ids = torch.randint(0, self.built.vocab_size, (r.micro_batch, length), generator=self._gen)
        return ids.to(self.built.tensor_device)

    def train_step(self, phase: PhaseFn = no_phase) -> None:
        """One optimizer step: grad_accum micro-batches, then step and zero_grad."""
        import torch

        r = self.recipe
        for _ in range(r.grad_accum):
            with phase("forward"):
                ids = self._ids(r.seq_len)
                with autocast_context(r, self.built.tensor_device, self.cuda_autocast):
                    out = self.model(input_ids=ids, labels=ids, use_cache=False)
                loss = out.loss / r.grad_accum if r.grad_accum > 1 else out.loss
                del out, ids
            with phase("backward"):
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                del loss
            self.on_grads([p.grad for p in self.params])
        with phase("optimizer"):
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            if r.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.params, r.grad_clip, foreach=True)
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        self.on_states(self.optimizer)
        with phase("zero_grad"):
            self.optimizer.zero_grad(set_to_none=True)

    def inference_step(self, phase: PhaseFn = no_phase) -> None:
        """Prefill seq_len tokens with a KV cache, then decode generate_len tokens one by one."""
        import torch
        from transformers import DynamicCache

        r = self.recipe
        # inference loads the served dtype (recipe.INFERENCE_POLICY) and runs without autocast,
        # as serving engines do
        amp = contextlib.nullcontext()
        # transformers >= 5.2x names the cache argument ``cache``; older ones ``past_key_values``
        arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        cuda = self.built.device == "cuda"

        def now() -> float:  # wall time after the GPU finished (latency of the step, as served)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        with torch.no_grad(), amp:
            t0 = now()
            with phase("forward"):
                ids = self._ids(r.seq_len)
                cache = DynamicCache(config=self.built.config)
                out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{arg: cache})
                cache = out.past_key_values
                del out, ids
            t1 = now()
            self.on_cache(cache_tensors(cache))
            for _ in range(r.generate_len):
                with phase("decode"):
                    ids = self._ids(1)
                    out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{arg: cache})
                    cache = out.past_key_values
                    del out, ids
                self.on_cache(cache_tensors(cache))
            t2 = now()
            del cache
        n = r.generate_len
        self.latency = {"ttft_s": t1 - t0, "tpot_s": (t2 - t1) / n if n else None, "batch": r.micro_batch,
                        "prompt_tokens": r.seq_len, "output_tokens": n,
                        "output_tokens_per_s": r.micro_batch * n / (t2 - t1) if n and t2 > t1 else None}

    def step(self, phase: PhaseFn = no_phase) -> None:
        if self.recipe.is_training:
            self.train_step(phase)
        else:
            self.inference_step(phase)
