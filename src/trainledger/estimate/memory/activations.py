"""Activation memory of one decoder layer, per token, in the reference runtime (torch + transformers).

The bytes a training step keeps for backward are the tensors autograd saves. We count them by
following the dtype of every saved tensor through one Hugging Face decoder layer (Llama-style
pre-norm block; Qwen2/Qwen3/Mistral/Mixtral/OLMoE/DeepSeek share it). The rules, each measured on
torch 2.13 + transformers 5 with a saved-tensor hook (see tests/groundtruth/test_memory_accuracy.py):

* RMSNorm (``x.float(); x * rsqrt(mean(x^2)); w * x.to(dtype)``) saves the fp32 view of its input
  (4h), ``rsqrt`` (4 per token) and ``x.to(input_dtype)`` (R·h). Its output has dtype R.
* Under autocast every ``nn.Linear`` casts its input to the compute dtype and saves the cast; a
  tensor read by n linears is cast n times (q, k, v each cast the norm output). Without autocast,
  or when the input already has the compute dtype, the input itself is saved once.
* RoPE multiplies the c-byte projections by fp32 (autocast) cos/sin, so q_embed/k_embed have dtype
  R; SDPA/flash then saves c-byte q, k, v, its c-byte output and the fp32 logsumexp (4a per token)
  and never an s×s matrix. Eager attention saves q, the repeated k and v (c·a·d each), the fp32
  softmax (4·a·s per token) and, if it differs, its c-byte copy (c·a·s per token).
* A gated MLP saves gate, up, act(gate) and act·up (4·c·f); a plain MLP fc1 and act (2·c·f).
* The residual stream has dtype R = max(embedding dtype, c): fp32 under autocast with fp32
  weights, because ``nn.Embedding`` is not autocast.

These agree with Korthikanti et al. 2022 (arXiv:2205.05198) §4.1, which counts the same saved
inputs for a GPT layer in 16-bit (34·s·b·h + 5·a·s²·b); the differences (fp32 residual and norm
saves, separate casts per linear, no dropout masks, flash attention) are the runtime's.

Glossary: h hidden, a heads, k KV heads, d head dim, f FFN width, E experts, K top-k, V vocab,
s sequence, b micro-batch, c compute-dtype bytes, R residual-dtype bytes, t TP degree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainledger.spec.model import ModelSpec
from trainledger.spec.runtime import LigerOps

FP32 = 4
INT64 = 8
#: Megatron-LM activation bytes per layer (Korthikanti et al. 2022, Table 2), 16-bit activations,
#: 1-byte dropout masks, 4h GELU MLP, explicit attention scores.
KORTHIKANTI_SOURCE = "Korthikanti et al. 2022, arXiv:2205.05198, Table 2 / Eq. 1-2"


#: families whose RMSNorm multiplies the weight in fp32 and casts afterwards (saves fp32 x·rsqrt)
NORM_WEIGHT_IN_FP32 = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "olmo2", "olmo3"})


#: tensors Liger's gated-MLP kernels save per FFN element: gate and up (not act(gate), act·up)
LIGER_GLU_SAVES = 2


def liger_norm_bytes(width: int, src: int, groups: int = 1) -> float:
    """Liger's RMSNorm (``LigerRMSNormFunction``, src/liger_kernel/ops/rms_norm.py @ ead96b61):
    ``ctx.save_for_backward(X, W, RSTD)``, the input in its own dtype and one fp32 rstd per row
    (the weight is a parameter, not an activation); the fp32 upcast and the normalised copy that
    transformers' RMSNorm keeps live only in the kernel's registers."""
    return src * width + FP32 * groups


@dataclass(frozen=True, slots=True)
class Flow:
    """Dtypes (bytes per element) that activations take under one precision policy."""

    c: int  # compute dtype of matmul inputs/outputs
    R: int  # residual stream (embedding output, residual adds, norm outputs)
    autocast: bool  # linears cast their inputs (weights are not in the compute dtype)
    #: bytes of peft's LoRA adapter weights: fp32 (peft's autocast_adapter_dtype=True upcasts them),
    #: or the compute dtype when the runtime casts every parameter (FSDP MixedPrecisionPolicy,
    #: DeepSpeed/Megatron 16-bit modules)
    adapter: int = 4
    #: Liger Kernel's replacements of the transformers modules (``Plan.liger``; None: the model's own)
    liger: LigerOps | None = None
    #: routed rows an expert holds relative to its mean share (``Recipe.expert_rows``: padding to
    #: the capacity factor, or dropping below it)
    expert_rows: float = 1.0


@dataclass(frozen=True, slots=True)
class LoraShape:
    """What LoRA changes in the saved tensors: rank, wrapped modules, adapter dropout."""

    rank: int
    targets: tuple[str, ...]
    dropout: bool
    #: FSDP1 flat parameters: a unit's parameters are views of one FlatParameter, which requires
    #: grad when any of them does (torch/distributed/fsdp/_flat_param.py, ``FlatParameter`` is
    #: one ``nn.Parameter``; ``_use_unsharded_views`` hands the modules views of it), so a LoRA
    #: layer's frozen base weights require grad in autograd and every op saves what a weight
    #: gradient needs (as in full fine-tuning), beside the adapters' own saves
    flat_units: bool = False


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """Saved bytes per token of one decoder layer, split so TP/SP/CP/recompute can scale parts.

    ``replicated`` is what Megatron TP without sequence parallelism keeps on every rank (norms,
    residual, inputs of column-parallel linears); ``sharded`` is divided by t; ``per_s`` is
    multiplied by the attended length (s×s scores, divided by t).
    """

    replicated: float
    sharded: float
    per_s: float
    layer_input: float  # what full recomputation keeps: the layer input (R·h)
    cache_extra: float  # fp32 K copy the DynamicCache keeps during forward (use_cache)
    first_layer_saving: float  # LoRA: layer 0's first norm saves nothing (its input needs no grad)
    per_layer_const: float = 0.0  # bytes per layer and micro-batch independent of tokens (LoRA experts)
    first_layer_per_s: float = 0.0  # LoRA: layer 0's scores, not kept when q, k, v need no gradient
    core_drop: float = 0.0  # selective recompute: what the checkpointed attention core no longer saves
    core_keep: float = 0.0  # ... and the core inputs the checkpoint keeps instead (q, k after RoPE, v)
    #: part of ``replicated``: the saved inputs of the column-parallel linears. Megatron's sequence
    #: parallelism saves them sequence-sharded (and all-gathers again in backward); torch's
    #: ``PrepareModuleInput`` hands the linears the gathered tensor, which they save whole.
    linear_inputs: float = 0.0

    def total(self, s_attended: float) -> float:
        return self.replicated + self.sharded + self.per_s * s_attended


class _Layer:
    """Accumulates the saved bytes of one layer while walking its modules (see module docstring)."""

    def __init__(self, m: ModelSpec, flow: Flow, lora: LoraShape | None, moe_layer: bool) -> None:
        from trainledger.spec.layers import PEFT_MOE_CONVERSION, converted, layer_linears, matches

        self.m, self.flow, self.lora = m, flow, lora
        # weights that need a gradient in autograd: all without LoRA, and with FSDP1's flat units
        self.trainable = lora is None or lora.flat_units
        lin = layer_linears(m, 0 if not moe_layer else _first_moe(m))
        # peft >= 0.21 converts gate/up/down targets of these MoE families to the expert stacks:
        # they then wrap no nn.Linear (not even a dense layer's MLP or the shared expert)
        names = PEFT_MOE_CONVERSION.get(m.model_type, {}) if (lora and m.moe) else {}
        roles, targets = converted(tuple(lora.targets), names) if names else (set(), lora.targets if lora else ())
        self.wrapped = {p for p, x in lin.items() if lora and x.count == 1
                        and any(matches(p, t) for t in targets)}
        self.lin = lin
        self.lora_experts = moe_layer and bool(roles - {"router"})

    def norm(self, width: int, src: int, groups: int = 1) -> float:
        """RMSNorm: fp32 input (4w), rsqrt (4 per group) and, when its weight trains, what the
        weight multiplies: x.to(src) (Llama style) or the fp32 x·rsqrt (Gemma/OLMo-2 style).
        Liger's RMSNorm keeps only its input and the fp32 rstd (:func:`liger_norm_bytes`)."""
        if self.m.norm_type == "layernorm":
            # torch.nn.LayerNorm is one kernel (aten ``native_layer_norm``) whose backward reads its
            # input and the fp32 mean and rstd of each row (``native_layer_norm_backward``); the affine
            # weight and bias are applied inside it, so nothing else is saved. Autocast runs
            # layer_norm in fp32 (its fp32 op list), keeping the fp32 input; else the input itself
            return (FP32 if self.flow.autocast else src) * width + 2 * FP32 * groups
        if self.flow.liger is not None and self.flow.liger.rms_norm:
            return liger_norm_bytes(width, src, groups)
        kept = FP32 if self.m.model_type in NORM_WEIGHT_IN_FP32 else src
        return FP32 * width + FP32 * groups + (kept * width if self.trainable else 0)

    def inputs(self, width: int, src: int, readers: tuple[str, ...], already_saved: bool = False) -> float:
        """Saved inputs of the linears in ``readers`` (module paths) reading one tensor of
        ``width`` elements of ``src`` bytes: under autocast each saver keeps its own cast; else the
        tensor itself is kept once (nothing extra when another op saves it already). A frozen
        base linear keeps only its weight; a LoRA-wrapped one's adapter keeps the input."""
        f = self.flow
        present = [r for r in readers if r in self.lin]
        savers = present if self.trainable else [r for r in present if r in self.wrapped]
        out = 0.0
        if savers:
            if f.autocast and (src != f.c or not self.trainable):
                # peft casts x to the fp32 adapter dtype first, so lora_A always makes its own cast
                out += len(savers) * f.c * width
            elif not already_saved and (self.trainable or src == FP32 or src == f.adapter):
                out += src * width
        for _r in (r for r in present if r in self.wrapped) if self.lora is not None else ():
            out += self._lora(width, src)
        return out

    def _lora(self, width: int, src: int) -> float:
        """peft LoRA (fp32 adapters): lora_A output, and without autocast an fp32 input copy."""
        assert self.lora is not None
        f, r = self.flow, self.lora.rank
        out = (f.c if f.autocast else f.adapter) * r
        if not f.autocast and src != f.adapter:
            out += f.adapter * width  # peft casts x to the adapter dtype
        if self.lora.dropout:
            out += width + (0 if f.autocast else src * width)  # bool mask (+ the dropped copy)
        return out


