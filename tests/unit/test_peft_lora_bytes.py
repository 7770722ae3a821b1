"""The streaming bytes of peft's fp32 LoRA adapters (work.PEFT_FP32_ADAPTER_BYTES), counted again
from the ops torch dispatches for one wrapped projection, forward and backward, with and without
autocast (CPU autocast casts a linear's inputs to bf16 as CUDA's does), on the installed torch and
peft: a peft that changes its LoRA forward fails here instead of silently changing the
hf stack's LoRA step time."""

from __future__ import annotations

import pytest

from trainledger.estimate.time.compute import Gemm
from trainledger.estimate.time.work import PEFT_FP32_ADAPTER_BYTES, peft_adapter_bytes

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

T, K, N, R = 64, 48, 80, 4  # tokens, projection in/out, rank: K != N separates the two rates


def _counted(k: int, n: int, autocast: bool) -> tuple[float, float]:
    """Elementwise bytes of a bf16 Linear(k, n) wrapped by peft (fp32 adapters), with or without
    autocast, minus those of the bare Linear, per token: (forward, backward). The adapters' own
    weight casts under autocast (per step, not per token) are left out: r·(k + n) elements."""
    from trainledger.verify.opbytes import OpBytes

    def run(wrap: bool) -> tuple[float, float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential()
        model.add_module("proj", torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16))
        if wrap:
            cfg = peft.LoraConfig(r=R, lora_alpha=2 * R, target_modules=["proj"], lora_dropout=0.0)
            model = peft.get_peft_model(model, cfg)
            a = model.base_model.model.proj.lora_A["default"].weight
            assert a.dtype == torch.float32  # peft's autocast_adapter_dtype default
        else:
            model.proj.weight.requires_grad_(False)  # frozen, as the LoRA base is
        x = torch.randn(T, k, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(T, n, dtype=torch.bfloat16)
        ob = OpBytes()
        with ob:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
            ob.phase = "backward"
            out.backward(grad.to(out.dtype))
        return (sum(v for key, v in ob.by_op.items() if key.endswith("(forward)")),
                sum(v for key, v in ob.by_op.items() if key.endswith("(backward)")))

    (fw, bw), (f0, b0) = run(True), run(False)
    weight_casts = (4 + 2) * R * (k + n) if autocast else 0  # fp32 adapter weights -> bf16, once
    return (fw - f0 - weight_casts) / T, (bw - b0 - weight_casts) / T


@pytest.mark.parametrize("autocast", [False, True])
def test_peft_fp32_adapter_bytes_match_torch(autocast):
    fwd, bwd = _counted(K, N, autocast)
    fi, bi = PEFT_FP32_ADAPTER_BYTES[autocast]["in"]
    fo, bo = PEFT_FP32_ADAPTER_BYTES[autocast]["out"]
    assert fwd == pytest.approx(fi * K + fo * N)
    assert bwd == pytest.approx(bi * K + bo * N)


def test_peft_adapter_bytes_reads_the_projection_dims_from_the_adapter_gemms():
    adapters = (Gemm("lora_a_q", K, R, "none"), Gemm("lora_b_q", R, N, "none"),
                Gemm("lora_a_experts", K, 2 * R, "none", 2.0, 8), Gemm("lora_b_experts", 2 * R, N, "none", 2.0, 8))
    fwd, bwd = peft_adapter_bytes(adapters, False)
    fi, bi = PEFT_FP32_ADAPTER_BYTES[False]["in"]
    fo, bo = PEFT_FP32_ADAPTER_BYTES[False]["out"]
    assert fwd == pytest.approx(3 * (fi * K + fo * N))  # routed experts: top-2 per token
    assert bwd == pytest.approx(3 * (bi * K + bo * N))


def test_hf_lora_step_streams_the_adapter_bytes_by_hand(monkeypatch):
    # Llama-3.1-8B, all 7 projections wrapped: per layer sum k = 6 x 4096 + 14336 = 38912 and
    # sum n = 2 x 4096 + 2 x 1024 + 2 x 14336 + 4096 = 43008; pure bf16 (no autocast):
    # (6 + 12) x 38912 + (24 + 20) x 43008 = 2,592,768 bytes per token per layer
    from trainledger.estimate.time import estimate_compute
    from trainledger.estimate.time import work
    from trainledger.estimate.time.efficiency import for_gpu
    from trainledger.load.plan import PlanInputs, build_plan

    def elementwise(framework: str) -> float:
        plan = build_plan(PlanInputs(model="llama-3.1-8b", method="lora", precision="bf16", seq_len=4096,
                                     gpu="h100-sxm", framework=framework))
        return estimate_compute(plan).compute_parts["elementwise"]

    with_adapters, fsdp2 = elementwise("hf"), elementwise("fsdp2")
    zero = {"in": (0.0, 0.0), "out": (0.0, 0.0)}
    monkeypatch.setattr(work, "PEFT_FP32_ADAPTER_BYTES", {False: zero, True: zero})
    gpu = build_plan(PlanInputs(model="llama-3.1-8b", gpu="h100-sxm")).cluster.gpu
    expected = 32 * 4096 * 2_592_768 / (gpu.hbm_bytes_per_s * for_gpu(gpu).hbm)
    assert with_adapters - elementwise("hf") == pytest.approx(expected, rel=1e-9)
    assert fsdp2 == elementwise("fsdp2")  # a stack that does not run peft's layers pays nothing
