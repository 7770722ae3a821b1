"""The numbers behind the memory estimate: per-GPU bytes of every term in every phase of one step.

A steady-state training step (optimizer states already exist) passes four moments; the peak of
``torch.cuda.max_memory_allocated`` is the largest of them (symbols: W weights, M master copy,
S optimizer states, G gradients, C autocast weight copies, A saved activations, T = b·s tokens):

* forward end, inside the loss: W+M+S(+G with grad accumulation)+C+A + the logits path
  (c-byte logits, their fp32 upcast and the fp32 log-softmax: (c+4+4)·V·T; transformers'
  ``ForCausalLMLoss`` calls ``logits.float()`` before ``cross_entropy``) + the fp32 K copies of the
  DynamicCache when the config has ``use_cache``;
* backward start, inside log-softmax backward: the same without the forward-only tensors, with
  the log-softmax output, its incoming and outgoing gradients (3·4·V·T);
* backward end: W+M+S+G + the gradient of the embedding output;
* optimizer step: W+M+S+G + the step's temporaries (foreach AdamW: one state-sized copy).

During backward, layer by layer, saved activations and autocast copies are freed while gradients
appear, so the backward curve between its two ends is monotone and its maximum is an end
(with full recomputation, one layer's activations are rematerialized on top).
"""

from __future__ import annotations

from dataclasses import dataclass, fields as dataclass_fields
from functools import lru_cache

from trainledger.spec.plan import Plan
from trainledger.estimate.memo import KeyedMemo, last_call
from trainledger.estimate.stage import Stage, current_role, inflight_microbatches, layers_on_stage  # noqa: F401  (inflight_microbatches: re-exported)
from trainledger.spec.runtime import liger_flce_chunk
from trainledger.units import DTYPE_BYTES
from trainledger.estimate.memory.activations import (
    FP32, INT64, Flow, LoraShape, cp_ring_bytes, layer_bytes, liger_norm_bytes, mla_kernel, op_sac_bytes,
    te_layer_bytes,
)
from trainledger.estimate.memory.states import (
    model_shape, optimizer_state_bytes, optimizer_temp_bytes, qlora_weight_bytes,
)
from trainledger.spec.layers import lora_params as _lora_params_uncached
from trainledger.estimate.memory import runtimes as RT
from trainledger.estimate.memory.runtimes import sixteen_bit_model, torch_tp
from trainledger.estimate.options import MemoryOptions

_COMPUTE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


@dataclass(slots=True)
class Parts:
    """Per-GPU bytes of each term (model states, activations, logits) on one pipeline stage."""

    weights: float = 0.0
    master: float = 0.0
    grads: float = 0.0
    states: float = 0.0
    opt_temp: float = 0.0
    pp_buffers: float = 0.0  # torch.distributed.pipelining's per-micro-batch receive buffers
    pp_buffer_each: float = 0.0  # one micro-batch's receive buffer (pp_buffers = micro-batches x this)
    copies: float = 0.0  # autocast weight copies, all layers
    copies_layer: float = 0.0  # one layer's copies (recompute)
    copies_head: float = 0.0  # lm_head copy
    acts: float = 0.0  # saved activations of all in-flight micro-batches
    act_layer: float = 0.0  # one layer's full activations (recompute working set)
    cp_fwd: float = 0.0  # context parallelism: ring-attention forward transient beyond the layer's saves
    ckpt: float = 0.0  # checkpointed layer inputs (part of acts)
    head_saves: float = 0.0  # final norm saves + lm_head input
    head_out: float = 0.0  # final norm output held by the model output (forward only)
    logits_fwd: float = 0.0
    logits_bwd: float = 0.0
    logits_grad: float = 0.0  # c-byte gradient of the logits entering lm_head backward
    cache: float = 0.0  # DynamicCache fp32 K copies (forward only)
    inputs: float = 0.0  # ids, labels, rotary tables
    ddp: float = 0.0
    zero_buf: float = 0.0
    grad_flow: float = 0.0  # gradient of the residual stream during backward
    grad_transient: float = 0.0  # c-byte weight grad before its fp32 cast (largest matrix)
    kv_cache: float = 0.0  # inference, full context
    kv_prefill: float = 0.0  # inference, after the prefill
    decode_work: float = 0.0  # inference, one decode step's transient
    infer_work: float = 0.0  # inference transient of one layer + logits
    host: float = 0.0
    grad_head: float = 0.0  # gradients of lm_head + final norm (first to appear in backward)
    layer_grads: float = 0.0  # gradients of one decoder layer
    bwd_work: float = 0.0  # working set of one layer's backward (gradients of its widest tensors)
    n_layers: int = 0
    emb_grad_transient: float = 0.0  # tied embeddings: the embedding's new gradient and the sum
    mlp_share: float = 0.0  # share of a layer's parameters in its MLP (backward runs it first)
    grads_static: float = 0.0  # gradient buffers that live all step (DeepSpeed's contiguous partition)
    copies_cached: float | None = None  # LoRA: autocast copies of the trainable adapters (cached)


#: every Parts field, in declaration order
PARTS_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclass_fields(Parts))


