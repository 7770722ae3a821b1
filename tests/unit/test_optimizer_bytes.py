"""HBM accesses of the optimizer step: torch's foreach implementations against one fused pass.

``optimizers.FOREACH_EXTRA_ACCESSES`` holds, per optimizer, the parameter-sized element accesses
(reads + writes) its multi-kernel implementation makes beyond one fused pass. They are counted
here again from the ops torch dispatches for ``step()``, each op's reads and writes taken from its
schema (the arguments it mutates, the tensors it returns), so a torch whose optimizers change
fails this test instead of silently changing the time model's optimizer step.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.optimizers import FOREACH_EXTRA_ACCESSES, STATES_PER_PARAM

torch = pytest.importorskip("torch")

ROWS, COLS = 64, 48  # a 2-D parameter (Adafactor factors its second moment only for matrices)


def _accesses(make) -> int:
    """Parameter-sized tensor accesses of one ``step()`` over one 2-D parameter: per op, the distinct
    parameter-sized tensors it reads (every tensor argument) plus those it writes (mutated
    arguments and fresh outputs)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n = ROWS * COLS

    def sized(v) -> list:
        vs = v if isinstance(v, (list, tuple)) else [v]
        return [t for t in vs if isinstance(t, torch.Tensor) and t.numel() == n]

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            reads: dict[int, object] = {}
            writes = 0
            given = {a.name: (args[i] if i < len(args) else kwargs.get(a.name))
                     for i, a in enumerate(func._schema.arguments)}
            for a in func._schema.arguments:
                ts = sized(given[a.name])
                reads.update((id(t), t) for t in ts)
                # the fused kernels' schema marks the gradients mutable for AMP's in-kernel
                # unscaling, which happens only when a grad_scale is passed
                scaled = a.name != "grads" or given.get("grad_scale") is not None
                if a.alias_info is not None and a.alias_info.is_write and scaled:
                    writes += len(ts)
            rets = func._schema.returns
            outs = out if isinstance(out, (list, tuple)) and len(rets) > 1 else [out]
            for r, o in zip(rets, outs):
                if r.alias_info is None:  # a fresh tensor (in-place ops return their mutated input)
                    writes += len(sized(o))
            Count.total += len(reads) + writes
            return out

    p = torch.nn.Parameter(torch.randn(ROWS, COLS))
    p.grad = torch.randn(ROWS, COLS)
    opt = make([p])
    opt.step()  # creates the state
    Count.total = 0
    with Count():
        opt.step()
    return Count.total


def _one_pass(name: str) -> int:
    """A fused kernel reads weight, gradient and states once and writes weight and states once."""
    return 3 + 2 * STATES_PER_PARAM[name]


@pytest.mark.parametrize("name,make", [
    ("adamw", lambda ps: torch.optim.AdamW(ps, foreach=True, weight_decay=0.01)),
    ("adamw-loop", lambda ps: torch.optim.AdamW(ps, foreach=False, weight_decay=0.01)),
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True)),
    ("sgd-momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)),
    ("adafactor", lambda ps: torch.optim.Adafactor(ps, foreach=True)),
])
def test_foreach_extra_accesses_match_torch(name, make):
    assert _accesses(make) - _one_pass(name) == FOREACH_EXTRA_ACCESSES[name]


def test_fused_adamw_is_one_pass():
    if not hasattr(torch, "_fused_adamw_"):
        pytest.skip("this torch has no fused AdamW")
    assert _accesses(lambda ps: torch.optim.AdamW(ps, fused=True, weight_decay=0.01)) == _one_pass("adamw-fused")
    assert FOREACH_EXTRA_ACCESSES["adamw-fused"] == 0


def test_foreach_adamw_moves_88_bytes_per_fp32_parameter():
    """The time model's step, by hand, for 8B full fine-tuning on 8 H100 with ZeRO-3, fp32 weights
    and states (bf16-mixed under autocast): one fused pass moves 2 x 2 x 4 (states r/w) + 3 x 4
    (gradient read by the step, its norm and its reduce) + 2 x 4 (weights r/w) = 36 bytes per
    parameter; torch's foreach AdamW adds 13 fp32 accesses: 88 bytes. The hf stack's plain tensors
    have no host-dispatch term, so its step is the bytes over the HBM rate."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.estimate.time.stack import stack_profile
    from trainledger.load.catalog import load_gpu
    from trainledger.load.plan import PlanInputs, build_plan

    g = load_gpu("h100-sxm")
    bw = g.hbm_bytes_per_s * stack_profile("hf", g).eff.hbm
    kw = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, seq_len=4096, framework="hf")
    for opt, per in (("adamw", 88), ("adamw-fused", 36)):
        p = build_plan(PlanInputs(optimizer=opt, **kw))
        want = p.model.params.total / 8 * per / bw
        assert estimate_compute(p).breakdown["optimizer"] == pytest.approx(want, rel=1e-9)
    # DeepSpeed's adamw is its own FusedAdam: one pass
    p = build_plan(PlanInputs(optimizer="adamw", **{**kw, "framework": "deepspeed"}))
    ds = estimate_compute(p).breakdown["optimizer"]
    assert ds == pytest.approx(p.model.params.total / 8 * 36 / bw, rel=1e-9)
