"""Exports for launchers that carry the whole layout: torchtitan TOML and Megatron-LM arguments.

torchtitan: the ``JobConfig`` sections of torchtitan/config/job_config.py (pytorch/torchtitan);
Megatron-LM: ``pretrain_gpt.py`` arguments (megatron/training/arguments.py, NVIDIA/Megatron-LM),
written as a torchrun script like the project's own examples. Each refuses, with the reason, a plan
its launcher cannot run as planned (e.g. ZeRO-2 under torchtitan, a MoE model in Megatron
arguments, a model with no torchtitan flavor).
"""

from __future__ import annotations

import shlex
from typing import Any

from trainledger.errors import SpecError
from trainledger.estimate.time.efficiency import gpu_efficiency
from trainledger.estimate.time.stack import tp_overlaps_by_default
from trainledger.spec.plan import Plan
from trainledger.spec.runtime import Runtime
from trainledger.runconfig.importers.torchtitan import PRESET_FLAVOR


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _titan_reshard(rt: Runtime, pp: int) -> str:
    """torchtitan's ``fsdp_reshard_after_forward`` for the plan: "default" when it resolves as the
    stack's default does (``Runtime.default_reshard_after_forward``: torchtitan's own rule), else
    "always" / "never" (torchtitan/config/job_config.py ``Parallelism``)."""
    keep = rt.reshards_after_forward(pp)
    if keep == rt.default_reshard_after_forward(pp):
        return "default"
    return "always" if keep else "never"


