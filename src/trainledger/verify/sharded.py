"""Per-rank memory of a sharded plan, measured by running the real runtime on a fake process group.

``measure_sharded(plan)`` runs rank 0 of the plan's runtime on torch's fake process group
(``init_process_group("fake", store=FakeStore())`` from ``torch.testing._internal.distributed.fake_pg``:
every collective returns at once, nothing is sent) with FakeTensors, so a full-size model on 8 to
1024 ranks is traced on one CPU in seconds. The runtimes are the real ones:

* ``fsdp2`` — ``fully_shard`` on every decoder layer (and on the embedding and the head with
  ``wrap=layers+embed+head``) and on the root, ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``
  for the mixed policies with ``param_dtype=bf16`` (no autocast, as torchtitan runs it; with
  ``param_dtype=fp32`` no policy and torch autocast), ``reshard_after_forward`` from the runtime
  (``zero=2`` also means False: FSDP's SHARD_GRAD_OP); with ``tp > 1`` a 2-D mesh and
  ``parallelize_module`` first.
* ``pytorch-fsdp`` — FSDP1 ``FullyShardedDataParallel`` with a per-decoder-layer auto-wrap policy,
  ``use_orig_params=True``, ``limit_all_gathers=True``, ``MixedPrecision(param_dtype, reduce_dtype)``
  plus autocast (what accelerate / Trainer do); FULL_SHARD, or SHARD_GRAD_OP for ``zero=2``.
* ``hf`` with ``dp > 1`` — ``DistributedDataParallel`` (``gradient_as_bucket_view`` from the
  runtime) over the AMP replica; with ``tp > 1`` torch tensor parallelism.
* torch TP (``tp > 1`` under ``hf``/``fsdp2``): ``parallelize_module`` with colwise q/k/v/gate/up
  and rowwise o/down; with ``sp`` the norms get ``SequenceParallel``, the embedding is row-wise
  (output sharded on the sequence) and the head column-wise (torchtitan's plan); without ``sp``
  the embedding, norms and head stay replicated; ``loss_parallel`` keeps the logits vocab-sharded
  and runs the loss under ``loss_parallel()``.

What the fake process group needs (each found by running it, torch 2.13):

* FSDP2 frees and re-allocates its unsharded parameters with ``UntypedStorage.resize_``, which no
  ATen op reports: the tracker wraps ``resize_`` and updates the storage's size.
* Local tensors under DTensor are dispatched below the DTensor subclass, where a
  ``TorchDispatchMode`` on top of the stack does not see them: the tracker observes every op at
  the FakeTensorMode itself (its ``dispatch``), i.e. on the local shards.
* DDP: the parameter-shape check and the initial broadcast read data (skipped: all ranks build the
  same model), the all-reduce is a comm hook that returns the bucket as it is, and the step-0
  bucket rebuild (it reads the recorded order's sizes) is skipped, so the buckets keep their
  construction order (reverse parameter order, as DDP builds them).
* torch's ``FSDPMemTracker`` is not used: under FakeTensorMode in 2.13 it reported optimizer
  states far larger than the parameters they belong to.

Pipeline parallelism (``measure_pipeline_stage(plan, role)``, PP alone under ``hf``): the model is
split by hand into stages (embedding + the first ceil(L/p) layers, ..., the last layers + final norm
+ head), and rank 0 (first stage) or rank p-1 (last stage) runs its stage under
torch.distributed.pipelining's ``Schedule1F1B`` / ``ScheduleGPipe`` on the fake process group of p
ranks: sends return at once, receives hand over the stage's preallocated (fake) buffers. What it
needs: the input/output shapes are given (STATIC mode; the P2P warm-up vote reads a tensor's value
and is skipped), the example tensors must require grad (else no gradient buffers are made), and
``step(return_outputs=False)`` as a training loop calls it (else the last stage keeps every
micro-batch's logits). Autocast spans the whole schedule step.

Not measurable here (``VerifyError`` says so): DeepSpeed (its engine needs an accelerator and a
real communication backend; its ZeRO terms are checked against DeepSpeed's own estimators in the
tests), Megatron, context/expert parallelism, pipeline parallelism combined with DP/TP, offload.
"""

from __future__ import annotations

import datetime

import contextlib
import time
import weakref
from typing import Any

from trainledger.errors import VerifyError
from trainledger.verify.build import build_model, fake_runtime, require
from trainledger.verify.measurement import MemoryMeasurement, environment, optimizer_states, tracked_notes

#: runtimes this module can run on the fake process group
MEASURABLE = ("hf", "fsdp2", "pytorch-fsdp")


