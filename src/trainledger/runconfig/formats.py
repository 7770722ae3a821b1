"""The formats every training tool shares, read into plan inputs (:class:`ImportResult`).

DeepSpeed JSON, Accelerate config YAML/JSON, Hugging Face ``TrainingArguments`` (and TRL's
keys), peft ``LoraConfig``, bitsandbytes quantization configs and torchrun/Slurm launch lines.
Every key is accounted for: used for sizing, known without effect on sizing, or unknown (reported).
:mod:`trainledger.runconfig.importer` detects a file's format and dispatches here; the tool
importers (:mod:`trainledger.runconfig.importers`: axolotl, TRL, LLaMA-Factory, torchtitan, Megatron,
NeMo) reuse these readers for the sections they embed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainledger.errors import CatalogError, PlanError, SpecError
from trainledger.estimate.time.efficiency import gpu_efficiency
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import DEFAULT_GPU
from trainledger.estimate.time.stack import stops_early_by_default, tp_overlaps_by_default

_AUTO = "auto"


def _tp_overlap_default(framework: str, inputs: dict[str, Any]) -> bool | None:
    """The stack's own TP-overlap choice on the GPU the imported inputs name (the default GPU when
    none does); None when that GPU cannot be read here (a spec file): no normalisation then."""
    try:
        gpu = load_gpu(str(inputs.get("gpu") or DEFAULT_GPU))
    except (CatalogError, SpecError, OSError):
        return None
    return tp_overlaps_by_default(framework, gpu_efficiency(gpu.architecture).family)


@dataclass
class ImportResult:
    """Plan inputs read from config files, with where each came from and what was not used."""

    inputs: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    header: dict[str, Any] = field(default_factory=dict)
    unknown_keys: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    checks: list[tuple[str, Any, str]] = field(default_factory=list)

    def set(self, key: str, value: Any, where: str) -> None:
        if value is None or value == _AUTO:
            return
        old = self.inputs.get(key)
        if old is not None and old != value:
            raise PlanError(f"{key}: {self.sources[key]} says {old!r} but {where} says {value!r}; "
                            f"make the files agree")
        self.inputs[key] = value
        self.sources[key] = where

    def merged(self) -> dict[str, Any]:
        """Header inputs (lowest priority), overridden by what the files' own keys say."""
        out = dict(self.header)
        fw = self.inputs.get("framework") or self.header.get("framework") or "hf"
        for k, v in self.inputs.items():
            if (k == "checkpoint_early_stop" and self.header.get(k) is None
                    and v == stops_early_by_default(fw)):
                # a file states the checkpoint's early stop (our exports do, so that the launcher
                # runs what was priced); the stack's own default is no choice of the user's
                continue
            if k == "tp_comm_overlap" and self.header.get(k) is None and v == _tp_overlap_default(fw, out):
                continue  # the same for a script's --tp-comm-overlap (or its absence) on the stack's GPU
            if k in self.header and self.header[k] != v:
                self.notes.append(f"{k}: {self.sources[k]} says {v!r}, its trainledger header says "
                                  f"{self.header[k]!r} (edited after export?) — using {v!r}")
            out[k] = v
        if out.get("method") in ("lora", "qlora") and self.inputs.get("precision") in ("bf16-mixed", "fp16-mixed"):
            # a Trainer/accelerate bf16 or fp16 flag turns on autocast; the frozen base keeps the dtype it
            # was loaded in (the checkpoint's, transformers' default), which the method default states
            if self.header.get("precision") is not None:
                out["precision"] = self.header["precision"]
            else:  # the output states the policy used
                out.pop("precision")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": self.merged(), "sources": self.sources, "formats": self.formats,
                "unknown_keys": self.unknown_keys, "ignored_keys": self.ignored_keys, "notes": self.notes}


# ----------------------------------------------------------------------------- known keys
DS_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
          "gradient_clipping", "bf16", "fp16", "zero_optimization", "optimizer", "scheduler",
          "steps_per_print", "wall_clock_breakdown", "activation_checkpointing",
          "zero_allow_untested_optimizer", "communication_data_type", "prescale_gradients",
          "gradient_predivide_factor", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
          "comms_logger", "dump_state", "amp", "data_types", "zero_force_ds_cpu_optimizer",
          "memory_breakdown", "checkpoint", "seq_parallel_communication_data_type"}
