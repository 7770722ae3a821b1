"""Transient bytes of an optimizer step, measured on CPU by counting the tensors torch creates.

``LivePeak`` is a TorchDispatchMode that adds up the storage of every tensor an op creates while
the step runs and subtracts it when the tensor is freed: the peak of that sum is what the step
allocates on top of the parameters, gradients and states that existed before (the same quantity
the memory model's optimizer-temporaries term estimates; on a GPU it is the rise of
``torch.cuda.max_memory_allocated`` during ``optimizer.step()``).
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers.optimization import Adafactor

from trainledger.estimate.memory.states import optimizer_temp_bytes


class LivePeak(TorchDispatchMode):
    """Peak bytes of the tensors created inside the mode that are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.cur = self.peak = 0

    def _free(self, ptr: int) -> None:
        self.cur -= self.live.pop(ptr, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                  if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr == 0 or ptr in inputs or ptr in self.live:  # in-place result or a view
                continue
            self.live[ptr] = t.untyped_storage().nbytes()
            self.cur += self.live[ptr]
            weakref.finalize(t, self._free, ptr)
        self.peak = max(self.peak, self.cur)
        return out


@pytest.mark.parametrize("shape", [(512, 512), (2048, 128)])
def test_adafactor_step_transients_match_the_measured_peak(shape):
    """transformers' Adafactor on one fp32 matrix: the step's peak of new tensors (second step,
    the factored states already exist) is what the model's adafactor temporaries predict."""
    p = torch.nn.Parameter(torch.randn(*shape))
    opt = Adafactor([p], lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False)
    for _ in range(2):
        p.grad = torch.randn_like(p)
        probe = LivePeak()
        with probe:
            opt.step()
    n = p.numel()
    predicted = optimizer_temp_bytes("adafactor", n, 4.0, largest_param=n)
    assert predicted == pytest.approx(probe.peak, rel=0.02)


@pytest.mark.parametrize("shapes", [[(512, 512)], [(1024, 256), (256, 256), (64, 64)]])
def test_per_tensor_adamw_holds_two_temporaries_of_its_largest_tensor(shapes):
    """torch AdamW(foreach=False), the loop Composer's DecoupledAdamW also runs: the denominator
    ``exp_avg_sq.sqrt() / c`` of one tensor at a time, two tensors of the largest one live at once
    (the foreach AdamW holds sqrt(v) of all tensors together)."""
    ps = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    opt = torch.optim.AdamW(ps, foreach=False, weight_decay=0.01)
    for _ in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        probe = LivePeak()
        with probe:
            opt.step()
    n = sum(p.numel() for p in ps)
    largest = max(p.numel() for p in ps)
    assert optimizer_temp_bytes("adamw-loop", n, 4.0, largest_param=largest) == pytest.approx(probe.peak, rel=0.02)
    assert optimizer_temp_bytes("adamw", n, 4.0, largest_param=largest) == n * 4.0
