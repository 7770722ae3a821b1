"""axolotl YAML (``axolotl train config.yml``).

Keys follow axolotl's config schema (``src/axolotl/utils/schemas/config.py`` in
axolotl-ai-cloud/axolotl): ``base_model``, ``adapter`` (lora|qlora), ``load_in_4bit``/``load_in_8bit``,
``lora_r``/``lora_alpha``/``lora_target_modules``/``lora_target_linear``, ``sequence_len``,
``micro_batch_size``, ``gradient_accumulation_steps``, ``optimizer``, ``bf16``/``fp16``/``fp8``,
``gradient_checkpointing``, ``deepspeed`` (a JSON path), ``fsdp``/``fsdp_config``/``fsdp_version``,
and the device-mesh sizes ``tensor_parallel_size``, ``context_parallel_size``, ``dp_shard_size``,
``dp_replicate_size`` (older: ``sequence_parallel_degree`` for ring-attention context parallelism).
"""

from __future__ import annotations

from typing import Any

from trainledger.errors import SpecError
from trainledger.runconfig.formats import ImportResult, read_accelerate
from trainledger.runconfig.importers._common import num, relevant_unknown, set_hf_optim, set_lora_targets, set_precision, truthy

#: axolotl keys that identify the format (two or more of them)
SIGNATURE = {"base_model", "sequence_len", "micro_batch_size", "adapter", "lora_r", "datasets",
             "sample_packing", "lora_target_linear", "num_epochs"}

#: axolotl's Liger plugin (``plugins: [axolotl.integrations.liger.LigerPlugin]``; its args in
#: src/axolotl/integrations/liger/args.py): which of Liger's kernels it applies
LIGER_KEYS = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy",
              "liger_layer_norm", "liger_cross_entropy")

USED = {"base_model", "adapter", "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha",
        "lora_target_modules", "lora_target_linear", "sequence_len", "micro_batch_size",
        "gradient_accumulation_steps", "batch_size", "optimizer", "bf16", "fp16", "fp8", "tf32",
        "gradient_checkpointing", "gradient_checkpointing_kwargs", "flash_attention",
        "sdp_attention", "xformers_attention", "eager_attention", "deepspeed", "fsdp", "fsdp_config",
        "fsdp_version", "tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree",
        "dp_shard_size", "dp_replicate_size", "max_steps", "sample_packing", "pad_to_sequence_len",
        "lora_dropout", "max_grad_norm", "rl", *LIGER_KEYS}

#: keys that change memory or time and are not modeled (reported when set)
_RELEVANT_WORDS = ("offload", "liger", "unsloth", "kernel", "quant", "relora", "lisa", "peft_",
                   "cut_cross", "fsdp", "parallel", "checkpoint", "compile", "gptq", "8bit", "4bit",
                   "fp8", "float8", "low_cpu", "s2_attention", "flex")


def detect(keys: set[str]) -> bool:
    return "base_model" in keys and len(keys & SIGNATURE) >= 2


