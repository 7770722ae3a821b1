"""What each distributed runtime holds per rank: the memory meaning of ``plan.runtime``.

The single-GPU terms (:mod:`.memory_model`) describe torch AMP (``framework=hf``). The runtimes
change which dtype the weights are stored and computed in, what is sharded over which group,
which buffers exist and when gathered parameters are freed:

* **hf** (Trainer / accelerate, torch AMP): fp32 weights + autocast; DDP keeps a flat bucket copy
  of every gradient unless ``gradient_as_bucket_view`` (then ``.grad`` are views into the buckets:
  ``torch/nn/parallel/distributed.py``, DDP docstring "gradient_as_bucket_view ... saves a
  memory overhead equal to the total gradients size"). ``zero`` > 0 keeps trainledger <= 0.1's
  semantics (unchanged).
* **fsdp2** (``fully_shard``, torch/distributed/fsdp/_fully_shard): every parameter is a DTensor
  sharded on dim 0 over the shard group, rank 0 holding ``ceil(d0/N)`` rows (``_fsdp_param.py``
  pads dim 0 to a multiple of N); the fp32 shard is the optimizer's parameter (no separate master);
  ``MixedPrecisionPolicy(param_dtype=bf16)`` casts the shard *before* the all-gather, so the
  gathered (unsharded) parameters are 16-bit and there are no autocast copies: the whole forward
  runs in bf16 (residual stream included). Gathered parameters: the root module's (embedding,
  final norm, head unless wrapped separately) stay gathered from forward into the end of backward
  (the root is never resharded after forward, ``_fsdp_state._root_pre_forward``); each decoder
  layer is gathered for its forward and freed after it (``reshard_after_forward=True``) or kept
  until its backward (False); backward gathers the current layer and prefetches the next one.
  A layer's backward ends with its unsharded ``param_dtype`` gradients being copied into a
  ``reduce_dtype`` reduce-scatter input (``foreach_reduce``); the root group's unsharded gradients
  (head, norm, embedding) live until the root's post-backward at the very end.
* **pytorch-fsdp** (FSDP1, flat parameters, ``use_orig_params``): the same mechanism with one
  flat parameter per wrapped unit (padded to a multiple of N: ``FlatParamHandle._get_shard``).
  With LoRA the adapters sit in their decoder layer's unit (see ``lora_layer_params``).
* **deepspeed** (ZeRO, deepspeed/runtime/zero/stage_1_and_2.py, stage3.py): the model runs in
  16-bit (bf16/fp16 weights, activations and gradients); fp32 master weights and Adam states are
  partitioned for stage >= 1, gradients for stage >= 2 (a 16-bit partition plus the fp32 partition
  the optimizer steps on), 16-bit weights for stage 3 (plus the parameters below
  ``stage3_param_persistence_threshold``, kept whole). Per GPU model states (DeepSpeed's own
  ``estimate_zero2_model_states_mem_needs``: 2Ψ + 18Ψ/N; ``estimate_zero3_...``: 4·largest layer
  + 18Ψ/N; with optimizer offload 2Ψ (stage 2) / 4·largest layer + 2Ψ/N (stage 3) on the GPU).
  Buffers: stage 1/2 reduce in ``reduce_bucket_size``-element 16-bit buckets (two with
  ``overlap_comm``); stage 3 gathers the current layer plus ``stage3_prefetch_bucket_size``
  elements ahead, and keeps at most ``stage3_max_live_parameters`` gathered. Bucket sizes come
  from the plan (``--from ds_config.json``) or DeepSpeed's defaults
  (:data:`DS_DEFAULTS`, deepspeed/runtime/zero/config.py). Host memory with offload: DeepSpeed's
  estimator, ``Ψ·max(4·gpus_per_node, 16)·1.5`` per node for the optimizer (stage 2).
* **megatron-core / megatron-deepspeed**: the model runs in 16-bit with a main-gradient buffer
  (fp32, or ``reduce_dtype=bf16``) and a sharded optimizer: Megatron-Core's ``DistributedOptimizer``
  (fp32 main params and Adam states sharded over DP, i.e. 2+4+(4+8)/N bytes per parameter for
  bf16 with fp32 main grads) or NeMo 1.x's Apex ``DistributedFusedAdam`` (``dist_optimizer=apex``:
  2+4+(2+8)/N, the master kept as 16-bit remainders); under fp8-mixed Transformer Engine's cached
  fp8 weights and transposes unless ``fp8_params`` (see :func:`megatron_states`); Korthikanti et
  al. 2022 for TP+SP activations; vocabulary-parallel embedding and cross-entropy).

Tensor parallelism under hf/fsdp2/pytorch-fsdp is torch's ``parallelize_module``: only the
decoder projections are sharded (colwise q/k/v/gate/up, rowwise o/down); the embedding, the norms
and the head stay replicated unless sequence parallelism (torchtitan's plan: row-wise embedding,
column-wise head) or ``loss_parallel`` shards them, and without ``loss_parallel`` every rank holds
the whole vocabulary's logits. Under megatron/deepspeed TP is Megatron's (all of it sharded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from trainledger.estimate.stage import layers_on_stage
from trainledger.spec.runtime import DS_DEFAULTS, FSDP_STACKS
from trainledger.units import DTYPE_BYTES

FP32 = 4

#: DeepSpeed's estimators multiply host memory by this "additional_buffer_factor" (default 1.5,
#: deepspeed/runtime/zero/stage_1_and_2.py ``estimate_zero2_model_states_mem_needs``).
DS_HOST_BUFFER_FACTOR = 1.5


def framework(plan: Any) -> str:
    rt = getattr(plan, "runtime", None)
    return rt.framework if rt is not None else "hf"


def torch_tp(plan: Any) -> bool:
    """TP is torch's parallelize_module (replicated embedding/norms/head unless SP / loss parallel)."""
    return _torch_tp(plan.layout.tp, framework(plan))


