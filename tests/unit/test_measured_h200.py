"""The Hopper time constants against what one H200 measured (bench/time_cuda.py, committed in
bench/results/time_cuda_h200*.json with bench/device_h200.sh): isolated GEMM rates, SDPA's fused
attention per backend, and the kernel time of single-GPU Hugging Face training steps by term.

These files are measurements, not our output: a constant that moves away from them fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainledger.estimate.time.efficiency import attention_efficiency, for_gpu, gemm_time_s
from trainledger.estimate.time.stack import stack_profile
from trainledger.load.catalog import load_gpu

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RUNS = ("time_cuda_h200.json", "time_cuda_h200_run1.json")


def _runs() -> list[dict]:
    return [json.loads((RESULTS / name).read_text()) for name in RUNS]


def _attention_rows(backends: tuple[str, ...]) -> list[dict]:
    return [r for run in _runs() for r in run["attention"] if r["backend"] in backends and "error" not in r]


def test_the_measurements_are_from_an_h200():
    for run in _runs():
        assert run["device_name"] == "NVIDIA H200"


def test_large_bf16_gemms_run_at_the_hopper_family_rate():
    # cuBLAS on random data, median of timed repeats; two runs differ by up to 8% (clocks under the
    # 700 W limit), so 20% bounds the model, not the noise
    gpu = load_gpu("h200")
    eff = for_gpu(gpu)
    by_shape: dict[tuple[int, int, int], list[float]] = {}
    for run in _runs():
        for r in run["gemm"]:
            if r["dtype"] == "bf16" and min(r["M"], r["N"]) >= 4096 and r["K"] >= 2048:
                by_shape.setdefault((r["M"], r["K"], r["N"]), []).append(r["measured_s"])
    assert len(by_shape) >= 8
    ratios = []
    for (M, K, N), times in by_shape.items():
        pred = gemm_time_s(M, K, N, gpu.peak_flop_per_s("bf16"), gpu.hbm_bytes_per_s, eff, eff.matmul_max("bf16"), 2.0)
        ratios.append(sum(times) / len(times) / pred)
        assert ratios[-1] == pytest.approx(1.0, abs=0.20), (M, K, N)
    ratios.sort()
    assert ratios[len(ratios) // 2] == pytest.approx(1.0, abs=0.10)


def test_torch_stacks_flash_attention_rate_is_sdpas_flash_backend():
    # hf / pytorch-fsdp / fsdp2 on Hopper: SDPA's FlashAttention-2 backend (torch < 2.11's default)
    gpu = load_gpu("h200")
    for framework in ("hf", "pytorch-fsdp", "fsdp2"):
        eff = stack_profile(framework, gpu).eff
        rows = [r for r in _attention_rows(("flash",)) if r["s"] >= 2048]
        assert len(rows) >= 10
        for r in rows:
            assert attention_efficiency(eff, r["s"], r["d"]) / r["measured_efficiency"] == \
                pytest.approx(1.0, abs=0.12), (framework, r["s"], r["d"])


def test_hopper_family_attention_rate_is_cudnns():
    # the family's FA3/cuDNN-class rate; torch 2.11's SDPA picks cuDNN on sm90 by itself ("default")
    eff = for_gpu(load_gpu("h200"))
    rows = [r for r in _attention_rows(("cudnn", "default")) if r["s"] >= 2048 and r["d"] == 128]
    assert len(rows) >= 10
    for r in rows:
        assert attention_efficiency(eff, r["s"], r["d"]) / r["measured_efficiency"] == \
            pytest.approx(1.0, abs=0.16), (r["backend"], r["s"])


def test_sdpa_default_on_torch_2_11_hopper_is_the_cudnn_backend():
    # transformers PR #48163 (2026-08): torch's check_prefer_cudnn_attention puts cuDNN first on
    # sm90/sm100 once the bundled cuDNN passes 9.15 (torch 2.11); the default rows run at cuDNN's rate
    run = _runs()[0]
    assert run["torch"].startswith("2.11")
    by = {(r["backend"], r["s"], r["d"]): r["fwd_bwd_s"] for r in run["attention"] if "error" not in r}
    for (backend, s, d), t in by.items():
        if backend == "default":
            assert t == pytest.approx(by[("cudnn", s, d)], rel=0.15)
            assert t < 0.8 * by[("flash", s, d)]


def test_memory_estimate_against_the_h200_measurement():
    # bench/memory_cuda.py: the estimate made now, against torch.cuda.max_memory_allocated there
    from trainledger.estimate.memory import estimate_memory
    from trainledger.load.plan import PlanInputs, build_plan

    import sys

    sys.path.insert(0, str(RESULTS.parent))
    from memory_cuda import case_inputs

    rows = json.loads((RESULTS / "memory_cuda_h200.json").read_text())["rows"]
    errors = {}
    for r in rows:
        est = estimate_memory(build_plan(PlanInputs(gpu="h200", **case_inputs(r["inputs"]))), suggest=False)
        errors[r["name"]] = est.peak_allocated_bytes / r["measured_allocated"] - 1
    assert len(errors) == 12
    assert sum(abs(e) < 0.004 for e in errors.values()) >= 10  # README: 10 within 0.4%
    assert max(abs(e) for e in errors.values()) < 0.018         # every one within 1.8%


def _hf_step_errors(name: str) -> dict[str, float]:
    """measured / predicted - 1 of the H200 hf steps, the prediction made now (less the Trainer's
    host step, which verify's StepRunner does not run)."""
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    out = {}
    for r in json.loads((RESULTS / name).read_text())["step"]:
        plan = build_plan(PlanInputs(gpu="h200", framework="hf", **r["inputs"]))
        comp = estimate_compute(plan)
        out[r["name"]] = r["measured_step_s"] / (comp.step_time_s - stack_profile("hf", plan.cluster.gpu).host_step_s) - 1
    return out


def test_hf_steps_on_the_h200_as_the_readme_states():
    errors = _hf_step_errors("time_cuda_h200.json")
    assert len(errors) == 8 and max(abs(e) for e in errors.values()) < 0.13
    # peft's fp32 adapter casts (work.PEFT_FP32_ADAPTER_BYTES) were +33% before they were priced
    assert abs(errors["Llama-3.1-8B LoRA s4096 b2"]) < 0.07


def test_hf_gemm_term_against_the_profiled_kernels():
    # README: the GEMM kernels take 18-31% less time than the hf profile charges (LoRA aside: its
    # fp32 adapter GEMMs run on FFMA units)
    from trainledger.estimate.time import estimate_compute
    from trainledger.load.plan import PlanInputs, build_plan

    ratios = []
    for r in json.loads((RESULTS / "time_cuda_h200_profile.json").read_text())["step"]:
        if "LoRA" in r["name"]:
            continue
        comp = estimate_compute(build_plan(PlanInputs(gpu="h200", framework="hf", **r["inputs"])))
        ratios.append(r["profile"]["kernel_ms_by_term"]["matmul"] / 1e3 / comp.compute_parts["matmul"])
    assert len(ratios) == 7
    assert 0.68 < min(ratios) and max(ratios) < 0.83
