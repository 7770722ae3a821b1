"""FLOPs of one training step, counted per architecture, forward and backward (issue 4).

Counting convention: one multiply-add is 2 FLOPs; a matmul of an (M×K) by a (K×N) matrix is
2·M·K·N FLOPs (Narayanan et al. 2021, arXiv:2104.04473, §5.1). The backward pass of a matmul is two
matmuls of the same size (input gradient "dgrad" and weight gradient "wgrad"), so fwd + bwd = 3×fwd.
A frozen weight (LoRA/QLoRA base model, frozen embeddings) needs no wgrad: fwd + bwd = 2×fwd.

Two totals are kept apart (Korthikanti et al. 2022, arXiv:2205.05198, §6: MFU vs HFU):

* **model FLOPs** — the work the method needs, without recomputation: what MFU divides by. The
  quadratic attention term is counted over the full s×s score matrix, the convention of Megatron-LM
  (Narayanan eq. 3), PaLM (Chowdhery et al. 2022, App. B) and MosaicML llm-foundry, so MFU figures
  compare with theirs. ``model_flops_causal_per_step`` counts only the unmasked half.
* **hardware FLOPs** — what the GPUs execute: model FLOPs + recomputed forward passes + the score
  recomputation inside FlashAttention's backward (Dao 2023, arXiv:2307.08691, §3.1: the backward
  pass runs 5 matmuls, not 4). Kernels that skip masked blocks (flash/sdpa) execute the causal
  half; an eager kernel executes the whole s×s product and masks it afterwards.

``six_nt_per_step`` = 6·N·T (Kaplan et al. 2020, arXiv:2001.08361, §2.1) with N the active
parameters that take part in a matmul (the input embedding lookup excluded, the lm_head kept),
shown beside the detailed count for comparison.

Glossary: s sequence length, b micro-batch, h hidden, a heads, k KV heads, d head dim, f FFN width,
V vocabulary, L layers, E routed experts, K experts per token, r LoRA rank, t/p/c tensor/pipeline/
context parallel degrees.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainledger.spec.model import ModelSpec
from trainledger.spec.layers import Linear, layer_linears, lora_targets_of
from trainledger.spec.plan import Plan
from trainledger.spec.recipe import Recipe
from trainledger.estimate.time.efficiency import for_gpu
from trainledger.estimate.time.stack import stack_values, stops_early_by_default

#: how the FLOP count names the projections of the layer inventory (``modules.layer_linears``):
#: module name -> (GEMM role, TP split). Fused projections are split into their parts so that each
#: GEMM keeps its own shape: qkv -> q, k, v; gate_up -> gate, up.
_ROLE: dict[str, tuple[str, str]] = {
    "q_proj": ("q", "col"), "k_proj": ("k", "col"), "v_proj": ("v", "col"), "o_proj": ("o", "row"),
    "qkv_proj": ("qkv", "col"), "c_attn": ("qkv", "col"), "query_key_value": ("qkv", "col"),
    "dense": ("o", "row"), "q_a_proj": ("q_a", "none"), "q_b_proj": ("q_b", "col"),
    "kv_a_proj_with_mqa": ("kv_a", "none"), "kv_b_proj": ("kv_b", "col"),
    "gate_proj": ("gate", "col"), "up_proj": ("up", "col"), "gate_up_proj": ("gate_up", "col"),
    "c_fc": ("up", "col"), "dense_h_to_4h": ("up", "col"), "down_proj": ("down", "row"),
    "dense_4h_to_h": ("down", "row"), "gate": ("router", "none"), "router": ("router", "none"),
    "shared_expert_gate": ("gate", "none"),
}


@dataclass(frozen=True, slots=True)
class Gemm:
    """One weight matmul of a layer, per token: (tokens·mult × k) @ (k × n).

    ``split`` says how tensor parallelism divides it: 'col' splits n, 'row' splits k, 'none'
    replicates it (router). ``experts`` > 0 marks a routed-expert GEMM: ``mult`` = top-k and the
    tokens are spread over ``experts`` matrices.
    """

    name: str
    k: int
    n: int
    split: str = "col"
    mult: float = 1.0
    experts: int = 0

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.mult * self.k * self.n


@dataclass(frozen=True, slots=True)
class LayerKind:
    """Decoder layers that share one structure (dense/MoE × full/sliding attention)."""

    count: int
    gemms: tuple[Gemm, ...]
    heads: int
    d_qk: int
    d_v: int
    window: int | None
    first_layer: int = 0  # index of one layer of this kind (its projections in the inventory)
    #: GEMMs whose outputs no backward reads: after the last tensor the layer saves (see
    #: :func:`early_stop_skips`; without dropout)
    trailing: tuple[Gemm, ...] = ()

    def attn_keys(self, s: int, causal: bool) -> float:
        """Average keys each query attends to: s (full), (s+1)/2 (causal), less with a window."""
        w = self.window
        if not causal:
            return float(min(s, w) if w else s)
        if w is None or w >= s:
            return (s + 1) / 2.0
        return (w * (w + 1) / 2.0 + (s - w) * w) / s

    def attn_core_flops_per_token(self, s: int, causal: bool) -> float:
        """QKᵀ and attention-weighted V: 2·a·(d_qk + d_v)·keys FLOPs per token, forward."""
        return 2.0 * self.heads * (self.d_qk + self.d_v) * self.attn_keys(s, causal)

    @property
    def gemm_flops_per_token(self) -> float:
        return sum(g.flops_per_token for g in self.gemms)

    @property
    def is_moe(self) -> bool:
        return any(g.experts for g in self.gemms)


def _role(path: str) -> tuple[str, str]:
    """(GEMM role, TP split) of one projection path; GPT-2's ``c_proj`` is attention out or MLP down."""
    leaf = path.rsplit(".", 1)[-1]
    if leaf == "c_proj":
        return ("o", "row") if path.startswith("attn.") else ("down", "row")
    return _ROLE[leaf]


