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


def _amp_bytes(recompute: bool) -> dict[str, float]:
    """Bytes of the weight-sized ops of two AMP micro-batches on a tiny transformers Llama (CPU
    autocast, bf16), per element: forward casts and backward casts per linear weight (decoder
    projections and lm_head), the second micro-batch's accumulation per parameter."""
    transformers = pytest.importorskip("transformers")
    from torch.utils._python_dispatch import TorchDispatchMode

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    linear = {id(p): p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n}
    head = model.lm_head.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    shapes = {tuple(p.shape) for p in model.parameters()}
    got: dict[str, float] = {}

    class Log(TorchDispatchMode):
        def __init__(self, phase):
            super().__init__()
            self.phase = phase

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if isinstance(out, torch.Tensor) and tuple(out.shape) in shapes and name in ("_to_copy", "add_"):
                moved = _tensor_bytes([a for a in args if isinstance(a, torch.Tensor)]) + _tensor_bytes(out)
                key = f"{self.phase}_{name}"
                got[key] = got.get(key, 0) + moved
            return out

    ids = torch.randint(0, 256, (2, 16))
    model.zero_grad(set_to_none=True)
    for mb in range(2):
        with Log(f"fwd{mb}"), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        with Log(f"bwd{mb}"):
            loss.backward()
    lin = sum(linear.values())
    layers = lin - head
    return {"fwd_cast": got["fwd0__to_copy"] / lin, "bwd_cast": got["bwd0__to_copy"], "lin": lin,
            "layers": layers, "accumulate": got.get("bwd1_add_", 0) / total,
            "first_accumulate": got.get("bwd0_add_", 0)}


@pytest.mark.parametrize("recompute", [False, True])
def test_amp_weight_passes_match_torch(recompute):
    from trainledger.estimate.time.step import AMP_CAST_BYTES, GRAD_ACCUMULATE_BYTES

    b = _amp_bytes(recompute)
    assert b["fwd_cast"] == AMP_CAST_BYTES  # every linear weight, fp32 -> bf16, per forward
    # the backward: the weight gradients' casts, plus the recomputed layers' weight casts
    expect = AMP_CAST_BYTES * b["lin"] + (AMP_CAST_BYTES * b["layers"] if recompute else 0)
    assert b["bwd_cast"] == expect
    assert b["first_accumulate"] == 0  # the first micro-batch's gradient is taken over as is
    assert b["accumulate"] == GRAD_ACCUMULATE_BYTES


def test_amp_weight_passes_in_the_step():
    """hf without ZeRO on fp32 weights under autocast only; the accumulation grows with the
    micro-batches after the first; pure bf16 and FSDP-sharded plans have none."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    def amp_s(**kw):
        base = dict(model="llama-3.2-1b", gpus=1, framework="hf", seq_len=2048)
        c = estimate_compute(build_plan(PlanInputs(**{**base, **kw})))
        return c.breakdown.get("amp_weight_passes", 0.0)

    one = amp_s()
    assert one > 0
    assert amp_s(grad_accum=2) > 2 * one  # two micro-batches of casts plus one accumulation
    assert amp_s(recompute="full") > one
    assert amp_s(precision="bf16") == 0.0
    assert amp_s(gpus=8, zero=3) == 0.0
    assert amp_s(framework="megatron-core") == 0.0


def _fsdp2_two_blocks(reduce_dtype, reshard: bool):
    """(model, its parameter count, its unsharded parameter shapes): two blocks of two bias-free
    linears, each block and the root ``fully_shard``-ed with a bf16 param / ``reduce_dtype`` policy
    (the process group must exist)."""
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False)) for _ in range(2)]
    model = nn.Sequential(*blocks)
    numel = sum(p.numel() for p in model.parameters())
    shapes = {tuple(p.shape) for p in model.parameters()}
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    for blk in blocks:
        fully_shard(blk, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    return model, numel, shapes


def _fsdp2_bytes(reshard: bool, reduce_dtype) -> float:
    """Bytes per parameter per micro-batch (forward + backward) of FSDP2's copy-out and copy-in."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        model, numel, _ = _fsdp2_two_blocks(reduce_dtype, reshard)
        moved = 0

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                nonlocal moved
                out = func(*args, **(kwargs or {}))
                if func.overloadpacket.__name__ in ("split_with_sizes_copy", "chunk_cat"):
                    # out= ops: their inputs are read, their out= tensors written
                    moved += _tensor_bytes(list(args)) + _tensor_bytes(list((kwargs or {}).values()))
                return out

        with Log():
            model(torch.randn(4, 64)).float().sum().backward()
        return moved / numel
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("reduce,gb", [("fp32", 4.0), ("bf16", 2.0)])
def test_fsdp2_copy_bytes_match_torch(reshard, reduce, gb):
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    from trainledger.estimate.time.step import fsdp2_copy_bytes

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[reduce]
    assert _fsdp2_bytes(reshard, dtype) == fsdp2_copy_bytes(2.0, gb, regather=reshard)


