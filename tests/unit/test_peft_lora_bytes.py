"""The streaming bytes of peft's fp32 LoRA adapters (work.PEFT_FP32_ADAPTER_BYTES), counted again
from the ops torch dispatches for one wrapped projection, forward and backward, on the installed
torch and peft: a peft that changes its LoRA forward fails here instead of silently changing the
hf stack's LoRA step time."""

from __future__ import annotations

import pytest

from trainledger.estimate.time.compute import Gemm
from trainledger.estimate.time.work import PEFT_FP32_ADAPTER_BYTES, peft_adapter_bytes

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

T, K, N, R = 64, 48, 80, 4  # tokens, projection in/out, rank: K != N separates the two rates


def _counted(k: int, n: int) -> tuple[float, float]:
    """Elementwise bytes of a bf16 Linear(k, n) wrapped by peft (fp32 adapters, no autocast),
    minus those of the bare Linear: (forward, backward)."""
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
            out = model(x)
            ob.phase = "backward"
            out.backward(grad)
        return (sum(v for key, v in ob.by_op.items() if key.endswith("(forward)")),
                sum(v for key, v in ob.by_op.items() if key.endswith("(backward)")))

    (fw, bw), (f0, b0) = run(True), run(False)
    return (fw - f0) / T, (bw - b0) / T


def test_peft_fp32_adapter_bytes_match_torch():
    fwd, bwd = _counted(K, N)
    fi, bi = PEFT_FP32_ADAPTER_BYTES["in"]
    fo, bo = PEFT_FP32_ADAPTER_BYTES["out"]
    assert fwd == pytest.approx(fi * K + fo * N)
    assert bwd == pytest.approx(bi * K + bo * N)


def test_peft_adapter_bytes_reads_the_projection_dims_from_the_adapter_gemms():
    adapters = (Gemm("lora_a_q", K, R, "none"), Gemm("lora_b_q", R, N, "none"),
                Gemm("lora_a_experts", K, 2 * R, "none", 2.0, 8), Gemm("lora_b_experts", 2 * R, N, "none", 2.0, 8))
    fwd, bwd = peft_adapter_bytes(adapters)
    fi, bi = PEFT_FP32_ADAPTER_BYTES["in"]
    fo, bo = PEFT_FP32_ADAPTER_BYTES["out"]
    assert fwd == pytest.approx(3 * (fi * K + fo * N))  # routed experts: top-2 per token
    assert bwd == pytest.approx(3 * (bi * K + bo * N))
