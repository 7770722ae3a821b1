"""NeMo AutoModel recipes (``--from recipe.yaml``): FSDP2 with its backend switches mapped to ours
(TE attention -> cudnn, DeepEP, meta-device loading), batch and pipeline keys, recomputation."""

from __future__ import annotations

import pytest
import yaml

from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.errors import SpecError
from trainledger.runconfig import import_configs
from trainledger.runconfig.importers.automodel import virtual_stages

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
    assert m["kernels"] == "fused"  # TE's linear and RMSNorm layers: fused kernels, priced as such
    assert any("Transformer Engine" in n for n in res.notes)
    assert any("fake_balanced_gate" in n for n in res.notes)
    assert not res.unknown_keys
    plan = build_plan(PlanInputs(**{**m, "gpus": 8}))
    assert plan.model.name == "qwen3-30b-a3b" and plan.runtime.moe_dispatcher == "deepep"
    assert plan.runtime.kernels == "fused"
    eager = build_plan(PlanInputs(**{**m, "gpus": 8, "kernels": "unfused"}))
    assert estimate_compute(plan).step_time_s < estimate_compute(eager).step_time_s


def test_pipeline_recipe_takes_the_pipeline_micro_batch(tmp_path):
    r = {**RECIPE, "distributed": {**RECIPE["distributed"], "pp_size": 4, "ep_size": 64},
         "step_scheduler": {"global_batch_size": 512, "local_batch_size": 8},
         "autopipeline": {"pp_schedule": "interleaved1f1b", "pp_microbatch_size": 1, "layers_per_stage": 2,
                          "round_virtual_stages_to_pp_multiple": "down"},
         "model": {**RECIPE["model"], "config": {"pretrained_model_name_or_path": "deepseek-ai/DeepSeek-V3"}}}
    res = _read(tmp_path, r)
    m = res.merged()
    assert (m["pp"], m["micro_batch"], m["pp_schedule"]) == (4, 1, "interleaved")
    assert build_plan(PlanInputs(model=m["model"])).model.name == "deepseek-v3"
    # AutoModel's DeepSeek-V3 benchmark recipe: 61 layers at 2 per stage = 31 virtual stages, rounded
    # down to 28 over pp 4: 7 model chunks per rank (an interleaving of 7, not 1, for the bubble)
    assert m["vp"] == 7
    r["autopipeline"] = {**r["autopipeline"], "round_virtual_stages_to_pp_multiple": None}
    with pytest.raises(SpecError, match="do not divide"):
        _read(tmp_path, r)


@pytest.mark.parametrize("layers,per,pp,rounding,want", [
    (61, 2, 4, "down", 7), (61, 2, 4, "up", 8), (32, 4, 2, None, 4), (80, None, 8, None, 2), (61, 1, 8, "down", 7)])
def test_autopipeline_virtual_stages(layers, per, pp, rounding, want):
    """ceil(layers / layers_per_stage) stages rounded to a pp multiple, per rank (hand-counted)."""
    assert virtual_stages(layers, per, pp, rounding) == want


def test_autopipeline_refuses_fewer_than_two_stages_per_rank():
    with pytest.raises(SpecError, match="at least 2"):
        virtual_stages(32, 8, 4, None)


@pytest.mark.parametrize("ac,want", [(False, "none"), ("selective", "selective")])
def test_activation_checkpointing_modes(tmp_path, ac, want):
    r = {**RECIPE, "parallelizer": {**RECIPE["parallelizer"], "activation_checkpointing": ac}}
    assert _read(tmp_path, r).merged()["recompute"] == want
