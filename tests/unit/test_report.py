"""Reports: every chart and section for several plans; the HTML carries the estimate's own numbers.

Expected figures are computed in the test by calling the estimator directly (never copied from a
report), then looked up in the rendered text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from trainledger.estimate import estimate
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.options import MemoryOptions
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.report import build_report, render
from trainledger.units import GIB, fmt_seconds

PLANS = {
    "8b-full-zero3-8xh100": PlanInputs(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, tokens=2e9),
    "7b-lora-1x4090": PlanInputs(model="qwen2.5-7b", method="lora", gpu="rtx-4090", gpus=1),
    "70b-tp4-pp2-16xh200": PlanInputs(model="llama-3.1-70b", gpu="h200", gpus=16, tp=4, pp=2, zero=1,
                                     recompute="full", micro_batch=1, grad_accum=8, tokens=1e10),
    "mixtral-ep-8xmi300x": PlanInputs(model="mixtral-8x7b", gpu="mi300x", gpus=8, ep=8, zero=1, tokens=5e8),
}
SECTIONS = ("summary", "memory", "gpus", "seq", "mb", "time", "scaling", "sheet", "risks")


@pytest.fixture(scope="module")
def reports():
    return {k: build_report(v, compare_gpus=["h100-sxm", "a100-sxm-80gb", "l40s"]) for k, v in PLANS.items()}


def _gib(b: float) -> str:
    return f"{b / GIB:,.2f} GiB"


@pytest.mark.parametrize("name", list(PLANS))
def test_html_has_every_section_chart_and_the_estimates_numbers(reports, name):
    data, inputs = reports[name], PLANS[name]
    html = render(data, "html")
    for sid in SECTIONS:
        assert f'id="{sid}"' in html, sid
    # charts: memory timeline, GPU comparison, two sweeps, step time, time/cost vs GPUs
    assert html.count("<svg") == 6
    est = estimate(build_plan(inputs)).to_dict()
    mem, comp = est["memory"], est["compute"]
    assert _gib(mem["device_total_bytes"]) in html
    assert _gib(mem["usable_bytes"]) in html
    assert ("FITS" if mem["fits"] else "DOES NOT FIT") in html
    for term, value in mem["breakdown"].items():
        if value:
            assert re.search(rf"<td>{re.escape(term)}</td><td>{re.escape(_gib(value))}</td>", html), term
    assert fmt_seconds(comp["step_time_s"]) in html
    if est.get("time", {}).get("total_s"):
        assert f"{est['time']['total_s'] / 86400:,.2f} days" in html
        usd = est["cost"]["cloud_usd"]
        if usd is None:  # no price for this GPU in the catalog
            assert "not estimated" in html
        else:
            assert (f"${usd:,.0f}" if usd >= 100 else f"${usd:,.2f}") in html
    # each candidate GPU's bar: the estimate of the same plan on that GPU
    for g in ("a100-sxm-80gb", "l40s"):
        other = estimate_memory(build_plan(inputs.model_copy(update={"gpu": g})), MemoryOptions(suggestions=False),
                                suggest=False)
        assert f"<td>{g}</td><td>{_gib(other.device_total_bytes)}</td>" in html
        assert ("fits" if other.fits else "does not fit") in html


def test_html_is_self_contained(reports):
    html = render(reports["8b-full-zero3-8xh100"], "html")
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html
    assert html.startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("fmt", ["md", "txt", "json"])
def test_other_formats_carry_the_same_figures(reports, fmt):
    inputs = PLANS["8b-full-zero3-8xh100"]
    text = render(reports["8b-full-zero3-8xh100"], fmt)
    est = estimate(build_plan(inputs)).to_dict()
    if fmt == "json":
        data = json.loads(text)
        assert data["estimate"]["memory"]["device_total_bytes"] == est["memory"]["device_total_bytes"]
        assert {"gpu_compare", "seq_sweep", "mb_sweep", "count_sweep", "sheet", "risks", "triggers"} <= set(data)
        return
    assert _gib(est["memory"]["device_total_bytes"]) in text
    assert "Procurement and acceptance sheet" in text and "Recompute the plan when" in text
    if fmt == "md":
        assert text.count("data:image/svg+xml;base64,") == 6
        assert "| term | GiB | share | source |" in text


def test_sweeps_are_monotone_and_limits_are_where_fit_ends(reports):
    data, inputs = reports["8b-full-zero3-8xh100"], PLANS["8b-full-zero3-8xh100"]
    for sw, field in ((data.seq_sweep, "seq_len"), (data.mb_sweep, "micro_batch")):
        assert inputs.model_dump()[field] in sw["values"]
        for gpu, s in sw["gpus"].items():
            ys = [y for y in s["bytes"] if y is not None]
            assert ys == sorted(ys), (field, gpu)
            for x, fits in zip(sw["values"], s["fits"]):
                upd = {"gpu": gpu, field: x} | ({"global_batch": None} if field == "micro_batch" else {})
                m = estimate_memory(build_plan(inputs.model_copy(update=upd)), MemoryOptions(suggestions=False),
                                    suggest=False)
                assert m.fits == fits, (field, gpu, x)
            if s["limit"] is not None and s["runs_out_at"] is not None:
                assert s["limit"] < s["runs_out_at"]


def test_max_fitting_finds_the_edge():
    from trainledger.planner.sweeps import max_fitting

    inputs = PlanInputs(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3)
    edge = max_fitting(inputs, "seq_len", 1 << 20, step=256)
    assert edge is not None and edge % 256 == 0

    def fits(s):
        return estimate_memory(build_plan(inputs.model_copy(update={"seq_len": s})),
                               MemoryOptions(suggestions=False), suggest=False).fits

    assert fits(edge) and not fits(edge + 256)


def test_pareto_front_by_hand():
    from trainledger.planner.sweeps import pareto_front

    pts = [{"total_s": 10, "cost_usd": 5, "fits": True},   # front
           {"total_s": 5, "cost_usd": 10, "fits": True},   # front
           {"total_s": 10, "cost_usd": 10, "fits": True},  # dominated by both
           {"total_s": 1, "cost_usd": 1, "fits": False},   # does not fit: never on the front
           {"total_s": 7, "cost_usd": None, "fits": True}]  # no cost: not comparable
    assert pareto_front(pts) == [True, True, False, False, False]


def test_gpu_count_curve_matches_direct_estimates(reports):
    inputs = PLANS["8b-full-zero3-8xh100"]
    cs = reports["8b-full-zero3-8xh100"].count_sweep
    assert not cs["tokens_assumed"] and cs["tokens"] == inputs.tokens
    for p in cs["points"]:
        if p.get("error"):
            continue
        n = p["gpus"]
        est = estimate(build_plan(inputs.model_copy(update={"gpus": n, "dp": None, "gpus_per_node": min(n, 8)}))).to_dict()
        assert p["fits"] == est["memory"]["fits"]
        assert p["total_s"] == pytest.approx(est["time"]["total_s"])
    front = [p for p in cs["points"] if p.get("pareto")]
    assert front, "some point must be on the front"
    for a in front:
        assert a["fits"]
        assert not any(b["fits"] and b["total_s"] <= a["total_s"] and b["cost_usd"] <= a["cost_usd"]
                       and (b["total_s"], b["cost_usd"]) != (a["total_s"], a["cost_usd"]) for b in cs["points"])


def test_without_token_budget_the_curve_says_it_assumed_one(reports):
    cs = reports["7b-lora-1x4090"].count_sweep
    assert cs["tokens_assumed"]
    html = render(reports["7b-lora-1x4090"], "html")
    assert "assumed: no token budget given" in html
    # a GPU without a catalog price: the curve trades days against GPU-hours instead of dollars
    priced = estimate(build_plan(PLANS["7b-lora-1x4090"].model_copy(update={"tokens": 1e9}))).to_dict()
    assert cs["cost_key"] == ("cost_usd" if priced["cost"]["cloud_usd"] is not None else "gpu_hours")
    if cs["cost_key"] == "gpu_hours":
        assert "Time and GPU-hours vs GPU count" in html and "No catalog price for this GPU" in html
        assert not any(p["pareto"] for p in cs["points"] if not p.get("fits"))
        assert any(p["pareto"] for p in cs["points"]) == any(p.get("fits") for p in cs["points"])


def test_acceptance_sheet_topology_and_thresholds(reports):
    sheet = reports["8b-full-zero3-8xh100"].sheet
    hw = {r["item"]: r for r in sheet["hardware"]}
    # H100 SXM: 18 NVLink 4 links per GPU (NVIDIA H100 datasheet), all pairs through NVSwitch
    assert "NV18 between every GPU pair" in hw["GPU-to-GPU link"]["check"]
    checks = {c["command"].split()[2]: c for c in sheet["checks"]}
    # catalog/networks/nvlink4.yaml: 450 GB/s per direction; interconnect.yaml: nvlink 0.80 of it
    assert "busbw >= 360 GB/s" in checks["comm"]["pass"]
    assert "--nproc 8" in checks["comm"]["command"]
    peak = estimate(build_plan(PLANS["8b-full-zero3-8xh100"])).to_dict()["memory"]["peak_allocated_bytes"]
    assert f"{peak * 0.95 / GIB:.2f} GiB .. {peak * 1.05 / GIB:.2f} GiB" in checks["memory"]["pass"]
    assert "> 0.85" in checks["scaling"]["pass"]
    a100 = build_report(PLANS["8b-full-zero3-8xh100"].model_copy(update={"gpu": "a100-sxm-80gb"}), sweeps_on=False)
    assert "NV12 between every GPU pair" in {r["item"]: r for r in a100.sheet["hardware"]}["GPU-to-GPU link"]["check"]
    pcie = build_report(PlanInputs(model="llama-3.2-1b", gpu="l40s", gpus=4), sweeps_on=False)
    assert "PIX or PXB" in {r["item"]: r for r in pcie.sheet["hardware"]}["GPU-to-GPU link"]["check"]
    assert "CUDA >= 11.8" in {r["item"]: r for r in pcie.sheet["hardware"]}["driver / CUDA"]["value"]


def test_plan_flags_reproduce_the_inputs():
    import click
    from click.testing import CliRunner

    from trainledger.cli.options import inputs_from_options, plan_options
    from trainledger.report.sheet import plan_flags

    seen = {}

    @click.command()
    @plan_options
    def cmd(**kw):
        seen["inputs"] = inputs_from_options(kw)

    for inputs in PLANS.values():
        res = CliRunner().invoke(cmd, plan_flags(inputs).split())
        assert res.exit_code == 0, res.output
        assert seen["inputs"] == inputs


def test_risks_follow_the_estimate(reports):
    for name, data in reports.items():
        est = estimate(build_plan(PLANS[name])).to_dict()
        m = est["memory"]
        left = 1 - m["device_total_bytes"] / m["usable_bytes"]
        risk = {r["name"]: r for r in data.risks}
        want = "fail" if not m["fits"] else "warn" if left < 0.15 else "ok"
        assert risk["memory headroom"]["level"] == want, name
        assert risk["data starvation"]["level"] == ("fail" if est["io"]["starved"] else "ok")
        conds = " ".join(t["condition"] for t in data.triggers)
        assert "longer context" in conds and "larger micro-batch" in conds
    lora = {t["condition"]: t["effect"] for t in reports["7b-lora-1x4090"].triggers}
    full = estimate_memory(build_plan(PLANS["7b-lora-1x4090"].model_copy(update={"method": "full"})),
                           MemoryOptions(suggestions=False), suggest=False)
    assert f"needs {_gib(full.device_total_bytes).replace(',', '')}" in lora["lora -> full fine-tune"].replace(",", "")


def test_plan_and_verify_results_are_rendered(tmp_path):
    from trainledger.report import inputs_from_plan_result
    from trainledger.planner.search import Job, search

    res = search(Job(model="llama-3.2-1b", tokens=1e9, deadline_days=2, gpus=("h100-sxm", "l40s"),
                     max_gpus=16, top=3)).to_dict()
    res = json.loads(json.dumps(res))
    inputs = inputs_from_plan_result(res, 0)
    top = res["plans"][0]
    plan = build_plan(inputs)
    assert (plan.cluster.gpu.name, plan.cluster.world_size) == (top["gpu"], top["gpus"])
    assert plan.layout.dp_size == top["layout"]["dp"] and plan.recipe.micro_batch == top["layout"]["micro_batch"]
    pred = estimate(plan).to_dict()["memory"]
    cats = {"weights": 0, "gradients": 0, "optimizer_states": 0, "activations": 0, "logits": 0, "other": 0}
    from trainledger.verify.compare import predicted_by_category

    by_cat = predicted_by_category(pred["breakdown"])
    measured = {"device": "cuda", "peak_allocated_bytes": int(pred["peak_allocated_bytes"] * 1.02),
                "categories_at_peak": {k: int(by_cat.get(k, 0) * 1.02) for k in cats}, "phase_peaks": {}}
    data = build_report(inputs, plan_result=res, verify_result={"measured": measured, "predicted": pred},
                        sweeps_on=False)
    assert data.verify["within_tolerance"] and data.verify["peak_relative_error"] == pytest.approx(-0.02 / 1.02)
    html = render(data, "html")
    assert 'id="plans"' in html and 'id="verify"' in html
    assert html.count("<svg") == 4  # timeline, step time, ranked plans, measured vs predicted
    for r in res["rejected"]:
        assert r["reason"].replace("'", "&#x27;") in html
    measured["peak_allocated_bytes"] = int(pred["peak_allocated_bytes"] * 1.2)
    data = build_report(inputs, verify_result={"measured": measured, "predicted": pred}, sweeps_on=False)
    assert not data.verify["within_tolerance"] and "OUTSIDE" in render(data, "html")


def test_write_atomic_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    import os

    from trainledger.report import write_atomic

    target = tmp_path / "r.html"
    write_atomic(target, "first")
    assert target.read_text() == "first" and oct(target.stat().st_mode & 0o777) == "0o644"

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    from trainledger.errors import TrainledgerError

    with pytest.raises((OSError, TrainledgerError)):  # a full disk may be reported as one clear line
        write_atomic(target, "second")
    assert target.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_report_modules_do_not_import_torch_or_fastapi():
    code = ("import sys, trainledger.report, trainledger.planner.sweeps, trainledger.report.sheet; "
            "print(sorted(m for m in ('torch', 'fastapi', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_report_from_a_real_cpu_measurement():
    """The verify section on a real `measure_memory` result (tiny model, CPU, exact tensor accounting)."""
    pytest.importorskip("torch")
    from trainledger.verify.measure import measure_memory

    inputs = PlanInputs(model="tiny-llama-debug", seq_len=128)
    plan = build_plan(inputs)
    measured = measure_memory(plan, device="cpu").to_dict()
    predicted = estimate(plan).to_dict()["memory"]
    data = build_report(inputs, verify_result={"measured": measured, "predicted": predicted}, sweeps_on=False)
    err = (predicted["peak_allocated_bytes"] - measured["peak_allocated_bytes"]) / measured["peak_allocated_bytes"]
    assert data.verify["peak_relative_error"] == pytest.approx(err)
    assert data.verify["within_tolerance"] == (abs(err) <= 0.05)
    text = render(data, "txt")
    from trainledger.units import fmt_bytes

    assert f"peak allocated          {fmt_bytes(measured['peak_allocated_bytes'])}" in text
    assert render(data, "html").count("<svg") == 3  # timeline, step time, measured vs predicted


def test_sheet_for_multi_node_and_amd():
    from trainledger.report.sheet import acceptance_checks, procurement_sheet

    inputs = PlanInputs(model="llama-3.1-8b", gpu="h100-sxm", gpus=16, zero=3, network="ib-ndr")
    plan = build_plan(inputs)
    est = estimate(plan).to_dict()
    sheet = procurement_sheet(plan, inputs, est)
    hw = {r["item"]: r for r in sheet["hardware"]}
    assert "8 x " in hw["node network"]["value"] and "PIX/PXB" in hw["node network"]["check"]
    comm = next(c for c in acceptance_checks(plan, inputs, est) if " comm " in c["command"])
    # NDR: 400 Gbit/s = 50 GB/s per NIC, one NIC per GPU; interconnect.yaml: infiniband 0.90 -> 45 GB/s
    assert "busbw >= 45 GB/s" in comm["pass"] and "--nproc 8" in comm["command"]
    mi = PlanInputs(model="llama-3.1-8b", gpu="mi300x", gpus=8, zero=3)
    mplan = build_plan(mi)
    msheet = procurement_sheet(mplan, mi, estimate(mplan).to_dict())
    mhw = {r["item"]: r for r in msheet["hardware"]}
    assert "XGMI between every GPU pair" in mhw["GPU-to-GPU link"]["check"]
    assert mhw["driver / CUDA"]["value"] == "ROCm >= 6.0"
