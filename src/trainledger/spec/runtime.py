"""Runtime: the software stack that runs a job, and the options of that stack.

The same job holds different memory and runs at a different speed under each stack, so the
runtime is part of every plan (DESIGN.md §1). ``framework`` names the stack:

* ``hf`` — Hugging Face Trainer / accelerate on one GPU or DDP (torch AMP: fp32 weights, autocast);
  with ``zero`` > 0 the Trainer's integrated sharding (the behaviour of trainledger <= 0.1).
* ``pytorch-fsdp`` — FSDP1 (flat parameters) as Trainer / accelerate / Composer drive it.
* ``fsdp2`` — ``fully_shard`` (per-parameter DTensor sharding), e.g. torchtitan or accelerate's FSDP2;
  tensor parallelism means torch's ``parallelize_module`` / DTensor.
* ``deepspeed`` — ZeRO stages 0-3 as DeepSpeed implements them (16-bit model weights, fp32 master).
* ``megatron-core`` — Megatron-LM core / NeMo / Megatron-Bridge with Transformer Engine; tensor
  parallelism means Megatron's (vocab-parallel embedding and cross-entropy, distributed optimizer).
* ``megatron-deepspeed`` — Megatron-DeepSpeed (Megatron TP/PP with DeepSpeed ZeRO).

The options below are what those stacks expose; each is read only by the stacks that have it
(``fsdp2``: reshard / param and reduce dtypes / wrapping; DDP: gradient-as-bucket-view; torch TP:
loss parallel; ``megatron-core``: the fused cross-entropy loss; Megatron: the gradient-buffer dtype
(``reduce_dtype``), the sharded optimizer's implementation and fp8 weights). Which semantics an estimate
assumed is stated in its JSON (``plan.runtime``).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

from pydantic import Field

from trainledger.spec.base import Spec

Framework = Literal["hf", "pytorch-fsdp", "fsdp2", "deepspeed", "megatron-core", "megatron-deepspeed"]
FRAMEWORKS: tuple[str, ...] = Framework.__args__  # type: ignore[attr-defined]
ParamDtype = Literal["bf16", "fp32"]
ReduceDtype = Literal["fp32", "bf16"]
DistOptimizer = Literal["mcore", "apex"]
Wrap = Literal["layers", "layers+embed+head"]
MoeDispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
ModelLoading = Literal["every-rank", "rank0", "sharded"]
Kernels = Literal["fused", "unfused"]

#: the stacks that run DeepEP's dispatch and combine kernels (github:deepseek-ai/DeepEP):
#: Megatron-Core's flex token dispatcher (``--moe-token-dispatcher-type flex`` with
#: ``--moe-enable-deepep``, or ``--moe-flex-dispatcher-backend deepep`` in later releases; NeMo's
#: ``moe_token_dispatcher_type``/``moe_enable_deepep``) and torchtitan's
#: ``[parallelism] expert_parallel_comm_backend = "deepep"`` (torchtitan/distributed/deepep).
DEEPEP_STACKS = ("megatron-core", "fsdp2")
#: the dispatchers with DeepEP's hierarchical copies (one per destination rank over NVLink, one per
#: destination node or NVLink domain over the network): DeepEP's normal kernels and NVIDIA's Hybrid-EP
#: (DeepEP's hybrid-ep branch: Megatron-Core's flex dispatcher with ``--moe-flex-dispatcher-backend
#: hybridep``, torchtitan's ``expert_parallel_comm_backend = "hybridep"``, AutoModel's ``dispatcher:
#: hybridep``), which runs on the same stacks and on NVLink domains beyond 8 GPUs (NVL72)
HIERARCHICAL_DISPATCHERS = ("deepep", "hybridep")
#: NVLink peers per node DeepEP's legacy kernels pair a rank with (csrc/legacy/buffer.hpp
#: LEGACY_NUM_MAX_NVL_PEERS): beyond one node each node must hold 8 ranks of the group
DEEPEP_NVL_PEERS = 8
#: DeepEP's recommended normal-kernel configs by EP size, as both stacks size their buffer
#: (Megatron-Core moe/fused_a2a.py and torchtitan distributed/deepep ``get_buffer``: the larger of
#: ``Buffer.get_dispatch_config(n)`` and ``get_combine_config(n)``), from deep_ep/buffers/legacy.py
#: @ dd758ca: n -> ((NVL recv tokens, RDMA send tokens, RDMA recv tokens) of dispatch, of combine).
#: Any other EP size fails its "Unsupported number of EP ranks" assertion.
DEEPEP_CONFIGS: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    2: ((256, 6, 128), (256, 6, 128)), 4: ((256, 6, 128), (256, 6, 128)),
    8: ((256, 6, 128), (256, 6, 128)), 16: ((288, 20, 128), (288, 12, 128)),
    24: ((288, 8, 128), (288, 8, 128)), 32: ((288, 8, 128), (288, 8, 128)),
    48: ((288, 8, 128), (288, 8, 128)), 64: ((288, 8, 128), (288, 8, 128)),
    96: ((480, 12, 128), (480, 8, 128)), 128: ((560, 12, 128), (560, 8, 128)),
    144: ((720, 12, 128), (720, 8, 128)), 160: ((720, 12, 128), (720, 8, 128)),
}

#: one line per stack, shown in text outputs
FRAMEWORK_TEXT: dict[str, str] = {
    "hf": "Hugging Face Trainer/accelerate (torch AMP, DDP)",
    "pytorch-fsdp": "PyTorch FSDP1 (flat parameters) via Trainer/accelerate",
    "fsdp2": "PyTorch FSDP2 (fully_shard, DTensor TP)",
    "deepspeed": "DeepSpeed ZeRO",
    "megatron-core": "Megatron-Core + Transformer Engine",
    "megatron-deepspeed": "Megatron-DeepSpeed",
}


#: The AdamW a stack's users get when they name no implementation (``PlanInputs.optimizer`` None):
#: * hf, pytorch-fsdp: transformers' Trainer asks for ``adamw_torch_fused`` when torch >= 2.8
#:   (transformers training_args.py: ``default_optim``), accelerate passes the Trainer's optimizer on;
#: * fsdp2: torchtitan's ``Optimizer.implementation`` defaults to ``"fused"``
#:   (torchtitan/components/optimizer/optimizer.py), and accelerate's FSDP2 runs the Trainer's;
#: * deepspeed, megatron-*: ``adamw`` is the stack's own fused Adam (DeepSpeed FusedAdam, Apex / TE
#:   FusedAdam in Megatron's distributed optimizer), whose memory and passes those stacks model.
#: Composer's DecoupledAdamW and a hand-written ``torch.optim.AdamW(params)`` (foreach on CUDA) are
#: ``--optimizer adamw``.
DEFAULT_OPTIMIZER: dict[str, str] = {
    "hf": "adamw-fused", "pytorch-fsdp": "adamw-fused", "fsdp2": "adamw-fused",
    "deepspeed": "adamw", "megatron-core": "adamw", "megatron-deepspeed": "adamw",
}


#: Liger Kernel (github:linkedin/Liger-Kernel, src/liger_kernel/transformers/monkey_patch.py @
#: ead96b61, ``MODEL_TYPE_TO_APPLY_LIGER_FN``): the transformers model types it patches, of those a
#: ModelSpec can describe. The Trainer's ``use_liger_kernel`` (TRL, LLaMA-Factory's
#: ``enable_liger_kernel``, Axolotl's Liger plugin) calls ``_apply_liger_kernel_to_instance``, which
#: for any other model type logs "not supported" and changes nothing.
LIGER_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi3", "olmo2", "olmo3", "granite", "gpt_oss", "nemotron", "glm4", "smollm3",
    "ministral", "llama4_text", "exaone4"})
#: model types whose ``apply_liger_kernel_to_*`` leaves the MLP alone by default (gpt_oss:
#: ``swiglu=False``, "GPT-OSS has custom expert implementation")
LIGER_NO_GLU = frozenset({"gpt_oss"})
#: model types whose ``apply_liger_kernel_to_*`` has no RoPE patch (nemotron: ``relu_squared`` and
#: the losses only; its LayerNorm1P is not an RMSNorm either)
LIGER_NO_ROPE = frozenset({"nemotron"})
#: the stacks that run transformers' modules, which Liger patches (Megatron runs its own layers)
LIGER_STACKS = ("hf", "pytorch-fsdp", "fsdp2", "deepspeed")


class LigerOps(NamedTuple):
    """The Liger kernels a plan runs (each ``apply_liger_kernel_to_*`` default for its model type:
    ``rope=True, rms_norm=True, swiglu/geglu=True, fused_linear_cross_entropy=True``)."""

    rms_norm: bool  # LigerRMSNorm (the model's norms are RMSNorm)
    rope: bool      # liger_rotary_pos_emb (rotary positions)
    glu: bool       # LigerSwiGLUMLP / LigerGEGLUMLP (gated MLP; not gpt_oss)
    flce: bool      # LigerFusedLinearCrossEntropy: the lm_head and the loss in chunks, no logits


def liger_stack_problem(liger_kernel: bool, framework: str) -> str | None:
    """Why a stack cannot run Liger Kernel (None: it can, or Liger is not asked for)."""
    if liger_kernel and framework not in LIGER_STACKS:
        return (f"--liger-kernel with --framework {framework}: Liger Kernel patches transformers' modules, "
                f"which {framework} does not run (it has its own fused layers); use one of "
                f"{', '.join(LIGER_STACKS)}")
    return None


def liger_ops(liger_kernel: bool, framework: str, model_type: str, norm_type: str, mlp_type: str,
              position_embedding: str, tp: int = 1) -> LigerOps | None:
    """The Liger kernels that apply (None: Liger not asked for, or it has no patch for the model).
    With tensor parallelism the head's weight is a DTensor shard, which Liger's fused linear
    cross-entropy (a plain ``_input @ weight.t()`` per chunk) does not handle: the loss then runs as
    the model's own (the other kernels are per-token and shard as the model does)."""
    if not liger_kernel or framework not in LIGER_STACKS or model_type not in LIGER_MODEL_TYPES:
        return None
    return LigerOps(rms_norm=norm_type == "rmsnorm",
                    rope=position_embedding == "rope" and model_type not in LIGER_NO_ROPE,
                    glu=mlp_type == "gated" and model_type not in LIGER_NO_GLU, flce=tp == 1)