def torchtitan_config(plan: Plan) -> dict[str, dict[str, Any]]:
    r, lay, c, rt = plan.recipe, plan.layout, plan.cluster, plan.runtime
    flavor = PRESET_FLAVOR.get(plan.model.name)
    if flavor is None:
        raise SpecError(f"torchtitan has no model flavor for {plan.model.name} (flavors here: "
                        f"{', '.join(sorted(PRESET_FLAVOR))})")
    if lay.zero in (1, 2):
        raise SpecError("torchtitan shards with FSDP2 (--zero 3, or 0: an FSDP stack always shards); it has "
                        "no ZeRO-1/2 — plan --zero 3, or export deepspeed")
    if lay.offload == "optimizer":
        raise SpecError("torchtitan offloads parameters with their optimizer state (enable_cpu_offload), "
                        "not the optimizer alone — plan --offload params")
    if r.method not in ("pretrain", "full"):
        raise SpecError(f"torchtitan trains all weights; a {r.method} plan needs a PEFT trainer (export trainer-args)")
    if r.optimizer not in ("adamw", "adamw-fused", "adamw-loop"):
        raise SpecError(f"torchtitan's optimizers here are AdamW; the plan uses {r.optimizer}")
    if r.dropout:
        raise SpecError("torchtitan's models have no dropout; plan --dropout 0")
    if r.precision not in ("bf16-mixed", "fp8-mixed", "fp32"):
        raise SpecError(f"torchtitan trains bf16 (or fp32, or float8) under FSDP2; {r.precision} is not one")
    if lay.zero == 3 and lay.dp_size == 1:
        raise SpecError("zero 3 over one data-parallel rank shards nothing; plan --zero 0")
    if lay.zero == 3 and rt.wrap == "layers" and not plan.model.tie_word_embeddings:
        raise SpecError("torchtitan wraps the embedding, and the final norm with the head, as FSDP groups of "
                        "their own (apply_fsdp, since 2025-07); the plan keeps them in the root group, which "
                        "holds them gathered all step — plan --wrap layers+embed+head")
    name, fl = flavor
    # --zero 0 under fsdp2 is priced as FULL_SHARD like 3 (memory.runtimes.fsdp_sharded: an FSDP
    # stack always shards), so it is written as sharded; replicate-only would hold every rank's states
    rep, shard = (c.nodes, lay.dp_size // c.nodes) if lay.hybrid_shard else (1, lay.dp_size)
    training: dict[str, Any] = {
        "local_batch_size": r.micro_batch, "global_batch_size": plan.global_batch, "seq_len": r.seq_len,
        "max_norm": r.grad_clip or 0.0,
        "mixed_precision_param": "float32" if r.precision == "fp32" or rt.param_dtype == "fp32" else "bfloat16",
        "mixed_precision_reduce": "bfloat16" if rt.reduce_dtype == "bf16" else "float32",
    }
    if r.train_tokens:
        training["steps"] = max(1, round(r.train_tokens / plan.tokens_per_step))
    if lay.offload == "params":
        training["enable_cpu_offload"] = True
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": rep, "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": _titan_reshard(rt, lay.pp),
        "tensor_parallel_degree": lay.tp, "pipeline_parallel_degree": lay.pp,
        "context_parallel_degree": lay.cp, "expert_parallel_degree": lay.ep,
    }
    if lay.tp > 1:
        par["disable_loss_parallel"] = not rt.loss_parallel
    if lay.pp > 1:
        par["pipeline_parallel_schedule"] = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                                             "gpipe": "GPipe"}[lay.pp_schedule]
    ac = {"none": {"mode": "none"}, "full": {"mode": "full"},
          "selective": {"mode": "selective", "selective_ac_option": "op"}}[r.recompute]
    if r.recompute == "full" and rt.checkpoint_early_stop:
        # torchtitan >= 2025-08-29 (PR #1580) takes early stop as a key, off by default
        ac["early_stop"] = True
    if rt.tp_comm_overlap and lay.tp > 1:
        if rt.kernels != "fused":  # torchtitan refuses AsyncTP without compile (parallelize.py)
            raise SpecError("torchtitan runs AsyncTP (--tp-comm-overlap) only under torch.compile: plan "
                            "--kernels fused too")
        par["enable_async_tensor_parallel"] = True
    model: dict[str, Any] = {"name": name, "flavor": fl}
    if r.precision == "fp8-mixed":
        model["converters"] = ["float8"]
    # torchtitan's [optimizer] implementation: "fused" (its default) or "foreach" (torch's AdamW
    # default on CUDA), torchtitan/components/optimizer/optimizer.py
    impl = {"adamw-fused": "fused", "adamw-loop": "for-loop"}.get(r.optimizer, "foreach")
    if r.optimizer_states_dtype not in (None, "fp32"):
        if r.optimizer_states_dtype != "bf16" or impl != "fused":
            raise SpecError(f"torchtitan keeps 16-bit Adam moments only as bf16 in its fused AdamW "
                            f"(implementation fused_opt_states_bf16); the plan has {r.optimizer_states_dtype} states "
                            f"with {r.optimizer} — plan --optimizer adamw-fused --optimizer-states-dtype bf16")
        impl = "fused_opt_states_bf16"
    out = {"model": model, "optimizer": {"name": "AdamW", "implementation": impl}, "training": training,
           "parallelism": par, "activation_checkpoint": ac}
    if rt.kernels == "fused":  # torch.compile of the blocks and the loss ([compile], torchtitan >= 2025-06)
        out["compile"] = {"enable": True, "components": ["model", "loss"]}
    return out


