"""Bytes per weight of the served weight formats, against the tensors the serving kernels allocate.

Expected values are not the estimator's formula: each case lays out the tensors that the cited
loader creates for one K×N linear layer (shapes from vLLM's ``create_weights`` of each method, the
AWQ/GPTQ packing of 8 int4 values per int32, the NVFP4 micro-block of 16 values), as torch tensors
on the meta device, and sums their ``nbytes`` — so the element sizes come from torch itself. A
changed scale size, group layout or block size in estimate/serving/quant.py makes these fail.
"""

from __future__ import annotations

import pytest
import torch

from trainledger.estimate.serving.quant import weight_format


def _nbytes(*tensors: tuple[tuple[int, ...], torch.dtype]) -> int:
    return sum(torch.empty(shape, dtype=dt, device="meta").nbytes for shape, dt in tensors)


K, N, G = 4096, 11008, 128  # a Llama-7B MLP up-projection, AWQ/GPTQ's default group size


def _per_weight(tensors) -> float:
    return _nbytes(*tensors) / (K * N)


def test_awq_int4_packed_eight_per_int32_with_fp16_scales_and_packed_zeros():
    # vLLM awq.py AWQLinearMethod.create_weights: qweight int32 [K, N/8], qzeros int32 [K/g, N/8],
    # scales fp16 [K/g, N] (Lin et al. 2024, arXiv:2306.00978)
    expected = _per_weight([((K, N // 8), torch.int32), ((K // G, N // 8), torch.int32),
                            ((K // G, N), torch.float16)])
    assert weight_format("bf16", "bf16", "awq", G).linear_bytes(K, N) == pytest.approx(expected, rel=1e-9)


def test_gptq_adds_one_int32_group_index_per_input_row():
    # vLLM gptq.py GPTQLinearMethod.create_weights: the AWQ tensors (qweight packed along K) plus
    # g_idx int32 [K] (act-order group of every input row) (Frantar et al. 2023, arXiv:2210.17323)
    expected = _per_weight([((K // 8, N), torch.int32), ((K // G, N // 8), torch.int32),
                            ((K // G, N), torch.float16), ((K,), torch.int32)])
    assert weight_format("fp16", "fp16", "gptq", G).linear_bytes(K, N) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("g", [32, 64, 128])
def test_int4_group_overhead_halves_when_the_group_doubles(g):
    # scale + zero per group: the overhead above the 0.5-byte payload is inversely proportional to g
    f = weight_format("bf16", "bf16", "awq", g)
    f2 = weight_format("bf16", "bf16", "awq", 2 * g)
    payload = torch.empty((), dtype=torch.int32).element_size() / 8  # 8 int4 per int32
    assert (f.linear_bytes(K, N) - payload) == pytest.approx(2 * (f2.linear_bytes(K, N) - payload))


def test_fp8_w8a8_one_byte_per_weight_plus_two_per_tensor_fp32_scales():
    # vLLM Fp8LinearMethod: weight float8_e4m3fn [N, K], weight_scale and input_scale fp32 scalars
    expected = _per_weight([((N, K), torch.float8_e4m3fn), ((), torch.float32), ((), torch.float32)])
    assert weight_format("bf16", "bf16", "fp8", 0).linear_bytes(K, N) == pytest.approx(expected, rel=1e-12)


def test_int8_w8a8_per_output_channel_fp32_scale():
    # vLLM CompressedTensorsW8A8Int8: weight int8 [N, K], channel-wise weight_scale fp32 [N, 1]
    expected = _per_weight([((N, K), torch.int8), ((N, 1), torch.float32)])
    assert weight_format("bf16", "bf16", "int8", 0).linear_bytes(K, N) == pytest.approx(expected, rel=1e-12)


def test_nvfp4_two_values_per_byte_and_one_e4m3_scale_per_16():
    # NVFP4 (NVIDIA, "Introducing NVFP4", 2025; vLLM modelopt ModelOptNvFp4LinearMethod): weight
    # uint8 [N, K/2] (two E2M1 values per byte), weight_scale float8_e4m3fn [N, K/16]; the one
    # fp32 global scale per tensor is below the comparison's tolerance
    expected = _per_weight([((N, K // 2), torch.uint8), ((N, K // 16), torch.float8_e4m3fn)])
    assert weight_format("bf16", "bf16", "nvfp4", 0).linear_bytes(K, N) == pytest.approx(expected, rel=1e-9)


def test_nf4_double_quantization_bytes():
    # bitsandbytes Params4bit (quant_type nf4, compress_statistics=True, blocksize 64): uint8 data
    # [K*N/2], absmax quantized to uint8 per 64-block, one fp32 absmax per 256 of those blocks
    # (QLoRA, Dettmers et al. 2023, arXiv:2305.14314, §3 "Double Quantization": 0.127 bits/param
    # of constants instead of 0.5); the 256-entry code tables are per tensor and negligible
    n = K * N
    expected = _nbytes(((n // 2,), torch.uint8), ((n // 64,), torch.uint8),
                       ((n // (64 * 256),), torch.float32)) / n
    assert weight_format("bf16", "bf16", "nf4", 0).linear_bytes(K, N) == pytest.approx(expected, rel=1e-9)
    assert (expected - 0.5) * 8 == pytest.approx(0.127, abs=5e-4)  # the paper's figure


def test_mxfp4_two_values_per_byte_and_one_e8m0_scale_per_32():
    # OCP Microscaling Formats (MX) Specification v1.0 (2023), MXFP4: blocks of k = 32 E2M1
    # elements sharing one 8-bit E8M0 scale. The gpt-oss checkpoints store them so (transformers
    # integrations/mxfp4.py ``Mxfp4GptOssExperts``, 4.55: ``*_blocks`` uint8 [E, N, K/32, 16],
    # ``*_scales`` uint8 [E, N, K/32]); one expert's 2880 -> 5760 gate_up projection of gpt-oss
    k, n = 2880, 5760
    expected = _nbytes(((n, k // 32, 16), torch.uint8), ((n, k // 32), torch.uint8)) / (k * n)
    assert weight_format("bf16", "bf16", "mxfp4", 0).linear_bytes(k, n) == pytest.approx(expected, rel=1e-12)
    assert expected * 8 == pytest.approx(4.25)  # the gpt-oss model card's "4.25 bits per parameter"
