"""MoE expert capacity (``--moe-capacity-factor``, ``--moe-pad-to-capacity``): the busiest rank's
tokens capped at the capacity (dropped beyond it, GShard §2.2) or padded to it, in the expert GEMMs,
the all-to-all and the experts' saved activations; and how Megatron and Megatron-DeepSpeed state it."""

from __future__ import annotations

import pytest

from trainledger.errors import TrainledgerError
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.compute import layer_kinds, step_flops
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import import_configs
from trainledger.spec.recipe import Recipe

MIX = dict(model="mixtral-8x7b", gpus=16, ep=8, framework="megatron-core", seq_len=4096)


def test_expert_load_is_capped_or_padded():
    assert Recipe().expert_load(1.3) == 1.3                                   # dropless
    assert Recipe(moe_capacity_factor=1.25).expert_load(1.1) == 1.1           # under capacity
    assert Recipe(moe_capacity_factor=1.25).expert_load(1.4) == 1.25          # the rest dropped
    assert Recipe(moe_capacity_factor=1.25, moe_pad_to_capacity=True).expert_load(1.1) == 1.25
    assert Recipe(moe_capacity_factor=0.5).expert_rows == 0.5                 # below the mean
    assert Recipe(moe_capacity_factor=2.0).expert_rows == 1.0
    assert Recipe(moe_capacity_factor=2.0, moe_pad_to_capacity=True).expert_rows == 2.0


def test_padding_needs_a_capacity():
    with pytest.raises(TrainledgerError, match="--moe-capacity-factor") as e:
        build_plan(PlanInputs(**MIX, moe_pad_to_capacity=True))
    assert e.value.field == "moe_pad_to_capacity"


def test_padding_scales_the_expert_gemms_and_the_all_to_all():
    base = estimate_compute(build_plan(PlanInputs(**MIX)))
    pad = estimate_compute(build_plan(PlanInputs(**MIX, moe_capacity_factor=2.0, moe_pad_to_capacity=True)))
    capped = estimate_compute(build_plan(PlanInputs(**MIX, moe_capacity_factor=2.0)))
    assert pad.breakdown["compute"] > base.breakdown["compute"]
    assert capped.breakdown == base.breakdown   # the routing never reaches twice the mean here
    # the all-to-all moves the capacity, 2x the mean, where it moved the routing's statistical peak
    from trainledger.estimate.time.comm import topology
    from trainledger.estimate.time.dispatch import dispatch_s
    from trainledger.estimate.time.efficiency import link_efficiency
    from trainledger.estimate.time.work import routing_imbalance

    p = build_plan(PlanInputs(**MIX))
    tokens = p.recipe.micro_batch * p.recipe.seq_len
    peak = routing_imbalance(tokens * 8 * p.model.moe.top_k, 8)
    grp = topology(p.cluster, 1, 1, 8, 16, 1, link_efficiency()).ep
    size = tokens * p.model.hidden_size * 2.0
    one = [dispatch_s(grp, p.model.moe, "alltoall", size, p.cluster, imbalance=x) for x in (peak, 2.0)]
    assert pad.breakdown["comm_ep"] / base.breakdown["comm_ep"] == pytest.approx(one[1] / one[0], rel=1e-9)
    assert one[1] / one[0] > 1.5


def test_padded_experts_save_more_and_dropping_saves_less():
    base = estimate_memory(build_plan(PlanInputs(**MIX))).breakdown["activations"]
    pad = estimate_memory(build_plan(PlanInputs(**MIX, moe_capacity_factor=2.0, moe_pad_to_capacity=True)))
    drop = estimate_memory(build_plan(PlanInputs(**MIX, moe_capacity_factor=0.5)))
    assert pad.breakdown["activations"] > base > drop.breakdown["activations"]


_SCRIPT = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 1 --num-layers 4 "
           "--hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 16 --seq-length 2048 "
           "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 "
           "--bf16 --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 {extra}\n")


@pytest.mark.parametrize("extra,want", [
    ("", (None, None)),                                                        # Megatron-Core: dropless
    ("--moe-expert-capacity-factor 1.5", (1.5, False)),
    ("--moe-expert-capacity-factor 1.5 --moe-pad-expert-input-to-capacity", (1.5, True)),
    ("--deepspeed --deepspeed_config ds.json", (1.0, True)),                   # DeepSpeed-MoE's default
    ("--deepspeed --deepspeed_config ds.json --moe-train-capacity-factor 2", (2.0, True)),
    ("--deepspeed --deepspeed_config ds.json --disable-moe-token-dropping", (None, None)),
])
def test_megatron_capacity_flags(tmp_path, extra, want):
    p = tmp_path / "run.sh"
    p.write_text(_SCRIPT.format(extra=extra))
    m = import_configs([p]).merged()
    assert (m.get("moe_capacity_factor"), m.get("moe_pad_to_capacity")) == want


def test_plan_takes_the_capacity():
    from trainledger.planner import search
    from trainledger.planner.job import Job

    job = dict(model="mixtral-8x7b", method="full", framework="megatron-core", gpus=("h100-sxm",), max_gpus=64,
               tokens=1e10)
    base = search(Job(**job))
    pad = search(Job(**job, moe_capacity_factor=2.0, moe_pad_to_capacity=True))
    assert all(c.plan.recipe.moe_capacity_factor == 2.0 and c.plan.recipe.moe_pad_to_capacity for c in pad.plans)
    assert min(c.compute.step_time_s / c.plan.tokens_per_step * c.plan.cluster.world_size for c in pad.plans) > \
        min(c.compute.step_time_s / c.plan.tokens_per_step * c.plan.cluster.world_size for c in base.plans)
    with pytest.raises(TrainledgerError) as e:
        search(Job(**job, moe_pad_to_capacity=True))
    assert e.value.field == "moe_pad_to_capacity"


def test_hardware_flops_count_the_rows_the_experts_execute():
    """HFU counts what the GPUs execute: padded to capacity c, the routed-expert GEMMs run c times
    the mean rows (fwd + dgrad + wgrad); a capacity below the mean drops tokens, which run nowhere.
    Model FLOPs (MFU) keep the routed tokens' own work."""
    kw = dict(model="mixtral-8x7b", gpus=16, ep=8, zero=3, framework="fsdp2", seq_len=4096)
    base = build_plan(PlanInputs(**kw))
    f0 = step_flops(base)
    experts = sum(k.count * sum(g.flops_per_token for g in k.gemms if g.experts) for k in layer_kinds(base.model))
    # Mixtral: 32 layers x top-2 x 3 GEMMs of 4096 x 14336, 2 FLOPs per multiply-add
    assert experts == 32 * 2 * 3 * 2 * 4096 * 14336
    for c, pad, rows in ((2.0, True, 2.0), (0.5, False, 0.5), (1.5, False, 1.0)):
        f = step_flops(build_plan(PlanInputs(**kw, moe_capacity_factor=c, moe_pad_to_capacity=pad)))
        assert f.model == f0.model
        assert f.hardware - f0.hardware == pytest.approx((rows - 1) * experts * 3 * base.tokens_per_step, rel=1e-9)
