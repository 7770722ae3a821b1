"""torchtitan TOML job config (``torchrun ... -m torchtitan.train --job.config_file x.toml``).

Sections and keys follow torchtitan's ``JobConfig`` (torchtitan/config/job_config.py in
pytorch/torchtitan): ``[model] name, flavor, converters``; ``[training] local_batch_size`` (older:
``batch_size``), ``global_batch_size``, ``seq_len``, ``max_norm``, ``steps``,
``mixed_precision_param``, ``mixed_precision_reduce``, ``compile`` (older) / ``[compile] enable``;
``[parallelism] data_parallel_replicate_degree, data_parallel_shard_degree (-1: the rest),
fsdp_reshard_after_forward, tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_schedule, context_parallel_degree, expert_parallel_degree, disable_loss_parallel``;
``[activation_checkpoint] mode, selective_ac_option, early_stop``; ``[float8]``; ``[optimizer] name``.

torchtitan runs FSDP2 (``fully_shard``) with DTensor tensor parallelism: framework ``fsdp2``.
Model flavors map to presets by their published dimensions (torchtitan/models/llama3/__init__.py
``llama3_configs``: 8B = dim 4096, 32 layers, 32 heads, 8 KV heads, vocab 128256 = Llama 3.1 8B).
"""

from __future__ import annotations

from typing import Any

from trainledger.errors import SpecError
from trainledger.load.hf import load_model
from trainledger.runconfig.formats import ImportResult
from trainledger.runconfig.importers._common import num

#: (torchtitan model name, flavor) -> preset; the dimensions of each flavor equal the preset's
FLAVORS: dict[tuple[str, str], str] = {
    ("llama3", "8B"): "llama-3.1-8b", ("llama3", "70B"): "llama-3.1-70b",
    ("llama3", "405B"): "llama-3.1-405b",
    ("qwen3", "0.6B"): "qwen3-0.6b", ("qwen3", "1.7B"): "qwen3-1.7b", ("qwen3", "4B"): "qwen3-4b",
    ("qwen3", "8B"): "qwen3-8b", ("qwen3", "14B"): "qwen3-14b", ("qwen3", "32B"): "qwen3-32b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
    ("deepseek_v3", "671B"): "deepseek-v3",
}
PRESET_FLAVOR = {v: k for k, v in FLAVORS.items()}

SCHEDULES = {"1f1b": "1f1b", "interleaved1f1b": "interleaved", "gpipe": "gpipe"}
SECTIONS = {"job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training",
            "parallelism", "checkpoint", "activation_checkpoint", "float8", "mx", "compile",
            "comm", "memory_estimation", "fault_tolerance", "experimental", "validation",
            "quantize", "_trainledger", "dataloader"}
KNOWN = {
    "model": {"name", "flavor", "converters", "tokenizer_path", "hf_assets_path", "print_after_conversion"},
    "training": {"local_batch_size", "batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "compile", "mixed_precision_param", "mixed_precision_reduce", "dataset",
                 "dataset_path", "warmup_steps", "gc_freq", "seed", "deterministic",
                 "enable_cpu_offload", "gc_debug"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree", "pipeline_parallel_degree",
                    "pipeline_parallel_schedule", "context_parallel_degree", "expert_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel", "enable_compiled_autograd",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_split_points",
                    "pipeline_parallel_layers_per_stage", "context_parallel_rotate_method",
                    "expert_tensor_parallel_degree", "expert_parallel_comm_backend"},
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop"},
    "compile": {"enable", "components", "backend"},
    "optimizer": {"name", "lr", "eps", "beta1", "beta2", "weight_decay", "implementation"},
}


def detect(data: dict[str, Any]) -> bool:
    return isinstance(data.get("model"), dict) and isinstance(data.get("training"), dict) \
        and ("parallelism" in data or "flavor" in data["model"])


def _unknown(res: ImportResult, where: str, section: str, d: dict[str, Any]) -> None:
    for k in sorted(set(d) - KNOWN.get(section, set())):
        res.unknown_keys.append(f"{where}: [{section}] {k}")