@last_call
def flow_of(plan: Plan) -> tuple[Flow, float, float]:
    """(activation dtype flow, weight bytes, trainable-parameter bytes) of the plan's policy.

    Remembered for the last plan object (``memo.last_call``): ``model_states`` and ``activations`` of one walk ask in
    turn (the result is immutable and reads nothing but the plan)."""
    return _flow_of(plan)


def _flow_of(plan: Plan) -> tuple[Flow, float, float]:
    r = plan.recipe
    pol = r.policy
    c = _COMPUTE[pol["compute"]]
    w = DTYPE_BYTES[pol["weights"]]
    if r.method == "qlora":  # bnb 4-bit base, other weights in the 16-bit compute dtype
        w_emb = 2.0 if c == 2 else 4.0
        return (Flow(c=c, R=int(max(w_emb, c)), autocast=r.precision.endswith("-mixed"), liger=plan.liger,
                     expert_rows=r.expert_rows),
                w_emb, 4.0)
    if sixteen_bit_model(plan):  # DeepSpeed / Megatron / FSDP param_dtype=bf16: all in 16 bits
        return (Flow(c=c, R=c, autocast=False, adapter=c, liger=plan.liger, expert_rows=r.expert_rows), float(c),
                4.0 if r.method == "lora" else float(c))
    autocast = r.precision.endswith("-mixed") and w > c and pol["master"] == "none"
    R = int(max(w, c))
    train_w = 4.0 if r.method == "lora" else w
    return Flow(c=c, R=R, autocast=autocast, liger=plan.liger, expert_rows=r.expert_rows), w, train_w


def _layer_kinds(plan: Plan) -> dict[tuple[bool, bool], int]:
    """Decoder layers on the busiest stage by (MoE layer, explicit SDPA mask)."""
    m, r = plan.model, plan.recipe
    n_layers, n_moe = layers_on_stage(plan)
    win = m.sliding_window
    n_masked = 0
    if win is not None and r.seq_len > win:
        n_masked = _count_sliding(m) * n_layers // m.num_layers
    kinds: dict[tuple[bool, bool], int] = {}
    dense = n_layers - n_moe
    # a stage's MoE and sliding layers are spread alike: split the masked ones proportionally
    for moe_layer, count in ((False, dense), (True, n_moe)):
        if count <= 0:
            continue
        masked = round(n_masked * count / n_layers)
        if masked:
            kinds[(moe_layer, True)] = masked
        if count - masked:
            kinds[(moe_layer, False)] = count - masked
    return kinds


@lru_cache(maxsize=1024)
def _count_sliding(m) -> int:
    return sum(1 for i in range(m.num_layers) if m.is_sliding_layer(i))


def _local_params(plan: Plan) -> tuple[float, float, float, float, int]:
    """(parameters, autocast-cast parameters, quantizable decoder parameters, lm_head, layers)
    on the busiest GPU: decoder layers split over pp, matrices over tp, routed experts over ep.

    Remembered by what it reads (the model, the model-parallel layout, the stack's TP style and
    the pipeline role): suggestion variants and scaling-curve points change none of it."""
    return _LOCAL_PARAMS.get(local_params_key(plan), lambda: _local_params_uncached(plan))


_LOCAL_PARAMS = KeyedMemo(1024)


def local_params_key(plan: Plan) -> tuple:
    """What ``_local_params`` reads of ``plan`` (tests/unit/test_memory_terms_deps.py checks it)."""
    lay = plan.layout
    return (plan.model, lay.tp, lay.pp, lay.ep, lay.expert_tp, lay.sp, plan.runtime.framework,
            plan.runtime.loss_parallel, current_role(plan))


def _local_params_uncached(plan: Plan) -> tuple[float, float, float, float, int]:
    m, lay = plan.model, plan.layout
    sh = model_shape(m)
    t = lay.tp
    n_layers, _ = layers_on_stage(plan)
    frac = n_layers / m.num_layers
    experts = sh.experts * frac
    other = sh.total - sh.layers - sh.embedding - sh.lm_head  # final norm
    layer_norms = (sh.norms - other) * frac
    # TP splits the projections; norm weights are replicated on every TP rank (Shoeybi et al. 2019
    # §3; torch's parallelize_module leaves them whole or as SequenceParallel replicas)
    et = lay.expert_tp  # Megatron --expert-tensor-parallel-size (tp unless set)
    layers = (sh.layers * frac - experts - layer_norms) / t + layer_norms + experts / (lay.ep * et)
    head_linear = sh.lm_head or m.vocab_size * m.hidden_size  # tied: the embedding is cast
    emb_t = head_t = t
    if torch_tp(plan):  # parallelize_module: replicated unless SP (row-wise embedding) / loss parallel
        emb_t = t if lay.sp else 1
        head_t = t if (lay.sp or plan.runtime.loss_parallel) else 1
    if torch_tp(plan) and not sh.lm_head and (lay.sp or plan.runtime.loss_parallel):
        head_linear = m.vocab_size * m.hidden_size  # parallelize_module replaces the tied head
        sh_head = head_linear  # weight by its own DTensor: the tie is broken, both are held
    else:
        sh_head = sh.lm_head
    role = current_role(plan)
    head_lin_local = head_linear / head_t
    if lay.pp == 1:
        head = sh.embedding / emb_t + sh_head / head_t
    elif role == "first":  # the embedding (not autocast: nn.Embedding is not cast)
        head, head_lin_local, other = sh.embedding / emb_t, 0.0, 0.0
    elif role == "last":  # the final norm and the head (a tied model's copy of the embedding)
        head = head_linear / head_t
    else:  # one stage bounding both: the larger of the embedding and the head
        head = max(sh.embedding / emb_t, head_linear / head_t)
    P = layers + head + other
    # grouped_mm experts run in the parameter dtype: autocast makes no copies of them
    linear = layers - layer_norms - experts / (lay.ep * et) + head_lin_local
    return P, linear, layers - layer_norms, head_lin_local, n_layers


