"""Flat, user-facing plan inputs (CLI flags, plan files, web form) -> a validated Plan.

A plan file (YAML, TOML or JSON) holds the same keys as the ``estimate`` flags, with
underscores: ``model``, ``gpu``, ``gpus``, ``method``, ``precision``, ``seq_len`` ...
Flags given on the command line override the file.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from trainledger.spec.base import Spec, spec_error
from trainledger.load.catalog import load_gpu, load_network, read_data_file
from trainledger.spec.cluster import Cluster, GpuSpec
from trainledger.errors import CatalogError, LayoutError, SpecError
from trainledger.load.hf import load_model
from trainledger.spec.layout import Layout, Offload, PipelineSchedule
from trainledger.spec.model import ModelSpec
from trainledger.spec.plan import Plan
from trainledger.spec.precision import default_precision
from trainledger.spec.runtime import (
    DistOptimizer, Framework, Kernels, ModelLoading, MoeDispatcher, ParamDtype, ReduceDtype, Runtime, Wrap, stack_optimizer,
)
from trainledger.spec.recipe import (
    PRECISION_POLICY, Attention, Method, Optimizer, Precision, Recipe, Recompute, StatesDtype,
)
from trainledger.units import GIB
from trainledger.safety import check_tree, clip, path_exists, read_text, shorten
from trainledger.spec.serving import Engine, KvCacheDtype, QuantizationInput, Serving

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100-sxm"
#: largest token budget accepted: 1e15 is ~65x the 15T tokens Llama 3 trained on (Meta, "The Llama 3
#: Herd of Models", arXiv:2407.21783, §3.1) and beyond any text corpus; larger is a typo (1e30)
MAX_TOKENS = 1e15


#: fields declared by the parts a plan is validated into; PlanInputs takes them as they are
_RECIPE, _LAYOUT, _RUNTIME = Recipe.model_fields, Layout.model_fields, Runtime.model_fields
_SERVING = Serving.model_fields


class PlanInputs(Spec):
    """Everything a user states about one job, flat: the one declaration of a job's fields.

    Every field is written here once, with its unit, bounds, default and help text; the CLI flags
    (``--seq-len`` for ``seq_len``), plan-file keys and the web API schema are generated from it.
    ``Recipe``, ``Layout``, ``Cluster`` and ``Runtime`` are validated out of it by ``build_plan``.
    """

    # -- model and hardware
    model: str = Field(DEFAULT_MODEL, description="preset name, config.json path/folder, or cached Hub id")
    gpu: str = Field(DEFAULT_GPU, description="catalog GPU (see `trainledger gpus`) or a GPU spec file")
    gpus: int = Field(1, gt=0, le=1_000_000, description="total number of GPUs (world size)")
    gpus_per_node: int | None = Field(None, gt=0, le=1024, description="GPUs per node [min(gpus, 8)]")
    intra: str | None = Field(None, description="intra-node link, e.g. nvlink4, pcie5-x16 [the GPU's own link]")
    network: str | None = Field(None, description="inter-node network, e.g. ib-ndr, roce-400 [ib-ndr when multi-node]")
    nics_per_node: int | None = Field(None, gt=0, le=64, description="inter-node NICs per node [the network's default]")
    power_limit_w: float | None = Field(None, gt=0, le=5000, description="GPU power limit in watts, e.g. 500 for the 500 W H100 parts [the GPU's TDP]")
    # -- the software stack
    framework: Framework = _RUNTIME["framework"]
    reshard_after_forward: bool | None = _RUNTIME["reshard_after_forward"]
    param_dtype: ParamDtype = _RUNTIME["param_dtype"]
    reduce_dtype: ReduceDtype = _RUNTIME["reduce_dtype"]
    wrap: Wrap = _RUNTIME["wrap"]
    loss_parallel: bool = _RUNTIME["loss_parallel"]
    gradient_as_bucket_view: bool = _RUNTIME["gradient_as_bucket_view"]
    fused_loss: bool = _RUNTIME["fused_loss"]
    liger_kernel: bool = _RUNTIME["liger_kernel"]
    kernels: Kernels | None = _RUNTIME["kernels"]
    tp_comm_overlap: bool | None = _RUNTIME["tp_comm_overlap"]
    moe_dispatcher: MoeDispatcher = _RUNTIME["moe_dispatcher"]
    moe_shared_expert_overlap: bool = _RUNTIME["moe_shared_expert_overlap"]
    ep_comm_overlap: bool = _RUNTIME["ep_comm_overlap"]
    dist_optimizer: DistOptimizer = _RUNTIME["dist_optimizer"]
    fp8_params: bool = _RUNTIME["fp8_params"]
    checkpoint_early_stop: bool | None = _RUNTIME["checkpoint_early_stop"]
    model_loading: ModelLoading | None = _RUNTIME["model_loading"]
    stack_version: str | None = _RUNTIME["stack_version"]
    ds_reduce_bucket_size: int | None = _RUNTIME["ds_reduce_bucket_size"]
    ds_allgather_bucket_size: int | None = _RUNTIME["ds_allgather_bucket_size"]
    ds_stage3_prefetch_bucket_size: int | None = _RUNTIME["ds_stage3_prefetch_bucket_size"]
    ds_stage3_param_persistence_threshold: int | None = _RUNTIME["ds_stage3_param_persistence_threshold"]
    ds_stage3_max_live_parameters: int | None = _RUNTIME["ds_stage3_max_live_parameters"]
    ds_overlap_comm: bool | None = _RUNTIME["ds_overlap_comm"]
    # -- the recipe
    method: Method = _RECIPE["method"]
    precision: Precision | None = Field(
        None, description="precision policy [by method: bf16-mixed for pretrain/full; the checkpoint's dtype "
        "with fp32 adapters for lora/qlora; the checkpoint's dtype for inference; fp16 on GPUs without bf16]")
    optimizer: Optimizer | None = Field(
        None, description="optimizer [by stack: adamw-fused for hf, pytorch-fsdp and fsdp2 (the Trainer's "
        "default with torch >= 2.8, torchtitan's); adamw (the stack's own fused Adam) for deepspeed and "
        "megatron]; adamw = torch's foreach AdamW")
    seq_len: int = _RECIPE["seq_len"]
    doc_len: int | None = _RECIPE["doc_len"]
    micro_batch: int = _RECIPE["micro_batch"]
    grad_accum: int = _RECIPE["grad_accum"]
    global_batch: int | None = _RECIPE["global_batch"]
    recompute: Recompute = _RECIPE["recompute"]
    recompute_layers: int | None = _RECIPE["recompute_layers"]
    attention: Attention = _RECIPE["attention"]
    lora_rank: int = _RECIPE["lora_rank"]
    lora_alpha: float = _RECIPE["lora_alpha"]
    lora_targets: tuple[str, ...] = _RECIPE["lora_targets"]
    dropout: float = _RECIPE["dropout"]
    grad_clip: float | None = Field(1.0, ge=0.0, description="max gradient norm; 0 = no clipping")
    tokens: float | None = Field(None, gt=0, le=MAX_TOKENS, allow_inf_nan=False,
                                 description="token budget of the run, e.g. 2B")
    generate_len: int = _RECIPE["generate_len"]
    fp4_bf16_layers: int | None = _RECIPE["fp4_bf16_layers"]
    moe_capacity_factor: float | None = _RECIPE["moe_capacity_factor"]
    optimizer_states_dtype: StatesDtype | None = _RECIPE["optimizer_states_dtype"]
    moe_pad_to_capacity: bool = _RECIPE["moe_pad_to_capacity"]
    # -- serving (method inference; declared in serving_spec.Serving)
    serving_engine: Engine = _SERVING["engine"]
    quantization: QuantizationInput = Field(
        "auto", description="weight quantization: auto = what the checkpoint ships (config.json "
        "quantization_config: fp8 for DeepSeek-V3, mxfp4 for gpt-oss), as vLLM loads it, else none; "
        + str(_SERVING["quantization"].description).removeprefix("weight quantization: "))
    quant_group_size: int = _SERVING["quant_group_size"]
    kv_cache_dtype: KvCacheDtype = _SERVING["kv_cache_dtype"]
    mla_latent_cache: bool | None = _SERVING["mla_latent_cache"]
    block_size: int | None = _SERVING["block_size"]
    gpu_memory_utilization: float = _SERVING["gpu_memory_utilization"]
    max_num_seqs: int | None = _SERVING["max_num_seqs"]
    max_num_batched_tokens: int | None = _SERVING["max_num_batched_tokens"]
    max_model_len: int | None = _SERVING["max_model_len"]
    cuda_graphs: bool = _SERVING["cuda_graphs"]
    requests_per_s: float | None = _SERVING["requests_per_s"]
    ttft_p50_s: float | None = _SERVING["ttft_p50_s"]
    ttft_p99_s: float | None = _SERVING["ttft_p99_s"]
    tpot_p50_s: float | None = _SERVING["tpot_p50_s"]
    tpot_p99_s: float | None = _SERVING["tpot_p99_s"]
    # -- the layout
    dp: int | None = _LAYOUT["dp"]
    tp: int = _LAYOUT["tp"]
    pp: int = _LAYOUT["pp"]
    cp: int = _LAYOUT["cp"]
    ep: int = _LAYOUT["ep"]
    etp: int | None = _LAYOUT["etp"]
    sp: bool = _LAYOUT["sp"]
    vp: int = _LAYOUT["vp"]
    pp_schedule: PipelineSchedule | None = Field(None, description="pipeline schedule [1f1b, interleaved when --vp > 1]")
    zero: int = Field(0, ge=0, le=3, description="ZeRO stage; 3 = full shard (FSDP)")
    hybrid_shard: bool = _LAYOUT["hybrid_shard"]
    offload: Offload = _LAYOUT["offload"]
    host_ram_gib: float | None = Field(
        None, gt=0, le=1_048_576, description="host RAM per node in GiB [2048 = a DGX-class node for GPUs in an "
        "NVLink domain (DGX H100: 2 TB); not known, so not judged, for PCIe cards]")
    headroom: float = Plan.model_fields["headroom"]
    corpus: str | None = Field(None, description="stats JSON of `trainledger corpus --json`: sets seq_len "
                               "and tokens (padding included) unless they are given")


#: serving-engine fields: read by inference plans only (``serving_of``); a training estimate never looks at them
SERVING_ONLY = ("serving_engine", "quantization", "quant_group_size", "kv_cache_dtype", "mla_latent_cache",
                "block_size", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "cuda_graphs", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                "generate_len")
#: training fields an inference estimate never reads (no backward, no recomputation, no adapters, no
#: optimizer, no gradient accumulation, no dropout: ``build_plan`` gives an inference plan the defaults)
TRAINING_ONLY = ("recompute", "recompute_layers", "grad_clip", "lora_rank", "lora_alpha", "lora_targets",
                 "optimizer", "grad_accum", "dropout")


def unused_inputs(inputs: PlanInputs, given: set[str] | frozenset[str]) -> list[tuple[str, str]]:
    """The ``given`` fields that ``inputs`` never uses, each with why: (field, reason).

    A stated value that changes nothing is a mistake the user should see (``--quantization awq`` on a
    full fine-tune, ``--recompute-layers 4`` without ``--recompute full``), not a silent default.
    """
    out: list[tuple[str, str]] = []
    if inputs.method != "inference":
        why = f"it applies to --method inference only; a {inputs.method} estimate does not read it"
        if inputs.method == "qlora":
            why += " (QLoRA's base is always NF4)"
        out += [(k, why) for k in SERVING_ONLY if k in given]
    else:
        out += [(k, "training only; an inference estimate does not read it") for k in TRAINING_ONLY if k in given]
        if "offload" in given and inputs.offload == "optimizer":
            out.append(("offload", "an inference job has no optimizer states to offload"))
    if "recompute_layers" in given and inputs.method != "inference" and inputs.recompute != "full":
        out.append(("recompute_layers", f"it applies with --recompute full only (recompute is {inputs.recompute})"))
    return out


def load_plan_file(path: str | Path) -> dict[str, Any]:
    """Read a plan file (YAML, TOML or JSON) into a flat dict of PlanInputs keys."""
    p = Path(path)
    if not path_exists(p):
        raise SpecError(f"{shorten(str(p))}: no such plan file")
    if p.suffix == ".toml":
        try:
            data = check_tree(tomllib.loads(read_text(p, what="plan file")), str(p))
        except (tomllib.TOMLDecodeError, RecursionError) as exc:
            raise SpecError(f"{p}: not valid TOML ({exc})") from None
    else:
        data = read_data_file(p)
    if not isinstance(data, dict):
        raise SpecError(f"{p}: a plan file holds a mapping of keys such as model, gpu, method")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(data) - set(PlanInputs.model_fields))
    if unknown:
        from trainledger.errors import did_you_mean

        hints = "".join(f" {k}:{did_you_mean(k, PlanInputs.model_fields, n=2)}" for k in unknown[:5]
                        if did_you_mean(k, PlanInputs.model_fields, n=2))
        raise SpecError(f"{p}: unknown keys {clip(unknown, 200)};{hints or ''} accepted: "
                        f"{', '.join(PlanInputs.model_fields)}")
    return data


def apply_corpus(data: dict[str, Any]) -> dict[str, Any]:
    """``corpus: stats.json`` fills seq_len and tokens (padded tokens per epoch) when not given."""
    if not data.get("corpus"):
        return data
    from trainledger.corpus import plan_hints

    hints = plan_hints(str(data["corpus"]))
    out = dict(data)
    if out.get("seq_len") is None:
        out["seq_len"] = hints["seq_len"]
    if out.get("tokens") is None:
        if int(out["seq_len"]) != hints["seq_len"]:
            # the padded token count is the corpus's at its own sequence length: padding and packing
            # waste change with the length, so that count would describe another job
            raise SpecError(
                f"{clip(str(data['corpus']), 120)}: the corpus stats were computed for seq_len {hints['seq_len']}, "
                f"not {out['seq_len']}: rerun `trainledger corpus DATA --seq-len {out['seq_len']} --json`, "
                "or give --tokens", field="seq_len")
        out["tokens"] = float(hints["tokens"])
    return out


def parse_inputs(data: dict[str, Any], where: str = "plan") -> PlanInputs:
    data = apply_corpus(data)
    try:
        return PlanInputs.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, where) from None


def _default_intra(gpu: Any, per_node: int) -> str:
    """The GPU's own link, or its NVLink bridge when a node is exactly one bridged pair (H100 NVL)."""
    if gpu.nvlink_bridge_gb_per_s and per_node == 2 and gpu.nvlink_generation == 4:
        return "nvlink4-bridge"
    return gpu.link


