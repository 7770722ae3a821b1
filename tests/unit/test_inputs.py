"""One job, declared once: every PlanInputs field reaches the CLI, plan files, the web API and the Plan."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.load.plan import PlanInputs, build_plan, load_plan_file, parse_inputs
from trainledger.planner.search import Job
from trainledger.web.schemas import WEB_EXCLUDED, PlanRequest, WebInputs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("command", ["estimate", "export", "report", "verify memory"])
def test_every_field_is_a_flag_of_every_plan_command(command):
    out = CliRunner().invoke(main, [*command.split(), "--help"], terminal_width=200).output
    missing = [n for n in PlanInputs.model_fields if _flag(n) not in out]
    assert not missing, f"{command} lacks flags for {missing}"


def test_every_field_is_a_web_field_except_server_paths():
    web = set(WebInputs.model_fields)
    assert web == set(PlanInputs.model_fields) - set(WEB_EXCLUDED)
    for name in web:  # same default and help text: declared once
        assert WebInputs.model_fields[name].default == PlanInputs.model_fields[name].default, name


def test_planner_fields_share_the_declaration():
    for name in ("model", "framework", "method", "precision", "seq_len", "tokens", "lora_rank", "headroom"):
        assert Job.model_fields[name].description == PlanInputs.model_fields[name].description
        assert Job.model_fields[name].default == PlanInputs.model_fields[name].default
    # gpus: candidate names; config_json: a pasted model (the request body, not a job field)
    assert set(PlanRequest.model_fields) - {"gpus", "config_json"} <= set(Job.model_fields)


def test_every_field_is_a_plan_file_key(tmp_path):
    data = {n: f.default for n, f in PlanInputs.model_fields.items() if f.default is not None}
    data["lora_targets"] = list(data["lora_targets"])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert set(load_plan_file(path)) == set(data)


def test_dropout_grad_clip_and_runtime_reach_the_plan():
    plan = build_plan(parse_inputs({"model": "tiny-llama-debug", "dropout": 0.1, "grad_clip": 0,
                                    "framework": "fsdp2", "reshard_after_forward": False,
                                    "gradient_as_bucket_view": True, "sp": False}))
    assert plan.recipe.dropout == 0.1
    assert plan.recipe.grad_clip is None  # 0 = no clipping
    assert plan.runtime.framework == "fsdp2" and plan.runtime.reshard_after_forward is False
    assert plan.runtime.gradient_as_bucket_view is True
    assert plan.layout.sp is False


def test_cli_flags_reach_the_json():
    res = CliRunner().invoke(main, ["estimate", "-m", "tiny-llama-debug", "--gpu", "h100-sxm",
                                    "--framework", "deepspeed", "--dropout", "0.1", "--no-sp", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)["plan"]
    assert plan["framework"] == "deepspeed"
    assert plan["runtime"]["framework"] == "deepspeed"


def test_bad_framework_is_a_usage_error():
    res = CliRunner().invoke(main, ["estimate", "--framework", "jax"])
    assert res.exit_code == 2
    assert "hf" in res.output and "megatron-core" in res.output


def test_top_level_api_estimates_a_plan_inputs_or_fields():
    import trainledger
    from trainledger.estimate import estimate as estimate_plan

    plan = trainledger.build_plan(trainledger.PlanInputs(model="llama-3.2-1b", gpus=8, zero=3))
    want = estimate_plan(plan).memory.device_total_bytes
    assert trainledger.estimate(plan).memory.device_total_bytes == want
    assert trainledger.estimate(model="llama-3.2-1b", gpus=8, zero=3).memory.device_total_bytes == want
    # ZeRO-3 over 8 GPUs holds less than the unsharded job: the keywords really reached the plan
    assert trainledger.estimate(model="llama-3.2-1b").memory.device_total_bytes > want
    with pytest.raises(TypeError):
        trainledger.estimate("llama-3.2-1b")
    assert callable(trainledger.planner.search)


@pytest.mark.parametrize("fields, field", [
    ({"gpus": 8, "tp": 3}, "tp"),
    ({"gpus": 8, "dp": 3}, "dp"),
    ({"gpus": 2, "global_batch": 3}, "global_batch"),
    ({"seq_len": -1}, "seq_len"),
    ({"pp": 1000}, "pp"),
])
def test_errors_carry_the_field_they_concern(fields, field):
    from trainledger.errors import TrainledgerError

    with pytest.raises(TrainledgerError) as info:
        build_plan(parse_inputs({"model": "llama-3.2-1b", **fields}))
    assert info.value.field == field, str(info.value)


def test_web_error_names_the_field_from_the_error_not_its_words():
    from fastapi.testclient import TestClient

    from trainledger.web import create_app

    r = TestClient(create_app()).post("/api/estimate", json={"inputs": {"gpus": 8, "tp": 3}})
    assert r.status_code == 400
    assert r.json()["field"] == "tp"
