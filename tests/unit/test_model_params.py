"""Parameter counts: every bundled preset against the real transformers model on the meta device,
component by component and layer by layer; generic specs against hand computations from papers;
totals against the counts that model cards publish.

Building on the meta device allocates no memory; all presets together build in a few seconds
(transformers 5 stores MoE experts as fused 3-D tensors), so every model is built at full size.
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache

import pytest

from trainledger.load.hf import from_hf_config, load_hf_config, load_model, preset_names

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_ONLY_KEYS = ("model_type", "quantization_config", "auto_map")  # not constructor arguments


def build_meta(cfg: dict):
    """The transformers CausalLM for a config mapping, built on the meta device (no memory)."""
    transformers.logging.set_verbosity_error()
    mt = cfg["model_type"]
    kwargs = {k: v for k, v in cfg.items() if k not in HF_ONLY_KEYS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_cfg = transformers.AutoConfig.for_model(mt, **kwargs)
        if mt == "gemma3":  # multimodal config: our spec is its language model
            hf_cfg = hf_cfg.text_config
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(hf_cfg)


LAYER = re.compile(r"^(?:model|transformer|gpt_neox)\.(?:layers|h)\.(\d+)\.(.*)$")


def classify(name: str) -> tuple[int | None, str]:
    """(layer index or None, our component name) for a transformers parameter name."""
    m = LAYER.match(name)
    if m is None:
        if re.search(r"(embed_tokens|wte|embed_in)\.weight$", name):
            return None, "embedding"
        if name.endswith("wpe.weight"):
            return None, "position_embedding"
        if name.startswith(("lm_head", "embed_out")):
            return None, "lm_head"
        assert re.search(r"(norm|ln_f)\.(weight|bias)$", name), name
        return None, "norms"
    i, rest = int(m.group(1)), m.group(2)
    if rest.startswith(("self_attn.", "attn.", "attention.")):
        return i, "attention"
    if rest.startswith("mlp.experts."):
        return i, "experts"
    if rest.startswith(("mlp.gate.", "mlp.router.")):
        return i, "router"
    if rest.startswith("mlp.shared_expert"):
        return i, "shared_experts"
    if rest.startswith("mlp."):
        return i, "mlp"
    assert re.search(r"(norm|ln_\d)\.(weight|bias)$", rest), name
    return i, "norms"


def reference_counts(model) -> tuple[int, dict[str, int], dict[int, int]]:
    total, by_part, by_layer = 0, {}, {}
    for name, p in model.named_parameters():  # tied weights appear once
        n = p.numel()
        total += n
        i, part = classify(name)
        by_part[part] = by_part.get(part, 0) + n
        if i is not None:
            by_layer[i] = by_layer.get(i, 0) + n
    return total, by_part, by_layer


HF_PRESETS = [n for n in preset_names() if load_hf_config(n)["model_type"] != "generic"]


@lru_cache(maxsize=None)
def preset_model(name: str):
    return build_meta(load_hf_config(name))


def test_there_are_at_least_30_real_presets():
    real = [n for n in preset_names() if not n.startswith("tiny-")]
    assert len(real) >= 30, real


@pytest.mark.parametrize("name", HF_PRESETS)
def test_preset_equals_transformers_numel(name):
    spec = load_model(name)
    model = preset_model(name)
    total, by_part, by_layer = reference_counts(model)
    assert spec.params.total == total
    ours = {k: v for k, v in spec.params.breakdown.items() if v}
    assert ours == by_part
    assert list(spec.params.per_layer) == [by_layer[i] for i in range(spec.num_layers)]
    assert spec.params.total == sum(spec.params.breakdown.values())


@pytest.mark.parametrize("name", HF_PRESETS)
def test_preset_tensor_count_equals_transformers(name):
    """Per-tensor costs (the optimizer's dispatch on DTensor stacks) read this count."""
    from trainledger.spec.layers import param_tensors

    assert param_tensors(load_model(name)) == len(list(preset_model(name).parameters()))


# Totals published by model cards / papers (decimal, as printed on the card or in the paper).
PUBLISHED = {
    # exact counts of the published checkpoints (Hub safetensors metadata; quoted in issue 2)
    "llama-2-7b": 6_738_415_616,  # Llama 2 safetensors metadata, meta-llama/Llama-2-7b-hf
    "llama-3.1-70b": 70_553_706_496,  # meta-llama/Llama-3.1-70B safetensors metadata
    "qwen2.5-7b": 7_615_616_512,  # Qwen/Qwen2.5-7B safetensors metadata ("7.61B")
    "mixtral-8x7b": 46_702_792_704,  # mistralai/Mixtral-8x7B-v0.1 safetensors metadata
}
# Rounded figures on the cards: (value in billions, digits after the point printed). Cards round
# some figures and truncate others (Qwen2.5-14B 14.77B is printed "14.7B"), so we accept anything
# within one unit of the last printed digit.
PUBLISHED_ROUNDED = {
    "gpt2": (0.124, 3),  # openai-community/gpt2 card: "the smallest version of GPT-2, with 124M parameters"
    "qwen2.5-0.5b": (0.49, 2),  # Qwen2.5-0.5B card: "Number of Parameters: 0.49B"
    "qwen2.5-1.5b": (1.54, 2),  # card: 1.54B
    "qwen2.5-3b": (3.09, 2),  # card: 3.09B
    "qwen2.5-72b": (72.7, 1),  # card: 72.7B
    "qwen3-0.6b": (0.6, 1),  # Qwen3-0.6B card: 0.6B
    "qwen3-8b": (8.2, 1),  # Qwen3-8B card: 8.2B
    "qwen3-32b": (32.8, 1),  # Qwen3-32B card: 32.8B
    "qwen3-30b-a3b": (30.5, 1),  # Qwen3-30B-A3B card: 30.5B total
    "qwen3-235b-a22b": (235, 0),  # Qwen3-235B-A22B card: 235B total
    "deepseek-v3": (671, 0),  # DeepSeek-V3 report (arXiv:2412.19437): 671B total (without MTP)
    "gemma-2-9b": (9.24, 2),  # google/gemma-2-9b safetensors: 9.24B
    "phi-3-mini": (3.8, 1),  # Phi-3 report (arXiv:2404.14219): 3.8B
    "phi-3-medium": (14, 0),  # Phi-3 report: 14B
    "llama-3.1-405b": (405.85, 2),  # meta-llama/Llama-3.1-405B safetensors: 405.85B
    "mixtral-8x22b": (141, 0),  # Mistral announcement: 141B total
    "pythia-1b": (1.01, 2),  # Biderman et al. 2023 (arXiv:2304.01373) Table 1: 1,011,781,632
    "olmo-2-7b": (7.3, 1),  # allenai/OLMo-2-1124-7B card: 7.3B
}
PUBLISHED_ACTIVE = {
    "qwen3-30b-a3b": (3.3, 1),  # card: 3.3B activated
    "qwen3-235b-a22b": (22, 0),  # card: 22B activated
    "mixtral-8x7b": (12.9, 1),  # Mistral blog "Mixtral of experts": 12.9B active per token
    "qwen1.5-moe-a2.7b": (2.7, 1),  # Qwen1.5-MoE-A2.7B card: 2.7B activated
}


@pytest.mark.parametrize("name,expected", PUBLISHED.items())
def test_exact_published_totals(name, expected):
    assert load_model(name).params.total == expected


@pytest.mark.parametrize("name,pub", PUBLISHED_ROUNDED.items())
def test_rounded_published_totals(name, pub):
    value, digits = pub
    assert abs(load_model(name).params.total / 1e9 - value) < 10.0**-digits


@pytest.mark.parametrize("name,pub", PUBLISHED_ACTIVE.items())
def test_published_active_params(name, pub):
    value, digits = pub
    assert abs(load_model(name).params.active / 1e9 - value) < 10.0**-digits


def test_deepseek_v3_active_matches_report():
    """DeepSeek-V3 README_WEIGHTS: 36.6B activated (incl. the 0.9B output head, excl. the input
    embedding table, of which one row is read per token). We count the table, so add it back."""
    p = load_model("deepseek-v3").params
    assert round((p.active - p.breakdown["embedding"]) / 1e9, 1) == 36.6


# OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925), Table 1, in billions to two
# decimals: MLP (experts + routers), attention (q/k/v/o with biases, sinks), embed + unembed, active
# parameters per token (without the embedding table), total.
GPT_OSS_CARD = {
    "gpt-oss-20b": {"mlp": 19.12, "attention": 0.64, "embed_unembed": 1.16, "active": 3.61, "total": 20.91},
    "gpt-oss-120b": {"mlp": 114.71, "attention": 0.96, "embed_unembed": 1.16, "active": 5.13, "total": 116.83},
}


@pytest.mark.parametrize("name", GPT_OSS_CARD)
def test_gpt_oss_counts_match_model_card(name):
    """Biases, attention sinks and the biased router are all counted: each column of the card's
    table within half a unit of its last printed digit (they round to 0.01B)."""
    card, p = GPT_OSS_CARD[name], load_model(name).params
    bd = p.breakdown
    ours = {"mlp": bd["experts"] + bd["router"], "attention": bd["attention"],
            "embed_unembed": bd["embedding"] + bd["lm_head"], "active": p.active - bd["embedding"],
            "total": p.total}
    for k, v in card.items():
        assert abs(ours[k] / 1e9 - v) <= 0.005, (k, ours[k], v)


def test_gpt_oss_layers_alternate_sliding_and_full():
    """config.json layer_types: even layers use the 128-token window, odd layers attend fully."""
    m = load_model("gpt-oss-20b")
    assert m.sliding_window == 128 and m.attn_sinks
    assert [m.is_sliding_layer(i) for i in range(4)] == [True, False, True, False]
    assert all(m.is_moe_layer(i) for i in range(m.num_layers))


def test_gpt3_175b_from_the_paper():
    """Brown et al. 2020 (arXiv:2005.14165) Table 2.1: n_layers 96, d_model 12288, d_head 128,
    n_ctx 2048; GPT-2 layout: biases everywhere, 2 LayerNorms per block + final, tied embedding,
    learned positions, vocabulary 50257. The paper reports 175.0B (rounded)."""
    L, h, V, n_ctx = 96, 12288, 50257, 2048
    attention = 4 * h * h + 4 * h  # W_q, W_k, W_v, W_o and their biases
    mlp = 2 * 4 * h * h + 4 * h + h  # h -> 4h -> h with biases
    norms = 2 * 2 * h
    expected = V * h + n_ctx * h + L * (attention + mlp + norms) + 2 * h
    spec = load_model("gpt3-175b")
    assert spec.params.total == expected == 174_604_259_328
    assert round(spec.params.total / 1e9) == 175


def test_mpt_7b_generic_matches_model_card():
    """MPT-7B: 6.7B parameters (mosaicml/mpt-7b card, 6,649,286,656 in its safetensors);
    no biases, LayerNorm without bias, ALiBi (no position table), tied embedding."""
    L, h, V = 32, 4096, 50432
    expected = V * h + L * (4 * h * h + 8 * h * h + 2 * h) + h
    assert load_model("mpt-7b").params.total == expected == 6_649_286_656


def test_generic_equals_gpt2_architecture():
    """A generic spec with GPT-2's layout counts exactly what transformers' GPT2 builds."""
    generic = {"model_type": "generic", "hidden_size": 96, "intermediate_size": 384, "num_hidden_layers": 3,
               "num_attention_heads": 4, "vocab_size": 300, "tie_word_embeddings": True, "mlp_type": "plain",
               "norm_type": "layernorm", "bias": True, "position_embedding": "learned",
               "max_position_embeddings": 128}
    gpt2 = {"model_type": "gpt2", "n_embd": 96, "n_inner": 384, "n_layer": 3, "n_head": 4, "vocab_size": 300,
            "n_positions": 128}
    total, _, _ = reference_counts(build_meta(gpt2))
    assert from_hf_config(generic).params.total == total


def test_generic_gated_rmsnorm_equals_llama():
    generic = {"model_type": "generic", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
               "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 256,
               "mlp_type": "gated", "norm_type": "rmsnorm", "position_embedding": "rope"}
    llama = dict(generic, model_type="llama")
    for k in ("mlp_type", "norm_type", "position_embedding"):
        llama.pop(k)
    total, _, _ = reference_counts(build_meta(llama))
    assert from_hf_config(generic).params.total == total


# Small configs exercising options the presets leave at their defaults.
VARIANTS = {
    "llama-biases": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "llama-tied": {"model_type": "llama", "tie_word_embeddings": True, "head_dim": 24},
    "mistral-window": {"model_type": "mistral", "sliding_window": 32},
    "qwen2-sliding": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
                      "max_window_layers": 1},
    "qwen2-moe-mlp-only": {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                           "mlp_only_layers": [1]},
    "qwen3-moe-sparse-step": {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 32, "decoder_sparse_step": 2},
    "qwen3-bias": {"model_type": "qwen3", "attention_bias": True, "head_dim": 8},
    "olmo2-gqa": {"model_type": "olmo2"},
    "neox-no-attn-bias": {"model_type": "gpt_neox", "num_key_value_heads": None, "attention_bias": False,
                          "rotary_pct": 0.5},
    "deepseek-no-q-lora": {"model_type": "deepseek_v3", "num_key_value_heads": 4, "q_lora_rank": None,
                           "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                           "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                           "n_shared_experts": 2, "first_k_dense_replace": 2, "n_group": 2, "topk_group": 1,
                           "attention_bias": True},
    "gemma2-untied": {"model_type": "gemma2", "head_dim": 16, "tie_word_embeddings": False},
}
SMALL = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 96, "vocab_size": 1000}