def own_link(gpu: Any, per_node: int) -> Any:
    """The GPU's default intra-node link (``_default_intra``) at the GPU's own bandwidth where its
    datasheet states less than the link generation carries: H800 SXM5 (NVLink 4 cut to 400 GB/s
    both directions, 200 per direction, of the H100's 900) and one MI250X GCD (its share of
    Infinity Fabric). One object per link and bandwidth (the comm model memoizes by identity)."""
    return _capped_link(_default_intra(gpu, per_node), gpu.link, gpu.link_gb_per_s)


@lru_cache(maxsize=64)
def _capped_link(name: str, gpu_link: str, gb_per_s: float) -> Any:
    net = load_network(name)
    if name == gpu_link and gb_per_s * 1e9 < net.bytes_per_s:
        return net.model_copy(update={"gb_per_s": gb_per_s, "gbit_per_s": None})
    return net


def _network(name: str, field: str) -> Any:
    """The link the user named in ``field`` (--intra or --network); an unknown one names that flag."""
    try:
        return load_network(name)
    except CatalogError as exc:
        raise CatalogError(f"--{field}: {exc}", field=field) from None


def host_ram(gpu: GpuSpec, host_ram_gib: float | None) -> dict[str, Any]:
    """The ``Cluster`` field of a node's host RAM: the given GiB, else the Cluster's default for a
    GPU in an NVLink node (DGX class), else None (a PCIe card: any workstation or server, not judged)."""
    if host_ram_gib:
        return {"host_ram_bytes": int(host_ram_gib * GIB)}
    if not (gpu.max_gpus_per_node or gpu.nvlink_domain_size):
        return {"host_ram_bytes": None}
    return {}