def check_measurable(plan: Any) -> None:
    """Raise VerifyError (one line, what to do) when the plan's layout cannot be measured here."""
    lay, rt = plan.layout, plan.runtime
    fw = rt.framework
    if fw not in MEASURABLE:
        raise VerifyError(f"framework {fw} cannot run on the fake process group (DeepSpeed and Megatron need an "
                          "accelerator and their own communication backends); its memory terms are checked "
                          "against DeepSpeed's estimators in the test suite — measure the plan with --framework "
                          "fsdp2 or pytorch-fsdp instead")
    if max(lay.pp, lay.cp, lay.ep) > 1:
        raise VerifyError("the sharded measurement runs data and tensor parallelism; cp/ep > 1 cannot be "
                          "measured yet — set them to 1 (pipeline parallelism alone: measure_pipeline_stage)")
    if lay.offload != "none":
        raise VerifyError("offload cannot be measured on the fake process group; set --offload none")
    if fw == "hf" and lay.zero:
        raise VerifyError("framework hf with --zero is the Trainer's integrated sharding, not a runtime that "
                          "runs here; measure it as --framework fsdp2 or pytorch-fsdp")
    if fw == "hf" and lay.tp > 1 and lay.dp_size > 1:
        raise VerifyError("torch TP with DDP is not measured; use --framework fsdp2 for TP + data parallelism, "
                          "or --gpus equal to --tp")
    if fw == "pytorch-fsdp" and (lay.zero in (1, 2) or not plan.runtime.reshards_after_forward(lay.pp)):
        raise VerifyError("FSDP1 SHARD_GRAD_OP does not run on fake tensors (it checks the unsharded flat "
                          "parameter's storage); measure FULL_SHARD (--zero 3) or use --framework fsdp2")
    if fw == "pytorch-fsdp" and lay.tp > 1:
        raise VerifyError("FSDP1 with tensor parallelism is not measured; use --framework fsdp2 for TP + FSDP")
    if plan.recipe.method == "qlora" or not plan.recipe.is_training:
        raise VerifyError("the sharded measurement runs training steps of full or LoRA fine-tuning")
    if lay.tp > 1:
        m = plan.model
        if m.num_heads % lay.tp or m.num_kv_heads % lay.tp:
            raise VerifyError(f"tp={lay.tp} must divide the attention heads ({m.num_heads}) and KV heads "
                              f"({m.num_kv_heads}) for torch's colwise q/k/v sharding")
        if m.moe is not None:
            raise VerifyError("torch TP of MoE expert stacks is not measured; measure MoE models with tp=1")