def read(d: dict[str, Any], res: ImportResult, where: str) -> None:
    if d.get("base_model"):
        res.set("model", str(d["base_model"]), where)
    adapter = str(d.get("adapter") or "").lower()
    q4, q8 = truthy(d.get("load_in_4bit") or False), truthy(d.get("load_in_8bit") or False)
    if adapter == "qlora" or (adapter == "lora" and q4):
        if not q4 and adapter == "qlora":
            res.notes.append(f"{where}: adapter qlora without load_in_4bit: axolotl loads the base in 4 bit")
        res.set("method", "qlora", where)
    elif adapter == "lora":
        if q8:
            res.unknown_keys.append(f"{where}: load_in_8bit (8-bit base weights are not modeled; sized as LoRA on 16-bit weights)")
        res.set("method", "lora", where)
    elif adapter:
        raise SpecError(f"{where}: adapter {adapter!r} is not modeled (lora and qlora are)")
    elif q4 or q8:
        res.unknown_keys.append(f"{where}: load_in_{'4' if q4 else '8'}bit without an adapter (quantized full fine-tune is not modeled)")
    if adapter:
        res.set("lora_rank", num(d.get("lora_r"), where, "lora_r"), where)
        if d.get("lora_alpha") is not None:
            res.set("lora_alpha", float(d["lora_alpha"]), where)
        if not truthy(d.get("lora_target_linear") or False):
            set_lora_targets(res, d.get("lora_target_modules"), where)
    res.set("seq_len", num(d.get("sequence_len"), where, "sequence_len"), where)
    mb = num(d.get("micro_batch_size"), where, "micro_batch_size")
    rl = str(d.get("rl") or "").lower()
    if rl in ("dpo", "ipo", "orpo", "simpo") and mb:
        # axolotl runs these with TRL's trainers: chosen and rejected in one forward
        # (trl DPOTrainer.concatenated_forward), so the GPU holds 2 × micro_batch_size sequences
        res.notes.append(f"{where}: rl {rl}: chosen + rejected in one batch: micro-batch 2 × {mb}")
        mb *= 2
    elif rl:
        res.unknown_keys.append(f"{where}: rl={rl} (its reference/reward models and rollouts are not modeled)")
    res.set("micro_batch", mb, where)
    res.set("grad_accum", num(d.get("gradient_accumulation_steps"), where, "gradient_accumulation_steps"), where)
    if truthy(d.get("sample_packing")):
        res.notes.append(f"{where}: sample_packing — examples are packed to sequence_len and attend only within "
                         "themselves (flash varlen); give --doc-len (their mean length in tokens) to price "
                         "attention per example")
    if d.get("batch_size") is not None and d.get("gradient_accumulation_steps") is None:
        res.notes.append(f"{where}: batch_size is per-GPU micro-batch × grad-accum in axolotl; "
                         "give gradient_accumulation_steps to be explicit")
    set_precision(res, where, bf16=d.get("bf16"), fp16=d.get("fp16"), fp8=d.get("fp8"))
    if "gradient_checkpointing" in d and d["gradient_checkpointing"] is not None:
        gc = d["gradient_checkpointing"]
        if isinstance(gc, str) and gc.strip().lower() not in ("true", "false", "auto", "1", "0"):
            # e.g. "offload": checkpointing with the saved inputs moved to host memory
            res.set("recompute", "full", where)
            res.unknown_keys.append(f"{where}: gradient_checkpointing={gc} (sized as full recomputation; "
                                    "the offload of checkpoints to host memory is not modeled)")
        else:
            res.set("recompute", "full" if truthy(gc) else "none", where)
    if d.get("optimizer"):
        set_hf_optim(res, d["optimizer"], where, "optimizer")
    if truthy(d.get("flash_attention") or False):
        res.set("attention", "flash", where)
    elif truthy(d.get("eager_attention") or False):
        res.set("attention", "eager", where)
    if d.get("max_grad_norm") is not None:
        res.set("grad_clip", float(d["max_grad_norm"]), where)
    _read_parallel(d, res, where)
    _read_liger(d, res, where)
    if d.get("deepspeed"):
        res.set("framework", "deepspeed", where)
        res.notes.append(f"{where}: deepspeed {d['deepspeed']!r} — pass that JSON with --from too "
                         "for its ZeRO stage and offload")
    relevant_unknown(res, where, d, _RELEVANT_WORDS, USED)


def _read_liger(d: dict[str, Any], res: ImportResult, where: str) -> None:
    """The Liger plugin's switches: any of them on runs Liger (sized as all of its defaults for the
    model type: RMSNorm, RoPE, SwiGLU/GeGLU and the fused linear cross-entropy)."""
    on = [k for k in LIGER_KEYS if truthy(d.get(k) or False)]
    if not on:
        return
    res.set("liger_kernel", True, where)
    main = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")
    off = [k for k in main if k not in on]
    if off:
        res.notes.append(f"{where}: {', '.join(off)} not set: sized as Liger's defaults for the model type "
                         "(all of RMSNorm, RoPE, SwiGLU/GeGLU and the fused linear cross-entropy)")


def _read_parallel(d: dict[str, Any], res: ImportResult, where: str) -> None:
    tp = d.get("tensor_parallel_size")
    cp = d.get("context_parallel_size") or d.get("sequence_parallel_degree")
    res.set("tp", num(tp, where, "tensor_parallel_size"), where)
    res.set("cp", num(cp, where, "context_parallel_size"), where)
    rep, shard = d.get("dp_replicate_size"), d.get("dp_shard_size")
    fsdp, fcfg = d.get("fsdp"), d.get("fsdp_config") or {}
    version = d.get("fsdp_version") or (fcfg.get("fsdp_version") if isinstance(fcfg, dict) else None)
    if fsdp or (isinstance(fcfg, dict) and fcfg) or version:
        if not isinstance(fcfg, dict):
            raise SpecError(f"{where}: fsdp_config must be a mapping")
        words = fsdp if isinstance(fsdp, list) else str(fsdp or "").split()
        cfg = {("fsdp_" + k if not k.startswith("fsdp_") else k): v for k, v in fcfg.items()}
        if version is not None:
            cfg["fsdp_version"] = version
        if "full_shard" in words:
            cfg.setdefault("fsdp_sharding_strategy", "FULL_SHARD")
        if "offload" in words:
            cfg["fsdp_offload_params"] = True
        read_accelerate({"distributed_type": "FSDP", "fsdp_config": cfg}, res, where)
        res.set("framework", "fsdp2" if str(version) == "2" else "pytorch-fsdp", where)
    if rep is not None and shard is not None and num(rep, where, "dp_replicate_size") > 1 \
            and num(shard, where, "dp_shard_size") > 1:
        res.set("hybrid_shard", True, where)
