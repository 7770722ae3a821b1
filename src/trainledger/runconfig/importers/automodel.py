"""NeMo AutoModel recipe YAML (``automodel finetune llm -c recipe.yaml``, its benchmark configs).

Keys follow NeMo AutoModel's recipes (github:NVIDIA-NeMo/Automodel, e.g.
examples/benchmark/configs/qwen3_moe_30b_te_deepep.yaml): ``distributed`` (``_target_``
``...fsdp2.FSDP2Manager``, ``tp_size``, ``cp_size``, ``pp_size``, ``ep_size``, ``dp_replicate_size``,
``sequence_parallel``), ``step_scheduler`` (``global_batch_size``, ``local_batch_size``),
``autopipeline`` (``pp_schedule``, ``pp_microbatch_size``, ``layers_per_stage``,
``round_virtual_stages_to_pp_multiple``: the interleaving, ``--vp``), ``parallelizer``
(``activation_checkpointing``, ``reshard_after_forward``), ``model`` (``config.
pretrained_model_name_or_path`` or ``pretrained_model_name_or_path``, ``is_meta_device``, ``backend``:
``attn`` te|sdpa|flex, ``linear``/``rms_norm`` te|torch, ``enable_deepep``), ``dataset.seq_len``,
``optimizer._target_``.

AutoModel runs PyTorch FSDP2 (``fully_shard``): framework ``fsdp2``, every rank's parameters sharded
(ZeRO-3). Its backend choices map to our switches: ``attn: te`` is Transformer Engine's cuDNN
attention (``--attention cudnn``), ``enable_deepep`` DeepEP's dispatch (``--moe-dispatcher deepep``),
``is_meta_device`` a sharded load (``--model-loading sharded``), ``linear``/``rms_norm: te``
Transformer Engine's fused layers (``--kernels fused``); AutoModel's own model classes run their
shared experts under the dispatch (``--moe-shared-expert-overlap``).
"""

from __future__ import annotations

import math
from typing import Any

from trainledger.errors import SpecError, TrainledgerError
from trainledger.load.hf import load_model
from trainledger.runconfig.formats import ImportResult
from trainledger.runconfig.importers._common import num, truthy

#: AutoModel's pipeline schedules -> ours
SCHEDULES = {"1f1b": "1f1b", "interleaved1f1b": "interleaved", "gpipe": "gpipe"}
#: attention backends (nemo_automodel BackendConfig.attn) -> ours; flex: torch FlexAttention, a
#: tiled kernel priced as SDPA's
ATTENTION = {"te": "cudnn", "sdpa": "sdpa", "flex": "sdpa"}
SECTIONS = {"seed", "benchmark", "step_scheduler", "distributed", "autopipeline", "dist_env", "parallelizer",
            "model", "checkpoint", "loss_fn", "dataset", "dataloader", "optimizer", "lr_scheduler",
            "validation_dataset", "validation_dataloader", "packed_sequence", "peft", "wandb", "compile",
            "clip_grad_norm", "max_grad_norm", "_trainledger"}


def detect(data: dict[str, Any]) -> bool:
    """An AutoModel recipe: a ``step_scheduler`` and a ``distributed`` or ``model`` section whose
    ``_target_`` is one of ``nemo_automodel``'s classes."""
    targets = [str((data.get(k) or {}).get("_target_", "")) for k in ("distributed", "model")
               if isinstance(data.get(k), dict)]
    return isinstance(data.get("step_scheduler"), dict) and any("nemo_automodel" in t for t in targets)