def _torch_tp(tp: int, fw: str) -> bool:
    return tp > 1 and fw in ("hf", "fsdp2", "pytorch-fsdp")


def sixteen_bit_model(plan: Any) -> bool:
    """The runtime runs the whole model in the 16-bit compute dtype (no fp32 residual stream, no
    autocast copies): DeepSpeed and Megatron with a mixed policy, FSDP with param_dtype=bf16."""
    r = plan.recipe
    if not r.precision.endswith("-mixed") or r.method == "qlora":
        return False
    fw = framework(plan)
    if fw in ("deepspeed", "megatron-core", "megatron-deepspeed"):
        return True
    if fw in FSDP_STACKS and fsdp_sharded(plan):
        return plan.runtime.param_dtype == "bf16"
    return False


def op_level_sac(plan: Any) -> bool:
    """``recompute=selective`` is torchtitan's per-op SAC (activations.OP_SAC_SOURCE), not the
    attention-core recomputation of Korthikanti et al.: the fsdp2 runtime (torchtitan's stack)."""
    return framework(plan) == "fsdp2"


def fsdp_sharded(plan: Any) -> bool:
    """FSDP frameworks always shard (zero 0 or 3: full shard; 1/2: shard-grad-op), even on one rank."""
    return framework(plan) in FSDP_STACKS