def read(d: dict[str, Any], res: ImportResult, where: str) -> None:
    for s in sorted(set(d) - SECTIONS):
        res.unknown_keys.append(f"{where}: [{s}]")
    model, tr = d.get("model") or {}, d.get("training") or {}
    par, ac = d.get("parallelism") or {}, d.get("activation_checkpoint") or {}
    for sec in ("model", "training", "parallelism", "activation_checkpoint", "compile", "optimizer"):
        if isinstance(d.get(sec), dict):
            _unknown(res, where, sec, d[sec])
    res.set("framework", "fsdp2", where)
    name, flavor = str(model.get("name", "")), str(model.get("flavor", ""))
    if name or flavor:
        preset = FLAVORS.get((name, flavor))
        if preset is None:
            raise SpecError(f"{where}: model {name!r} flavor {flavor!r} has no preset here; known: "
                            f"{', '.join(f'{n} {f}' for n, f in FLAVORS)}. Pass --model with a config.json "
                            "of the same dimensions")
        res.set("model", preset, where)
        if not load_model(preset).tie_word_embeddings:
            # torchtitan wraps the embedding, and the final norm with the output head, as FSDP groups
            # of their own (``apply_fsdp``, torchtitan/models/llama3/infra/parallelize.py, since
            # 83e6941 "Improve reshard_after_forward logic" #1094, 2025-07-28; before it the two sat
            # in the root group with the other loose parameters)
            res.set("wrap", "layers+embed+head", where)
            res.notes.append(f"{where}: torchtitan (since 2025-07-28) wraps tok_embeddings and [norm, output] "
                             "as FSDP groups of their own: --wrap layers+embed+head; an older checkout "
                             "keeps them in the root group (pass --wrap layers)")
    res.set("seq_len", num(tr.get("seq_len"), where, "[training] seq_len"), where)
    local = tr.get("local_batch_size", tr.get("batch_size"))
    mb = num(local, where, "[training] local_batch_size")
    res.set("micro_batch", mb, where)
    if tr.get("max_norm") is not None:
        res.set("grad_clip", float(tr["max_norm"]), where)
    param = tr.get("mixed_precision_param", "bfloat16")
    res.set("param_dtype", {"bfloat16": "bf16", "float32": "fp32"}.get(str(param)), where)
    res.set("reduce_dtype", {"bfloat16": "bf16", "float32": "fp32"}.get(str(tr.get("mixed_precision_reduce", "float32"))), where)
    conv = model.get("converters") or []
    res.set("precision", "fp8-mixed" if "float8" in conv else ("fp32" if str(param) == "float32" else "bf16-mixed"), where)
    if tr.get("enable_cpu_offload"):
        res.set("offload", "params", where)
    _read_parallel(par, tr, res, where)
    mode = str(ac.get("mode", "selective")).lower()
    if mode == "none":
        res.set("recompute", "none", where)
    elif mode == "full":
        res.set("recompute", "full", where)
    if "early_stop" in ac:  # torchtitan >= 2025-08-29 (PR #1580): torch's checkpoint early stop, off by default
        res.set("checkpoint_early_stop", bool(ac["early_stop"]), where)
    elif mode == "selective":
        opt = str(ac.get("selective_ac_option", "2"))
        if opt == "op":
            res.set("recompute", "selective", where)
            res.notes.append(f"{where}: selective_ac_option 'op' (per-op SAC) sized as fsdp2's selective "
                             "recomputation: each block keeps its input, every other matmul output and the SDPA output")
        else:
            res.set("recompute", "full", where)
            res.notes.append(f"{where}: selective_ac_option {opt}: every {opt}th layer is checkpointed "
                             "(sized as full recomputation of those layers)")
    opt_name = str((d.get("optimizer") or {}).get("name", "AdamW")).lower()
    # [optimizer] implementation defaults to "fused" (torchtitan/components/optimizer/optimizer.py);
    # "foreach" is torch's multi-tensor AdamW, "for-loop" its per-tensor loop (foreach=False)
    impl = str((d.get("optimizer") or {}).get("implementation", "fused")).lower()
    adamw = "adamw-fused" if impl.startswith("fused") else ("adamw-loop" if impl == "for-loop" else "adamw")
    res.set("optimizer", {"adamw": adamw, "adam": adamw}.get(opt_name), where)
    if impl == "fused_opt_states_bf16":  # the fused AdamW kernel with bf16 moments, fp32 params and grads
        res.set("optimizer_states_dtype", "bf16", where)
    if opt_name not in ("adamw", "adam"):
        res.unknown_keys.append(f"{where}: [optimizer] name={opt_name} (state size not modeled)")
    comp = (d.get("compile") or {}).get("enable", tr.get("compile"))
    if comp:
        # torch.compile (Inductor) fuses the elementwise ops between the matmuls: the time model's
        # fused kernels; the memory model keeps eager's saved tensors (an upper bound)
        res.set("kernels", "fused", where)
        res.notes.append(f"{where}: torch.compile on — priced with fused kernels; activation memory is "
                         "sized for eager modules (an upper bound)")


