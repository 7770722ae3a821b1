"""``--attention cudnn``: cuDNN's fused attention (Transformer Engine's DotProductAttention, NeMo
AutoModel's ``attn: te``) at its own rate on any stack: the rate the megatron-core profile holds for
the GPU family, since that stack runs it; memory as the other tiled kernels."""

from __future__ import annotations

import pytest

from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.stack import cudnn_attention_efficiency, stack_profile
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import PlanInputs, build_plan


def _plan(**kw):
    return build_plan(PlanInputs(**{"model": "llama-3.1-8b", "gpus": 8, "zero": 3, "seq_len": 8192, **kw}))


def test_cudnn_runs_at_te_attention_rate_on_a_pytorch_stack():
    h100 = load_gpu("h100-sxm")
    assert cudnn_attention_efficiency(h100) == stack_profile("megatron-core", h100).eff.attention
    sdpa = estimate_compute(_plan(framework="fsdp2")).compute_parts["attention"]
    cudnn = estimate_compute(_plan(framework="fsdp2", attention="cudnn")).compute_parts["attention"]
    ratio = cudnn_attention_efficiency(h100) / stack_profile("fsdp2", h100).eff.attention
    assert ratio > 1.2 and sdpa / cudnn == pytest.approx(ratio, rel=1e-9)


def test_cudnn_changes_nothing_where_the_stack_runs_it_already():
    a = estimate_compute(_plan(framework="megatron-core", zero=1))
    b = estimate_compute(_plan(framework="megatron-core", zero=1, attention="cudnn"))
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)


def test_cudnn_memory_is_the_tiled_kernels():
    a = estimate_memory(_plan(framework="fsdp2"))
    b = estimate_memory(_plan(framework="fsdp2", attention="cudnn"))
    assert a.peak_allocated_bytes == b.peak_allocated_bytes


def test_megatron_export_names_the_fused_backend():
    from trainledger.runconfig import export_plan

    files = export_plan(PlanInputs(model="llama-3.1-8b", gpus=8, framework="megatron-core", zero=1,
                                   attention="cudnn"), "megatron")
    assert "--attention-backend fused" in files[0].text