def shard_group(plan: Any) -> int:
    """Ranks the states are sharded over: DP×CP, or one node's share with hybrid sharding."""
    lay = plan.layout
    n = lay.dp_size * lay.cp
    if lay.hybrid_shard:
        n = min(n, max(plan.cluster.gpus_per_node // max(lay.tp * lay.pp, 1), 1))
    return max(n, 1)


def reshard_after_forward(plan: Any) -> bool:
    return plan.runtime.reshards_after_forward(plan.layout.pp) and plan.layout.zero not in (1, 2)


# ------------------------------------------------------------------------------- parameter shapes
@dataclass(frozen=True, slots=True)
class Shapes:
    """Parameter counts of one rank before (full) and after dim-0 sharding over N (local)."""

    layer_full: float  # one decoder layer, all-gathered (padded), per TP rank
    layer_local: float  # one decoder layer's shard on rank 0
    layers_local: float  # all decoder layers on this stage, shards
    layer_padded: float  # one decoder layer all-gathered with FSDP's dim-0 padding (its units' shards x group)
    emb_full: float
    emb_local: float
    head_full: float  # untied head (0 when tied)
    head_local: float
    norm_full: float  # final norm
    norm_local: float


_COLWISE_END = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "gate_up_proj", "qkv_proj",
                "c_fc", "dense_h_to_4h", "query_key_value", "c_attn", "q_a_proj", "q_b_proj",
                "kv_a_proj_with_mqa", "kv_b_proj")


def _rows(d0: float, n: int) -> float:
    return math.ceil(d0 / n) if n > 1 else d0


@lru_cache(maxsize=4096)
def _layer_shapes(m: Any, i: int, t: int, n: int, flat: bool, ep: int = 1) -> tuple[float, float, float]:
    """(gathered, rank-0 shard, gathered with padding) parameters of decoder layer i under TP t and
    FSDP over n. With expert parallelism under FSDP2 the routed experts are split over ``ep`` ranks:
    torchtitan (parallelize.py ``apply_fsdp``) wraps ``moe.experts`` in its own FSDP unit on the
    data-parallel mesh less EP (n/ep ranks), over expert DTensors already sharded on dim 0 by EP, so
    a rank gathers its E/ep experts beside the block's dense part (its shard is E/n experts' worth
    either way); with fewer experts than the unit's shards it shards dim 1, not the expert index
    (``_experts_shard_placement_fn``: efsdp·ep > E). FSDP1's flat units are taken whole (``ep`` 1)."""
    from trainledger.spec.layers import layer_linears

    lin = layer_linears(m, i)
    total = sum(m.layer_params(i).values())
    vectors = total - sum(x.params for x in lin.values())  # norms (1-D, replicated under TP)
    ne = max(1, n // ep)  # the expert unit's shard group
    full = local = padded = 0.0
    for path, x in lin.items():
        col = path.split(".")[-1] in _COLWISE_END and t > 1
        out = x.out_features / t if col else x.out_features
        inn = x.in_features if col or t == 1 else x.in_features / t
        b = (out if col or t == 1 else x.out_features) if x.bias else 0.0
        if x.count > 1:  # expert stacks: dim 0 is the expert index
            e = x.count / ep
            full += e * (out * inn + b)
            if ep > 1 and ne * ep > x.count:  # fewer experts than shards: torchtitan shards dim 1 (Shard(1))
                rows = e * _rows(out, ne)
                local += rows * inn + (e * _rows(b, ne) if b else 0.0)
                padded += (rows * inn + (e * _rows(b, ne) if b else 0.0)) * ne
            else:
                local += _rows(e, ne) * (out * inn + b)
                padded += _rows(e, ne) * ne * (out * inn + b)
        else:
            full += out * inn + b
            local += _rows(out, n) * inn + (_rows(b, n) if b else 0.0)
            padded += (_rows(out, n) * inn + (_rows(b, n) if b else 0.0)) * n
    h = m.hidden_size
    full += vectors
    v_local = (vectors / h) * _rows(h, n) if h else vectors
    local += v_local
    padded += v_local * n
    if flat:  # FSDP1: one flat parameter, padded to a multiple of n
        local = math.ceil(full / n)
        padded = local * n
    return full, local, padded


@lru_cache(maxsize=4096)
def _stage_shapes(m: Any, count: int, t: int, n: int, flat: bool,
                  ep: int = 1) -> tuple[float, float, float, float]:
    """(largest gathered layer, largest rank-0 layer shard, sum of the shards, largest padded
    gathered layer) over decoder layers 0..count-1: the per-layer walk once per model, TP degree and
    shard group (the planner asks for the same stage thousands of times)."""
    per = [_layer_shapes(m, i, t, n, flat, ep) for i in range(count)]
    return (max(f for f, _, _ in per), max(lo for _, lo, _ in per), sum(lo for _, lo, _ in per),
            max(pd for _, _, pd in per))


def shapes(plan: Any) -> Shapes:
    lay = plan.layout
    n_layers, _ = layers_on_stage(plan)
    return _shapes(plan.model, framework(plan), shard_group(plan) if fsdp_sharded(plan) else 1, lay.tp,
                   lay.sp, plan.runtime.loss_parallel, lay.pp, n_layers, lay.ep)


@lru_cache(maxsize=4096)
def _shapes(m: Any, fw: str, n: int, t: int, sp: bool, loss_parallel: bool, pp: int,
            n_layers: int, ep: int = 1) -> Shapes:
    """``shapes`` from what it reads of the plan: the model, the stack, the shard group, the TP
    degree with its sequence and loss parallelism, the pipeline depth and the stage's layers."""
    flat = fw == "pytorch-fsdp"
    tt = _torch_tp(t, fw)
    layer_full, layer_local, layers_local, layer_padded = _stage_shapes(
        m, min(n_layers, m.num_layers), t, n, flat, 1 if flat else ep)
    h, V = m.hidden_size, m.vocab_size
    sh_emb = m.params.embedding
    vocab_split = t if (tt and sp) or (not tt and t > 1) else 1
    emb_full = sh_emb / vocab_split
    head_split = t if (not tt and t > 1) or (tt and (sp or loss_parallel)) else 1
    from trainledger.estimate.memory.states import model_shape

    head_full = model_shape(m).lm_head / head_split
    if tt and not head_full and (sp or loss_parallel):
        head_full = V * h / head_split  # parallelize_module unties a tied head (own DTensor)
    norm_full = float(h)
    if pp > 1:
        # FSDP + PP (torchtitan: fully_shard on each pipeline stage's module): the first stage holds
        # the embedding, the last the final norm and lm_head (a tied head as its own copy); the
        # busiest stage is the one with the larger of the two, as for the other stacks
        last = head_full or V * h / head_split
        if last >= emb_full:
            emb_full, head_full = 0.0, last
        else:
            head_full, norm_full = 0.0, 0.0
    if flat:
        root = emb_full + head_full + norm_full
        emb_local = math.ceil(root / n)
        head_local = norm_local = 0.0
    else:
        emb_local = _rows(V / vocab_split, n) * (emb_full / max(V / vocab_split, 1))
        head_local = _rows(V / head_split, n) * h if head_full else 0.0
        norm_local = _rows(h, n) if norm_full else 0.0
    return Shapes(layer_full=layer_full, layer_local=layer_local, layers_local=layers_local,
                  layer_padded=layer_padded,
                  emb_full=emb_full, emb_local=emb_local, head_full=head_full, head_local=head_local,
                  norm_full=norm_full, norm_local=norm_local)


def lora_layer_params(plan: Any) -> float:
    """LoRA adapter parameters of one decoder layer on one TP rank (the mean over the layers).

    Under FSDP1 the adapters are taken to sit in their decoder layer's unit (a layer-class wrap
    policy, accelerate's TRANSFORMER_BASED_WRAP; verify wraps so). The HF Trainer instead wraps a
    PEFT model with peft's ``fsdp_auto_wrap_policy`` (each LoRA A and B a unit of its own, the
    layer's flat parameter then frozen): not modelled yet."""
    m, r = plan.model, plan.recipe
    return m.lora_params(tuple(r.lora_targets), r.lora_rank) / m.num_layers / plan.layout.tp


def pipeline_nosync(plan: Any) -> bool:
    """An FSDP2 stage trained under torch.distributed.pipelining: every micro-batch's backward runs
    with ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``, and the
    stage reduce-scatters once, after its last backward (torch/distributed/pipelining/stage.py
    ``backward_maybe_with_nosync``, ``perform_reduce_grad``). Read by the memory moments
    (``fsdp_points``) and the time model's FSDP collectives."""
    return plan.layout.pp > 1 and framework(plan) == "fsdp2" and plan.recipe.is_training


# ------------------------------------------------------------------------------- FSDP
@dataclass(slots=True)
class FsdpParts:
    """Bytes per rank of FSDP's gathered parameters and gradient buffers."""

    root_gathered: float = 0.0  # root group, gathered from forward into the end of backward
    head_gathered: float = 0.0  # separately wrapped head, while it runs
    emb_gathered: float = 0.0  # separately wrapped embedding, while it runs
    layer_gathered: float = 0.0  # one decoder layer, gathered
    layer_grad: float = 0.0  # one layer's unsharded gradients (param dtype)
    layer_reduce: float = 0.0  # one layer's reduce-scatter input (reduce dtype)
    head_grad: float = 0.0  # unsharded head (+ final norm) gradient of the root group
    emb_grad: float = 0.0  # unsharded embedding gradient (root group, end of backward)
    root_reduce: float = 0.0  # the root group's reduce-scatter input
    n_layers: int = 0
    reshard: bool = True


def fsdp_parts(plan: Any) -> FsdpParts:
    r, rt = plan.recipe, plan.runtime
    s = shapes(plan)
    pol = r.policy
    w = DTYPE_BYTES[pol["weights"]]
    mixed = r.precision.endswith("-mixed")
    gb = 2.0 if (mixed and rt.param_dtype == "bf16") else w  # gathered dtype
    rb = (FP32 if rt.reduce_dtype == "fp32" else 2.0) if (mixed and rt.param_dtype == "bf16") else w
    lora = r.method in ("lora", "qlora")
    n_layers, _ = layers_on_stage(plan)
    f = FsdpParts(n_layers=n_layers, reshard=reshard_after_forward(plan))
    # a tied embedding/head cannot be wrapped on its own (FSDP2 needs both in one group): root
    sep = rt.wrap == "layers+embed+head" and framework(plan) == "fsdp2" and bool(s.head_full)
    n = shard_group(plan)
    if framework(plan) == "pytorch-fsdp":  # one flat root unit (padded)
        root = math.ceil((s.emb_full + s.head_full + s.norm_full) / n) * n
        f.root_gathered = gb * root
    elif sep:
        f.root_gathered = gb * s.norm_full
        f.emb_gathered = gb * s.emb_full
        f.head_gathered = gb * s.head_full
    else:
        f.root_gathered = gb * (s.emb_full + s.head_full + s.norm_full)
    layer_padded = s.layer_padded
    f.layer_gathered = gb * layer_padded
    flat = framework(plan) == "pytorch-fsdp"
    if not lora or flat:
        # FSDP1: a flat parameter holding any trainable tensor gets a gradient for all of it (the
        # frozen base weights' part zero-filled), so LoRA reduces whole decoder units (the adapters
        # wrapped inside their decoder layer's unit, as verify wraps them: see ``lora_layer_params``)
        f.layer_grad = gb * s.layer_full
        f.layer_reduce = rb * layer_padded
    else:
        # FSDP2 shards per parameter: the frozen base gets no gradient; a layer's group gathers its
        # adapters with the base and reduces only them
        a = lora_layer_params(plan)
        f.layer_gathered += gb * a
        f.layer_grad = gb * a
        f.layer_reduce = rb * a
    if not lora:
        head = s.head_full or s.emb_full  # tied: the embedding's gradient arrives from the head first
        f.head_grad = gb * (head + s.norm_full)
        f.emb_grad = gb * s.emb_full if s.head_full else 0.0
        f.root_reduce = rb * (s.emb_full + s.head_full + s.norm_full)
        if sep:  # separate groups reduce right after their own backward
            f.head_grad = gb * s.norm_full
            f.root_reduce = rb * s.norm_full
    return f


def fsdp_forward_terms(plan: Any, x: Any) -> dict[str, float]:
    """The forward-end moment of an FSDP step (``fsdp_points``' loss moment) but for its gathered
    parameters (``zero_buffers``), which need the FSDP units' shapes: a lower bound of the step's
    peak from the parts alone (``phases._fit`` rejects a plan on it without the walk)."""
    g_prev = x.grads if plan.recipe.grad_accum > 1 else 0.0
    return {"weights": x.weights, "master_weights": x.master, "optimizer_states": x.states,
            "gradients": g_prev, "autocast_weight_copies": x.copies,
            "activations": x.acts + x.head_saves + x.head_out, "logits": x.logits_fwd,
            "dynamic_cache": x.cache, "other": x.inputs}


def fsdp_points(plan: Any, x: Any) -> list[tuple[str, str, dict[str, float]]]:
    """The moments of an FSDP training step (see the module docstring), term -> bytes."""
    f = fsdp_parts(plan)
    r = plan.recipe
    n = max(f.n_layers, 1)
    pp_nosync = pipeline_nosync(plan)
    ga = r.grad_accum > 1
    g_prev = x.grads if ga else 0.0
    base = {"weights": x.weights, "master_weights": x.master, "optimizer_states": x.states}
    # no reshard after forward: every layer (and a separately wrapped embedding / head) stays
    # gathered from its forward to its backward
    layers_kept = 0.0 if f.reshard else n * f.layer_gathered + f.emb_gathered + f.head_gathered
    gathered_fwd = f.root_gathered + layers_kept
    copies_bwd = x.copies_head if r.recompute == "full" else x.copies
    # FSDP2 frees a forward all-gather's output only after the next group's copy-out (overlap),
    # and the last one in the root's post-forward (torch/distributed/fsdp/_fully_shard/
    # _fsdp_param_group.py ``wait_for_unshard``: ``comm_ctx.all_gather_state``; _fsdp_state.py
    # ``_post_forward``: "Free the last all-gather result"). transformers computes the loss inside
    # the root module's forward, so at the loss the last group's all-gather output (the head's when
    # wrapped on its own, else the last decoder layer's) is still alive
    last_ag = 0.0
    if framework(plan) == "fsdp2" and shard_group(plan) > 1:
        last_ag = f.head_gathered or f.layer_gathered
    fwd = dict(fsdp_forward_terms(plan, x), zero_buffers=gathered_fwd + last_ag)
    # backward starts by gathering (prefetching) the head group, or else the last layer; without
    # reshard-after-forward they are still gathered from forward
    prefetch = (f.head_gathered or f.layer_gathered) if f.reshard else 0.0
    b0 = dict(base, gradients=g_prev, autocast_weight_copies=copies_bwd,
              activations=x.acts + x.head_saves, logits=x.logits_bwd, other=x.inputs,
              zero_buffers=gathered_fwd + prefetch)
    head_bwd = (f.head_gathered + f.layer_gathered if f.head_gathered else prefetch) if f.reshard else 0.0
    b1 = dict(base, gradients=g_prev, autocast_weight_copies=copies_bwd,
              activations=x.acts + x.head_saves + f.head_grad + x.grad_transient,
              logits=x.logits_grad, other=x.inputs, zero_buffers=gathered_fwd + head_bwd)
    points = [("forward", "loss (forward end)", fwd), ("backward", "log-softmax backward", b0),
              ("backward", "lm_head backward", b1)]
    if x.act_layer or x.cp_fwd:  # (+ a context-parallel ring's forward transient)
        points.insert(0, ("forward", "last layer forward", dict(
            base, gradients=g_prev, autocast_weight_copies=x.copies, activations=x.acts + x.act_layer + x.cp_fwd,
            other=x.inputs, zero_buffers=gathered_fwd + f.layer_gathered * f.reshard)))
    for j in (0, n - 1):
        keep = (n - j) / n
        copies = x.copies_layer if r.recompute == "full" else (x.copies - x.copies_head) * keep
        # pipelining's backward does not reshard (pp_nosync below): the layers behind stay gathered
        if f.reshard:
            live_layers = (min(n, j + 2) if pp_nosync else 2) * f.layer_gathered
        else:
            live_layers = (n if pp_nosync else n - j) * f.layer_gathered
        label = "last layer" if j == 0 else "first layer"
        # inside the layer's backward (the MLP's unsharded gradients exist, attention runs) ...
        points.append(("backward", f"{label} backward", dict(
            base, gradients=max(g_prev, x.grads * j / n), autocast_weight_copies=copies,
            activations=x.acts * keep + x.act_layer + x.bwd_work + f.head_grad + x.mlp_share * f.layer_grad,
            other=x.inputs + x.grad_flow, zero_buffers=f.root_gathered + live_layers)))
        # ... and its post-backward: its activations are gone, its unsharded gradients are copied
        # into the reduce-scatter input (foreach_reduce) while the next layer is already gathered
        points.append(("backward", f"{label} reduce-scatter", dict(
            base, gradients=max(g_prev, x.grads * j / n), autocast_weight_copies=copies * (n - j - 1) / max(n - j, 1),
            activations=x.acts * (n - j - 1) / n + f.head_grad + f.layer_grad,
            other=x.inputs + x.grad_flow, zero_buffers=f.root_gathered + live_layers + f.layer_reduce)))
    end = dict(base, gradients=x.grads, activations=f.head_grad + f.emb_grad, other=x.inputs,
               zero_buffers=f.root_gathered + f.emb_gathered + f.root_reduce)
    opt = dict(base, gradients=x.grads, optimizer_temporaries=x.opt_temp)
    points += [("backward", "backward end (root reduce-scatter)", end), ("optimizer", "optimizer step", opt)]
    if pp_nosync:
        # torch.distributed.pipelining runs every micro-batch's backward of an FSDP2 stage with
        # set_requires_gradient_sync(False) and set_reshard_after_backward(False), reduce-scattering
        # only after the last one (torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``);
        # meanwhile FSDP2 upcasts and keeps each unsharded gradient in the reduce dtype
        # (_fsdp_param.py ``to_accumulated_grad_if_needed``): the stage's whole unsharded gradient, from
        # the first micro-batch's backward to the optimizer step
        acc = n * f.layer_reduce + f.root_reduce
        points = [(ph, lb, d if ph == "optimizer" else dict(d, gradients=d.get("gradients", 0.0) + acc))
                  for ph, lb, d in points]
    return points


def fsdp_states(plan: Any, parts: Any, P_t: float, flow: Any) -> None:
    """Weights, gradients, optimizer states of an FSDP rank: shards of the stored parameters."""
    from trainledger.estimate.memory.states import model_shape, optimizer_state_bytes, optimizer_temp_bytes

    r = plan.recipe
    s = shapes(plan)
    pol = r.policy
    # a policy with an fp32 master (fp8-mixed, mxfp8/nvfp4-mixed) keeps it as the sharded parameter
    # itself: FSDP shards the fp32 module parameters and gathers them in param_dtype (torchao
    # Float8Linear under FSDP2 keeps the fp32 weight and casts at all-gather time: torchao
    # float8/fsdp_utils.py ``WeightWithDynamicFloat8CastTensor``); its gradient lands in that dtype
    master = pol["master"] != "none"
    w = FP32 if master else DTYPE_BYTES[pol["weights"]]
    local = s.layers_local + s.emb_local + s.head_local + s.norm_local
    lora = r.method in ("lora", "qlora")
    parts.weights = local * w + (P_t * 4.0 / shard_group(plan) if lora else 0.0)
    parts.master = 0.0
    if not r.is_training:
        return
    sh = model_shape(plan.model)
    train = P_t / shard_group(plan) if lora else local
    g_bytes = 4.0 if (lora or master) else DTYPE_BYTES[pol["grads"]]
    # LoRA adapters keep fp32 states whatever the base's policy, unless the states dtype is stated
    s_bytes = DTYPE_BYTES[pol["states"]] if (r.optimizer_states_dtype or not lora) else FP32
    parts.grads = train * g_bytes
    parts.states = optimizer_state_bytes(r.optimizer, train, s_bytes, sh, train / max(local, 1))
    parts.opt_temp = optimizer_temp_bytes(r.optimizer, train, s_bytes, sh.largest_param / shard_group(plan), w)
    parts.ddp = 0.0
    parts.zero_buf = 0.0


# ------------------------------------------------------------------------------- DeepSpeed
def ds_config(plan: Any) -> dict[str, int]:
    """Bucket sizes: the plan's (imported from a ds_config.json) or DeepSpeed's defaults."""
    rt = plan.runtime
    out = dict(DS_DEFAULTS)
    for k in DS_DEFAULTS:
        v = getattr(rt, "ds_" + k, None)
        if v is not None:
            out[k] = int(v)
    return out


def ds_overlap_comm(plan: Any) -> bool:
    v = getattr(plan.runtime, "ds_overlap_comm", None)
    return plan.layout.zero == 3 if v is None else bool(v)


def deepspeed_states(plan: Any, parts: Any, P: float, P_t: float, largest_layer: float) -> None:
    """ZeRO model states and buffers per GPU, as DeepSpeed allocates them (module docstring).

    Ψ = local parameters (after TP/PP), N = data-parallel shards, c = 16-bit bytes:
    stage 0: cΨ weights + cΨ grads + 4Ψ fp32 master + 4Ψ fp32 grads + 8Ψ Adam (BF16_Optimizer);
    stage 1: cΨ + cΨ + (4+4+8)Ψ/N; stage 2: cΨ + (c+4+4+8)Ψ/N (= DeepSpeed's 2Ψ + 18Ψ/N);
    stage 3: (c+4+4+8)Ψ/N (one fp32 gradient partition) + 2·c·largest layer (its gathered weights
    and gradients: DeepSpeed's "4·largest_layer_params"); optimizer offload moves the fp32 master, fp32 gradients and states
    to the host.
    """
    from trainledger.estimate.memory.states import model_shape, optimizer_state_bytes

    r, lay = plan.recipe, plan.layout
    cfg = ds_config(plan)
    z = lay.zero
    N = shard_group(plan)
    pol = r.policy
    c = 2.0 if pol["compute"] in ("bf16", "fp16", "fp8") else 4.0
    lora = r.method in ("lora", "qlora")
    frozen = P - P_t if lora else 0.0
    train = P_t
    sh = model_shape(plan.model)
    persist = 0.0
    if z == 3:
        persist = _persistent_params(plan, cfg["stage3_param_persistence_threshold"])
    w16 = (train + frozen) * c
    parts.weights = (w16 / N + persist * c) if z == 3 else w16
    if not r.is_training:
        return
    fp32_master = c < 4
    master = train * FP32 if fp32_master else 0.0
    states = optimizer_state_bytes(r.optimizer, train, FP32, sh, train / max(P, 1))
    fp32_grads = train * FP32 if fp32_master else 0.0
    g16 = train * c
    parts.master = master / N if z >= 1 else master
    parts.states = states / N if z >= 1 else states
    # 16-bit gradients live through backward (stage 2/3: a contiguous partition, all step); the
    # fp32 partition the optimizer steps on is made in step() and dropped after it
    parts.grads = g16
    parts.layer_grads = parts.layer_grads * c / 4.0
    parts.grad_head = parts.grad_head * c / 4.0
    parts.grad_transient = 0.0
    parts.emb_grad_transient = parts.emb_grad_transient * c / 4.0
    parts.opt_temp = fp32_grads / N if z >= 1 else fp32_grads  # fused Adam updates in place
    if z >= 2:
        parts.grads = 0.0
        parts.grads_static = g16 / N
        parts.layer_grads = parts.grad_head = parts.emb_grad_transient = 0.0
    if z == 3 and fp32_master:
        # stage 3 reduces straight into one persistent flat partition in the gradient-accumulation
        # dtype (fp32; stage3.py ``grad_partitions_flat_buffer``), which is the fp32 master's .grad
        parts.grads_static = fp32_grads / N
        parts.opt_temp = 0.0
    parts.ddp = 0.0
    bucket = cfg["reduce_bucket_size"] * c * (2 if ds_overlap_comm(plan) else 1)
    if z in (1, 2) and lay.dp_size > 1:
        parts.zero_buf = min(bucket, g16)
    elif z == 3:
        gather = min(largest_layer + cfg["stage3_prefetch_bucket_size"], cfg["stage3_max_live_parameters"])
        parts.zero_buf = gather * c + largest_layer * c + min(bucket, g16 / N)
    elif z == 0 and lay.dp_size > 1:
        parts.zero_buf = min(cfg["reduce_bucket_size"] * c, g16)
    if lay.offload in ("optimizer", "params"):
        # ZeRO-Offload: fp32 master, states and fp32 gradient partition live on the host (4+8+4
        # bytes/param: DeepSpeed's "16"); the 16-bit gradients are copied out bucket by bucket into
        # the host's fp32 partition, so no gradient partition stays on the GPU
        host = parts.master + parts.states + (fp32_grads / N if z >= 1 else fp32_grads)
        parts.master = parts.states = parts.opt_temp = parts.grads_static = 0.0
        if lay.offload == "params" and z == 3:
            host += parts.weights
            parts.weights = persist * c
        parts.host = host * DS_HOST_BUFFER_FACTOR
    del sh


def _persistent_params(plan: Any, threshold: int) -> float:
    """Parameters below stage3_param_persistence_threshold stay whole on every rank (norms,
    biases): DeepSpeed's ``persistence_threshold`` in ``DeepSpeedZeRoOffload``."""
    m = plan.model
    from trainledger.spec.layers import layer_linears

    total = 0.0
    for i in range(m.num_layers):
        lin = layer_linears(m, i)
        vec = sum(m.layer_params(i).values()) - sum(x.params for x in lin.values())
        total += vec if m.hidden_size < threshold else 0.0
        total += sum(x.out_features for x in lin.values() if x.bias and x.out_features < threshold)
    if m.hidden_size < threshold:
        total += m.hidden_size
    return total / plan.layout.pp


def deepspeed_host_bytes(plan: Any, total_params: float) -> float:
    """DeepSpeed's own host estimate for ZeRO-2/3 optimizer offload (per node, its formulas)."""
    lay = plan.layout
    g = plan.cluster.gpus_per_node
    nodes = plan.cluster.nodes
    if lay.zero == 3:
        per = 18 if lay.offload == "params" else 16
        return total_params * per / nodes * DS_HOST_BUFFER_FACTOR
    return total_params * max(4 * g, 16) * DS_HOST_BUFFER_FACTOR / 1


# ------------------------------------------------------------------------------- Megatron
def megatron_states(plan: Any, parts: Any, P: float, P_t: float, te_linear: float = 0.0) -> None:
    """Megatron-Core: 16-bit weights, a main-gradient buffer, a sharded optimizer (``zero`` >= 1).

    ``te_linear``: this rank's decoder-layer linear parameters (Transformer Engine modules).

    * Gradient buffer: allocated once when the model is wrapped and only zeroed between steps
      (megatron/core/distributed/param_and_grad_buffer.py, ``_ParamAndGradBuffer``:
      ``self.grad_data = torch.zeros(self.numel, dtype=self.grad_dtype, ...)``), so it lives all
      step, in ``runtime.reduce_dtype``: fp32 by default (Megatron-LM @ core_r0.8.0
      megatron/training/arguments.py forces ``accumulate_allreduce_grads_in_fp32`` with --bf16;
      ``--grad-reduce-in-bf16`` from core_r0.12.0 turns it off). NeMo 1.x's Apex optimizer points
      every ``param.main_grad`` into its contiguous grad buffer of ``grad_sync_dtype``
      (nemo/core/optim/distributed_adam.py @ v2.0.0rc0 ``zero_grad``: ``grad_buffer_view``; apex
      @ 24.07 contrib/optimizers/distributed_fused_adam.py ``_init_grad_buffer``), whose default
      is the state dtype fp32 (``grad_sync_dtype = dtype`` when unset).
    * ``dist_optimizer=mcore`` (megatron/core/optimizer/distrib_optimizer.py): fp32 main params
      and Adam states sharded over DP: 4 + 8 bytes per parameter / N. With a bf16 gradient buffer
      the step casts its gradient shard to fp32 (``_copy_model_grads_to_main_grads``:
      ``shard_model_grad.float()`` @ core_r0.12.0): 4/N bytes during the step.
    * ``dist_optimizer=apex`` (NeMo 1.x ``optim.name: distributed_fused_adam``; NeMo @ v2.0.0rc0
      megatron_base_model.py ``setup_optimization``: state dtype fp32, ``param_sync_dtype`` = the
      bf16 model dtype, hence ``store_params=False, store_param_remainders=True`` unless
      ``fp8_params`` (then ``store_params=True``)): Apex ``StateBucket`` keeps per parameter
      shard the int16 remainders of the fp32 master (2 bytes, or the fp32 master: 4) and the two
      fp32 moments (8); the reduce-scatter writes each bucket's gradient shard into a separate
      ``sync_grads_shard`` (``_start_bucket_grad_sync``: ``torch.empty([shard_size], ...)``) kept
      as ``grads_shard`` until ``zero_grad``: grad bytes / N through the optimizer step.
    * fp8-mixed (megatron-core + Transformer Engine): Megatron-Core passes ``is_first_microbatch``
      to TE's linears (megatron/core/transformer/custom_layers/transformer_engine.py @ core_r0.8.0,
      unless ``disable_parameter_transpose_cache``), so TE casts each bf16 weight once per step
      into a cached workspace with its transpose (TE v1.8 pytorch/module/linear.py
      ``get_fp8_workspace(cache_name="weight", with_transpose=...)``): 1 + 1 bytes per linear
      parameter held beside the bf16 weight. With ``fp8_params`` the weights are TE fp8 tensors
      (1 byte + the cached transpose: 2 bytes, no bf16 copy).
    """
    from trainledger.estimate.memory.states import model_shape, optimizer_state_bytes

    r, lay, rt = plan.recipe, plan.layout, plan.runtime
    N = _megatron_shards(plan, P, shard_group(plan))
    pol = r.policy
    c = 2.0 if pol["compute"] in ("bf16", "fp16", "fp8") else 4.0
    z = lay.zero
    te = framework(plan) == "megatron-core"
    fp8 = te and pol["compute"] == "fp8" and "gemm" not in pol  # per-tensor scaled TE fp8
    fp8_params = fp8 and rt.fp8_params
    # zero 3: Megatron-FSDP / torch FSDP2 under Megatron-Core (``--use-megatron-fsdp``) also shards
    # the 16-bit weights and gathers one unit at a time (current + prefetched, fp32 reduce-scatter)
    parts.weights = P * c / (N if z == 3 else 1)
    if fp8 and not fp8_params and z != 3:
        # TE's cached fp8 weight + its transpose (the transpose only when grad is enabled)
        parts.weights += te_linear * (2.0 if r.is_training else 1.0)
    if not r.is_training:
        return
    sh = model_shape(plan.model)
    dist = lay.zero >= 1
    apex = te and rt.dist_optimizer == "apex"
    g = FP32 if c == 4.0 or rt.reduce_dtype == "fp32" else 2.0
    if c == 4.0:
        master = 0.0
    elif (apex or r.optimizer_states_dtype) and not fp8_params and r.precision != "fp16-mixed":  # bf16 weights
        # store_param_remainders: the low 16 bits of the fp32 master (int16) -- Apex's
        # DistributedFusedAdam, and Megatron-Core's precision-aware optimizer (a stated states dtype;
        # OptimizerConfig.store_param_remainders, default True, megatron/core/optimizer/optimizer_config.py)
        master = 2.0
    else:
        master = FP32
    parts.master = P_t * master / (N if dist else 1)
    # fp32 moments, or the precision-aware optimizer's (--exp-avg-dtype / --exp-avg-sq-dtype)
    s_bytes = DTYPE_BYTES[r.optimizer_states_dtype] if r.optimizer_states_dtype else FP32
    parts.states = optimizer_state_bytes(r.optimizer, P_t, s_bytes, sh, P_t / max(P, 1)) / (N if dist else 1)
    parts.grads_static = P_t * g / (N if lay.zero >= 2 else 1)
    parts.grads = 0.0
    if apex:
        parts.opt_temp = P_t * g / N if dist else 0.0  # the reduced gradient shards (grads_shard)
    else:
        parts.opt_temp = P_t * FP32 / (N if dist else 1) if g < FP32 and c < 4.0 else 0.0  # .float()
    parts.ddp = 0.0
    if z == 3:
        unit = max(sh.max_layer / lay.tp, sh.embedding / lay.tp)
        parts.zero_buf = 2 * unit * c + unit * FP32
    else:
        parts.zero_buf = 0.0


def _megatron_shards(plan: Any, P: float, N: int) -> float:
    """Effective shard count of a rank's states: the distributed optimizer shards dense parameters
    over the data-parallel group (N) and expert parameters over the expert-data-parallel group
    EDP = tp·cp·dp / (etp·ep) (megatron/core/parallel_state.py; MoE parallel folding,
    arXiv:2504.14960 §3), so a rank holds (P - E)/N + E/EDP of its P parameters, E of them experts."""
    from trainledger.estimate.memory.states import model_shape
    from trainledger.estimate.stage import Stage

    m, lay = plan.model, plan.layout
    if m.moe is None or not P:
        return float(N)
    e = model_shape(m).experts * Stage.of(plan).layers / m.num_layers / (lay.ep * lay.expert_tp)
    e = min(e, P)
    return P / ((P - e) / N + e / lay.expert_dp)


def runtime_note(plan: Any) -> str:
    """One line naming the runtime semantics assumed (part of every memory estimate's notes)."""
    from trainledger.spec.runtime import FRAMEWORK_TEXT

    fw = framework(plan)
    lay = plan.layout
    text = f"runtime {fw}: {FRAMEWORK_TEXT.get(fw, fw)}"
    if fw == "fsdp2":
        rt = plan.runtime
        text += (f"; fully_shard over {shard_group(plan)} ranks, reshard_after_forward="
                 f"{reshard_after_forward(plan)}, param_dtype={rt.param_dtype}, reduce_dtype={rt.reduce_dtype}, "
                 f"wrap={rt.wrap}")
    elif fw == "pytorch-fsdp":
        text += f"; flat parameters sharded over {shard_group(plan)} ranks"
    elif fw == "deepspeed":
        cfg = ds_config(plan)
        text += (f"; ZeRO-{lay.zero} over {shard_group(plan)} ranks, reduce_bucket_size "
                 f"{cfg['reduce_bucket_size']:.3g}" + (f", prefetch {cfg['stage3_prefetch_bucket_size']:.3g}"
                                                      if lay.zero == 3 else ""))
    elif fw == "hf" and lay.dp_size > 1 and not lay.zero:
        text += f"; DDP gradient_as_bucket_view={plan.runtime.gradient_as_bucket_view}"
    elif fw in ("megatron-core", "megatron-deepspeed") and plan.recipe.is_training:
        rt = plan.runtime
        opt = ("Apex DistributedFusedAdam (NeMo distributed_fused_adam)" if rt.dist_optimizer == "apex"
               and fw == "megatron-core" else "distributed optimizer")
        text += f"; {opt}, {rt.reduce_dtype} gradient buffer"
        if plan.recipe.precision == "fp8-mixed" and fw == "megatron-core":
            text += ", fp8 weights (fp8_params)" if rt.fp8_params else ", bf16 weights + TE's cached fp8 copies"
    if lay.tp > 1:
        text += ("; torch TP (parallelize_module): embedding/norms/head replicated unless SP/loss parallel"
                 if torch_tp(plan) else "; Megatron TP (vocab-parallel embedding and cross-entropy)")
    return text