def fsdp_shards(plan: Any) -> int:
    """Ranks FSDP shards over: the DP group, or one node with hybrid sharding."""
    lay = plan.layout
    n = lay.dp_size * lay.cp
    if lay.hybrid_shard:
        n = min(n, max(plan.cluster.gpus_per_node // (lay.tp * lay.pp * lay.cp), 1))
    return n


# ---------------------------------------------------------------------------------------- tracker
def _local_tracker_class() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    from trainledger.verify.memtrace import MemoryTracker, _op_name, _UNCOUNTED_OPS

    class LocalTracker(MemoryTracker):
        """A MemoryTracker fed by the FakeTensorMode's dispatch: it sees the local shards of
        DTensors and storage resizes (see the module docstring). Not entered as a mode."""

        def __init__(self, vocab_size: int | None = None, local_vocab: int | None = None) -> None:
            super().__init__(vocab_size=vocab_size)
            # loss_parallel: the head's output and the loss path stay vocab-sharded, so rank 0's
            # logits have ceil(V / tp) columns (torch's Shard chunks the dimension with ceil)
            self.local_vocab = local_vocab
            self.buffer_scope = 0  # > 0 inside a runtime's collective helpers
            self.shadow_scope = 0  # > 0 inside DTensor's shape propagation (no memory on a GPU)

        def _counted(self, t: object) -> bool:
            return isinstance(t, FakeTensor) and super()._counted(t)

        def _kind_for(self, func: object, args: tuple, out: Any) -> str:
            if self.buffer_scope:
                return "sharding_buffers"
            if (self.local_vocab and getattr(out, "dim", lambda: 0)() >= 2 and out.shape[-1] == self.local_vocab
                    and self.current_phase in ("forward", "backward")):
                return "logits"
            if _op_name(func) == "_to_copy" and args and isinstance(args[0], FakeTensor):
                src = self._live.get(args[0].untyped_storage()._cdata)
                if src is not None and src.category == "sharding_buffers" and args[0].dtype != out.dtype:
                    return "autocast_weight_copies"  # autocast's copy of a gathered parameter
            return super()._kind_for(func, args, out)

        def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
            """One op seen at the FakeTensorMode: the tracker's own input / output accounting."""
            if self.shadow_scope or _op_name(func) in _UNCOUNTED_OPS:
                return
            self.note_inputs(func, args, kwargs)
            self.note_outputs(func, args, out)

        def resized(self, st: Any) -> None:
            rec = self._live.get(st._cdata)
            if rec is None:
                if st.nbytes():
                    rec = self._record(st, "sharding_buffers")
                    rec.op, rec.phase = "UntypedStorage.resize_", self.current_phase
                return
            if rec.category == "other":  # made outside a phase, sized by the runtime: its buffer
                rec.label = "sharding_buffers"
            self._maybe_resized(rec, st)

        @contextlib.contextmanager
        def _scope(self, counter: str) -> Any:
            setattr(self, counter, getattr(self, counter) + 1)
            try:
                yield
            finally:
                setattr(self, counter, getattr(self, counter) - 1)

        def buffers(self) -> Any:
            """Allocations inside this block are the runtime's collective buffers."""
            return self._scope("buffer_scope")

        def shadow(self) -> Any:
            """Allocations inside this block are DTensor shape-propagation shadows (not counted)."""
            return self._scope("shadow_scope")

    return LocalTracker


@contextlib.contextmanager
def attach(tracker: Any, fake_mode: Any) -> Any:
    """Feed ``tracker`` from ``fake_mode``'s dispatch and from ``UntypedStorage.resize_``."""
    import torch

    orig_dispatch = fake_mode.dispatch
    orig_resize = torch.UntypedStorage.resize_
    ref = weakref.ref(tracker)

    def dispatch(func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = orig_dispatch(func, types, args, kwargs)
        tr = ref()
        if tr is not None:
            tr.observe(func, args, kwargs, out)
        return out

    def resize_(self: Any, size: int) -> Any:
        out = orig_resize(self, size)
        tr = ref()
        if tr is not None:
            tr.resized(self)
        return out

    fake_mode.dispatch = dispatch
    torch.UntypedStorage.resize_ = resize_
    patched = _wrap_collective_helpers(tracker)
    try:
        yield tracker
    finally:
        fake_mode.dispatch = orig_dispatch
        torch.UntypedStorage.resize_ = orig_resize
        for mod, name, fn in patched:
            setattr(mod, name, fn)


def _wrap_collective_helpers(tracker: Any) -> list[tuple[Any, str, Any]]:
    """Allocations inside FSDP2's all-gather / copy-out / reduce-scatter helpers and FSDP1's
    unshard / gradient reduction are the runtime's buffers."""
    import functools

    from torch.distributed.fsdp import _runtime_utils as ru
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    patched = []
    for mod, name in ((pg, "foreach_all_gather"), (pg, "foreach_all_gather_copy_out"), (pg, "foreach_reduce"),
                      (ru, "_unshard"), (ru, "_reduce_grad")):
        fn = getattr(mod, name, None)
        if fn is None:
            continue

        @functools.wraps(fn)
        def wrapped(*a: Any, _fn: Any = fn, **k: Any) -> Any:
            with tracker.buffers():
                return _fn(*a, **k)

        setattr(mod, name, wrapped)
        patched.append((mod, name, fn))
    # DTensor derives an op's global output shape by running the op on global-shape tensors under
    # the current fake mode ("We must call the tracing in fake tensor mode so that it avoids
    # materializing memory": torch/distributed/tensor/_sharding_prop.py,
    # ShardingPropagator._propagate_tensor_meta_non_cached). On a GPU that mode is a fresh
    # FakeTensorMode and nothing is allocated; here it is the measuring mode itself, so those
    # global-shape "shadow" tensors (e.g. loss_parallel's full-vocabulary log-softmax, run by its
    # handlers through _propagate_tensor_meta) would be counted: they are not.
    from torch.distributed.tensor._sharding_prop import ShardingPropagator as SP

    fn = SP.__dict__["_propagate_tensor_meta_non_cached"]

    @functools.wraps(fn)
    def shadow(*a: Any, _fn: Any = fn, **k: Any) -> Any:
        with tracker.shadow():
            return _fn(*a, **k)

    SP._propagate_tensor_meta_non_cached = shadow
    patched.append((SP, "_propagate_tensor_meta_non_cached", fn))
    return patched


# ---------------------------------------------------------------------------------------- runtime
def _process_group(world: int, rank: int = 0) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world and dist.get_backend() == "fake" and dist.get_rank() == rank:
            return
        dist.destroy_process_group()
    # the fake backend never waits on a peer; the timeout only bounds the call like every other one
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


def _decoder_layers(model: Any) -> list[Any]:
    from trainledger.verify.build import _decoder_layers as layers

    return layers(model)


def _base(model: Any) -> Any:
    """The transformers model under a peft wrapper."""
    get = getattr(model, "get_base_model", None)
    return get() if get else model


def _tp_plan(model: Any, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    """torch tensor parallelism on a Llama-style transformers model (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module,
    )

    base = _base(model)
    inner = base.model
    top: dict[str, Any] = {}
    if sp:
        top["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        top["model.norm"] = SequenceParallel(use_local_output=True)
    if sp or loss_parallel:
        top["lm_head"] = ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                         output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                         use_local_output=not loss_parallel)
    if top:
        parallelize_module(base, mesh, top)
    for layer in inner.layers:
        plan: dict[str, Any] = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
        }
        if sp:
            plan.update({
                "input_layernorm": SequenceParallel(use_local_output=True),
                "post_attention_layernorm": SequenceParallel(use_local_output=True),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(layer, mesh, plan)


class _Setup:
    """The wrapped model, its optimizer parameters and what the step needs."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: list[Any] = []
        self.autocast = True
        self.loss_parallel = False
        self.seq_parallel = False
        self.notes: list[str] = []
        self.ddp_buckets: list[Any] = []


def _wrap(built: Any, plan: Any, mesh: Any) -> _Setup:
    import torch

    rt, lay, r = plan.runtime, plan.layout, plan.recipe
    s = _Setup()
    model = built.model
    mixed = r.precision.endswith("-mixed")
    dp_mesh, tp_mesh = mesh
    if lay.tp > 1:
        _tp_plan(model, tp_mesh, lay.sp, rt.loss_parallel)
        s.loss_parallel = rt.loss_parallel
        s.seq_parallel = lay.sp
        s.notes.append(f"torch TP {lay.tp} (parallelize_module{', sequence parallel' if lay.sp else ''}"
                       f"{', loss parallel' if rt.loss_parallel else ''})")
    fw = rt.framework
    if fw == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if lay.tp > 1:
            _real_mesh_concatenate()

        reshard = rt.reshards_after_forward(lay.pp) and lay.zero != 2
        mp = MixedPrecisionPolicy()
        if mixed and rt.param_dtype == "bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=getattr(
                torch, {"fp32": "float32", "bf16": "bfloat16"}[rt.reduce_dtype]))
            s.autocast = False
        if lay.hybrid_shard:
            s.notes.append("hybrid_shard is measured as full sharding over the shard group size")
        base = _base(model)
        kw = dict(mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        for layer in _decoder_layers(model):
            fully_shard(layer, **kw)
        if rt.wrap == "layers+embed+head":
            head = base.get_output_embeddings()
            if head is None or head.weight is base.get_input_embeddings().weight:
                raise VerifyError("wrap layers+embed+head needs an untied head: this model ties its embedding "
                                  "and head (FSDP2 would need them in one group); use --wrap layers")
            fully_shard(base.get_input_embeddings(), **kw)
            fully_shard(head, **kw)
        fully_shard(model, **kw)
        s.model = model
        s.notes.append(f"FSDP2 fully_shard per decoder layer{' + embed + head' if rt.wrap != 'layers' else ''}, "
                       f"reshard_after_forward={reshard}, "
                       + (f"MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype={rt.reduce_dtype})"
                          if not s.autocast else "no MixedPrecisionPolicy"))
    elif fw == "pytorch-fsdp":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        layer_ids = {id(m) for m in _decoder_layers(model)}
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in layer_ids)
        mp = None
        if mixed and rt.param_dtype == "bf16":
            red = {"fp32": torch.float32, "bf16": torch.bfloat16}[rt.reduce_dtype]
            mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=red, buffer_dtype=torch.bfloat16)
        strategy = ShardingStrategy.SHARD_GRAD_OP if (lay.zero == 2 or not rt.reshards_after_forward(lay.pp)) \
            else ShardingStrategy.FULL_SHARD
        s.model = FSDP(model, process_group=dist_group(), auto_wrap_policy=policy, use_orig_params=True,
                       limit_all_gathers=True, mixed_precision=mp, sharding_strategy=strategy,
                       device_id=torch.device("cpu"), sync_module_states=False)
        s.notes.append(f"FSDP1 {strategy.name}, use_orig_params, limit_all_gathers"
                       + (f", MixedPrecision(bf16, reduce {rt.reduce_dtype}) + autocast" if mp else ""))
    else:  # hf: DDP over data-parallel ranks (TP alone needs no wrapper)
        s.model = model
        if lay.dp_size > 1 and lay.tp == 1:
            s.model = _ddp(model, rt.gradient_as_bucket_view, s)
    s.params = [p for p in s.model.parameters() if p.requires_grad]
    return s


def _real_mesh_concatenate() -> None:
    """FSDP2 + TP concatenates the DP and TP meshes (reading the real rank tensor): outside fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    orig = DeviceMesh.__dict__["_concatenate"]
    if getattr(orig, "_trainledger", False):
        return
    fn = orig.__func__ if isinstance(orig, staticmethod) else orig

    def concatenate(meshes: list[Any]) -> Any:
        with unset_fake_temporarily():
            return fn(meshes)

    concatenate._trainledger = True  # type: ignore[attr-defined]
    DeviceMesh._concatenate = staticmethod(concatenate)


def dist_group() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD


def _ddp(model: Any, as_view: bool, s: _Setup) -> Any:
    import torch
    import torch.distributed as dist
    import torch.nn.parallel.distributed as D

    saved = D._verify_param_shape_across_processes, D._sync_module_states
    D._verify_param_shape_across_processes = lambda *a, **k: None
    D._sync_module_states = lambda *a, **k: None
    try:
        ddp = D.DistributedDataParallel(model, gradient_as_bucket_view=as_view)
    finally:
        D._verify_param_shape_across_processes, D._sync_module_states = saved

    def hook(_state: Any, bucket: Any) -> Any:
        """The all-reduce returns the bucket unchanged."""
        buf = bucket.buffer()
        if len(s.ddp_buckets) < 10_000:
            s.ddp_buckets.append(buf)
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    # DDP checks the annotations themselves (this module's are strings: __future__ annotations)
    hook.__annotations__ = {"_state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}

    ddp.register_comm_hook(None, hook)

    class _NoRebuild:  # the step-0 bucket rebuild reads data; keep the construction-time buckets
        def __init__(self, reducer: Any) -> None:
            self._reducer = reducer

        def __getattr__(self, name: str) -> Any:
            return getattr(self._reducer, name)

        def _rebuild_buckets(self) -> bool:
            return False

    ddp.reducer = _NoRebuild(ddp.reducer)
    s.notes.append(f"DDP gradient_as_bucket_view={as_view}, default 25 MiB buckets, all-reduce as a no-op comm hook")
    return ddp


def _flat_params(model: Any) -> list[Any]:
    """FSDP1's sharded flat parameters (``FlatParameter._local_shard``, the clone made by
    ``FlatParamHandle._get_shard``): with ``use_orig_params`` an all-frozen unit's original
    parameters are not views of it, yet it is the unit's weight storage. (Not ``flat_param``
    itself: between steps it may point at the gathered, unsharded buffer.)"""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not isinstance(model, FSDP):
        return []
    return [getattr(m._handle.flat_param, "_local_shard", None) for m in FSDP.fsdp_modules(model)
            if getattr(m, "_handle", None) is not None]


def _local(t: Any) -> Any:
    inner = getattr(t, "_local_tensor", None)
    return inner if inner is not None else t


# ---------------------------------------------------------------------------------------- step
def _train_step(s: _Setup, plan: Any, built: Any, phase: Any, on_grads: Any, opt: Any,
                cuda_autocast: bool) -> None:
    import torch

    from trainledger.verify.train_step import autocast_context

    r = plan.recipe
    for _ in range(r.grad_accum):
        lp = contextlib.nullcontext()
        if s.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            lp = loss_parallel()
        with lp:
            with phase("forward"):
                ids = torch.empty((r.micro_batch, r.seq_len), dtype=torch.long, device="cpu")
                amp = autocast_context(r, "cpu", cuda_autocast) if s.autocast else contextlib.nullcontext()
                extra = {}
                if s.seq_parallel:  # the residual stream holds s/t positions: give the full positions
                    extra["position_ids"] = torch.empty((r.micro_batch, r.seq_len), dtype=torch.long, device="cpu")
                with amp:
                    out = s.model(input_ids=ids, labels=ids, use_cache=False, **extra)
                loss = out.loss / r.grad_accum if r.grad_accum > 1 else out.loss
                del out, ids
            with phase("backward"):
                loss.backward()
                del loss
        on_grads([p.grad for p in s.params])
    with phase("optimizer"):
        if r.grad_clip is not None:
            _clip(s.params, r.grad_clip)
        opt.step()
    with phase("zero_grad"):
        opt.zero_grad(set_to_none=True)


def _mesh_key(t: Any) -> Any:
    """Plain tensors, or DTensors of one device mesh (TP + FSDP: 2-D; FSDP alone: 1-D)."""
    mesh = getattr(t, "device_mesh", None)
    return None if mesh is None else (tuple(mesh.mesh_dim_names or ()), mesh.ndim, mesh.size())


def _param_groups(params: list[Any]) -> Any:
    """One parameter group per kind (plain / DTensor per mesh): a foreach optimizer step runs per
    group, and its foreach kernels refuse a mix of plain and DTensor, or of DTensors on different
    meshes (TP+FSDP parameters are 2-D, replicated ones only FSDP-sharded)."""
    kinds: dict[Any, list[Any]] = {}
    for p in params:
        kinds.setdefault(_mesh_key(p), []).append(p)
    if len(kinds) <= 1:
        return params
    return [{"params": ps} for ps in kinds.values()]


def _clip(params: list[Any], max_norm: float) -> None:
    """clip_grad_norm_(foreach=True) over all parameters; torch's refuses a mix of DTensor
    (TP-sharded) and plain (replicated) parameters, so each kind is clipped on its own (the same
    per-tensor norms and in-place scaling: the same memory)."""
    import torch

    kinds: dict[Any, list[Any]] = {}
    for p in params:
        if p.grad is not None:
            kinds.setdefault(_mesh_key(p.grad), []).append(p)
    if len(kinds) <= 1:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return
    for group in kinds.values():  # same temporaries; the clip factor is per kind here
        torch.nn.utils.clip_grad_norm_(group, max_norm, foreach=True)


def measure_sharded(plan: Any, steps: int = 2, seed: int = 0, cuda_autocast: bool = True) -> MemoryMeasurement:
    """Per-rank memory of rank 0 of the plan's runtime on the fake process group (module docstring)."""
    require("torch")
    check_measurable(plan)
    if steps < 2:
        raise VerifyError("steps must be >= 2 (the last, steady-state step is measured)")
    world = plan.layout.dp_size * plan.layout.tp
    _process_group(world)
    try:
        return _measure_on_fake_pg(plan, steps, seed, cuda_autocast, world)
    finally:  # leave no global process group behind: later work in this process starts clean
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _measure_on_fake_pg(plan: Any, steps: int, seed: int, cuda_autocast: bool, world: int) -> MemoryMeasurement:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from trainledger.load.hf import load_hf_config
    from trainledger.verify.train_step import host_step_counters, make_optimizer

    lay, r = plan.layout, plan.recipe
    if lay.tp > 1:  # sub-meshes are sliced here: slicing under FakeTensorMode reads the mesh tensor
        full = init_device_mesh("cpu", (lay.dp_size, lay.tp), mesh_dim_names=("dp", "tp"))
        mesh = (full["dp"], full["tp"])
    else:
        mesh = (init_device_mesh("cpu", (world,)), None)
    hf_config = load_hf_config(plan.model.name)
    built = build_model(hf_config, r, device="fake", seed=seed)
    # DeviceMesh concatenates its (real) rank tensors when TP and FSDP meshes meet
    built.fake_mode.allow_non_fake_inputs = True
    local_vocab = -(-built.vocab_size // lay.tp) if (lay.tp > 1 and plan.runtime.loss_parallel) else None
    tracker = _local_tracker_class()(vocab_size=built.vocab_size, local_vocab=local_vocab)
    notes: list[str] = list(built.notes)
    with fake_runtime(built.fake_mode), attach(tracker, built.fake_mode):
        tracker.register(built.model.parameters(), "weights")
        tracker.register(built.model.buffers(), "other")
        s = _wrap(built, plan, mesh)
        notes += s.notes
        opt = make_optimizer(r, _param_groups(s.params), "cpu", notes)
        for _ in range(steps - 1):
            _train_step(s, plan, built, lambda _n: contextlib.nullcontext(), lambda g: None, opt, cuda_autocast)
        tracker.label([_local(p) for p in s.model.parameters()], "weights")
        tracker.label(_flat_params(s.model), "weights")
        tracker.label(s.ddp_buckets, "sharding_buffers")
        states = [_local(t) for t in optimizer_states(opt)]
        tracker.label(states, "optimizer_states")
        tracker.ignore([_local(t) for t in host_step_counters(opt)])
        tracker.reset_peaks()

        def on_grads(grads: list[Any]) -> None:
            tracker.label([_local(g) for g in grads if g is not None], "gradients")

        t0 = time.perf_counter()
        _train_step(s, plan, built, tracker.phase, on_grads, opt, cuda_autocast)
        wall = time.perf_counter() - t0
        tracker.label([_local(t) for t in optimizer_states(opt)], "optimizer_states")
    rep = tracker.report()
    notes += tracked_notes(built, r, cuda_autocast and s.autocast)
    notes.append(f"rank 0 of {world} on torch's fake process group (collectives return at once)")
    if rep.late_registered:
        notes.append(f"{rep.late_registered} storages were first seen as op inputs (made outside the tracker)")
    m = _fake_measurement(rep, notes, r, wall, world_size=str(world))
    del torch
    return m


# ---------------------------------------------------------------------------------------- pipeline
#: the rank roles of a pipeline that differ in memory: the first stage holds the embedding and the
#: most micro-batches in flight, the last the final norm, the head and the loss
PP_ROLES = ("first", "last")


def _stage_module(built: Any, lo: int, hi: int, first: bool, last: bool) -> Any:
    """Layers [lo, hi) of a Llama-style transformers model as one pipeline stage (a manual split,
    as torchtitan's ``pipeline_llm`` does): the embedding on the first stage, the final norm and
    the head on the last; RoPE tables are recomputed per stage (they are not sent)."""
    import torch

    base = _base(built.model)
    inner = base.model

    class _Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = inner.embed_tokens if first else None
            self.layers = torch.nn.ModuleList(list(inner.layers)[lo:hi])
            self.rotary_emb = inner.rotary_emb
            self.norm = inner.norm if last else None
            self.lm_head = base.lm_head if last else None

        def forward(self, x: Any) -> Any:
            h = self.embed_tokens(x) if self.embed_tokens is not None else x
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pe = self.rotary_emb(h, pos)
            for layer in self.layers:
                h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
                h = h[0] if isinstance(h, tuple) else h
            if self.lm_head is not None:
                h = self.lm_head(self.norm(h))
            return h

    return _Stage()


def measure_pipeline_stage(plan: Any, role: str, steps: int = 2, seed: int = 0,
                           cuda_autocast: bool = True) -> MemoryMeasurement:
    """Memory of one pipeline rank (``role``: first or last stage) running the plan's schedule
    with torch.distributed.pipelining (``Schedule1F1B`` or ``ScheduleGPipe``) on the fake process
    group of pp ranks: this rank's stage runs its real forward/backward for every micro-batch, the
    sends/receives return at once (the received activations and gradients are fake tensors)."""
    require("torch")
    lay = plan.layout
    if role not in PP_ROLES:
        raise VerifyError(f"pipeline role must be one of {', '.join(PP_ROLES)}")
    if lay.pp < 2 or lay.dp_size * lay.tp * lay.cp * lay.ep > 1 or plan.runtime.framework != "hf":
        raise VerifyError("the pipeline measurement runs pipeline parallelism alone (--gpus equal to --pp, "
                          "framework hf)")
    if lay.pp_schedule not in ("1f1b", "gpipe"):
        raise VerifyError("the pipeline measurement runs the 1f1b and gpipe schedules")
    rank = 0 if role == "first" else lay.pp - 1
    _process_group(lay.pp, rank)
    try:
        return _measure_stage(plan, role, rank, steps, seed, cuda_autocast)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _measure_stage(plan: Any, role: str, rank: int, steps: int, seed: int, cuda_autocast: bool) -> MemoryMeasurement:
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining.stage import InferenceMode

    from trainledger.load.hf import load_hf_config
    from trainledger.verify.train_step import autocast_context, host_step_counters, make_optimizer

    lay, r = plan.layout, plan.recipe
    p = lay.pp
    n_mb = lay.pp_microbatches or r.grad_accum
    hf_config = load_hf_config(plan.model.name)
    built = build_model(hf_config, r, device="fake", seed=seed)
    if getattr(_base(built.model), "lm_head", None) is None or not hasattr(_base(built.model), "model"):
        raise VerifyError("the pipeline measurement splits Llama-style transformers models (model.layers, lm_head)")
    n_layers = len(_decoder_layers(built.model))
    per = -(-n_layers // p)  # ceil(L / p) layers on every stage but the last ones
    lo, hi = rank * per, min((rank + 1) * per, n_layers)
    first, last = rank == 0, rank == p - 1
    b, s, h = r.micro_batch, r.seq_len, plan.model.hidden_size
    # what crosses a stage boundary: the residual stream (the weights' dtype: fp32 under autocast
    # with fp32 weights), and out of the last stage the head's logits (compute dtype). Shape
    # examples only (STATIC mode allocates its own receive buffers): real meta tensors, made
    # outside the fake mode so that they own no (fake) storage
    act_dtype = next(built.model.parameters()).dtype
    logit_dtype = torch.float32 if r.precision == "fp32" else (
        torch.float16 if r.precision.startswith("fp16") else torch.bfloat16)
    inp = torch.empty((b, s), dtype=torch.long, device="meta") if first else torch.empty(
        (b, s, h), dtype=act_dtype, device="meta").requires_grad_()
    out = torch.empty((b, s, built.vocab_size) if last else (b, s, h),
                      dtype=logit_dtype if last else act_dtype, device="meta").requires_grad_()
    tracker = _local_tracker_class()(vocab_size=built.vocab_size)
    notes: list[str] = list(built.notes)
    with fake_runtime(built.fake_mode), attach(tracker, built.fake_mode):
        stage_mod = _stage_module(built, lo, hi, first, last)
        params = [q for q in stage_mod.parameters() if q.requires_grad]
        tracker.register(stage_mod.parameters(), "weights")
        tracker.register(stage_mod.buffers(), "other")
        stage = PipelineStage(stage_mod, rank, p, torch.device("cpu"), input_args=(inp,), output_args=(out,))
        base = _base(built.model)

        def loss_fn(logits: Any, target: Any) -> Any:  # transformers' ForCausalLMLoss
            return base.loss_function(logits=logits, labels=target, vocab_size=built.vocab_size)

        cls = Schedule1F1B if lay.pp_schedule == "1f1b" else ScheduleGPipe
        sched = cls(stage, n_mb, loss_fn=loss_fn)
        # the warm-up vote reads a tensor's value (.item()); the shapes are given, so the stage is static
        sched._warmup_p2p = lambda stages, *_a: [setattr(st, "_inference_mode", InferenceMode.STATIC)
                                                for st in stages]
        cur_phase: list[Any] = [lambda _n: contextlib.nullcontext()]
        fwd_one, bwd_one = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(*a: Any, **k: Any) -> Any:
            with cur_phase[0]("forward"):
                return fwd_one(*a, **k)

        def backward_one_chunk(*a: Any, **k: Any) -> Any:
            with cur_phase[0]("backward"):
                return bwd_one(*a, **k)

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
        loss_one = sched._maybe_compute_loss

        def compute_loss(*a: Any, **k: Any) -> Any:  # the loss belongs to the forward
            with cur_phase[0]("forward"):
                return loss_one(*a, **k)

        sched._maybe_compute_loss = compute_loss
        opt = make_optimizer(r, params, "cpu", notes)
        x = torch.empty((b * n_mb, s), dtype=torch.long)

        def one_step(phase: Any) -> None:
            amp = autocast_context(r, "cpu", cuda_autocast)
            with amp:
                # a training loop keeps no merged output (return_outputs=False, as torchtitan's
                # trainer): else the last stage holds every micro-batch's logits until the step ends
                if first:
                    sched.step(x, return_outputs=False)
                elif last:
                    sched.step(target=x, losses=[], return_outputs=False)
                else:
                    sched.step(return_outputs=False)
            with phase("optimizer"):
                if r.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, r.grad_clip, foreach=True)
                opt.step()
            with phase("zero_grad"):
                opt.zero_grad(set_to_none=True)

        for _ in range(steps - 1):
            one_step(lambda _n: contextlib.nullcontext())
        tracker.label(params, "weights")
        tracker.label(optimizer_states(opt), "optimizer_states")
        tracker.ignore(host_step_counters(opt))
        tracker.reset_peaks()
        cur_phase[0] = tracker.phase
        grads_seen: list[Any] = []
        orig_step = opt.step

        def step_after_labels(*a: Any, **k: Any) -> Any:
            tracker.label([q.grad for q in params if q.grad is not None], "gradients")
            grads_seen.append(True)
            return orig_step(*a, **k)

        opt.step = step_after_labels
        t0 = time.perf_counter()
        one_step(tracker.phase)
        wall = time.perf_counter() - t0
        tracker.label(optimizer_states(opt), "optimizer_states")
    rep = tracker.report()
    notes += tracked_notes(built, r, cuda_autocast)
    notes.append(f"pipeline rank {rank} of {p} ({role} stage: layers {lo}..{hi - 1}"
                 + (", embedding" if first else "") + (", final norm + head + loss" if last else "")
                 + f"), torch.distributed.pipelining {cls.__name__} over {n_mb} micro-batches on the fake "
                 "process group (sends/receives return at once)")
    return _fake_measurement(rep, notes, r, wall, world_size=str(p), pp_role=role)


def _fake_measurement(rep: Any, notes: list[str], r: Any, wall: float, **env: str) -> MemoryMeasurement:
    """The measurement of one traced rank on the fake process group (no device time: the
    trace's wall time goes into ``env``, with ``env`` naming the rank's place)."""
    m = MemoryMeasurement(
        peak_allocated_bytes=rep.peak_bytes, peak_phase=rep.peak_phase, phase_peaks=rep.phase_peaks,
        categories_at_peak=rep.categories_at_peak, phase_categories=rep.phase_categories,
        device="fake", start_bytes=rep.start_bytes, notes=notes, tracker_peak_bytes=rep.peak_bytes,
        timeline=rep.timeline)
    m.env = {**environment("fake"), **env, "trace_wall_s": f"{wall:.2f}"}
    m.recipe = r.model_dump(mode="json")
    return m
