"""MLA under Megatron-Core: Transformer Engine's fused attention takes d_qk != d_v (DeepSeek's 192 /
128), so no s×s scores are saved; the Hugging Face path on torch's SDPA keeps none on a GPU either
(memory-efficient kernel) but falls back to the math kernel, which saves fp32 scores, on the CPU
(estimate/memory/activations.py ``_mla``, ``mla_kernel``; tests/unit/test_mla_kernel.py)."""

from __future__ import annotations

import pytest

from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.activations import layer_bytes
from trainledger.estimate.memory.model import flow_of
from trainledger.estimate.options import MemoryOptions
from trainledger.load.plan import build_plan, parse_inputs


def _plan(framework: str, seq_len: int):
    return build_plan(parse_inputs({"model": "deepseek-v3", "gpu": "h800", "gpus": 2048, "tp": 1, "pp": 16,
                                    "ep": 64, "seq_len": seq_len, "framework": framework}))


def _acts(plan, device: str = "gpu") -> float:
    m = estimate_memory(plan, MemoryOptions(suggestions=False, device=device), suggest=False)
    return next(t.value for t in m.terms if t.name == "activations")


def test_fused_mla_keeps_no_scores():
    plan = _plan("megatron-core", 4096)
    m = plan.model
    flow = flow_of(plan)[0]
    fused = layer_bytes(m, flow, "sdpa", True, mla="fused")
    math_kernel = layer_bytes(m, flow, "sdpa", True)
    assert fused.per_s == 0
    assert math_kernel.per_s == 4 * m.num_heads  # fp32 scores per attended position
    # bf16 weights (c = R = 2): both keep q, k (192 per head), v and o_proj's 16-bit input (128 per
    # head) per token; the fused kernel adds its fp32 softmax statistics (4 bytes per head)
    assert (flow.c, flow.R) == (2, 2)
    assert fused.sharded - math_kernel.sharded == 4 * m.num_heads
    assert fused.replicated == math_kernel.replicated


def test_megatron_mla_activations_grow_linearly_with_the_sequence():
    # no per-position term: doubling s doubles the saved activations (tokens per micro-batch)
    mc = _acts(_plan("megatron-core", 8192)) / _acts(_plan("megatron-core", 4096))
    assert mc == pytest.approx(2.0, rel=1e-3)
    # the HF path on the GPU as well; on the CPU it keeps the math kernel's scores: more than linear
    assert _acts(_plan("hf", 8192)) / _acts(_plan("hf", 4096)) == pytest.approx(2.0, rel=1e-3)
    assert _acts(_plan("hf", 8192), "cpu") / _acts(_plan("hf", 4096), "cpu") > 2.5
