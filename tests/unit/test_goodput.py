"""The goodput section of the estimate, its flags and text, the planner's deadline bound, and the
report's facility sheet and goodput rows."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.estimate import EstimateOptions, estimate
from trainledger.estimate.run.checkpoint import FAILURES_PER_GPU_HOUR
from trainledger.estimate.run.goodput import daly_interval_s, goodput, job_mtbf_s, wall_factor
from trainledger.estimate.options import CostOptions
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.planner.search import Job, search

BIG = {"model": "llama-3.1-405b", "gpus": 16384, "tp": 8, "pp": 16, "seq_len": 8192, "global_batch": 2048,
       "tokens": 15.6e12}


@pytest.fixture(scope="module")
def big():
    return estimate(build_plan(parse_inputs(BIG, "t")))


def test_section_follows_daly_with_the_checkpoint_sections_write_time(big):
    g, ck, t = big.extra["goodput"], big.extra["checkpoint"], big.time
    assert g["write_s"] == ck["write_s"] > 0
    assert g["mtbf_s"] == pytest.approx(job_mtbf_s(FAILURES_PER_GPU_HOUR, 16384))
    assert g["interval_s"] == g["daly_interval_s"] == pytest.approx(daly_interval_s(ck["write_s"], g["mtbf_s"]))
    want = goodput(t.total_s, g["interval_s"], g["write_s"], g["restart_s"], g["mtbf_s"])
    assert g["goodput"] == pytest.approx(want.goodput) and g["wall_s"] == pytest.approx(want.wall_s)
    assert g["solve_s"] == t.total_s
    assert g["checkpoint_s"] + g["restart_total_s"] + g["lost_work_s"] == pytest.approx(g["added_s"])
    assert g["added_gpu_hours"] == pytest.approx(g["added_s"] * 16384 / 3600)
    cost = big.extra["cost"]
    assert g["added_usd"] == pytest.approx(g["added_gpu_hours"] * cost["usd_per_gpu_hour"])
    assert g["cloud_usd_with_failures"] == pytest.approx(cost["cloud_usd"] + g["added_usd"])
    assert cost["failures_usd"] == g["added_usd"] and cost["cloud_usd_with_failures"] == g["cloud_usd_with_failures"]
    assert g["restart_s"] == 600 and "Daly 2006" in g.inputs["restart_s_source"]
    assert sum(c["interruptions"] for c in g["causes"]) == pytest.approx(g["interruptions"])
    d = big.to_dict()["goodput"]
    assert d["goodput"] == g["goodput"] and d["terms"] and "Llama 3" in json.dumps(d)


def test_overrides_move_the_figures():
    plan = build_plan(parse_inputs(BIG, "t"))
    base = estimate(plan).extra["goodput"]
    worse = estimate(plan, EstimateOptions(cost=CostOptions(failures_per_gpu_hour=4 * FAILURES_PER_GPU_HOUR,
                                                            restart_s=1800))).extra["goodput"]
    assert worse["mtbf_s"] == pytest.approx(base["mtbf_s"] / 4)
    assert worse["goodput"] < base["goodput"] and worse["added_days"] > base["added_days"]
    fixed = estimate(plan, EstimateOptions(cost=CostOptions(checkpoint_interval_s=4 * 3600))).extra["goodput"]
    assert fixed["interval_s"] == 4 * 3600 and fixed.inputs["interval_s_source"].startswith("user")
    assert fixed["goodput"] < base["goodput"]  # Daly's interval is the optimum
    assert fixed["goodput_at_daly_interval"] == pytest.approx(base["goodput"])


def test_small_jobs_lose_little_and_inference_is_not_modeled():
    small = estimate(build_plan(parse_inputs({"model": "llama-3.1-8b", "gpus": 8, "zero": 3, "tokens": 1e9}, "t")))
    assert small.extra["goodput"]["goodput"] > 0.99
    inf = estimate(build_plan(parse_inputs({"model": "llama-3.1-8b", "method": "inference"}, "t")))
    assert inf.extra["goodput"]["goodput"] is None and inf.extra["goodput"].notes


def test_never_finishing_job_is_an_answer():
    plan = build_plan(parse_inputs(BIG, "t"))
    g = estimate(plan, EstimateOptions(cost=CostOptions(failures_per_gpu_hour=0.5, checkpoint_interval_s=86400))
                 ).extra["goodput"]
    assert g["goodput"] == 0.0 and "never finishes" in g.notes[0]
    assert wall_factor(plan, CostOptions(failures_per_gpu_hour=0.5, checkpoint_interval_s=86400)) == math.inf


def test_cli_text_json_and_flags():
    args = ["estimate", "--model", "llama-3.1-405b", "--gpus", "16384", "--tp", "8", "--pp", "16", "--seq-len", "8192",
            "--global-batch", "2048", "--tokens", "15.6T"]
    r = CliRunner().invoke(main, args + ["--restart-s", "120"])
    assert r.exit_code == 0, r.output
    assert "  with interruptions: " in r.output and "\ngoodput     " in r.output and "restart 2.0 min" in r.output
    r = CliRunner().invoke(main, args + ["--json", "--failures-per-gpu-hour", "1e-4"])
    d = json.loads(r.output)["goodput"]
    assert d["failures_per_gpu_hour"] == 1e-4 and d["inputs"]["failures_per_gpu_hour_source"].startswith("user")
    r = CliRunner().invoke(main, args + ["--failures-per-gpu-hour", "-1"])
    assert r.exit_code != 0 and "--failures-per-gpu-hour" in r.output and "Traceback" not in r.output


def test_planner_deadline_counts_interruptions():
    base = dict(model="llama-3.1-8b", tokens=2e9, global_batch=64, max_gpus=8, gpus=("h100-sxm",),
                gpus_per_node=(8,))
    free = search(Job(**base))
    best = min(free.plans, key=lambda c: c.total_s)
    opts = CostOptions(failures_per_gpu_hour=0.02)  # MTBF 6.25 h on 8 GPUs
    factor = wall_factor(best.plan, opts)
    assert factor > 1.05
    deadline_days = best.total_s * (1 + (factor - 1) / 3) / 86400  # met without failures, missed with them
    res = search(Job(**base, deadline_days=deadline_days, cost_options=opts))
    assert all(c.plan.cluster.world_size != best.plan.cluster.world_size or c.wall_s(opts) <= deadline_days * 86400
               for c in res.plans)
    assert any("with interruptions" in r.reason for r in res.rejected)
    for c in res.plans:
        d = c.to_dict()["estimate"]
        assert d["days_with_failures"] == pytest.approx(d["days"] / d["goodput"])
