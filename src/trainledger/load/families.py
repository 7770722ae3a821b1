"""One reader per Hugging Face ``model_type``: config.json keys -> ModelSpec fields.

Each reader mirrors how transformers builds that family (module shapes, biases, norms, which
layers are MoE or sliding) and uses the transformers config default when an optional key is
absent, so that our counts equal ``sum(p.numel() for p in model.parameters())``. Dimensions
without which a model is undefined (hidden size, layers, heads, FFN width, vocabulary) are
required; a missing or ill-typed key raises SpecError naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainledger.errors import SpecError

_NO = object()

#: most decoder layers a config may have. Real models stay far below it: Llama 3.1 405B has 126
#: (Llama Team 2024, arXiv:2407.21783, Table 3), DeepNet trained 1,000-layer Transformers (Wang et
#: al. 2022, arXiv:2203.00555, §1). A 10,000-layer pasted config made one web estimate take a minute
#: (issue 20); past this bound it is one error line.
MAX_LAYERS = 1024


class Cfg:
    """A config.json mapping plus the file name, with typed, range-checked getters."""

    def __init__(self, data: dict[str, Any], where: str, defaults: dict[str, Any] | None = None):
        self.data, self.where, self.defaults = data, where, defaults or {}

    def _raw(self, key: str, default: Any) -> Any:
        v = self.data.get(key)
        if v is not None:
            return v
        if key in self.defaults:
            return self.defaults[key]
        if default is _NO:
            raise SpecError(f"{self.where}: missing field {key!r} (required for model_type "
                            f"{self.data.get('model_type')!r})")
        return default

    def fail(self, key: str, what: str, got: Any) -> SpecError:
        shown = repr(got)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return SpecError(f"{self.where}: field {key!r} must be {what} (got {shown})")

    def int(self, key: str, default: Any = _NO, lo: int = 1, hi: int = 10**8) -> Any:
        v = self._raw(key, default)
        if v is None:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(key, "an integer", v)
        if not lo <= v <= hi:
            raise self.fail(key, f"an integer in [{lo}, {hi:,}]", v)
        return v

    def bool(self, key: str, default: Any = _NO) -> bool:
        v = self._raw(key, default)
        if not isinstance(v, bool):
            raise self.fail(key, "true or false", v)
        return v

    def str(self, key: str, default: Any = _NO) -> Any:
        v = self._raw(key, default)
        if v is not None and not isinstance(v, str):
            raise self.fail(key, "a string", v)
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _NO) -> str:
        v = self.str(key, default)
        if v not in choices:
            raise self.fail(key, "one of " + ", ".join(choices), v)
        return v

    def int_list(self, key: str, default: Any = _NO) -> tuple[int, ...]:
        v = self._raw(key, default)
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
            raise self.fail(key, "a list of integers", v)
        return tuple(v)

    def layer_indices(self, key: str, n_layers: int) -> tuple[int, ...]:
        """A list of distinct layer indices in [0, n_layers) (e.g. ``mlp_only_layers``), sorted."""
        v = self._raw(key, [])
        if isinstance(v, list) and len(v) > n_layers:
            raise self.fail(key, f"a list of at most {n_layers} layer indices", f"{len(v):,} entries")
        got = self.int_list(key, [])
        if any(not 0 <= x < n_layers for x in got) or len(set(got)) != len(got):
            raise self.fail(key, f"a list of distinct layer indices in [0, {n_layers})", v)
        return tuple(sorted(got))

    def layer_types(self, n_layers: int) -> tuple[str, ...] | None:
        v = self.data.get("layer_types")
        if v is None:
            return None
        names = {"full_attention": "full", "sliding_attention": "sliding"}
        if not isinstance(v, list) or len(v) != n_layers or any(not isinstance(x, str) or x not in names for x in v):
            raise self.fail("layer_types", f"a list of {n_layers} 'full_attention'/'sliding_attention'", v)
        return tuple(names[x] for x in v)


# ------------------------------------------------------------------ shared pieces
def _attention_dims(c: Cfg, head_dim_default: Any = None) -> dict[str, Any]:
    h = c.int("hidden_size", hi=1_000_000)
    a = c.int("num_attention_heads", hi=10_000)
    kv = c.int("num_key_value_heads", a, hi=10_000)
    d = c.int("head_dim", head_dim_default, hi=100_000)
    if d is None:
        if h % a:
            raise SpecError(f"{c.where}: hidden_size {h} is not divisible by num_attention_heads {a}; "
                            "give head_dim")
        d = h // a
    if a % kv:
        raise SpecError(f"{c.where}: num_attention_heads {a} is not a multiple of num_key_value_heads {kv}")
    return dict(hidden_size=h, num_heads=a, num_kv_heads=kv, head_dim=d)


def _common(c: Cfg, tie_default: bool = False) -> dict[str, Any]:
    return dict(
        num_layers=c.int("num_hidden_layers", hi=MAX_LAYERS),
        intermediate_size=c.int("intermediate_size"),
        vocab_size=c.int("vocab_size"),
        tie_word_embeddings=c.bool("tie_word_embeddings", tie_default),
        max_position_embeddings=c.int("max_position_embeddings", 4096),
        activation=c.str("hidden_act", "silu"),
    )


def _llama_like(c: Cfg, head_dim_default: Any = None, tie_default: bool = False) -> dict[str, Any]:
    f = _attention_dims(c, head_dim_default)
    f.update(_common(c, tie_default))
    return f


def _all_sliding(c: Cfg, f: dict[str, Any]) -> dict[str, Any]:
    """mistral, mixtral, phi3: one window for every layer when ``sliding_window`` is set."""
    f["sliding_window"] = c.int("sliding_window", None)
    return f


def _qwen_sliding(c: Cfg, f: dict[str, Any]) -> dict[str, Any]:
    """qwen2/qwen3: a window only when ``use_sliding_window``, for layers >= ``max_window_layers``."""
    if not c.bool("use_sliding_window", False):
        return f
    w = c.int("sliding_window", 4096)
    L = f["num_layers"]
    types = c.layer_types(L)
    if types is None:
        first = c.int("max_window_layers", 28, lo=0)
        types = tuple("sliding" if i >= first else "full" for i in range(L))
    f.update(sliding_window=w, layer_types=types)
    return f


def _pattern_sliding(c: Cfg, f: dict[str, Any], period: int) -> dict[str, Any]:
    """gemma2 (period 2) / gemma3 (``sliding_window_pattern``, 6): every period-th layer is global."""
    L = f["num_layers"]
    types = c.layer_types(L) or tuple("sliding" if (i + 1) % period else "full" for i in range(L))
    f.update(sliding_window=c.int("sliding_window", 4096), layer_types=types)
    return f


def _moe_layers(c: Cfg, n_layers: int) -> dict[str, Any]:
    return dict(layer_freq=c.int("decoder_sparse_step", 1, hi=max(1, n_layers)),
                dense_layers=c.layer_indices("mlp_only_layers", n_layers))


# ------------------------------------------------------------------ families
def llama(c: Cfg) -> dict[str, Any]:
    f = _llama_like(c)
    bias = c.bool("attention_bias", False)
    f.update(qkv_bias=bias, o_bias=bias, mlp_bias=c.bool("mlp_bias", False))
    return f


def mistral(c: Cfg) -> dict[str, Any]:
    return _all_sliding(c, _llama_like(c))


def mixtral(c: Cfg) -> dict[str, Any]:
    f = _all_sliding(c, _llama_like(c))
    f["moe"] = dict(num_experts=c.int("num_local_experts", 8), top_k=c.int("num_experts_per_tok", 2),
                    expert_intermediate_size=f["intermediate_size"])
    return f


def qwen2(c: Cfg) -> dict[str, Any]:
    f = _qwen_sliding(c, _llama_like(c))
    f["qkv_bias"] = True  # transformers Qwen2Attention: q/k/v always have a bias, o_proj none
    return f


def qwen2_moe(c: Cfg) -> dict[str, Any]:
    f = qwen2(c)
    shared = c.int("shared_expert_intermediate_size", 5632, lo=0)
    f["moe"] = dict(num_experts=c.int("num_experts", 60), top_k=c.int("num_experts_per_tok", 4),
                    expert_intermediate_size=c.int("moe_intermediate_size", 1408),
                    num_shared_experts=1 if shared else 0, shared_intermediate_size=shared,
                    shared_expert_gate=True, **_moe_layers(c, f["num_layers"]))
    return f


def qwen3(c: Cfg) -> dict[str, Any]:
    f = _qwen_sliding(c, _llama_like(c, head_dim_default=128))
    bias = c.bool("attention_bias", False)
    f.update(qkv_bias=bias, o_bias=bias, qk_norm="head")
    return f


def qwen3_moe(c: Cfg) -> dict[str, Any]:
    f = _qwen_sliding(c, _llama_like(c))
    bias = c.bool("attention_bias", False)
    f.update(qkv_bias=bias, o_bias=bias, qk_norm="head")
    f["moe"] = dict(num_experts=c.int("num_experts", 128), top_k=c.int("num_experts_per_tok", 8),
                    expert_intermediate_size=c.int("moe_intermediate_size", 768), **_moe_layers(c, f["num_layers"]))
    return f


def _gemma_base(c: Cfg) -> dict[str, Any]:
    f = _llama_like(c, head_dim_default=256, tie_default=True)
    bias = c.bool("attention_bias", False)
    act = c.str("hidden_activation", None) or f["activation"]
    f.update(qkv_bias=bias, o_bias=bias, activation=act)
    return f


def gemma(c: Cfg) -> dict[str, Any]:
    """Gemma: embeddings scaled by sqrt(h) and RMSNorm as x·(1+w) — same parameter shapes as Llama."""
    return _gemma_base(c)


#: transformers Gemma2Config defaults (models/gemma2/configuration_gemma2.py)
GEMMA2_FINAL_SOFTCAP = 30.0
GEMMA2_ATTN_SOFTCAP = 50.0


def gemma2(c: Cfg) -> dict[str, Any]:
    """Gemma 2: pre- and post-norm around attention and MLP (4 norms per layer), local/global layers."""
    f = _pattern_sliding(c, _gemma_base(c), 2)
    # transformers' Gemma2Config applies 30 / 50 when config.json omits the keys (an explicit null
    # turns the cap off): configuration_gemma2.py ``final_logit_softcapping=30.0, attn_logit_softcapping=50.0``
    f.update(norms_per_layer=4, logit_softcap=c.data.get("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP),
             attn_softcap=c.data.get("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP))
    return f


GEMMA3_TEXT_DEFAULTS = {  # transformers Gemma3TextConfig defaults; gemma3 text_config relies on them
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 131_072, "hidden_activation": "gelu_pytorch_tanh",
}


def gemma3_text(c: Cfg) -> dict[str, Any]:
    """Gemma 3 text: Gemma 2 layout plus per-head q/k RMSNorm; 5 local layers per global one."""
    f = _gemma_base(c)
    f = _pattern_sliding(c, f, c.int("sliding_window_pattern", 6))
    f.update(norms_per_layer=4, qk_norm="head", logit_softcap=c.data.get("final_logit_softcapping"))
    return f


def phi3(c: Cfg) -> dict[str, Any]:
    """Phi-3: fused qkv_proj and gate_up_proj, no biases."""
    f = _all_sliding(c, _llama_like(c))
    f.update(fused_qkv=True, fused_gate_up=True)
    return f


def olmo2(c: Cfg) -> dict[str, Any]:
    """OLMo 2: RMSNorm over the full q and k width, norms after attention and MLP only."""
    f = _llama_like(c)
    bias = c.bool("attention_bias", False)
    f.update(qkv_bias=bias, o_bias=bias, qk_norm="full", post_norm_only=True)
    return f


def gpt2(c: Cfg) -> dict[str, Any]:
    """GPT-2: Conv1D projections with biases, LayerNorm with bias, learned positions, tied lm_head."""
    def key(name: str, alias: str) -> str:  # GPT2Config.attribute_map: hidden_size -> n_embd, ...
        return alias if name not in c.data and alias in c.data else name

    h = c.int(key("n_embd", "hidden_size"), hi=1_000_000)
    a = c.int(key("n_head", "num_attention_heads"), hi=10_000)
    if h % a:
        raise SpecError(f"{c.where}: n_embd {h} is not divisible by n_head {a}")
    return dict(
        hidden_size=h, num_heads=a, num_kv_heads=a, head_dim=h // a,
        num_layers=c.int(key("n_layer", "num_hidden_layers"), hi=MAX_LAYERS),
        intermediate_size=c.int("n_inner", 4 * h),
        vocab_size=c.int("vocab_size"), tie_word_embeddings=c.bool("tie_word_embeddings", True),
        mlp_type="plain", activation=c.str("activation_function", "gelu_new"), norm_type="layernorm",
        norm_bias=True, qkv_bias=True, o_bias=True, mlp_bias=True, fused_qkv=True,
        position_embedding="learned",
        max_position_embeddings=c.int(key("n_positions", "max_position_embeddings"), 1024),
    )


def gpt_neox(c: Cfg) -> dict[str, Any]:
    """GPT-NeoX / Pythia: fused qkv, biases, LayerNorm with bias, parallel residual, partial rotary."""
    f = _llama_like(c)
    f["num_kv_heads"] = f["num_heads"]
    bias = c.bool("attention_bias", True)
    pct = c.data.get("rotary_pct", c.data.get("partial_rotary_factor", 0.25))
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 1:
        raise c.fail("rotary_pct", "a number in (0, 1]", pct)
    f.update(mlp_type="plain", activation=c.str("hidden_act", "gelu"), norm_type="layernorm",
             norm_bias=True, qkv_bias=bias, o_bias=bias, mlp_bias=True, fused_qkv=True,
             parallel_residual=c.bool("use_parallel_residual", True), rotary_fraction=float(pct))
    return f


def deepseek_v3(c: Cfg) -> dict[str, Any]:
    """DeepSeek-V3: MLA attention, MoE with shared experts after ``first_k_dense_replace`` dense layers."""
    h = c.int("hidden_size", hi=1_000_000)
    a = c.int("num_attention_heads", hi=10_000)
    mla = dict(q_lora_rank=c.int("q_lora_rank", 1536), kv_lora_rank=c.int("kv_lora_rank", 512),
               qk_nope_head_dim=c.int("qk_nope_head_dim", 128), qk_rope_head_dim=c.int("qk_rope_head_dim", 64),
               v_head_dim=c.int("v_head_dim", 128))
    if c.int("moe_layer_freq", 1) != 1:
        raise c.fail("moe_layer_freq", "1 (transformers' DeepseekV3 makes every layer after "
                     "first_k_dense_replace an MoE layer)", c.data["moe_layer_freq"])
    f = dict(hidden_size=h, num_heads=a, num_kv_heads=a, head_dim=mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"],
             mla=mla, **_common(c))
    bias = c.bool("attention_bias", False)
    f.update(qkv_bias=bias, o_bias=bias)
    shared = c.int("n_shared_experts", 1, lo=0)
    width = c.int("moe_intermediate_size", 2048)
    f["moe"] = dict(num_experts=c.int("n_routed_experts", 256), top_k=c.int("num_experts_per_tok", 8),
                    expert_intermediate_size=width, num_shared_experts=shared,
                    shared_intermediate_size=shared * width, router_bias=True,
                    first_dense_layers=c.int("first_k_dense_replace", 3, lo=0),
                    num_groups=c.int("n_group", 8), topk_groups=c.int("topk_group", 4))
    mtp = c.int("num_nextn_predict_layers", 0, lo=0)
    if mtp:
        f["notes"] = (f"{mtp} multi-token-prediction layer(s) in the checkpoint are not counted "
                      "(transformers does not build them)",)
    return f


def gpt_oss(c: Cfg) -> dict[str, Any]:
    """GPT-OSS (openai/gpt-oss-20b, -120b; transformers models/gpt_oss): biased q/k/v/o, one learned
    attention-sink logit per head, sliding-window (128) layers alternating with full ones, and
    MoE in every layer: a biased router and experts with biased fused gate_up and down projections.
    Its clamped SwiGLU (alpha 1.702, limit 7) has the shapes of a gated MLP."""
    f = _llama_like(c, head_dim_default=64)
    bias = c.bool("attention_bias", True)
    L = f["num_layers"]
    # GptOssConfig.__post_init__: without layer_types, even layers slide and odd ones are full
    types = c.layer_types(L) or tuple("sliding" if (i + 1) % 2 else "full" for i in range(L))
    f.update(qkv_bias=bias, o_bias=bias, mlp_bias=True, attn_sinks=True, layer_types=types,
             sliding_window=c.int("sliding_window", 128))
    f["moe"] = dict(num_experts=c.int("num_local_experts", 128), top_k=c.int("num_experts_per_tok", 4),
                    expert_intermediate_size=f["intermediate_size"])
    return f


GENERIC_KEYS = ("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                "num_key_value_heads, vocab_size, tie_word_embeddings, mlp_type, norm_type, bias, "
                "position_embedding, max_position_embeddings")


def generic(c: Cfg) -> dict[str, Any]:
    """A model given by its dimensions alone (Llama key names plus a few layout keys).

    ``mlp_type`` gated|plain, ``norm_type`` rmsnorm|layernorm, ``bias`` (every linear layer and
    LayerNorm has a bias, lm_head excepted), ``position_embedding`` rope|learned|alibi.
    """
    f = _llama_like(c)
    bias = c.bool("bias", False)
    norm = c.choice("norm_type", ("rmsnorm", "layernorm"), "rmsnorm")
    pos = c.choice("position_embedding", ("rope", "learned", "alibi"), "rope")
    if pos == "learned":
        f["max_position_embeddings"] = c.int("max_position_embeddings")
    f.update(mlp_type=c.choice("mlp_type", ("gated", "plain"), "gated"), norm_type=norm,
             norm_bias=bias and norm == "layernorm", qkv_bias=bias, o_bias=bias, mlp_bias=bias,
             position_embedding=pos, activation=c.str("hidden_act", "silu"))
    return f


Reader = Callable[[Cfg], dict[str, Any]]

# Optional keys whose transformers default differs from "same as the query heads" etc.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {"num_key_value_heads": 8},
    "mixtral": {"num_key_value_heads": 8},
    "qwen2_moe": {"num_key_value_heads": 16},
    "qwen3_moe": {"num_key_value_heads": 4},
    "gemma": {"num_key_value_heads": 16},
    "gemma2": {"num_key_value_heads": 4},
    "gemma3_text": GEMMA3_TEXT_DEFAULTS,
    "gpt_oss": {"num_key_value_heads": 8},  # GptOssConfig defaults
}

FAMILIES: dict[str, Reader] = {
    "llama": llama, "mistral": mistral, "mixtral": mixtral, "qwen2": qwen2, "qwen2_moe": qwen2_moe,
    "qwen3": qwen3, "qwen3_moe": qwen3_moe, "gemma": gemma, "gemma2": gemma2,
    "gemma3_text": gemma3_text, "phi3": phi3, "gpt2": gpt2, "gpt_neox": gpt_neox, "olmo2": olmo2,
    "deepseek_v3": deepseek_v3, "gpt_oss": gpt_oss, "generic": generic,
}
