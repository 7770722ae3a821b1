"""The moments of one step and their peak: what ``estimate_memory`` and the suggestions share.

``step_points(plan, opts)`` walks a steady-state step (training) or a prefill and a decode step
(inference) and returns every moment as term -> bytes; ``peak_bytes`` turns them into the peak
allocated, reserved and device-total bytes exactly as the full estimate reports them.
``fit_bytes`` is that figure alone: the suggestion search (``.suggest``) calls it once per
variant plan and needs no terms, notes or timeline. Both ``estimate_memory`` (in the package
``__init__``) and ``.suggest`` import from here, so neither imports the other's module.
"""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

from trainledger.spec.plan import Plan
from trainledger.spec.runtime import Runtime
from trainledger.estimate.memory.model import (
    PARTS_FIELDS, Parts, activations, inference, model_states,
)
from trainledger.estimate.memory.runtimes import fsdp_forward_terms, fsdp_points, fsdp_sharded
from trainledger.estimate.memory.device import RuntimeDefaults, comm_buffer_bytes, runtime_defaults
from trainledger.estimate.memory.pressure import Pressure, busier, pressure
from trainledger.estimate.memo import KeyedMemo, clear_keyed
from trainledger.estimate.options import MemoryOptions
from trainledger.estimate.stage import current_role, inflight_microbatches, pipeline_role

Point = tuple[str, str, dict[str, float]]  # (phase, moment, term -> bytes)


def _training_points(plan: Plan, x: Parts) -> list[tuple[str, str, dict[str, float]]]:
    """The moments of a steady-state training step, each as term -> bytes.

    Backward is walked at both ends of the layer loop: memory changes linearly with the number j
    of layers done (activations and copies freed, gradients added), so the maximum is at j = 0 or
    j = n-1; each layer's backward adds its working set (gradients of its widest tensors).
    """
    r = plan.recipe
    ga = r.grad_accum > 1 or plan.layout.pp > 1
    g_prev = x.grads if ga else 0.0
    n = max(x.n_layers, 1)
    base = {"weights": x.weights, "master_weights": x.master, "optimizer_states": x.states,
            "ddp_buckets": x.ddp, "zero_buffers": x.zero_buf, "pipeline_buffers": x.pp_buffers}
    recompute = r.recompute == "full"
    # autocast copies alive at the end of forward: all (the autocast cache holds them even for
    # checkpointed layers); in backward only the saved ones (recompute: the lm_head's + one layer).
    copies_bwd = x.copies_head if recompute else x.copies
    # the autocast cache keeps casts of trainable leaf weights only (aten/src/ATen/autocast_mode.cpp
    # ``cached_cast``: requires_grad && is_leaf); a frozen LoRA base weight's copy lives only while
    # saved for backward, i.e. not at all inside a checkpointed layer
    copies_fwd = x.copies_cached + x.copies_head if (recompute and x.copies_cached is not None) else x.copies
    fwd = _forward_end(base, g_prev, copies_fwd, x)
    b0 = dict(base, gradients=g_prev, autocast_weight_copies=copies_bwd,
              activations=x.acts + x.head_saves, logits=x.logits_bwd, other=x.inputs)
    b1 = dict(base, gradients=max(g_prev, x.grad_head) + x.grad_transient,
              autocast_weight_copies=copies_bwd, activations=x.acts + x.head_saves,
              logits=x.logits_grad, other=x.inputs)
    points = [("forward", "loss (forward end)", fwd), ("backward", "log-softmax backward", b0),
              ("backward", "lm_head backward", b1)]
    if x.act_layer or x.cp_fwd:  # recompute: a checkpointed layer's full activations exist while it runs
        points.insert(0, ("forward", "last layer forward", dict(  # (+ a CP ring's forward transient)
            base, gradients=g_prev, autocast_weight_copies=copies_fwd + (x.copies_layer if copies_fwd != x.copies
                                                                         else 0.0),
            activations=x.acts + x.act_layer + x.cp_fwd,
            other=x.inputs)))

    def grads_after(j: int) -> float:
        return max(g_prev, min(x.grads, x.grad_head + (j + x.mlp_share) * x.layer_grads))

    for j in (0, n - 1):
        keep = (n - j) / n
        acts = x.acts * keep + x.act_layer  # + the layer being rematerialized (recompute)
        copies = x.copies_layer if recompute else (x.copies - x.copies_head) * keep
        label = "last layer backward" if j == 0 else "first layer backward"
        points.append(("backward", label, dict(base, gradients=grads_after(j), autocast_weight_copies=copies,
                                               activations=acts + x.bwd_work, other=x.inputs + x.grad_flow)))
    if current_role(plan) == "first" and x.emb_grad_transient:
        # 1F1B first stage: a micro-batch's backward ends in the embedding backward while the other
        # in-flight micro-batches' activations are still held. Autocast's cached weight copies were
        # cast in an earlier micro-batch's forward, so their ToCopyBackward nodes are older than
        # this micro-batch's graph and the autograd engine (which runs the newest ready node first,
        # torch/csrc/autograd/engine.cpp ``CompareNodeTaskTime``: by sequence number) leaves every
        # c-byte weight gradient of the stage waiting until the embedding backward has run
        m = inflight_microbatches(plan)
        points.append(("backward", "embedding backward (first stage)", dict(
            base, gradients=x.grads, autocast_weight_copies=x.copies,
            activations=x.acts * (m - 1) / m + x.emb_grad_transient + x.copies, other=x.inputs + x.grad_flow)))
    end = dict(base, gradients=x.grads, activations=x.emb_grad_transient, other=x.inputs + x.grad_flow)
    opt = dict(base, gradients=x.grads, optimizer_temporaries=x.opt_temp)
    points += [("backward", "backward end", end), ("optimizer", "optimizer step", opt)]
    return points