def liger_flce_chunk(tokens: float, h: int, V: int) -> int:
    """Rows of one chunk of Liger's fused linear cross-entropy (src/liger_kernel/ops/
    fused_linear_cross_entropy.py @ ead96b61): ``inc_factor = cdiv(V, H)``, ``chunk_size =
    next_power_of_2(cdiv(BT, inc_factor))``, so a chunk's V-wide logits are about as large as the
    B·T×H hidden states; never more rows than the micro-batch has."""
    bt = max(1, math.ceil(tokens))
    inc = -(-V // h)
    rows = -(-bt // inc)
    return min(bt, 1 << (rows - 1).bit_length())


def dispatcher_problem(dispatcher: str, framework: str, ep: int, gpus_per_node: int = 8) -> tuple[str, str] | None:
    """(field, reason) when a stack, an EP size or the node size cannot run an MoE token
    dispatcher, else None."""
    if dispatcher == "allgather" and framework != "megatron-core":
        return "moe_dispatcher", (
            f"--moe-dispatcher allgather with --framework {framework}: the all-gather token dispatcher is "
            "Megatron-Core's (MoEAllGatherTokenDispatcher); use --framework megatron-core or "
            "--moe-dispatcher alltoall")
    if dispatcher not in HIERARCHICAL_DISPATCHERS:
        return None
    if framework not in DEEPEP_STACKS:
        return "moe_dispatcher", (
            f"--moe-dispatcher {dispatcher} with --framework {framework}: DeepEP's and Hybrid-EP's dispatch and "
            f"combine kernels are wired into Megatron-Core's flex token dispatcher and torchtitan's "
            f"expert_parallel_comm_backend only; use one of {', '.join(DEEPEP_STACKS)}, or "
            "--moe-dispatcher alltoall")
    if dispatcher == "hybridep":  # JIT-compiled for the group's shape: no fixed EP sizes or node shape
        return None
    if ep > 1 and ep not in DEEPEP_CONFIGS:
        return "ep", (f"ep={ep} with --moe-dispatcher deepep: DeepEP's buffer configs exist for "
                      f"{', '.join(map(str, DEEPEP_CONFIGS))} EP ranks only (get_dispatch_config asserts "
                      "'Unsupported number of EP ranks'); pick one of those or --moe-dispatcher alltoall")
    if (ep > DEEPEP_NVL_PEERS or ep > gpus_per_node) and gpus_per_node != DEEPEP_NVL_PEERS:
        return "moe_dispatcher", (
            f"--moe-dispatcher deepep with ep={ep} on {gpus_per_node}-GPU nodes: DeepEP's internode kernels "
            f"pair each rank with the ranks of its {DEEPEP_NVL_PEERS}-GPU node over NVLink "
            f"(LEGACY_NUM_MAX_NVL_PEERS = {DEEPEP_NVL_PEERS}); use 8-GPU nodes, ep <= 8, or --moe-dispatcher "
            "alltoall, or --moe-dispatcher hybridep (NVIDIA's Hybrid-EP, which spans NVL72 domains)")
    return None


def stack_optimizer(optimizer: str | None, framework: str) -> str:
    """The optimizer a job runs: the one asked for, else its stack's default (``DEFAULT_OPTIMIZER``).
    ``build_plan`` and the planner (once per searched stack) both resolve it here."""
    return optimizer or DEFAULT_OPTIMIZER[framework]


#: DeepSpeed ZeRO defaults (elements), deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig,
#: v0.19): reduce_bucket_size 5e8, allgather_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
#: stage3_param_persistence_threshold 1e5, stage3_max_live_parameters 1e9; overlap_comm defaults
#: to True for stage 3 only (``overlap_comm_valid``). Also https://www.deepspeed.ai/docs/config-json/.
DS_DEFAULTS: dict[str, int] = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
}


#: What each stack's usual drivers run besides data parallelism and ZeRO/FSDP sharding, and where
#: that is written. The planner searches only these layouts (``stack_limits``); an estimate of another
#: layout is priced with the stack's profile and says that its drivers do not run it
#: (``stack_layout_note``). What a stack cannot run at all is refused (``stack_layout_problem``).
#: * hf: the Trainer / accelerate run DDP (their DeepSpeed / FSDP integrations with ``zero`` > 0) and
#:   DTensor tensor parallelism with autocast (transformers' ``tp_plan``). Pipelining: transformers'
#:   "Efficient training on multiple GPUs" guide (perf_train_gpu_many): "none of the models supports
#:   full-PP"; the Trainer has no pipeline schedule (an hf plan with PP is priced as torch's
#:   ``torch.distributed.pipelining`` under autocast, what ``verify`` runs). Context parallelism in
#:   accelerate (``ParallelismConfig.cp_size``) composes with FSDP2 only (the fsdp2 stack); the
#:   Trainer shards no experts.
#: * pytorch-fsdp: FSDP1 as Trainer / accelerate / Composer drive it: no pipeline schedule and no
#:   context parallelism (torch's pipelining and ring attention compose with FSDP2, as torchtitan
#:   uses them); DTensor TP with FSDP1 (Composer's tp_config) and experts sharded by Composer +
#:   MegaBlocks exist.
#: * deepspeed, megatron-deepspeed: DeepSpeed's PipelineEngine refuses ZeRO-2/3
#:   (deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
#:   parallelism") and runs its own 1F1B ``TrainSchedule`` (deepspeed/runtime/pipe/schedule.py): no
#:   interleaved virtual stages. Both are refused. DeepSpeed's own tensor parallelism (AutoTP
#:   training, deepspeed.ai/tutorials/autotp-training) combines with ZeRO stage 0, 1 or 2, not 3:
#:   refused too. The Trainer runs TP through AutoTP (ZeRO <= 2) or as DTensor TP under FSDP2
#:   (accelerate's ParallelismConfig: the fsdp2 stack), so hf TP with ZeRO-3 is not searched either.
#: * fsdp2 (torchtitan: TP, PP with interleaved schedules, CP, EP) and megatron-core: all of them.
NO_PIPELINE = ("hf", "pytorch-fsdp")
NO_CONTEXT_PARALLEL = ("hf", "pytorch-fsdp")
NO_EXPERT_PARALLEL = ("hf",)
NO_INTERLEAVING = ("deepspeed", "megatron-deepspeed")
PIPELINE_ZERO_MAX: dict[str, int] = {"deepspeed": 1, "megatron-deepspeed": 1}
TP_ZERO_MAX: dict[str, int] = {"deepspeed": 2, "hf": 2}
#: Stacks whose planner search leaves out ZeRO-2 (``estimate`` still prices it). Megatron-Core's
#: data parallelism is the distributed optimizer (ZeRO-1: the gradient buffer stays whole and is
#: reduce-scattered in place); its ZeRO-2 is Megatron-FSDP's ``optim_grads``, a strategy its user
#: guide does not recommend (docs/discussions/megatron-fsdp-user-guide: ``--data-parallel-sharding-
#: strategy optim_grads_params`` is the required setting), so plans stay on what NVIDIA's recipes run.
#: Everywhere else ZeRO-2 is a standard setting: DeepSpeed ZeRO-2 (also through the Trainer), FSDP1
#: SHARD_GRAD_OP, FSDP2 ``reshard_after_forward=False``.
NO_ZERO2_SEARCH = ("megatron-core",)
#: Stacks whose planner search tries ``recompute=selective`` between none and full. fsdp2: its
#: selective is torchtitan's per-op SAC (the default of its configs: ``activation_checkpoint.mode =
#: "selective"``, ``selective_ac_option = "op"``), which keeps every other matmul output and so
#: trades half of full recomputation's memory saving for half its GEMM time
#: (memory.activations.OP_SAC_SOURCE). Elsewhere it is left out: Megatron's selective recomputes
#: the attention core, which under a flash or cuDNN kernel frees only the softmax statistics for
#: a second kernel forward (time.compute.attention_core_recomputed), and the Trainer and DeepSpeed
#: checkpoint whole layers. ``estimate`` prices it on every stack.
SELECTIVE_SEARCH = ("fsdp2",)
_TP_ZERO_REFUSED = ("deepspeed",)  # hf: priced, with a note
#: the stacks whose zero 0 is a sharding strategy already (FULL_SHARD; memory.runtimes.fsdp_sharded)
FSDP_STACKS = ("fsdp2", "pytorch-fsdp")
#: the stacks that offload the optimizer only from a ZeRO optimizer (stage >= 1): DeepSpeed's
#: zero_optimization.offload_optimizer, Megatron-Core's --optimizer-cpu-offload in its distributed
#: optimizer. The Trainer (hf) also pages optimizer states to the host without ZeRO (bitsandbytes'
#: paged optimizers, ``optim="paged_adamw_32bit"``; QLoRA §3), and FSDP's zero 0 is FULL_SHARD.
ZERO_OFFLOAD_STACKS = ("deepspeed", "megatron-deepspeed", "megatron-core")


def offload_needs_zero(framework: str, zero: int) -> bool:
    """Whether CPU offload at this ZeRO stage needs a ZeRO stage first: the ``ZERO_OFFLOAD_STACKS``
    offload from their ZeRO optimizer, which stage 0 does not run."""
    return zero == 0 and framework in ZERO_OFFLOAD_STACKS


def stack_zero_max(framework: str, pp: int, tp: int) -> int:
    """The deepest ZeRO stage ``framework`` runs with this pipeline and tensor-parallel degree."""
    z = 3
    if pp > 1:
        z = min(z, PIPELINE_ZERO_MAX.get(framework, 3))
    if tp > 1:
        z = min(z, TP_ZERO_MAX.get(framework, 3))
    return z


_USE = {
    "pp": "megatron-core, fsdp2 (torchtitan), deepspeed or megatron-deepspeed",
    "cp": "fsdp2 (torchtitan, accelerate's ParallelismConfig with FSDP2) or megatron-core",
    "ep": "megatron-core, fsdp2 (torchtitan) or pytorch-fsdp (Composer + MegaBlocks)",
}
_LIMITS = (("pp", "PP", NO_PIPELINE, "no pipeline schedule"),
           ("cp", "CP", NO_CONTEXT_PARALLEL, "no context parallelism"),
           ("ep", "EP", NO_EXPERT_PARALLEL, "no expert parallelism"))


def stack_limits(framework: str) -> list[str]:
    """The parallelisms ``framework``'s drivers do not run (the table above), as short phrases: the
    planner does not search them."""
    out = [short for _, short, stacks, _ in _LIMITS if framework in stacks]
    if framework in NO_INTERLEAVING:
        out.append("interleaved PP")
    if framework in PIPELINE_ZERO_MAX:
        out.append(f"ZeRO > {PIPELINE_ZERO_MAX[framework]} with PP")
    if framework in TP_ZERO_MAX:
        out.append(f"ZeRO > {TP_ZERO_MAX[framework]} with TP")
    return out


def stack_layout_note(framework: str, layout: Any) -> str | None:
    """A note for an estimate whose layout uses a parallelism ``framework``'s drivers do not run
    (priced with the stack's profile all the same), else None."""
    parts = [f"{key}={int(getattr(layout, key))}: {what} (use --framework {_USE[key]})"
             for key, _, stacks, what in _LIMITS if framework in stacks and int(getattr(layout, key)) > 1]
    tp, zero = int(layout.tp), int(layout.zero)
    if tp > 1 and zero > TP_ZERO_MAX.get(framework, 3):
        parts.append(f"tp={tp} with --zero {zero}: its TP is DeepSpeed's AutoTP, which runs with ZeRO "
                     f"<= {TP_ZERO_MAX[framework]} (use --zero {TP_ZERO_MAX[framework]}, or --framework fsdp2 "
                     "for DTensor TP under FSDP2)")
    if not parts:
        return None
    text = "; ".join(parts)
    return (f"{framework} ({FRAMEWORK_TEXT.get(framework, framework)}) runs no such layout — {text}; "
            f"priced with the {framework} profile as plain PyTorch would run it, and the planner does not "
            "search it")


def stack_layout_problem(framework: str, layout: Any) -> tuple[str, str] | None:
    """(field, reason) when ``framework`` cannot run ``layout`` at all (a Layout: DeepSpeed's
    pipeline engine, see the table above), else None."""
    pp, vp, zero, tp = int(layout.pp), int(layout.vp), int(layout.zero), int(layout.tp)
    if pp > 1 and framework in NO_INTERLEAVING and (vp > 1 or layout.pp_schedule == "interleaved"):
        return "vp", (f"vp={vp}: {framework} pipelines with DeepSpeed's PipelineEngine, whose 1F1B "
                      "TrainSchedule has no interleaved virtual stages; use --vp 1 or --framework megatron-core")
    zmax = PIPELINE_ZERO_MAX.get(framework)
    if pp > 1 and zmax is not None and zero > zmax:
        return "zero", (f"--zero {zero} with pp={pp}: DeepSpeed's PipelineEngine refuses ZeRO-2 and "
                        f"ZeRO-3 (\"incompatible with pipeline parallelism\"); use --zero {zmax} or pp=1")
    if str(layout.offload) != "none" and offload_needs_zero(framework, zero):
        return "offload", (f"--offload {layout.offload} with --zero 0: {framework} offloads the optimizer "
                           "from its ZeRO optimizer (DeepSpeed's zero_optimization.offload_optimizer is a "
                           "stage 1-3 option, Megatron-Core's --optimizer-cpu-offload runs in its "
                           "distributed optimizer); use --zero 1, 2 or 3 (ZeRO-Offload runs on one GPU too)")
    if tp > 1 and framework in _TP_ZERO_REFUSED and zero > TP_ZERO_MAX[framework]:
        return "zero", (f"--zero {zero} with tp={tp}: DeepSpeed's tensor parallelism (AutoTP training) runs "
                        f"with ZeRO stage 0, 1 or 2; use --zero {TP_ZERO_MAX[framework]}, or --framework "
                        "megatron-deepspeed / megatron-core for Megatron's TP")
    return None


class Runtime(Spec):
    """The software stack of a job and its memory/time-relevant options."""

    framework: Framework = Field("hf", description="software stack that runs the job")
    reshard_after_forward: bool | None = Field(
        None, description="fsdp2: free the gathered parameters after forward (re-gather in backward) "
        "[the stack's default: yes, except fsdp2 with pipeline parallelism, which keeps them between "
        "micro-batches as torchtitan's 'default' policy does]")
    param_dtype: ParamDtype = Field(
        "bf16", description="fsdp2 MixedPrecisionPolicy.param_dtype: dtype the shards are gathered in")
    reduce_dtype: ReduceDtype = Field(
        "fp32", description="dtype gradients are reduced in: FSDP MixedPrecision(Policy) reduce_dtype; "
        "Megatron the main-gradient buffer (--grad-reduce-in-bf16 for bf16; NeMo optim.grad_sync_dtype)")
    wrap: Wrap = Field(
        "layers", description="fsdp2 wrapping: each decoder layer, or the embedding and head separately too")
    loss_parallel: bool = Field(
        False, description="torch TP loss_parallel: cross-entropy on the vocab-sharded logits")
    gradient_as_bucket_view: bool = Field(
        False, description="DDP gradient_as_bucket_view: gradients are views into the reduction buckets")
    fused_loss: bool = Field(
        False, description="the stack's fused cross-entropy kernel: megatron-core "
        "--cross-entropy-loss-fusion (fewer passes over the fp32 logits: time), or on PyTorch stacks "
        "one fused kernel such as flash-attn's (llm-foundry's default): the logits are kept once, "
        "with no fp32 copy or log-softmax output (memory)")
    liger_kernel: bool = Field(
        False, description="Liger Kernel on the transformers model (Trainer/TRL use_liger_kernel): fused "
        "RMSNorm, RoPE and SwiGLU/GeGLU and the chunked fused linear cross-entropy that never holds the "
        "logits; stacks that run transformers' modules (hf, pytorch-fsdp, fsdp2, deepspeed), model types "
        "Liger patches")
    kernels: Kernels | None = Field(
        None, description="the small-op kernels between the GEMMs (norms, RoPE, activations, residual "
        "adds): fused = Transformer Engine / Apex / torch.compile kernels, unfused = PyTorch eager modules "
        "(transformers', torchtitan's without compile) [the stack's: fused for megatron-core and "
        "megatron-deepspeed, unfused for the others]")
    tp_comm_overlap: bool | None = Field(
        None, description="tensor-parallel collectives overlapped with the GEMMs (Megatron-Core "
        "--tp-comm-overlap with Transformer Engine's userbuffers, torch AsyncTP: torchtitan "
        "enable_async_tensor_parallel) [the stack's: on for megatron-core on Hopper and newer, as "
        "NeMo's recipes run it; off otherwise]")
    moe_shared_expert_overlap: bool = Field(
        False, description="MoE: the shared experts run on a side stream while the routed tokens are "
        "dispatched and combined, hiding up to their own GEMM time of that communication (Megatron-Core "
        "--moe-shared-expert-overlap; NeMo AutoModel's MoE block always does it)")
    ep_comm_overlap: bool = Field(
        False, description="MoE: the expert-parallel dispatch and combine of one micro-batch run under "
        "another's compute (Megatron-Core --overlap-moe-expert-parallel-comm, DeepSeek-V3's DualPipe): "
        "hidden up to the micro-batch's compute")
    moe_dispatcher: MoeDispatcher = Field(
        "alltoall", description="MoE token dispatch under expert parallelism: alltoall = NCCL all-to-all "
        "of one copy per routed expert (Megatron-Core's alltoall dispatcher, torchtitan's standard "
        "backend); allgather = Megatron-Core's default dispatcher, all tokens all-gathered over the TP×EP "
        "group and reduce-scattered back; deepep = DeepEP's kernels, one copy per destination rank over NVLink and one per "
        "destination node over the network (Megatron-Core flex + DeepEP, torchtitan "
        "expert_parallel_comm_backend deepep); hybridep = NVIDIA's Hybrid-EP, the same copies with the "
        "node's whole NVLink domain (NVL72 racks) as one unit (Megatron-Core flex backend hybridep, "
        "torchtitan expert_parallel_comm_backend hybridep)")
    dist_optimizer: DistOptimizer = Field(
        "mcore", description="megatron: the sharded optimizer: mcore = Megatron-Core DistributedOptimizer "
        "(fp32 main params); apex = NeMo 1.x optim.name distributed_fused_adam (Apex DistributedFusedAdam: "
        "bf16 params keep only 16-bit remainders of the fp32 master)")
    fp8_params: bool = Field(
        False, description="megatron with fp8-mixed: weights stored as Transformer Engine fp8 tensors "
        "(Megatron --fp8-param-gather, NeMo fp8_params) instead of bf16 plus TE's cached fp8 copies")
    checkpoint_early_stop: bool | None = Field(
        None, description="full recomputation through torch's non-reentrant checkpoint (torch >= 2.1), "
        "which stops re-running a layer once the tensors its backward needs are rebuilt: the last "
        "GEMM of a pre-norm block (MLP down) is not recomputed; False = a reentrant checkpoint (Megatron's, "
        "deepspeed.checkpointing, transformers < 5 by default) or torch < 2.1 [the stack's default]")
    model_loading: ModelLoading | None = Field(
        None, description="how the model's weights reach the GPUs, for the host RAM at load: every-rank = "
        "each process builds the whole model on the CPU (from_pretrained on every rank: DDP, FSDP without "
        "cpu_ram_efficient_loading, DeepSpeed ZeRO <= 2); rank0 = one process per node does, the others "
        "start on the meta device and receive a broadcast (accelerate fsdp_cpu_ram_efficient_loading); "
        "sharded = each rank reads only its shard (DeepSpeed ZeRO-3 zero.Init, torchtitan's meta-device "
        "init + DCP, Megatron's distributed checkpoint) [the stack's default: every-rank for hf below ZeRO-3 "
        "and deepspeed ZeRO <= 2, rank0 for pytorch-fsdp and hf ZeRO-3 (accelerate launch's default), "
        "sharded for fsdp2, deepspeed ZeRO-3, megatron and TP loads]")
    stack_version: str | None = Field(
        None, min_length=1, max_length=80, pattern=r"^[\w.@/+ :-]+$",
        description="the stack's release, e.g. nemo-24.07, megatron-core-0.12, 'torchtitan b5bcd76 torch-2.6': "
        "read by no estimate, it keys a time calibration (one measured on another release is refused)")
    # DeepSpeed ZeRO knobs (elements); None = DeepSpeed's default (DS_DEFAULTS above)
    ds_reduce_bucket_size: int | None = Field(None, gt=0, description="deepspeed reduce_bucket_size [5e8]")
    ds_allgather_bucket_size: int | None = Field(None, gt=0, description="deepspeed allgather_bucket_size [5e8]")
    ds_stage3_prefetch_bucket_size: int | None = Field(
        None, ge=0, description="deepspeed stage3_prefetch_bucket_size [5e7]")
    ds_stage3_param_persistence_threshold: int | None = Field(
        None, ge=0, description="deepspeed stage3_param_persistence_threshold [1e5]")
    ds_stage3_max_live_parameters: int | None = Field(
        None, ge=0, description="deepspeed stage3_max_live_parameters [1e9]")
    ds_overlap_comm: bool | None = Field(None, description="deepspeed overlap_comm [True for stage 3 only]")

    def default_reshard_after_forward(self, pp: int) -> bool:
        """The stack's own choice: torchtitan (the FSDP2 stack that pipelines) keeps the gathered
        parameters under PP ("For PP, by default do not reshard after forward to avoid
        per-microbatch all-gathers": torchtitan/distributed/fsdp.py
        ``get_fsdp_reshard_after_forward_policy`` @ b5bcd76, policy "default"); FSDP1's FULL_SHARD
        and fsdp2 without PP (torchtitan, accelerate's ``fsdp_reshard_after_forward: true``) free them."""
        return not (self.framework == "fsdp2" and pp > 1)

    def reshards_after_forward(self, pp: int) -> bool:
        """Whether the gathered parameters are freed after each forward: the option when stated,
        else the stack's default (``default_reshard_after_forward``)."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.default_reshard_after_forward(pp)

    def loading(self, zero: int, tp: int = 1) -> str:
        """How the model is loaded (``model_loading``): as stated, else the stack's default."""
        return self.model_loading or self.default_loading(zero, tp)

    def default_loading(self, zero: int, tp: int = 1) -> str:
        """The stack's own way to load the model (on hf with TP, transformers' ``tp_plan`` load
        reads each rank's slices straight to its GPU)."""
        if self.framework == "hf":
            # the Trainer's sharding (zero 3) runs under accelerate launch, whose FSDP loads on local
            # rank 0 (and ZeRO-3 through zero.Init); DDP and ZeRO <= 2 load on every rank
            return "sharded" if tp > 1 else ("rank0" if zero >= 3 else "every-rank")
        if self.framework == "deepspeed" and zero < 3:
            return "every-rank"
        return "rank0" if self.framework == "pytorch-fsdp" else "sharded"

    @property
    def is_fsdp(self) -> bool:
        return self.framework in ("pytorch-fsdp", "fsdp2")

    @property
    def is_megatron(self) -> bool:
        return self.framework in ("megatron-core", "megatron-deepspeed")

    def summary(self, pp: int = 1) -> dict[str, object]:
        """The semantics assumed, for JSON output (only the options the stack reads; ``pp``: the
        plan's pipeline degree, which settles the stack's reshard-after-forward default)."""
        d: dict[str, object] = {"framework": self.framework, "text": FRAMEWORK_TEXT[self.framework]}
        if self.stack_version:
            d["stack_version"] = self.stack_version
        if self.framework == "fsdp2":
            d.update(reshard_after_forward=self.reshards_after_forward(pp), param_dtype=self.param_dtype,
                     reduce_dtype=self.reduce_dtype, wrap=self.wrap, loss_parallel=self.loss_parallel)
        if self.framework in ("hf", "pytorch-fsdp", "fsdp2"):
            d["gradient_as_bucket_view"] = self.gradient_as_bucket_view
        if self.checkpoint_early_stop is not None:
            d["checkpoint_early_stop"] = self.checkpoint_early_stop
        if self.liger_kernel:
            d["liger_kernel"] = True
        if self.model_loading is not None:
            d["model_loading"] = self.model_loading
        if self.moe_dispatcher != "alltoall":
            d["moe_dispatcher"] = self.moe_dispatcher
        if self.moe_shared_expert_overlap:
            d["moe_shared_expert_overlap"] = True
        if self.ep_comm_overlap:
            d["ep_comm_overlap"] = True
        if self.kernels is not None:
            d["kernels"] = self.kernels
        if self.tp_comm_overlap is not None:
            d["tp_comm_overlap"] = self.tp_comm_overlap
        if self.framework == "megatron-core" or self.fused_loss:
            d["fused_loss"] = self.fused_loss
        if self.is_megatron:
            d.update(reduce_dtype=self.reduce_dtype, dist_optimizer=self.dist_optimizer,
                     fp8_params=self.fp8_params)
        if self.framework in ("deepspeed", "megatron-deepspeed"):
            for k, dflt in DS_DEFAULTS.items():
                v = getattr(self, "ds_" + k)
                d["ds_" + k] = dflt if v is None else v
            d["ds_overlap_comm"] = self.ds_overlap_comm
        return d
