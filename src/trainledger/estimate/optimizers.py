"""The one optimizer table: state tensors per trainable parameter and bytes per state element.

Read by the memory model (optimizer-state term), the time model (optimizer-step streaming) and the
run sections (checkpoint and host-RAM sizes). Sources:

* AdamW: ``exp_avg`` + ``exp_avg_sq`` (Loshchilov & Hutter 2019, arXiv:1711.05101, Algorithm 2).
* Lion: one momentum buffer (Chen et al. 2023, arXiv:2302.06675, Algorithm 1).
* SGD with momentum: one buffer; plain SGD: none.
* Adafactor: a factored second moment, O(rows + cols) per matrix (Shazeer & Stern 2018,
  arXiv:1804.04235, §3) — 0 per parameter here; the memory model counts the factors by shape.
* 8-bit AdamW (bitsandbytes ``AdamW8bit``): both states in 8 bits, quantized block-wise with one
  fp32 absmax per block. The paper evaluates B = 2048 (Dettmers et al. 2022, arXiv:2110.02861, §2);
  the bitsandbytes optimizers allocate one absmax per 256 elements
  (``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``: ``blocksize = 256``),
  which is what the process holds, so B = 256.
"""

from __future__ import annotations

from trainledger.units import DTYPE_BYTES

#: state tensors per trainable parameter
STATES_PER_PARAM: dict[str, int] = {
    "adamw": 2, "adamw-fused": 2, "adamw-loop": 2, "adamw-8bit": 2, "sgd": 0, "sgd-momentum": 1,
    "adafactor": 0, "lion": 1,
}

#: Operator dispatches per parameter tensor per optimizer step: each list op of a foreach optimizer
#: and each op of a per-tensor loop handles every parameter tensor once on the host (on a DTensor,
#: one sharding propagation and local op per tensor). Counted with a TorchDispatchMode over
#: ``step()`` on torch 2.13 (tests/unit/test_optimizer_dispatch.py counts them again), leaving out
#: the ops on the plain CPU ``step`` counters:
#: AdamW foreach (torch/optim/adam.py ``_multi_tensor_adam``, decoupled decay): mul_ (decay), lerp_,
#: mul_, addcmul_, sqrt, div_, add_ (eps), addcdiv_ = 8; fused (``torch._fused_adamw_``) 1; SGD
#: foreach add_ 1, with momentum mul_, add_, add_ = 3; Adafactor foreach (torch/optim/_adafactor.py)
#: 13 list ops + 6 per-tensor ops (4 vector norms, mm, mean) = 19; bitsandbytes 8-bit AdamW one
#: kernel per tensor (bitsandbytes/optim/optimizer.py ``Optimizer2State.update_step``) = 1; Lion
#: (lucidrains/lion-pytorch ``update_fn``, a per-tensor loop: mul_, clone, mul_, add, sign_, add_,
#: mul_, add_) = 8; AdamW as a per-tensor loop (torch ``_single_tensor_adam``, foreach=False, and
#: Composer's DecoupledAdamW.adamw, composer/optim/decoupled_weight_decay.py) runs the same 8 ops
#: tensor by tensor.
DISPATCHES_PER_TENSOR: dict[str, int] = {
    "adamw": 8, "adamw-fused": 1, "adamw-loop": 8, "adamw-8bit": 1, "sgd": 1, "sgd-momentum": 3,
    "adafactor": 19, "lion": 8,
}

#: Extra parameter-sized element accesses (reads + writes, per parameter per step) of the
#: optimizer's multi-kernel implementation over one fused pass (which reads weights, gradient and
#: states once and writes weights and states once: 3 + 2·states accesses). Each foreach list op is
#: its own kernel and streams its operands from HBM; temporaries (sqrt of the second moment, the
#: update) are written and read back. Counted with a TorchDispatchMode over ``step()`` on torch 2.13
#: from each op's schema (arguments it reads, arguments it writes; a tensor passed twice is loaded
#: once), 2-D parameters (tests/unit/test_optimizer_bytes.py counts them again):
#: AdamW foreach: mul_ (decay) 2, lerp_ 3, mul_ 2, addcmul_(v, g, g) 3, sqrt 2, div_ 2, add_ 2,
#: addcdiv_ 4 = 20 vs fused 7 -> 13; SGD foreach add_ 3 vs 3 -> 0; with momentum mul_ 2, add_ 3,
#: add_ 3 = 8 vs 5 -> 3; Adafactor foreach (torch/optim/_adafactor.py, factored 2-D path): row and
#: column norms of the gradient 2, mm 1, div_ 2, clamp_min_ 2, rsqrt_ 2, mul_ 3, update norm 1,
#: mul_ 2, add_ 3 = 19 vs 3 -> 16; Lion (lucidrains/lion-pytorch ``update_fn``: mul_ 2, clone 2,
#: mul_ 2, add 3, sign_ 2, add_ 3, mul_ 2, add_ 3 = 19 vs 5, counted by hand) -> 14; fused AdamW
#: and bitsandbytes' 8-bit AdamW (one kernel) 0; AdamW's per-tensor loop, the same ops as foreach, 13. Stacks whose ``adamw`` is their own fused Adam
#: (DeepSpeed, Megatron: ``adamw_kernel: fused``) pay none for it.
FOREACH_EXTRA_ACCESSES: dict[str, int] = {
    "adamw": 13, "adamw-fused": 0, "adamw-loop": 13, "adamw-8bit": 0, "sgd": 0, "sgd-momentum": 3,
    "adafactor": 16, "lion": 14,
}

#: bitsandbytes block size of the 8-bit optimizer states (one fp32 absmax per block; see docstring)
BNB_BLOCK = 256

#: bytes per state element of the 8-bit optimizers: 1 byte plus the block's fp32 absmax share
BNB_STATE_BYTES = 1 + 4 / BNB_BLOCK


def bytes_per_state(optimizer: str, states_dtype: str) -> float:
    """Bytes one optimizer-state element takes: the policy's states dtype, or 8-bit blocks."""
    if optimizer == "adamw-8bit":
        return BNB_STATE_BYTES
    return float(DTYPE_BYTES[states_dtype])


def state_bytes_per_param(optimizer: str, states_dtype: str) -> float:
    """Optimizer-state bytes per trainable parameter (Adafactor's factors are counted by shape)."""
    return STATES_PER_PARAM[optimizer] * bytes_per_state(optimizer, states_dtype)