@lru_cache(maxsize=4096)
def lora_params(m, targets: tuple[str, ...], rank: int) -> int:
    """Trainable LoRA parameters (trainledger.spec.layers.lora_params), cached per model."""
    return _lora_params_uncached(m, targets, rank)


@lru_cache(maxsize=4096)
def _dense_lora_params(m, targets: tuple[str, ...], rank: int) -> int:
    """LoRA parameters on nn.Linear modules only (peft's expert-stack adapters run in grouped_mm,
    outside autocast, so autocast makes no copies of them)."""
    from trainledger.spec.layers import PEFT_MOE_CONVERSION, converted

    names = PEFT_MOE_CONVERSION.get(m.model_type, {})
    if not names or m.moe is None:
        return lora_params(m, targets, rank)
    _, module_targets = converted(targets, names)
    return _lora_params_uncached(m, tuple(module_targets), rank)


@lru_cache(maxsize=1024)
def _unsaved_first(m, targets: tuple[str, ...]) -> float:
    """LoRA: layer 0's frozen projections that read tensors needing no gradient (the embedding
    output) keep no autocast weight copy: q/k/v (q_a/kv_a for MLA), and the whole attention when
    no attention input projection carries an adapter."""
    from trainledger.spec.layers import PEFT_MOE_CONVERSION, converted, layer_linears, matches
    from trainledger.estimate.memory.activations import _ATTN_INPUTS

    names = PEFT_MOE_CONVERSION.get(m.model_type, {}) if m.moe else {}
    module_targets = converted(targets, names)[1] if names else targets
    lin = {p: x for p, x in layer_linears(m, 0).items() if p.startswith("self_attn.")}
    wrapped = any(p in _ATTN_INPUTS and any(matches(p, t) for t in module_targets) for p in lin)
    first = ("q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa")
    return float(sum(x.params for p, x in lin.items() if not wrapped or p.split(".")[-1] in first))


