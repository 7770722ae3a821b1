"""Serving memory as the engines hold it: weights, profile-run activations, CUDA graphs, KV pool.

vLLM V1 (vllm/v1/worker/gpu_worker.py ``determine_available_memory``; docs
configuration/conserving_memory.md) sizes its KV pool once at start-up:

    requested    = gpu_memory_utilization × total device memory
    available KV = requested − (weights + torch peak of the profile run + non-torch increase
                   [+ CUDA-graph pool, counted by recent versions])
    blocks       = available KV // (block_size × bytes per token and layer × layers)
                   (vllm/v1/core/kv_cache_utils.py ``get_num_blocks``)
    max concurrency for a context of n tokens = blocks / cdiv(n, block_size)
                   (``get_max_concurrency_for_kv_cache_config``; logged at start-up as
                   "Maximum concurrency for n tokens per request: X")

The profile run is one forward of ``max_num_batched_tokens`` tokens plus a sampler run over
``max_num_seqs`` rows of logits. SGLang sizes its token pool as ``mem_fraction_static`` × total −
weights (python/sglang/srt/model_executor/model_runner.py ``profile_max_num_token``);
TensorRT-LLM gives ``free_gpu_memory_fraction`` of the memory left after weights and activations
to the KV cache (docs reference/memory.md).

Activation working set of a forward over T tokens (c = activation bytes, t = TP): the residual,
hidden and norm output (3·h·c per token), the MLP's merged gate|up output and SiLU·mul output
(3·f/t·c; vLLM ``MergedColumnParallelLinear`` + ``SiluAndMul``), or for MoE the fused_moe caches
``intermediate_cache1/2/3`` (k·(2·f_e + f_e)/t + k·h)·c plus fp32 router logits
(vllm/model_executor/layers/fused_moe/fused_moe.py). Sampler: fp32 logits over the full
vocabulary and two same-sized temporaries (softmax probabilities and the top-k/top-p sort;
vllm/v1/sample/sampler.py) per running sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trainledger.spec.model import ModelSpec
from trainledger.spec.plan import Plan
from trainledger.units import DTYPE_BYTES
from trainledger.estimate.time.compute import layer_kinds
from trainledger.estimate.memory.device import runtime_defaults
from trainledger.estimate.memo import last_call
from trainledger.estimate.serving.engine import EngineSettings, capture_summary, resolve
from trainledger.estimate.serving.kv import KvLayout, kv_dtype, kv_layout, stage_layers
from trainledger.estimate.serving.quant import WeightFormat, weight_format

FP32 = 4.0
#: sampler copies of the fp32 logits: the logits, the softmax probabilities, the top-k/top-p sort
SAMPLER_COPIES = 3


@dataclass
class EngineMemory:
    """Per-GPU memory of one serving plan under one engine (bytes)."""

    engine: str
    weights: float
    weight_format: str
    activations: float
    cuda_graphs: float
    non_torch: float
    cuda_context: float
    requested: float
    kv_pool: float
    kv: KvLayout
    block_size: int
    block_bytes: float
    num_blocks: int
    max_model_len: int
    batch: int
    batch_kv: float
    max_concurrency: float  # sequences of max_model_len the pool holds (vLLM's log line)
    max_num_seqs: int
    longest_context: int
    notes: list[str] = field(default_factory=list)

    @property
    def concurrency(self) -> int:
        """Sequences of max_model_len that run at once: the KV pool's limit and max_num_seqs."""
        return int(min(math.floor(self.max_concurrency), self.max_num_seqs))

    def steady_concurrency(self, prompt: float, out: float) -> int:
        """Sequences running at once in the steady state of continuous batching.

        Engines allocate KV blocks as sequences grow (vLLM ``KVCacheManager.allocate_slots``,
        TensorRT-LLM on-demand block allocation), so with requests at uniformly spread stages a
        sequence holds on average the blocks of s_in + s_out/2 tokens; the pool, not
        max_model_len, bounds the running count, and max_num_seqs caps it.
        """
        per_seq = self.kv.sequence_bytes(int(math.ceil(prompt + out / 2.0)), self.block_size)
        fit = (self.num_blocks * self.block_bytes) / per_seq if per_seq else 0.0
        return int(max(0, min(math.floor(fit), self.max_num_seqs)))

    @property
    def fits(self) -> bool:
        return self.kv_pool > 0 and self.batch_kv <= self.kv_pool

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "weights_bytes": int(self.weights), "weight_format": self.weight_format,
            "activations_bytes": int(self.activations), "cuda_graphs_bytes": int(self.cuda_graphs),
            "non_torch_bytes": int(self.non_torch), "cuda_context_bytes": int(self.cuda_context),
            "requested_bytes": int(self.requested), "kv_pool_bytes": int(self.kv_pool),
            "kv_dtype": self.kv.dtype, "kv_bytes_per_token": self.kv.bytes_per_token,
            "kv_heads_per_rank": self.kv.heads_per_rank, "kv_replicated_over_tp": self.kv.replicated,
            "mla_latent": self.kv.latent, "block_size": self.block_size, "block_bytes": int(self.block_bytes),
            "num_blocks": self.num_blocks, "max_model_len": self.max_model_len,
            "batch": self.batch, "batch_kv_bytes": int(self.batch_kv),
            "max_concurrency": self.max_concurrency, "max_num_seqs": self.max_num_seqs,
            "concurrency": self.concurrency, "longest_context": self.longest_context, "fits": self.fits,
            "notes": list(self.notes),
        }