def test_a_step_dominated_by_copies_says_so_and_what_avoids_them():
    from trainledger.estimate.time import estimate_compute
    from trainledger.estimate.time.step import COPIES_NOTE_SHARE
    from trainledger.load.plan import PlanInputs, build_plan

    def note(**kw):
        base = dict(model="llama-3.2-1b", gpus=8, framework="hf", seq_len=4096, grad_accum=4)
        c = estimate_compute(build_plan(PlanInputs(**{**base, **kw})))
        bd = c.breakdown
        share = sum(bd.get(k, 0.0) for k in ("amp_weight_passes", "ddp_copy", "fsdp_copy")) / c.step_time_s
        return share, [n for n in c.notes if "gradient-sized copies" in n]

    share, notes = note()
    assert share > COPIES_NOTE_SHARE and len(notes) == 1
    assert "autocast" in notes[0] and "--gradient-as-bucket-view halves them" in notes[0]
    _, notes = note(gradient_as_bucket_view=True)
    assert "halves" not in notes[0]
    share, notes = note(seq_len=16384, micro_batch=4, gpus=1)  # one GPU, long micro-batches
    assert share < COPIES_NOTE_SHARE and not notes


@pytest.mark.parametrize("framework", ["pytorch-fsdp", "fsdp2"])
def test_fsdp_stacks_shard_whatever_zero_says_in_time_as_in_memory(framework):
    """An FSDP stack always shards (the memory model's runtimes.fsdp_sharded): --zero 0 is
    FULL_SHARD like 3, and 1/2 are SHARD_GRAD_OP (no backward re-gather). The time model prices
    the same: the per-unit gathers and reduce-scatters, the optimizer over the shard, no DDP
    all-reduce."""
    from trainledger.estimate.memory.runtimes import fsdp_sharded
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    def comp(zero):
        p = build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, framework=framework, zero=zero))
        assert fsdp_sharded(p)
        return estimate_compute(p)

    full, zero0, sgo = comp(3), comp(0), comp(2)
    assert zero0.breakdown == pytest.approx(full.breakdown)
    assert sgo.breakdown["optimizer"] == pytest.approx(full.breakdown["optimizer"])
    assert sgo.breakdown["compute"] == pytest.approx(full.breakdown["compute"])
    # the backward does not gather again: less communication to hide, no more exposed
    assert sgo.hidden_comm["dp"] < full.hidden_comm["dp"]
    assert sgo.step_time_s <= full.step_time_s