def model_states(plan: Plan, parts: Parts) -> None:
    """Weights, master, gradients, optimizer states and temporaries, DDP/ZeRO buffers, host."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    sh = model_shape(m)
    flow, w, tw = flow_of(plan)
    t = lay.tp
    P, linear, quantizable, head_lin, n_layers = _local_params(plan)
    training = r.is_training
    lora = r.method in ("lora", "qlora")
    if lora:
        P_t = lora_params(m, tuple(r.lora_targets), r.lora_rank) * n_layers / m.num_layers / t
    else:
        P_t = P if training else 0.0
    N = lay.zero_shards if lay.zero else 1
    if lay.hybrid_shard and lay.zero:
        N = min(N, plan.cluster.gpus_per_node)
    base = qlora_weight_bytes(quantizable, P - quantizable, w) if r.method == "qlora" else P * w
    pol = r.policy
    g_bytes = tw if lora else DTYPE_BYTES[pol["grads"]]
    # LoRA adapters keep fp32 states whatever the base's policy, unless the states dtype is stated
    s_bytes = DTYPE_BYTES[pol["states"]] if (r.optimizer_states_dtype or not lora) else FP32
    master = P_t * FP32 if pol["master"] != "none" and training and not lora else 0.0
    grads = P_t * g_bytes if training else 0.0
    states = 0.0
    if training:
        states = optimizer_state_bytes(r.optimizer, P_t, s_bytes, sh, (P_t / P if P else 0.0))
    adapters = P_t * tw if lora else 0.0
    parts.weights = (base + adapters) / N if lay.zero == 3 else base + adapters
    parts.master = master / N if lay.zero >= 1 else master
    parts.states = states / N if lay.zero >= 1 else states
    parts.grads = grads / N if lay.zero >= 2 else grads
    step_params = P_t
    if torch_tp(plan) and not lay.sp and not lora and lay.pp == 1 and training:
        # torch TP without sequence parallelism leaves the embedding, the norms (and an unsharded
        # head) plain tensors beside the DTensor projections; foreach kernels refuse the mix, so the
        # optimizer runs one parameter group per kind and a foreach step's temporaries exist for
        # one group at a time (the larger one)
        plain = sh.embedding + sh.norms + (0.0 if plan.runtime.loss_parallel else sh.lm_head)
        step_params = max(plain, P_t - plain)
    temp = optimizer_temp_bytes(r.optimizer, step_params, s_bytes, sh.largest_param / t, tw) if training else 0.0
    parts.opt_temp = temp / N if lay.zero >= 1 else temp
    if "gemm" in pol and training and not lora:
        # block-scaled recipes (mxfp8-mixed, nvfp4-mixed): each Transformer Engine linear quantizes
        # its bf16 weight in forward and saves it for the dgrad GEMM with both usages, rowwise
        # (fprop) and columnwise (dgrad) (TE pytorch/module/linear.py: ``weightmat.update_usage(
        # columnwise_usage=True)`` before saving), each at DTYPE_BYTES[gemm] with its block scales.
        # Freed layer by layer in backward like autocast copies; the lm_head and nvfp4's bf16
        # layers are not quantized.
        kept = r.bf16_layers(m.num_layers) / m.num_layers if pol["gemm"] == "nvfp4" else 0.0
        parts.copies = quantizable * (1.0 - kept) * 2 * DTYPE_BYTES[pol["gemm"]]
        parts.copies_head = 0.0
    elif lay.zero == 3 and not RT.fsdp_sharded(plan):
        pass  # FSDP mixed precision gathers 16-bit units and frees them after use: no autocast copies
    elif flow.autocast and r.method == "qlora":  # bnb dequantizes the 4-bit base per use, unsaved
        parts.copies = P_t * flow.c
        parts.copies_head = 0.0
    elif flow.autocast:  # every Linear weight once, LoRA adapters included (not those on experts)
        adapters = _dense_lora_params(m, tuple(r.lora_targets), r.lora_rank) * n_layers / m.num_layers / t
        parts.copies = (linear + (adapters if lora else 0.0) - (_unsaved_first(m, tuple(r.lora_targets)) / t if lora else 0.0)) * flow.c
        parts.copies_head = head_lin * flow.c
        if lora:
            parts.copies_cached = adapters * flow.c
    if parts.copies:
        parts.copies_layer = (parts.copies - parts.copies_head) / max(n_layers, 1)
    if training and lay.dp_size > 1 and lay.zero <= 1:
        parts.ddp = grads  # DDP buckets: a flat copy of every gradient (gradient_as_bucket_view=False)
    if lay.zero == 3 or (lay.zero == 2 and lay.dp_size > 1):
        unit = max(sh.max_layer / t, head_lin)
        gather_b = DTYPE_BYTES["bf16"] if r.precision.endswith("-mixed") else w
        parts.zero_buf = (2 * unit * gather_b if lay.zero == 3 else 0.0) + unit * g_bytes
    if training and not lora:
        parts.layer_grads = quantizable / max(n_layers, 1) * g_bytes  # decoder layers only
        parts.grad_head = (head_lin * g_bytes) / (N if lay.zero >= 2 else 1)
        if flow.autocast:
            parts.grad_transient = head_lin * flow.c  # bf16 grad of the lm_head copy before its cast
        if lay.pp > 1 and current_role(plan) == "first":
            # the first stage's embedding backward writes a dense V×h gradient while the .grad of
            # the earlier micro-batches exists (AccumulateGrad adds it afterwards)
            parts.emb_grad_transient = sh.embedding / (t if (lay.sp or not torch_tp(plan)) else 1) * g_bytes
        elif not sh.lm_head and lay.pp == 1:
            # tied: lm_head's gradient is already in .grad when the embedding backward yields a
            # second V×h gradient; AccumulateGrad adds them out of place (measured, torch 2.13)
            parts.emb_grad_transient = 2 * head_lin * g_bytes / (N if lay.zero >= 2 else 1)
    fw = RT.framework(plan)
    if RT.fsdp_sharded(plan):
        RT.fsdp_states(plan, parts, P_t, flow)
        parts.emb_grad_transient = 0.0
        if not training:
            return
    elif fw == "deepspeed":
        RT.deepspeed_states(plan, parts, P, P_t, max(sh.max_layer / t, head_lin, sh.embedding / t))
        if lay.offload != "none":
            return
    elif fw in ("megatron-core", "megatron-deepspeed"):
        RT.megatron_states(plan, parts, P, P_t, quantizable)
    elif plan.runtime.gradient_as_bucket_view:
        pass  # the buckets are the gradients: see estimate_memory
    offload(plan, parts)


def offload(plan: Plan, parts: Parts) -> None:
    """CPU/NVMe offload: optimizer states + master (+ fp32 grads) or also the weights to the host
    (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840; ZeRO-Infinity, arXiv:2104.07857)."""
    lay = plan.layout
    host = 0.0
    if lay.offload in ("optimizer", "params"):
        host += parts.states + parts.master + parts.opt_temp
        parts.states = parts.master = parts.opt_temp = 0.0
    if lay.offload == "params":
        host += parts.weights
        parts.weights = parts.zero_buf  # only the gathered unit lives on the GPU
    parts.host = host


def activations(plan: Plan, opts: MemoryOptions, parts: Parts) -> None:
    """Saved activations, logits path, caches and inputs (see module docstring)."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    flow, _, _ = flow_of(plan)
    t = lay.tp
    sp = lay.sp and t > 1
    s_local = Stage.of(plan).seq_per_rank
    T = r.micro_batch * s_local
    n_layers, n_moe = layers_on_stage(plan)
    lora = None
    if r.method in ("lora", "qlora"):
        lora = LoraShape(rank=r.lora_rank, targets=tuple(r.lora_targets), dropout=r.dropout > 0,
                         flat_units=RT.fsdp_sharded(plan) and RT.framework(plan) == "pytorch-fsdp")
    s_att = r.seq_len
    per_layer = []
    te = RT.framework(plan) == "megatron-core" and lora is None
    op_level = r.recompute == "selective" and RT.op_level_sac(plan)
    mla = mla_kernel(m, r.attention, RT.framework(plan), opts.device)
    for (moe_layer, masked), count in _layer_kinds(plan).items():
        if te and not moe_layer:  # Transformer Engine's fused modules (te_layer_bytes)
            lb = te_layer_bytes(m, r.policy["compute"] == "fp8", r.dropout > 0)
        else:
            lb = layer_bytes(m, flow, r.attention, moe_layer, lora, masked, mla=mla)
        full = (lb.replicated / (t if sp else 1) + lb.sharded / t + lb.per_s * s_att / t)
        if sp and torch_tp(plan):  # torch SP: the linears save their gathered (full-sequence) input
            full += lb.linear_inputs * (1 - 1 / t)
        sel = full - (lb.per_s * s_att + lb.core_drop - lb.core_keep) / t
        op_sac = op_sac_bytes(m, flow.c, flow.R, r.attention, t, sp) if (
            op_level and not moe_layer and lora is None) else None
        if op_sac is not None:  # torchtitan's per-op SAC (activations.OP_SAC_SOURCE)
            sel = op_sac
        per_layer.append((count, lb, full, sel))
    inflight = inflight_microbatches(plan)
    acts = 0.0
    act_layer = 0.0
    ckpt = 0.0
    cache = 0.0
    n_ckpt_left = n_layers if r.recompute_layers is None else min(r.recompute_layers, n_layers)
    for count, lb, full, sel in per_layer:
        act_layer = max(act_layer, full * T)
        if r.recompute == "full":
            k = min(count, n_ckpt_left)
            n_ckpt_left -= k
            inp = lb.layer_input / (t if sp else 1)
            ckpt += k * inp * T
            acts += (k * inp + (count - k) * full) * T
        else:
            acts += count * (sel if r.recompute == "selective" else full) * T + count * lb.per_layer_const
            if opts.use_cache:
                cache += count * lb.cache_extra / t * T
    if lora is not None and per_layer and r.recompute != "full":
        lb0 = per_layer[0][1]
        # selective recompute already dropped every layer's per-position (score) tensors
        per_s = 0.0 if r.recompute == "selective" else lb0.first_layer_per_s * s_att
        # the first layer's saving is part of that layer's (TP-sharded) activations, never more
        first = per_layer[0][3 if r.recompute == "selective" else 2]
        acts -= min((lb0.first_layer_saving + per_s) / t, first) * T
    parts.acts = acts * inflight
    parts.ckpt = ckpt * inflight
    if r.recompute == "selective" and op_level:
        # per-op SAC recomputes a whole block in its backward: one layer's full activations
        act_layer = max(full * T for _, _, full, _ in per_layer)
    elif r.recompute == "selective":  # the attention core of one layer, rematerialized
        act_layer = max(((lb.per_s * s_att + lb.core_drop - lb.core_keep) / t) * T for _, lb, _, _ in per_layer)
    parts.act_layer = act_layer if r.recompute != "none" else 0.0
    parts.n_layers = n_layers
    width = m.moe.top_k * m.moe.expert_intermediate_size if (m.moe and n_moe) else m.intermediate_size
    mlp_saved = 4 * flow.c * width / t  # freed by the time attention backward runs
    eager = lb_eager_transient(plan, flow) - mlp_saved if r.attention == "eager" else 0.0
    parts.bwd_work = max(T * (flow.c * width + flow.R * m.hidden_size) / t, eager * T)
    cp_fwd, cp_bwd = cp_transients(plan, flow)
    if cp_fwd or cp_bwd:
        # the ring runs where the attention runs: in forward after the layer's attention inputs are
        # saved and before its MLP saves exist (the moment holds the acts, act_layer, less one
        # layer's MLP saves); in backward after the MLP's backward freed them (as ``eager`` above).
        # A recomputed layer runs the ring forward again inside backward.
        mlp_kept = mlp_saved
        if te and not n_moe:  # TE's MLP saves fc1's output and fc2's input (te_layer_bytes)
            fc2_in = 1 if r.policy["compute"] == "fp8" else 2
            mlp_kept = (2 * (2 if m.mlp_type == "gated" else 1) + fc2_in) * m.intermediate_size / t
        parts.cp_fwd = max(0.0, cp_fwd - mlp_kept) * T
        ring_bwd = max(cp_bwd, cp_fwd if r.recompute != "none" else 0.0)
        parts.bwd_work = max(parts.bwd_work, (ring_bwd - mlp_kept) * T)
    sh = model_shape(m)
    parts.mlp_share = sh.mlp_share
    parts.cache = cache
    _logits(plan, flow, T, parts)


