"""Megatron-Bridge ``ConfigContainer`` YAML (NVIDIA's Megatron-Core training library, NeMo's successor
for LLM training: github:NVIDIA-NeMo/Megatron-Bridge).

Two shapes: the whole container as the library writes it (``_target_:
megatron.bridge.training.config.ConfigContainer``, e.g. scripts/performance/dryrun_configs/*.yaml, the
``config.yaml`` a run saves) and the override files of its examples, whose sections may carry a
``_config`` suffix (``model_config``, ``train_config``, ...). Sections read: ``model`` (the model
provider: ``hf_model_id``, the parallel sizes, ``seq_length``, recomputation, the MoE dispatcher and
its overlaps, ``cross_entropy_loss_fusion``, ``attention_backend``), ``ddp`` (distributed optimizer,
Megatron-FSDP, ``grad_reduce_in_fp32``), ``optimizer`` (``optimizer``, ``clip_grad``, the precision-aware
optimizer's moment dtypes ``exp_avg_dtype`` / ``exp_avg_sq_dtype``), ``mixed_precision`` (``bf16``/``fp16``, ``fp8`` = the fp8 format,
``fp8_recipe``, ``fp8_param``, ``fp4``), ``comm_overlap`` (``tp_comm_overlap``,
``overlap_moe_expert_parallel_comm``), ``dataset`` (``sequence_length``) and ``train``
(``global_batch_size``, ``micro_batch_size``, ``train_iters``). Their keys are Megatron-Core's own
(TransformerConfig, DistributedDataParallelConfig, OptimizerConfig), so the Megatron-LM argument
reader sizes them; this module lays the sections on top of each other in the order the library
applies them (the mixed-precision and comm-overlap configs are applied onto the model config at
setup: they win) and renames the few keys that differ from Megatron-LM's arguments.

The world size is not in the container (the launcher sets it): pass ``--gpus``.
"""

from __future__ import annotations

from typing import Any

from trainledger.runconfig.formats import ImportResult
from trainledger.runconfig.importers.megatron import read_args

#: sections in the order their keys are laid on top of each other (later wins)
SECTIONS = ("model", "ddp", "optimizer", "mixed_precision", "comm_overlap", "dataset", "train")
#: the container's other sections: nothing in them changes memory or time
OTHER = {"checkpoint", "dist", "ft", "inprocess_restart", "logger", "nvrx_straggler", "peft", "profiling",
         "rerun_state_machine", "rng", "scheduler", "straggler", "tensor_inspect", "tokenizer", "validation",
         "optimizer_config_override_provider", "mixed_precision_config", "perf_matrix"}
#: keys whose names look sizing-relevant but are sub-options, logging or the model's own structure
#: (which the preset named by hf_model_id holds): known here without effect on the estimate
NEUTRAL = {
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "moe_layer_freq",
    "moe_router_topk", "moe_router_num_groups", "moe_router_group_topk", "moe_router_pre_softmax",
    "moe_router_score_function", "moe_router_topk_scaling_factor", "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate", "moe_router_dtype", "moe_router_load_balancing_type", "moe_router_fusion",
    "moe_router_force_load_balancing", "moe_aux_loss_coeff", "moe_grouped_gemm", "moe_permute_fusion",
    "moe_token_drop_policy", "moe_deepep_num_sms", "moe_hybridep_num_sms", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "moe_router_topk_limited_devices", "moe_input_jitter_eps",
    "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_margin", "fp8_interval", "fp8_wgrad",
    "tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_bulk_dgrad", "tp_comm_bulk_wgrad", "tp_comm_split_ag",
    "tp_comm_split_rs", "tp_comm_bootstrap_backend", "tp_comm_overlap_rs_dgrad", "tp_comm_atomic_ag",
    "tp_comm_atomic_rs", "tp_comm_overlap_disable_qkv", "tp_comm_overlap_disable_fc1",
    "cpu_offloading_activations", "cpu_offloading_double_buffering", "cpu_offloading_retain_pinned_cpu_buffers",
    "batch_p2p_comm", "batch_p2p_sync", "overlap_p2p_comm", "overlap_p2p_comm_warmup_flush",
    "overlap_param_gather", "overlap_grad_reduce", "align_param_gather", "overlap_param_gather_with_optimizer_step",
    "fsdp_all_gather_in_start_param_sync", "outer_dp_sharding_strategy", "num_distributed_optimizer_instances",
    "use_precision_aware_optimizer", "main_params_dtype", "params_dtype",
    "pipeline_dtype", "autocast_dtype", "scatter_embedding_sequence_parallel", "sequence_parallel_size",
    "context_parallel_size_dataset", "hierarchical_context_parallel_sizes", "cp_comm_type",
    "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "fp4_recipe", "fp8_quantizer_factory",
    "fp4_quantizer_factory", "moe_pad_experts_for_cuda_graph_inference", "moe_router_padding_for_fp8",
    "moe_router_padding_for_quantization", "expert_tensor_parallel_size_dataset", "recompute_method",
    "recompute_num_layers", "mtp_num_layers", "moe_shared_expert_gate", "cuda_graph_scope",
    "cuda_graph_warmup_steps", "cuda_graph_retain_backward_graph", "cuda_graph_use_single_mempool",
    "cross_entropy_fusion_impl", "use_transformer_engine_op_fuser", "optimizer_offload_fraction",
    "data_parallel_size", "reuse_grad_buf_for_mxfp8_param_ag", "delay_wgrad_compute",
    "ep_overlap_early_attn_memory_release", "fp8_dot_product_attention", "fp8_multi_head_attention",
}