def _forward_end(base: dict[str, float], g_prev: float, copies_fwd: float, x: Parts) -> dict[str, float]:
    """The moment at the end of forward, inside the loss (``_training_points``' first moment but
    for a recomputed layer's): every training step walks it, so its total bounds the peak
    (``_fit``'s early misfit, ``_forward_end_bytes``)."""
    return dict(base, gradients=g_prev, autocast_weight_copies=copies_fwd,
                activations=x.acts + x.head_saves + x.head_out, logits=x.logits_fwd,
                dynamic_cache=x.cache, other=x.inputs)


def _forward_end_bytes(plan: Plan, x: Parts) -> float:
    """The total of ``_training_points``' forward-end moment of ``plan`` (the same terms, built by
    the same code) before the adjustments of ``_step_points``, which only add (``grads_static``)."""
    r = plan.recipe
    g_prev = x.grads if (r.grad_accum > 1 or plan.layout.pp > 1) else 0.0
    base = {"weights": x.weights, "master_weights": x.master, "optimizer_states": x.states,
            "ddp_buckets": x.ddp, "zero_buffers": x.zero_buf, "pipeline_buffers": x.pp_buffers}
    recompute = r.recompute == "full"
    copies_fwd = x.copies_cached + x.copies_head if (recompute and x.copies_cached is not None) else x.copies
    return sum(_forward_end(base, g_prev, copies_fwd, x).values())


def _bucket_view(d: dict[str, float]) -> None:
    """DDP gradient_as_bucket_view: the buckets are the gradients (``d`` changed in place)."""
    d["gradients"] = d.pop("ddp_buckets", 0.0)


def _inference_points(x: Parts) -> list[tuple[str, str, dict[str, float]]]:
    pts = [("forward", "prefill", {"weights": x.weights, "kv_cache": x.kv_prefill,
                                    "activations": x.infer_work, "other": x.inputs})]
    if x.decode_work:
        pts.append(("decode", "last decode step", {"weights": x.weights, "kv_cache": x.kv_cache,
                                                   "activations": x.decode_work}))
    return pts


#: the moments of the plans walked lately, by (plan object, options read, runtime defaults, pipeline
#: role): ``estimate_memory`` and the time model's allocator term (``allocator_pressure``) walk the
#: same plan, with its suggestion variants walked in between, and the combined search measures
#: variants whose busier stage the single-change search walked (the planner walks each candidate
#: twice in turn). The entry holds the plan, so its id is not reused while it is kept; the store is
#: emptied whole when full. Callers read the moments, never change them.
_WALKS: dict[tuple[int, tuple[bool, str], int, str | None], tuple[Plan, RuntimeDefaults, tuple[Parts, list[Point]]]] = {}
_WALKS_SIZE = 64


def step_points(plan: Plan, opts: MemoryOptions, rt: RuntimeDefaults,
                parts: Parts | None = None) -> tuple[Parts, list[Point]]:
    """Per-term bytes of ``plan`` at every moment of a step (not for paged serving engines).
    ``parts``: the plan's terms (``_training_parts``) when the caller has them."""
    key = (id(plan), (opts.use_cache, opts.kv_cache, opts.device), id(rt), current_role(plan))  # what the moments read
    hit = _WALKS.get(key)
    if hit is not None and hit[0] is plan and hit[1] is rt:
        return hit[2]
    out = _step_points(plan, opts, rt, parts)
    if len(_WALKS) >= _WALKS_SIZE:
        _WALKS.clear()
    _WALKS[key] = (plan, rt, out)
    return out


