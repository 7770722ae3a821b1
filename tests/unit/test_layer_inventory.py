"""One decoder-layer inventory: parameter counts, LoRA matching and FLOPs read the same list."""

from __future__ import annotations

import pytest

from trainledger.load.catalog import names
from trainledger.estimate.time.compute import layer_kinds, lora_gemms
from trainledger.load.hf import load_model
from trainledger.spec.layers import layer_linears, lora_params

TARGETS = [
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    ("c_attn", "c_proj", "c_fc"), ("query_key_value", "dense"), ("qkv_proj", "gate_up_proj", "o_proj"),
]
DENSE = [n for n in sorted(names("models")) if not load_model(n).is_moe]


@pytest.mark.parametrize("name", DENSE)
def test_lora_flops_are_twice_the_adapter_parameters(name):
    """Each adapter weight is used once per token in forward: 2 FLOPs per parameter (dense models)."""
    m = load_model(name)
    for targets in TARGETS:
        flops = sum(k.count * sum(g.flops_per_token for g in lora_gemms(m, k, targets, 16)) for k in layer_kinds(m))
        assert flops == pytest.approx(2 * lora_params(m, targets, 16)), targets


@pytest.mark.parametrize("name", sorted(names("models")))
def test_gemm_weights_equal_the_inventory(name):
    """The FLOP count's GEMMs hold exactly the inventory's projection weights (experts once each)."""
    m = load_model(name)
    for k in layer_kinds(m):
        gemm_weights = sum(g.k * g.n * (g.experts or 1) for g in k.gemms)
        inventory = sum(lin.count * lin.in_features * lin.out_features for lin in layer_linears(m, k.first_layer).values())
        assert gemm_weights == inventory


def test_gpt2_lora_on_c_proj_wraps_attention_and_mlp():
    """peft's name rule: 'c_proj' is the suffix of attn.c_proj and mlp.c_proj, so both get adapters."""
    m = load_model("gpt2")
    k = layer_kinds(m)[0]
    wrapped = {g.name for g in lora_gemms(m, k, ("c_proj",), 8)}
    assert wrapped == {"lora_a_attn.c_proj", "lora_b_attn.c_proj", "lora_a_mlp.c_proj", "lora_b_mlp.c_proj"}
