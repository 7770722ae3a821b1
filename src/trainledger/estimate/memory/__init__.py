"""Per-GPU memory of a training or inference job, term by term, with its peak phase and fit verdict.

``estimate_memory(plan, opts)`` predicts what ``torch.cuda.max_memory_allocated()`` reports in a
steady-state step of the reference runtime (PyTorch + transformers + peft + torch.distributed,
CUDA defaults), the allocator's reserved memory, and the device total with the CUDA context and
library workspaces. The phase model is in :mod:`.model`, the moments of a step and their peak in
:mod:`.phases`, activations in :mod:`.activations`, model states in :mod:`.states`, suggestions
in :mod:`.suggest`.
"""

from __future__ import annotations

from trainledger.spec.plan import Plan
from trainledger.units import gib
from trainledger.estimate.memory import runtimes as RT
from trainledger.estimate.memory.device import DEEPEP_BUFFER_SOURCE, RuntimeDefaults, comm_buffer_bytes, runtime_defaults
from trainledger.estimate.memory.model import Parts
from trainledger.estimate.memory.phases import (
    Peak, Point, allocator_pressure, fit_bytes, fit_or_misfit, peak_bytes, step_points,
)
from trainledger.estimate.memory.pressure import Pressure
from trainledger.estimate.memory.result import MEASURED_CATEGORY, MemoryEstimate, by_measured_category
from trainledger.estimate.memory.suggest import suggestions
from trainledger.estimate.stage import current_role, pipeline_role
from trainledger.estimate.options import MemoryOptions
from trainledger.estimate.terms import Term

__all__ = ["MEASURED_CATEGORY", "SOURCES", "MemoryEstimate", "by_measured_category", "estimate_memory", "fit_bytes",
           "fit_or_misfit"]

#: term -> (formula source, assumptions); shown with every breakdown entry.
SOURCES: dict[str, tuple[str, str]] = {
    "weights": ("P·bytes(weight dtype); QLoRA NF4 + double-quant constants (Dettmers et al. 2023, §3)",
                "TP/PP/EP split per Megatron (Shoeybi et al. 2019); ZeRO-3 shards over d; per runtime "
                "(FSDP dim-0 shards, DeepSpeed 16-bit): estimate/memory/runtimes.py"),
    "master_weights": ("4·P_t fp32 master copy (Micikevicius et al. 2018; ZeRO Fig. 1 '2+2+12')", ""),
    "gradients": ("P_t·bytes(grad dtype); ZeRO-2/3 shard over d (Rajbhandari et al. 2020, Fig. 1)", ""),
    "optimizer_states": ("AdamW 2, SGD-momentum/Lion 1, 8-bit AdamW 2·(1+4/256), Adafactor rows+cols "
                         "(see estimate/memory/states.py)", "ZeRO-1+ shard over d"),
    "optimizer_temporaries": ("foreach AdamW: _foreach_sqrt(exp_avg_sq) = P_t·state bytes; per-tensor AdamW "
                              "(adamw-loop): 2 x the largest tensor (torch/optim/adamw.py; measured on torch 2.13)",
                              "fused AdamW: none"),
    "autocast_weight_copies": ("c·(all Linear weights): autocast casts each weight once and backward "
                               "keeps the copy (measured on torch 2.13); mxfp8/nvfp4 recipes: Transformer Engine's quantized "
                               "rowwise + columnwise copy with block scales, 2·bytes(gemm) per decoder weight",
                               "only when weights are fp32 and compute is 16-bit, or with a block-scaled recipe"),
    "activations": ("saved tensors per layer and token, dtype-traced through the HF decoder layer "
                    "(estimate/memory/activations.py); cf. Korthikanti et al. 2022 Table 2",
                    "recompute/PP in-flight micro-batches/TP/SP/CP applied"),
    "logits": ("(c + 4 + 4)·V·b·s forward (logits, fp32 upcast, log-softmax), 12·V·b·s in backward "
               "(transformers ForCausalLMLoss)", "all positions, no chunked loss"),
    "dynamic_cache": ("fp32 K copies of transformers' DynamicCache during the training forward",
                      "config use_cache=True; gone with gradient checkpointing"),
    "kv_cache": ("b·ctx·L·2·k·d·c (GQA); MLA latent in paged engines (DeepSeek-V2 §2.1.2)", ""),
    "ddp_buckets": ("DDP bucket copy of all gradients (torch DDP, gradient_as_bucket_view=False)", ""),
    "zero_buffers": ("FSDP/ZeRO-3 all-gather of the current and prefetched unit + reduce-scatter; FSDP2: the "
                     "root group's gathered embedding/head, gathered layers, reduce-dtype reduce-scatter "
                     "inputs; DeepSpeed: reduce_bucket_size / stage3 prefetch buckets (estimate/memory/runtimes.py)",
                     "largest wrapped unit = largest decoder layer or the embedding"),
    "other": ("input ids/labels, rotary tables, residual-stream gradients", ""),
    "pipeline_buffers": ("torch.distributed.pipelining's receive buffers, one micro-batch of the residual "
                         "stream per micro-batch (stage.py _create_grad_recv_info / act recv infos)",
                         "framework hf with pp > 1; allocated when the schedule first runs, kept"),
}


