"""Stack profiles, power limit, GPU variants and intervals of the time model (issue 15)."""

from __future__ import annotations

import pytest

from trainledger.load.catalog import load_gpu, load_network
from trainledger.estimate.time.efficiency import for_gpu
from trainledger.estimate.time.intervals import rate_interval, time_interval
from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time.stack import DVFS_EXPONENT, clock_scale, stack_profile
from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.runtime import FRAMEWORKS


def _plan(**kw):
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, seq_len=4096)
    base.update(kw)
    return build_plan(PlanInputs(**base))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm-80gb", "b200", "mi300x"])
def test_every_stack_has_a_profile_capped_by_best_shape(framework, gpu):
    # the cap is the family's measured best-shape rate; Blackwell and CDNA have none (their files
    # extrapolate from Hopper), so no stack may claim more than the family's own rate there
    g = load_gpu(gpu)
    prof = stack_profile(framework, g)
    fam = for_gpu(g)
    cap = fam.matmul_best or fam.matmul
    assert (gpu in ("b200", "mi300x")) == (not fam.matmul_best)
    for dt, eta in prof.eff.matmul.items():
        assert 0 < eta <= cap[dt]
    assert prof.kernels in ("hf", "megatron")


def test_hopper_bf16_ceiling_is_the_measured_best_shape_rate():
    g = load_gpu("h100-sxm")
    fam = for_gpu(g)
    assert fam.matmul_best["bf16"] < 0.82  # cuBLAS best shape ~780 of 989.5 TFLOP/s
    assert stack_profile("megatron-core", g).eff.matmul["bf16"] == fam.matmul_best["bf16"]
    assert stack_profile("fsdp2", g).eff.matmul["fp8"] < stack_profile("megatron-core", g).eff.matmul["fp8"]


def test_stacks_differ_in_time_for_the_same_plan():
    t = {fw: estimate_compute(_plan(framework=fw)).step_time_s for fw in ("hf", "fsdp2", "megatron-core")}
    assert t["megatron-core"] < min(t["fsdp2"], t["hf"])  # fused kernels, TE GEMMs, FA3-class attention
    assert t["fsdp2"] != t["hf"]  # FSDP2 copy-in/out vs the Trainer's host cost


def test_overrides_win_over_the_profile():
    p = _plan(framework="fsdp2", tp=2)
    base = estimate_compute(p)
    fused = estimate_compute(p, TimeOptions(runtime="megatron"))
    overlap = estimate_compute(p, TimeOptions(tp_comm_overlap=True))
    assert fused.step_time_s < base.step_time_s
    assert overlap.breakdown.get("comm_tp", 0) < base.breakdown["comm_tp"]
    assert "runtime" in fused.to_dict()["stack_profile"]["overrides"]
    mc = _plan(framework="megatron-core", tp=2)
    assert estimate_compute(mc, TimeOptions(tp_comm_overlap=False)).breakdown["comm_tp"] > \
        estimate_compute(mc).breakdown["comm_tp"]


def test_power_limit_follows_the_dvfs_cube_law():
    g = load_gpu("h100-sxm")
    assert clock_scale(g) == 1.0
    lim = g.model_copy(update={"power_limit_w": 500.0})
    idle = 0.2 * g.tdp_w
    assert clock_scale(lim) == pytest.approx(((500 - idle) / (g.tdp_w - idle)) ** DVFS_EXPONENT)
    slow = estimate_compute(_plan(power_limit_w=500)).step_time_s
    fast = estimate_compute(_plan()).step_time_s
    assert 1.05 < slow / fast < 1 / clock_scale(lim) + 1e-9  # memory-bound parts do not slow down


@pytest.mark.parametrize("name,bf16,link", [("h800", 989.5, 200), ("h20", 148, 450),
                                            ("h100-sxm-96gb", 989.5, 450), ("b300", 2250, 900),
                                            ("gb300", 2500, 900)])
def test_gpu_variants(name, bf16, link):
    g = load_gpu(name)
    assert g.bf16_tflops == bf16 and g.link_gb_per_s == link and g.source


def test_nvl72_domain_network():
    n = load_network("nvlink5-nvl72")
    assert n.kind == "nvlink" and n.gb_per_s == 900