def _first_moe(m: ModelSpec) -> int:
    return next(i for i in range(m.num_layers) if m.is_moe_layer(i))


def _attention(x: _Layer, attention: str, masked: bool,
               mla: str = "math") -> tuple[float, float, float, float, float]:
    """(replicated, sharded, per attended position, core_drop, core_keep) bytes per token.

    ``masked``: transformers passes SDPA an explicit mask (sliding window shorter than the
    sequence): GQA then repeats k and v (``repeat_kv``) and every layer keeps a c-byte mask.
    """
    m, f = x.m, x.flow
    c, R = f.c, f.R
    a, q, kv = m.num_heads, m.q_dim, m.kv_dim
    if m.mla is not None:
        rep, sh, per_s = _mla(x, attention, mla)
        return rep, sh, per_s, 0.0, 0.0
    if getattr(m, "fused_qkv", False):
        rep = x.inputs(m.hidden_size, R, ("self_attn.qkv_proj",))
    else:
        rep = x.inputs(m.hidden_size, R, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
    sh = 0.0
    if m.qk_norm != "none":
        groups = (a + m.num_kv_heads) if m.qk_norm == "head" else 2
        sh += x.norm(q + kv, c, groups)
    sh += x.inputs(q, c, ("self_attn.o_proj",), already_saved=True)  # the SDPA/bmm output
    out = c * q
    grouped = a > m.num_kv_heads
    rope = R if f.autocast else c  # q, k after RoPE with R-byte cos/sin
    # Phi-3's fused qkv_proj: v is a view of the fused output, so saving v for the attention
    # backward keeps the whole q|k|v buffer alive (transformers Phi3Attention slices qkv)
    fused_rest = c * (q + kv) if m.model_type == "phi3" and m.fused_qkv else 0.0
    keep = rope * (q + kv) + c * kv
    if attention == "eager":
        # eager: the bmm output is saved only by an o_proj that needs its input (trainable, or a
        # LoRA adapter on it); a frozen o_proj keeps just its weight (matmul backward saves probs, v)
        if not (x.trainable or "self_attn.o_proj" in x.wrapped):
            out = 0.0
        k_saved = c * q if grouped else c * kv
        probs_copy = c * a if c != FP32 else 0
        # Gemma-2 soft-capping, cap·tanh(scores/cap): tanh saves its c-byte output for backward
        # (transformers gemma2 ``eager_attention_forward``); the division and the product save nothing
        capped = c * a if getattr(m, "attn_softcap", None) else 0
        core = c * q + 2 * k_saved + fused_rest
        return rep, sh + core + out, FP32 * a + probs_copy + capped, core, keep
    k_saved = c * q if (masked and grouped) else c * kv
    core = c * q + 2 * k_saved + FP32 * a + fused_rest
    per_s = c if masked else 0.0  # each layer's SDPA keeps its own c-byte copy of the mask
    return rep, sh + core + out, per_s, core, keep


def _mla(x: _Layer, attention: str, kernel: str = "math") -> tuple[float, float, float]:
    """DeepSeek MLA: low-rank q/kv projections with their norms; keys and queries carry
    d_q = d_nope + d_rope per head, values d_v. The attention core runs in the kernel
    :func:`mla_kernel` names: ``math`` saves fp32 scores (4·a·s per token) like eager attention;
    ``fused`` keeps q, k, v, its output and the fp32 softmax statistics, no s×s scores; ``padded``
    (FlashAttention, which needs equal head dims) keeps v and its output padded to d_q and o_proj
    its own copy of the sliced output."""
    m, f = x.m, x.flow
    ml = m.mla
    assert ml is not None
    c, R, a, h = f.c, f.R, m.num_heads, m.hidden_size
    dq, dv = ml.qk_nope_head_dim + ml.qk_rope_head_dim, ml.v_head_dim
    rep = x.inputs(h, R, ("self_attn.q_a_proj", "self_attn.q_proj", "self_attn.kv_a_proj_with_mqa"))
    sh = 0.0
    if ml.q_lora_rank:
        sh += x.norm(ml.q_lora_rank, c) + x.inputs(ml.q_lora_rank, R, ("self_attn.q_b_proj",))
    sh += x.norm(ml.kv_lora_rank, c) + x.inputs(ml.kv_lora_rank, R, ("self_attn.kv_b_proj",))
    if kernel == "math":
        probs_copy = c * a if (attention == "eager" and c != FP32) else 0
        sh += x.inputs(a * dv, R, ("self_attn.o_proj",))
        return rep, sh + R * a * (2 * dq + dv), FP32 * a + probs_copy
    if kernel == "padded":  # q, k and the padded v (3·d_q), the padded output (d_q), its lse
        sh += x.inputs(a * dv, c, ("self_attn.o_proj",))
        return rep, sh + c * a * (3 * dq + dq) + FP32 * a, 0.0
    sh += x.inputs(a * dv, c, ("self_attn.o_proj",), already_saved=True)
    return rep, sh + c * a * (2 * dq + dv) + c * a * dv + FP32 * a, 0.0


def mla_kernel(m: ModelSpec, attention: str, framework: str, device: str = "gpu") -> str:
    """The kernel that runs MLA's attention core (see :func:`_mla`); "" for models without MLA.

    * ``eager`` attention, and torch SDPA on the CPU when d_q != d_v: ``math``. The CPU's flash
      kernel needs equal head dims (aten sdp_utils_cpp.cpp, ``check_head_dim_size_cpp``), so SDPA
      falls back to its math kernel — what a CPU verification run measures.
    * SDPA on a GPU: ``fused``. The memory-efficient kernel requires only d_q = d_k and both
      aligned (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
      ``check_head_dim_size_mem_efficient``), so transformers' DeepSeek-V3 ``sdpa`` path runs it
      where flash (``check_head_dim_size_flash``: q, k, v dims equal) is ruled out.
    * Megatron-Core: ``fused`` — Transformer Engine's FusedAttention, which MLASelfAttention calls
      through TEDotProductAttention, takes d_q != d_v (NVIDIA/TransformerEngine PR #1039, "Add
      support for multi-latent attention (MLA)", 2024-07).
    * FlashAttention (``flash``/``flash1``): ``padded`` — the kernel needs equal head dims, and
      transformers' DeepseekV3Attention pads v to d_q before it and slices the output after.
    """
    ml = m.mla
    if ml is None:
        return ""
    if attention == "eager":
        return "math"
    if framework == "megatron-core" or ml.qk_nope_head_dim + ml.qk_rope_head_dim == ml.v_head_dim:
        return "fused"
    if attention in ("flash", "flash1"):
        return "padded"
    return "math" if device == "cpu" else "fused"


def _mlp(x: _Layer, prefix: str, width: int) -> tuple[float, float]:
    """(replicated, sharded): input casts of gate/up and the 4·c·f (gated) or 2·c·f (plain) saves."""
    m, f = x.m, x.flow
    gated = m.mlp_type == "gated"
    rep = x.inputs(m.hidden_size, f.R, (f"{prefix}.gate_proj", f"{prefix}.up_proj", f"{prefix}.gate_up_proj"))
    # gate, up, act(gate) (gated) or fc1 output (plain) are saved by the activation and product;
    # the down projection's input (act·up, or act) is saved by down_proj itself. Liger's SwiGLU /
    # GeGLU (``LigerSiLUMulFunction`` / ``LigerGELUMulFunction``, src/liger_kernel/ops/swiglu.py and
    # geglu.py @ ead96b61: ``ctx.save_for_backward(a, b)``) keeps gate and up and recomputes act(gate)
    # in its backward kernel
    kept = (LIGER_GLU_SAVES if (f.liger is not None and f.liger.glu) else 3) if gated else 1
    sh = kept * f.c * width + x.inputs(width, f.c, (f"{prefix}.down_proj",))
    return rep, sh


def _moe(x: _Layer) -> tuple[float, float]:
    """Routed experts with transformers' default ``grouped_mm`` experts (not autocast: they run in
    the residual dtype R). Per routed token: gathered input (R·h), gate|up (2·R·f_e), act and
    act·up (2·R·f_e), the down output kept by the routing-weight multiply (R·h), the routing
    weight and three int64 indices; plus the router (c·h cast, fp32 softmax over E, top-k)."""
    m, f = x.m, x.flow
    mo = m.moe
    assert mo is not None
    R, h, fe = f.R, m.hidden_size, mo.expert_intermediate_size
    grad_w = x.trainable or x.lora_experts  # the expert weights need gradients: inputs are saved
    # frozen experts (LoRA elsewhere): neither the gathered input nor act·up is kept
    per_routed = (4 * R * fe + 2 * R * h if grad_w else 3 * R * fe + R * h) + f.c + 3 * INT64
    router = x.inputs(h, R, ("mlp.gate",)) + FP32 * mo.num_experts + 3 * FP32 * mo.top_k + FP32
    rep, sh = 0.0, mo.top_k * per_routed * f.expert_rows
    if mo.num_shared_experts and mo.shared_intermediate_size:
        name = "mlp.shared_expert" if mo.shared_expert_gate else "mlp.shared_experts"
        r2, s2 = _mlp(x, name, mo.shared_intermediate_size)
        rep, sh = rep + r2, sh + s2
    return rep + router, sh


_ATTN_INPUTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.qkv_proj",
                "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                "self_attn.kv_b_proj")


def _o_proj_part(x: _Layer, mla: str = "math") -> float:
    """What o_proj's savers keep of the attention output (see _attention/_mla)."""
    m, f = x.m, x.flow
    o = ("self_attn.o_proj",)
    if m.mla is None:
        return x.inputs(m.q_dim, f.c, o, already_saved=True)
    a, dv = m.num_heads, m.mla.v_head_dim
    if mla == "math":
        return x.inputs(a * dv, f.R, o)
    return x.inputs(a * dv, f.c, o, already_saved=(mla == "fused"))


@lru_cache(maxsize=4096)
def layer_bytes(m: ModelSpec, flow: Flow, attention: str, moe_layer: bool,
                lora: LoraShape | None = None, masked: bool = False, mla: str = "math") -> LayerBytes:
    """Saved activation bytes per token of one decoder layer (see module docstring).
    ``mla``: the kernel of MLA's attention core (:func:`mla_kernel`)."""
    x = _Layer(m, flow, lora, moe_layer)
    h, R = m.hidden_size, flow.R
    norms = m.norms_per_layer * x.norm(h, R)  # pre-norms, and post-norms (Gemma-2/3, OLMo-2)
    rep_a, sh_a, per_s, drop, keep = _attention(x, attention, masked, mla)
    if moe_layer:
        rep_m, sh_m = _moe(x)
    else:
        rep_m, sh_m = _mlp(x, "mlp", m.intermediate_size)
    cache_extra = R * m.kv_dim if (flow.autocast and R != flow.c and m.mla is None) else 0.0
    const = 0.0
    if moe_layer and x.lora_experts:
        # peft's ParamWrapper builds W + B·A for every expert stack each forward and grouped_mm
        # saves the merged weights for backward (expert parameters in the residual dtype)
        mo = m.moe
        const = R * mo.num_experts * 3 * mo.expert_intermediate_size * h
    first, first_per_s = 0.0, 0.0
    if lora is not None:
        # layer 0's first norm: its input needs no gradient (a frozen-weight Liger norm then records
        # no autograd node either: what it would have saved is not kept)
        first = (liger_norm_bytes(h, R) if (flow.liger is not None and flow.liger.rms_norm)
                 else FP32 * h + FP32)
        if not lora.flat_units and not any(p in x.wrapped for p in _ATTN_INPUTS):
            # nor do q, k, v of layer 0: its attention core keeps nothing; only o_proj's adapter does
            first += rep_a + sh_a - _o_proj_part(x, mla)
            first_per_s = per_s
    return LayerBytes(replicated=norms + rep_a + rep_m, sharded=sh_a + sh_m, per_s=per_s,
                      layer_input=float(R * h), cache_extra=cache_extra, first_layer_saving=first,
                      core_drop=drop, core_keep=keep, per_layer_const=const,
                      first_layer_per_s=first_per_s, linear_inputs=rep_a + rep_m)


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                            recompute: str = "none") -> float:
    """Megatron-LM activation bytes of one transformer layer (Korthikanti et al. 2022, Table 2).

    none, no TP: s·b·h·(34 + 5·a·s/h); TP: s·b·h·(10 + 24/t + 5·a·s/(h·t)); TP+SP: s·b·h/t·(34 +
    5·a·s/h); selective: drops the 5·a·s/h score term; full: 2·s·b·h (the layer input, /t with SP).
    Assumes 16-bit activations, 1-byte dropout masks, a 4h GELU MLP and explicit attention scores.
    """
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    scores = 0.0 if recompute == "selective" else 5 * a * s / h
    if sp:
        return sbh / t * (34 + scores)
    return sbh * (10 + 24 / t + scores / t)


