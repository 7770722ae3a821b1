"""Context-parallel ring-attention transients in the memory model (activations.cp_ring_bytes).

Expected values are derived by hand from the sources the model cites, not read back from it:
torch's context_parallel (torch/distributed/tensor/experimental/_attention.py: the ALL_GATHER
rotater gathers one K|V chunk per CP rank), Transformer Engine's AttnFuncWithCPAndKVP2P (a list of
cp received K|V chunks and per-step outputs in forward, two fixed buffers in backward), and the
torchtitan 2024-12 benchmark (benchmarks/llama3_h100_202412_torchtitan.md, Table 2).
"""

from __future__ import annotations

import pytest

from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.activations import cp_ring_bytes
from trainledger.estimate.memory.device import runtime_defaults
from trainledger.estimate.memory.model import cp_transients, flow_of
from trainledger.estimate.memory.phases import step_points
from trainledger.estimate.options import MemoryOptions
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import PlanInputs, build_plan

GIB = 2**30


def _titan8b(cp: int, **kw):
    # torchtitan Table 2: Llama 3.1 8B, 8 H100 96GB, FSDP (8/cp) x CP cp, 32768 tokens per rank,
    # local batch 1, full activation checkpointing, Float8
    base = dict(model="llama-3.1-8b", gpu="h100-sxm-96gb", gpus=8, zero=3, framework="fsdp2",
                cp=cp, seq_len=32768 * cp, micro_batch=1, global_batch=8 // cp, recompute="full",
                precision="fp8-mixed")
    base.update(kw)
    return build_plan(PlanInputs(**base))


def _moment(plan, label: str) -> dict[str, float]:
    _, points = step_points(plan, MemoryOptions(suggestions=False), runtime_defaults())
    return next(d for _, lb, d in points if lb == label)


def test_no_transient_without_context_parallelism():
    assert cp_ring_bytes("torch", 1, 4096, 4096, 32, 2) == (0.0, 0.0)
    assert cp_ring_bytes("te", 1, 4096, 1024, 32, 2) == (0.0, 0.0)
    p = _titan8b(1)
    assert cp_transients(p, flow_of(p)[0]) == (0.0, 0.0)


@pytest.mark.parametrize("cp", [2, 3, 4, 7])
def test_torch_all_gather_holds_one_kv_chunk_per_rank(cp):
    # ALL_GATHER rotater: the gathered buffer is cp chunks of the rank's K|V (2 tensors of kv
    # elements in c bytes); one more rank adds one chunk, in forward and in backward alike
    q, kv, heads, c = 4096, 1024, 32, 2
    f0, b0 = cp_ring_bytes("torch", cp, q, kv, heads, c)
    f1, b1 = cp_ring_bytes("torch", cp + 1, q, kv, heads, c)
    assert f1 - f0 == pytest.approx(2 * c * kv)
    assert b1 - b0 == pytest.approx(2 * c * kv)


def test_torch_backward_accumulates_in_fp32():
    # convert_to_f32: dQ, dK, dV accumulate in fp32 and the dK|dV exchanged between ranks is fp32,
    # so the backward transient grows by >= 4 bytes per extra K/V element (three dK|dV buffers:
    # 24 bytes per K/V width), independent of the compute dtype's 2 bytes
    q, heads, c, cp = 4096, 32, 2, 4
    _, b_small = cp_ring_bytes("torch", cp, q, 512, heads, c)
    _, b_large = cp_ring_bytes("torch", cp, q, 1024, heads, c)
    gathered = 2 * c * (1 + cp)  # K|V copies + gathered chunks, per K/V element
    step_grads = 2 * c  # the step's c-byte dK, dV
    assert (b_large - b_small) / 512 == pytest.approx(3 * 2 * 4 + step_grads + gathered)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_te_p2p_keeps_every_step_in_forward_and_two_buffers_in_backward(cp):
    # TE AttnFuncWithCPAndKVP2P: p2p_comm_buffers, out_per_step and softmax_lse_per_step are lists
    # of cp entries alive until the forward's correction loop; backward allocates two
    # (K|V, dK|dV) buffers whatever cp is
    q, kv, heads, c = 4096, 1024, 32, 2
    f0, b0 = cp_ring_bytes("te", cp, q, kv, heads, c)
    f1, b1 = cp_ring_bytes("te", cp + 1, q, kv, heads, c)
    assert f1 - f0 == pytest.approx(2 * c * kv + c * q + 4 * heads)
    assert b1 == b0
    assert b0 >= 2 * 2 * 2 * c * kv  # the two buffers, each a K|V chunk and its dK|dV


def test_torchtitan_gathers_query_wide_kv_chunks():
    # torchtitan repeats K/V to the 32 query heads before SDPA: between CP 4 and CP 8 at the same
    # 32768 tokens per rank, a layer's backward holds 4 more gathered K|V chunks of 4096-wide bf16
    # K and V: 4 * 2 * 2 bytes * 4096 * 32768 = 2 GiB; nothing else in that moment's
    # activations depends on cp
    a4 = _moment(_titan8b(4), "last layer backward")["activations"]
    a8 = _moment(_titan8b(8), "last layer backward")["activations"]
    assert a8 - a4 == pytest.approx(4 * 2 * 2 * 4096 * 32768, rel=1e-9)
    assert a8 - a4 == pytest.approx(2 * GIB)


def test_torchtitan_table2_peak_is_the_loss_not_the_ring():
    # Table 2 reports 83.9 / 84.2 / 84.0 / 84.5 GiB for CP 1/2/4/8 at 32768 tokens per rank: flat
    # within 0.6 GiB although the ring's buffers grow with cp. At 32768 tokens x 128256 vocab the
    # fp32 logits path (15.7 GiB per tensor) outweighs any layer's backward, ring included
    est = {cp: estimate_memory(_titan8b(cp), MemoryOptions(suggestions=False), suggest=False)
           for cp in (1, 2, 4, 8)}
    reserved = [e.peak_reserved_bytes / GIB for e in est.values()]
    assert max(reserved) - min(reserved) <= 0.6
    for cp in (2, 4, 8):
        p = _titan8b(cp)
        layer = sum(_moment(p, "last layer backward").values())
        assert layer < est[cp].peak_allocated_bytes
        assert layer > sum(_moment(_titan8b(1), "last layer backward").values())


def test_h100_96gb_total_is_below_96_gib():
    # the driver keeps part of the HBM: GH200 96GB / H20 96GB report 97871 MiB of 98304
    g = load_gpu("h100-sxm-96gb")
    assert g.memory_bytes == 97871 * 2**20
    assert g.usable_bytes < 96 * GIB
