"""Kernel counts the serving model adds for MLA attention and shared experts, derived from the
module structure of the reference implementation (transformers' DeepSeek-V3 and Llama classes,
built tiny on CPU) rather than from the estimator's constants."""

from __future__ import annotations

from types import SimpleNamespace

from transformers import DeepseekV3Config, LlamaConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3MLP
from transformers.models.llama.modeling_llama import LlamaAttention

from trainledger.estimate.serving.perf import extra_kernels

_DS = DeepseekV3Config(hidden_size=64, num_attention_heads=4, q_lora_rank=16, kv_lora_rank=8,
                       qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_hidden_layers=1,
                       intermediate_size=32, moe_intermediate_size=16, n_routed_experts=4,
                       num_experts_per_tok=2)


def _children(module) -> set[str]:
    return {n for n, _ in module.named_children()}


def test_mla_adds_its_low_rank_down_projections_and_their_norms():
    """MLA (DeepSeek-V2 §2.1.1-2.1.2) compresses q and kv through a down-projection and an RMSNorm
    before the up-projections that stand where a GQA layer's q/k/v projections are: the modules of
    DeepseekV3Attention that a LlamaAttention has no counterpart for are the ``*_a_*`` ones."""
    mla = _children(DeepseekV3Attention(_DS, 0))
    gqa = _children(LlamaAttention(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2), 0))
    up_and_out = {"q_b_proj", "kv_b_proj", "o_proj"}  # q_proj, (k_proj, v_proj) and o_proj of GQA
    extra = mla - up_and_out
    assert extra == {n for n in mla if "_a_" in n} and len(gqa & mla) == 1  # only o_proj shared
    kind = SimpleNamespace(is_moe=False)
    model = SimpleNamespace(mla=object(), moe=None)
    assert extra_kernels(kind, model) == len(extra)


def test_a_shared_expert_runs_as_one_dense_mlp():
    """A shared expert is a dense gated MLP (DeepseekV3MLP: gate_proj, up_proj, down_proj, act_fn);
    serving engines merge gate and up into one GEMM (vLLM MergedColumnParallelLinear
    ``gate_up_proj``), so it launches one kernel fewer than it has modules."""
    mlp = _children(DeepseekV3MLP(_DS, intermediate_size=16))
    assert mlp == {"gate_proj", "up_proj", "down_proj", "act_fn"}
    kernels = len(mlp) - 1  # gate_proj + up_proj -> gate_up_proj
    routed = SimpleNamespace(is_moe=True)
    without = extra_kernels(routed, SimpleNamespace(mla=None, moe=SimpleNamespace(num_shared_experts=0)))
    with_shared = extra_kernels(routed, SimpleNamespace(mla=None, moe=SimpleNamespace(num_shared_experts=1)))
    assert with_shared - without == kernels


def test_a_routed_expert_block_launches_four_kernels_more_than_a_dense_mlp():
    """The kernels of one routed-expert MLP in vLLM's fused MoE path, counted from the source
    (vllm-project/vllm @ 000d1458, vllm/model_executor/layers/fused_moe/fused_moe.py):
    ``fused_topk`` launches one ``topk_softmax`` kernel after the router's gate GEMM, and
    ``fused_experts_impl`` per chunk ``moe_align_block_size``, the w1 ``invoke_fused_moe_kernel``,
    ``silu_and_mul``, the w2 ``invoke_fused_moe_kernel`` and ``moe_sum`` (unquantized weights, no
    expert map, one chunk: decode batches are far below VLLM_FUSED_MOE_CHUNK_SIZE). A dense gated
    MLP in vLLM is ``gate_up_proj`` (MergedColumnParallelLinear), ``SiluAndMul``, ``down_proj``."""
    routed = ["router gate GEMM", "topk_softmax", "moe_align_block_size", "fused_moe_kernel w1",
              "silu_and_mul", "fused_moe_kernel w2", "moe_sum"]
    dense = ["gate_up_proj", "silu_and_mul", "down_proj"]
    kind = SimpleNamespace(is_moe=True)
    plain_moe = SimpleNamespace(mla=None, moe=SimpleNamespace(num_shared_experts=0))
    assert extra_kernels(kind, plain_moe) == len(routed) - len(dense)
    assert extra_kernels(SimpleNamespace(is_moe=False), SimpleNamespace(mla=None, moe=None)) == 0
