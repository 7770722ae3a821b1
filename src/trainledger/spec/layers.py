"""The weight matrices of one decoder layer, named as transformers names its modules.

LoRA wraps modules by name (peft ``target_modules``), and the families fuse projections
differently: Phi-3 has one ``qkv_proj`` and one ``gate_up_proj``, GPT-2 ``c_attn``/``c_fc``,
GPT-NeoX ``query_key_value``, DeepSeek-V3 the MLA down/up projections. This module lists every
projection of layer i with its shape so that adapter sizes and per-GEMM costs are exact.

Paths are relative to the decoder layer (``self_attn.q_proj``, ``mlp.experts.down_proj``).
Routed experts in transformers 5 are single 3-D parameters (``count`` = E) and routers are custom
modules holding a weight; neither is an ``nn.Linear``, so ``target_modules`` does not reach them.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from trainledger.spec.model import ModelSpec


class Linear(NamedTuple):
    """One projection y = x·W (+ b): W is in_features × out_features."""

    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1  # >1: that many experts stacked in one 3-D parameter

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


def _attention(m: ModelSpec) -> dict[str, Linear]:
    h, q, kv, b, ob = m.hidden_size, m.q_dim, m.kv_dim, m.qkv_bias, m.o_bias
    if m.mla is not None:
        x, a = m.mla, m.num_heads
        qk = x.qk_nope_head_dim + x.qk_rope_head_dim
        if x.q_lora_rank is None:
            out = {"self_attn.q_proj": Linear(h, a * qk)}
        else:
            out = {"self_attn.q_a_proj": Linear(h, x.q_lora_rank, b),
                   "self_attn.q_b_proj": Linear(x.q_lora_rank, a * qk)}
        out["self_attn.kv_a_proj_with_mqa"] = Linear(h, x.kv_lora_rank + x.qk_rope_head_dim, b)
        out["self_attn.kv_b_proj"] = Linear(x.kv_lora_rank, a * (x.qk_nope_head_dim + x.v_head_dim))
        out["self_attn.o_proj"] = Linear(a * x.v_head_dim, h, ob)
        return out
    if m.model_type == "gpt2":
        return {"attn.c_attn": Linear(h, q + 2 * kv, b), "attn.c_proj": Linear(q, h, ob)}
    if m.model_type == "gpt_neox":
        return {"attention.query_key_value": Linear(h, q + 2 * kv, b), "attention.dense": Linear(q, h, ob)}
    if m.fused_qkv:
        return {"self_attn.qkv_proj": Linear(h, q + 2 * kv, b), "self_attn.o_proj": Linear(q, h, ob)}
    return {"self_attn.q_proj": Linear(h, q, b), "self_attn.k_proj": Linear(h, kv, b),
            "self_attn.v_proj": Linear(h, kv, b), "self_attn.o_proj": Linear(q, h, ob)}


def _ffn(m: ModelSpec, prefix: str, f: int) -> dict[str, Linear]:
    h, b = m.hidden_size, m.mlp_bias
    if m.model_type == "gpt2":
        return {f"{prefix}.c_fc": Linear(h, f, b), f"{prefix}.c_proj": Linear(f, h, b)}
    if m.model_type == "gpt_neox":
        return {f"{prefix}.dense_h_to_4h": Linear(h, f, b), f"{prefix}.dense_4h_to_h": Linear(f, h, b)}
    if m.mlp_type == "plain":
        return {f"{prefix}.up_proj": Linear(h, f, b), f"{prefix}.down_proj": Linear(f, h, b)}
    if m.fused_gate_up:
        return {f"{prefix}.gate_up_proj": Linear(h, 2 * f, b), f"{prefix}.down_proj": Linear(f, h, b)}
    return {f"{prefix}.gate_proj": Linear(h, f, b), f"{prefix}.up_proj": Linear(h, f, b),
            f"{prefix}.down_proj": Linear(f, h, b)}


def layer_linears(m: ModelSpec, i: int) -> dict[str, Linear]:
    """Every projection of decoder layer i (norms excluded), by module path."""
    out = _attention(m)
    if not m.is_moe_layer(i):
        out.update(_ffn(m, "mlp", m.intermediate_size))
        return out
    x, h = m.moe, m.hidden_size
    assert x is not None
    fe, n_in = x.expert_intermediate_size, 2 if m.mlp_type == "gated" else 1
    if m.model_type == "gpt_oss":  # GptOssTopKRouter: weight E×h and a bias of E (modeling_gpt_oss.py)
        out["mlp.router"] = Linear(h, x.num_experts, True)
    else:
        out["mlp.gate"] = Linear(h, x.num_experts)  # router: weight E×h, no bias
    out["mlp.experts.gate_up_proj"] = Linear(h, n_in * fe, m.mlp_bias, count=x.num_experts)
    out["mlp.experts.down_proj"] = Linear(fe, h, m.mlp_bias, count=x.num_experts)
    if x.num_shared_experts and x.shared_intermediate_size:
        name = "mlp.shared_expert" if x.shared_expert_gate else "mlp.shared_experts"
        out.update(_ffn(m, name, x.shared_intermediate_size))
        if x.shared_expert_gate:
            out["mlp.shared_expert_gate"] = Linear(h, 1)
    return out


def matches(path: str, target: str) -> bool:
    """peft's rule for a string in ``target_modules``: the full path or its last dotted parts."""
    return path == target or path.endswith("." + target)