def _gemms_of(m: ModelSpec, path: str, lin: Linear) -> tuple[Gemm, ...]:
    """The GEMMs of one projection of the inventory; routed experts run top-k times per token."""
    role, split = _role(path)
    if path.startswith("mlp.experts.") or path.startswith("mlp.shared_expert"):
        role = ("expert_" if lin.count > 1 else "shared_") + role
    mult, experts = (float(m.moe.top_k), lin.count) if lin.count > 1 and m.moe else (1.0, 0)
    k, n = lin.in_features, lin.out_features
    if role.endswith("qkv"):
        return (Gemm(role[:-3] + "q", k, m.q_dim, split, mult, experts),
                Gemm(role[:-3] + "k", k, m.kv_dim, split, mult, experts),
                Gemm(role[:-3] + "v", k, m.kv_dim, split, mult, experts))
    if role.endswith("gate_up"):
        return (Gemm(role[:-7] + "gate", k, n // 2, split, mult, experts),
                Gemm(role[:-7] + "up", k, n // 2, split, mult, experts))
    return (Gemm(role, k, n, split, mult, experts),)


def _layer_gemms(m: ModelSpec, layer: int) -> tuple[Gemm, ...]:
    """Per-token GEMMs of decoder layer ``layer``, read from the one layer inventory."""
    return tuple(g for path, lin in layer_linears(m, layer).items() for g in _gemms_of(m, path, lin))


_KINDS: dict[int, tuple[ModelSpec, tuple[LayerKind, ...]]] = {}


def layer_kinds(m: ModelSpec) -> tuple[LayerKind, ...]:
    """The model's decoder layers grouped by structure, with their per-token GEMMs.

    Cached by object identity (a search evaluates the same ModelSpec thousands of times; hashing
    and comparing a pydantic model per call would cost more than the count itself).
    """
    hit = _KINDS.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    if len(_KINDS) > 256:
        _KINDS.clear()
    kinds = _layer_kinds(m)
    _KINDS[id(m)] = (m, kinds)
    return kinds


def _layer_kinds(m: ModelSpec) -> tuple[LayerKind, ...]:
    groups: dict[tuple[bool, bool], int] = {}
    first: dict[tuple[bool, bool], int] = {}
    for i in range(m.num_layers):
        key = (m.is_moe_layer(i), m.is_sliding_layer(i))
        groups[key] = groups.get(key, 0) + 1
        first.setdefault(key, i)
    if m.mla is not None:
        d_qk, d_v = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim, m.mla.v_head_dim
    else:
        d_qk = d_v = m.head_dim
    out = []
    for (moe, sliding), n in sorted(groups.items()):
        gemms = _layer_gemms(m, first[(moe, sliding)])
        out.append(LayerKind(count=n, gemms=gemms, heads=m.num_heads, d_qk=d_qk, d_v=d_v,
                             window=m.sliding_window if sliding else None,
                             first_layer=first[(moe, sliding)], trailing=_trailing_gemms(m, gemms)))
    return tuple(out)


def lm_head_gemm(m: ModelSpec) -> Gemm:
    """The output projection h -> V (vocab-parallel under TP); computed even when tied."""
    return Gemm("lm_head", m.hidden_size, m.vocab_size, "col")


@lru_cache(maxsize=1024)  # per (model, layer kind, targets, rank): asked per micro-batch term
def lora_gemms(m: ModelSpec, kind: LayerKind, targets: tuple[str, ...], r: int) -> tuple[Gemm, ...]:
    """LoRA adapters of one layer: for each wrapped projection (k×n), A (k×r) then B (r×n).

    Which projections are wrapped follows peft exactly as the parameter count does
    (:func:`modules.lora_targets_of`): module targets by peft's name rule, and for the MoE families
    that peft converts, adapters on the router and the stacked experts (gate_up at rank 2r, as
    peft fuses them; routed experts run top-k times per token).
    """
    out: list[Gemm] = []
    modules, roles = lora_targets_of(m, kind.first_layer, targets)
    for path, lin in modules:
        out.append(Gemm(f"lora_a_{path}", lin.in_features, r, "none"))
        out.append(Gemm(f"lora_b_{path}", r, lin.out_features, "none"))
    if roles and m.moe is not None:
        x, h = m.moe, m.hidden_size
        f, top, E = x.expert_intermediate_size, float(x.top_k), x.num_experts
        if "router" in roles:
            out += [Gemm("lora_a_router", h, r, "none"), Gemm("lora_b_router", r, E, "none")]
        if "gate" in roles:
            out += [Gemm("lora_a_expert_gate_up", h, 2 * r, "none", top, E),
                    Gemm("lora_b_expert_gate_up", 2 * r, 2 * f, "none", top, E)]
        if "down" in roles:
            out += [Gemm("lora_a_expert_down", f, r, "none", top, E),
                    Gemm("lora_b_expert_down", r, h, "none", top, E)]
    return tuple(out)


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one optimizer step over all GPUs, by kind. All values in FLOP."""

    model: float
    model_causal: float
    hardware: float
    six_nt: float
    breakdown: dict[str, float]

    def to_dict(self) -> dict[str, float]:
        return {"model_flops_per_step": self.model, "model_flops_causal_per_step": self.model_causal,
                "hardware_flops_per_step": self.hardware, "six_nt_per_step": self.six_nt,
                "flops_breakdown": dict(self.breakdown)}


def uses_flash(attention: str) -> bool:
    """sdpa on a GPU with 16-bit inputs dispatches to the flash kernel; eager materializes s×s.
    flash1 (FlashAttention-1 generation: FA1, Triton FA, xformers) and cuDNN's fused attention are
    tiled the same way."""
    return attention in ("flash", "sdpa", "flash1", "cudnn")


def skips_masked_blocks(m: ModelSpec, attention: str) -> bool:
    """Whether the attention kernel skips the masked upper triangle of the causal score matrix.

    Flash kernels do — unless the model adds a positional bias tensor to the scores (ALiBi):
    then transformers' sdpa path passes an explicit float mask (memory-efficient kernel, all blocks
    computed). The Triton FlashAttention kernel (flash1) takes the bias and the causal flag
    together and still stops each query block's key loop at the diagonal (flash_attn_triton.py,
    _fwd_kernel: ``end_n = ... if not IS_CAUSAL else min((start_m + 1) * BLOCK_M, seqlen_k)``; MPT
    with ALiBi passes both, llmfoundry/models/layers/attention.py triton_flash_attn_fn).
    """
    if attention == "flash1":
        return True
    return uses_flash(attention) and m.position_embedding != "alibi"


def step_flops(plan: Plan) -> FlopCount:
    """Model and hardware FLOPs of one optimizer step (all micro-batches, all GPUs)."""
    m, r = plan.model, plan.recipe
    # packed sequences: each document attends to itself (model FLOPs count that work); a kernel
    # that skips masked blocks (flash varlen) executes just that, one that takes a mask tensor
    # (eager, or SDPA with ALiBi) computes the whole masked s×s product
    s, tokens = r.attention_len, float(plan.tokens_per_step)
    training = r.is_training
    frozen = r.method in ("lora", "qlora")
    flash = uses_flash(r.attention)
    w_mult = 1.0 if not training else (2.0 if frozen else 3.0)  # fwd, dgrad, wgrad
    layers_fwd = attn_full = attn_causal = adapters = experts_fwd = 0.0
    for kind in layer_kinds(m):
        layers_fwd += kind.count * kind.gemm_flops_per_token
        experts_fwd += kind.count * sum(g.flops_per_token for g in kind.gemms if g.experts)
        attn_full += kind.count * kind.attn_core_flops_per_token(s, causal=False)
        attn_causal += kind.count * kind.attn_core_flops_per_token(s, causal=True)
        if frozen:
            adapters += kind.count * sum(g.flops_per_token for g in
                                         lora_gemms(m, kind, r.lora_targets, r.lora_rank))
    attn_masked = attn_full if s == r.seq_len else sum(
        kind.count * kind.attn_core_flops_per_token(r.seq_len, causal=False) for kind in layer_kinds(m))
    head = lm_head_gemm(m).flops_per_token
    a_mult = 3.0 if training else 1.0
    head_mult = (2.0 if frozen else 3.0) if training else 1.0
    bd = {
        "layers": layers_fwd * w_mult * tokens,
        "attention_core": attn_full * a_mult * tokens,
        "lm_head": head * head_mult * tokens,
        "lora_adapters": adapters * (3.0 if training else 1.0) * tokens,
    }
    model = sum(bd.values())
    model_causal = model - (attn_full - attn_causal) * a_mult * tokens
    executed_attn = attn_causal if skips_masked_blocks(m, r.attention) else attn_masked
    # the routed experts execute the rows their inputs hold: padded to the capacity (Megatron
    # --moe-pad-expert-input-to-capacity), or fewer when tokens beyond it are dropped (Recipe.expert_rows)
    layers_hw = layers_fwd + (r.expert_rows - 1.0) * experts_fwd
    hw = model - bd["attention_core"] + executed_attn * a_mult * tokens
    if layers_hw != layers_fwd:
        hw += (layers_hw - layers_fwd) * w_mult * tokens
    if training and flash:
        hw += 0.5 * executed_attn * tokens  # flash backward recomputes QKᵀ (Dao 2023, §3.1)
    if training:
        hw += recompute_flops_per_token(plan, executed_attn, layers_hw, adapters) * tokens
    return FlopCount(model=model, model_causal=model_causal, hardware=hw,
                     six_nt=(6.0 if training else 2.0) * matmul_params(m) * tokens,
                     breakdown={k: v for k, v in bd.items() if v})


def matmul_params(m: ModelSpec) -> int:
    """Active parameters that take part in a matmul: all but the input embedding lookup
    (a tied embedding counts once, as the lm_head)."""
    pc = m.params
    lookup = pc.embedding if not m.tie_word_embeddings else pc.embedding - pc.breakdown["embedding"]
    return pc.active - lookup


def recompute_fraction(plan: Plan) -> float:
    """Share of layers whose forward is recomputed under full recomputation."""
    r = plan.recipe
    if r.recompute != "full":
        return 0.0
    if r.recompute_layers is None:
        return 1.0
    return min(1.0, r.recompute_layers / plan.model.num_layers)


def early_stop_skips(kind: LayerKind, dropout: float, adapters: tuple[Gemm, ...] = ()) -> tuple[Gemm, ...]:
    """GEMMs of one layer that a full recomputation with early stop does not run again.

    torch's non-reentrant checkpoint (torch >= 2.1) counts the tensors the layer's backward will
    unpack and stops re-running the forward once the last of them is rebuilt
    (torch/utils/checkpoint.py, ``_StopRecomputationError``; ``set_checkpoint_early_stop``). A
    pre-norm block ends in ``h + down(act(...))``: the down projection saves its input and its
    output feeds only the residual add, which saves nothing, so the down GEMM is never recomputed.
    Nothing is skipped when a norm follows the MLP (post-norm, sandwich norms: the norm saves its
    input), when dropout does (its mask comes from running it), or in an MoE layer (the combine
    weighs the expert outputs by the router's probabilities and saves them for that gradient).

    ``adapters``: the layer's LoRA GEMMs. peft's wrapped projection runs its base layer first and
    adds ``lora_B(lora_A(x))`` after it, so where the down projection carries an adapter the last
    saved tensor is lora_A's output: the adapter's B GEMM is skipped and the base GEMM runs again
    (checked against torch with peft, tests/unit/test_checkpoint_early_stop.py).
    """
    if dropout > 0 or not kind.trailing:
        return ()
    last = tuple(g for g in adapters if g.name.startswith("lora_b_") and _adapter_role(g.name) == "down")
    return last or kind.trailing


def _adapter_role(name: str) -> str | None:
    """The projection role of a LoRA GEMM (``lora_b_<path>``), None for the converted MoE ones."""
    try:
        return _role(name.split("_", 2)[2])[0]
    except KeyError:
        return None


def _trailing_gemms(m: ModelSpec, gemms: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """The GEMMs of a layer after its last saved tensor (:func:`early_stop_skips`), dropout aside."""
    if any(g.experts for g in gemms) or m.post_norm_only or m.norms_per_layer > 2:
        return ()
    return tuple(g for g in gemms if g.name == "down")


def checkpoint_stops_early(plan: Plan) -> bool:
    """Whether the plan's full recomputation stops early: ``Runtime.checkpoint_early_stop``, else
    the stack's default (catalog/efficiency/stacks/*.yaml)."""
    v = plan.runtime.checkpoint_early_stop
    if v is not None:
        return v
    return stops_early_by_default(plan.runtime.framework, for_gpu(plan.cluster.gpu).family)


def early_stop_flops_per_token(plan: Plan) -> float:
    """Forward GEMM FLOPs per token, all layers, that early stop leaves out of a full recompute."""
    r = plan.recipe
    if r.recompute != "full" or r.dropout > 0 or not checkpoint_stops_early(plan):
        return 0.0
    m, frozen = plan.model, r.method in ("lora", "qlora")
    return sum(k.count * sum(g.flops_per_token for g in early_stop_skips(
        k, r.dropout, lora_gemms(m, k, r.lora_targets, r.lora_rank) if frozen else ()))
        for k in layer_kinds(m))


def recompute_flops_per_token(plan: Plan, attn_executed: float, layers_fwd: float,
                              adapters: float) -> float:
    """Extra forward FLOPs per token from activation recomputation (Korthikanti et al. 2022).

    full: every checkpointed layer's forward runs again (lm_head is not recomputed, as in
    Narayanan eq. 3), but for the GEMMs an early-stopping checkpoint skips
    (:func:`early_stop_skips`). selective: the attention core (QKᵀ, softmax, ·V) where the stack
    checkpoints it (:func:`attention_core_recomputed`), plus the share of GEMM forwards the
    stack's selective policy recomputes (torchtitan's op-level SAC: every second matmul).
    """
    r = plan.recipe
    if r.recompute == "full":
        return recompute_fraction(plan) * (layers_fwd - early_stop_flops_per_token(plan)
                                           + attn_executed + adapters)
    if r.recompute != "selective":
        return 0.0
    share = _selective_gemm_share(plan)
    core = attention_core_recomputed(r, share)
    return core * attn_executed + share * layers_fwd  # the stack's op-level SAC (stacks/*.yaml)


def attention_core_recomputed(recipe: Recipe, selective_gemms: float) -> float:
    """Forward passes of the attention core that a training ``recompute=selective`` runs again in
    the backward (1 or 0; 0 for any other recipe), given the stack's share of recomputed GEMM
    forwards (``selective_recompute_gemms``).

    Megatron's meaning (share 0): the core is checkpointed whatever kernel computes it. Megatron-LM
    and Megatron-Core wrap ``core_attention`` in ``tensor_parallel.checkpoint`` when
    ``recompute_granularity == "selective"`` (megatron/core/transformer/attention.py
    ``_checkpointed_attention_forward``; Transformer Engine's ``DotProductAttention`` does the same
    with ``checkpoint_core_attention``), flash and fused kernels included: with them it saves only
    the softmax statistics, and the kernel's forward runs again. torchtitan's op-level SAC (share
    > 0) keeps the SDPA kernels' outputs, so a flash kernel is not re-run, while eager attention's
    bmm and softmax are not on its save list and are."""
    if not recipe.is_training or recipe.recompute != "selective":
        return 0.0
    if selective_gemms == 0 or not uses_flash(recipe.attention):
        return 1.0
    return 0.0


def _selective_gemm_share(plan: Plan) -> float:
    """Share of GEMM forwards the plan's stack recomputes under ``recompute=selective``."""
    v = stack_values(plan.runtime.framework, for_gpu(plan.cluster.gpu).family)
    return float(v.get("selective_recompute_gemms", 0.0))


def narayanan_flops_per_iteration(B: int, s: int, L: int, h: int, V: int,
                                  recompute: bool = True) -> float:
    """Narayanan et al. 2021 (arXiv:2104.04473) eq. 3: F = 96·B·s·l·h²·(1 + s/6h + V/16lh).

    Without activation recomputation the leading constant is 72 and the vocabulary term V/12lh
    (the lm_head is never recomputed). GPT with a 4h MLP, full attention, B samples per iteration;
    L is the paper's l (number of layers).
    """
    if recompute:
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def training_time_s(tokens: float, params: float, n_gpus: int, flop_per_s_per_gpu: float,
                    recompute: bool = True) -> float:
    """Narayanan et al. 2021 eq. 4: end-to-end time ≈ 8·T·P / (n·X) (6·T·P without recompute)."""
    return (8.0 if recompute else 6.0) * tokens * params / (n_gpus * flop_per_s_per_gpu)
