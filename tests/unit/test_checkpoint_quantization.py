"""A served checkpoint's own quantization is the default weight format (``--quantization auto``):
vLLM and SGLang load config.json ``quantization_config`` without a flag, so DeepSeek-V3 serves in its
shipped fp8 and gpt-oss in mxfp4 unless the job says otherwise."""

from __future__ import annotations

import pytest

from trainledger.estimate.serving.memory import engine_memory, weight_bytes
from trainledger.load.hf import checkpoint_quantization, load_model
from trainledger.load.plan import build_plan, parse_inputs


@pytest.mark.parametrize("cfg, expected", [
    # DeepSeek-V3 config.json: block-scaled e4m3
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
     "fp8"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}, "mxfp4"),   # gpt-oss
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "awq"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "gptq"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4"}, None),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, None),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, None),  # not priced
])
def test_quantization_config_names_the_format(cfg, expected):
    assert checkpoint_quantization({"quantization_config": cfg}) == expected
    assert checkpoint_quantization({}) is None


def test_presets_carry_what_their_checkpoints_ship():
    assert load_model("deepseek-v3").checkpoint_quantization == "fp8"
    assert load_model("kimi-k2").checkpoint_quantization == "fp8"   # DeepseekV3 block-fp8 release
    assert load_model("gpt-oss-120b").checkpoint_quantization == "mxfp4"
    assert load_model("llama-3.1-8b").checkpoint_quantization is None


def _serve(model, gpu="h100-sxm", **kw):
    return build_plan(parse_inputs({"model": model, "method": "inference", "gpu": gpu, "gpus": kw.pop("gpus", 1),
                                    "tp": kw.pop("tp", 1), **kw}))


def test_auto_serves_the_checkpoint_format_and_an_explicit_choice_wins():
    assert _serve("deepseek-v3", gpu="h200", gpus=8, tp=8).serving.quantization == "fp8"
    assert _serve("deepseek-v3", gpu="h200", gpus=8, tp=8, quantization="none").serving.quantization == "none"
    assert _serve("gpt-oss-120b").serving.quantization == "mxfp4"
    assert _serve("llama-3.1-8b").serving.quantization == "none"
    auto, explicit = _serve("gpt-oss-120b"), _serve("gpt-oss-120b", quantization="mxfp4")
    assert weight_bytes(auto) == weight_bytes(explicit)


def test_gpt_oss_120b_fits_one_80gb_gpu_as_shipped_not_in_bf16():
    # OpenAI's gpt-oss model card: the 120B "runs on a single 80GB GPU" with its MXFP4 experts
    assert engine_memory(_serve("gpt-oss-120b", seq_len=4096)).fits
    assert not engine_memory(_serve("gpt-oss-120b", seq_len=4096, quantization="none")).fits


def test_kimi_k2_smallest_h800_deployment_is_sixteen_gpus_in_its_fp8():
    # vLLM recipe for moonshotai/Kimi-K2-Instruct: "the smallest deployment unit for Kimi-K2 FP8
    # weights with 128k seqlen on mainstream H800 platforms is a 16-GPU cluster" (TP8+PP2 shown)
    def fits(gpus, pp, **kw):
        return engine_memory(_serve("kimi-k2", gpu="h800", gpus=gpus, tp=8, pp=pp, seq_len=131072, **kw)).fits
    assert fits(16, 2)
    assert not fits(8, 1)                       # one node of 80 GB parts holds no 1 TB of fp8 weights
    assert not fits(16, 2, quantization="none")  # nor two nodes the same weights in bf16