def torchtitan_toml(plan: Plan, head: str) -> str:
    out = [head.rstrip("\n")]
    for section, values in torchtitan_config(plan).items():
        out.append(f"\n[{section}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(out) + "\n"


def _tp_overlap(plan: Plan) -> bool:
    """Whether the plan was priced with its TP collectives overlapped: as it states, else the
    stack's default on its GPU (megatron-core on Hopper: on, as NeMo's recipes run it). An exported
    Megatron-LM script must say so, since its own --tp-comm-overlap is off unless given."""
    rt = plan.runtime
    if rt.tp_comm_overlap is not None:
        return rt.tp_comm_overlap
    return rt.framework == "megatron-core" and tp_overlaps_by_default(
        rt.framework, gpu_efficiency(plan.cluster.gpu.architecture).family)


def megatron_args(plan: Plan) -> list[str]:
    """``pretrain_gpt.py`` arguments that reproduce the plan (model, batch, parallelism, precision)."""
    m, r, lay = plan.model, plan.recipe, plan.layout
    if m.moe is not None or m.mla is not None:
        raise SpecError(f"{m.name}: MoE/MLA models need Megatron's MoE/MLA arguments, which this export "
                        "does not write; use the model's Megatron-Bridge recipe")
    if r.method not in ("pretrain", "full"):
        raise SpecError(f"Megatron-LM pretrain_gpt.py trains all weights; a {r.method} plan needs a PEFT trainer")
    if lay.offload == "params":
        raise SpecError("Megatron-LM offloads optimizer states (--optimizer-cpu-offload), not parameters")
    if r.optimizer not in ("adamw", "adamw-fused", "adamw-loop", "sgd-momentum"):
        raise SpecError(f"Megatron-LM's optimizers are adam and sgd (momentum); the plan uses {r.optimizer}")
    if m.model_type not in ("llama", "mistral", "qwen2", "generic", "gpt2") or m.qk_norm != "none" \
            or m.sliding_window or m.post_norm_only or m.parallel_residual:
        raise SpecError(f"{m.name}: only Llama-like or GPT-like blocks map onto pretrain_gpt.py arguments here")
    a: list[str] = ["--use-mcore-models", "--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
                    "--ffn-hidden-size", str(m.intermediate_size), "--num-attention-heads", str(m.num_heads)]
    if m.num_kv_heads != m.num_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if m.head_dim != m.hidden_size // m.num_heads:
        a += ["--kv-channels", str(m.head_dim)]
    a += ["--seq-length", str(r.seq_len), "--max-position-embeddings", str(max(m.max_position_embeddings, r.seq_len))]
    a += ["--position-embedding-type", "rope" if m.position_embedding == "rope" else "learned_absolute"]
    if m.mlp_type == "gated":
        a.append("--swiglu")
    a += ["--normalization", "RMSNorm" if m.norm_type == "rmsnorm" else "LayerNorm"]
    if not m.tie_word_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not (m.qkv_bias or m.mlp_bias or m.o_bias):
        a.append("--disable-bias-linear")
    a += ["--vocab-size", str(m.vocab_size)]
    if m.source and "/" in m.source:
        a += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", m.source]
    if r.attention != "sdpa":  # sdpa: Megatron's default (auto: TE fused attention)
        a += ["--attention-backend", {"flash": "flash", "flash1": "flash", "cudnn": "fused"}.get(r.attention, "unfused")]
    a += ["--attention-dropout", str(r.dropout), "--hidden-dropout", str(r.dropout)]
    a += ["--micro-batch-size", str(r.micro_batch), "--global-batch-size", str(plan.global_batch)]
    if r.train_tokens:
        a += ["--train-iters", str(max(1, round(r.train_tokens / plan.tokens_per_step)))]
    a += ["--clip-grad", str(r.grad_clip or 0.0)]
    if r.optimizer == "sgd-momentum":
        a += ["--optimizer", "sgd"]
    if r.precision == "fp8-mixed":
        a += ["--bf16", "--fp8-format", "hybrid"]
    elif r.precision == "mxfp8-mixed":  # megatron/training/arguments.py --fp8-recipe {..., mxfp8}
        a += ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    elif r.precision == "nvfp4-mixed":  # --fp4-format e2m1 --fp4-recipe nvfp4; bf16 first/last layers
        a += ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
        kept = r.bf16_layers(m.num_layers)
        if kept:  # the paper keeps 2 first and 8 last of 10 (arXiv:2509.25149, "selective high-precision layers")
            first = kept * 2 // 10
            a += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(first),
                  "--num-layers-at-end-in-bf16", str(kept - first)]
    elif r.precision in ("bf16-mixed", "bf16"):
        a.append("--bf16")
    elif r.precision in ("fp16-mixed", "fp16"):
        a.append("--fp16")
    if r.recompute != "none":
        a += ["--recompute-granularity", r.recompute]
        if r.recompute == "full":
            a += ["--recompute-method", "uniform", "--recompute-num-layers", "1"]
    a += ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp),
          "--context-parallel-size", str(lay.cp)]
    if lay.tp > 1 and lay.sp:
        a.append("--sequence-parallel")
    if lay.tp > 1 and _tp_overlap(plan):
        if lay.sp:
            a.append("--tp-comm-overlap")
        elif plan.runtime.tp_comm_overlap:  # megatron/training/arguments.py asserts sequence parallelism
            raise SpecError("Megatron-LM overlaps TP communication (--tp-comm-overlap) only with sequence "
                            "parallelism: plan --sp, or --no-tp-comm-overlap")
    if lay.vp > 1:
        if m.num_layers % (lay.pp * lay.vp):  # Megatron's virtual stages hold equal layer counts
            raise SpecError(f"{m.name}'s {m.num_layers} layers do not split into pp·vp = {lay.pp}·{lay.vp} "
                            "equal virtual stages, which --num-layers-per-virtual-pipeline-stage needs; "
                            "plan a --vp that divides the layers of each stage")
        a += ["--num-layers-per-virtual-pipeline-stage", str(m.num_layers // (lay.pp * lay.vp))]
    if lay.zero == 1:
        a += ["--use-distributed-optimizer"]
    elif lay.zero > 1:  # Megatron-FSDP (megatron/training/arguments.py --use-megatron-fsdp)
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              {2: "optim_grads", 3: "optim_grads_params"}[lay.zero]]
    if lay.offload == "optimizer":
        a += ["--optimizer-cpu-offload"]
    if plan.runtime.fused_loss:
        a += ["--cross-entropy-loss-fusion"]
    rt = plan.runtime
    if rt.dist_optimizer == "apex":
        raise SpecError("dist_optimizer apex is NeMo 1.x's distributed_fused_adam; Megatron-LM shards with "
                        "its own distributed optimizer — plan --dist-optimizer mcore")
    if rt.reduce_dtype == "bf16" and r.is_training:
        a += ["--grad-reduce-in-bf16"]  # megatron/training/arguments.py (core_r0.12.0 on)
    if rt.fp8_params and r.precision == "fp8-mixed":
        a += ["--fp8-param-gather"]
    if r.optimizer_states_dtype is not None and r.is_training:  # the precision-aware optimizer
        a += ["--use-precision-aware-optimizer", "--exp-avg-dtype", r.optimizer_states_dtype,
              "--exp-avg-sq-dtype", r.optimizer_states_dtype]
    return a


def megatron_script(plan: Plan, head: str) -> str:
    if plan.runtime.framework != "megatron-core":
        raise SpecError(f"the Megatron-LM export runs under megatron-core; this plan's framework is "
                        f"{plan.runtime.framework} — plan --framework megatron-core")
    c = plan.cluster
    if plan.layout.pp > 1 and plan.layout.pp_schedule == "gpipe":
        raise SpecError("Megatron-LM schedules pipelines 1F1B or interleaved, not GPipe")
    args = megatron_args(plan)
    lines = ["#!/usr/bin/env bash", head.rstrip("\n"),
             "# Run from a Megatron-LM checkout; fill in DATA_ARGS (--data-path or --mock-data) and, on",
             "# several nodes, MASTER_ADDR and NODE_RANK.", "set -euo pipefail",
             'export CUDA_DEVICE_MAX_CONNECTIONS="1"',
             "DISTRIBUTED_ARGS=(", f"    --nproc_per_node {c.gpus_per_node}", f"    --nnodes {c.nodes}",
             "    --node_rank ${NODE_RANK:-0}", "    --master_addr ${MASTER_ADDR:-localhost}",
             "    --master_port ${MASTER_PORT:-6000}", ")", "MEGATRON_ARGS=("]
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"    {args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(f"    {args[i]}")
            i += 1
    lines += [")", 'DATA_ARGS=(${DATA_ARGS:---mock-data})',
              'torchrun "${DISTRIBUTED_ARGS[@]}" pretrain_gpt.py "${MEGATRON_ARGS[@]}" "${DATA_ARGS[@]}" "$@"']
    return "\n".join(lines) + "\n"


def nemo_script(plan: Plan, head: str) -> str:
    """NeMo 2 ``nemo llm pretrain --factory <recipe>`` with the plan's batch, sequence and layout
    as Hydra overrides (NeMo docs, "NeMo 2.0 CLI"; keys of nemo/collections/llm/recipes/*.py:
    trainer.strategy.*_parallel_size, data.micro_batch_size/global_batch_size/seq_length)."""
    from trainledger.runconfig.importers.megatron import NEMO_RECIPES

    if plan.runtime.framework != "megatron-core":
        raise SpecError(f"NeMo runs the job under megatron-core; this plan's framework is "
                        f"{plan.runtime.framework} — plan --framework megatron-core")
    recipe = next((k for k, v in NEMO_RECIPES.items() if v == plan.model.name), None)
    if recipe is None:
        raise SpecError(f"no NeMo 2 recipe for {plan.model.name} (recipes here: "
                        f"{', '.join(sorted(set(NEMO_RECIPES.values())))}); export megatron instead")
    megatron_args(plan)  # the same refusals as the Megatron-LM export (MoE, PEFT, ...)
    if plan.runtime.reduce_dtype != "fp32" or plan.runtime.fp8_params:
        raise SpecError("this NeMo export writes the recipe's fp32 gradient buffer and bf16 weights; for "
                        "--reduce-dtype bf16 / --fp8-params export megatron")
    if plan.layout.zero > 1:
        raise SpecError("this NeMo export writes ZeRO-0/1 (distributed optimizer); for Megatron-FSDP "
                        "(ZeRO-2/3) export megatron")
    r, lay, c = plan.recipe, plan.layout, plan.cluster
    if r.dropout:
        raise SpecError(f"the {recipe} recipe trains without dropout; plan --dropout 0")
    o = [f"trainer.devices={c.gpus_per_node}", f"trainer.num_nodes={c.nodes}",
         f"trainer.strategy.tensor_model_parallel_size={lay.tp}",
         f"trainer.strategy.pipeline_model_parallel_size={lay.pp}",
         f"trainer.strategy.context_parallel_size={lay.cp}",
         f"trainer.strategy.sequence_parallel={'true' if lay.tp > 1 and lay.sp else 'false'}",
         f"data.micro_batch_size={r.micro_batch}", f"data.global_batch_size={plan.global_batch}",
         f"data.seq_length={r.seq_len}", f"optim.config.use_distributed_optimizer={'true' if lay.zero == 1 else 'false'}",
         f"optim.config.clip_grad={r.grad_clip or 0.0}"]
    if lay.vp > 1:
        o.append(f"trainer.strategy.virtual_pipeline_model_parallel_size={lay.vp}")
    prec = {"bf16-mixed": "bf16_mixed", "fp16-mixed": "fp16_mixed", "fp8-mixed": "bf16_with_fp8_mixed"}.get(r.precision)
    if prec is None:
        raise SpecError(f"NeMo recipes train bf16/fp16/fp8 mixed precision; the plan uses {r.precision}")
    o.append(f"trainer.plugins={prec}")
    if r.recompute != "none":
        o.append(f"model.config.recompute_granularity={r.recompute}")
    if plan.runtime.fused_loss:
        o.append("model.config.cross_entropy_loss_fusion=true")
    if r.train_tokens:
        o.append(f"trainer.max_steps={max(1, round(r.train_tokens / plan.tokens_per_step))}")
    lines = ["#!/usr/bin/env bash", head.rstrip("\n"),
             "# NeMo 2 CLI (pip install nemo_toolkit[nlp] or the NeMo container); on several nodes start it",
             "# through your launcher (NeMo-Run / srun) on every node.", "set -euo pipefail",
             f"nemo llm pretrain -y --factory {recipe} \\"]
    lines += [f"    {x} \\" for x in o[:-1]] + [f"    {o[-1]}"]
    return "\n".join(lines) + "\n"