def te_layer_bytes(m: ModelSpec, fp8: bool, dropout: bool) -> LayerBytes:
    """Saved bytes per token of one dense decoder layer under Megatron-Core with Transformer Engine
    (``get_gpt_layer_with_transformer_engine_spec``: TELayerNormColumnParallelLinear for qkv and
    fc1, TEDotProductAttention, TERowParallelLinear for proj and fc2, Megatron's fused bias-SwiGLU
    / bias-GeLU), 16-bit activations (c = 2 bytes):

    * each fused norm + linear saves the norm input (2h), its fp32 statistics (rsigma, and mu for
      LayerNorm: 4 or 8 bytes) and the normalized input the GEMM reads for its weight gradient:
      2h, or 1h as TE's fp8 copy under fp8 (TE ``_LayerNormLinear.forward`` /
      ``_LayerNormMLP.forward``: ``ctx.save_for_backward(inputmat, ln_weight, mu, rsigma, ln_out,
      ...)``; ``ln_out`` is the fp8-cast output when fp8 is on);
    * fused / flash attention saves q, k, v, its output and the fp32 softmax statistics (4 per
      head and token); no s×s tensor (TE ``FusedAttnFunc``: ``aux_ctx_tensors``);
    * the row-parallel proj and fc2 save their input: the attention output itself in 16 bits (no
      extra), TE's fp8 copy of it under fp8 (1 byte per element; the 16-bit tensor is then not kept
      by proj, though attention keeps its own output); fc2 likewise keeps its fp8 copy (1·f), or the
      16-bit activation output (2·f);
    * the fused activation saves only its input, fc1's output (2·2f gated, 2·f plain;
      megatron/core/fusions/fused_bias_swiglu.py ``BiasSwiGLUFunction.forward``:
      ``ctx.save_for_backward(input, bias)``);
    * hidden dropout (when > 0) keeps a 1-byte mask after proj and after fc2.

    For a GPT layer in 16 bits with dropout this is Korthikanti et al. 2022 (arXiv:2205.05198)
    §4.1 term by term: 4sbh norm inputs, 2+2 sbh linear inputs, 6sbh q/k/v, 2sbh proj input, 8+8
    sbh GeLU input/output, 2sbh masks (34·s·b·h), with flash attention's statistics (4·a per token)
    instead of the 5·a·s²·b score terms. Of these, the norm inputs, normalized inputs and masks are
    what Megatron TP without SP keeps whole on every rank ("10sbh"), the rest is split ("24sbh/t").
    """
    h, a, q, kv = m.hidden_size, m.num_heads, m.q_dim, m.kv_dim
    c = 2
    x = 1 if fp8 else c  # a GEMM's saved input: TE's fp8 copy, or the 16-bit tensor
    stats = FP32 * (1 if m.norm_type == "rmsnorm" else 2)  # rsigma (and mu for LayerNorm)
    norms = 2 * (c * h + stats + x * h)  # qkv's and fc1's fused norm: input, statistics, normalized input
    masks = 2 * h if dropout else 0  # bool masks of the two hidden dropouts
    gated = m.mlp_type == "gated"
    f = m.intermediate_size
    core = c * (q + 2 * kv) + c * q + FP32 * a  # q, k, v, output, softmax statistics
    proj_in = 0 if x == c else x * q  # 16 bits: the attention output already kept
    mlp = c * (2 * f if gated else f) + x * f  # fc1 output (activation input) + fc2 input
    return LayerBytes(replicated=norms + masks, sharded=core + proj_in + mlp, per_s=0.0,
                      layer_input=float(c * h), cache_extra=0.0, first_layer_saving=0.0,
                      # selective recompute of the core (``--recompute-modules core_attn``) keeps its
                      # inputs q, k, v and, in 16 bits, the output proj saves anyway
                      core_drop=float(core), core_keep=float(c * (q + 2 * kv) + (c * q if x == c else 0)),
                      linear_inputs=float(2 * x * h))


