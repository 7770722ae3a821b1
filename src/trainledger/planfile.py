"""Flat, user-facing plan inputs (CLI flags, plan files, web form) -> a validated Plan.

A plan file (YAML, TOML or JSON) holds the same keys as the ``estimate`` flags, with
underscores: ``model``, ``gpu``, ``gpus``, ``method``, ``precision``, ``seq_len`` ...
Flags given on the command line override the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from ._spec import Spec, spec_error
from .catalog import load_gpu, load_network, read_data_file
from .cluster import Cluster
from .errors import LayoutError, SpecError
from .hfconfig import load_model
from .layout import Layout, Offload, PipelineSchedule
from .model import ModelSpec
from .plan import Plan
from .precision import default_precision
from .runtime import FRAMEWORKS, Framework, ParamDtype, ReduceDtype, Runtime, Wrap
from .recipe import DEFAULT_LORA_TARGETS, Attention, Method, Optimizer, Precision, Recipe, Recompute
from .units import GIB
from .safety import check_tree, clip, path_exists, read_text, shorten

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100-sxm"
#: largest token budget accepted: 1e15 is ~65x the 15T tokens Llama 3 trained on (Meta, "The Llama 3
#: Herd of Models", arXiv:2407.21783, §3.1) and beyond any text corpus; larger is a typo (1e30)
MAX_TOKENS = 1e15


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
    # -- the software stack
    framework: Framework = Field("hf", description="software stack that runs the job: " + ", ".join(FRAMEWORKS))
    reshard_after_forward: bool = Field(True, description="fsdp2: free gathered parameters after forward")
    param_dtype: ParamDtype = Field("bf16", description="fsdp2 MixedPrecisionPolicy param_dtype")
    reduce_dtype: ReduceDtype = Field("fp32", description="fsdp2 MixedPrecisionPolicy reduce_dtype")
    wrap: Wrap = Field("layers", description="fsdp2 wrapping: layers, or layers+embed+head")
    loss_parallel: bool = Field(False, description="torch TP loss_parallel (cross-entropy on sharded logits)")
    gradient_as_bucket_view: bool = Field(False, description="DDP gradient_as_bucket_view (no separate gradient copy)")
    # -- the recipe
    method: Method = Field("full", description="training method: pretrain, full fine-tune, lora, qlora, inference")
    precision: Precision | None = Field(
        None, description="precision policy [by method: bf16-mixed for pretrain/full; the checkpoint's dtype "
        "with fp32 adapters for lora/qlora; the checkpoint's dtype for inference; fp16 on GPUs without bf16]")
    optimizer: Optimizer = Field("adamw", description="optimizer (adamw = torch's foreach AdamW)")
    seq_len: int = Field(4096, gt=0, le=10_000_000, description="sequence length in tokens")
    micro_batch: int = Field(1, gt=0, le=1_000_000, description="samples per GPU per forward pass")
    grad_accum: int = Field(1, gt=0, le=1_000_000, description="micro-batches per optimizer step")
    global_batch: int | None = Field(None, gt=0, description="samples per optimizer step over all replicas")
    recompute: Recompute = Field("none", description="activation recomputation")
    recompute_layers: int | None = Field(None, ge=0, description="with --recompute full: only this many layers are checkpointed [all]")
    attention: Attention = Field("sdpa", description="attention kernel")
    lora_rank: int = Field(16, gt=0, le=65536, description="LoRA rank")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scaling only; no memory effect)")
    lora_targets: tuple[str, ...] = Field(DEFAULT_LORA_TARGETS, description="comma-separated module names LoRA wraps [all linear]")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="attention/hidden dropout probability")
    grad_clip: float | None = Field(1.0, ge=0.0, description="max gradient norm; 0 = no clipping")
    tokens: float | None = Field(None, gt=0, le=MAX_TOKENS, description="token budget of the run, e.g. 2B")
    generate_len: int = Field(0, ge=0, le=10_000_000, description="inference: new tokens per sequence beyond --seq-len")
    # -- the layout
    dp: int | None = Field(None, gt=0, description="data-parallel degree [gpus / (tp·pp·cp)]")
    tp: int = Field(1, gt=0, le=1024, description="tensor-parallel degree")
    pp: int = Field(1, gt=0, le=1024, description="pipeline-parallel degree")
    cp: int = Field(1, gt=0, le=1024, description="context-parallel degree")
    ep: int = Field(1, gt=0, le=4096, description="expert-parallel degree")
    sp: bool = Field(True, description="sequence parallelism with TP")
    vp: int = Field(1, gt=0, le=128, description="virtual pipeline stages per rank (interleaved 1F1B)")
    pp_schedule: PipelineSchedule | None = Field(None, description="pipeline schedule [1f1b, interleaved when --vp > 1]")
    zero: int = Field(0, ge=0, le=3, description="ZeRO stage; 3 = full shard (FSDP)")
    hybrid_shard: bool = Field(False, description="shard within a node, replicate across nodes (HSDP)")
    offload: Offload = Field("none", description="CPU offload of optimizer states, or of params too")
    host_ram_gib: float | None = Field(
        None, gt=0, le=1_048_576, description="host RAM per node in GiB [2048 = a DGX-class node for GPUs in an "
        "NVLink domain (DGX H100: 2 TB); not known, so not judged, for PCIe cards]")
    headroom: float = Field(0.10, ge=0.0, lt=0.9, description="fraction of memory kept free for the fit verdict")
    corpus: str | None = Field(None, description="stats JSON of `trainledger corpus --json`: sets seq_len "
                               "and tokens (padding included) unless they are given")


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
        raise SpecError(f"{p}: unknown keys {clip(unknown, 200)}; accepted: {', '.join(PlanInputs.model_fields)}")
    return data


def apply_corpus(data: dict[str, Any]) -> dict[str, Any]:
    """``corpus: stats.json`` fills seq_len and tokens (padded tokens per epoch) when not given."""
    if not data.get("corpus"):
        return data
    from .corpus import plan_hints

    hints = plan_hints(str(data["corpus"]))
    out = dict(data)
    if out.get("seq_len") is None:
        out["seq_len"] = hints["seq_len"]
    if out.get("tokens") is None:
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


def build_cluster(inputs: PlanInputs) -> Cluster:
    gpu = load_gpu(inputs.gpu)
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
    intra = load_network(inputs.intra or _default_intra(gpu, per_node))
    inter = None
    if nodes > 1 or inputs.network:
        inter = load_network(inputs.network or "ib-ndr")
    extra: dict[str, Any] = {}
    if inputs.nics_per_node:
        extra["nics_per_node"] = inputs.nics_per_node
    if inputs.host_ram_gib:
        extra["host_ram_bytes"] = int(inputs.host_ram_gib * GIB)
    elif not (gpu.max_gpus_per_node or gpu.nvlink_domain_size):  # a PCIe card: any workstation or server
        extra["host_ram_bytes"] = None
    return Cluster(gpu=gpu, gpus_per_node=per_node, nodes=nodes, intra=intra, inter=inter, **extra)


def build_plan(inputs: PlanInputs, model: ModelSpec | None = None) -> Plan:
    """Resolve names (model preset, GPU, links) and validate the whole plan.

    ``model`` replaces ``inputs.model`` (e.g. a config.json the web app parsed from a request body).
    """
    model = model or load_model(inputs.model)
    try:
        cluster = build_cluster(inputs)
        precision = inputs.precision or default_precision(inputs.method, model, cluster.gpu)[0]
        recipe = Recipe(
            method=inputs.method, precision=precision, optimizer=inputs.optimizer,
            seq_len=inputs.seq_len, micro_batch=inputs.micro_batch, grad_accum=inputs.grad_accum,
            global_batch=inputs.global_batch, recompute=inputs.recompute,
            recompute_layers=inputs.recompute_layers, attention=inputs.attention,
            lora_rank=inputs.lora_rank, lora_alpha=inputs.lora_alpha, lora_targets=inputs.lora_targets,
            train_tokens=inputs.tokens, generate_len=inputs.generate_len, dropout=inputs.dropout,
            grad_clip=inputs.grad_clip or None,
        )
        runtime = Runtime(
            framework=inputs.framework, reshard_after_forward=inputs.reshard_after_forward,
            param_dtype=inputs.param_dtype, reduce_dtype=inputs.reduce_dtype, wrap=inputs.wrap,
            loss_parallel=inputs.loss_parallel, gradient_as_bucket_view=inputs.gradient_as_bucket_view,
        )
        schedule = inputs.pp_schedule or ("interleaved" if inputs.vp > 1 else "1f1b")
        layout = Layout(
            dp=inputs.dp, tp=inputs.tp, pp=inputs.pp, cp=inputs.cp, ep=inputs.ep, sp=inputs.sp,
            vp=inputs.vp, pp_schedule=schedule, zero=inputs.zero, hybrid_shard=inputs.hybrid_shard,
            offload=inputs.offload,
        )
        return Plan(model=model, recipe=recipe, layout=layout, cluster=cluster, runtime=runtime,
                    headroom=inputs.headroom)
    except ValidationError as exc:
        raise spec_error(exc, "plan") from None