def read(d: dict[str, Any], res: ImportResult, where: str) -> None:
    for s in sorted(set(d) - SECTIONS):
        res.unknown_keys.append(f"{where}: {s}")
    dist = d.get("distributed") or {}
    target = str(dist.get("_target_", ""))
    if target and "FSDP2Manager" not in target:
        res.notes.append(f"{where}: distributed {target.rsplit('.', 1)[-1]} is sized as FSDP2 (the "
                         "FSDP2Manager's sharding)")
    res.set("framework", "fsdp2", where)
    res.set("zero", 3, where)
    _read_model(d.get("model") or {}, res, where)
    tp, cp, pp, ep = (num(dist.get(k, 1) or 1, where, k) for k in ("tp_size", "cp_size", "pp_size", "ep_size"))
    for key, v in (("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep)):
        res.set(key, v, where)
    if tp > 1:
        res.set("sp", truthy(dist.get("sequence_parallel", False)), where)
    if num(dist.get("dp_replicate_size", 1) or 1, where, "dp_replicate_size") > 1:
        res.set("hybrid_shard", True, where)
    sched = d.get("step_scheduler") or {}
    gb, lbs = sched.get("global_batch_size"), sched.get("local_batch_size")
    pipe = d.get("autopipeline") or {}
    if gb is not None:
        res.set("global_batch", num(gb, where, "global_batch_size"), where)
    if pp > 1:
        res.set("micro_batch", num(pipe.get("pp_microbatch_size", 1), where, "pp_microbatch_size"), where)
        mapped = SCHEDULES.get(str(pipe.get("pp_schedule", "1f1b")).lower())
        res.set("pp_schedule", mapped, where)
        if mapped == "interleaved":
            _read_virtual_stages(pipe, pp, res, where)
    elif lbs is not None:
        res.set("micro_batch", num(lbs, where, "local_batch_size"), where)
    ds = d.get("dataset") or {}
    if ds.get("seq_len") is not None:
        res.set("seq_len", num(ds["seq_len"], where, "dataset.seq_len"), where)
    par = d.get("parallelizer") or {}
    ac = par.get("activation_checkpointing")
    if ac is not None:
        res.set("recompute", "selective" if str(ac).lower() == "selective" else
                ("full" if truthy(ac) else "none"), where)
    if par.get("reshard_after_forward") is not None:
        res.set("reshard_after_forward", truthy(par["reshard_after_forward"]), where)
    opt = str((d.get("optimizer") or {}).get("_target_", ""))
    if opt.endswith(("torch.optim.Adam", "torch.optim.AdamW")):
        fused = truthy((d.get("optimizer") or {}).get("fused", False))
        res.set("optimizer", "adamw-fused" if fused else "adamw", where)
    elif opt:
        res.unknown_keys.append(f"{where}: optimizer {opt} (state size sized as AdamW)")
    if d.get("peft"):
        res.unknown_keys.append(f"{where}: peft (read the adapter settings with --method lora --lora-rank)")


def virtual_stages(layers: int, layers_per_stage: int | None, pp: int, rounding: str | None) -> int:
    """Model chunks per pipeline rank of AutoModel's interleaved schedules (AutoPipeline's rule,
    nemo_automodel/components/distributed/pipelining/functional.py ``calculate_virtual_stages``):
    ceil(layers / layers_per_stage) virtual stages, rounded to a multiple of pp ``up`` or ``down``
    (else they must divide evenly), at least 2 per rank; 2 per rank when layers_per_stage is unset."""
    if layers_per_stage is None:
        return 2
    stages = math.ceil(layers / layers_per_stage)
    if stages % pp:
        if rounding == "up":
            stages += pp - stages % pp
        elif rounding == "down":
            stages -= stages % pp
        else:
            raise SpecError(f"autopipeline: {stages} virtual stages ({layers} layers at layers_per_stage "
                            f"{layers_per_stage}) do not divide over pp_size {pp}, which AutoPipeline refuses "
                            "without round_virtual_stages_to_pp_multiple")
    if stages // pp < 2:
        raise SpecError(f"autopipeline: interleaved1f1b needs at least 2 virtual stages per rank; {layers} layers "
                        f"at layers_per_stage {layers_per_stage} give {stages} over pp_size {pp}")
    return stages // pp


def _read_virtual_stages(pipe: dict[str, Any], pp: int, res: ImportResult, where: str) -> None:
    """``--vp`` from AutoPipeline's keys; it needs the model's layer count (a preset, a local
    config.json or a cached Hub config): without it, a note asks for --vp."""
    per = pipe.get("layers_per_stage")
    per = num(per, where, "layers_per_stage") if per is not None else None
    try:
        layers = load_model(str(res.inputs["model"])).num_layers if "model" in res.inputs else None
    except (TrainledgerError, OSError):  # not a preset, not cached and the Hub unreachable
        layers = None
    if layers is None:
        res.notes.append(f"{where}: autopipeline interleaved1f1b: its virtual stages follow layers_per_stage "
                         f"({per}) and the model's layers, which could not be read here; give --vp for them")
        return
    rounding = pipe.get("round_virtual_stages_to_pp_multiple")
    res.set("vp", virtual_stages(layers, per, pp, str(rounding).lower() if rounding else None), where)


def _read_model(m: dict[str, Any], res: ImportResult, where: str) -> None:
    cfg = m.get("config") if isinstance(m.get("config"), dict) else {}
    ref = cfg.get("pretrained_model_name_or_path") or m.get("pretrained_model_name_or_path")
    res.set("model", str(ref) if ref else None, where)
    if truthy(m.get("is_meta_device", False)):
        res.set("model_loading", "sharded", where)  # meta-device init, each rank loads its shards
    backend = m.get("backend") if isinstance(m.get("backend"), dict) else {}
    attn = backend.get("attn")
    if attn is not None:
        mapped = ATTENTION.get(str(attn).lower())
        res.set("attention", mapped, where)
        if mapped is None:
            res.unknown_keys.append(f"{where}: model.backend.attn {attn} (priced as sdpa)")
    dispatcher = str(backend.get("dispatcher", "")).lower()  # later releases: dispatcher deepep | hybridep
    if dispatcher in ("deepep", "hybridep"):
        res.set("moe_dispatcher", dispatcher, where)
    elif truthy(backend.get("enable_deepep", False)):
        res.set("moe_dispatcher", "deepep", where)
    if str(m.get("_target_", "")).startswith("nemo_automodel.components.models."):
        # AutoModel's own MoE block runs the shared experts on a side stream while the routed tokens
        # are dispatched (nemo_automodel/components/moe/layers.py ``MoE.forward``); no effect on
        # models without shared experts
        res.set("moe_shared_expert_overlap", True, where)
    te_layers = [k for k in ("linear", "rms_norm") if str(backend.get(k, "")).lower() == "te"]
    if te_layers:
        res.set("kernels", "fused", where)
        res.notes.append(f"{where}: model.backend {', '.join(te_layers)}: te runs Transformer Engine's fused "
                         "layers (priced with fused kernels)")
    if truthy(backend.get("fake_balanced_gate", False)):
        res.notes.append(f"{where}: model.backend.fake_balanced_gate spreads tokens evenly over the experts "
                         "(a benchmark setting); the estimate keeps the statistical routing imbalance of a "
                         "real router")