# ----------------------------------------------------------------------------- term memos
# A step's terms come from two functions of the plan: ``model_states`` (weights, master, gradients,
# optimizer states and temporaries, DDP/ZeRO buffers, host) and ``activations`` (saved activations,
# logits path, caches, inputs). Each reads only some of the plan's fields, declared below; plans
# that agree on a term's declared fields share its bytes. The suggestion variants each change one
# field (an optimizer leaves the activations as they are, a micro-batch or recomputation the model
# states), the scaling curve's points change dp and the accumulation, a pipeline walks the same
# roles again: each of them derives only the terms its change touches.
# tests/unit/test_memory_terms_deps.py perturbs every field of every spec of a set of plans and
# checks that a term whose key did not change did not change either (the declaration is complete).

#: the Parts fields ``activations`` writes (disjoint from those ``model_states`` writes; it reads none)
ACT_FIELDS: tuple[str, ...] = (
    "acts", "ckpt", "act_layer", "n_layers", "bwd_work", "mlp_share", "cache", "inputs", "grad_flow",
    "pp_buffers", "pp_buffer_each", "head_saves", "head_out", "logits_fwd", "logits_bwd", "logits_grad", "cp_fwd")

#: model_states: not the batch shape, recomputation, attention kernel, token budget, dropout or
#: clipping (only the precision policy, method, optimizer, LoRA shape and nvfp4 bf16 layers)
_STATES_RECIPE = attrgetter("method", "precision", "optimizer", "lora_rank", "lora_targets", "fp4_bf16_layers",
                             "optimizer_states_dtype")
_STATES_LAYOUT = attrgetter("tp", "pp", "cp", "ep", "etp", "sp", "zero", "hybrid_shard", "offload")
#: activations: not the optimizer, global batch, token budget, generation length, clipping, LoRA alpha
#: or nvfp4 bf16 layers, nor the data-parallel, expert or ZeRO layout, offload or node shape; the
#: accumulation only with a pipeline, through the micro-batches in flight and receive buffers
_ACTS_RECIPE = attrgetter("method", "precision", "seq_len", "micro_batch", "recompute", "recompute_layers",
                          "attention", "lora_rank", "lora_targets", "dropout", "moe_capacity_factor",
                          "moe_pad_to_capacity")
_ACTS_LAYOUT = attrgetter("tp", "pp", "cp", "sp", "vp", "pp_schedule", "pp_microbatches")
#: every runtime option but the release tag (it keys time calibrations; no estimate reads it)
_RUNTIME = attrgetter(*(f for f in Runtime.model_fields if f != "stack_version"))

#: every Parts field of a Parts, and its ``ACT_FIELDS``, as tuples in that order (one C call each)
_ALL_PARTS, _ACT_PARTS = attrgetter(*PARTS_FIELDS), attrgetter(*ACT_FIELDS)
#: the positions of ``ACT_FIELDS`` among every Parts field
_ACT_INDEX = tuple(PARTS_FIELDS.index(f) for f in ACT_FIELDS)
_PP_BUFFERS, _PP_EACH = ACT_FIELDS.index("pp_buffers"), ACT_FIELDS.index("pp_buffer_each")
#: the Parts fields resident at every moment of a training step (``_fit``'s lower bound)
_RESIDENT = tuple(PARTS_FIELDS.index(f) for f in ("weights", "master", "states"))
_MEMO_SIZE = 512
_STATES_MEMO = KeyedMemo(_MEMO_SIZE)
_ACTS_MEMO = KeyedMemo(_MEMO_SIZE)


def states_key(plan: Plan) -> tuple:
    """What ``model_states`` reads of ``plan`` (and the pipeline role being walked)."""
    lay, cl = plan.layout, plan.cluster
    # the data-parallel degree: only whether DDP buckets exist under plain DDP without ZeRO, else
    # the shard count; the node size only for hybrid sharding
    dp = lay.dp_size > 1 if (lay.zero == 0 and plan.runtime.framework == "hf") else lay.dp_size
    return (plan.model, _STATES_RECIPE(plan.recipe), _STATES_LAYOUT(lay), dp,
            cl.gpus_per_node if lay.hybrid_shard else 0, _RUNTIME(plan.runtime), current_role(plan))


