"""Serving memory: the three answers issue 16 found wrong, and vLLM's accounting, against published numbers.

Sources:
* Llama-3.1-70B has 70,553,706,496 parameters (safetensors metadata of meta-llama/Llama-3.1-70B,
  huggingface.co model card "Model size 70.6B params"); 80 layers, 8 KV heads of 128 (config.json).
* vLLM serves ``--dtype auto`` as the checkpoint's bf16 (docs: engine args ``--dtype``); ``--quantization fp8``
  stores W8A8 linears in one byte and keeps the embedding and ``lm_head`` in 16 bits
  (vllm/model_executor/layers/quantization/fp8.py: only LinearBase layers get Fp8LinearMethod).
* KV heads per TP rank: vllm/config ModelConfig.get_num_kv_heads = max(1, total_kv_heads // tp).
* MLA: DeepSeek-V2 (arXiv:2405.04434) Table 1 caches (d_c + d_h^R)·l elements per token; DeepSeek-V3
  config: kv_lora_rank 512, qk_rope_head_dim 64, 61 layers -> 576·61 elements per token.
* vLLM start-up log of Qwen3-30B-A3B, TP4, fp16, block 32, 21.66 GiB GPUs, vLLM 0.8.5 (blog post
  "突破131K上下文：Qwen3-30B模型的YaRN扩展实践", 2025-06-03): "total_gpu_memory (21.66GiB) x
  gpu_memory_utilization (0.92) = 19.93GiB; model weights take 14.27GiB; non_torch_memory takes
  0.20GiB; PyTorch activation peak memory takes 1.39GiB; the rest of the memory reserved for KV Cache
  is 4.07GiB"; with max-model-len 32768 the same setup logged KV 4.30 GiB and "Maximum concurrency:
  5.73x".
"""

from __future__ import annotations

import pytest

from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.serving.kv import kv_layout
from trainledger.estimate.serving.memory import engine_memory, pool_concurrency, vllm_kv_pool, weight_bytes
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.units import GIB

LLAMA70_PARAMS = 70_553_706_496
LLAMA70_V, LLAMA70_H = 128_256, 8192


def plan(**kw):
    base = dict(method="inference", gpu="h200")
    base.update(kw)
    return build_plan(PlanInputs(**base))


# ---------------------------------------------------------------- wrong answer 1: fp32 by default
def test_default_inference_precision_serves_bf16_weights_and_kv() -> None:
    p = plan(model="llama-3.1-70b", seq_len=4096, micro_batch=1)
    assert p.model.params.total == LLAMA70_PARAMS
    assert p.recipe.policy["weights"] == "bf16"
    em = engine_memory(p)
    assert em.weights == pytest.approx(LLAMA70_PARAMS * 2, rel=1e-6)  # 131.4 GiB, not 262.8
    assert em.weights / GIB == pytest.approx(131.4, abs=0.05)
    assert em.kv.dtype == "bf16"
    assert em.kv.bytes_per_token == 80 * 2 * 8 * 128 * 2  # 327,680 bytes per token, bf16
    hf = estimate_memory(plan(model="llama-3.1-70b", seq_len=4096, serving_engine="hf"), suggest=False)
    assert hf.breakdown["weights"] == pytest.approx(LLAMA70_PARAMS * 2, rel=1e-6)


# ---------------------------------------------------------------- wrong answer 2: fp8 = bf16
def test_fp8_weights_are_one_byte_per_linear_weight() -> None:
    p = plan(model="llama-3.1-70b", precision="fp8-mixed", seq_len=4096)
    bf16 = LLAMA70_PARAMS * 2
    ends = 2 * LLAMA70_V * LLAMA70_H  # untied embedding + lm_head stay 16-bit in vLLM
    norms = (2 * 80 + 1) * LLAMA70_H
    expected = (LLAMA70_PARAMS - ends - norms) * 1 + (ends + norms) * 2
    w = engine_memory(p).weights
    assert w == pytest.approx(expected, rel=1e-4)
    assert w < 0.52 * bf16
    hf = estimate_memory(plan(model="llama-3.1-70b", precision="fp8-mixed", seq_len=4096, serving_engine="hf"),
                         suggest=False)
    assert hf.breakdown["weights"] / GIB == pytest.approx(LLAMA70_PARAMS / GIB, rel=1e-3)  # 65.7 GiB
    q = engine_memory(plan(model="llama-3.1-70b", quantization="fp8", seq_len=4096)).weights
    assert q == pytest.approx(w, rel=1e-6)


