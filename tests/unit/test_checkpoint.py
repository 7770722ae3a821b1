"""Checkpoint size, shards, write time, storage and time share."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from trainledger.estimate.run.checkpoint import (
    FAILURES_PER_GPU_HOUR,
    checkpoint_bytes,
    checkpoint_section,
    checkpoint_time_share,
    moe_shard_bytes,
    shard_bytes,
    write_time_s,
    writer_nodes,
    young_interval_s,
)
from trainledger.estimate.options import CostOptions
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.units import GB, GIB


def _plan(**kw):
    base = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9, "zero": 3}
    base.update(kw)
    return build_plan(parse_inputs(base))


def test_bloom_176b_checkpoint_matches_the_reported_size():
    # BLOOM-176B (176,247M params): bf16 weights + fp32 master + fp32 Adam m, v = 14 bytes/param.
    # BigScience tr11 README: "2.3TB" with optimizer states, "329GB" for bf16 weights alone.
    n = 176_247_000_000
    full = checkpoint_bytes(n, 2, 4, 8)
    assert full == pytest.approx(2.467e12, rel=1e-3)
    assert full / 2.3e12 == pytest.approx(1.0, abs=0.08)
    assert n * 2 / GIB == pytest.approx(329, rel=0.01)


def test_shards():
    n = 8e9
    assert shard_bytes(n, 4, 8, zero=3, zero_shards=16) == pytest.approx(n * 12 / 16)
    assert shard_bytes(n, 4, 8, zero=1, zero_shards=16) == pytest.approx(n * 4 + n * 8 / 16)
    assert shard_bytes(n, 4, 8, tp=8, pp=2) == pytest.approx(n * 12 / 16)


def test_writer_nodes_and_write_time():
    assert writer_nodes(4, 8, tp=8, pp=2, zero=0) == 2
    assert writer_nodes(4, 8, tp=1, pp=1, zero=0) == 1
    assert writer_nodes(4, 8, tp=1, pp=1, zero=1) == 4
    # 846.6 GB over 2 nodes writing 3 GB/s each
    assert write_time_s(846.6e9, 2, 3e9) == pytest.approx(141.1)


def test_time_share_and_young_interval():
    assert checkpoint_time_share(141.1, 3600) == pytest.approx(141.1 / 3741.1)
    assert young_interval_s(100, 3600 * 8) == pytest.approx(math.sqrt(2 * 100 * 28_800))
    # Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs -> one every 3.09 h
    assert 1 / (FAILURES_PER_GPU_HOUR * 16_384) == pytest.approx(54 * 24 / 419)


def test_full_finetune_section_by_hand():
    plan = _plan(model="llama-3.1-70b")
    n = plan.model.params.total
    sec = checkpoint_section(plan, CostOptions(checkpoint_interval_s=1800, checkpoints_kept=2),
                             compute=SimpleNamespace(step_time_s=20.0))
    assert sec["full_bytes"] == pytest.approx(n * 12)  # bf16-mixed: fp32 weights + fp32 AdamW m, v
    assert sec["shard_bytes"] == pytest.approx(n * 12 / 16)
    assert sec["weights_export_bytes"] == pytest.approx(n * 2)
    assert sec["write_s"] == pytest.approx(n * 12 / (2 * 3.0 * GB))  # ZeRO-3: both nodes write
    assert sec["storage_bytes"] == pytest.approx(2 * n * 12 + n * 2)
    assert sec["time_share"] == pytest.approx(sec["write_s"] / (1800 + sec["write_s"]))
    steps = math.ceil(2e9 / plan.tokens_per_step)
    assert sec["checkpoints_per_run"] == math.floor(steps * 20.0 / 1800)


def test_lora_checkpoint_holds_adapters():
    # Llama 3 8B, LoRA r=16 on all linear layers: 41,943,040 trainable parameters (PEFT's
    # print_trainable_parameters for meta-llama/Meta-Llama-3-8B with these targets)
    plan = _plan(method="lora", gpus=1, zero=0)
    sec = checkpoint_section(plan, CostOptions())
    assert sec.to_dict()["inputs"]["trainable_params"] == 41_943_040
    assert sec["full_bytes"] == pytest.approx(41_943_040 * 12)
    assert sec["merged_export_bytes"] == pytest.approx(plan.model.params.total * 2)
    assert sec.notes


def test_optimizer_and_precision_change_the_size():
    n = _plan().model.params.total
    assert checkpoint_section(_plan(optimizer="sgd"), CostOptions())["full_bytes"] == pytest.approx(n * 4)
    assert checkpoint_section(_plan(precision="bf16"), CostOptions())["full_bytes"] == pytest.approx(n * 6)
    assert checkpoint_section(_plan(precision="fp8-mixed"), CostOptions())["full_bytes"] == pytest.approx(n * 14)


def test_moe_shards_split_the_experts_over_expert_parallel_ranks():
    # 100 params of which 80 routed experts; 14 bytes (bf16 weights + fp32 master + Adam m, v)
    n, e = 100.0, 80.0
    # dense 20·14/(1·2) + experts 80·14/(1·8·2)
    assert moe_shard_bytes(n, e, 2, 12, pp=2, ep=8) == pytest.approx(20 * 14 / 2 + 80 * 14 / 16)
    # ZeRO-1: the dense states shard over dp·cp (16), the experts' over the expert-dp group (2)
    assert moe_shard_bytes(n, e, 2, 12, pp=2, ep=8, zero=1, zero_shards=16, expert_dp=2) == pytest.approx(
        20 * 2 / 2 + 20 * 12 / 32 + 80 * 2 / 16 + 80 * 12 / 32)
    # expert TP multiplies the split; no experts is the dense formula
    assert moe_shard_bytes(n, e, 2, 12, tp=2, ep=4, etp=1) == pytest.approx(20 * 14 / 2 + 80 * 14 / 4)
    assert moe_shard_bytes(n, 0, 2, 12, tp=2, pp=2) == pytest.approx(shard_bytes(n, 2, 12, tp=2, pp=2))
    # one replica of a tp1·pp16 model with its experts over 64 ranks spans 16·64 GPUs = 128 nodes
    assert writer_nodes(256, 8, tp=1, pp=16, zero=0, ep_ranks=64) == 128
    assert writer_nodes(256, 8, tp=1, pp=16, zero=0) == 2


@pytest.mark.parametrize("method", ["full", "pretrain"])
def test_deepseek_v3_expert_parallel_checkpoint_by_hand(method):
    # DeepSeek-V3 on 2048 H800 (DeepSeek-V3 report §3.2: PP16, EP64); without ZeRO one replica of
    # 16·64 ranks = 128 nodes holds the checkpoint: before the fix each of 2 "replica" nodes staged
    # half of 8.5 TiB in host RAM (DOES NOT FIT) and each rank a 1/16 shard (547 GiB)
    plan = build_plan(parse_inputs({"model": "deepseek-v3", "gpu": "h800", "gpus": 2048, "tp": 1, "pp": 16,
                                    "ep": 64, "precision": "fp8-mixed", "framework": "megatron-core",
                                    "method": method}))
    pc = plan.model.params
    n, e = pc.total, pc.breakdown["experts"]
    sec = checkpoint_section(plan, CostOptions())
    assert sec["full_bytes"] == pytest.approx(n * 14)
    assert sec["shard_bytes"] == pytest.approx((n - e) * 14 / 16 + e * 14 / (64 * 16))
    assert sec["shards"] == 16 * 64
    assert sec["bytes_per_writer_node"] == pytest.approx(n * 14 / 128)