#: torchtitan's per-op selective activation checkpointing (``activation_checkpoint.mode =
#: "selective"``, ``selective_ac_option = "op"``; torchtitan/distributed/activation_checkpoint.py
#: ``_save_list`` and ``_custom_policy``, pytorch/torchtitan @ b5bcd76c): each decoder block runs
#: under a non-reentrant checkpoint whose policy saves the outputs of ``aten.mm`` except every
#: second one (counted per block), of the SDPA kernels and of ``reduce_scatter_tensor``; every other
#: op is recomputed in backward from the block input. ``fsdp2`` plans mean this by
#: ``recompute=selective`` (as the time model does: catalog/efficiency/stacks/fsdp2.yaml
#: ``selective_recompute_gemms: 0.5``; runconfig's torchtitan importer/exporter map the same).
OP_SAC_SOURCE = ("torchtitan per-op SAC: block input, every other matmul output, SDPA output + "
                 "logsumexp, reduce-scatter outputs (torchtitan/distributed/activation_checkpoint.py)")


def op_sac_bytes(m: ModelSpec, c: int, R: int, attention: str, t: int, sp: bool) -> float | None:
    """Bytes per token of one dense decoder layer kept under torchtitan's per-op SAC (see
    ``OP_SAC_SOURCE``), on one of ``t`` TP ranks; None for layers it does not describe (MLA).

    Matmul outputs in forward order: q, k, v (or one fused q|k|v), o, then gate, up, down (gated
    MLP; torchtitan's ``w2(silu(w1(x)) * w3(x))``) or fc1, down; the 1st, 3rd, ... are saved.
    Column-parallel outputs are split over t; a row-parallel output (o, down) is the rank's
    partial sum over the whole sequence (DTensor ``Partial``), so it is not; with sequence
    parallelism the reduce-scatter that follows it keeps its 1/t share as well. SDPA keeps its
    c-byte output and the fp32 logsumexp (4 per head); eager attention's bmm/softmax are not on
    the save list. The block input (R bytes) stays alive for the recomputation.
    """
    if m.mla is not None:
        return None
    h, q, kv, f = m.hidden_size, m.q_dim, m.kv_dim, m.intermediate_size
    attn = [(q + 2 * kv, True)] if getattr(m, "fused_qkv", False) else [(q, True), (kv, True), (kv, True)]
    mlp = [(f, True), (f, True), (h, False)] if m.mlp_type == "gated" else [(f, True), (h, False)]
    mms = attn + [(h, False)] + mlp  # (width, column-parallel)
    saved = sum(c * w / (t if col else 1) for i, (w, col) in enumerate(mms) if i % 2 == 0)
    rs = 2 * R * h / t if (sp and t > 1) else 0.0
    core = (c * q + FP32 * m.num_heads) / t if attention != "eager" else 0.0
    return R * h / (t if sp else 1) + saved + rs + core


