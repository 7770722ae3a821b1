"""The gradient passes of FSDP1 and DDP that the time model charges, against torch itself.

FSDP1 (``step.flat_gradient_bytes``): torch runs FullyShardedDataParallel (FlatParameter) on CPU
over the fake process group; a dispatch mode logs every op of the backward, and the bytes of the
ops that produce a whole flat gradient (the split backward's concatenation, the cast to the reduce
dtype, the in-place pre-divide) must equal what the time model charges per parameter.
DDP (``step.ddp_copy_s``): torch's DistributedDataParallel on one gloo rank; the passes over each
gradient (the reducer's divide-while-copying into its bucket, the copy back into ``.grad``) must
be the number the model charges, with and without ``gradient_as_bucket_view``.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.time.step import flat_gradient_bytes

torch = pytest.importorskip("torch")

#: ops that only alias their input (no bytes move)
_ALIASES = {"view", "detach", "alias", "split", "slice", "expand", "as_strided", "t", "_unsafe_view",
            "empty_like"}


def _tensor_bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(y) for y in x)
    return 0


def _flat_backward_bytes(world: int, reduce_dtype) -> tuple[float, list[str]]:
    """(bytes per flat-parameter element moved by whole-flat-gradient ops, their names)."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    was = dist.is_initialized()
    if was:
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False))
        numel = sum(p.numel() for p in model.parameters())  # 16384: divisible by every world here
        f = FSDP(model, device_id=torch.device("cpu"), use_orig_params=False,
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype))
        loss = f(torch.randn(4, 64)).float().sum()
        moved, names = 0, []

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                nonlocal moved
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                if isinstance(out, torch.Tensor) and out.numel() == numel and name not in _ALIASES:
                    # bytes read (tensor inputs) + bytes written (the output; in place: the same)
                    moved += _tensor_bytes(list(args)) + _tensor_bytes(out)
                    names.append(name)
                return out

        with Log():
            loss.backward()
        return moved / numel, names
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,reduce,gb", [
    (8, "fp32", 4.0),    # Composer 'DEFAULT' from 0.16.4: bf16 compute, fp32 reduce
    (8, None, 2.0),      # reduce_dtype None -> the param dtype (bf16): no cast
    (2, "fp32", 4.0),    # the smallest sharded group still pre-divides
])
def test_flat_gradient_bytes_match_torch_fsdp1(world, reduce, gb):
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    dtype = {"fp32": torch.float32, None: None}[reduce]
    per_param, names = _flat_backward_bytes(world, dtype)
    assert "cat" in names  # the split backward's concatenation
    assert per_param == flat_gradient_bytes(2.0, gb), names


def test_flat_gradient_passes_in_the_step():
    """The passes enter a pytorch-fsdp ZeRO-3 step (per micro-batch), not an fsdp2 one (its own
    copy-in), not a single-GPU one, and cost more with an fp32 reduce than a bf16 one by the byte
    ratio of the two paths."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    def copy_s(**kw):
        base = dict(model="llama-3.1-8b", seq_len=2048, gpus=8, zero=3, grad_accum=2)
        return estimate_compute(build_plan(PlanInputs(**{**base, **kw}))).breakdown.get("fsdp_copy", 0.0)

    fp32 = copy_s(framework="pytorch-fsdp", reduce_dtype="fp32")
    bf16 = copy_s(framework="pytorch-fsdp", reduce_dtype="bf16")
    assert fp32 > 0 and bf16 > 0
    assert fp32 / bf16 == pytest.approx(flat_gradient_bytes(2, 4) / flat_gradient_bytes(2, 2))
    assert copy_s(framework="pytorch-fsdp", reduce_dtype="bf16", grad_accum=4) == pytest.approx(2 * bf16)
    assert copy_s(framework="pytorch-fsdp", gpus=1, zero=0) == 0.0


def _ddp_passes(bucket_view: bool) -> float:
    """Read+write passes over the gradients during a DDP backward (the second step's: buckets
    built), per gradient element."""
    import torch.distributed as dist
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    was = dist.is_initialized()
    if was:
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False))
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
        numel = sum(p.numel() for p in model.parameters())
        shapes = {tuple(p.shape) for p in model.parameters()}
        moved = 0

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                nonlocal moved
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                # a pass over one gradient: read one tensor, write one (the weight-gradient GEMM
                # that makes it is not a pass)
                if (isinstance(out, torch.Tensor) and tuple(out.shape) in shapes
                        and name not in _ALIASES | {"mm"}):
                    moved += out.numel()
                return out

        for _ in range(2):  # the Trainer's zero_grad(set_to_none=True) between steps
            model.zero_grad(set_to_none=True)
            moved = 0
            loss = ddp(torch.randn(4, 64)).sum()
            with Log():
                loss.backward()
        return moved / numel
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bucket_view,passes", [(False, 2), (True, 1)])
def test_ddp_gradient_passes_match_torch(bucket_view, passes):
    assert _ddp_passes(bucket_view) == passes


def test_ddp_copies_in_the_step():
    """Once per step (not per micro-batch), half with gradient_as_bucket_view, none without DDP."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    def copy_s(**kw):
        base = dict(model="llama-3.2-1b", gpus=8, framework="hf", seq_len=2048)
        return estimate_compute(build_plan(PlanInputs(**{**base, **kw}))).breakdown.get("ddp_copy", 0.0)

    two = copy_s()
    assert two > 0
    assert copy_s(gradient_as_bucket_view=True) == pytest.approx(two / 2)
    assert copy_s(grad_accum=4) == pytest.approx(two)
    assert copy_s(gpus=1) == 0.0
    assert copy_s(zero=1) == 0.0
    assert copy_s(framework="fsdp2", zero=3) == 0.0
