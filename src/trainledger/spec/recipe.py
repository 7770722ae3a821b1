"""Recipe: how a job trains — method, precision policy, optimizer, batch and recomputation."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator

from trainledger.spec.base import Spec

Method = Literal["pretrain", "full", "lora", "qlora", "inference"]
Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "fp8-mixed", "mxfp8-mixed", "nvfp4-mixed", "bf16", "fp16"]
Optimizer = Literal["adamw", "adamw-fused", "adamw-loop", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]
Recompute = Literal["none", "selective", "full"]
Attention = Literal["sdpa", "flash", "flash1", "cudnn", "eager"]

METHODS: tuple[str, ...] = Method.__args__  # type: ignore[attr-defined]
PRECISIONS: tuple[str, ...] = Precision.__args__  # type: ignore[attr-defined]
OPTIMIZERS: tuple[str, ...] = Optimizer.__args__  # type: ignore[attr-defined]
RECOMPUTES: tuple[str, ...] = Recompute.__args__  # type: ignore[attr-defined]
ATTENTIONS: tuple[str, ...] = Attention.__args__  # type: ignore[attr-defined]

#: What each precision policy keeps in which dtype.
#: ``bf16-mixed`` is ``Trainer(bf16=True)``: fp32 weights, grads and optimizer states, bf16 autocast.
#: ``bf16`` is pure bf16: weights, gradients and optimizer states all bf16.
#: ``fp8-mixed`` is Transformer-Engine style: fp8 matmuls, bf16 elsewhere, fp32 master + states.
#: ``mxfp8-mixed`` and ``nvfp4-mixed`` are the block-scaled Transformer Engine recipes of Blackwell
#: (TE ``MXFP8BlockScaling`` and ``NVFP4BlockScaling``): the linear layers' GEMMs run in the
#: block-scaled dtype named by ``gemm`` (units.DTYPE_BYTES gives its bytes with the scales), every
#: other op in bf16 (``compute``: ``fp8`` means "16-bit activations, low-precision GEMMs", as for
#: fp8-mixed). Weights are bf16 with an fp32 master copy, and weight gradients fp32: Megatron turns
#: on ``accumulate_allreduce_grads_in_fp32`` with ``--bf16`` (megatron/training/arguments.py), and the
#: NVFP4 recipe keeps the main weights, weight gradients and optimizer states in FP32 (arXiv:2509.25149).
#: Each quantized weight copy that a linear layer saves for its backward is a memory term
#: (estimate/memory/model.py ``model_states``).
PRECISION_POLICY: dict[str, dict[str, str]] = {
    "fp32": {"weights": "fp32", "compute": "fp32", "grads": "fp32", "master": "none", "states": "fp32"},
    "bf16-mixed": {"weights": "fp32", "compute": "bf16", "grads": "fp32", "master": "none", "states": "fp32"},
    "fp16-mixed": {"weights": "fp32", "compute": "fp16", "grads": "fp32", "master": "none", "states": "fp32"},
    "fp8-mixed": {"weights": "bf16", "compute": "fp8", "grads": "bf16", "master": "fp32", "states": "fp32"},
    "mxfp8-mixed": {"weights": "bf16", "compute": "fp8", "gemm": "mxfp8", "grads": "fp32", "master": "fp32",
                    "states": "fp32"},
    "nvfp4-mixed": {"weights": "bf16", "compute": "fp8", "gemm": "nvfp4", "grads": "fp32", "master": "fp32",
                    "states": "fp32"},
    "bf16": {"weights": "bf16", "compute": "bf16", "grads": "bf16", "master": "none", "states": "bf16"},
    "fp16": {"weights": "fp16", "compute": "fp16", "grads": "fp16", "master": "none", "states": "fp16"},
}

#: Inference serves in the policy's 16-bit (or 8-bit) dtype: nobody serves fp32 weights under
#: autocast. ``bf16-mixed`` loads bf16 weights (vLLM ``--dtype auto`` takes the checkpoint's bf16;
#: transformers ``from_pretrained(torch_dtype="auto")``), ``fp8-mixed`` fp8 weights (vLLM
#: ``--quantization fp8``: W8A8, docs/features/quantization/fp8.md), ``fp32`` stays fp32 when asked.
INFERENCE_POLICY: dict[str, dict[str, str]] = {
    "fp32": PRECISION_POLICY["fp32"],
    "bf16-mixed": PRECISION_POLICY["bf16"], "bf16": PRECISION_POLICY["bf16"],
    "fp16-mixed": PRECISION_POLICY["fp16"], "fp16": PRECISION_POLICY["fp16"],
    "fp8-mixed": {"weights": "fp8", "compute": "fp8", "grads": "bf16", "master": "none", "states": "bf16"},
    # training recipes only: a plan refuses them for inference (spec/precision.py check_precision)
    "mxfp8-mixed": PRECISION_POLICY["bf16"], "nvfp4-mixed": PRECISION_POLICY["bf16"],
}

#: block-scaled GEMM recipes -> the dtype their linear-layer GEMMs run in
BLOCK_SCALED: dict[str, str] = {"mxfp8-mixed": "mxfp8", "nvfp4-mixed": "nvfp4"}
#: NVFP4 recipe: share of the decoder layers whose linear layers stay in bf16. arXiv:2509.25149
#: (selective high-precision layers): the 12B model keeps its first two and last eight of 62
#: blocks in BF16, about 16% of the linear layers, most of them at the end of the network.
NVFP4_BF16_LAYERS_OF: tuple[int, int] = (10, 62)

StatesDtype = Literal["fp32", "bf16", "fp16"]


@lru_cache(maxsize=64)
def _with_states(precision: str, states: str) -> dict[str, str]:
    """The training policy of ``precision`` with its optimizer states in ``states`` (one dict per pair)."""
    return {**PRECISION_POLICY[precision], "states": states}


DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Recipe(Spec):
    """How the job trains. Sizes are per GPU unless named global."""

    method: Method = Field("full", description="training method: pretrain, full fine-tune, lora, qlora, inference")
    precision: Precision = Field("bf16-mixed", description="precision policy (recipe.PRECISION_POLICY)")
    optimizer: Optimizer = Field("adamw", description="optimizer (adamw = torch's foreach AdamW; adamw-loop = a per-tensor loop: torch AdamW(foreach=False), Composer's DecoupledAdamW)")
    seq_len: int = Field(4096, gt=0, le=10_000_000, description="sequence length in tokens (s)")
    doc_len: int | None = Field(
        None, gt=0, le=10_000_000, description="packed sequences: mean length in tokens of the documents "
        "packed into each sequence, attended to one by one (flash varlen / cu_seqlens, TE THD, NeMo packed "
        "SFT, TRL padding_free); attention work per token follows it instead of --seq-len [one document "
        "per sequence]")
    micro_batch: int = Field(1, gt=0, le=1_000_000, description="samples per GPU per forward pass (b)")
    grad_accum: int = Field(1, gt=0, le=1_000_000, description="micro-batches per optimizer step")
    global_batch: int | None = Field(
        None, gt=0, description="samples per optimizer step over all DP ranks (derived when None)"
    )
    recompute: Recompute = Field("none", description="activation recomputation (full = HF gradient checkpointing)")
    recompute_layers: int | None = Field(
        None, ge=0, description="with --recompute full: only this many layers are checkpointed [all]"
    )
    attention: Attention = Field("sdpa", description="attention kernel (sdpa/flash keep no s×s scores; "
                                 "flash1: a FlashAttention-1-generation kernel - FA1, Triton FA, xformers; "
                                 "cudnn: cuDNN's fused attention - Transformer Engine's DotProductAttention, "
                                 "NeMo AutoModel's attn: te, torch SDPA's cuDNN backend - at its own rate "
                                 "on every stack)")
    lora_rank: int = Field(16, gt=0, le=65536, description="LoRA rank")
    lora_alpha: float = Field(32.0, gt=0, allow_inf_nan=False, description="LoRA alpha (scaling only; no memory effect)")
    lora_targets: tuple[str, ...] = Field(DEFAULT_LORA_TARGETS, description="comma-separated module names LoRA wraps [all linear]")
    train_tokens: float | None = Field(None, gt=0, allow_inf_nan=False, description="token budget of the whole run")
    generate_len: int = Field(0, ge=0, le=10_000_000, description="inference: new tokens per sequence beyond --seq-len")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="attention/hidden dropout probability")
    grad_clip: float | None = Field(1.0, description="max grad norm (None = no clipping)")
    moe_capacity_factor: float | None = Field(
        None, gt=0, le=64, allow_inf_nan=False, description="MoE expert capacity factor: an expert takes at "
        "most this many times its mean share of the routed tokens, the rest are dropped (GShard; Megatron "
        "--moe-expert-capacity-factor, DeepSpeed-MoE capacity_factor) [none: dropless]")
    moe_pad_to_capacity: bool = Field(
        False, description="MoE: every expert's input padded to its capacity (Megatron "
        "--moe-pad-expert-input-to-capacity; DeepSpeed-MoE's einsum dispatch always pads): the experts "
        "compute, and the all-to-all moves, the capacity whatever the routing")
    optimizer_states_dtype: StatesDtype | None = Field(
        None, description="dtype of the optimizer's state tensors (AdamW's two moments): bf16 = Megatron-Core's "
        "precision-aware optimizer (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype "
        "bf16; Megatron-Bridge exp_avg_dtype / exp_avg_sq_dtype), torchtitan's fused_opt_states_bf16; on "
        "megatron-core a stated dtype is the precision-aware optimizer, which also keeps only the 16-bit "
        "remainders of the fp32 master weights [the precision policy's: fp32, bf16 under --precision bf16]")
    fp4_bf16_layers: int | None = Field(
        None, ge=0, le=10_000, description="--precision nvfp4-mixed: decoder layers whose linear layers stay "
        "in bf16 [16% of the layers, rounded up, as arXiv:2509.25149 keeps 10 of 62]")

    def expert_load(self, imbalance: float) -> float:
        """The busiest EP rank's routed tokens relative to the mean, given the routing's own
        ``imbalance``: uncapped (dropless), capped at the capacity factor (tokens beyond an
        expert's capacity are dropped: Lepikhin et al. 2020, GShard, arXiv:2006.16668 §2.2), or
        exactly the capacity when every expert's input is padded to it."""
        c = self.moe_capacity_factor
        if c is None:
            return imbalance
        return c if self.moe_pad_to_capacity else min(imbalance, c)

    @property
    def capacity_problem(self) -> str | None:
        """Why the experts' capacity settings cannot run (padding with no capacity), else None."""
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            return ("--moe-pad-to-capacity pads each expert's input to its capacity: give "
                    "--moe-capacity-factor too (Megatron asserts the same)")
        return None

    @property
    def expert_rows(self) -> float:
        """Rows an expert's input holds relative to its mean share of the routed tokens (the
        activations it saves): its capacity when padded to it, fewer when the capacity is below the
        mean (tokens dropped), else the mean."""
        c = self.moe_capacity_factor
        if c is None:
            return 1.0
        return c if self.moe_pad_to_capacity else min(1.0, c)

    @field_validator("lora_targets")
    @classmethod
    def _targets_as_set(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        """LoRA targets are a set of module names: sorted and de-duplicated, so equal sets compare equal."""
        if not v:
            raise ValueError("name at least one module for LoRA to wrap")
        return tuple(sorted(set(v)))

    @property
    def policy(self) -> dict[str, str]:
        """Dtype of weights, compute, grads, master copy and optimizer states (inference: served dtypes);
        ``optimizer_states_dtype`` replaces the policy's states dtype."""
        if self.method == "inference":
            return INFERENCE_POLICY[self.precision]
        if self.optimizer_states_dtype is None:
            return PRECISION_POLICY[self.precision]
        return _with_states(self.precision, self.optimizer_states_dtype)

    @property
    def states_problem(self) -> str | None:
        """Why the optimizer cannot keep its states in ``optimizer_states_dtype``, else None."""
        if self.optimizer_states_dtype is not None and self.optimizer in ("adamw-8bit", "adafactor"):
            return (f"--optimizer-states-dtype {self.optimizer_states_dtype} with --optimizer {self.optimizer}: "
                    "its states have their own format (8-bit blocks, factored moments)")
        return None

    @property
    def gemm_dtype(self) -> str:
        """The dtype the linear layers' GEMMs run in (before the GPU is consulted)."""
        pol = self.policy
        return pol.get("gemm", pol["compute"])

    def bf16_layers(self, num_layers: int) -> int:
        """nvfp4-mixed: decoder layers kept in bf16 (all of them when the model is that small)."""
        if self.precision != "nvfp4-mixed":
            return 0
        if self.fp4_bf16_layers is not None:
            return min(self.fp4_bf16_layers, num_layers)
        kept, of = NVFP4_BF16_LAYERS_OF
        return min(num_layers, -(-num_layers * kept // of))

    @property
    def is_training(self) -> bool:
        return self.method != "inference"

    @property
    def attention_len(self) -> int:
        """Tokens one query can attend to at most: the sequence, or its packed document."""
        return min(self.seq_len, self.doc_len) if self.doc_len else self.seq_len

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.seq_len * self.micro_batch