#: torch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``; what
#: torchtitan's ``--experimental.context_parallel_degree`` and accelerate's CP use), read in
#: torch/distributed/tensor/experimental/_attention.py (pytorch/pytorch, stored version @ 0123248a;
#: the torchtitan 2024-12 benchmark ran torch @ 1963fc8): ``_templated_ring_attention`` and its
#: backward replace the SDPA kernel by cp steps over K/V chunks; ``_cp_options`` defaults to
#: ``rotate_method = ALL_GATHER`` (one all-gather of the whole sequence's K|V per call) and
#: ``convert_to_f32 = True`` (fp32 merge and fp32 gradient accumulators).
TORCH_CP_SOURCE = ("torch context_parallel ring attention (torch/distributed/tensor/experimental/"
                   "_attention.py: ALL_GATHER rotater, fp32 _SDPAMerger, fp32 dQ/dK/dV accumulators)")
#: Megatron-Core CP through Transformer Engine's ``AttnFuncWithCPAndKVP2P`` (cp_comm_type "p2p", the
#: default): TE transformer_engine/pytorch/attention.py (NVIDIA/TransformerEngine, stored version);
#: the forward keeps every step's received K|V (``p2p_comm_buffers``, a list of cp) and every step's
#: output and softmax statistics (``out_per_step``, ``softmax_lse_per_step``) until the final
#: correction loop; the backward runs with two K|V+dK|dV buffers ``torch.empty((2, *kv.shape))``.
TE_CP_SOURCE = ("Transformer Engine AttnFuncWithCPAndKVP2P (p2p ring): cp K|V chunks, per-step outputs "
                "and softmax statistics in forward; two (K|V, dK|dV) buffers and dQ in backward")