# peft >= 0.21 on transformers 5 (peft.utils.transformers_weight_conversion): for these MoE
# families the v4 names below no longer select nn.Linear modules — they are rewritten into
# parameter targets on the stacked experts (gate+up fused, so both or neither) and the router.
# Consequence: those names wrap no dense-layer or shared-expert MLP at all.
_QWEN2_MOE_NAMES = {"gate": "router", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
PEFT_MOE_CONVERSION: dict[str, dict[str, str]] = {
    "mixtral": {"gate": "router", "w1": "gate", "w3": "up", "w2": "down"},
    "qwen3_moe": _QWEN2_MOE_NAMES, "deepseek_v3": _QWEN2_MOE_NAMES,
    # qwen2_moe itself is not in transformers' _MODEL_TO_CONVERSION_PATTERN: its names keep
    # selecting nn.Linear modules (the shared expert), and its stacked experts get no adapter.
}


def converted(targets: tuple[str, ...], names: dict[str, str]) -> tuple[set[str], tuple[str, ...]]:
    """(roles selected by converted names, targets left as module targets)."""
    roles, rest = set(), []
    for t in targets:
        old = next((o for o in names if t == o or t.endswith("." + o)), None)
        if old is None:
            rest.append(t)
        else:
            roles.add(names[old])
    return roles, tuple(rest)


def _moe_lora(m: ModelSpec, roles: set[str], r: int) -> int:
    """LoRA on the router and stacked experts of one MoE layer, as peft 0.21 builds it.

    Router weight (E×h): r(h + E). Fused gate_up (rank 2r): A (2r·E)×h, B 2f×(2r·E), so
    2rE(h + 2f). down: A (r·E)×f, B h×(r·E), so rE(f + h). Measured against peft 0.21.2.
    """
    x = m.moe
    assert x is not None
    h, f, E = m.hidden_size, x.expert_intermediate_size, x.num_experts
    if ("gate" in roles) != ("up" in roles):
        from trainledger.errors import PlanError

        raise PlanError("LoRA targets name only one of the gate/up expert projections: peft fuses them "
                        "into gate_up_proj and needs both or neither")
    n = r * (h + E) if "router" in roles else 0
    if "gate" in roles:
        n += 2 * r * E * (h + 2 * f)
    if "down" in roles:
        n += r * E * (f + h)
    return n


def lora_targets_of(m: ModelSpec, layer: int, targets: tuple[str, ...]) -> tuple[list[tuple[str, Linear]], set[str]]:
    """What peft wraps in decoder layer ``layer``: the matched projections, and the converted MoE roles.

    Module targets follow peft's ``target_modules`` rule (:func:`matches`) on single ``nn.Linear``
    projections; for the MoE families in :data:`PEFT_MOE_CONVERSION` the expert/router names become
    roles on the stacked experts (only in MoE layers).
    """
    roles, module_targets = converted(tuple(targets), PEFT_MOE_CONVERSION.get(m.model_type, {}))
    mods = [(path, lin) for path, lin in layer_linears(m, layer).items()
            if lin.count == 1 and any(matches(path, t) for t in module_targets)]
    return mods, (roles if m.is_moe_layer(layer) else set())


def lora_params(m: ModelSpec, targets: tuple[str, ...], rank: int) -> int:
    """Trainable LoRA parameters r·(in + out) per wrapped module (Hu et al. 2021, arXiv:2106.09685 §4.1).

    Modules match peft's ``target_modules`` rule. For the MoE families in
    :data:`PEFT_MOE_CONVERSION` the expert/router names follow peft's v5 conversion instead
    (:func:`_moe_lora`). Assumes transformers 5 and peft >= 0.21 (the verify extra).
    """
    n_moe = sum(1 for i in range(m.num_layers) if m.is_moe_layer(i))
    total = 0
    # a layer's projections depend on i only through is_moe_layer(i): count each kind once
    for kind_count, i in ((m.num_layers - n_moe, _first_layer(m, moe=False)), (n_moe, _first_layer(m, moe=True))):
        if not kind_count:
            continue
        mods, roles = lora_targets_of(m, i, targets)
        per_layer = sum(rank * (lin.in_features + lin.out_features) for _, lin in mods)
        if roles:
            per_layer += _moe_lora(m, roles, rank)
        total += kind_count * per_layer
    return total


def _first_layer(m: ModelSpec, moe: bool) -> int:
    """Index of the first decoder layer that is (or is not) a MoE layer; -1 when there is none."""
    return next((i for i in range(m.num_layers) if m.is_moe_layer(i) == moe), -1)


def component(path: str) -> str:
    """The parameter-count component of a projection path: attention, mlp, experts, router, shared_experts."""
    head, _, rest = path.partition(".")
    if head in ("self_attn", "attn", "attention"):
        return "attention"
    if rest.startswith("experts."):
        return "experts"
    if rest in ("gate", "router"):
        return "router"
    if rest.startswith("shared_expert"):
        return "shared_experts"
    return "mlp"


def layer_tensors(m: ModelSpec, i: int) -> int:
    """Parameter tensors of decoder layer i: each projection's weight (a stack of routed experts is
    one 3-D tensor) and bias, each norm's weight and bias, q/k norms, MLA's latent norms, sinks."""
    n = sum(1 + lin.bias for lin in layer_linears(m, i).values())
    n += m.norms_per_layer * (2 if m.norm_bias else 1)
    if m.mla is not None:
        n += 1 + (m.mla.q_lora_rank is not None)  # kv_a_layernorm (+ q_a_layernorm)
    elif m.qk_norm != "none":
        n += 2  # q_norm, k_norm
    return n + m.attn_sinks


def _end_tensors(m: ModelSpec) -> tuple[int, int]:
    """(first-stage, last-stage) tensors outside the decoder layers: the embeddings; the final norm
    and an untied lm_head."""
    head = ((2 if m.norm_bias else 1) if m.final_norm else 0)
    return 1 + (m.position_embedding == "learned"), head + (0 if m.tie_word_embeddings else 1 + m.lm_head_bias)


def param_tensors(m: ModelSpec) -> int:
    """Parameter tensors of the model (``len(list(model.parameters()))`` of its transformers
    module): per-tensor costs (optimizer dispatch) scale with this, not with the parameter count."""
    return sum(_end_tensors(m)) + sum(layer_tensors(m, i) for i in range(m.num_layers))


@lru_cache(maxsize=1024)
def stage_tensors(m: ModelSpec, pp: int, lora: tuple[str, ...] | None = None) -> int:
    """Trainable parameter tensors on the busiest of ``pp`` pipeline stages (ceil(L/pp) layers,
    the larger end's embeddings or head); ``lora``: peft's targets, only the adapters train."""
    share = -(-m.num_layers // pp) / m.num_layers
    if lora is not None:
        return math.ceil(share * lora_tensors(m, lora))
    ends = _end_tensors(m)
    layers = math.ceil(share * sum(layer_tensors(m, i) for i in range(m.num_layers)))
    return layers + (sum(ends) if pp == 1 else max(ends))


def lora_tensors(m: ModelSpec, targets: tuple[str, ...]) -> int:
    """Trainable tensors peft adds for ``target_modules=targets``: an A and a B per wrapped module
    (and per converted MoE role: router, the fused expert gate_up, expert down)."""
    n = 0
    for i in range(m.num_layers):
        mods, roles = lora_targets_of(m, i, targets)
        n += 2 * len(mods) + 2 * len(roles & {"router", "gate", "down"})
    return n
