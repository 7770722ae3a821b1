"""Weight formats of a served model: bytes per weight (scales and zero points counted) and GEMM dtype.

Symbols: K input features of a linear layer, N output features, g the group size.

* ``none``: the precision policy's weight dtype (bf16/fp16: 2 bytes; fp32: 4; fp8-mixed: fp8).
* ``fp8``: W8A8 with one fp32 scale per weight tensor (vLLM ``Fp8LinearMethod``, docs
  features/quantization/fp8.md; ``input_scale``/``weight_scale`` are per-tensor): 1 + 8/(K·N) bytes.
* ``int8``: W8A8 with one fp32 scale per output channel (vLLM ``CompressedTensorsW8A8Int8``,
  channel-wise ``weight_scale`` of shape [N, 1]): 1 + 4/K bytes per weight.
* ``awq``: int4 weights packed 8 per int32 (``qweight`` [K, N/8]), fp16 ``scales`` [K/g, N] and
  4-bit ``qzeros`` packed [K/g, N/8] (Lin et al. 2024, arXiv:2306.00978; vLLM awq.py
  ``AWQLinearMethod.create_weights``): 0.5 + (2 + 0.5)/g bytes per weight.
* ``gptq``: the same tensors plus ``g_idx`` (int32 per input row, [K]) (Frantar et al. 2023,
  arXiv:2210.17323; vLLM gptq.py ``GPTQLinearMethod.create_weights``): 0.5 + 2.5/g + 4/N.
* ``nvfp4``: FP4 (E2M1) weights and activations with one FP8 (E4M3) scale per 16 values and one
  fp32 scale per tensor (NVIDIA, "Introducing NVFP4", 2025; ModelOpt ``NVFP4`` checkpoints, vLLM
  ``modelopt_fp4``): 0.5 + 1/16 bytes per weight; the GEMMs run on Blackwell's FP4 tensor cores.
* ``mxfp4``: OCP MX FP4 (E2M1) with one E8M0 scale per 32 values, 0.5 + 1/32 bytes per weight, on
  the routed experts only — how the gpt-oss checkpoints ship (config.json ``quantization_config``:
  ``quant_method: mxfp4``, ``modules_to_not_convert``: attention, router, embedding, lm_head) and
  how vLLM serves them (``Mxfp4Config``: FusedMoE layers quantized, other linears unquantized).
  The expert GEMMs are modelled as dequantized into the 16-bit GEMM (W4A16; the triton
  ``matmul_ogs`` kernel on Hopper), also on Blackwell, whose W4A8 path is not modelled.
* ``nf4``: bitsandbytes 4-bit NF4 with double quantization, 0.5 + 1/64 + 4/(64·256) bytes
  (Dettmers et al. 2023, arXiv:2305.14314, §3).

Quantized: every decoder-layer linear (experts included). Kept in the 16-bit dtype: embeddings,
lm_head, norms, the MoE router (vLLM keeps ``lm_head`` and ``gate`` unquantized for these methods).
GEMM dtype: fp8 and int8 run on their tensor cores; int4 and nf4 dequantize inside a 16-bit GEMM
(Marlin, arXiv:2408.11743), so they read 4-bit weights but compute at the 16-bit rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainledger.units import DTYPE_BYTES

#: bytes per element of the quantized payload
INT4_BYTES = 0.5
#: AWQ/GPTQ scales are fp16 (2 bytes) per group and output channel; zeros are 4-bit packed
SCALE_BYTES = 2.0
ZERO_BYTES = 0.5
#: GPTQ g_idx: one int32 per input row
G_IDX_BYTES = 4.0
FP32_SCALE = 4.0
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
#: NVFP4: one E4M3 scale (1 byte) per 16-value micro-block
NVFP4_BLOCK = 16
NVFP4_SCALE_BYTES = 1.0
#: OCP Microscaling Formats (MX) v1.0, Table 1: one 8-bit E8M0 scale per 32-element block
MX_BLOCK = 32
MX_SCALE_BYTES = 1.0


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How one served model stores its decoder linears and which GEMM rate they run at."""

    name: str
    quantization: str
    group_size: int
    other_bytes: float  # embeddings, lm_head, norms, router: the 16-bit (or fp32) dtype
    gemm_dtype: str  # fp8 | int8 | bf16 | fp16 | fp32: the tensor-core rate the GEMMs run at
    dequant: bool  # int4/nf4: dequantized in the GEMM main loop (slower compute at large batch)

    def linear_bytes(self, k: float, n: float) -> float:
        """Bytes per weight of a K×N linear (payload + scales/zeros/indices)."""
        q = self.quantization
        g = k if self.group_size <= 0 else min(self.group_size, k)
        if q == "fp8":
            return 1.0 + 2 * FP32_SCALE / (k * n)
        if q == "int8":
            return 1.0 + FP32_SCALE / k
        if q == "awq":
            return INT4_BYTES + (SCALE_BYTES + ZERO_BYTES) / g
        if q == "gptq":
            return INT4_BYTES + (SCALE_BYTES + ZERO_BYTES) / g + G_IDX_BYTES / n
        if q == "nf4":
            return NF4_BYTES_PER_WEIGHT
        if q == "nvfp4":
            return INT4_BYTES + NVFP4_SCALE_BYTES / NVFP4_BLOCK
        if q == "mxfp4":
            return INT4_BYTES + MX_SCALE_BYTES / MX_BLOCK
        return self.other_bytes

    @property
    def experts_only(self) -> bool:
        """Whether only the routed experts are quantized (mxfp4, as gpt-oss ships)."""
        return self.quantization == "mxfp4"


def weight_format(weights_dtype: str, compute_dtype: str, quantization: str, group_size: int) -> WeightFormat:
    """The format of ``quantization`` on top of the policy's weight/compute dtypes."""
    other = DTYPE_BYTES[weights_dtype] if weights_dtype not in ("fp8",) else 2.0
    act = "bf16" if compute_dtype in ("fp8",) else compute_dtype
    if quantization == "none" and weights_dtype == "fp8":
        quantization = "fp8"
    if quantization == "fp8":
        return WeightFormat("fp8 W8A8 (per-tensor scales)", "fp8", group_size, other, "fp8", False)
    if quantization == "int8":
        return WeightFormat("int8 W8A8 (per-channel scales)", "int8", group_size, other, "int8", False)
    if quantization in ("awq", "gptq"):
        gs = "per-channel" if group_size <= 0 else f"g{group_size}"
        return WeightFormat(f"int4 {quantization.upper()} {gs} (fp16 scales, 4-bit zeros)", quantization,
                            group_size, other, act, True)
    if quantization == "nvfp4":
        return WeightFormat("NVFP4 W4A4 (E4M3 scale per 16)", "nvfp4", NVFP4_BLOCK, other, "fp4", False)
    if quantization == "mxfp4":
        return WeightFormat("MXFP4 experts (E8M0 scale per 32), other linears 16-bit", "mxfp4", MX_BLOCK, other,
                            act, True)
    if quantization == "nf4":
        return WeightFormat("NF4 bitsandbytes (double-quantized absmax)", "nf4", 64, other, act, True)
    return WeightFormat(weights_dtype, "none", group_size, other, compute_dtype, False)
