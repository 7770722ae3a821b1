"""Per-GPU work of one micro-batch on one pipeline stage: GEMMs, attention, streaming kernels.

Everything here is the *compute* side of the step; communication and overlap are in
:mod:`trainledger.estimate.time`. Times are seconds on one GPU for one micro-batch (b sequences of
s tokens, split s/c by context parallelism) through the layers of the busiest pipeline stage.

Streaming-kernel bytes per token per layer (16-bit activations, 2 bytes/element; counted from the
kernels a layer launches, Korthikanti et al. 2022, arXiv:2205.05198, §4.1 lists the same tensors
for memory). With fused kernels (runtime "megatron"; "hf" see KERNEL_BYTES):
    forward : norms 4h each, 2 residual adds 6h each, activation 6f (gated) / 4f (plain),
              RoPE 4(q+kv), dropout 5h per dropout when p > 0
    backward: norms 6h each, residual grads 6h each, activation 10f / 6f, RoPE, dropout 3h each
    eager attention: scale-mask-softmax 4 bytes per score fwd, 6 bwd (+5/+3 with dropout)
    cross-entropy: bytes per vocabulary entry per token, by stack (``xent_bytes_per_vocab`` in
              stacks/<framework>.yaml). Default 32, PyTorch's path: up-cast of the 16-bit logits
              (read 2, write 4), log-softmax (read 4, write 4), its gradient (read 4, write 4),
              down-cast (read 4, write 2), plus the loss reduction
Hidden-sized tensors are sharded over TP only with sequence parallelism; FFN and attention tensors
are always sharded over TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Callable
from functools import lru_cache

from trainledger.spec.plan import Plan
from trainledger.spec.runtime import LigerOps, liger_flce_chunk
from trainledger.units import DTYPE_BYTES
from trainledger.estimate.time.compute import (Gemm, attention_core_recomputed, early_stop_skips, layer_kinds,
                                              lm_head_gemm, lora_gemms, recompute_fraction,
                                              skips_masked_blocks, uses_flash)
from trainledger.estimate.time.efficiency import GpuEfficiency, attention_efficiency, gemm_time_s
from trainledger.estimate.time.stack import cudnn_attention_efficiency

#: Streaming bytes per element of the layer's small ops, (forward, backward), by runtime.
#: "megatron": fused kernels (Transformer Engine / Apex: one pass per norm, fused RoPE, fused
#: bias-SwiGLU). "hf": PyTorch eager with transformers' modules — RMSNorm composed of up-cast,
#: pow, mean, rsqrt, mul, down-cast and weight-mul kernels (~40 bytes per element forward), RoPE
#: from mul/rotate_half/cat/add (~20), SiLU and the gate product as separate kernels (10); torch's
#: LayerNorm and GELU are single kernels in both.
KERNEL_BYTES: dict[str, dict[str, tuple[float, float]]] = {
    "megatron": {"rmsnorm": (4, 6), "layernorm": (4, 6), "gated": (6, 10), "plain": (4, 6),
                 "rope": (4, 4)},
    "hf": {"rmsnorm": (40, 60), "layernorm": (4, 6), "gated": (10, 16), "plain": (4, 6),
           "rope": (20, 20)},
}
#: Liger Kernel's Triton kernels in place of transformers' eager ops (src/liger_kernel/ops @
#: ead96b61), bytes per element of 16-bit tensors: RMSNorm reads x and writes y (4), its backward
#: reads dy and x and writes dx (6; rms_norm.py); RoPE rotates q and k in place (read + write, both
#: ways: rope.py); SwiGLU/GeGLU read gate and up and write their product (6), the backward reads dc,
#: gate and up and writes both gradients, recomputing the activation (10; swiglu.py, geglu.py) - the
#: fused stacks' figures. Ops Liger leaves alone keep the eager bytes.
LIGER_KERNEL_BYTES: dict[str, tuple[float, float]] = {"rmsnorm": (4, 6), "rope": (4, 4), "gated": (6, 10)}
#: Liger's cross-entropy kernel inside the fused linear cross-entropy (ops/cross_entropy.py
#: ``liger_cross_entropy_kernel``): one pass over a row's logits for its max and sum, a second that
#: reads them again and writes the gradient in place: 3 passes of the logits' bytes per entry
LIGER_XENT_PASSES = 3.0
#: peft's LoRA layer with its adapters in fp32 (``LoraModel(autocast_adapter_dtype=True)``, the
#: default since peft 0.12: adapters of a bf16/fp16 base are upcast to fp32): ``lora_B(lora_A(
#: x.to(fp32))) * scaling`` added to the base output (peft/tuners/lora/layer.py ``Linear.forward``).
#: HBM bytes per element of the wrapped projection's input (k) and output (n), per token,
#: (forward, backward), keyed by whether autocast runs (the ``*-mixed`` precisions):
#:   no autocast (pure 16-bit): the adapter path is fp32 and the sum with the 16-bit base output
#:     is promoted to fp32, then cast back.
#:     input : x -> fp32 (read 2, write 4) = 6; backward: dx fp32 -> 16-bit (4 + 2) and the sum
#:             with the base path's dx (2 + 2 + 2) = 12
#:     output: scaling (4 + 4), base + adapter -> fp32 (2 + 4 + 4), back to 16-bit (4 + 2) = 24;
#:             backward: the cast's grad (2 + 4), the add's grad for the 16-bit base output
#:             (4 + 2), scaling's grad (4 + 4) = 20
#:   autocast: lora_A casts the fp32 x back to 16 bits, so the adapter path and the sum are 16-bit.
#:     input : x -> fp32 (2 + 4) and back (4 + 2) = 12; backward: both casts' grads (6 + 6) and
#:             the sum with the base path's dx (6) = 18
#:     output: scaling (2 + 2), the sum (2 + 2 + 2) = 10; backward: scaling's grad (2 + 2) = 4
#:   (a 16-bit input x; an fp32 one, the normed input of an fp32 base, skips the first cast and
#:   its grad: 6 bytes less each way on those projections)
#: Counted again from the ops torch dispatches in tests/unit/test_peft_lora_bytes.py.
PEFT_FP32_ADAPTER_BYTES = {
    False: {"in": (6.0, 12.0), "out": (24.0, 20.0)},
    True: {"in": (12.0, 18.0), "out": (10.0, 4.0)},
}
#: kernels a decoder layer launches per forward (projections, norms, rope, attention, MLP, adds);
#: backward launches about twice as many. Fixed cost per kernel from the family file.
KERNELS_PER_LAYER_FWD = {"megatron": 20, "hf": 40}
#: PyTorch cross-entropy on 16-bit logits: cast up (2 + 4), log-softmax (4 + 4), its gradient
#: (4 + 4), cast down (4 + 2) bytes per vocabulary entry (the stacks' default, see the module doc)
XENT_BYTES_PER_VOCAB = 32.0


@dataclass(frozen=True, slots=True)
class StageWork:
    """Seconds of one micro-batch's forward+backward on the busiest pipeline stage."""

    matmul_s: float
    attention_s: float
    elementwise_s: float
    overhead_s: float
    layers: float  # decoder layers on the busiest stage (incl. recomputed share as a count)

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.attention_s + self.elementwise_s + self.overhead_s


