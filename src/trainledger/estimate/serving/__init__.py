"""Serving: inference memory as engines hold it, latency and throughput, cost per token (issue 16).

* :mod:`.quant` — weight formats (bf16/fp16, fp8, int8, AWQ/GPTQ int4 with group scales and zeros, NF4);
* :mod:`.kv` — KV bytes per token on one GPU (TP split, replicated KV heads, MLA latent, windows, PP);
* :mod:`.engine` — engine defaults (vLLM, SGLang, TensorRT-LLM, transformers) from catalog/serving;
* :mod:`.memory` — the engine's KV-pool accounting: max concurrency and longest context;
* :mod:`.perf` — prefill, decode, TTFT, TPOT, tokens/s over concurrency (roofline per GEMM);
* :mod:`.section` — the Estimate's ``serving`` section and the engine memory section.
"""

from trainledger.estimate.serving.memory import EngineMemory, engine_memory
from trainledger.estimate.serving.perf import ServingPerf
from trainledger.estimate.serving.section import NOT_MODELLED, ServingEstimate, memory_estimate, serving_section

__all__ = ["EngineMemory", "engine_memory", "ServingPerf", "ServingEstimate", "serving_section",
           "memory_estimate", "NOT_MODELLED"]