DS_ZERO = {"stage", "offload_optimizer", "offload_param", "overlap_comm", "contiguous_gradients",
           "reduce_bucket_size", "allgather_bucket_size", "reduce_scatter", "allgather_partitions",
           "round_robin_gradients", "sub_group_size", "stage3_prefetch_bucket_size",
           "stage3_param_persistence_threshold", "stage3_max_live_parameters",
           "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
           "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
           "mics_shard_size", "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
           "cpu_offload", "memory_efficient_linear"}
ACCEL_TOP = {"compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
             "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip",
             "main_process_port", "rdzv_backend", "same_network", "main_training_function",
             "enable_cpu_affinity", "fp8_config", "deepspeed_config", "fsdp_config",
             "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name",
             "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm",
             "tpu_env", "dynamo_config"}
ACCEL_DS = {"zero_stage", "gradient_accumulation_steps", "gradient_clipping", "offload_optimizer_device",
            "offload_param_device", "offload_optimizer_nvme_path", "offload_param_nvme_path",
            "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_config_file", "deepspeed_multinode_launcher",
            "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter"}
ACCEL_FSDP = {"fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
              "fsdp_reshard_after_forward", "fsdp_offload_params", "fsdp_activation_checkpointing",
              "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading", "fsdp_sharding_strategy",
              "fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_use_orig_params",
              "fsdp_sync_module_states", "fsdp_min_num_params"}
TRL_KEYS = {"max_length", "max_seq_length", "packing", "dataset_text_field"}
LORA_FALLBACK = {"r", "lora_alpha", "lora_dropout", "target_modules", "bias", "task_type",
                 "peft_type", "modules_to_save", "fan_in_fan_out", "init_lora_weights",
                 "base_model_name_or_path", "inference_mode", "use_rslora", "use_dora", "revision",
                 "rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern"}
BNB_KEYS = {"load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
            "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage", "llm_int8_threshold"}

OPTIM_FROM_HF = {"adamw_torch": "adamw", "adamw_hf": "adamw", "adamw_torch_fused": "adamw-fused",
                 "adamw_bnb_8bit": "adamw-8bit", "adamw_8bit": "adamw-8bit",
                 "paged_adamw_8bit": "adamw-8bit", "adafactor": "adafactor", "lion_32bit": "lion",
                 "paged_lion_32bit": "lion", "sgd": "sgd",
                 # paged = the same states, paged to host memory under pressure (bitsandbytes)
                 "paged_adamw_32bit": "adamw", "paged_adamw": "adamw", "adamw_apex_fused": "adamw-fused",
                 "adamw_torch_npu_fused": "adamw-fused", "adam": "adamw", "adamw": "adamw",
                 "lion_8bit": "lion", "paged_lion_8bit": "lion"}
#: TrainingArguments fields of older transformers releases (removed or renamed since): known, no
#: effect on memory or time
LEGACY_TRAINER = {"overwrite_output_dir", "warmup_ratio", "evaluation_strategy", "no_cuda",
                  "use_mps_device", "push_to_hub_model_id", "push_to_hub_organization",
                  "push_to_hub_token", "fp16_backend", "logging_dir", "use_legacy_prediction_loop",
                  "save_on_each_node", "per_gpu_train_batch_size", "per_gpu_eval_batch_size"}


TRAINER_FALLBACK = {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
                    "gradient_checkpointing", "gradient_checkpointing_kwargs", "optim", "optim_args",
                    "max_steps", "fsdp", "fsdp_config", "deepspeed", "output_dir", "max_grad_norm"}


def _source_fields(package: str, *where: tuple[str, str]) -> set[str] | None:
    """Field names of dataclasses in an installed package, read from its source without importing it.

    Importing transformers or peft takes seconds (peft imports torch); the field names are the
    class-level annotated assignments of each ``(module file, class name)`` in ``where``.
    None when the package or a class is not found (the caller falls back to a fixed list).
    """
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    out: set[str] = set()
    for rel, cls in where:
        try:
            tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return None
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            return None
        out |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return out or None


