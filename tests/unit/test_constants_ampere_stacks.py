"""Catalog values of the Ampere family (catalog/efficiency/ampere.yaml) and of the PyTorch /
DeepSpeed stacks (stacks/hf.yaml, pytorch-fsdp.yaml, deepspeed.yaml, megatron-deepspeed.yaml)
against their sources, for the mutants that bench/results/mutation_catalog_ampere_stacks.json
found unguarded.

Expected values are derived here by hand from the figures the catalog files cite (datasheet SM
counts, kernel tile shapes), never copied from the estimator's output.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.time.efficiency import for_gpu, gpu_efficiency, wave_efficiency
from trainledger.load.catalog import load_gpu
from trainledger.estimate.time.stack import stack_values


# ------------------------------------------------------------------ wave quantization on A100

def test_a100_wave_is_108_tiles_of_256x128():
    """NVIDIA Matrix Multiplication Background User's Guide (DU-09799-001, §3.2 "Wave
    Quantization"): an A100 has 108 SMs (A100 Tensor Core GPU Architecture whitepaper, Table 1) and
    runs one 256x128 thread-block tile per SM, so a wave is 108 tiles and utilization is highest
    when the tile count is a multiple of 108 (or just below). By hand, with no split-K (K = 0):

    * M = 9·256, N = 12·128: 9 x 12 = 108 tiles, exactly one full wave -> 1;
    * M = 9·256, N = 13·128: 117 tiles, two waves of 108 slots -> 117 / 216;
    * M = N = 1792: ceil(1792/256) x ceil(1792/128) = 7 x 14 = 98 tiles in one wave -> 98 / 108.
    """
    eff = gpu_efficiency("ampere")
    assert wave_efficiency(9 * 256, 12 * 128, eff) == pytest.approx(1.0)
    assert wave_efficiency(9 * 256, 13 * 128, eff) == pytest.approx(117 / 216)
    assert wave_efficiency(1792, 1792, eff) == pytest.approx(98 / 108)


# ------------------------------------------------------------------ Megatron-DeepSpeed GEMM rates

def test_megatron_deepspeed_hopper_fp8_gemm_rate_sits_below_te_linear_benchmarks():
    """stacks/megatron-deepspeed.yaml runs fp8 "through Transformer Engine linears (as
    megatron-core.yaml)". Transformer Engine's FP8 linear-layer benchmarks on an H100 SXM reach
    1300-1450 of 1979 TFLOP/s on large shapes (the range hopper.yaml cites); in training each GEMM's
    scaling-factor bookkeeping (amax history, scale update) comes on top, so the rate the stack's
    time model gives an 8192^3 training GEMM lies below that range's low end. Lower bound: faster
    than the same stack's bf16 GEMM of that shape (fp8 has twice the tensor-core rate, H100 SXM
    datasheet 1979 vs 989.5 TFLOP/s), otherwise fp8 training would not pay."""
    from trainledger.estimate.time.efficiency import for_gpu, gemm_time_s
    from trainledger.estimate.time.stack import stack_profile
    from trainledger.load.catalog import load_gpu

    g = load_gpu("h100-sxm")
    fam, prof = for_gpu(g), stack_profile("megatron-deepspeed", g)
    n = 8192

    def rate(dt, peak, bpe):
        t = gemm_time_s(n, n, n, peak * 1e12, g.hbm_bytes_per_s, fam, prof.eff.matmul[dt], bpe)
        return 2 * n**3 / t / 1e12

    fp8, bf16 = rate("fp8", g.fp8_tflops, 1.0), rate("bf16", g.bf16_tflops, 2.0)
    assert bf16 < fp8 < 1300, (fp8, bf16)


def test_megatron_stacks_have_no_fp8_tensor_cores_on_ampere():
    # the A100 datasheet lists no FP8 tensor-core rate (TF32, BF16/FP16, INT8, INT4 only): an fp8
    # recipe's GEMMs run at the 16-bit rate on Ampere, for the Megatron stacks as for the eager ones
    for fw in ("megatron-deepspeed", "megatron-core"):
        r = stack_values(fw, "ampere")["matmul_efficiency"]
        assert r["fp8"] == r["bf16"] == r["fp16"], fw


def test_megatron_deepspeed_runs_megatron_lm_2021_gemms_on_a100():
    """Megatron-DeepSpeed is DeepSpeed's fork of NVIDIA's Megatron-LM (microsoft/Megatron-DeepSpeed
    README: "DeepSpeed version of NVIDIA's Megatron-LM"; BLOOM, Le Scao et al. 2022, §3.4): its
    ColumnParallel/RowParallelLinear GEMMs are Megatron-LM 2021's code on cuBLAS. The A100 rate of
    those GEMMs is the one the Megatron-LM 2021 and Korthikanti 2022 rows measure, which the time
    model runs as megatron-core on Ampere (bench/time_accuracy.py, megatron_cases, korthikanti_cases;
    no Transformer Engine on A100 in those runs). Same kernels, same rate: checked on the rates the
    time model uses (after the family cap)."""
    from trainledger.estimate.time.stack import stack_profile
    from trainledger.load.catalog import load_gpu

    g = load_gpu("a100-sxm-80gb")
    mds, mc = stack_profile("megatron-deepspeed", g).eff.matmul, stack_profile("megatron-core", g).eff.matmul
    for dt in ("bf16", "fp16"):
        assert mds[dt] == mc[dt], dt


# ------------------------------------------------------------------ eager PyTorch collectives

def test_eager_pytorch_stacks_pay_one_collective_launch_cost():
    """An identity of mechanism, not a measured figure: hf.yaml, pytorch-fsdp.yaml and fsdp2.yaml
    all state their per-collective host cost as eager dispatch + NCCL launch (ProcessGroupNCCL
    called from Python, one call per all-gather / reduce-scatter / all-reduce bucket); which FSDP
    or DDP wrapper issues the call does not change that path, so the three stacks share one value
    (the same reasoning as test_constants_catalog's shared eager GEMM rates). DeepSpeed's ZeRO-3
    per-submodule Python hooks and Megatron's persistent buffers are different mechanisms and are
    left out."""
    launch = {fw: stack_values(fw, fam)["collective_launch_s"]
              for fw in ("hf", "pytorch-fsdp", "fsdp2") for fam in ("hopper", "ampere")}
    assert len(set(launch.values())) == 1, launch


@pytest.mark.parametrize("gpu,sms", [("a10", 72), ("rtx-a6000", 84), ("rtx-3090", 82), ("a100-sxm-80gb", 108),
                                     ("h100-pcie", 114), ("h100-sxm", 132)])
def test_waves_fill_each_gpus_own_sms(gpu, sms):
    """Wave quantization counts the GPU's own SMs (GA102 boards: one RT core per SM, 72 on the A10,
    84 on the RTX A6000, 82 on the RTX 3090; A100 108, H100 PCIe 114, H100 SXM 132: the A100/H100
    whitepapers): a GEMM with exactly ``sms`` output tiles is one full wave, one more tile starts a
    second wave of a single tile."""
    g = load_gpu(gpu)
    eff = for_gpu(g)
    assert eff.sm_count == sms
    tm, tn = eff.gemm_tile
    assert wave_efficiency(tm * sms, tn, eff) == pytest.approx(1.0)
    assert wave_efficiency(tm * (sms + 1), tn, eff) == pytest.approx((sms + 1) / (2 * sms))
