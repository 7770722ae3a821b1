"""Megatron-Bridge ConfigContainer YAML (``--from config.yaml``): the model provider, ddp, optimizer,
mixed-precision, comm-overlap, dataset and train sections laid over each other as the library applies
them, read by the Megatron-LM argument reader; what it does not model is listed."""

from __future__ import annotations

import pytest
import yaml

from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import import_configs

_BF16 = {"_call_": False, "_target_": "torch.bfloat16"}
#: the keys of Megatron-Bridge's DeepSeek-V3 H100 fp8 performance run as the library dumps them
#: (scripts/performance/dryrun_configs/deepseek/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml), trimmed to
#: those the estimate reads plus a few it lists or knows to be neutral; values as there
CONTAINER = {
    "_target_": "megatron.bridge.training.config.ConfigContainer",
    "checkpoint": {"save_interval": 2000},
    "comm_overlap": {"tp_comm_overlap": False, "overlap_moe_expert_parallel_comm": False,
                     "overlap_grad_reduce": False, "overlap_param_gather": None},
    "dataset": {"sequence_length": 4096, "num_workers": 8},
    "ddp": {"use_distributed_optimizer": True, "grad_reduce_in_fp32": False, "use_megatron_fsdp": False,
            "data_parallel_sharding_strategy": "no_shard", "overlap_param_gather": True},
    "mixed_precision": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param": False,
                        "fp8_amax_history_len": 1, "grad_reduce_in_fp32": False},
    "model": {"_target_": "megatron.bridge.models.mla_provider.MLAModelProvider",
              "hf_model_id": "deepseek-ai/DeepSeek-V3", "tensor_model_parallel_size": 2,
              "pipeline_model_parallel_size": 8, "virtual_pipeline_model_parallel_size": 4,
              "context_parallel_size": 1, "expert_model_parallel_size": 64, "expert_tensor_parallel_size": 1,
              "sequence_parallel": True, "seq_length": 4096, "num_layers": 61, "hidden_size": 7168,
              "num_moe_experts": 256, "moe_router_topk": 8, "moe_layer_freq": [0, 0, 0] + [1] * 58,
              "moe_token_dispatcher_type": "alltoall", "moe_enable_deepep": False,
              "moe_shared_expert_overlap": True, "overlap_moe_expert_parallel_comm": False,
              "cross_entropy_loss_fusion": True, "recompute_granularity": "selective",
              "recompute_modules": ["mla_up_proj", "mlp"], "pipeline_model_parallel_layout": "Et|(tt|)*30mL",
              "fp8": None, "fp8_recipe": "delayed", "tp_comm_overlap": False, "attention_dropout": 0.0,
              "hidden_dropout": 0.0, "cuda_graph_impl": "none", "tp_comm_overlap_ag": True},
    "optimizer": {"optimizer": "adam", "clip_grad": 1.0, "use_distributed_optimizer": True,
                  "exp_avg_dtype": _BF16, "exp_avg_sq_dtype": _BF16, "use_precision_aware_optimizer": True},
    "train": {"global_batch_size": 8192, "micro_batch_size": 1, "train_iters": 50},
    "logger": {"log_interval": 1},
}


def _read(tmp_path, data):
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(data))
    return import_configs([p])


def test_deepseek_v3_container(tmp_path):
    res = _read(tmp_path, CONTAINER)
    m = res.merged()
    assert "bridge" in res.formats.values()
    assert (m["framework"], m["model"], m["tp"], m["pp"], m["vp"], m["cp"], m["ep"], m["etp"], m["sp"]) == \
        ("megatron-core", "deepseek-v3", 2, 8, 4, 1, 64, 1, True)
    assert (m["seq_len"], m["micro_batch"], m["global_batch"], m["zero"], m["precision"]) == \
        (4096, 1, 8192, 1, "fp8-mixed")
    # mixed_precision wins over the model provider's own fp8 keys (applied onto it at setup)
    assert (m["reduce_dtype"], m["fused_loss"], m["recompute"], m["dropout"]) == ("bf16", True, "selective", 0.0)
    assert (m["moe_dispatcher"], m["moe_shared_expert_overlap"], m["tp_comm_overlap"]) == ("alltoall", True, False)
    assert "ep_comm_overlap" not in m and m["grad_clip"] == 1.0
    listed = " ".join(res.unknown_keys)
    assert m["optimizer_states_dtype"] == "bf16"  # the precision-aware optimizer's bf16 moments
    for what in ("pipeline_model_parallel_layout", "recompute-modules mla_up_proj mlp", "blockwise"):
        assert what in listed
    for neutral in ("sequence-length", "moe_router_topk", "moe_layer_freq", "fp8_amax_history_len", "tp_comm_overlap_ag", "num_moe_experts"):
        assert neutral not in listed
    assert any("--gpus" in n for n in res.notes)
    plan = build_plan(PlanInputs(**{**m, "gpus": 1024}))
    assert plan.model.name == "deepseek-v3" and plan.layout.dp_size == 64
    assert estimate_compute(plan).step_time_s > 0


def test_override_file_with_config_suffixes(tmp_path):
    """The examples' override files: sections named ``model_config``, ``train_config`` ..."""
    res = _read(tmp_path, {
        "model_config": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "seq_length": 8192,
                         "hf_model_id": "meta-llama/Llama-3.1-8B"},
        "train_config": {"global_batch_size": 256, "micro_batch_size": 4},
        "ddp_config": {"grad_reduce_in_fp32": True},
        "rng_config": {"seed": 42}})
    m = res.merged()
    assert (m["tp"], m["pp"], m["micro_batch"], m["global_batch"], m["seq_len"]) == (2, 2, 4, 256, 8192)
    assert "reduce_dtype" not in m  # fp32 gradient buffer: Megatron's own
    assert "tp_comm_overlap" not in m  # an override file leaves it to the recipe
    assert build_plan(PlanInputs(**{**m, "gpus": 16})).model.name == "llama-3.1-8b"


@pytest.mark.parametrize("mp,want", [({"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8"}, "mxfp8-mixed"),
                                     ({"bf16": True, "fp8": None}, "bf16-mixed"),
                                     ({"bf16": True, "fp4": "e2m1", "fp4_recipe": "nvfp4"}, "nvfp4-mixed")])
def test_mixed_precision_recipes(tmp_path, mp, want):
    data = {**CONTAINER, "mixed_precision": {**mp, "grad_reduce_in_fp32": True}}
    assert _read(tmp_path, data).merged()["precision"] == want


def test_megatron_fsdp_and_deepep(tmp_path):
    data = {**CONTAINER, "ddp": {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params",
                                 "use_distributed_optimizer": True},
            "model": {**CONTAINER["model"], "moe_token_dispatcher_type": "flex", "moe_enable_deepep": True},
            # the comm-overlap config is applied onto the model provider: it wins
            "comm_overlap": {**CONTAINER["comm_overlap"], "overlap_moe_expert_parallel_comm": True}}
    m = _read(tmp_path, data).merged()
    assert (m["zero"], m["moe_dispatcher"], m["ep_comm_overlap"]) == (3, "deepep", True)