def build_cluster(inputs: PlanInputs) -> Cluster:
    gpu = load_gpu(inputs.gpu)
    if inputs.power_limit_w:
        gpu = gpu.model_copy(update={"power_limit_w": inputs.power_limit_w})
    per_node = inputs.gpus_per_node or min(inputs.gpus, 8)
    if inputs.gpus % per_node:
        raise LayoutError(
            f"{inputs.gpus} GPUs do not fill whole nodes of {per_node}; use a multiple of {per_node} "
            f"or set --gpus-per-node"
        )
    limit = max(filter(None, (gpu.max_gpus_per_node, gpu.nvlink_domain_size)), default=None)
    if limit is not None and per_node > limit:
        raise LayoutError(
            f"{gpu.display_name}: a node holds at most {limit} GPUs in one NVLink domain, not {per_node}; "
            f"use --gpus-per-node {limit} (the nodes talk over --network)"
        )
    nodes = inputs.gpus // per_node
    intra = _network(inputs.intra, "intra") if inputs.intra else own_link(gpu, per_node)
    inter = None
    if nodes > 1 or inputs.network:
        inter = _network(inputs.network, "network") if inputs.network else load_network("ib-ndr")
    extra: dict[str, Any] = {}
    if inputs.nics_per_node:
        extra["nics_per_node"] = inputs.nics_per_node
    extra.update(host_ram(gpu, inputs.host_ram_gib))
    return Cluster(gpu=gpu, gpus_per_node=per_node, nodes=nodes, intra=intra, inter=inter, **extra)