# ---------------------------------------------------------------- wrong answer 3: KV over TP, MLA
def test_deepseek_v3_128k_on_tp8_holds_the_mla_latent_per_gpu() -> None:
    p = plan(model="deepseek-v3", precision="fp8-mixed", seq_len=131072, tp=8, gpus=8)
    em = engine_memory(p)
    assert em.kv.latent
    assert em.batch_kv == 131072 * 61 * 576 * 2  # bf16 latent, every rank holds all of it
    assert em.batch_kv / GIB == pytest.approx(8.58, abs=0.01)
    mem = estimate_memory(p, suggest=False)
    assert mem.breakdown["kv_cache"] == em.batch_kv
    # transformers' expanded per-head cache: the heads split over TP (128 / 8 per rank)
    hf8 = estimate_memory(plan(model="deepseek-v3", precision="bf16", seq_len=131072, tp=8, gpus=8,
                               serving_engine="hf"), suggest=False)
    hf1 = estimate_memory(plan(model="deepseek-v3", precision="bf16", seq_len=131072, serving_engine="hf"),
                          suggest=False)
    assert hf8.breakdown["kv_cache"] * 8 == hf1.breakdown["kv_cache"]
    latent_hf = estimate_memory(plan(model="deepseek-v3", precision="bf16", seq_len=131072, tp=8, gpus=8,
                                     serving_engine="hf", mla_latent_cache=True), suggest=False)
    assert latent_hf.breakdown["kv_cache"] == 131072 * 61 * 576 * 2


def test_gqa_kv_heads_split_over_tp_and_replicated_beyond_k() -> None:
    m = plan(model="llama-3.1-70b", seq_len=4096).model
    per_rank = {tp: kv_layout(m, tp, 1, "bf16", False) for tp in (1, 2, 8, 16)}
    assert per_rank[2].bytes_per_token == per_rank[1].bytes_per_token / 2
    assert per_rank[8].heads_per_rank == 1 and not per_rank[8].replicated
    assert per_rank[16].heads_per_rank == 1 and per_rank[16].replicated  # max(1, 8 // 16)
    assert per_rank[16].bytes_per_token == per_rank[8].bytes_per_token == 80 * 2 * 128 * 2


# ---------------------------------------------------------------- vLLM's own accounting
def test_vllm_kv_budget_reproduces_the_published_start_up_log() -> None:
    kv = vllm_kv_pool(21.66 * GIB, 0.92, 14.27 * GIB, 1.39 * GIB, 0.20 * GIB)
    assert kv / GIB == pytest.approx(4.07, abs=0.006)


def test_vllm_max_concurrency_of_qwen3_30b_a3b_tp4() -> None:
    p = plan(model="qwen3-30b-a3b", precision="fp16", seq_len=32768, tp=4, gpus=4, block_size=32)
    assert weight_bytes(p) / GIB == pytest.approx(14.27, rel=0.01)  # "model weights take 14.27GiB"
    kv = kv_layout(p.model, 4, 1, "fp16", False)
    _, _, conc = pool_concurrency(kv, 4.30 * GIB, 32768, 32)
    assert conc == pytest.approx(5.73, abs=0.02)  # "Maximum concurrency ...: 5.73x"


def test_awq_int4_group_128_counts_scales_and_zeros() -> None:
    """AWQ g128: 4-bit weights + fp16 scales + 4-bit zeros per group = 0.5 + 2.5/128 bytes."""
    p = plan(model="llama-3.1-8b", quantization="awq", seq_len=4096)
    m = p.model
    bd = m.params.breakdown
    linear = m.params.total - m.params.embedding - bd.get("lm_head", 0) - bd.get("norms", 0)
    ends = m.params.embedding + bd.get("lm_head", 0) + bd.get("norms", 0)
    expected = linear * (0.5 + 2.5 / 128) + ends * 2
    assert weight_bytes(p) == pytest.approx(expected, rel=1e-4)