def _read_ep_backend(par: dict[str, Any], ep: int, res: ImportResult, where: str) -> None:
    """``[parallelism] expert_parallel_comm_backend``: standard (all-to-all), deepep, hybridep
    (torchtitan/distributed/deepep: NVIDIA's Hybrid-EP, for NVL72 racks too)."""
    backend = str(par.get("expert_parallel_comm_backend", "standard")).lower()
    if backend in ("deepep", "hybridep") and ep > 1:
        res.set("moe_dispatcher", backend, where)
    elif backend not in ("standard", "deepep", "hybridep"):
        res.unknown_keys.append(f"{where}: [parallelism] expert_parallel_comm_backend={backend} (not modeled)")


def _read_parallel(par: dict[str, Any], tr: dict[str, Any], res: ImportResult, where: str) -> None:
    rep = num(par.get("data_parallel_replicate_degree", 1), where, "data_parallel_replicate_degree")
    shard_raw = par.get("data_parallel_shard_degree", -1)
    tp = num(par.get("tensor_parallel_degree", 1), where, "tensor_parallel_degree")
    pp = num(par.get("pipeline_parallel_degree", 1), where, "pipeline_parallel_degree")
    cp = num(par.get("context_parallel_degree", 1), where, "context_parallel_degree")
    ep = num(par.get("expert_parallel_degree", 1), where, "expert_parallel_degree")
    for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        res.set(k, v, where)
    _read_ep_backend(par, ep, res, where)
    sched = par.get("pipeline_parallel_schedule")
    if pp > 1 and sched:
        mapped = SCHEDULES.get(str(sched).lower())
        if mapped is None:
            res.unknown_keys.append(f"{where}: [parallelism] pipeline_parallel_schedule={sched} (not modeled)")
        res.set("pp_schedule", mapped, where)
    if par.get("disable_loss_parallel") is not None:
        res.set("loss_parallel", tp > 1 and not par["disable_loss_parallel"], where)
    elif tp > 1:
        res.set("loss_parallel", True, where)  # torchtitan's default: loss parallel on with TP
    if tp > 1 and par.get("enable_async_tensor_parallel"):
        # AsyncTP (torch's micro-pipelined TP: each all-gather / reduce-scatter split and overlapped
        # with its matmul; torchtitan requires compile for it)
        res.set("tp_comm_overlap", True, where)
    reshard = str(par.get("fsdp_reshard_after_forward", "default")).lower()
    if reshard in ("never", "always"):  # "default": the stack's own (Runtime.reshards_after_forward)
        res.set("reshard_after_forward", reshard == "always", where)
    shard = None if shard_raw in (-1, None) else num(shard_raw, where, "data_parallel_shard_degree")
    if shard is None:
        res.notes.append(f"{where}: data_parallel_shard_degree -1 takes the GPUs left over: the world "
                         "size comes from the launcher — pass --gpus")
    else:
        dp = rep * shard
        res.set("gpus", dp * tp * pp * cp, where)
        res.set("dp", dp, where)
    if shard is None or shard > 1:
        res.set("zero", 3, where)
        if rep > 1:
            res.set("hybrid_shard", True, where)
    else:
        res.set("zero", 0, where)
        if rep > 1 and cp == 1:
            res.notes.append(
                f"{where}: data_parallel_replicate_degree {rep} with shard degree 1 replicates every state "
                f"on each rank, while --framework fsdp2 prices --zero 0 as full sharding over the data-parallel "
                f"ranks (an FSDP stack always shards): the estimate understates the weights, gradients and "
                f"optimizer states up to {rep}x")
    gb, mb = tr.get("global_batch_size"), tr.get("local_batch_size", tr.get("batch_size"))
    if gb not in (None, -1) and mb and shard is not None:
        dp = rep * shard
        if gb % (mb * dp):
            from trainledger.errors import PlanError

            raise PlanError(f"{where}: global_batch_size {gb} is not local_batch_size × dp × grad-accum: "
                            f"{mb} × {dp} = {mb * dp} does not divide {gb}")
        res.set("grad_accum", gb // (mb * dp), where)
    elif gb not in (None, -1):
        res.set("global_batch", num(gb, where, "global_batch_size"), where)
