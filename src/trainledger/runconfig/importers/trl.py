"""TRL script configs (``trl sft|dpo --config x.yaml``; alignment-handbook recipes).

One YAML holds TRL's ``ModelConfig`` (``model_name_or_path``, ``torch_dtype``/``dtype``,
``attn_implementation``, ``use_peft``, ``lora_r``, ``lora_alpha``, ``lora_target_modules``,
``load_in_4bit``/``load_in_8bit``), the trainer config (``SFTConfig``/``DPOConfig``, both
``TrainingArguments`` plus ``max_length``/``max_seq_length``, ``packing``, ``max_prompt_length``,
``beta``, ...) and the script's data arguments (trl/trainer/model_config.py, sft_config.py,
dpo_config.py in huggingface/trl).

DPO: ``DPOTrainer.concatenated_forward`` runs chosen and rejected completions as one batch of
2 × ``per_device_train_batch_size`` sequences (trl/trainer/dpo_trainer.py), so the micro-batch the
GPU holds is doubled. Without PEFT a frozen reference copy of the model is loaded too; that copy is
not modeled and is reported.
"""

from __future__ import annotations

from typing import Any

from trainledger.runconfig.formats import ImportResult, read_trainer_args
from trainledger.runconfig.importers._common import num, relevant_unknown, set_lora_targets

MODEL_CONFIG = {"model_name_or_path", "model_revision", "torch_dtype", "dtype", "trust_remote_code",
                "attn_implementation", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
                "lora_target_modules", "lora_target_parameters", "lora_modules_to_save",
                "lora_task_type", "use_rslora", "use_dora", "load_in_8bit", "load_in_4bit",
                "bnb_4bit_quant_type", "use_bnb_nested_quant", "use_flash_attention_2",
                "model_init_kwargs"}
SCRIPT_ARGS = {"dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split",
               "dataset_streaming", "gradient_checkpointing_use_reentrant", "ignore_bias_buffers",
               "dataset_mixer", "dataset_splits", "preprocessing_num_workers", "dataset_configs",
               "chat_template", "text_column", "auto_insert_empty_system_msg", "truncation_side"}
SFT_KEYS = {"max_length", "max_seq_length", "packing", "packing_strategy", "padding_free",
            "dataset_text_field", "completion_only_loss", "assistant_only_loss", "dataset_kwargs",
            "dataset_num_proc", "eos_token", "pad_token", "padding_side", "pad_to_multiple_of",
            "neftune_noise_alpha", "activation_offloading", "use_liger_kernel", "loss_type"}
DPO_KEYS = {"beta", "max_prompt_length", "max_completion_length", "max_target_length", "loss_type",
            "label_smoothing", "reference_free", "precompute_ref_log_probs", "ref_model_init_kwargs",
            "sync_ref_model", "ref_adapter_name", "model_adapter_name", "rpo_alpha", "f_divergence_type",
            "generate_during_eval", "is_encoder_decoder", "disable_dropout", "use_logits_to_keep",
            "padding_value", "label_pad_token_id", "truncation_mode", "force_use_ref_model",
            "tools", "use_weighting", "ld_alpha"}
_DPO_SIGNS = {"beta", "max_prompt_length", "precompute_ref_log_probs", "reference_free", "rpo_alpha"}


def detect(keys: set[str]) -> bool:
    model = "model_name_or_path" in keys
    trl_only = keys & (MODEL_CONFIG - {"model_name_or_path", "trust_remote_code"}) | keys & (SFT_KEYS | _DPO_SIGNS)
    trainer = keys & {"per_device_train_batch_size", "output_dir", "gradient_accumulation_steps", "learning_rate"}
    return bool(model and (trl_only or trainer)) and not keys & {"finetuning_type", "stage", "cutoff_len"}


def read(d: dict[str, Any], res: ImportResult, where: str) -> None:
    keys = set(d) - {"_trainledger"}
    if d.get("model_name_or_path"):
        res.set("model", str(d["model_name_or_path"]).strip(), where)
    trainer_part = {k: v for k, v in d.items() if k not in MODEL_CONFIG | SCRIPT_ARGS | DPO_KEYS}
    is_dpo = bool(keys & _DPO_SIGNS)
    pdb = d.get("per_device_train_batch_size")
    if is_dpo and pdb is not None:
        trainer_part.pop("per_device_train_batch_size")
        res.set("micro_batch", 2 * num(pdb, where, "per_device_train_batch_size"), where)
        res.notes.append(f"{where}: DPO runs chosen + rejected as one batch: micro-batch "
                         f"2 × {pdb} = {2 * int(pdb)} sequences (trl DPOTrainer.concatenated_forward)")
    read_trainer_args(trainer_part, res, where)
    if d.get("packing") is not None:
        res.notes.append(f"{where}: packing {d['packing']} — every sequence is "
                         f"{'filled to' if d['packing'] else 'padded to at most'} max_length tokens")
    if d.get("packing") or d.get("padding_free"):
        res.notes.append(f"{where}: packed examples attend only within themselves (padding-free, flash varlen); "
                         "give --doc-len (their mean length in tokens) to price attention per example")
    # TRL applies LoRA only with use_peft: true (ModelConfig.use_peft defaults to False, lora_r to 16)
    peft = bool(d.get("use_peft"))
    if not peft and d.get("lora_r") is not None:
        res.notes.append(f"{where}: lora_r without use_peft: true — TRL trains all weights (sized as full)")
    q4, q8 = bool(d.get("load_in_4bit")), bool(d.get("load_in_8bit"))
    if peft:
        res.set("method", "qlora" if q4 else "lora", where)
        res.set("lora_rank", num(d.get("lora_r"), where, "lora_r"), where)
        if d.get("lora_alpha") is not None:
            res.set("lora_alpha", float(d["lora_alpha"]), where)
        set_lora_targets(res, d.get("lora_target_modules"), where)
        if q8:
            res.unknown_keys.append(f"{where}: load_in_8bit (8-bit base weights not modeled; sized as 16-bit LoRA)")
    elif q4 or q8:
        res.unknown_keys.append(f"{where}: load_in_{'4' if q4 else '8'}bit without use_peft (not trainable as a full fine-tune)")
    if d.get("attn_implementation") in ("flash_attention_2", "flash_attention_3") or d.get("use_flash_attention_2"):
        res.set("attention", "flash", where)
    elif d.get("attn_implementation") == "eager":
        res.set("attention", "eager", where)
    if is_dpo and not peft and not d.get("precompute_ref_log_probs") and not d.get("reference_free"):
        res.unknown_keys.append(f"{where}: beta (DPO without PEFT loads a frozen reference model: "
                                "its weights are not in this estimate)")
    relevant_unknown(res, where, d, ("liger", "offload", "padding_free", "neftune"),
                     set(_trainer_known()) | MODEL_CONFIG | SCRIPT_ARGS | DPO_KEYS | {"max_length", "max_seq_length", "packing"})
    # keys of SFT/DPO configs that are not TrainingArguments fields are known, not unknown
    res.unknown_keys[:] = [u for u in res.unknown_keys
                           if not (u.startswith(f"{where}: ") and u[len(where) + 2:] in SFT_KEYS | DPO_KEYS | MODEL_CONFIG | SCRIPT_ARGS)]


def _trainer_known() -> set[str]:
    from trainledger.runconfig.formats import trainer_known

    return trainer_known()
