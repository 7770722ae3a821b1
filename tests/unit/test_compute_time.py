"""Step-time cost model (estimate/time/): breakdown, overlap rules, overrides, time to train."""

from __future__ import annotations

import pytest

from trainledger.estimate.time.efficiency import gemm_time_s, gpu_efficiency
from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time import estimate_compute, estimate_time, scaling_curve
from trainledger.load.plan import PlanInputs, build_plan


def plan(**kw):
    base = dict(model="llama-3.1-8b", gpus=8, seq_len=2048, zero=1)
    base.update(kw)
    return build_plan(PlanInputs(**base))


def test_breakdown_sums_to_step_time_and_outputs_are_consistent():
    p = plan(global_batch=64)
    c = estimate_compute(p)
    assert sum(c.breakdown.values()) == pytest.approx(c.step_time_s)
    assert c.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_step / c.step_time_s / 8)
    assert c.mfu == pytest.approx(c.flops.model / (c.step_time_s * 8 * 989.5e12))
    assert 0.2 < c.mfu < 0.8
    d = c.to_dict()
    for key in ("model_flops_per_step", "step_time_s", "tokens_per_s_per_gpu", "mfu", "breakdown"):
        assert key in d


def test_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    p = plan(gpus=8, pp=4, dp=2, global_batch=16, micro_batch=1)  # m = 8 micro-batches
    c = estimate_compute(p)
    per_mb = c.breakdown["bubble"] / 3  # (p-1) micro-batch times
    m = p.recipe.grad_accum
    rest = sum(v for k, v in c.breakdown.items() if k not in
               ("bubble", "comm_dp", "optimizer", "data", "overlap_contention"))
    assert rest == pytest.approx(m * per_mb)
    assert c.breakdown["bubble"] / (rest + c.breakdown["bubble"]) == pytest.approx(3 / (m + 3))


def test_interleaving_shrinks_the_bubble():
    one = estimate_compute(plan(pp=4, dp=2, global_batch=16))
    two = estimate_compute(plan(pp=4, dp=2, vp=2, global_batch=16))
    assert two.breakdown["bubble"] == pytest.approx(one.breakdown["bubble"] / 2, rel=0.05)