def acts_key(plan: Plan, opts: MemoryOptions) -> tuple:
    """What ``activations`` reads of ``plan`` and ``opts`` (and the pipeline role being walked)."""
    r, lay = plan.recipe, plan.layout
    # with a pipeline the accumulation enters only as the micro-batches in flight and, under
    # torch.distributed.pipelining, one receive buffer per micro-batch (model.activations; the
    # memo keeps one buffer, ``_acts_values`` multiplies): plans whose accumulation differs above
    # the pipeline depth (the scaling curve's points) share the rest
    pipe = inflight_microbatches(plan) if lay.pp > 1 else 0
    return (plan.model, _ACTS_RECIPE(r), _ACTS_LAYOUT(lay), pipe,
            _RUNTIME(plan.runtime), opts.use_cache, opts.device, current_role(plan))


def _states_values(plan: Plan) -> tuple:
    """Every Parts field of ``plan`` as ``model_states`` leaves them (``PARTS_FIELDS`` order),
    shared with the memo."""
    role = current_role(plan)
    last = _LAST_STATES[0]  # (one tuple, read at once: a consistent entry under threads too)
    if last is not None and last[0] is plan and last[1] == role:  # a variant's lower bound, then its walk
        return last[2]

    def compute() -> tuple:
        x = Parts()
        model_states(plan, x)
        return _ALL_PARTS(x)
    out = _STATES_MEMO.get(states_key(plan), compute)
    _LAST_STATES[0] = (plan, role, out)
    return out


#: the last plan object (and pipeline role) whose model states were asked for, and their values:
#: ``_fit`` reads them for its lower bound and again for its walk
_LAST_STATES: list[tuple[Plan, str | None, tuple] | None] = [None]


def _acts_values(plan: Plan, opts: MemoryOptions) -> tuple:
    """Every ``ACT_FIELDS`` value of ``plan`` (in that order), as ``activations`` leaves them."""
    def compute() -> tuple:
        x = Parts()
        activations(plan, opts, x)
        return _ACT_PARTS(x)
    hit = _ACTS_MEMO.get(acts_key(plan, opts), compute)
    if hit[_PP_EACH]:  # receive buffers: one per micro-batch of this plan (model.activations)
        hit = list(hit)
        hit[_PP_BUFFERS] = (plan.layout.pp_microbatches or plan.recipe.grad_accum) * hit[_PP_EACH]
    return hit


def clear_memos() -> None:
    """Forget every remembered term (benchmarks of a cold estimate; tests): every ``KeyedMemo``
    (the memory terms, local parameters, the time model's communicators) and the walks."""
    clear_keyed()
    _LAST_STATES[0] = None
    _WALKS.clear()


def _training_parts(plan: Plan, opts: MemoryOptions) -> Parts:
    """The terms of a training plan's step: what ``model_states`` and ``activations`` wrote."""
    values = list(_states_values(plan))
    for i, v in zip(_ACT_INDEX, _acts_values(plan, opts)):  # model_states writes none of them
        values[i] = v
    return Parts(*values)


def _step_points(plan: Plan, opts: MemoryOptions, rt: RuntimeDefaults,
                 parts: Parts | None = None) -> tuple[Parts, list[Point]]:
    if plan.recipe.is_training:
        x = parts if parts is not None else _training_parts(plan, opts)
        if fsdp_sharded(plan):
            points = fsdp_points(plan, x)
        else:
            points = _training_points(plan, x)
            # each moment's dict is its own (``_training_points`` builds every one anew): changed
            # in place, the keys keep their order (a new key goes last, as ``dict(d, k=v)`` puts it)
            if x.grads_static:
                for _, _, d in points:
                    d["gradients"] = d.get("gradients", 0.0) + x.grads_static
            if plan.runtime.gradient_as_bucket_view and x.ddp:
                # DDP gradient_as_bucket_view: .grad are views into the buckets, which live all step
                for _, _, d in points:
                    _bucket_view(d)
    else:
        x = Parts(*_states_values(plan))
        inference(plan, opts, x, rt.paged_block_tokens)
        points = _inference_points(x)
    return x, points


class Peak(NamedTuple):
    """The peak moment of a step and the device bytes around it."""

    index: int                    # position of the peak moment in the points
    totals: list[tuple[str, float]]  # (phase, bytes) of every moment
    breakdown: dict[str, int]     # term -> bytes at the peak (terms > 0)
    allocated: int                # torch.cuda.max_memory_allocated
    reserved: int                 # allocator reserve, rounded up to whole segments
    context: int                  # CUDA context + kernels
    workspace: int                # cuBLAS/cuBLASLt workspaces

    @property
    def device_total(self) -> int:
        return self.reserved + self.context + self.workspace