def served_format(plan: Plan) -> WeightFormat:
    pol = plan.recipe.policy
    return weight_format(pol["weights"], pol["compute"], plan.serving.quantization, plan.serving.quant_group_size)


def act_bytes(plan: Plan) -> float:
    """Bytes of one activation element (bf16/fp16 compute; fp8 GEMMs still pass 16-bit activations)."""
    c = plan.recipe.policy["compute"]
    return 4.0 if c == "fp32" else 2.0


def weight_bytes(plan: Plan, fmt: WeightFormat | None = None) -> float:
    """Weights on the busiest GPU: decoder linears (quantized), embedding/lm_head and norms.

    TP splits column/row-parallel linears and the vocabulary (Shoeybi et al. 2019, arXiv:1909.08053,
    §3; vLLM ``VocabParallelEmbedding``/``ParallelLMHead``); routers are replicated; PP puts
    ceil(L/p) layers on a stage and the larger of embedding and lm_head on the end stage.
    """
    return _weight_bytes(plan.model, fmt or served_format(plan), plan.layout.tp, plan.layout.pp)


@lru_cache(maxsize=4096)  # per (model, format, tp, pp): the serving suggestions ask for several variants
def _weight_bytes(m: ModelSpec, fmt: WeightFormat, t: int, p: int) -> float:
    frac = math.ceil(m.num_layers / p) / m.num_layers
    total = 0.0
    for kind in layer_kinds(m):
        per_layer = 0.0
        for g in kind.gemms:
            n_mat = max(g.experts, 1)
            div = 1 if g.split == "none" else t
            per = g.k * g.n * n_mat / div
            plain = g.name == "router" or (fmt.experts_only and not g.experts)
            per_layer += per * (fmt.other_bytes if plain else fmt.linear_bytes(g.k, g.n))
        total += kind.count * per_layer * frac
    bd = m.params.breakdown
    emb = m.params.embedding
    head = bd.get("lm_head", 0)
    ends = emb + head if p == 1 else max(emb, head or emb)
    norms = bd.get("norms", 0) * frac
    return total + ends * fmt.other_bytes / t + norms * fmt.other_bytes