def test_fsdp2_pipeline_stages_move_parameters_once_per_step_under_zero_1():
    """torch.distributed.pipelining skips the gradient sync of every micro-batch but the last and
    keeps an FSDP2 stage's parameters gathered (memory's pp_nosync): with --zero 1 the parameters
    move once per step (the data-parallel sync), with --zero 0/3 FULL_SHARD's per-unit collectives
    and copies (see test_fsdp2_pipeline_stages_gather_once_and_reduce_once_per_step)."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    def bd(zero):
        p = build_plan(PlanInputs(model="llama-3.1-8b", gpus=16, pp=2, framework="fsdp2", zero=zero,
                                  grad_accum=8))
        return estimate_compute(p).breakdown

    assert bd(1).get("fsdp_copy", 0.0) == 0.0
    assert bd(0).get("fsdp_copy", 0.0) > 0.0
    assert bd(0) == pytest.approx(bd(3))


def _fsdp2_nosync_bytes(micro_batches: int, reduce_dtype, reshard: bool) -> float:
    """Bytes per parameter per step of FSDP2's copies when the gradient sync waits for the last
    micro-batch, as torch.distributed.pipelining drives an FSDP2 stage (stage.py
    ``backward_maybe_with_nosync``: every backward without sync nor reshard; ``perform_reduce_grad``:
    then every group's post-backward with sync): the copy-outs, the unsharded gradient's cast and
    accumulation, the copy-in."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        model, numel, shapes = _fsdp2_two_blocks(reduce_dtype, reshard)  # shapes: unsharded
        moved = 0

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                nonlocal moved
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                if name in ("split_with_sizes_copy", "chunk_cat"):
                    moved += _tensor_bytes(list(args)) + _tensor_bytes(list((kwargs or {}).values()))
                elif (isinstance(out, torch.Tensor) and tuple(out.shape) in shapes
                      and name in ("_to_copy", "add_")):  # the gradient's cast, its accumulation
                    moved += _tensor_bytes(list(args)) + _tensor_bytes(out)
                return out

        with Log():
            for _ in range(micro_batches):
                model.set_is_last_backward(False)
                model.set_reshard_after_backward(False)
                model.set_requires_gradient_sync(False)
                model(torch.randn(4, 64)).float().sum().backward()
            model.set_is_last_backward(True)
            model.set_reshard_after_backward(True)
            model.set_requires_gradient_sync(True)
            state = fully_shard.state(model)
            for s in state._state_ctx.all_states:
                for group in s._fsdp_param_groups:
                    group.post_backward()
            state._root_post_backward_final_callback()
        return moved / numel
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("micro_batches", [1, 3])
@pytest.mark.parametrize("reduce,gb", [("fp32", 4.0), ("bf16", 2.0)])
@pytest.mark.parametrize("reshard", [False, True])
def test_fsdp2_nosync_copy_bytes_match_torch(micro_batches, reduce, gb, reshard):
    """rAF False: one gather per step; True: the first forward and every backward gather (forward
    and backward alternate here: the forward after a backward finds the group still gathered)."""
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    from trainledger.estimate.time.step import fsdp2_nosync_copy_bytes

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[reduce]
    gathers = 1 + micro_batches if reshard else 1
    assert _fsdp2_nosync_bytes(micro_batches, dtype, reshard) == fsdp2_nosync_copy_bytes(
        2.0, gb, micro_batches, gathers)


def test_fsdp2_pipeline_stages_gather_once_and_reduce_once_per_step():
    """Under --zero 3 an FSDP2 pipeline stage with reshard_after_forward=False (torchtitan's choice
    under PP) gathers its parameters once per step and reduce-scatters once, after its last backward: the
    collectives do not grow with the micro-batches, only the gradient accumulation does, and the
    reduce-scatter at the end has nothing to hide behind."""
    from trainledger.estimate.memory.runtimes import reshard_after_forward
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    def comp(ga, **kw):
        p = build_plan(PlanInputs(**{**dict(model="llama-3.1-8b", gpus=16, pp=2, framework="fsdp2", zero=3,
                                            grad_accum=ga, reshard_after_forward=False), **kw}))
        return p, estimate_compute(p)

    p, c4 = comp(4)
    assert not reshard_after_forward(p)
    _, c8 = comp(8)
    comm4 = c4.breakdown["comm_dp"] + c4.hidden_comm["dp"]
    comm8 = c8.breakdown["comm_dp"] + c8.hidden_comm["dp"]
    assert comm8 == pytest.approx(comm4)  # the same collectives whatever the accumulation
    # the fp32 reduce-scatter moves twice the bf16 gather's bytes and is all exposed: >= 2/3 of it
    assert c4.breakdown["comm_dp"] >= 0.6 * comm4
    # the copies grow by the accumulation of 4 more micro-batches' fp32 gradients only
    from trainledger.estimate.time.step import fsdp2_nosync_copy_bytes
    per_mb = fsdp2_nosync_copy_bytes(2.0, 4.0, 2, 1) - fsdp2_nosync_copy_bytes(2.0, 4.0, 1, 1)
    ratio = (c8.breakdown["fsdp_copy"] - c4.breakdown["fsdp_copy"]) / c4.breakdown["fsdp_copy"]
    assert ratio == pytest.approx(4 * per_mb / fsdp2_nosync_copy_bytes(2.0, 4.0, 4, 1))
    # no pipeline: the same plan gathers and reduces every micro-batch
    _, flat = comp(8, pp=1, gpus=8)
    assert flat.breakdown["comm_dp"] + flat.hidden_comm["dp"] > comm8
    # with reshard_after_forward every backward gathers again: more collectives with more micro-batches
    _, r4 = comp(4, reshard_after_forward=True)
    _, r8 = comp(8, reshard_after_forward=True)
    assert r8.breakdown["comm_dp"] + r8.hidden_comm["dp"] > r4.breakdown["comm_dp"] + r4.hidden_comm["dp"] > comm4


def test_nosync_backward_keeps_every_group_gathered_in_torch_and_in_memory():
    """After a backward without gradient sync nor reshard (pipelining's), torch leaves every group
    gathered even with reshard_after_forward=True, so the memory model's backward of the stage's
    first layer holds all its layers gathered, as with reshard_after_forward=False (it held two)."""
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        blocks = [nn.Linear(64, 64, bias=False) for _ in range(3)]
        model = nn.Sequential(*blocks)
        for blk in blocks:
            fully_shard(blk, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
        model.set_reshard_after_backward(False)
        model.set_requires_gradient_sync(False)
        out = model(torch.randn(4, 64))
        sharded_after_forward = [not fully_shard.state(b)._fsdp_param_group.is_unsharded for b in blocks]
        out.sum().backward()
        gathered_after_backward = [fully_shard.state(b)._fsdp_param_group.is_unsharded for b in blocks]
    finally:
        dist.destroy_process_group()
    assert all(sharded_after_forward) and all(gathered_after_backward)

    from trainledger.estimate.memory.device import runtime_defaults
    from trainledger.estimate.memory.phases import step_points
    from trainledger.estimate.memory.runtimes import fsdp_parts
    from trainledger.estimate.options import MemoryOptions
    from trainledger.estimate.stage import pipeline_role
    from trainledger.load.plan import PlanInputs, build_plan

    def first_layer_gathered(**kw):
        p = build_plan(PlanInputs(model="llama-3.1-8b", gpus=16, framework="fsdp2", zero=3, **kw))
        with pipeline_role("first"):  # the first stage (a plan without PP has one stage)
            f = fsdp_parts(p)
            _, points = step_points(p, MemoryOptions(suggestions=False), runtime_defaults())
        d = next(d for _, label, d in points if label == "first layer backward")
        return (d["zero_buffers"] - f.root_gathered) / f.layer_gathered, f.n_layers

    kept, n = first_layer_gathered(pp=2, reshard_after_forward=True)
    assert kept == pytest.approx(n)
    assert first_layer_gathered(pp=2, reshard_after_forward=False)[0] == pytest.approx(n)
    assert first_layer_gathered(reshard_after_forward=True)[0] == pytest.approx(2)


def _lora_reduce_inputs(framework: str):
    """(plan, the element count of every reduce-scatter input of one backward) of a tiny LoRA
    model wrapped as verify wraps ``framework``, on torch's fake process group of 8 ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainledger.load.hf import load_hf_config
    from trainledger.load.plan import PlanInputs, build_plan
    from trainledger.verify.build import build_model
    from trainledger.verify.sharded import _wrap

    plan = build_plan(PlanInputs(model="tiny-llama-debug", gpu="h100-sxm", gpus=8, seq_len=64,
                                 framework=framework, method="lora"))
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = (init_device_mesh("cpu", (8,)), None)
        model = _wrap(build_model(load_hf_config("tiny-llama-debug"), plan.recipe, device="cpu"), plan, mesh).model
        reduced = []

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if "reduce_scatter" in func.overloadpacket.__name__:
                    reduced.append(args[1].numel())  # the unsharded gradient (input)
                return func(*args, **(kwargs or {}))

        ids = torch.randint(0, 512, (1, 64))
        # verify's step: FSDP1 computes in bf16 under autocast, FSDP2 under its own policy
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=framework == "pytorch-fsdp"):
            out = model(input_ids=ids, labels=ids)
        with Count():
            out.loss.backward()
    finally:
        dist.destroy_process_group()
    return plan, reduced


def test_fsdp1_lora_reduces_whole_layer_units():
    """FSDP1 + LoRA with the adapters inside their decoder layer's unit (verify's wrapping, a
    layer-class policy): torch, over the fake process group, forms and reduce-scatters each layer
    unit's whole flat gradient (the frozen part zero-filled) though only the adapters train, as the
    memory model holds it (``fsdp_parts``: the whole unit's gradient); the time model prices that
    reduce, which FSDP2 (per-parameter sharding: only the adapters reduced) does not pay."""
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    pytest.importorskip("peft")
    from trainledger.estimate.memory.runtimes import fsdp_parts, shapes
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    plan, reduced = _lora_reduce_inputs("pytorch-fsdp")
    layers = plan.model.num_layers
    a = plan.model.lora_params(tuple(plan.recipe.lora_targets), plan.recipe.lora_rank) / layers
    unit = shapes(plan).layer_full + a  # the layer's base and its adapters, unpadded
    assert len(reduced) == layers  # the frozen root unit (embedding, norm, head) reduces nothing
    assert all(unit <= n < unit + 8 for n in reduced)  # padded to a multiple of the 8 ranks
    assert fsdp_parts(plan).layer_grad == pytest.approx(2.0 * shapes(plan).layer_full)  # bf16, whole unit

    from trainledger.estimate.time.step import reduce_bytes

    def comm(framework):
        p = build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=3, method="lora", framework=framework))
        c = estimate_compute(p)
        return c.breakdown["comm_dp"] + c.hidden_comm["dp"], reduce_bytes(p)

    (fsdp1, gb), (fsdp2, _) = comm("pytorch-fsdp"), comm("fsdp2")
    # the whole units' reduce (gb B/param) beside the two bf16 gathers (2 + 2 B/param) that both
    # pay, less the collectives' latencies that both pay alike
    assert fsdp1 > (1 + 0.9 * gb / 4) * fsdp2




def test_fsdp2_lora_reduces_only_the_adapters():
    """FSDP2 + LoRA (verify's wrapping: fully_shard per decoder layer): each layer's reduce-scatter
    carries only its adapters' gradients (per-parameter sharding: the frozen base gets none), as
    ``fsdp_parts`` holds (adapters gathered with the layer, reduced alone)."""
    pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    pytest.importorskip("peft")
    from trainledger.estimate.memory.runtimes import fsdp_parts, lora_layer_params, shapes

    plan, reduced = _lora_reduce_inputs("fsdp2")
    a = plan.model.lora_params(tuple(plan.recipe.lora_targets), plan.recipe.lora_rank) / plan.model.num_layers
    assert len(reduced) == plan.model.num_layers
    # each adapter's dim 0 padded to a multiple of 8 rows: at most 7 rows of each of its 14 tensors
    assert all(a <= n <= a + 14 * 7 * 176 for n in reduced)
    f = fsdp_parts(plan)
    assert lora_layer_params(plan) == pytest.approx(a)
    assert f.layer_grad == pytest.approx(2.0 * a)
    assert f.layer_gathered == pytest.approx(2.0 * (shapes(plan).layer_local * 8 + a))
