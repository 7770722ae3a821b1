"""MoE communication overlap as plan fields: the shared experts under the dispatch
(``--moe-shared-expert-overlap``: Megatron-Core's flag, NeMo AutoModel's MoE block always) and one
micro-batch's dispatch under another's compute (``--ep-comm-overlap``: Megatron-Core
``--overlap-moe-expert-parallel-comm``, DeepSeek-V3's DualPipe)."""

from __future__ import annotations

import pytest

from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.step import _peak, matmul_dtype
from trainledger.estimate.time.stack import stack_profile
from trainledger.estimate.time.work import shared_expert_s
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import import_configs

#: DeepSeek-V3 (1 shared expert of width 2048 beside 8 routed of 256; 58 MoE layers of 61) at EP 64
#: over 8 nodes: the dispatch crosses the network and outlasts the shared expert's GEMMs
DSV3 = dict(model="deepseek-v3", gpus=64, ep=64, framework="megatron-core", zero=1, seq_len=4096,
            precision="bf16-mixed", moe_dispatcher="alltoall")


def _comm_ep(**kw) -> tuple[float, object]:
    plan = build_plan(PlanInputs(**{**DSV3, **kw}))
    return estimate_compute(plan).to_dict()["breakdown"]["comm_ep"], plan


def test_shared_experts_hide_their_own_gemm_time_of_the_dispatch():
    base, plan = _comm_ep()
    over, _ = _comm_ep(moe_shared_expert_overlap=True)
    prof = stack_profile("megatron-core", plan.cluster.gpu)
    dtype = matmul_dtype(plan)
    t_sh = shared_expert_s(plan, prof.eff, _peak(plan.cluster.gpu, dtype) * prof.clock_scale, dtype)
    # its three GEMMs of 7168 x 2048 per token, at no more than the dense peak and at least 30% of it
    flops = 3 * 2 * 7168 * 2048 * 4096
    assert flops / _peak(plan.cluster.gpu, dtype) < t_sh < flops / (0.3 * _peak(plan.cluster.gpu, dtype))
    # forward hides t_sh, backward its dgrad + wgrad (2 t_sh), per MoE layer: 58 of 61 layers, no recompute
    assert base - over == pytest.approx(58 * 3 * t_sh, rel=1e-9)
    assert over > 0.5 * base  # the network dispatch still dominates


def test_shared_expert_overlap_needs_shared_experts_and_a_token_dispatcher():
    mixtral = dict(model="mixtral-8x7b", gpus=16, ep=8, framework="megatron-core", zero=1, seq_len=4096)
    a = estimate_compute(build_plan(PlanInputs(**mixtral))).step_time_s
    assert estimate_compute(build_plan(PlanInputs(**mixtral, moe_shared_expert_overlap=True))).step_time_s == a
    # Megatron's all-gather dispatcher has no such overlap
    ag, _ = _comm_ep(moe_dispatcher="allgather")
    assert _comm_ep(moe_dispatcher="allgather", moe_shared_expert_overlap=True)[0] == ag


def test_ep_overlap_as_a_plan_field_equals_the_time_option():
    plan = build_plan(PlanInputs(**DSV3, grad_accum=4))
    stated = build_plan(PlanInputs(**DSV3, grad_accum=4, ep_comm_overlap=True))
    s = estimate_compute(stated)
    assert s.step_time_s == estimate_compute(plan, TimeOptions(ep_comm_overlap=True)).step_time_s
    assert s.step_time_s < estimate_compute(plan).step_time_s
    # hidden up to the micro-batches' own compute (the network dispatch at EP 64 outlasts it here)
    b = estimate_compute(plan).to_dict()["breakdown"]
    assert s.to_dict()["breakdown"]["comm_ep"] == pytest.approx(b["comm_ep"] - b["compute"], rel=1e-9)
    assert stated.runtime.summary()["ep_comm_overlap"] is True


def test_megatron_and_automodel_imports(tmp_path):
    p = tmp_path / "train.sh"
    p.write_text("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 "
                 "--vocab-size 32000 --seq-length 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --num-experts 8 "
                 "--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall "
                 "--moe-shared-expert-overlap --overlap-moe-expert-parallel-comm\n")
    m = import_configs([p]).merged()
    assert (m["moe_shared_expert_overlap"], m["ep_comm_overlap"]) == (True, True)
    p.write_text(p.read_text().replace("--moe-shared-expert-overlap --overlap-moe-expert-parallel-comm", ""))
    m = import_configs([p]).merged()
    assert "moe_shared_expert_overlap" not in m and "ep_comm_overlap" not in m
    import yaml

    q = tmp_path / "recipe.yaml"
    q.write_text(yaml.safe_dump({
        "step_scheduler": {"global_batch_size": 64, "local_batch_size": 1},
        "distributed": {"_target_": "nemo_automodel.components.distributed.fsdp2.FSDP2Manager", "ep_size": 8},
        "model": {"_target_": "nemo_automodel.components.models.deepseek_v3.model.DeepseekV3ForCausalLM.from_config",
                  "config": {"pretrained_model_name_or_path": "deepseek-ai/DeepSeek-V3"}},
        "dataset": {"seq_len": 4096}}))
    assert import_configs([q]).merged()["moe_shared_expert_overlap"] is True
