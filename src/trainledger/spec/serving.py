"""Serving: how an inference job is served — engine, weight quantization, KV cache, load and SLOs.

Read only when ``recipe.method == "inference"``. The batch of an inference plan is
``micro_batch`` concurrent sequences of ``seq_len`` prompt tokens and ``generate_len`` output
tokens; everything engine-specific (vLLM, SGLang, TensorRT-LLM, or transformers ``generate``) is
here. ``None`` means: the engine's own default (catalog/serving/engines.yaml, with its source).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainledger.spec.base import Spec

Engine = Literal["vllm", "sglang", "trtllm", "trtllm-0.6", "hf"]
Quantization = Literal["none", "fp8", "int8", "awq", "gptq", "nf4", "nvfp4", "mxfp4"]
KvCacheDtype = Literal["auto", "bf16", "fp16", "fp8"]

ENGINES: tuple[str, ...] = Engine.__args__  # type: ignore[attr-defined]
QUANTIZATIONS: tuple[str, ...] = Quantization.__args__  # type: ignore[attr-defined]
#: what a job may ask for: a format, or ``auto`` = the checkpoint's own (load.plan.serving_of)
QuantizationInput = Literal[("auto", *QUANTIZATIONS)]  # type: ignore[valid-type]
KV_CACHE_DTYPES: tuple[str, ...] = KvCacheDtype.__args__  # type: ignore[attr-defined]


class Serving(Spec):
    """Serving-engine settings and the load/SLO of an inference plan."""

    engine: Engine = Field("vllm", description="serving engine whose memory accounting and kernels are modeled "
                           "(hf = transformers generate with DynamicCache, what `verify memory` runs)")
    quantization: Quantization = Field(
        "none", description="weight quantization: fp8 (W8A8 per-tensor), int8 (W8A8 per-channel), awq/gptq "
        "(int4 weights, group-wise scales+zeros), nf4 (bitsandbytes), nvfp4 (FP4 W4A4, Blackwell), mxfp4 "
        "(MoE experts only, as gpt-oss checkpoints ship); "
        "none = the precision's dtype")
    quant_group_size: int = Field(128, ge=-1, le=65536, description="awq/gptq group size (-1 = per channel)")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="KV cache dtype; auto = the compute dtype")
    mla_latent_cache: bool | None = Field(
        None, description="MLA models: cache the compressed latent (kv_lora_rank + rope dim) per token "
        "instead of per-head K and V [engines: on; hf: off]")
    block_size: int | None = Field(None, gt=0, le=65536, description="tokens per paged KV block [engine default]")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0,
                                          description="share of GPU memory the engine may use (vLLM/SGLang)")
    max_num_seqs: int | None = Field(None, gt=0, le=1_000_000, description="max concurrent sequences [engine default]")
    max_num_batched_tokens: int | None = Field(None, gt=0, le=10_000_000,
                                               description="tokens per engine step (chunked prefill) [engine default]")
    max_model_len: int | None = Field(None, gt=0, le=100_000_000,
                                      description="context limit per sequence [seq_len + generate_len]")
    cuda_graphs: bool = Field(True, description="decode runs captured CUDA graphs (vLLM: not --enforce-eager)")
    requests_per_s: float | None = Field(None, gt=0, le=1e7, description="offered load, requests per second")
    ttft_p50_s: float | None = Field(None, gt=0, description="SLO: median time to first token, seconds")
    ttft_p99_s: float | None = Field(None, gt=0, description="SLO: 99th-percentile time to first token, seconds")
    tpot_p50_s: float | None = Field(None, gt=0, description="SLO: median time per output token, seconds")
    tpot_p99_s: float | None = Field(None, gt=0, description="SLO: 99th-percentile time per output token, seconds")

    @property
    def paged(self) -> bool:
        return self.engine != "hf"