#: the terms Liger's fused linear cross-entropy changes (estimate/memory/model.py ``_liger_flce``)
LIGER_SOURCES: dict[str, tuple[str, str]] = {
    "logits": ("Liger fused linear cross-entropy: one chunk of c-byte logits (about B·T·h/V rows), the fp32 "
               "per-token loss, grad_input (B·T·h) and, when the head trains, grad_weight (V·h) computed in "
               "forward and kept for backward (liger_kernel/ops/fused_linear_cross_entropy.py @ ead96b61)",
               "the logits are never whole"),
}


def liger_note(plan: Plan) -> str | None:
    """What ``--liger-kernel`` changes in this plan, or why it changes nothing."""
    if not plan.runtime.liger_kernel:
        return None
    ops = plan.liger
    if ops is None:
        return (f"liger kernel: Liger has no patch for model_type {plan.model.model_type} (its "
                "MODEL_TYPE_TO_APPLY_LIGER_FN): the Trainer logs 'not supported' and runs the model's own modules")
    done = [name for name, on in (("RMSNorm", ops.rms_norm), ("RoPE", ops.rope), ("SwiGLU/GeGLU", ops.glu),
                                  ("fused linear cross-entropy (no logits held)", ops.flce)) if on]
    out = "liger kernel: " + ", ".join(done)
    if plan.model.moe is not None and ops.glu:
        out += ("; routed experts sized as transformers' own (Liger's fused MoE kernel for transformers >= 5, "
                "LigerExperts, is not modeled)")
    if not ops.flce:
        out += ("; with tp > 1 the head's weight is a DTensor shard, which the fused linear cross-entropy does "
                "not take: the model's own loss runs")
    elif plan.runtime.framework == "deepspeed" and plan.layout.zero == 3:
        out += ("; under DeepSpeed ZeRO-3 the fused linear cross-entropy reads lm_head.weight without calling "
                "lm_head, so ZeRO-3 never gathers it (a size-mismatch crash: huggingface/trl#3368, "
                "EvolvingLMMs-Lab/lmms-engine#29) unless the trainer gathers the head around the loss (TRL's "
                "GRPO and DPO trainers do: trl#5891, #6372); ZeRO-2 or FSDP avoid it")
    return out


def estimate_memory(plan: Plan, opts: MemoryOptions | None = None, *, suggest: bool = True) -> MemoryEstimate:
    """Per-GPU memory estimate of ``plan`` (see the module docstring and DESIGN.md §1)."""
    opts = opts or MemoryOptions()
    if not plan.recipe.is_training and plan.serving.paged:  # a serving engine's own accounting
        from trainledger.estimate.serving.section import memory_estimate

        return memory_estimate(plan, opts)
    if plan.layout.pp > 1 and plan.recipe.is_training and current_role(plan) is None:
        # pipeline: the first and the last stage differ (embedding and p micro-batches in flight,
        # or head, loss and one micro-batch): the busier of the two is the per-GPU peak
        # (the moments of both are walked; the full breakdown is built for the busier one only)
        rt = runtime_defaults()
        walks = []
        for role in ("first", "last"):
            with pipeline_role(role):
                x, points = step_points(plan, opts, rt)
                walks.append((x, points, peak_bytes(points, opts, rt, plan), role))
        x, points, pk, role = max(walks, key=lambda w: w[2].allocated)
        with pipeline_role(role):
            est = _build(plan, opts, rt, x, points, pk)
        est.notes = [n for n in est.notes if not n.startswith("pipeline:")]
        # the near-capacity note names the stage the time term prices (``pressure.busier``), which
        # need not be the one with the larger peak: the time term's own count (the walks are cached)
        _note_pressure(est, allocator_pressure(plan, opts))
        est.notes.append(f"pipeline: the busiest rank is the {role} stage ("
                         + ", ".join(f"{w[3]} {gib(w[2].allocated):.2f} GiB" for w in walks) + ")")
        if suggest and opts.suggestions and not est.fits:
            est.suggestions = suggestions(plan, opts, est)
        return est
    rt = runtime_defaults()
    x, points = step_points(plan, opts, rt)
    pk = peak_bytes(points, opts, rt, plan)
    est = _build(plan, opts, rt, x, points, pk)
    if plan.recipe.is_training:  # near capacity: the caching allocator's retries (.pressure)
        _note_pressure(est, allocator_pressure(plan, opts))
    if suggest and opts.suggestions and not est.fits:
        est.suggestions = suggestions(plan, opts, est)
    return est