def cp_transients(plan: Plan, flow: Flow) -> tuple[float, float]:
    """(forward, backward) ring-attention transient bytes per local token of one layer on one rank
    under context parallelism (``activations.cp_ring_bytes``): torch's ``context_parallel`` for the
    PyTorch runtimes, Transformer Engine's p2p ring for Megatron-Core. DeepSpeed / Megatron-DeepSpeed
    sequence parallelism (Ulysses all-to-all) is not modelled here: zero."""
    m, lay = plan.model, plan.layout
    cp, t = lay.cp, lay.tp
    fw = RT.framework(plan)
    if cp <= 1 or fw in ("deepspeed", "megatron-deepspeed"):
        return 0.0, 0.0
    heads = m.num_heads / t
    if m.mla is not None:
        ml = m.mla
        dq, dv = ml.qk_nope_head_dim + ml.qk_rope_head_dim, ml.v_head_dim
        q, kv = heads * dq, heads * (dq + dv) / 2  # per-head K (dq) and V (dv): their mean width
    else:
        q = m.q_dim / t
        # KV heads split over TP, replicated when fewer than t
        kv = max(1, m.num_kv_heads // t) * m.head_dim
        if fw == "fsdp2":
            # torchtitan repeats K and V to the query heads before SDPA (torchtitan
            # models/llama/model.py ``Attention.forward``: ``keys = repeat_kv(xk, self.n_rep)``), so
            # the ring moves n_heads-wide K/V; transformers hands SDPA the KV heads (enable_gqa)
            kv = q
    if fw == "megatron-core":
        return cp_ring_bytes("te", cp, q, kv, heads, 2)
    return cp_ring_bytes("torch", cp, q, kv, heads, flow.c)


def lb_eager_transient(plan: Plan, flow: Flow) -> float:
    """Eager attention backward, per token: the fp32 gradient of the probabilities and the
    softmax-backward output (8·a·s), less the c-byte probabilities freed just before."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    c_probs = flow.c if flow.c != FP32 else 0
    return (2 * FP32 - c_probs) * m.num_heads * r.seq_len / lay.tp


def _logits(plan: Plan, flow: Flow, T: float, parts: Parts) -> None:
    """Final norm, lm_head input and the loss path on the last stage (vocab-parallel over t)."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    t = lay.tp
    h, V = m.hidden_size, m.vocab_size
    R, c = flow.R, flow.c
    parts.inputs = T * INT64 * 3 + 2 * r.seq_len * m.head_dim * R
    parts.grad_flow = T * R * h
    role = current_role(plan)
    if role is not None and RT.framework(plan) == "hf":
        # torch.distributed.pipelining allocates a receive buffer per micro-batch when the schedule
        # starts (torch/distributed/pipelining/stage.py ``_setup_backward_recv_info`` /
        # ``_create_grad_recv_info`` for the gradients a stage receives, the forward receive infos
        # for its inputs): the first stage holds m gradient buffers, the last m input buffers, each
        # one micro-batch of the R-byte residual stream
        parts.pp_buffer_each = T * R * h
        parts.pp_buffers = (lay.pp_microbatches or r.grad_accum) * parts.pp_buffer_each
    if role == "first":  # no final norm, head or loss on the first stage
        return
    cast = flow.autocast and R != c
    if r.method in ("lora", "qlora"):  # frozen final norm and lm_head: neither saves the input
        parts.head_saves = (FP32 * h + FP32) * T
    else:  # lm_head saves its (cast) input; the model output still holds the fp32 norm output
        parts.head_saves = (FP32 * h + FP32 + R * h) * T + (c if cast else R) * h * T
    parts.head_out = R * h * T if cast else 0.0
    logit_b = c if c != FP32 else FP32
    up = FP32 if logit_b != FP32 else 0.0
    local_loss = torch_tp(plan) and plan.runtime.loss_parallel and t > 1
    if torch_tp(plan) and not local_loss:
        # the head's output is replicated: every rank holds the whole vocabulary's logits
        t = 1
    # final-logit soft-cap (Gemma-2: logits = cap·tanh(logits/cap), transformers Gemma2ForCausalLM):
    # the tanh output is saved for backward until the loss gradient reaches it
    capped = logit_b * V * T / t if m.logit_softcap else 0.0
    liger = flow.liger
    if liger is not None and liger.flce:
        _liger_flce(plan, flow, T, parts)
    elif RT.framework(plan) == "megatron-core" and r.method not in ("lora", "qlora"):
        # Megatron's vocab-parallel cross entropy (megatron/core/fusions/fused_cross_entropy.py and
        # tensor_parallel/cross_entropy.py, ``_VocabParallelCrossEntropy``): ``calculate_logits_max``
        # upcasts the c-byte logits to fp32 once, exp / normalisation run in place on that copy,
        # which is saved as the softmax and overwritten in place by its gradient in backward; the
        # gradient handed to the output layer is cast back to c bytes (``grad_input.to(
        # logits_dtype)``). Forward: c-byte logits + the fp32 copy; backward: fp32 + c-byte gradient
        parts.logits_fwd = (logit_b + up) * V * T / t + capped
        parts.logits_bwd = (FP32 + logit_b) * V * T / t + capped
        # Megatron's final norm (TE: input + rsigma) and output layer (its input) save no fp32 copy
        parts.head_saves = (R * h + FP32 + c * h) * T
        parts.head_out = 0.0
    elif plan.runtime.fused_loss:
        # one fused cross-entropy kernel (flash-attn ``losses/cross_entropy.py`` CrossEntropyLoss, the
        # default loss of llm-foundry's MPT, ``loss_fn: fused_crossentropy``): forward keeps the
        # c-byte logits it saves and an fp32 log-sum-exp per token; backward writes a new c-byte
        # gradient beside them (``inplace_backward=False``), no fp32 upcast or log-softmax output
        parts.logits_fwd = logit_b * V * T / t + FP32 * T + capped
        parts.logits_bwd = 2 * logit_b * V * T / t + FP32 * T + capped
    elif local_loss:
        # torch's loss_parallel (torch/distributed/tensor/parallel/loss.py, torch 2.13) keeps the
        # logits vocab-sharded: ``_log_softmax`` runs on the local shard (all-reducing only the
        # row max and sum), where ``shifted = x - x_max`` and ``result = shifted - logsumexp`` are
        # both alive at its end, beside the c-byte logits and ForCausalLMLoss' fp32 upcast; the
        # fused ``_nll_loss_and_log_softmax_backward`` holds the saved log-softmax output x,
        # ``zeros_like(x)``, ``exp(x)`` and their sum at once: 4 fp32 tensors of V/t columns
        parts.logits_fwd = (logit_b + up + 2 * FP32) * V * T / t + capped
        parts.logits_bwd = 4 * FP32 * V * T / t + capped
    else:
        parts.logits_fwd = (logit_b + up + FP32) * V * T / t + capped
        parts.logits_bwd = 3 * FP32 * V * T / t + capped
    if liger is None or not liger.flce:
        parts.logits_grad = logit_b * V * T / t
    if role == "last" and RT.framework(plan) == "hf" and not (liger is not None and liger.flce):
        # torch.distributed.pipelining keeps a stage's output in ``fwd_cache`` until that
        # micro-batch's backward (stage.py ``forward_one_chunk`` / ``backward_one_chunk``): the
        # last stage's c-byte logits outlive the loss into log-softmax backward (Liger's fused
        # loss makes no logits to keep)
        parts.logits_bwd += logit_b * V * T / t


def _liger_flce(plan: Plan, flow: Flow, T: float, parts: Parts) -> None:
    """The head under Liger's fused linear cross-entropy (``LigerFusedLinearCrossEntropyFunction``,
    src/liger_kernel/ops/fused_linear_cross_entropy.py @ ead96b61). Its forward walks the tokens in
    chunks: a chunk's logits (``_input_chunk @ weight.t()``, c bytes) take the loss and, in place, its
    gradient, which is multiplied back at once into ``grad_input`` (``zeros_like(_input)``: the final
    norm's output dtype) and, when the head trains, accumulated into ``grad_weight``
    (``zeros_like(weight)``, the weight's dtype); backward only hands these two on
    (``ctx.save_for_backward(grad_input, grad_weight, ...)``). So the logits are never whole: the
    working set is one chunk of them, the fp32 per-token loss and the two gradient buffers, which
    stay until the head's backward. The final norm is Liger's when the model's norm is RMSNorm."""
    m, r = plan.model, plan.recipe
    h, V = m.hidden_size, m.vocab_size
    R, c = flow.R, flow.c
    ops = flow.liger
    trains_head = r.method not in ("lora", "qlora")
    # transformers' norm keeps x.to(dtype) only when its weight trains (as ``_logits``' own path)
    norm = (liger_norm_bytes(h, R) if (ops is not None and ops.rms_norm)
            else FP32 * h + FP32 + (R * h if trains_head else 0.0))
    # the final norm saves its input (its output feeds only the fused loss, which saves nothing of it)
    parts.head_saves = norm * T
    parts.head_out = 0.0
    grad_w = flow_of(plan)[1] * V * h if trains_head else 0.0
    grad_in = R * h * T
    chunk = liger_flce_chunk(T, h, V) * V * c
    parts.logits_fwd = grad_in + grad_w + chunk + FP32 * T
    parts.logits_bwd = grad_in + grad_w
    parts.logits_grad = 0.0


def inference(plan: Plan, opts: MemoryOptions, parts: Parts, block_tokens: int) -> None:
    """Weights + KV cache for batch × context + the working set of the prefill's widest layer.

    KV cache per token and layer: 2·k·d elements (GQA, Ainslie et al. 2023); under autocast the
    keys are cached after RoPE, i.e. in fp32 (transformers' DynamicCache, measured). MLA caches the
    compressed latent kv_lora_rank + rope dim in a serving engine (DeepSeek-V2, arXiv:2405.04434,
    §2.1.2), while transformers' DynamicCache stores the decompressed a·(d_nope+d_rope) keys and
    a·d_v values. Sliding-window layers keep at most the window; ``paged`` rounds the context up
    to whole blocks (vLLM). Prefill working set (measured, no_grad): the embedding output, the
    layer input, the mid-layer residual and the norm output (4·R·h per token) and three c-byte
    f-wide MLP tensors (routed experts: five per routed token in R bytes); with eager attention the
    larger of those MLP tensors and the attention's b·a·s×s scores at their softmax peak with the
    mask and repeat_kv's K/V (the two are never alive together).
    Generation computes logits for the last token only (``logits_to_keep=1``).
    """
    m, r, lay = plan.model, plan.recipe, plan.layout
    flow, _, _ = flow_of(plan)
    c, R, t = flow.c, flow.R, lay.tp
    ctx = r.seq_len + r.generate_len
    b = r.micro_batch
    n_layers, n_moe = layers_on_stage(plan)
    if opts.kv_cache == "paged":
        ctx = -(-ctx // block_tokens) * block_tokens
    k_bytes = R if flow.autocast else c
    kv_set = plan.serving.kv_cache_dtype
    if kv_set != "auto":  # an explicit KV dtype (e.g. fp8) stores keys and values in it
        k_bytes = c = DTYPE_BYTES[kv_set]
    latent = plan.serving.mla_latent_cache
    latent = opts.kv_cache == "paged" if latent is None else latent
    if m.mla is not None:
        ml = m.mla
        if latent:  # one shared latent per token: every TP rank holds all of it (DeepSeek-V2 §2.1.2)
            per_tok = (ml.kv_lora_rank + ml.qk_rope_head_dim) * c
        else:  # per-head K and V: the heads split over TP
            heads = max(1, m.num_heads // t)
            per_tok = heads * ((ml.qk_nope_head_dim + ml.qk_rope_head_dim) * k_bytes + ml.v_head_dim * c)
    else:  # KV heads split over TP, replicated when fewer than t (vLLM get_num_kv_heads)
        kv_local = max(1, m.num_kv_heads // t) * m.head_dim
        per_tok = kv_local * (c if opts.kv_cache == "paged" else k_bytes) + kv_local * c
    n_sliding = _count_sliding(m) * n_layers / m.num_layers
    win = min(ctx, m.sliding_window or ctx)
    tokens = (n_layers - n_sliding) * ctx + n_sliding * win
    parts.kv_cache = b * tokens * per_tok
    s_pre = -(-r.seq_len // block_tokens) * block_tokens if opts.kv_cache == "paged" else r.seq_len
    tokens_pre = (n_layers - n_sliding) * s_pre + n_sliding * min(s_pre, win)
    parts.kv_prefill = b * tokens_pre * per_tok
    # decode: DynamicCache appends with torch.cat, so one layer's keys (the larger half under
    # autocast: fp32) exist twice for a moment
    k_part = per_tok * k_bytes / (k_bytes + c) if m.mla is None else per_tok / 2
    parts.decode_work = b * ctx * k_part + b * m.vocab_size * (c + FP32) / t if r.generate_len else 0.0
    T = b * r.seq_len
    h = m.hidden_size
    if m.moe and n_moe:  # grouped_mm experts in the residual dtype, per routed token: two gathered
        mo = m.moe  # copies of the input, then gate|up, act, act·up — or the down output, weighted
        fe = mo.expert_intermediate_size
        mlp = mo.top_k * R * max(2 * h + 4 * fe, 4 * h) / t
        mlp += FP32 * mo.num_experts + 4 * INT64 * mo.top_k  # router softmax, indices
        if flow.autocast:  # autocast casts the router input
            mlp += c * h
    else:
        mlp = 3 * c * m.intermediate_size / t
    work = T * 4 * R * h
    if r.attention == "eager":
        # transformers' eager_attention_forward holds, per (b, s, s) element of the prefill (its
        # keys are the s prompt tokens; generation's later tokens attend one query at a time), the
        # c-byte additive mask (masking_utils ``eager_mask``: one b×1×s×s tensor for all heads and
        # layers) and per head, at its peak inside ``softmax(scores, dtype=float32)``: the c-byte
        # masked scores, the fp32 output and, for 16-bit scores, the fp32 copy of the input softmax
        # converts first; the later ``.to(c)`` holds less (the copy is freed). Without autocast:
        # c + 8 bytes per head in 16 bits, c + 4 in fp32 (measured, torch 2.13 / transformers 5.24:
        # tests/unit/test_constants_eager_mask.py). Under autocast: the c-byte scores, their fp32
        # softmax and its c-byte copy, and a c-byte mask. With GQA, ``repeat_kv`` has expanded K
        # and V to every query head (c bytes each per head dim). The scores are freed before the
        # MLP runs: the layer's working set is the larger of the two moments.
        if flow.autocast:
            per_head, mask = FP32 + 2 * c, c
        else:
            per_head, mask = c + FP32 + (FP32 if c < FP32 else 0), c
        s = r.seq_len
        attn = b * s * s * (m.num_heads / t * per_head + mask)
        if m.mla is None and m.num_kv_heads < m.num_heads:
            attn += T * 2 * c * m.q_dim / t
        work += max(T * mlp, attn)
    else:
        work += T * mlp
    parts.infer_work = work + b * m.vocab_size * (c + FP32) / t
    parts.inputs = T * INT64
