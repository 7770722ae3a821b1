"""Host RAM while the model loads (``--model-loading``): every process building the whole model on
the CPU (from_pretrained on every rank, pytorch/pytorch#105840), one copy per node (accelerate's
cpu_ram_efficient_loading), each rank's shard (ZeRO-3 zero.Init, torchtitan, Megatron), QLoRA's
device-map load; the note, the planner's rejection, and the importers and exporters."""

from __future__ import annotations

import json

import pytest

from trainledger.estimate.options import CostOptions
from trainledger.estimate.run.host import host_section, host_shortfall, model_load_bytes, model_loading
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import export_plan, import_configs


def _plan(**kw):
    return build_plan(PlanInputs(**kw))


def test_every_rank_builds_the_whole_model_in_its_weight_dtype():
    # hf full fine-tune under AMP keeps fp32 weights: 8 processes × P × 4 bytes
    p = _plan(model="llama-3.1-8b", gpus=8, method="full")
    assert model_loading(p) == "every-rank"
    assert model_load_bytes(p) == pytest.approx(8 * p.model.params.total * 4)
    # LoRA on bf16 weights: 2 bytes
    q = _plan(model="llama-3.1-8b", gpus=8, method="lora")
    assert model_load_bytes(q) == pytest.approx(8 * q.model.params.total * 2)


def test_rank0_and_sharded_and_device_map_loads():
    fsdp = _plan(model="llama-3.1-8b", gpus=16, gpus_per_node=8, framework="pytorch-fsdp", zero=3)
    assert model_loading(fsdp) == "rank0"
    assert model_load_bytes(fsdp) == pytest.approx(fsdp.model.params.total * 4)   # one copy per node
    z3 = _plan(model="llama-3.1-8b", gpus=16, gpus_per_node=8, framework="deepspeed", zero=3)
    assert model_loading(z3) == "sharded"
    # the recipe's weight dtype (fp32 under bf16-mixed), ZeRO-3 over 16 ranks: half the model per node
    assert model_load_bytes(z3) == pytest.approx(z3.model.params.total * 4 / 2)
    z2 = _plan(model="llama-3.1-8b", gpus=8, framework="deepspeed", zero=2)
    assert model_loading(z2) == "every-rank"
    mc = _plan(model="llama-3.1-8b", gpus=8, framework="megatron-core", tp=4, zero=1)
    wb = 2 if mc.recipe.policy["weights"] == "bf16" else 4
    assert model_load_bytes(mc) == pytest.approx(8 * mc.model.params.total * wb / 4)   # its TP shard each
    ql = _plan(model="llama-3.1-8b", gpus=8, method="qlora")
    assert model_loading(ql) == "to-gpu" and model_load_bytes(ql) == 0.0
    over = _plan(model="llama-3.1-8b", gpus=8, framework="pytorch-fsdp", zero=3, model_loading="every-rank")
    assert model_load_bytes(over) == pytest.approx(8 * over.model.params.total * 4)


def test_load_that_exceeds_the_node_is_a_note_and_a_planner_rejection():
    p = _plan(model="llama-3.1-70b", gpus=8, method="full")   # 8 × 70.6B × 4 B = 2.26 TB > 2 TiB
    sec = host_section(p, CostOptions())
    assert sec.values["load_fits"] is False
    assert any("host RAM at model load" in n and "--zero 3" in n for n in sec.notes)
    what, need = host_shortfall(p)
    assert "while it loads" in what and need == sec.values["model_load_bytes"]
    ok = _plan(model="llama-3.1-70b", gpus=8, framework="pytorch-fsdp", zero=3)
    assert host_section(ok, CostOptions()).values["load_fits"] is True and host_shortfall(ok) is None


def test_planner_skips_layouts_whose_model_does_not_load():
    from trainledger.planner import search
    from trainledger.planner.job import Job

    # 8B full fine-tune (fp32 weights, 32 GB) loaded on every rank, 200 GiB of host RAM: 8
    # data-parallel ranks on a node (8 × 32 GB) do not load; TP-sharded loads and 4-GPU nodes do
    job = dict(model="llama-3.1-8b", method="full", framework="hf", gpus=("h100-sxm",), max_gpus=16, tokens=1e9,
               model_loading="every-rank")
    res = search(Job(host_ram_gib=200, **job))
    assert res.plans and all(model_load_bytes(c.plan) <= 200 * 2**30 for c in res.plans)
    assert all(c.plan.runtime.model_loading == "every-rank" for c in res.plans)
    assert not any(c.plan.cluster.gpus_per_node == 8 and c.plan.layout.tp == 1 for c in res.plans)
    assert any(c.plan.cluster.gpus_per_node == 8 and c.plan.layout.tp == 1 for c in search(Job(**job)).plans)
    # 20 GiB: no layout loads; the rejection says why
    tiny = search(Job(host_ram_gib=20, **job))
    assert not tiny.plans and any("while it loads" in r.reason for r in tiny.rejected)


def test_accelerate_and_trainer_fsdp_configs(tmp_path):
    base = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 8\n"
            "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_version: 1\n")
    for extra, want in (("", "rank0"), ("  fsdp_cpu_ram_efficient_loading: false\n", "every-rank"),
                        ("  fsdp_cpu_ram_efficient_loading: true\n", "rank0")):
        f = tmp_path / "accelerate_config.yaml"
        f.write_text(base + extra)
        assert import_configs([f]).merged()["model_loading"] == want
    t = tmp_path / "args.json"
    t.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "fsdp": "full_shard auto_wrap",
                             "fsdp_config": {"version": 1}}))
    assert import_configs([t]).merged()["model_loading"] == "every-rank"   # the Trainer's default


@pytest.mark.parametrize("loading,want", [(None, True), ("every-rank", False)])
def test_accelerate_export_states_the_loading(loading, want):
    files = export_plan(PlanInputs(model="llama-3.1-8b", gpus=8, framework="pytorch-fsdp", zero=3,
                                   model_loading=loading), "accelerate")
    text = files[0].text
    assert f"fsdp_cpu_ram_efficient_loading: {str(want).lower()}" in text


def test_procurement_sheet_asks_for_the_load_when_it_is_the_larger_need():
    from trainledger.report.sheet import hardware_rows

    p = _plan(model="llama-3.1-70b", gpus=8, method="full")
    host = host_section(p, CostOptions()).values
    rows = hardware_rows(p, {"host": host})
    row = next(r for r in rows if r["item"] == "host RAM")
    assert "while the model loads" in row["value"] and "every-rank" in row["value"]
    small = _plan(model="llama-3.1-8b", gpus=8, framework="pytorch-fsdp", zero=3)
    row = next(r for r in hardware_rows(small, {"host": host_section(small, CostOptions()).values})
               if r["item"] == "host RAM")
    assert "while the model loads" not in row["value"]


def test_the_note_suggests_what_would_help():
    # one copy per node already too large (405B in fp32 on a 1 TiB node): only a sharded load helps
    p = _plan(model="llama-3.1-405b", gpus=8, framework="pytorch-fsdp", zero=3, host_ram_gib=1024)
    note = next(n for n in host_section(p, CostOptions()).notes if "at model load" in n)
    assert "(rank0)" in note and "--model-loading sharded" in note