@pytest.mark.parametrize("name", VARIANTS)
def test_family_variants_equal_transformers(name):
    cfg = {k: v for k, v in {**SMALL, **VARIANTS[name]}.items() if v is not None}
    total, by_part, by_layer = reference_counts(build_meta(cfg))
    spec = from_hf_config(cfg, name=name)
    assert spec.params.total == total
    assert {k: v for k, v in spec.params.breakdown.items() if v} == by_part
    assert list(spec.params.per_layer) == [by_layer[i] for i in range(spec.num_layers)]


def test_moe_active_counts_only_top_k_experts():
    spec = load_model("mixtral-8x7b")
    p = spec.params
    expert = 3 * spec.hidden_size * spec.intermediate_size  # one SwiGLU expert
    routed = spec.num_layers * spec.moe.num_experts * expert
    assert p.breakdown["experts"] == routed
    assert p.total - p.active == spec.num_layers * (spec.moe.num_experts - spec.moe.top_k) * expert


def test_deepseek_v3_layer_structure():
    spec = load_model("deepseek-v3")
    assert [spec.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    dense, moe = spec.layer_params(0), spec.layer_params(3)
    assert "mlp" in dense and "experts" not in dense
    assert moe["router"] == 256 * 7168  # gate.weight; e_score_correction_bias is a buffer
    assert moe["shared_experts"] == 3 * 7168 * 2048
    assert any("multi-token" in n for n in spec.notes)


# ------------------------------------------------------------------ projections and LoRA
def decoder_layers(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model.gpt_neox
    return base.layers if hasattr(base, "layers") else base.h


def actual_linears(layer) -> dict:
    """Module path -> (in, out, bias, count) of every projection in a transformers decoder layer."""
    out = {}
    for path, mod in layer.named_modules():
        params = dict(mod.named_parameters(recurse=False))
        kind = type(mod).__name__
        if kind == "Linear":
            out[path] = (mod.in_features, mod.out_features, mod.bias is not None, 1)
        elif kind == "Conv1D":  # GPT-2 stores W as in × out
            out[path] = (*params["weight"].shape, "bias" in params, 1)
        elif "gate_up_proj_bias" in params:  # gpt_oss experts: E × h × 2f and E × f × h, with biases
            E, h, two_f = params["gate_up_proj"].shape
            out[f"{path}.gate_up_proj"] = (h, two_f, True, E)
            E, f, h = params["down_proj"].shape
            out[f"{path}.down_proj"] = (f, h, "down_proj_bias" in params, E)
        elif "gate_up_proj" in params:  # stacked experts: E × 2f × h and E × h × f
            E, two_f, h = params["gate_up_proj"].shape
            out[f"{path}.gate_up_proj"] = (h, two_f, False, E)
            E, h, f = params["down_proj"].shape
            out[f"{path}.down_proj"] = (f, h, False, E)
        elif path.endswith("gate") and set(params) == {"weight"}:  # router module
            E, h = params["weight"].shape
            out[path] = (h, E, False, 1)
        elif path.endswith("router") and set(params) == {"weight", "bias"}:  # gpt_oss GptOssTopKRouter
            E, h = params["weight"].shape
            out[path] = (h, E, True, 1)
    return out


@pytest.mark.parametrize("name", HF_PRESETS)
def test_linear_modules_match_transformers(name):
    spec = load_model(name)
    layers = decoder_layers(preset_model(name))
    for i in {0, spec.num_layers - 1}:
        ours = {k: (v.in_features, v.out_features, v.bias, v.count) for k, v in spec.linear_modules(i).items()}
        assert ours == actual_linears(layers[i])


LORA_CASES = [
    ("tiny-llama-debug", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    ("llama-3.1-8b", ("q_proj", "v_proj")),
    ("phi-3-mini", ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")),
    ("gpt2", ("c_attn", "c_proj", "c_fc")),
    ("pythia-1b", ("query_key_value", "dense")),
    ("gemma-2-2b", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("tiny-qwen3-moe-debug", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    ("tiny-qwen3-moe-debug", ("gate", "down_proj")),
    ("tiny-deepseek-v3-debug", ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                                "gate_proj", "up_proj", "down_proj")),
    ("qwen1.5-moe-a2.7b", ("q_proj", "v_proj", "gate_proj", "up_proj", "shared_expert_gate")),
    ("mixtral-8x7b", ("q_proj", "o_proj", "w1", "w3", "w2", "gate")),
]


@pytest.mark.parametrize("name,targets", LORA_CASES)
def test_lora_params_equal_peft(name, targets):
    peft = pytest.importorskip("peft")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_meta(load_hf_config(name))
        with torch.device("meta"):
            wrapped = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=list(targets)))
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    assert load_model(name).lora_params(targets, 8) == sum(p.numel() for p in trainable)
    from trainledger.spec.layers import lora_tensors

    assert lora_tensors(load_model(name), targets) == len(trainable)  # the optimizer's tensor list


def test_lora_half_of_fused_expert_projection_is_an_error():
    from trainledger.errors import PlanError

    with pytest.raises(PlanError, match="both or neither"):
        load_model("tiny-qwen3-moe-debug").lora_params(("gate_proj",), 8)


def test_model_copy_with_changes_recounts_the_derived_values():
    """``model_copy(update=...)`` must not carry the unchanged spec's parameter counts or MoE mask
    (``cached_property`` values live in ``__dict__``, which pydantic copies): Llama-3.1-8B has
    32 layers of 218,112,000 parameters each (4096² q/o, 2·4096·1024 k/v, 3·4096·14336 MLP, two
    norms: meta-llama/Llama-3.1-8B config.json), so 4 layers drop 28 of them."""
    from trainledger.load.hf import load_model

    m = load_model("llama-3.1-8b")
    assert m.params.total == 8_030_261_248 and len(m.moe_layer_mask) == 32
    small = m.model_copy(update={"num_layers": 4})
    assert small.params.total == 8_030_261_248 - 28 * 218_112_000
    assert len(small.moe_layer_mask) == 4
    same = m.model_copy()
    assert same == m and same.params.total == m.params.total