def peak_bytes(points: list[Point], opts: MemoryOptions, rt: RuntimeDefaults, plan: Plan) -> Peak:
    """The largest moment, its terms, and reserved/device bytes (see ``.device``)."""
    totals = [(ph, sum(d.values())) for ph, _, d in points]
    i_peak = max(range(len(totals)), key=lambda i: totals[i][1])
    breakdown = {k: int(v) for k, v in points[i_peak][2].items() if v > 0}
    peak = sum(breakdown.values())
    reserved, context, workspace = _device_bytes(peak, opts, rt, plan)
    return Peak(i_peak, totals, breakdown, int(peak), reserved, context, workspace)


def runtime_settings(opts: MemoryOptions, rt: RuntimeDefaults, plan: Plan) -> tuple[float, int, int]:
    """(allocator reserve fraction, CUDA context bytes, library workspace bytes): the options'
    overrides, else the CUDA runtime's defaults (catalog/runtime/cuda.yaml); the workspaces include
    the stack's communication buffers outside the allocator (``device.comm_buffer_bytes``)."""
    f = rt.reserve_fraction if opts.allocator_reserve_fraction is None else opts.allocator_reserve_fraction
    context = rt.context_bytes if opts.cuda_context_bytes is None else opts.cuda_context_bytes
    workspace = rt.workspace_bytes if opts.workspace_bytes is None else opts.workspace_bytes
    return f, context, workspace + comm_buffer_bytes(plan)


