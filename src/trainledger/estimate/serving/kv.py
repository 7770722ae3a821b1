"""KV cache bytes per token on one GPU, as serving engines hold them.

Symbols: L layers on the GPU's pipeline stage, k KV heads, d head dim, a query heads, t TP degree,
b bytes per cached element (the KV dtype), w sliding window, B block size (tokens per page).

* GQA/MHA (Ainslie et al. 2023, arXiv:2305.13245): 2·k_t·d·b per token and layer, where the KV
  heads of one rank are k_t = max(1, k // t): with fewer KV heads than TP ranks each head is
  replicated (vLLM ``ModelConfig.get_num_kv_heads``: ``max(1, total_num_kv_heads // tp)``; the
  same rule in SGLang ``get_num_kv_heads`` and TensorRT-LLM ``num_kv_heads_per_rank``).
* MLA latent (DeepSeek-V2, Liu et al. 2024, arXiv:2405.04434, §2.1.2 and Table 1: (d_c + d_h^R)·l
  elements per token): (kv_lora_rank + qk_rope_head_dim)·b per token and layer. The latent is shared
  by all heads, so TP does not split it: every rank holds the whole latent (vLLM MLA backends use one
  KV "head" of size kv_lora_rank + rope dim on every rank, vllm/model_executor/layers/mla.py).
* MLA expanded (transformers DynamicCache, engines with the latent cache off): per-head keys and
  values, a/t·(d_nope + d_rope + d_v)·b.
* sliding-window layers hold at most w + B tokens per sequence (vLLM V1 hybrid KV cache manager,
  ``SlidingWindowManager``: blocks outside the window are freed; one partial block stays).
* pipeline parallelism: the busiest stage holds ceil(L/p) layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from trainledger.spec.model import ModelSpec
from trainledger.units import DTYPE_BYTES


@dataclass(frozen=True, slots=True)
class KvLayout:
    """Bytes of one cached token on one GPU, split by layer kind."""

    bytes_per_token_layer: float  # one token, one layer
    full_layers: float  # layers on the stage with full attention
    sliding_layers: float  # layers on the stage with a window
    window: int | None
    latent: bool
    heads_per_rank: int  # KV heads (GQA) on one rank; 1 for the MLA latent
    replicated: bool  # KV heads replicated over TP (k < t, or the MLA latent)
    dtype: str

    @property
    def bytes_per_token(self) -> float:
        """One token in every layer of the stage (full and sliding layers alike)."""
        return self.bytes_per_token_layer * (self.full_layers + self.sliding_layers)

    def sequence_bytes(self, ctx: int, block: int) -> float:
        """KV bytes one sequence of ``ctx`` tokens holds, rounded up to whole blocks per layer."""
        full = math.ceil(ctx / block) * block
        slid = full
        if self.window is not None:
            slid = min(full, math.ceil((self.window + block) / block) * block)
        return self.bytes_per_token_layer * (self.full_layers * full + self.sliding_layers * slid)


def kv_dtype(kv_cache_dtype: str, compute: str) -> str:
    """The cached element type: the user's choice, else the compute dtype (fp8 compute keeps bf16 KV)."""
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return "bf16" if compute == "fp8" else compute


@lru_cache(maxsize=1024)  # a pure function of the (frozen, hashable) spec: once per model and pp
def stage_layers(m: ModelSpec, pp: int) -> tuple[float, float]:
    """(full-attention layers, sliding layers) on the busiest of ``pp`` stages."""
    n = math.ceil(m.num_layers / pp)
    n_slide = sum(1 for i in range(m.num_layers) if m.is_sliding_layer(i)) * n / m.num_layers
    if m.sliding_window is None:
        n_slide = 0.0
    return n - n_slide, n_slide


def kv_layout(m: ModelSpec, tp: int, pp: int, dtype: str, latent: bool) -> KvLayout:
    """The KV cache geometry of ``m`` on one GPU of a tp × pp layout (see the module docstring)."""
    b = DTYPE_BYTES[dtype]
    full, slide = stage_layers(m, pp)
    if m.mla is not None:
        x = m.mla
        if latent:
            per = (x.kv_lora_rank + x.qk_rope_head_dim) * b
            return KvLayout(per, full, slide, m.sliding_window, True, 1, tp > 1, dtype)
        heads = max(1, m.num_heads // tp)
        per = heads * (x.qk_nope_head_dim + x.qk_rope_head_dim + x.v_head_dim) * b
        return KvLayout(per, full, slide, m.sliding_window, False, heads, False, dtype)
    heads = max(1, m.num_kv_heads // tp)
    per = 2 * heads * m.head_dim * b
    return KvLayout(per, full, slide, m.sliding_window, False, heads, m.num_kv_heads < tp, dtype)
