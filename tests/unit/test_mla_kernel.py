"""Which kernel runs DeepSeek MLA's attention core, and what each keeps for the backward.

MLA's queries and keys carry d_nope + d_rope = 192 dims per head, its values 128. torch's SDPA
picks its kernel per device from the head dims (aten sdp_utils): on a GPU the memory-efficient
kernel takes d_v != d_q, so transformers' ``sdpa`` path saves no s×s scores; on the CPU the flash
kernel needs equal dims and SDPA falls back to its math kernel, which saves fp32 scores — what the
CPU verification runs measure (tests/groundtruth/test_memory_accuracy.py, the tiny DeepSeek-V3
cases, estimated with ``MemoryOptions(device="cpu")``). FlashAttention needs equal dims too:
transformers pads v to d_q for it.
"""

from __future__ import annotations

import pytest

from trainledger.estimate import estimate_job
from trainledger.estimate.memory.activations import FP32, Flow, layer_bytes, mla_kernel
from trainledger.estimate.options import EstimateOptions, MemoryOptions
from trainledger.load.hf import load_model

DSV3 = load_model("deepseek-v3")


@pytest.mark.parametrize("attention, framework, device, kernel", [
    ("sdpa", "hf", "gpu", "fused"),            # memory-efficient kernel: d_q = d_k, d_v aligned
    ("sdpa", "fsdp2", "gpu", "fused"),
    ("sdpa", "hf", "cpu", "math"),             # the CPU flash kernel needs q, k, v dims equal
    ("sdpa", "megatron-core", "cpu", "fused"),  # Transformer Engine's fused attention takes MLA
    ("flash", "hf", "gpu", "padded"),          # FlashAttention: v padded to d_q by transformers
    ("flash1", "deepspeed", "gpu", "padded"),
    ("eager", "hf", "gpu", "math"),
    ("eager", "megatron-core", "gpu", "math"),
])
def test_kernel_choice(attention, framework, device, kernel):
    assert mla_kernel(DSV3, attention, framework, device) == kernel
    assert mla_kernel(load_model("llama-3.1-8b"), attention, framework, device) == ""


def test_what_each_kernel_keeps_per_token():
    ml = DSV3.mla
    a, dq, dv = DSV3.num_heads, ml.qk_nope_head_dim + ml.qk_rope_head_dim, ml.v_head_dim
    assert (dq, dv) == (192, 128)
    flow = Flow(c=2, R=4, autocast=True)  # bf16-mixed with fp32 weights
    got = {k: layer_bytes(DSV3, flow, "sdpa", False, mla=k) for k in ("math", "fused", "padded")}
    assert got["math"].per_s == FP32 * a          # fp32 scores per attended position
    assert got["fused"].per_s == got["padded"].per_s == 0.0
    # padded: v and the kernel's output widen from d_v to d_q, and o_proj saves its own c-byte copy
    # of the sliced output instead of sharing the kernel's
    extra = flow.c * (2 * a * (dq - dv) + a * dv)
    assert got["padded"].sharded - got["fused"].sharded == pytest.approx(extra)


def test_gpu_plans_keep_no_scores_and_the_cpu_run_does():
    def acts(device):
        out = []
        for seq in (1024, 2048, 4096):
            e = estimate_job(model="deepseek-v3", method="full", gpus=256, gpu="h200", framework="fsdp2", zero=3,
                             seq_len=seq, recompute="none", micro_batch=1,
                             options=EstimateOptions(memory=MemoryOptions(device=device)))
            out.append(e.memory.breakdown["activations"])
        return (out[2] - out[1]) - 2 * (out[1] - out[0])   # zero when affine in s
    # on the GPU the activations are affine in the sequence (no s×s term) ...
    assert abs(acts("gpu")) <= 8
    # ... on the CPU the math kernel's fp32 scores add 4·a bytes per token pair, per layer held
    # ((4096² - 2048²) - 2·(2048² - 1024²) = 6·1024² token pairs; at least one layer's worth)
    assert acts("cpu") >= FP32 * DSV3.num_heads * 6 * 1024 ** 2


def test_acceptance_report_predicts_the_device_it_ran_on():
    from trainledger.load.plan import build_plan, parse_inputs
    from trainledger.verify.accept import predicted_memory

    plan = build_plan(parse_inputs({"model": "tiny-deepseek-v3-debug", "seq_len": 256, "micro_batch": 2}))
    cpu, gpu = predicted_memory(plan, "cpu"), predicted_memory(plan, "cuda")
    assert cpu["peak_allocated_bytes"] > gpu["peak_allocated_bytes"]   # the CPU math kernel's scores
    want = estimate_job(plan, options=EstimateOptions(memory=MemoryOptions(device="cpu"))).memory
    assert cpu["peak_allocated_bytes"] == want.peak_allocated_bytes