@lru_cache(maxsize=1)
def _trainer_fields() -> frozenset[str]:
    """TrainingArguments' fields (transformers/training_args.py), without importing transformers."""
    return frozenset(_source_fields("transformers", ("training_args.py", "TrainingArguments")) or TRAINER_FALLBACK)


def trainer_known() -> frozenset[str]:
    """TrainingArguments' fields plus those of older transformers releases (known, no effect)."""
    return _trainer_fields() | LEGACY_TRAINER


@lru_cache(maxsize=1)
def _lora_fields() -> frozenset[str]:
    """LoraConfig's fields and its PeftConfig bases' (peft/tuners/lora/config.py, peft/config.py)."""
    got = _source_fields("peft", ("tuners/lora/config.py", "LoraConfig"), ("config.py", "PeftConfig"),
                         ("config.py", "PeftConfigMixin"))
    return frozenset((got | {"peft_type", "base_model_name_or_path"}) if got else LORA_FALLBACK)


def _unknown(res: ImportResult, where: str, keys: set[str], known: set[str]) -> None:
    for k in sorted(keys - known):
        res.unknown_keys.append(f"{where}: {k}")


def _ignored(res: ImportResult, where: str, keys: set[str]) -> None:
    for k in sorted(keys):
        res.ignored_keys.append(f"{where}: {k}")


def num_value(v: Any, where: str, key: str) -> int | None:
    if v is None or v == _AUTO:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or int(v) != v:
        raise SpecError(f"{where}: {key} must be a positive integer or 'auto' (got {v!r})")
    return int(v)


# ----------------------------------------------------------------------------- per format
def _enabled(section: Any) -> bool:
    return isinstance(section, dict) and section.get("enabled") not in (False, None, _AUTO)


def read_deepspeed(d: dict[str, Any], res: ImportResult, where: str) -> None:
    keys = set(d) - {"_trainledger"}
    _unknown(res, where, keys, DS_TOP)
    res.set("framework", "deepspeed", where)
    mb = num_value(d.get("train_micro_batch_size_per_gpu"), where, "train_micro_batch_size_per_gpu")
    ga = num_value(d.get("gradient_accumulation_steps"), where, "gradient_accumulation_steps")
    tb = num_value(d.get("train_batch_size"), where, "train_batch_size")
    res.set("micro_batch", mb, where)
    res.set("grad_accum", ga, where)
    if tb is not None:
        res.checks.append(("train_batch_size", tb, where))
    if _enabled(d.get("bf16")) and _enabled(d.get("fp16")):
        raise PlanError(f"{where}: bf16 and fp16 are both enabled; enable one")
    if _enabled(d.get("bf16")):
        res.set("precision", "bf16-mixed", where)
    elif _enabled(d.get("fp16")):
        res.set("precision", "fp16-mixed", where)
    elif "bf16" in d or "fp16" in d:
        res.set("precision", "fp32", where)
    z = d.get("zero_optimization") or {}
    if not isinstance(z, dict):
        raise SpecError(f"{where}: zero_optimization must be an object")
    _unknown(res, f"{where} zero_optimization", set(z), DS_ZERO)
    res.set("framework", "deepspeed", where)  # a DeepSpeed config runs under DeepSpeed's semantics
    from trainledger.spec.runtime import DS_DEFAULTS

    for key, dflt in DS_DEFAULTS.items():  # only what differs from DeepSpeed's defaults
        if key in z:  # DeepSpeed accepts 5e8-style floats for these element counts
            v = num_value(int(z[key]) if isinstance(z[key], float) else z[key], where, key)
            if v != dflt:
                res.set("ds_" + key, v, where)
    if isinstance(z.get("overlap_comm"), bool) and z["overlap_comm"] != (z.get("stage") == 3):
        res.set("ds_overlap_comm", z["overlap_comm"], where)
    if "stage" in z:
        stage = z["stage"]
        if stage not in (0, 1, 2, 3):
            raise SpecError(f"{where}: zero_optimization.stage must be 0..3 (got {stage!r})")
        res.set("zero", stage, where)
    off_opt = (z.get("offload_optimizer") or {}).get("device", "none")
    off_par = (z.get("offload_param") or {}).get("device", "none")
    if off_par not in ("none", None):
        res.set("offload", "params", where)
    elif off_opt not in ("none", None):
        res.set("offload", "optimizer", where)
    opt = d.get("optimizer")
    if isinstance(opt, dict):
        t = str(opt.get("type", "")).lower()
        params = opt.get("params") or {}
        mapped = {"adamw": "adamw", "adam": "adamw", "lion": "lion", "sgd": "sgd"}.get(t)
        if mapped == "sgd" and params.get("momentum"):
            mapped = "sgd-momentum"
        if mapped is None:
            res.notes.append(f"{where}: optimizer type {opt.get('type')!r} is not modeled; keeping the default")
        res.set("optimizer", mapped, where)
    _ignored(res, where, keys & {"scheduler", "steps_per_print", "wall_clock_breakdown", "tensorboard",
                                 "wandb", "csv_monitor", "flops_profiler", "comms_logger"})