def test_interleaving_fewer_micro_batches_than_stages():
    """m < p: the micro-batches never meet on a stage, so the step is the chain of p·v chunks plus
    m-1 chunk-steps; the bubble is (p-m)·t + (m-1)·t/v, which at m = 1 is (p-1)·t whatever v is.
    (The (p-1)/v rule applied here made a one-micro-batch pipeline look 8x less idle at v = 8.)"""
    def bubble_per_mb(vp, gb):  # in micro-batch compute times (t also holds ~1% of TP/PP comm)
        c = estimate_compute(plan(gpus=16, pp=4, dp=4, vp=vp, global_batch=gb, micro_batch=1))
        return c.breakdown["bubble"] / (c.breakdown["compute"] / (gb // 4))
    assert bubble_per_mb(1, 4) == pytest.approx(3, rel=0.01)
    assert bubble_per_mb(4, 4) == pytest.approx(3, rel=0.01)  # m = 1: interleaving gains nothing
    assert bubble_per_mb(4, 8) == pytest.approx(2 + 1 / 4, rel=0.01)  # m = 2: (4-2) + (2-1)/4
    assert bubble_per_mb(4, 16) == pytest.approx(3 / 4, rel=0.01)  # m = p = 4: (p-1)/v


def test_tp_over_pcie_costs_more_than_over_nvlink():
    nv = estimate_compute(plan(gpu="h100-sxm", tp=8))
    pcie = estimate_compute(plan(gpu="h100-pcie", tp=8))
    assert pcie.breakdown["comm_tp"] > 5 * nv.breakdown["comm_tp"]


def test_tp_comm_overlap_hides_part_of_tp_traffic():
    p = plan(tp=8)
    exposed = estimate_compute(p)
    hidden = estimate_compute(p, TimeOptions(tp_comm_overlap=True))
    assert hidden.breakdown["comm_tp"] < 0.5 * exposed.breakdown["comm_tp"]
    assert hidden.hidden_comm["tp"] > 0


def test_dp_gradient_sync_overlaps_with_backward_unless_disabled():
    p = plan(gpus=64, global_batch=64, zero=0)
    on = estimate_compute(p)
    off = estimate_compute(p, TimeOptions(overlap_grad_reduce=False))
    assert off.breakdown["comm_dp"] > on.breakdown["comm_dp"]
    assert on.hidden_comm.get("dp", 0) > 0


def test_zero3_adds_per_micro_batch_gathers_over_a_slow_network():
    fast = estimate_compute(plan(gpus=32, zero=3, global_batch=32))
    slow = estimate_compute(plan(gpus=32, zero=3, global_batch=32, network="eth-25"))
    assert slow.step_time_s > fast.step_time_s
    assert slow.breakdown["comm_dp"] > fast.breakdown["comm_dp"]


def test_recompute_costs_time_and_raises_hfu_over_mfu():
    none = estimate_compute(plan(attention="flash"))
    full = estimate_compute(plan(attention="flash", recompute="full"))
    assert full.step_time_s > 1.15 * none.step_time_s
    assert full.hfu > full.mfu


def test_fp8_is_faster_than_bf16_on_hopper_only():
    h_bf16 = estimate_compute(plan(gpu="h100-sxm"))
    h_fp8 = estimate_compute(plan(gpu="h100-sxm", precision="fp8-mixed"))
    assert h_fp8.step_time_s < 0.85 * h_bf16.step_time_s
    from trainledger.errors import PlanError

    with pytest.raises(PlanError, match="no fp8 tensor cores"):  # A100: refused, not run at bf16 speed
        plan(gpu="a100-sxm-80gb", precision="fp8-mixed")


def test_mfu_override_sets_step_time():
    p = plan()
    c = estimate_compute(p, TimeOptions(mfu=0.4))
    assert c.mfu == pytest.approx(0.4)
    assert sum(c.breakdown.values()) == pytest.approx(c.step_time_s)


def test_matmul_efficiency_override_changes_gemm_time():
    p = plan()
    lo = estimate_compute(p, TimeOptions(matmul_efficiency=0.3))
    hi = estimate_compute(p, TimeOptions(matmul_efficiency=0.9))
    assert lo.compute_parts["matmul"] > 2.5 * hi.compute_parts["matmul"]


def test_gemm_shape_penalty_and_memory_roofline():
    eff = gpu_efficiency("Hopper")
    peak, hbm = 989.5e12, 3.35e12
    big = gemm_time_s(8192, 8192, 8192, peak, hbm, eff, 0.8, 2)
    small = gemm_time_s(8192, 512, 512, peak, hbm, eff, 0.8, 2)
    rate_big = 2 * 8192**3 / big
    rate_small = 2 * 8192 * 512 * 512 / small
    assert rate_small < 0.7 * rate_big  # thin GEMMs run further from peak
    lora = gemm_time_s(8192, 4096, 16, peak, hbm, eff, 0.8, 2)
    roofline = 2 * (8192 * 4096 + 4096 * 16 + 8192 * 16) / (hbm * eff.hbm)
    assert roofline <= lora < 1.05 * roofline  # a rank-16 LoRA GEMM streams memory


def test_time_to_train_and_gpu_hours():
    p = plan(tokens=1e9, global_batch=64)
    c = estimate_compute(p)
    t = estimate_time(p, c)
    assert t.steps == -(-1_000_000_000 // p.tokens_per_step)
    assert t.total_s == pytest.approx(t.steps * c.step_time_s)
    assert t.gpu_hours == pytest.approx(t.total_s * 8 / 3600)
    assert estimate_time(plan(), c) is None


def test_scaling_curve_efficiency_falls_with_more_gpus():
    rows = scaling_curve(plan(gpus=16, global_batch=64))
    assert rows[0]["scaling_efficiency"] == 1.0
    assert [r["gpus"] for r in rows] == sorted(r["gpus"] for r in rows)
    assert rows[-1]["scaling_efficiency"] < 1.0


def test_unknown_architecture_falls_back_to_default_family():
    assert gpu_efficiency("Something New").family == "default"
    assert gpu_efficiency("CDNA 3").family == "cdna"
    assert gpu_efficiency("Ampere (GA100)").family == "ampere"


def test_every_efficiency_file_is_complete_and_every_catalog_gpu_has_a_family():
    from trainledger.load.catalog import all_gpus
    from trainledger.estimate.time.efficiency import _families, link_efficiency

    fams = _families()
    assert {f for f, _, _ in fams} >= {"ampere", "hopper", "blackwell", "default"}
    for _, eff, _ in fams:
        assert all(0 < v <= 1 for v in eff.matmul.values())
        assert 0 < eff.attention <= 1 and 0 < eff.hbm <= 1 and eff.half_dim > 0
    links = link_efficiency()
    assert all(0 < v <= 1 for v in links.bandwidth.values())
    for g in all_gpus():
        fam = gpu_efficiency(g.architecture).family
        assert fam != "default" or "gaudi" in g.architecture.lower(), g.name


def test_text_rendering_shows_every_breakdown_part():
    from trainledger.cli.time_render import compute_lines, time_lines

    p = plan(tokens=1e9, global_batch=64, pp=2, dp=4)
    c = estimate_compute(p)
    lines = "\n".join(compute_lines(c.to_dict()))
    for part in c.breakdown:
        assert part in lines
    assert "MFU" in lines and "HFU" in lines and "6·N·T" in lines
    t = estimate_time(p, c, scaling_curve(p))
    text = "\n".join(time_lines(t.to_dict()))
    assert "GPU-hours" in text and "efficiency" in text


def test_cli_estimate_json_has_compute_and_time_sections_and_takes_time_flags():
    import json

    from click.testing import CliRunner

    from trainledger.cli import main

    args = ["estimate", "--model", "llama-3.1-8b", "--gpus", "8", "--zero", "3",
            "--global-batch", "32", "--tokens", "1B", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("model_flops_per_step", "step_time_s", "tokens_per_s_per_gpu", "mfu", "breakdown"):
        assert key in d["compute"]
    assert d["time"]["total_s"] > 0 and d["time"]["gpu_hours"] > 0
    forced = json.loads(CliRunner().invoke(main, args + ["--mfu", "0.3"]).output)
    assert forced["compute"]["mfu"] == pytest.approx(0.3)
    fused = json.loads(CliRunner().invoke(main, args + ["--runtime", "megatron"]).output)
    assert fused["compute"]["step_time_s"] < d["compute"]["step_time_s"]


def test_a_pipeline_with_fewer_micro_batches_than_stages_is_flagged():
    # 1F1B with m micro-batches on p stages idles (p-1)/(m+p-1) of the step (Narayanan et al. 2021)
    few = estimate_compute(plan(model="llama-3.1-70b", gpus=16, tp=4, pp=4, grad_accum=2))
    note = [n for n in few.notes if n.startswith("pipeline never fills")]
    assert len(note) == 1 and "2 micro-batches per step for 4 stages" in note[0]
    assert "--grad-accum 16" in note[0]
    assert few.bubble_fraction == pytest.approx(3 / 5, rel=0.1)  # (p-1)/(m+p-1), comm aside
    assert f"{100 * few.bubble_fraction:.0f}%" in note[0]
    full = estimate_compute(plan(model="llama-3.1-70b", gpus=16, tp=4, pp=4, grad_accum=4))
    assert not any(n.startswith("pipeline never fills") for n in full.notes)
