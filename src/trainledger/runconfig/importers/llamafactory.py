"""LLaMA-Factory YAML (``llamafactory-cli train x.yaml``).

Keys follow LLaMA-Factory's argument dataclasses (src/llamafactory/hparams/model_args.py,
finetuning_args.py, data_args.py in hiyouga/LLaMA-Factory) on top of ``TrainingArguments``:
``model_name_or_path``, ``stage`` (pt|sft|rm|ppo|dpo|kto), ``finetuning_type`` (lora|full|freeze),
``lora_rank``, ``lora_alpha``, ``lora_target`` (``all`` or a comma list), ``quantization_bit``
(4|8) with ``quantization_method``, ``cutoff_len`` (the sequence length), ``flash_attn``,
``deepspeed``.

Gradient checkpointing is ON unless ``disable_gradient_checkpointing: true``
(src/llamafactory/model/model_utils/checkpointing.py, ``prepare_model_for_training``), so a file that
does not mention it trains with full recomputation.
"""

from __future__ import annotations

from typing import Any

from trainledger.errors import SpecError
from trainledger.runconfig.formats import ImportResult, read_trainer_args, trainer_known as _trainer_fields
from trainledger.runconfig.importers._common import num, set_lora_targets

OWN = {"model_name_or_path", "adapter_name_or_path", "trust_remote_code", "stage", "do_train",
       "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "additional_target",
       "quantization_bit", "quantization_method", "quantization_type", "double_quantization",
       "cutoff_len", "dataset", "eval_dataset", "template", "max_samples", "overwrite_cache",
       "preprocessing_num_workers", "dataset_dir", "plot_loss", "flash_attn", "packing", "neat_packing",
       "disable_gradient_checkpointing", "val_size", "pref_beta", "pref_loss", "image_max_pixels",
       "video_max_pixels", "rope_scaling", "enable_liger_kernel", "use_unsloth", "use_dora",
       "use_rslora", "pissa_init", "freeze_trainable_layers", "freeze_trainable_modules",
       "upcast_layernorm", "upcast_lmhead_output", "infer_backend", "ddp_timeout", "resume_from_checkpoint",
       "dataloader_num_workers", "pure_bf16", "use_badam", "use_galore", "use_apollo", "shift_attn",
       "moe_aux_loss_coef", "disable_shuffling", "streaming", "mix_strategy", "tokenized_path",
       "reward_model", "reward_model_type", "ppo_epochs", "predict_with_generate", "do_predict",
       "do_eval", "eval_strategy", "eval_steps", "per_device_eval_batch_size", "kt_optimize_rule",
       "use_kt", "cpu_infer", "chunk_size", "report_to", "run_name"}

_NOT_MODELED = ("use_galore", "use_badam", "use_apollo", "use_unsloth",
                "use_dora", "pure_bf16", "rope_scaling", "neat_packing", "shift_attn", "use_kt",
                "freeze_trainable_layers")


def detect(keys: set[str]) -> bool:
    return bool(keys & {"finetuning_type", "cutoff_len"}) or ("stage" in keys and "model_name_or_path" in keys)


def read(d: dict[str, Any], res: ImportResult, where: str) -> None:
    if d.get("model_name_or_path"):
        res.set("model", str(d["model_name_or_path"]), where)
    stage = str(d.get("stage", "sft")).lower()
    ft = str(d.get("finetuning_type", "lora")).lower()  # LLaMA-Factory's default is lora
    qbit = d.get("quantization_bit")
    if ft == "lora":
        if qbit is not None and int(qbit) == 4:
            res.set("method", "qlora", where)
        else:
            res.set("method", "lora", where)
            if qbit is not None:
                res.unknown_keys.append(f"{where}: quantization_bit {qbit} ({qbit}-bit base weights are not modeled; sized as LoRA on 16-bit weights)")
        res.set("lora_rank", num(d.get("lora_rank", 8), where, "lora_rank"), where)
        if d.get("lora_alpha") is not None:
            res.set("lora_alpha", float(d["lora_alpha"]), where)
        set_lora_targets(res, d.get("lora_target", "all"), where)
    elif ft == "full":
        res.set("method", "full", where)
    else:
        raise SpecError(f"{where}: finetuning_type {ft!r} is not modeled (lora and full are)")
    if "finetuning_type" not in d:
        res.notes.append(f"{where}: no finetuning_type: LLaMA-Factory's default is lora")
    res.set("seq_len", num(d.get("cutoff_len"), where, "cutoff_len"), where)
    trainer = {k: v for k, v in d.items() if k in _trainer_fields() and k not in OWN}
    pdb = d.get("per_device_train_batch_size")
    if stage in ("dpo", "kto") and pdb is not None and stage == "dpo":
        trainer.pop("per_device_train_batch_size", None)
        res.set("micro_batch", 2 * num(pdb, where, "per_device_train_batch_size"), where)
        res.notes.append(f"{where}: DPO runs chosen + rejected together: micro-batch 2 × {pdb}")
    if stage in ("ppo", "rm", "kto") or (stage == "dpo" and ft == "full"):
        res.unknown_keys.append(f"{where}: stage {stage} (reference/reward/value models are not modeled)")
    trainer.setdefault("gradient_checkpointing", not d.get("disable_gradient_checkpointing", False))
    read_trainer_args(trainer, res, where)
    fa = str(d.get("flash_attn", "auto")).lower()
    if fa == "fa2":
        res.set("attention", "flash", where)
    elif fa == "disabled":
        res.set("attention", "eager", where)
    if d.get("deepspeed"):
        res.set("framework", "deepspeed", where)
        res.notes.append(f"{where}: deepspeed {d['deepspeed']!r} — pass that JSON with --from too")
    if d.get("enable_liger_kernel") is not None:  # model_args.enable_liger_kernel: Liger's defaults
        res.set("liger_kernel", bool(d["enable_liger_kernel"]), where)
    for k in _NOT_MODELED:
        if d.get(k):
            res.unknown_keys.append(f"{where}: {k}")
    for k in sorted(set(d) - OWN - _trainer_fields() - {"_trainledger"}):
        res.unknown_keys.append(f"{where}: {k}")