def routing_imbalance(routed_tokens: float, ep: int) -> float:
    """Load of the busiest of ``ep`` expert-parallel ranks relative to the mean (≥ 1).

    Each of the ``routed_tokens`` (tokens × top-k) lands on a rank with probability 1/ep even when
    the router is balanced in expectation, so a rank's load is Binomial(n, 1/ep) with relative
    standard deviation √((1 − 1/ep)·ep/n); the largest of ep such loads sits about √(2 ln ep)
    standard deviations above the mean (expected maximum of ep near-Gaussian variables; Cramér
    1946, Mathematical Methods of Statistics, §28.6). Every EP rank waits for the busiest one in
    the all-to-all, so expert GEMMs and the all-to-all run at this factor. A learned router's own
    imbalance comes on top of this statistical floor.
    """
    if ep <= 1 or routed_tokens <= 0:
        return 1.0
    rel_sd = math.sqrt((1.0 - 1.0 / ep) * ep / routed_tokens)
    return 1.0 + math.sqrt(2.0 * math.log(ep)) * rel_sd


def _gemm_set_s(gemms: tuple[Gemm, ...], tokens: float, tp: int, ep: int, peak: float,
                hbm: float, eff: GpuEfficiency, eta: float, bpe: float, etp: int | None = None,
                load: Callable[[float], float] | None = None) -> float:
    """Forward seconds of a layer's GEMMs on one GPU (TP-sharded, experts spread over EP; the
    busiest EP rank's share, see :func:`routing_imbalance`, through ``load``: the recipe's
    capacity factor, ``Recipe.expert_load``).

    ``etp``: the experts' own tensor-parallel degree (Megatron-Core MoE parallel folding,
    arXiv:2504.14960): an expert GEMM is split etp ways and, as each expert shard is held by
    tp·cp·dp / (etp·ep) ranks, receives etp/tp times the tokens it would under etp = tp.
    """
    t = 0.0
    for g in gemms:
        k, n = g.k, g.n
        d = (etp or tp) if g.experts else tp
        if g.split == "col":
            n = max(1, n // d) if n >= d else n / d
        elif g.split == "row":
            k = max(1, k // d) if k >= d else k / d
        if g.experts:
            local = max(1.0, g.experts / ep)
            busiest = routing_imbalance(tokens * ep * g.mult, ep)
            m = tokens * g.mult * ep / g.experts * (load(busiest) if load else busiest) * d / tp
            t += local * gemm_time_s(m, k, n, peak, hbm, eff, eta, bpe)
        else:
            t += gemm_time_s(tokens * g.mult, k, n, peak, hbm, eff, eta, bpe)
    return t


@lru_cache(maxsize=1024)
def _split_router(gemms: tuple[Gemm, ...]) -> tuple[tuple[Gemm, ...], tuple[Gemm, ...]]:
    return (tuple(g for g in gemms if g.name != "router"),
            tuple(g for g in gemms if g.name == "router"))


@lru_cache(maxsize=1024)
def _adapter_dims(adapters: tuple[Gemm, ...]) -> tuple[float, float]:
    """(Σk, Σn) per token of the projections the adapters wrap: each A GEMM's k is a projection's
    input, each B GEMM's n its output; routed experts count top-k times per token."""
    k = sum(g.k * g.mult for g in adapters if g.name.startswith("lora_a_"))
    n = sum(g.n * g.mult for g in adapters if not g.name.startswith("lora_a_"))
    return float(k), float(n)


def peft_adapter_bytes(adapters: tuple[Gemm, ...], autocast: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of one layer's peft fp32 adapters (their casts,
    scaling and sums; :data:`PEFT_FP32_ADAPTER_BYTES`)."""
    k, n = _adapter_dims(adapters)
    rates = PEFT_FP32_ADAPTER_BYTES[autocast]
    return (rates["in"][0] * k + rates["out"][0] * n, rates["in"][1] * k + rates["out"][1] * n)



def _liger(plan: Plan, runtime: str) -> LigerOps | None:
    """The plan's Liger kernels where the stack's kernels are eager (a fused stack counts fused
    kernels already)."""
    return plan.liger if runtime == "hf" else None

def _elementwise_bytes(plan: Plan, kind_ffn: float, moe_k: float,
                       runtime: str = "hf") -> tuple[float, float]:
    """Streaming bytes per token of one layer, forward and backward, on one GPU."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    tp = lay.tp
    h_sh = m.hidden_size / tp if (lay.sp and tp > 1) else m.hidden_size
    f = kind_ffn / tp
    gated = m.mlp_type == "gated"
    k = KERNEL_BYTES[runtime]
    norm = k["rmsnorm"] if m.norm_type == "rmsnorm" else k["layernorm"]
    act = k["gated"] if gated else k["plain"]
    rope = k["rope"]
    liger = _liger(plan, runtime)
    if liger is not None:
        norm = LIGER_KERNEL_BYTES["rmsnorm"] if liger.rms_norm else norm
        # routed experts: Liger's fused MoE kernel (LigerExperts) is not modeled, as in memory
        act = LIGER_KERNEL_BYTES["gated"] if (liger.glu and moe_k <= 1) else act
        rope = LIGER_KERNEL_BYTES["rope"] if liger.rope else rope
    fwd = m.norms_per_layer * norm[0] * h_sh + 12 * h_sh + act[0] * f * moe_k
    bwd = m.norms_per_layer * norm[1] * h_sh + 12 * h_sh + act[1] * f * moe_k
    if m.position_embedding == "rope":
        fwd += rope[0] * (m.q_dim + m.kv_dim) / tp
        bwd += rope[1] * (m.q_dim + m.kv_dim) / tp
    if r.dropout > 0:
        fwd += 2 * 5 * h_sh
        bwd += 2 * 3 * h_sh
    if moe_k > 1:  # token permutation and un-permutation around the experts
        fwd += 8 * m.hidden_size * moe_k
        bwd += 8 * m.hidden_size * moe_k
    if r.precision == "fp8-mixed":  # quantize GEMM inputs: read 2 bytes, write 1
        fwd += 3 * (3 * h_sh + 2 * f * moe_k)
        bwd += 3 * (3 * h_sh + 2 * f * moe_k)
    elif "gemm" in r.policy:
        # block-scaled: read the 16-bit input once, write it quantized in both directions (rowwise
        # for fprop/dgrad, columnwise for wgrad: the 1×32 / 1×16 blocks run along the reduction
        # dimension of each GEMM) with their block scales; NVFP4's 16×16 Hadamard transform of
        # the wgrad inputs (arXiv:2509.25149) is fused into that cast by Transformer Engine
        q = 2 + 2 * DTYPE_BYTES[r.policy["gemm"]]
        fwd += q * (3 * h_sh + 2 * f * moe_k)
        bwd += q * (3 * h_sh + 2 * f * moe_k)
    return fwd, bwd


def stage_work(plan: Plan, eff: GpuEfficiency, peak_mm: float, peak16: float,
               matmul_dtype: str, runtime: str = "hf", selective_gemms: float = 0.0,
               xent_bytes: float | None = None, lora_fp32_adapters: bool = False,
               early_stop: bool = False) -> StageWork:
    """Compute seconds of one micro-batch (fwd + bwd + recompute) on the busiest stage.

    ``selective_gemms``: the stack's meaning of ``recompute=selective`` beyond the attention core —
    the share of the layer's GEMM forwards recomputed, with all its elementwise ops (torchtitan's
    op-level SAC saves every matmul output except every second one; see stacks/fsdp2.yaml).
    ``xent_bytes``: HBM bytes per vocabulary entry per token of the stack's loss (forward and
    backward of the cross-entropy on the lm_head's logits; None: ``XENT_BYTES_PER_VOCAB``).
    ``lora_fp32_adapters``: the stack runs LoRA through peft, whose adapters of a 16-bit base are
    fp32 (their casts and sums: ``PEFT_FP32_ADAPTER_BYTES``).
    ``early_stop``: full recomputation stops once the backward's tensors are rebuilt, leaving out
    the layer's trailing GEMM (:func:`compute.early_stop_skips`).
    """
    m, r, lay, gpu = plan.model, plan.recipe, plan.layout, plan.cluster.gpu
    s, b, tp, pp, cp, ep = r.seq_len, r.micro_batch, lay.tp, lay.pp, lay.cp, lay.ep
    tokens = b * s / cp
    hbm = gpu.hbm_bytes_per_s
    bpe16 = 2.0
    bpe_mm = DTYPE_BYTES.get(matmul_dtype, 2.0)
    eta_mm = eff.matmul_max(matmul_dtype)
    eta16 = eff.matmul_max("bf16")
    training = r.is_training
    frozen = r.method in ("lora", "qlora")
    bwd_w = (1.0 if frozen else 2.0) if training else 0.0
    rc = recompute_fraction(plan) if training else 0.0
    sel = selective_gemms if (training and r.recompute == "selective") else 0.0
    core_rc = attention_core_recomputed(r, selective_gemms)
    flash = uses_flash(r.attention)
    peft_adapters = frozen and lora_fp32_adapters and r.precision in ("bf16", "fp16", "bf16-mixed", "fp16-mixed")
    autocast = r.precision.endswith("-mixed")
    stage_layers = math.ceil(m.num_layers / pp)
    # share of the decoder layers whose GEMMs the nvfp4 recipe keeps in bf16 (spread evenly; with
    # pp the last stage, which holds most of them, is slower than this average)
    hp_share = r.bf16_layers(m.num_layers) / m.num_layers if matmul_dtype == "nvfp4" else 0.0
    share = stage_layers / m.num_layers  # the busiest stage holds ceil(L/p) layers
    cap = r.expert_load if r.moe_capacity_factor is not None else None  # experts' capacity (or dropless)
    mm = att = ew = 0.0
    for kind in layer_kinds(m):
        nl = kind.count * share
        base, router = _split_router(kind.gemms)
        t_main = _gemm_set_s(base, tokens, tp, ep, peak_mm, hbm, eff, eta_mm, bpe_mm, lay.expert_tp, load=cap)
        if hp_share:  # nvfp4-mixed: these layers' linear GEMMs stay in bf16 (arXiv:2509.25149)
            t_main += hp_share * (_gemm_set_s(base, tokens, tp, ep, peak16, hbm, eff, eta16, bpe16,
                                              lay.expert_tp, load=cap) - t_main)
        t_main += _gemm_set_s(router, tokens, tp, ep, peak16, hbm, eff, eta16, bpe16, load=cap)
        adapters = lora_gemms(m, kind, r.lora_targets, r.lora_rank) if frozen else ()
        skips = early_stop_skips(kind, r.dropout, adapters) if (early_stop and rc) else ()
        t_skip = 0.0
        if skips and skips[0].name.startswith("lora_"):  # an adapter's B GEMM, at the adapters' rate
            t_skip = _gemm_set_s(skips, tokens, tp, ep, peak16, hbm, eff, eta16, bpe16, load=cap)
        elif skips:
            t_skip = _gemm_set_s(skips, tokens, tp, ep, peak_mm, hbm, eff, eta_mm, bpe_mm, load=cap)
            if hp_share:
                t_skip += hp_share * (_gemm_set_s(skips, tokens, tp, ep, peak16, hbm, eff, eta16, bpe16, load=cap) - t_skip)
        t_lora = 0.0
        if frozen:
            # priced at the 16-bit rate even where peft runs them in fp32 without autocast (SIMT
            # kernels): the family's GEMM shape model describes tensor-core tiles, not rank-16 fp32
            t_lora = _gemm_set_s(adapters, tokens, tp, ep, peak16, hbm, eff, eta16, bpe16, load=cap)
            if peft_adapters:  # peft's fp32 adapters: their casts and sums
                fwd_a, bwd_a = peft_adapter_bytes(adapters, autocast)
                ew += nl * tokens * (fwd_a * (1 + rc) + (bwd_a if training else 0.0)) / (hbm * eff.hbm)
        if r.method == "qlora":  # dequantize nf4 -> bf16 before each use: read 0.5, write 2 bytes
            nparams = sum(g.k * g.n * (g.experts or 1) for g in base) / tp
            t_main += nparams * 2.5 / (hbm * eff.hbm)
        mm += nl * (t_main * (1 + bwd_w + rc + sel) - rc * t_skip
                    + t_lora * ((3.0 + rc) if training else 1.0))
        att += nl * _attention_s(plan, kind, tokens, peak16, hbm, eff, flash, training, rc + core_rc)
        moe_k = float(m.moe.top_k) if kind.is_moe and m.moe else 1.0
        ffn = m.moe.expert_intermediate_size if moe_k > 1 and m.moe else m.intermediate_size
        fwd_b, bwd_b = _elementwise_bytes(plan, ffn, moe_k, runtime)
        ew_rc = rc if not sel else max(rc, 1.0)
        ew += nl * tokens * (fwd_b * (1 + ew_rc) + (bwd_b if training else 0.0)) / (hbm * eff.hbm)
    # lm_head + loss on the last stage (the first holds only an embedding lookup)
    t_head, t_loss = head_s(plan, tokens, eff, peak16, eta16, runtime, xent_bytes)
    mm += t_head
    ew += t_loss
    kernels = stage_layers * KERNELS_PER_LAYER_FWD[runtime] * (1 + (2 if training else 0) + rc)
    return StageWork(mm, att, ew, kernels * eff.kernel_overhead_s, stage_layers)


def shared_expert_s(plan: Plan, eff: GpuEfficiency, peak_mm: float, matmul_dtype: str) -> float:
    """Forward seconds of one MoE layer's shared-expert GEMMs on one GPU for one micro-batch (split
    over TP like the dense MLP; every token runs them): the compute a side stream can lay under the
    layer's dispatch and combine (``Runtime.moe_shared_expert_overlap``). Zero without shared experts."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    kind = next((k for k in layer_kinds(m) if k.is_moe), None)
    if kind is None:
        return 0.0
    shared = tuple(g for g in kind.gemms if g.name.startswith("shared_"))
    if not shared:
        return 0.0
    tokens = r.micro_batch * r.seq_len / lay.cp
    return _gemm_set_s(shared, tokens, lay.tp, lay.ep, peak_mm, plan.cluster.gpu.hbm_bytes_per_s, eff,
                       eff.matmul_max(matmul_dtype), DTYPE_BYTES.get(matmul_dtype, 2.0))


def head_s(plan: Plan, tokens: float, eff: GpuEfficiency, peak16: float, eta16: float,
           runtime: str = "hf", xent_bytes: float | None = None) -> tuple[float, float]:
    """(GEMM seconds, loss seconds) of the lm_head and the cross-entropy for ``tokens`` tokens of
    one micro-batch on one GPU, forward and backward (vocab-parallel over TP).

    Under Liger's fused linear cross-entropy (``Plan.liger``) the head runs chunk by chunk
    (``spec.runtime.liger_flce_chunk`` rows: about V/h chunks whatever the batch), each chunk's three
    GEMMs reading the whole weight again, and each weight-gradient GEMM accumulating into (reading
    again) the whole V×h ``grad_weight``; its loss kernel makes ``LIGER_XENT_PASSES`` passes over a chunk's logits."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    hbm = plan.cluster.gpu.hbm_bytes_per_s
    tp, ep = lay.tp, lay.ep
    training = r.is_training
    frozen = r.method in ("lora", "qlora")
    head = lm_head_gemm(m)
    head_w = (1.0 if frozen else 2.0) if training else 0.0
    xent = XENT_BYTES_PER_VOCAB if xent_bytes is None else xent_bytes
    liger = _liger(plan, runtime)
    vh = m.hidden_size * m.vocab_size / tp
    if liger is not None and liger.flce and training:
        chunk = liger_flce_chunk(tokens, m.hidden_size, m.vocab_size)
        n_chunks = tokens / chunk
        t_mm = n_chunks * _gemm_set_s((head,), chunk, tp, ep, peak16, hbm, eff, eta16, 2.0) * (1 + head_w)
        logit_bytes = 4.0 if r.policy["compute"] == "fp32" else 2.0  # the head GEMM's output dtype
        t_ew = tokens * LIGER_XENT_PASSES * logit_bytes * m.vocab_size / tp / (hbm * eff.hbm)
        if not frozen:
            # the weight-gradient GEMM of each chunk is an ``addmm`` into the whole weight-dtype
            # ``grad_weight`` (beta = 1): beside the weight-sized operand its GEMM term moves, it
            # reads the accumulator once more per chunk
            t_ew += n_chunks * DTYPE_BYTES[r.policy["weights"]] * vh / (hbm * eff.hbm)
        return t_mm, t_ew
    t_mm = _gemm_set_s((head,), tokens, tp, ep, peak16, hbm, eff, eta16, 2.0) * (1 + head_w)
    return t_mm, tokens * xent * m.vocab_size / tp / (hbm * eff.hbm)


def _attention_s(plan: Plan, kind, tokens: float, peak16: float, hbm: float, eff: GpuEfficiency,
                 flash: bool, training: bool, rc: float) -> float:
    """Seconds of the attention core (scores, softmax, ·V) of one layer, fwd + bwd + recompute
    (``rc``: forward passes run again, full recomputation's and selective's of the core)."""
    r, lay = plan.recipe, plan.layout
    s = r.seq_len
    heads = kind.heads / lay.tp
    d = 0.5 * (kind.d_qk + kind.d_v)
    if flash:
        skips = skips_masked_blocks(plan.model, r.attention)
        # packed documents: a varlen kernel attends within each (cu_seqlens); with a mask tensor
        # (ALiBi) the kernel computes every block of the sequence
        s_att = r.attention_len if skips else s
        keys = kind.attn_keys(s_att, causal=skips)
        fwd = tokens * 2.0 * heads * (kind.d_qk + kind.d_v) * keys
        # with context parallelism the kernel runs once per blockwise step on one rank's chunk of
        # s/c keys (the diagonal step; the load-balanced later steps pair s/c with s/(2c)), never
        # on the whole sequence (Liu et al. 2023, Ring Attention, arXiv:2310.01889, §3)
        if r.attention == "cudnn":  # cuDNN's own rate on this GPU family, whatever the stack
            eff = replace(eff, attention=cudnn_attention_efficiency(plan.cluster.gpu))
        eta = attention_efficiency(eff, min(s / lay.cp, kind.window or s, s_att), d, r.attention)
        mult = 1.0 + (2.5 if training else 0.0) + rc
        return fwd * mult / (peak16 * eta)
    keys = kind.attn_keys(s, causal=False)
    b_seqs = tokens / s
    per_head = 2 * gemm_time_s(s, d, keys, peak16, hbm, eff, eff.matmul_max("bf16"), 2.0)
    t_mm = b_seqs * heads * per_head
    p = r.dropout > 0
    scores = tokens * heads * keys
    fwd_b = scores * (4 + (5 if p else 0))
    bwd_b = scores * (6 + (3 if p else 0))
    t_sm_f = fwd_b / (hbm * eff.hbm)
    t_sm_b = bwd_b / (hbm * eff.hbm)
    sel = 1.0 if (r.recompute == "selective" and training) else rc
    if not training:
        return t_mm + t_sm_f
    return t_mm * (3 + sel) + t_sm_f * (1 + sel) + t_sm_b