def forward_working_set(plan: Plan, tokens: float) -> float:
    """Transient activation bytes of one forward over ``tokens`` tokens (module docstring)."""
    m, t = plan.model, plan.layout.tp
    c = act_bytes(plan)
    h = m.hidden_size
    if m.mla is not None:
        x = m.mla
        attn = m.num_heads / t * (2 * (x.qk_nope_head_dim + x.qk_rope_head_dim) + x.v_head_dim)
    else:
        attn = (m.q_dim + 2 * max(1, m.num_kv_heads // t) * m.head_dim * t) / t + m.q_dim / t
    mlp = 3 * m.intermediate_size / t
    if m.moe is not None:
        e = m.moe
        moe = e.top_k * (3 * e.expert_intermediate_size / t + h) + e.num_experts * FP32 / c
        moe += 3 * e.shared_intermediate_size / t
        mlp = max(mlp, moe)
    return tokens * c * (3 * h + max(attn, mlp))


def sampler_bytes(plan: Plan, rows: float) -> float:
    """fp32 logits over the whole vocabulary and the sampler's temporaries, per running sequence."""
    return rows * plan.model.vocab_size * FP32 * SAMPLER_COPIES


@last_call
def engine_memory(plan: Plan) -> EngineMemory:
    """The engine's memory accounting for ``plan`` (module docstring).

    Remembered for the last plan object (``memo.last_call``): the memory section and the serving
    section of one estimate ask in turn (callers read the result, never change it)."""
    return _engine_memory(plan)


def _engine_memory(plan: Plan) -> EngineMemory:
    es = resolve(plan)
    m, lay, gpu = plan.model, plan.layout, plan.cluster.gpu
    fmt = served_format(plan)
    w = weight_bytes(plan, fmt)
    kv = kv_layout(m, lay.tp, lay.pp, kv_dtype(plan.serving.kv_cache_dtype, plan.recipe.policy["compute"]), es.latent)
    if es.static_batch:  # static batching (transformers generate, TensorRT-LLM <= 0.6): the batch's prefill
        T = plan.recipe.micro_batch * plan.recipe.seq_len
        rows = plan.recipe.micro_batch
    else:  # the profile run: one step of max_num_batched_tokens, a sampler over max_num_seqs rows
        T = es.max_num_batched_tokens
        rows = min(es.max_num_seqs, T)
    acts = max(forward_working_set(plan, T), sampler_bytes(plan, rows) + T * m.hidden_size * act_bytes(plan))
    graphs = 0.0
    notes: list[str] = []
    if es.cuda_graphs:
        n_sizes, largest = capture_summary(es.max_num_seqs, es.cuda_graph_max_batch)
        graphs = forward_working_set(plan, largest) + n_sizes * es.cuda_graph_bytes_per_graph
    rt = runtime_defaults()
    context = float(rt.context_bytes)
    total = float(gpu.usable_bytes)  # the CUDA total (vLLM: torch.cuda.mem_get_info()[1] x the fraction)
    requested = es.gpu_memory_utilization * total
    if es.kv_budget == "fraction_minus_weights":  # SGLang: activations and graphs live outside the fraction
        pool = requested - w
    elif es.kv_budget == "fraction_of_free":  # TensorRT-LLM: a fraction of what is free after loading
        pool = es.gpu_memory_utilization * (total - context - w - acts - es.non_torch_bytes)
    else:
        pool = vllm_kv_pool(total, es.gpu_memory_utilization, w, acts, es.non_torch_bytes, graphs)
    pool = max(pool, 0.0)
    B = es.block_size
    num_blocks, block_bytes, max_conc = pool_concurrency(kv, pool, es.max_model_len, B)
    seq = kv.sequence_bytes(es.max_model_len, B)
    longest = _longest(kv, num_blocks * block_bytes, B)
    longest = min(longest, m.max_position_embeddings) if plan.serving.max_model_len is None else longest
    b = plan.recipe.micro_batch
    batch_kv = b * seq
    if requested + context > total and es.engine != "hf":
        notes.append(f"gpu_memory_utilization {es.gpu_memory_utilization:g} leaves no room for the CUDA "
                     f"context outside the engine's share; the engine fails at start-up — lower it")
    if es.max_model_len > m.max_position_embeddings:
        notes.append(f"max_model_len {es.max_model_len} exceeds the model's {m.max_position_embeddings} "
                     f"positions (vLLM refuses it without rope scaling)")
    if pool <= 0:
        notes.append("no memory is left for the KV cache: weights and activations take the engine's whole "
                     "share; use more TP, quantized weights, or a larger GPU")
    return EngineMemory(
        engine=es.engine, weights=w, weight_format=fmt.name, activations=acts, cuda_graphs=graphs,
        non_torch=es.non_torch_bytes, cuda_context=context, requested=requested, kv_pool=pool, kv=kv,
        block_size=B, block_bytes=block_bytes, num_blocks=num_blocks, max_model_len=es.max_model_len,
        batch=b, batch_kv=batch_kv, max_concurrency=max_conc, max_num_seqs=es.max_num_seqs,
        longest_context=int(longest), notes=notes,
    )


def pool_concurrency(kv: KvLayout, pool: float, max_model_len: int, block: int) -> tuple[int, float, float]:
    """(blocks, bytes per block over the stage's layers, max concurrency) of a KV pool.

    blocks = pool // (block × per-token bytes × layers) (vllm/v1/core/kv_cache_utils.py
    ``get_num_blocks``); concurrency = blocks / cdiv(max_model_len, block)
    (``get_max_concurrency_for_kv_cache_config``; vLLM V0: blocks × block / max_model_len).
    """
    block_bytes = kv.bytes_per_token_layer * block * (kv.full_layers + kv.sliding_layers)
    blocks = int(pool // block_bytes) if block_bytes else 0
    seq = kv.sequence_bytes(max_model_len, block)
    return blocks, block_bytes, (blocks * block_bytes) / seq if seq else 0.0


def vllm_kv_pool(total: float, utilization: float, weights: float, activation_peak: float,
                 non_torch: float, cuda_graphs: float = 0.0) -> float:
    """vLLM's KV budget: utilization × total − weights − activation peak − non-torch [− graphs]
    (vllm/v1/worker/gpu_worker.py ``determine_available_memory``)."""
    return utilization * total - weights - activation_peak - non_torch - cuda_graphs


def _longest(kv: KvLayout, pool: float, block: int) -> int:
    """Tokens one sequence can hold in ``pool`` bytes (sliding layers stop growing at the window)."""
    full_rate = kv.bytes_per_token_layer * kv.full_layers
    if kv.window is not None and kv.sliding_layers:
        slid = kv.bytes_per_token_layer * kv.sliding_layers * math.ceil((kv.window + block) / block) * block
        if full_rate <= 0:
            return 10**9 if pool >= slid else int(pool / (kv.bytes_per_token_layer * kv.sliding_layers))
        if pool > slid:
            return int((pool - slid) / full_rate) // block * block
    rate = kv.bytes_per_token
    return int(pool / rate) // block * block if rate else 0


def dtype_bytes(name: str) -> float:
    return DTYPE_BYTES[name]


__all__ = ["EngineMemory", "engine_memory", "weight_bytes", "forward_working_set", "served_format",
           "stage_layers", "EngineSettings"]
