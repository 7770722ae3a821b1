"""Property: any JSON mapping given as a config.json gives a ModelSpec or a SpecError — nothing else.

Keys are drawn from the ones the family readers look at (plus unknown ones), values from every
JSON type (numbers at and past the edges, NaN/inf, strings, lists, nested objects), model_type
from the supported families and a few unsupported ones. A ModelSpec that comes out must have
positive, finite parameter counts that add up (total = sum over layers + the rest).
"""

from __future__ import annotations

import math
from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainledger.errors import SpecError
from trainledger.load.families import FAMILIES
from trainledger.load.hf import from_hf_config, load_hf_config, preset_names

KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
        "max_window_layers", "layer_types", "num_local_experts", "num_experts", "num_experts_per_tok",
        "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
        "mlp_only_layers", "first_k_dense_replace", "n_routed_experts", "n_shared_experts",
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "n_group", "topk_group", "partial_rotary_factor", "rotary_pct", "n_embd", "n_layer", "n_head",
        "n_inner", "n_positions", "text_config", "hidden_act", "norm_type", "mlp_type", "bias",
        "position_embedding", "rope_scaling", "auto_map", "query_pre_attn_scalar", "unknown_key"]
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(-2, 70_000), st.sampled_from([0, 1, 2, 4, 8, 64, 4096, 10**8, 10**9, 2**63, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.0, 64.0, 1e300]),
    st.text(max_size=12), st.sampled_from(["silu", "gelu", "full", "sliding", "rmsnorm", "plain"]),
)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                    max_leaves=12)
SANE = st.sampled_from([1, 2, 4, 8, 16, 64, 128, 256, 1024])


@lru_cache(maxsize=None)
def _preset_config(name: str) -> dict:
    return load_hf_config(name)


@st.composite
def configs(draw: st.DrawFn) -> dict:
    """A bundled preset's real config.json with a few keys changed, or a config from scratch."""
    if draw(st.booleans()):
        cfg = dict(_preset_config(draw(st.sampled_from(preset_names()))))
        for k in draw(st.lists(st.sampled_from(sorted(set(KEYS) | set(cfg))), max_size=3, unique=True)):
            cfg[k] = draw(st.one_of(SANE, JSON))
        return cfg
    cfg = {"model_type": draw(st.sampled_from([*FAMILIES, "gemma3", "mamba", "", None, 7, ["llama"]]))}
    for k in draw(st.lists(st.sampled_from(KEYS), max_size=len(KEYS), unique=True)):
        cfg[k] = draw(st.one_of(SANE, SANE, SANE, JSON))
    return cfg


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(configs())
def test_any_config_gives_spec_or_spec_error(cfg):
    try:
        m = from_hf_config(cfg, name="fuzz.json")
    except SpecError as exc:
        msg = str(exc)
        assert msg.startswith("fuzz.json") and "\n" not in msg and len(msg) < 2000, msg[:300]
        return
    p = m.params
    assert 0 < p.total < 10**16 and math.isfinite(p.total)
    assert 0 < p.active <= p.total
    assert len(p.per_layer) == m.num_layers and all(x > 0 for x in p.per_layer)
    assert sum(p.per_layer) < p.total  # embeddings (and norms) come on top of the layers
