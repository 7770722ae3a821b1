"""ModelSpec: the architecture of a decoder-only LLM, and its exact parameter counts.

Built from a Hugging Face ``config.json`` (a local file or folder, a bundled preset name, or a Hub
id when the Hub is reachable or the file is cached). Remote code is never executed: ``auto_map``
entries are ignored and only the ``model_type`` families below are understood.

Glossary (symbols follow Narayanan et al. 2021 and Korthikanti et al. 2022):
    h  hidden size            L  number of decoder layers     V  vocabulary size
    a  attention heads        k  key/value heads (GQA)        d  head dimension
    f  FFN (intermediate) size E  routed experts              K  experts per token (top-k)

Parameter counts are exact: they equal ``sum(p.numel() for p in model.parameters())`` of the real
transformers model built from the same config (tested on the meta device for every family).
"""

from __future__ import annotations

import weakref
from functools import cached_property, lru_cache
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from trainledger.spec.base import Spec


class MoESpec(Spec):
    """Mixture-of-experts feed-forward layers.

    Which layers are MoE follows transformers: layer i is MoE when ``i >= first_dense_layers``,
    ``(i + 1) % layer_freq == 0`` and ``i not in dense_layers`` (qwen2_moe/qwen3_moe
    ``decoder_sparse_step`` and ``mlp_only_layers``; deepseek_v3 ``first_k_dense_replace``).
    """

    num_experts: int = Field(gt=0, le=4096, description="routed experts E per MoE layer")
    top_k: int = Field(gt=0, le=64, description="routed experts used per token K")
    expert_intermediate_size: int = Field(gt=0, le=10_000_000, description="FFN width of one routed expert")
    num_shared_experts: int = Field(0, ge=0, le=64, description="always-on shared experts")
    shared_intermediate_size: int = Field(
        0, ge=0, description="FFN width of the shared expert block (all shared experts together)"
    )
    shared_expert_gate: bool = Field(False, description="sigmoid gate Linear(h, 1) on the shared expert (qwen2_moe)")
    router_bias: bool = Field(
        False,
        description="router score-correction bias (deepseek_v3); a buffer in transformers, "
        "so it is not counted as a parameter",
    )
    first_dense_layers: int = Field(0, ge=0, description="leading layers with a dense FFN instead")
    layer_freq: int = Field(1, ge=1, description="every layer_freq-th layer is MoE (others dense)")
    dense_layers: tuple[int, ...] = Field((), description="layer indices forced dense (mlp_only_layers)")
    num_groups: int = Field(1, ge=1, description="expert groups for group-limited routing (n_group)")
    topk_groups: int = Field(1, ge=1, description="groups a token may be routed to (topk_group)")

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if self.num_experts % self.num_groups or self.topk_groups > self.num_groups:
            raise ValueError(f"{self.num_experts} experts cannot form {self.num_groups} routing groups "
                             f"with {self.topk_groups} chosen per token")
        return self


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3; Liu et al. 2024, arXiv:2405.04434, §2.1)."""

    q_lora_rank: int | None = Field(None, gt=0, description="query low-rank size; None = full q proj")
    kv_lora_rank: int = Field(gt=0, description="compressed KV latent size (cached per token)")
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0, description="decoupled RoPE key dim (cached per token)")
    v_head_dim: int = Field(gt=0)


class ParamCounts(Spec):
    """Parameter counts of a model, by component. All counts are exact integers."""

    total: int
    breakdown: dict[str, int]
    active: int = Field(description="parameters used per token (== total unless MoE)")
    embedding: int
    per_layer: tuple[int, ...] = Field(description="parameters of each decoder layer")


class ModelSpec(Spec):
    """Dimensions of a decoder-only transformer, as read from its config.

    Component names of :attr:`params` follow the transformers modules: ``attention`` is all of
    ``self_attn`` (projections, their biases, q/k norms, MLA latent norms), ``mlp`` a dense FFN,
    ``experts``/``router``/``shared_experts`` the parts of an MoE block, ``norms`` every other
    norm (per layer and final), ``embedding``/``position_embedding``/``lm_head`` the rest.
    """

    name: str = Field(description="preset name or path the spec came from")
    model_type: str = Field(description="Hugging Face model_type, or 'generic'")
    source: str | None = Field(None, description="Hub id or paper the config comes from")
    checkpoint_dtype: str | None = Field(
        None, description="dtype the checkpoint is stored in (config.json torch_dtype/dtype): bf16, fp16, fp32")
    checkpoint_quantization: str | None = Field(
        None, description="weight quantization the checkpoint ships (config.json quantization_config), as "
        "--quantization names it: fp8, mxfp4, awq, gptq, nf4, nvfp4; None: unquantized, or a method not modelled")
    hidden_size: int = Field(gt=0, le=1_000_000, description="h")
    num_layers: int = Field(gt=0, le=10_000, description="L")
    num_heads: int = Field(gt=0, le=10_000, description="a, query heads")
    num_kv_heads: int = Field(gt=0, le=10_000, description="k, key/value heads (== a for MHA and MLA)")
    head_dim: int = Field(gt=0, le=100_000, description="d, per-head q/k dimension (MLA: nope + rope)")
    intermediate_size: int = Field(gt=0, le=10_000_000, description="f, dense FFN width")
    vocab_size: int = Field(gt=0, le=100_000_000, description="V")
    tie_word_embeddings: bool = False
    mlp_type: Literal["gated", "plain"] = "gated"
    activation: str = "silu"
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_bias: bool = Field(False, description="LayerNorm has a bias")
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    fused_qkv: bool = Field(False, description="one q|k|v projection module (phi3, gpt2, gpt_neox)")
    fused_gate_up: bool = Field(False, description="one gate|up projection module (phi3)")
    qk_norm: Literal["none", "head", "full"] = Field(
        "none", description="RMSNorm on q and k: per head (qwen3, gemma3) or full width (olmo2)"
    )
    norms_per_layer: int = Field(2, ge=0, le=8, description="norm modules per decoder layer")
    final_norm: bool = True
    post_norm_only: bool = Field(False, description="olmo2: norms after attention/MLP, not before")
    parallel_residual: bool = Field(False, description="gpt_neox: attention and MLP read the same input")
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    rotary_fraction: float = Field(1.0, gt=0, le=1, description="share of head_dim that is rotated")
    max_position_embeddings: int = Field(4096, gt=0, le=100_000_000)
    sliding_window: int | None = Field(None, gt=0)
    layer_types: tuple[Literal["full", "sliding"], ...] = Field(
        (), description="attention type of each layer; empty = all full (or all sliding if a window is set)"
    )
    logit_softcap: float | None = Field(None, description="final-logit soft-cap c: logits = c·tanh(logits/c)")
    attn_softcap: float | None = Field(None, description="attention-score soft-cap (eager attention)")
    attn_sinks: bool = Field(False, description="one learned sink logit per query head (gpt_oss ``self_attn.sinks``)")
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    notes: tuple[str, ...] = Field((), description="what the counts include or leave out")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.mla is None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(f"first_dense_layers {self.moe.first_dense_layers} exceeds {self.num_layers} layers")
        return self

    # ---------------------------------------------------------------- derived structure
    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> ModelSpec:
        """pydantic's copy, less the derived values (``cached_property``: parameter counts, the MoE
        layer mask) that the copy would otherwise carry over from the unchanged spec."""
        new = super().model_copy(update=update, deep=deep)
        if update:
            for name in _DERIVED:
                new.__dict__.pop(name, None)
        return new

    def updated(self, changes: Mapping[str, Any]) -> ModelSpec:
        """``Spec.updated``, less the derived values (as ``model_copy`` above)."""
        new = super().updated(changes)
        if changes:
            for name in _DERIVED:
                new.__dict__.pop(name, None)
        return new

    def __hash__(self) -> int:
        """pydantic's hash of a frozen model (of all field values), computed once per instance: the
        per-model caches (``lru_cache`` keyed on the spec) hash it many times per estimate. Kept
        outside ``__dict__``, which ``model_copy(update=...)`` copies into the changed spec."""
        hit = _HASHES.get(id(self))
        if hit is not None and hit[0]() is self:
            return hit[1]
        h = hash(tuple(self.__dict__[k] for k in type(self).model_fields))
        if len(_HASHES) > 4096:
            _HASHES.clear()
        _HASHES[id(self)] = (weakref.ref(self), h)
        return h

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @cached_property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        """is_moe_layer for every layer, computed once: O(L + len(dense_layers)), not their product."""
        m = self.moe
        if m is None:
            return (False,) * self.num_layers
        dense = frozenset(m.dense_layers)
        return tuple(i >= m.first_dense_layers and i not in dense and (i + 1) % m.layer_freq == 0
                     for i in range(self.num_layers))

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer i (0-based) has a routed-expert FFN."""
        if self.moe is None:
            return False
        mask = self.moe_layer_mask
        return mask[i] if 0 <= i < len(mask) else False

    def is_sliding_layer(self, i: int) -> bool:
        """Whether layer i attends within ``sliding_window`` only."""
        if self.sliding_window is None:
            return False
        if not self.layer_types:
            return True
        return self.layer_types[i] == "sliding"

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (a·d)."""
        if self.mla is not None:
            return self.num_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key projection output (k·d); the value width too, except under MLA."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the value states (k·d; MLA: a·v_head_dim, which transformers caches per token)."""
        if self.mla is not None:
            return self.num_heads * self.mla.v_head_dim
        return self.kv_dim

    def linear_modules(self, i: int) -> dict:
        """Projections of layer i by transformers module path -> :class:`trainledger.spec.layers.Linear`."""
        from trainledger.spec.layers import layer_linears

        return layer_linears(self, i)

    def lora_params(self, targets: tuple[str, ...], rank: int) -> int:
        """Trainable LoRA parameters for peft ``target_modules=targets`` at rank r (exact)."""
        return _lora_params(self, tuple(targets), rank)

    def weight_bytes(self, bytes_per_param: float) -> int:
        """Bytes of all weights stored at ``bytes_per_param`` (2 for bf16)."""
        return int(self.params.total * bytes_per_param)

    # ---------------------------------------------------------------- parameter counts
    def _attention_norm_params(self) -> int:
        """Non-projection parameters of the attention block: q/k RMSNorms (qk_norm), MLA's q and kv
        latent norms, attention sinks (one logit per head, gpt_oss)."""
        if self.mla is not None:
            x = self.mla
            return (x.q_lora_rank or 0) + x.kv_lora_rank
        sinks = self.num_heads if self.attn_sinks else 0  # gpt_oss: nn.Parameter(num_attention_heads)
        return sinks + {"none": 0, "head": 2 * self.head_dim, "full": self.q_dim + self.kv_dim}[self.qk_norm]

    def _ffn_params(self, width: int) -> int:
        h = self.hidden_size
        n_in = 2 if self.mlp_type == "gated" else 1
        w = (n_in + 1) * h * width
        if self.mlp_bias:
            w += n_in * width + h
        return w

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm_bias else 1)

    def layer_params(self, i: int) -> dict[str, int]:
        """Parameters of decoder layer i by component (attention, norms, mlp | experts, router, shared_experts).

        The projections come from the one layer inventory (:func:`modules.layer_linears`), the same
        list LoRA matching and the FLOP count read; norms are added here.
        """
        from trainledger.spec.layers import component, layer_linears

        out = {"attention": self._attention_norm_params(), "norms": self.norms_per_layer * self._norm_params()}
        if self.is_moe_layer(i):
            out.update(experts=0, router=0, shared_experts=0)
        else:
            out["mlp"] = 0
        for path, lin in layer_linears(self, i).items():
            out[component(path)] += lin.params
        return out

    def layer_active_params(self, i: int) -> int:
        """Parameters of layer i that one token uses (top-k of the routed experts)."""
        p = self.layer_params(i)
        if "experts" in p:
            m = self.moe
            assert m is not None
            p["experts"] = m.top_k * self._ffn_params(m.expert_intermediate_size)
        return sum(p.values())

    @cached_property
    def params(self) -> ParamCounts:
        """Exact parameter counts by component; ``total == sum(breakdown) == non-layer + sum(per_layer)``.

        Counted once per distinct spec (:func:`_param_counts`, keyed by the field values): every
        ``build_plan`` of a preset builds a new, equal spec, and a 70B count walks 80 layers."""
        return _param_counts(self)

    def _count_params(self) -> ParamCounts:
        h, V = self.hidden_size, self.vocab_size
        bd: dict[str, int] = {"embedding": V * h}
        if self.position_embedding == "learned":
            bd["position_embedding"] = self.max_position_embeddings * h
        per_layer = []
        for i in range(self.num_layers):
            lp = self.layer_params(i)
            per_layer.append(sum(lp.values()))
            for k, v in lp.items():
                bd[k] = bd.get(k, 0) + v
        if self.final_norm:
            bd["norms"] = bd.get("norms", 0) + self._norm_params()
        bd["lm_head"] = 0 if self.tie_word_embeddings else V * h + (V if self.lm_head_bias else 0)
        bd = {k: v for k, v in bd.items() if v or k in ("embedding", "lm_head")}
        total = sum(bd.values())
        active = total
        if self.moe is not None:
            active = total - sum(per_layer) + sum(self.layer_active_params(i) for i in range(self.num_layers))
        return ParamCounts(
            total=total,
            breakdown=bd,
            active=active,
            embedding=bd["embedding"] + bd.get("position_embedding", 0),
            per_layer=tuple(per_layer),
        )


@lru_cache(maxsize=256)
def _param_counts(m: ModelSpec) -> ParamCounts:
    """``ModelSpec.params``, once per spec value (pydantic's hash and == of the field values)."""
    return m._count_params()


#: the ModelSpec attributes computed once per instance and kept in its ``__dict__``
_DERIVED = tuple(n for n, v in vars(ModelSpec).items() if isinstance(v, cached_property))

#: id(spec) -> (weak reference to the spec, its hash): see ``ModelSpec.__hash__``
_HASHES: dict[int, tuple[weakref.ref, int]] = {}


@lru_cache(maxsize=4096)
def _lora_params(m: ModelSpec, targets: tuple[str, ...], rank: int) -> int:
    """``ModelSpec.lora_params``, once per (spec, targets, rank): every Plan with a LoRA recipe
    checks it, and the suggestion search builds several such plans per estimate. Keyed by the
    spec's field values (pydantic's hash and ==), so a ``model_copy`` with changes is a new key."""
    from trainledger.spec.layers import lora_params

    return lora_params(m, targets, rank)
