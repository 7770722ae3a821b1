"""Model states per GPU: weights, gradients, master weights, optimizer states and step temporaries.

Rules (bytes per parameter; P = parameters on this GPU, P_t = trainable ones):

* weights P·w in the policy's weight dtype; QLoRA keeps the decoder linears in NF4 (0.5 byte) plus
  block-wise quantization constants: one 8-bit absmax per 64 weights and, with double quantization,
  one fp32 constant per 256 absmax blocks — 0.5 + 1/64 + 4/(64·256) bytes (Dettmers et al. 2023,
  arXiv:2305.14314, §3 "Double Quantization": 0.5 -> 0.127 bits of constants per parameter);
* gradients P_t·g; an fp32 master copy 4·P_t when the policy keeps one (ZeRO paper's "2+2+12");
* optimizer states: AdamW 2 states; 8-bit AdamW (bitsandbytes, block size 256: see estimate/optimizers.py) 2·(1 + 4/256);
  SGD with momentum 1; Lion 1; Adafactor factored row+column fp32 statistics for matrices and a
  full second moment for vectors (Shazeer & Stern 2018, arXiv:1804.04235, Alg. 4);
* torch's default foreach AdamW allocates ``exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)``: one
  temporary as large as all trainable parameters in the state dtype (torch/optim/adamw.py
  ``_multi_tensor_adamw``; measured on torch 2.13: exactly 4.000 bytes/parameter in fp32); fused
  AdamW and the other optimizers update tensor by tensor. AdamW as a per-tensor loop (torch's
  foreach=False ``_single_tensor_adam``, Composer's DecoupledAdamW) builds its denominator as
  ``exp_avg_sq.sqrt() / c`` for one tensor at a time: two temporaries of the largest tensor
  (measured on torch 2.13: 2.000 × its state bytes; tests/unit/test_constants_optimizer_temps.py).
* sharding: TP divides every matrix (and the vocabulary-parallel embedding) by t (Shoeybi et al.
  2019); ZeRO-1/2/3 shard states / +gradients / +weights over the d data-parallel ranks
  (Rajbhandari et al. 2020, arXiv:1910.02054, Fig. 1: (2+2+K)Ψ, 2Ψ+2Ψ+KΨ/N_d, 2Ψ+(2+K)Ψ/N_d,
  (2+2+K)Ψ/N_d); EP divides routed experts by the EP degree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainledger.spec.model import ModelSpec
from trainledger.units import DTYPE_BYTES
from trainledger.estimate.optimizers import BNB_STATE_BYTES, STATES_PER_PARAM

FP32 = 4

NF4_BYTES = 0.5
#: QLoRA block-wise constants with double quantization (Dettmers et al. 2023, §3): 8-bit absmax per
#: 64-weight block plus one fp32 second-level constant per 256 blocks.
NF4_CONST_BYTES = 1 / 64 + 4 / (64 * 256)


def nbytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Per-ModelSpec quantities the memory model needs (computed once, cached)."""

    total: int
    embedding: int  # input embedding (+ learned positions)
    lm_head: int  # untied output projection (0 when tied)
    norms: int
    layers: int  # all decoder-layer parameters
    experts: int  # routed-expert parameters (all layers)
    max_layer: int  # largest decoder layer
    linear: int  # parameters autocast casts (every nn.Linear / F.linear weight and bias)
    matrix_rows_cols: int  # sum over matrices of rows + cols (Adafactor factored states)
    vector_params: int  # 1-D parameters (norms, biases)
    largest_param: int
    mlp_share: float  # MLP (or experts) share of a decoder layer's parameters


@lru_cache(maxsize=4096)
def model_shape(m: ModelSpec) -> ModelShape:
    """Closed-form per-model quantities, cached per ModelSpec."""
    pc = m.params
    bd = pc.breakdown
    norms = bd.get("norms", 0)
    emb = pc.embedding
    lm = bd.get("lm_head", 0)
    layers = sum(pc.per_layer)
    experts = bd.get("experts", 0)
    tied_head = 0 if lm else m.vocab_size * m.hidden_size
    linear = pc.total - emb - norms + tied_head
    # Adafactor factors every matrix (3-D expert stacks over their last two dims) into rows + cols
    from trainledger.spec.layers import layer_linears

    rc = 0
    for i in range(m.num_layers):
        for lin in layer_linears(m, i).values():
            rc += lin.count * (lin.in_features + lin.out_features)
    h = m.hidden_size
    rc += (m.vocab_size + h) * (1 if lm == 0 else 2)
    vectors = norms
    largest = max(m.vocab_size * h, max(m.intermediate_size, m.q_dim) * h)
    lp = m.layer_params(0)
    mlp_share = (lp.get("mlp", 0) + lp.get("experts", 0) + lp.get("shared_experts", 0)) / max(sum(lp.values()), 1)
    return ModelShape(mlp_share=mlp_share, total=pc.total, embedding=emb, lm_head=lm, norms=norms, layers=layers,
                      experts=experts, max_layer=max(pc.per_layer), linear=linear,
                      matrix_rows_cols=rc, vector_params=vectors, largest_param=largest)


def qlora_weight_bytes(n_quantized: int, n_other: int, other_bytes: float) -> float:
    """NF4 base weights with double-quantized constants, other parameters in ``other_bytes``."""
    return n_quantized * (NF4_BYTES + NF4_CONST_BYTES) + n_other * other_bytes


def optimizer_state_bytes(optimizer: str, n_trainable: float, state_bytes: float,
                          shape: ModelShape | None = None, frac: float = 1.0) -> float:
    """Optimizer state bytes for ``n_trainable`` parameters (see module docstring)."""
    if optimizer == "adamw-8bit":
        return n_trainable * STATES_PER_PARAM[optimizer] * BNB_STATE_BYTES
    if optimizer == "adafactor":
        if shape is None:
            return n_trainable * 4 * 0.01
        return 4 * (shape.matrix_rows_cols + shape.vector_params) * frac
    return n_trainable * STATES_PER_PARAM[optimizer] * state_bytes


def optimizer_temp_bytes(optimizer: str, n_trainable: float, state_bytes: float,
                         largest_param: float, param_bytes: float = 4.0) -> float:
    """Transient bytes of one ``optimizer.step()`` beyond the states (see module docstring)."""
    if optimizer == "adamw":
        return n_trainable * state_bytes
    if optimizer == "adamw-loop":  # sqrt, then its quotient, of one tensor at a time
        return 2 * state_bytes * min(largest_param, n_trainable)
    if optimizer == "adafactor":  # transformers Adafactor: grad**2 and the new update, fp32
        return 2 * FP32 * min(largest_param, n_trainable)
    if optimizer == "lion":  # one update tensor of the parameter's size at a time
        return param_bytes * min(largest_param, n_trainable)
    return 0.0