def _device_bytes(peak: int, opts: MemoryOptions, rt: RuntimeDefaults, plan: Plan) -> tuple[int, int, int]:
    """(reserved, CUDA context, workspaces) bytes around a peak of ``peak`` allocated bytes."""
    reserve, context, workspace = runtime_settings(opts, rt, plan)
    reserved = int(peak * (1 + reserve))
    reserved = -(-reserved // rt.segment_bytes) * rt.segment_bytes
    return reserved, context, workspace


def _resident_bytes(plan: Plan) -> int:
    """Weights, master weights and optimizer states of a training plan's rank: held at every moment
    of its step (the ``base`` of ``_training_points`` and ``runtimes.fsdp_points``), so a lower
    bound of its peak (tests/unit/test_memory_terms_deps.py)."""
    x = _states_values(plan)
    return sum([int(x[i]) for i in _RESIDENT if x[i] > 0])


def fit_bytes(plan: Plan, opts: MemoryOptions) -> tuple[int, int, int]:
    """(peak allocated, device total, budget) bytes of ``plan``: the figures of
    ``estimate_memory(plan, opts)`` that decide and report a suggestion, without its terms,
    timeline and notes. Paged serving engines keep their own accounting (not a suggestion's)."""
    fit = _fit(plan, opts, misfit_early=False)
    assert fit is not None
    return fit


def fit_or_misfit(plan: Plan, opts: MemoryOptions, limit: float | None = None) -> tuple[int, int, int] | None:
    """``fit_bytes(plan, opts)``, or None as soon as the plan's device total is known to exceed
    ``limit`` (default: its budget, i.e. it does not fit) without walking its step: its resident
    states or its forward-end moment alone exceed it, or a pipeline stage does on its own (the
    busier stage, whose figures ``fit_bytes`` reports, holds at least as many bytes, and the device
    total grows with the allocated peak), without walking the other stage."""
    return _fit(plan, opts, misfit_early=True, limit=limit)


def _fit(plan: Plan, opts: MemoryOptions, misfit_early: bool,
         limit: float | None = None) -> tuple[int, int, int] | None:
    if not plan.recipe.is_training and plan.serving.paged:
        from trainledger.estimate.serving.section import memory_estimate

        est = memory_estimate(plan, opts)
        return est.peak_allocated_bytes, est.device_total_bytes, est.budget_bytes
    if plan.layout.pp > 1 and plan.recipe.is_training and current_role(plan) is None:
        # the busier of the first and the last pipeline stage, as ``estimate_memory`` reports it
        figures = []
        for role in ("first", "last"):
            with pipeline_role(role):
                fig = _fit(plan, opts, misfit_early, limit)
            if fig is None or (misfit_early and fig[1] > (fig[2] if limit is None else limit)):
                return None
            figures.append(fig)
        return max(figures, key=lambda f: f[0])
    rt = runtime_defaults()
    budget = int(plan.cluster.gpu.usable_bytes * (1 - plan.headroom))
    bound = budget if limit is None else limit  # misfit_early: a device total above it is all we need know
    parts = None
    if misfit_early and plan.recipe.is_training:
        # the device total grows with the peak: when the resident states alone exceed the budget,
        # no walk can make the plan fit
        reserved, context, workspace = _device_bytes(_resident_bytes(plan), opts, rt, plan)
        if reserved + context + workspace > bound:
            return None
        parts = _training_parts(plan, opts)
        # nor when the forward-end moment, one of the walk's moments, exceeds it (FSDP's without its
        # gathered units, whose shapes the walk reads: runtimes.fsdp_forward_terms): the peak is
        # the integer sum of the largest moment's positive terms, less than a byte each below
        # their sum (``_FORWARD_END_SLACK`` bytes cover the moment's terms and the float sums)
        low = _forward_end_floor(plan, parts)
        if low is not None and low - _FORWARD_END_SLACK > 0:
            reserved, context, workspace = _device_bytes(int(low - _FORWARD_END_SLACK), opts, rt, plan)
            if reserved + context + workspace > bound:
                return None
    points = step_points(plan, opts, rt, parts)[1]
    # ``peak_bytes`` without its breakdown: the same moment, the same integer sum of its terms
    totals = [sum(d.values()) for _, _, d in points]
    i_peak = max(range(len(totals)), key=totals.__getitem__)
    peak = sum([int(v) for v in points[i_peak][2].values() if v > 0])
    reserved, context, workspace = _device_bytes(peak, opts, rt, plan)
    return peak, reserved + context + workspace, budget


def _forward_end_floor(plan: Plan, parts: Parts) -> float | None:
    """The forward-end moment's bytes, or for FSDP all of it but its gathered units: at most the
    peak's; None with DDP's gradient_as_bucket_view (the buckets replace the gradients in every
    moment, which ``_forward_end_bytes`` does not)."""
    if fsdp_sharded(plan):
        return sum(fsdp_forward_terms(plan, parts).values())
    if plan.runtime.gradient_as_bucket_view and parts.ddp:
        return None
    return _forward_end_bytes(plan, parts)


#: bytes below the forward-end moment's total that the peak (an integer sum of at most ~16 terms,
#: each truncated) can fall at most, with room for the float sums' rounding
_FORWARD_END_SLACK = 64


#: the options ``allocator_pressure`` reads when given none (a frozen spec: one instance serves all)
_DEFAULT_OPTIONS = MemoryOptions()


def allocator_pressure(plan: Plan, opts: MemoryOptions | None = None, *, brief: bool = False) -> Pressure:
    """Caching-allocator retries per step of ``plan`` (``.pressure``) from its step's moments vs
    the GPU's usable bytes less the CUDA context and workspaces; the busier pipeline stage.

    ``brief``: only the retry count matters (the scaling curve's points): a stage whose resident
    weights, master weights and optimizer states alone, or whose forward-end moment, exceed the
    capacity does not run, so no retries, without walking its step (the peak it reports is then
    that lower bound)."""
    opts = opts or _DEFAULT_OPTIONS
    if not plan.recipe.is_training:
        return Pressure(0.0, 0.0, float(plan.cluster.gpu.usable_bytes), 0.0, True)
    if plan.layout.pp > 1 and current_role(plan) is None:
        out = []
        for role in ("first", "last"):
            with pipeline_role(role):
                out.append(allocator_pressure(plan, opts, brief=brief))
            if brief and not out[-1].fits:
                return out[-1]  # a stage that does not fit: no step, no retries
        return busier(out)
    rt = runtime_defaults()
    f, context, workspace = runtime_settings(opts, rt, plan)
    capacity = float(plan.cluster.gpu.usable_bytes - context - workspace)
    parts = None
    if brief:
        low = _resident_bytes(plan)
        if low > capacity:
            return Pressure(0.0, float(low), capacity, f, False)
        parts = _training_parts(plan, opts)  # nor when the forward-end moment exceeds it (see ``_fit``)
        fwd = _forward_end_floor(plan, parts)  # one of the walk's moments (or less: grads_static, FSDP)
        if fwd is not None and fwd > capacity:
            return Pressure(0.0, fwd, capacity, f, False)
    x, points = step_points(plan, opts, rt, parts)
    return pressure(plan, points, capacity, f, x.n_layers)