def test_fsdp_with_expert_parallelism_gathers_only_its_experts():
    p1 = build_plan(PlanInputs(model="qwen3-30b-a3b", gpu="h100-sxm", gpus=16, zero=3, ep=1, seq_len=4096))
    p8 = build_plan(PlanInputs(model="qwen3-30b-a3b", gpu="h100-sxm", gpus=16, zero=3, ep=8, seq_len=4096))
    c1, c8 = estimate_compute(p1), estimate_compute(p8)
    dp1 = c1.breakdown.get("comm_dp", 0) + c1.hidden_comm.get("dp", 0)
    dp8 = c8.breakdown.get("comm_dp", 0) + c8.hidden_comm.get("dp", 0)
    assert dp8 < dp1 / 3


def test_every_time_figure_has_an_interval():
    d = estimate_compute(_plan(framework="fsdp2")).to_dict()
    iv = d["step_time_interval_s"]
    assert iv["p10"] < d["step_time_s"] < iv["p90"] or iv["p10"] <= d["step_time_s"] <= iv["p90"]
    assert "fsdp2/hopper" in iv["basis"]
    assert d["mfu_interval"]["p10"] <= d["mfu"] <= d["mfu_interval"]["p90"]
    lo, hi, basis = rate_interval("deepspeed", "cdna")
    assert lo < 0 < hi and "pooled" in basis


def test_interval_median_is_the_stored_residual_median():
    import yaml

    from trainledger.estimate.time import intervals

    table = yaml.safe_load(intervals._path().read_text(encoding="utf-8"))
    fsdp2 = table["stacks"]["fsdp2/hopper"]
    iv = time_interval(2.0, "fsdp2", "hopper", gpus=8)
    assert iv["factor_p50"] == pytest.approx(1 + fsdp2["median"])
    assert iv["p50"] == pytest.approx(2.0 * (1 + fsdp2["median"]))
    assert iv["factor_p10"] <= iv["factor_p50"] <= iv["factor_p90"]
    # an unseen stack/family: the pooled median, widened as the interval is
    pooled = table["pooled"]
    unseen = time_interval(1.0, "deepspeed", "cdna")
    assert unseen["factor_p50"] == pytest.approx(1 + pooled["median"] * intervals.UNSEEN_WIDENING)
    cal = table["calibrated"]["fsdp2/hopper"]
    assert time_interval(1.0, "fsdp2", "hopper", calibrated=True)["factor_p50"] == pytest.approx(1 + cal["median"])
    # a table row without a median (an older file) reads the middle of its interval
    assert intervals._row({"p10": -0.1, "p90": 0.3}) == (-0.1, pytest.approx(0.1), 0.3)


def test_one_gpu_measurements_bound_one_gpu_plans_only():
    # hf/hopper's suite rows are single-GPU steps (bench/results/time_cuda_h200.json): they hold no
    # communication, so a multi-GPU hf plan keeps the widened pooled interval
    one = rate_interval("hf", "hopper", gpus=1)
    many = rate_interval("hf", "hopper", gpus=8)
    assert "accuracy suite residuals, hf/hopper" in one[2]
    assert "measured on one GPU only" in many[2] and "pooled" in many[2]
    assert many[1] - many[0] > one[1] - one[0]
    # a stack measured at scale keeps its own residuals at any GPU count
    assert "fsdp2/hopper" in rate_interval("fsdp2", "hopper", gpus=4096)[2]


def test_routing_imbalance_is_the_expected_maximum_of_binomial_loads():
    import math

    from trainledger.estimate.time.work import routing_imbalance

    assert routing_imbalance(1e6, 1) == 1.0
    n, ep = 4096 * 64 * 8, 64
    assert routing_imbalance(n, ep) == pytest.approx(
        1 + math.sqrt(2 * math.log(ep)) * math.sqrt((1 - 1 / ep) * ep / n))
    assert routing_imbalance(1e4, 64) > routing_imbalance(1e6, 64) > 1.0


