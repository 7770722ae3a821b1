"""`trainledger plan`: flags change the job field by field; the exit code says whether a plan fits."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trainledger.cli import main as cli
from trainledger.planner.search import EXAMPLE_JOB


def _plan(*args: str):
    return CliRunner().invoke(cli, ["plan", *args])


def test_a_display_flag_keeps_the_example_job():
    res = _plan("--top", "3", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert len(d["plans"]) == 3
    job = d["job"]
    # the job is still the built-in example: its token budget, deadline, GPU budget and batch
    assert job["tokens"] == EXAMPLE_JOB.tokens == 20e9
    assert job["deadline_days"] == EXAMPLE_JOB.deadline_days
    assert job["max_gpus"] == EXAMPLE_JOB.max_gpus == 64
    assert job["global_batch"] == 256
    assert all(p["gpus"] <= 64 for p in d["plans"])


def test_rank_by_keeps_the_example_job_and_says_what_changed():
    res = _plan("--rank-by", "time", "--top", "2")
    assert res.exit_code == 0, res.output
    assert "built-in example with --rank-by, --top" in res.output
    assert "20.00 B tokens" in res.output and "up to 64 GPUs" in res.output


def test_zero_gpu_budget_is_an_error_not_ignored():
    res = _plan("--max-gpus", "0")
    assert res.exit_code == 2
    assert "--max-gpus" in res.output  # the flag as typed


def test_no_plan_fits_exits_1():
    # 405B weights alone (810 GB in bf16) cannot fit on one 24 GB GPU whatever the layout
    res = _plan("--model", "llama-3.1-405b", "--gpu", "rtx-4090", "--max-gpus", "1")
    assert res.exit_code == 1, res.output
    assert "no plan fits" in res.output


def test_a_deadline_past_the_gpu_budget_names_the_count_that_meets_it():
    # 70B on 2T tokens in 30 days does not finish on 64 H100: the answer says how many would (under
    # Megatron-Core: the default hf stack, without pipelining, cannot spread a 256-sample batch that far)
    res = _plan("--model", "llama-3.1-70b", "--tokens", "2e12", "--deadline-days", "30", "--gpu", "h100-sxm",
                "--framework", "megatron-core")
    assert res.exit_code == 1, res.output
    row = [ln for ln in res.output.splitlines() if "the deadline needs" in ln]
    assert len(row) == 1 and "past the budget" in row[0]
    n = int(row[0].split("--max-gpus ")[1].split()[0])
    assert f"{n:,} h100-sxm" in row[0] and f"{n} (over budget)" in res.output and n > 64
    ok = _plan("--model", "llama-3.1-70b", "--tokens", "2e12", "--deadline-days", "30", "--gpu", "h100-sxm",
               "--framework", "megatron-core", "--max-gpus", str(n), "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["gpu_count"][0]["deadline_bound_gpus"] == n


def test_framework_flag_reaches_the_planned_layouts():
    res = _plan("--framework", "fsdp2", "--top", "1", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["job"]["framework"] == "fsdp2"


def test_inference_is_pointed_to_the_serving_planner():
    # plan sizes training (weights + optimizer states); a serving question goes to serve-plan
    res = _plan("--method", "inference")
    assert res.exit_code == 2
    assert "serve-plan" in res.output