def serving_of(inputs: PlanInputs, model: ModelSpec | None = None) -> Serving:
    """The serving settings of ``inputs`` (read by inference plans only); ``quantization="auto"``
    resolves to ``model``'s checkpoint quantization, or none."""
    keys = {k: k for k in Serving.model_fields if k not in ("engine", "quantization")}
    q = inputs.quantization
    if q == "auto":
        q = (model.checkpoint_quantization if model is not None else None) or "none"
        if q == "mxfp4" and (model is None or model.moe is None):
            q = "none"
    return Serving(engine=inputs.serving_engine, quantization=q, **{k: getattr(inputs, v) for k, v in keys.items()})


def _states_dtype(inputs: PlanInputs, precision: str) -> str | None:
    """The optimizer-state dtype as stated, or None where it is the precision policy's own (one form;
    on megatron-core a stated dtype also selects the precision-aware optimizer, so it stays)."""
    s = inputs.optimizer_states_dtype
    if inputs.method == "inference":  # no optimizer
        return None
    # the default: the policy's states dtype, and fp32 for LoRA adapters whatever the policy
    own = "fp32" if inputs.method in ("lora", "qlora") else PRECISION_POLICY[precision]["states"]
    if s is not None and inputs.framework != "megatron-core" and s == own:
        return None
    return s