def cp_ring_bytes(kind: str, cp: int, q: float, kv: float, heads: float, c: int) -> tuple[float, float]:
    """(forward, backward) transient bytes per local token of one layer's ring attention under
    context parallelism of degree ``cp``, beyond the tensors autograd saves (q, k, v, output,
    logsumexp: counted in ``layer_bytes`` / ``te_layer_bytes``). ``q`` and ``kv`` are the widths
    (elements per token) of the query and of each of K and V as the ring sees them on this rank,
    ``heads`` the rank's query heads, ``c`` the compute-dtype bytes. Zero without CP.

    ``kind="torch"`` (TORCH_CP_SOURCE), at the largest moment of each pass, step i >= 1:

    * forward: ``key.contiguous()`` / ``value.contiguous()`` copies (the SDPA inputs are transposed
      views: 2·c·kv), the all-gathered K|V of the whole sequence (cp·2·c·kv), the step's SDPA output
      and logsumexp (c·q + 4·heads) and the merge ``out - sigmoid(lse_b - lse)·(out - out_b)`` in
      fp32: the running output, the upcast step output, their difference and the weighted product
      (4 · 4q), with the fp32 running, step and merged logsumexp (3 · 4·heads);
    * backward: the fp32 dQ accumulator (4q), the dK|dV received from the previous rank (still
      referenced as grad_key/grad_value, 8kv), its updated copy handed to the all-to-all (8kv) and
      that all-to-all's output (8kv); the step's c-byte dQ, dK, dV (c·(q + 2kv)); the flash
      backward's fp32 dQ accumulator and softmax sums (4q + 4·heads, aten
      ``_scaled_dot_product_flash_attention_backward``); and the K|V copies and all-gather as in
      forward (2·c·kv·(1 + cp)).

    ``kind="te"`` (TE_CP_SOURCE), bf16 attention (Megatron's fp8 DPA off, its default):

    * forward (at the correction loop that ends it): every step's K|V chunk (cp·2·c·kv), every
      step's output (cp·c·q) and fp32 softmax statistics (cp·4·heads), the running output in q's
      dtype (c·q) and the fp64 running statistics (8·heads);
    * backward: dQ (c·q), two communication buffers holding a K|V chunk and its dK|dV (2 · 2 · 2·c·kv)
      and the step's dQ, dK, dV (c·(q + 2kv)); the cuDNN / flash workspace is not counted.
    """
    if cp <= 1:
        return 0.0, 0.0
    if kind == "torch":
        kv_copies = 2 * c * kv * (1 + cp)
        fwd = kv_copies + c * q + FP32 * heads + 4 * FP32 * q + 3 * FP32 * heads
        bwd = FP32 * q + 3 * 2 * FP32 * kv + c * (q + 2 * kv) + FP32 * q + FP32 * heads + kv_copies
        return fwd, bwd
    if kind == "te":
        fwd = cp * (2 * c * kv + c * q + FP32 * heads) + c * q + 2 * FP32 * heads
        bwd = c * q + 2 * 2 * 2 * c * kv + c * (q + 2 * kv)
        return fwd, bwd
    raise ValueError(f"unknown context-parallel implementation {kind!r}")
