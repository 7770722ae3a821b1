"""NeMo AutoModel recipes (``--from recipe.yaml``): FSDP2 with its backend switches mapped to ours
(TE attention -> cudnn, DeepEP, meta-device loading), batch and pipeline keys, recomputation."""

from __future__ import annotations

import pytest
import yaml

from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import import_configs

#: the keys of AutoModel's MoE benchmark recipes (examples/benchmark/configs), values ours
RECIPE = {
    "step_scheduler": {"global_batch_size": 512, "local_batch_size": 4, "max_steps": 30},
    "distributed": {"_target_": "nemo_automodel.components.distributed.fsdp2.FSDP2Manager", "tp_size": 1,
                    "cp_size": 1, "pp_size": 1, "dp_replicate_size": 1, "ep_size": 8, "sequence_parallel": False},
    "parallelizer": {"_target_": "nemo_automodel.components.moe.parallelizer.parallelize_model",
                     "activation_checkpointing": True, "reshard_after_forward": False},
    "model": {"_target_": "nemo_automodel.components.models.qwen3_moe.model.Qwen3MoeForCausalLM.from_config",
              "config": {"_target_": "transformers.AutoConfig.from_pretrained",
                         "pretrained_model_name_or_path": "Qwen/Qwen3-30B-A3B"},
              "is_meta_device": True,
              "backend": {"attn": "te", "linear": "te", "rms_norm": "te", "enable_deepep": True,
                          "fake_balanced_gate": True}},
    "dataset": {"seq_len": 4096},
    "optimizer": {"_target_": "torch.optim.Adam", "lr": 1e-4},
}


def _read(tmp_path, recipe):
    p = tmp_path / "recipe.yaml"
    p.write_text(yaml.safe_dump(recipe))
    return import_configs([p])


def test_moe_benchmark_recipe(tmp_path):
    res = _read(tmp_path, RECIPE)
    m = res.merged()
    assert (m["framework"], m["zero"], m["ep"], m["micro_batch"], m["global_batch"], m["seq_len"]) == \
        ("fsdp2", 3, 8, 4, 512, 4096)
    assert (m["attention"], m["moe_dispatcher"], m["model_loading"], m["recompute"]) == \
        ("cudnn", "deepep", "sharded", "full")
    assert m["reshard_after_forward"] is False and m["optimizer"] == "adamw"
    assert any("--runtime megatron" in n for n in res.notes)
    assert any("fake_balanced_gate" in n for n in res.notes)
    assert not res.unknown_keys
    plan = build_plan(PlanInputs(**{**m, "gpus": 8}))
    assert plan.model.name == "qwen3-30b-a3b" and plan.runtime.moe_dispatcher == "deepep"
    assert estimate_compute(plan).step_time_s > 0


def test_pipeline_recipe_takes_the_pipeline_micro_batch(tmp_path):
    r = {**RECIPE, "distributed": {**RECIPE["distributed"], "pp_size": 4, "ep_size": 64},
         "step_scheduler": {"global_batch_size": 512, "local_batch_size": 8},
         "autopipeline": {"pp_schedule": "interleaved1f1b", "pp_microbatch_size": 1, "layers_per_stage": 2},
         "model": {**RECIPE["model"], "config": {"pretrained_model_name_or_path": "deepseek-ai/DeepSeek-V3"}}}
    res = _read(tmp_path, r)
    m = res.merged()
    assert (m["pp"], m["micro_batch"], m["pp_schedule"]) == (4, 1, "interleaved")
    assert build_plan(PlanInputs(model=m["model"])).model.name == "deepseek-v3"
    assert any("--vp" in n for n in res.notes)


@pytest.mark.parametrize("ac,want", [(False, "none"), ("selective", "selective")])
def test_activation_checkpointing_modes(tmp_path, ac, want):
    r = {**RECIPE, "parallelizer": {**RECIPE["parallelizer"], "activation_checkpointing": ac}}
    assert _read(tmp_path, r).merged()["recompute"] == want