def build_plan(inputs: PlanInputs, model: ModelSpec | None = None) -> Plan:
    """Resolve names (model preset, GPU, links) and validate the whole plan.

    ``model`` replaces ``inputs.model`` (e.g. a config.json the web app parsed from a request body).
    """
    model = model or load_model(inputs.model)
    if inputs.method == "inference":  # an inference job has no optimizer, no accumulation, no dropout
        inputs = inputs.model_copy(update={       # and no packed training documents
            "optimizer": _RECIPE["optimizer"].default, "grad_accum": 1, "dropout": 0.0, "doc_len": None,
            "offload": "none" if inputs.offload == "optimizer" else inputs.offload})
    try:
        cluster = build_cluster(inputs)
        precision = inputs.precision or default_precision(inputs.method, model, cluster.gpu)[0]
        recipe = Recipe(
            method=inputs.method, precision=precision,
            optimizer=stack_optimizer(inputs.optimizer, inputs.framework),
            seq_len=inputs.seq_len, doc_len=inputs.doc_len, micro_batch=inputs.micro_batch,
            grad_accum=inputs.grad_accum,
            global_batch=inputs.global_batch, recompute=inputs.recompute,
            recompute_layers=inputs.recompute_layers, attention=inputs.attention,
            lora_rank=inputs.lora_rank, lora_alpha=inputs.lora_alpha, lora_targets=inputs.lora_targets,
            train_tokens=inputs.tokens, generate_len=inputs.generate_len, dropout=inputs.dropout,
            grad_clip=inputs.grad_clip or None, fp4_bf16_layers=inputs.fp4_bf16_layers,
            moe_capacity_factor=inputs.moe_capacity_factor, moe_pad_to_capacity=inputs.moe_pad_to_capacity,
            optimizer_states_dtype=_states_dtype(inputs, precision),
        )
        # every Runtime field is a PlanInputs field of the same name (declared there from it)
        runtime = Runtime(**{k: getattr(inputs, k) for k in Runtime.model_fields})
        if runtime.model_loading == runtime.default_loading(inputs.zero, inputs.tp):
            runtime = runtime.model_copy(update={"model_loading": None})  # the stack's own: one form
        schedule = inputs.pp_schedule or ("interleaved" if inputs.vp > 1 else "1f1b")
        layout = Layout(
            dp=inputs.dp, tp=inputs.tp, pp=inputs.pp, cp=inputs.cp, ep=inputs.ep, etp=inputs.etp, sp=inputs.sp,
            vp=inputs.vp, pp_schedule=schedule, zero=inputs.zero, hybrid_shard=inputs.hybrid_shard,
            offload=inputs.offload,
        )
        return Plan(model=model, recipe=recipe, layout=layout, cluster=cluster, runtime=runtime,
                    headroom=inputs.headroom, serving=serving_of(inputs, model))
    except ValidationError as exc:
        raise spec_error(exc, "plan") from None