def _section(d: dict[str, Any], name: str) -> dict[str, Any]:
    v = d.get(name, d.get(name + "_config"))
    return v if isinstance(v, dict) else {}


def detect(data: dict[str, Any]) -> bool:
    """A ConfigContainer: its ``_target_``, or a ``model`` and a ``train`` section beside one of the
    sections only Megatron-Bridge has (``ddp``, ``mixed_precision``, ``comm_overlap``,
    ``rerun_state_machine``), with or without the ``_config`` suffix."""
    if str(data.get("_target_", "")).startswith("megatron.bridge."):
        return True
    names = {str(k).removesuffix("_config") for k in data}
    return bool(_section(data, "model")) and bool(_section(data, "train")) and \
        bool(names & {"ddp", "mixed_precision", "comm_overlap", "rerun_state_machine"})


def _dtype(v: Any) -> str | None:
    """A dtype the container writes as ``{_target_: torch.bfloat16, _call_: false}``."""
    if isinstance(v, dict) and str(v.get("_target_", "")).startswith("torch."):
        return str(v["_target_"]).removeprefix("torch.")
    return None


def read(d: dict[str, Any], res: ImportResult, where: str) -> None:
    a: dict[str, Any] = {}
    for name in SECTIONS:
        for k, v in _section(d, name).items():
            if v is None or str(k).startswith("_") or isinstance(v, dict):
                continue
            a[str(k)] = v
    unknown = [f"{where}: [{k}] (section not read)" for k in d
               if str(k).removesuffix("_config") not in (*SECTIONS, *OTHER) and not str(k).startswith("_")]
    # the keys that differ from Megatron-LM's arguments
    fp8 = a.pop("fp8", None)
    if isinstance(fp8, str) and fp8.lower() not in ("true", "false", "null", "none"):
        a["fp8_format"] = fp8  # MixedPrecisionConfig.fp8 is the format (hybrid, e4m3)
    elif fp8 is True:
        a["fp8"] = True
    if a.get("fp4"):
        a["fp4_format"] = a["fp4"]
    if "sequence_length" in a:  # GPTDatasetConfig's name of the model's seq_length
        a.setdefault("seq_length", a.pop("sequence_length"))
    if a.get("grad_reduce_in_fp32") is False:  # the bf16 gradient buffer (Megatron-LM --grad-reduce-in-bf16)
        a["grad_reduce_in_bf16"] = True
    if a.get("fp8_param"):
        a["fp8_param_gather"] = True
    model = a.pop("hf_model_id", None)
    if model:
        res.set("model", str(model), where)
        # the Hugging Face bridge takes the dropout from the checkpoint's config.json (0 for the
        # Llama, Qwen and DeepSeek families), not Megatron's 0.1 default
        a.setdefault("attention_dropout", 0.0)
        a.setdefault("hidden_dropout", 0.0)
    for k in ("exp_avg_dtype", "exp_avg_sq_dtype"):  # the precision-aware optimizer's moments
        dt = _dtype(_section(d, "optimizer").get(k))
        if dt is not None:
            a[k] = dt
    if a.get("pipeline_model_parallel_layout"):
        unknown.append(f"{where}: pipeline_model_parallel_layout {a['pipeline_model_parallel_layout']} (a "
                       "hand-placed layer layout: sized as layers split evenly over the stages)")
    if str(a.get("fp8_recipe", "")).lower() == "blockwise":
        unknown.append(f"{where}: fp8_recipe blockwise (128-element block scales, DeepSeek-V3's: sized "
                       "as the fp8 tensor-scaled recipe)")
    if str(a.get("cuda_graph_impl", "none")).lower() not in ("none", "") or a.get("enable_cuda_graph"):
        unknown.append(f"{where}: cuda_graph_impl {a.get('cuda_graph_impl')} (CUDA graphs: the launch "
                       "overhead they remove and the static buffers they hold are not modeled)")
    before = len(res.unknown_keys)
    read_args(a, res, where, megatron_lm=False, dims=not model)
    # the generic reader lists every set sizing-sounding key it does not use; drop those known here
    res.unknown_keys[before:] = [u for u in res.unknown_keys[before:]
                                 if u.removeprefix(f"{where}: --").replace("-", "_").split(" ")[0] not in
                                 NEUTRAL | {"pipeline_model_parallel_layout", "fp8_recipe",
                                            "cuda_graph_impl", "num_moe_experts", "fp4"}]
    res.unknown_keys += unknown
    if "gpus" not in res.inputs:
        res.notes.append(f"{where}: the world size is the launcher's (not in the ConfigContainer): pass --gpus")