def _accel_precision(v: Any) -> str | None:
    return {"no": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed", "fp8": "fp8-mixed"}.get(str(v)) \
        if v is not None else None


def read_accelerate(d: dict[str, Any], res: ImportResult, where: str) -> None:
    _unknown(res, where, set(d), ACCEL_TOP)
    res.set("precision", _accel_precision(d.get("mixed_precision")), where)
    machines = num_value(d.get("num_machines", 1), where, "num_machines") or 1
    procs = num_value(d.get("num_processes"), where, "num_processes")
    if procs is not None:
        if procs % machines:
            raise PlanError(f"{where}: num_processes {procs} is not a multiple of num_machines {machines}")
        res.set("gpus", procs, where)
        res.set("gpus_per_node", procs // machines, where)
    dt = str(d.get("distributed_type", "NO")).upper()
    _read_parallelism_config(d.get("parallelism_config"), res, where)
    if dt == "DEEPSPEED":
        res.set("framework", "deepspeed", where)
        ds = d.get("deepspeed_config") or {}
        _unknown(res, f"{where} deepspeed_config", set(ds), ACCEL_DS)
        if "deepspeed_config_file" in ds:
            res.notes.append(f"{where}: deepspeed_config_file {ds['deepspeed_config_file']!r} — pass it with --from too")
        res.set("zero", ds.get("zero_stage"), where)
        res.set("grad_accum", num_value(ds.get("gradient_accumulation_steps"), where, "gradient_accumulation_steps"), where)
        off_o, off_p = ds.get("offload_optimizer_device", "none"), ds.get("offload_param_device", "none")
        if off_p not in ("none", None):
            res.set("offload", "params", where)
        elif off_o not in ("none", None):
            res.set("offload", "optimizer", where)
    elif dt == "FSDP":
        f = d.get("fsdp_config") or {}
        _unknown(res, f"{where} fsdp_config", set(f), ACCEL_FSDP)
        strategy = str(f.get("fsdp_sharding_strategy", "")).upper()
        reshard = f.get("fsdp_reshard_after_forward", True)
        if strategy not in ("NO_SHARD", "3"):
            res.set("framework", "fsdp2" if str(f.get("fsdp_version", 1)) == "2" else "pytorch-fsdp", where)
        if strategy in ("HYBRID_SHARD", "4") or str(reshard).upper() == "HYBRID_SHARD":
            res.set("zero", 3, where)
            res.set("hybrid_shard", True, where)
        elif strategy in ("SHARD_GRAD_OP", "2") or reshard is False or str(reshard).upper() == "SHARD_GRAD_OP":
            res.set("zero", 2, where)
        elif strategy in ("NO_SHARD", "3"):
            # FSDP without sharding replicates like DDP: the hf stack's DDP, since on an FSDP stack
            # every --zero shards (memory.runtimes.fsdp_sharded)
            res.set("framework", "hf", where)
            res.set("zero", 0, where)
        else:
            res.set("zero", 3, where)
        if f.get("fsdp_offload_params"):
            res.set("offload", "params", where)
        if f.get("fsdp_activation_checkpointing"):
            res.set("recompute", "full", where)
        if strategy not in ("NO_SHARD", "3"):
            # accelerate launch's --fsdp_cpu_ram_efficient_loading defaults to true: local rank 0
            # reads the checkpoint, the others start on the meta device
            eff = str(f.get("fsdp_cpu_ram_efficient_loading", True)).lower() in ("true", "1", "yes")
            res.set("model_loading", "rank0" if eff else "every-rank", where)
    elif dt not in ("NO", "MULTI_GPU", "MULTI_CPU"):
        res.notes.append(f"{where}: distributed_type {dt} is not modeled; treated as plain data parallel")


#: accelerate's ParallelismConfig keys in a config file (accelerate/commands/launch.py
#: ``--parallelism_config_*``; FSDP2 only)
ACCEL_PARALLEL = {"parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size",
                  "parallelism_config_tp_size", "parallelism_config_cp_size",
                  "parallelism_config_cp_backend", "parallelism_config_cp_comm_strategy",
                  "parallelism_config_sp_size", "parallelism_config_sp_backend"}


def _read_parallelism_config(p: Any, res: ImportResult, where: str) -> None:
    if not p:
        return
    if not isinstance(p, dict):
        raise SpecError(f"{where}: parallelism_config must be a mapping")
    _unknown(res, f"{where} parallelism_config", set(p), ACCEL_PARALLEL)
    key = "parallelism_config_"
    res.set("tp", num_value(p.get(key + "tp_size"), where, key + "tp_size"), where)
    res.set("cp", num_value(p.get(key + "cp_size"), where, key + "cp_size"), where)
    rep = num_value(p.get(key + "dp_replicate_size"), where, key + "dp_replicate_size") or 1
    shard = num_value(p.get(key + "dp_shard_size"), where, key + "dp_shard_size") or 1
    if p.get(key + "dp_replicate_size") is not None or p.get(key + "dp_shard_size") is not None:
        res.set("dp", rep * shard, where)
    if rep > 1 and shard > 1:
        res.set("hybrid_shard", True, where)
    if (p.get(key + "sp_size") or 1) > 1:
        res.unknown_keys.append(f"{where} parallelism_config: {key}sp_size (Ulysses sequence parallelism not modeled)")


def read_trainer_args(d: dict[str, Any], res: ImportResult, where: str) -> None:
    keys = set(d) - {"_trainledger"}
    known = trainer_known() | TRL_KEYS
    _unknown(res, where, keys, known)
    res.set("micro_batch", num_value(d.get("per_device_train_batch_size"), where, "per_device_train_batch_size"), where)
    res.set("grad_accum", num_value(d.get("gradient_accumulation_steps"), where, "gradient_accumulation_steps"), where)
    if d.get("bf16") and d.get("fp16"):
        raise PlanError(f"{where}: bf16 and fp16 are both true; set one")
    if d.get("bf16"):
        res.set("precision", "bf16-mixed", where)
    elif d.get("fp16"):
        res.set("precision", "fp16-mixed", where)
    for key in ("gradient_checkpointing", "activation_checkpointing"):  # the latter: transformers >= 5
        if key in d:
            res.set("recompute", "full" if d[key] else "none", where)
        kw = d.get(key + "_kwargs")
        if isinstance(kw, dict):
            # passed to torch.utils.checkpoint.checkpoint: reentrant never stops early; non-reentrant
            # does unless early_stop=False (torch >= 2.1); not stated: the stack's default
            if kw.get("use_reentrant") is True:
                res.set("checkpoint_early_stop", False, where)
            elif "early_stop" in kw:
                res.set("checkpoint_early_stop", bool(kw["early_stop"]), where)
    if d.get("use_liger_kernel") is not None:
        # TrainingArguments.use_liger_kernel (transformers >= 4.45): the Trainer applies Liger's
        # default kernels for the model type (liger_kernel_config picks a subset)
        res.set("liger_kernel", bool(d["use_liger_kernel"]), where)
        if d.get("use_liger_kernel") and d.get("liger_kernel_config"):
            res.notes.append(f"{where}: liger_kernel_config {d['liger_kernel_config']!r} is sized as Liger's "
                             "default kernels for the model type")
    if "optim" in d:
        o = str(d["optim"])
        mapped = OPTIM_FROM_HF.get(o)
        if mapped == "sgd" and "momentum" in str(d.get("optim_args") or ""):
            mapped = "sgd-momentum"
        if mapped is None:
            res.notes.append(f"{where}: optim {o!r} is not modeled; keeping the default optimizer")
        res.set("optimizer", mapped, where)
    if d.get("max_grad_norm") is not None:
        res.set("grad_clip", float(d["max_grad_norm"]), where)
    seq = d.get("max_length", d.get("max_seq_length"))
    res.set("seq_len", num_value(seq, where, "max_length"), where)
    if d.get("max_steps") not in (None, -1):
        res.checks.append(("max_steps", num_value(d["max_steps"], where, "max_steps"), where))
    if d.get("fsdp"):
        words = str(d["fsdp"]).split() if isinstance(d["fsdp"], str) else list(d["fsdp"])
        zero = 3 if ("full_shard" in words or "hybrid_shard" in words) else 2 if "shard_grad_op" in words else None
        res.set("zero", zero, where)
        if "hybrid_shard" in words:
            res.set("hybrid_shard", True, where)
        if "offload" in words:
            res.set("offload", "params", where)
        fc = d.get("fsdp_config") if isinstance(d.get("fsdp_config"), dict) else {}
        version = fc.get("version", fc.get("fsdp_version", 1))
        res.set("framework", "fsdp2" if str(version) == "2" else "pytorch-fsdp", where)
        # TrainingArguments.fsdp_config cpu_ram_efficient_loading: off unless set (every process
        # builds the model on the CPU)
        eff = fc.get("cpu_ram_efficient_loading", fc.get("fsdp_cpu_ram_efficient_loading", False))
        res.set("model_loading", "rank0" if str(eff).lower() in ("true", "1", "yes") else "every-rank", where)
    if d.get("deepspeed"):
        res.set("framework", "deepspeed", where)
    used = {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "max_grad_norm",
            "gradient_checkpointing", "gradient_checkpointing_kwargs", "activation_checkpointing",
            "activation_checkpointing_kwargs", "optim", "optim_args", "max_length", "max_seq_length", "max_steps", "fsdp", "fsdp_config", "deepspeed"}
    _ignored(res, where, (keys & known) - used)


def read_peft(d: dict[str, Any], res: ImportResult, where: str) -> None:
    keys = set(d) - {"_trainledger"}
    _unknown(res, where, keys, _lora_fields())
    if str(d.get("peft_type", "LORA")).upper() != "LORA":
        raise SpecError(f"{where}: peft_type {d.get('peft_type')!r} is not modeled; LoRA is")
    res.set("lora_rank", num_value(d.get("r"), where, "r"), where)
    if d.get("lora_alpha") is not None:
        res.set("lora_alpha", float(d["lora_alpha"]), where)
    tm = d.get("target_modules")
    if isinstance(tm, str):
        if tm == "all-linear":
            tm = None
            res.notes.append(f"{where}: target_modules 'all-linear' = the default (all linear layers)")
        else:
            tm = [tm]
    if tm is not None:
        res.set("lora_targets", tuple(sorted(tm)) if isinstance(tm, (list, set, tuple)) else tm, where)
    if "method" not in res.inputs:
        res.set("method", "lora", where)


def read_bnb(d: dict[str, Any], res: ImportResult, where: str) -> None:
    _unknown(res, where, set(d) - {"_trainledger"}, BNB_KEYS)
    if d.get("load_in_4bit"):
        res.inputs["method"] = "qlora"
        res.sources["method"] = where
    elif d.get("load_in_8bit"):
        res.notes.append(f"{where}: 8-bit base weights are not modeled as a method; sizing as LoRA")


_LAUNCH_RE = {
    "nnodes": re.compile(r"--nnodes[= ](\d+)"),
    "nproc": re.compile(r"--nproc[-_]per[-_]node[= ](\d+)"),
    "sbatch_nodes": re.compile(r"^#SBATCH\s+--nodes[= ](\d+)", re.M),
    "sbatch_gpus": re.compile(r"^#SBATCH\s+--gpus-per-node[= ](\d+)", re.M),
}


def read_launch(text: str, res: ImportResult, where: str) -> None:
    def grab(name: str) -> int | None:
        m = _LAUNCH_RE[name].search(text)
        return int(m.group(1)) if m else None

    nodes = grab("sbatch_nodes") or grab("nnodes")
    per_node = grab("sbatch_gpus") or grab("nproc")
    if nodes and per_node:
        res.set("gpus", nodes * per_node, where)
        res.set("gpus_per_node", per_node, where)
    elif per_node:
        res.set("gpus_per_node", per_node, where)