def _build(plan: Plan, opts: MemoryOptions, rt: RuntimeDefaults, x: Parts, points: list[Point],
           pk: Peak) -> MemoryEstimate:
    """The MemoryEstimate of one walked step: terms, phases, timeline and notes around its peak."""
    totals, breakdown, peak, reserved = pk.totals, pk.breakdown, pk.allocated, pk.reserved
    context, workspace = pk.context, pk.workspace
    peak_phase = totals[pk.index][0]
    phases: dict[str, int] = {}
    for ph, tot in totals:
        phases[ph] = max(phases.get(ph, 0), int(tot))
    if plan.recipe.is_training:
        idle = int(sum(v for k, v in points[-1][2].items() if k not in ("gradients", "optimizer_temporaries")))
    else:
        idle = int(x.weights)
    timeline = [("step start", idle)] + [(label, int(sum(d.values()))) for _, label, d in points]
    if plan.recipe.is_training:
        timeline.append(("after zero_grad", idle))
    sources = SOURCES if plan.liger is None or not plan.liger.flce else {**SOURCES, **LIGER_SOURCES}
    terms = [Term(name=k, value=v, unit="bytes", source=sources[k][0], assumptions=sources[k][1])
             for k, v in breakdown.items()]
    buffers = comm_buffer_bytes(plan)  # counted with the workspaces (phases.runtime_settings), shown apart
    runtime_terms = {"allocator_reserve": reserved - peak, "cuda_context": context,
                     "library_workspaces": workspace - buffers}
    terms += [Term("allocator_reserve", reserved - peak, "bytes", rt.reserve_source),
              Term("cuda_context", context, "bytes", rt.context_source),
              Term("library_workspaces", workspace - buffers, "bytes", rt.workspace_source)]
    if buffers:
        runtime_terms["comm_buffers"] = buffers
        terms.append(Term("comm_buffers", buffers, "bytes", DEEPEP_BUFFER_SOURCE))
    est = MemoryEstimate(
        peak_allocated_bytes=int(peak), peak_reserved_bytes=reserved,
        device_total_bytes=reserved + context + workspace, peak_phase=peak_phase,
        breakdown=breakdown, phases=phases, timeline=timeline,
        usable_bytes=plan.cluster.gpu.usable_bytes, headroom=plan.headroom,
        host_bytes=int(x.host), terms=terms, runtime_terms=runtime_terms,
        notes=_notes(plan), framework=RT.framework(plan),
    )
    return est


def _note_pressure(est: MemoryEstimate, p: Pressure) -> None:
    warn = p.note()
    if warn:
        est.notes.append(warn)


def _notes(plan: Plan) -> list[str]:
    r, lay = plan.recipe, plan.layout
    out = []
    if RT.framework(plan) != "hf" or lay.dp_size > 1 or lay.tp > 1:
        out.append(RT.runtime_note(plan))
    if r.recompute == "selective" and RT.op_level_sac(plan):
        out.append("selective recomputation under fsdp2 is torchtitan's per-op SAC: each block keeps its input, "
                   "every other matmul output, the SDPA output and the reduce-scatter outputs (activations.OP_SAC_SOURCE)")
    elif r.recompute == "selective":
        out.append("selective recomputation checkpoints the attention core (Korthikanti et al. 2022 §4.2): "
                   "it saves the s×s scores of eager attention; with sdpa/flash it keeps q, k, v after RoPE instead "
                   "and frees only the softmax statistics, for a second kernel forward in the backward")
    if r.dropout > 0 and r.method not in ("lora", "qlora"):
        out.append("dropout > 0: dropout masks and (on CPU) SDPA's math fallback are not modeled")
    if plan.model.model_type in ("gpt2", "gpt_neox", "phi", "phi3"):
        out.append(f"{plan.model.model_type}: LayerNorm/Conv1D/fused-projection details are approximated "
                   "by the Llama-style layer; expect a few percent")
    if lay.pp > 1:
        out.append("pipeline: one stage bounding both ends (the first stage's activations, the last's logits)")
    note = liger_note(plan)
    if note:
        out.append(note)
    if lay.cp > 1 and RT.framework(plan) == "megatron-core":
        out.append(f"context parallel cp={lay.cp}: Transformer Engine's p2p ring keeps cp K|V chunks, outputs and "
                   "softmax statistics in forward and two K|V+dK|dV buffers in backward, counted at the attention "
                   "(activations.TE_CP_SOURCE)")
    elif lay.cp > 1 and RT.framework(plan) not in ("deepspeed", "megatron-deepspeed"):
        out.append(f"context parallel cp={lay.cp}: torch's ring attention all-gathers the sequence's K|V and merges "
                   "in fp32, with fp32 dQ/dK/dV in backward, counted at the attention (activations.TORCH_CP_SOURCE)")
    if r.precision == "fp8-mixed" and RT.framework(plan) == "megatron-core":
        out.append("fp8-mixed under megatron-core: Transformer Engine's fp8 copies of GEMM inputs are the saved "
                   "ones (normalized inputs, proj and fc2 inputs); the rest stays bf16")
    elif r.precision == "fp8-mixed":
        out.append("fp8-mixed: activations modeled as bf16 (Transformer Engine keeps some in fp8)")
    return out