def test_megatron_core_hopper_fp8_gemm_rate_sits_below_te_linear_benchmarks():
    """Megatron-Core's fp8 GEMMs on an H100 SXM at 8192^3: Transformer Engine's FP8 linear-layer
    benchmarks reach 1300-1450 of 1979 TFLOP/s on large shapes (the range hopper.yaml and
    stacks/megatron-core.yaml cite); a training step adds each GEMM's scaling-factor bookkeeping
    (amax history reduction, scale update under delayed scaling) on top, so the rate the stack's
    time model gives a training GEMM lies below that range's low end. Lower bound: an fp8 GEMM is
    faster than the same stack's bf16 GEMM of the same shape (twice the tensor-core rate on the
    H100 datasheet, 1979 vs 989.5 TFLOP/s), otherwise fp8 training would not pay."""
    from trainledger.estimate.time.efficiency import gemm_time_s

    g = load_gpu("h100-sxm")
    fam, prof = for_gpu(g), stack_profile("megatron-core", g)
    n = 8192

    def rate(dt, peak, bpe):
        return 2 * n**3 / gemm_time_s(n, n, n, peak * 1e12, g.hbm_bytes_per_s, fam, prof.eff.matmul[dt], bpe) / 1e12

    fp8, bf16 = rate("fp8", g.fp8_tflops, 1.0), rate("bf16", g.bf16_tflops, 2.0)
    assert bf16 < fp8 < 1300, (fp8, bf16)


@pytest.mark.parametrize("gpu", ["b200", "gb200", "h100-sxm"])
def test_megatron_core_hides_tp_traffic_on_blackwell_as_on_hopper(gpu):
    # NVIDIA's Blackwell recipes set TP comm overlap (MLPerf Training v5.1 Llama 3.1 405B on DGX B200:
    # TP_COMM_OVERLAP=True; NeMo / Megatron-Bridge map B200 and GB200 to userbuffers configs), so a
    # TP plan's exposed TP time under megatron-core is the unhidden 0.3 of its TP traffic (Wang et
    # al. 2023 hide ~0.7) plus each collective's launch on the critical path (a few % here), and
    # --no-tp-comm-overlap exposes all of it
    plan = _plan(gpu=gpu, gpus=8, tp=8, zero=1, framework="megatron-core")
    on = estimate_compute(plan).breakdown["comm_tp"]
    off = estimate_compute(plan, TimeOptions(tp_comm_overlap=False)).breakdown["comm_tp"]
    assert 0.3 <= on / off < 0.4


@pytest.mark.parametrize("framework", ["hf", "fsdp2", "pytorch-fsdp"])
def test_fused_adamw_is_one_pass_on_stacks_whose_adamw_is_foreach(framework):
    """On these stacks ``adamw`` is torch's foreach AdamW (adamw_kernel: foreach); ``adamw-fused``
    (torch.optim.AdamW(fused=True)) streams the shard once. Hand sum for 8B on 8 H100, ZeRO-3,
    bf16-mixed (fp32 weights under autocast, no separate master): per parameter 2 states x 4 B read
    and written, fp32 grads 3 x 4 B, fp32 weights read and written; foreach adds 13 fp32 accesses
    (its 8 list kernels: 20 accesses against the fused kernel's 7, tests/unit/test_optimizer_bytes.py)."""
    g = load_gpu("h100-sxm")
    prof = stack_profile(framework, g)
    plans = {o: _plan(framework=framework, optimizer=o) for o in ("adamw", "adamw-fused")}
    opt = {o: estimate_compute(p).breakdown["optimizer"] for o, p in plans.items()}
    p = plans["adamw"].model.params.total / 8
    per = 2 * 2 * 4 + 3 * 4 + 2 * 4
    one_pass = p * per / (g.hbm_bytes_per_s * prof.eff.hbm)
    assert opt["adamw-fused"] == pytest.approx(one_pass, rel=1e-9)
    # foreach AdamW on DTensor shards (fsdp2) is host-bound: 8 dispatches per tensor (torch 2.13),
    # 291 tensors (32 layers x 9 + embedding, final norm, head), each dispatch the stack's cost
    host = prof.optimizer_dispatch_s * 8 * (32 * 9 + 3)
    assert (host > 0) == (framework == "fsdp2")
    foreach = p * (per + 13 * 4) / (g.hbm_bytes_per_s * prof.eff.hbm)
    assert opt["adamw"] == pytest.approx(max(foreach, host), rel=1e-9)
    assert not prof.adamw_fused
