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
from .recipe import DEFAULT_LORA_TARGETS, Attention, Method, Optimizer, Precision, Recipe, Recompute
from .safety import check_tree, clip, path_exists, read_text, shorten

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100-sxm"


class PlanInputs(Spec):
    """Everything a user states about one job, flat. Names match the CLI flags."""

    model: str = Field(DEFAULT_MODEL, description="preset name, config.json path or Hub id")
    gpu: str = Field(DEFAULT_GPU, description="catalog GPU name or a GPU spec file")
    gpus: int = Field(1, gt=0, le=1_000_000, description="total GPUs (world size)")
    gpus_per_node: int | None = Field(None, gt=0, le=1024, description="default: min(gpus, 8)")
    intra: str | None = Field(None, description="intra-node link (default: the GPU's own link)")
    network: str | None = Field(None, description="inter-node network (default: ib-ndr when multi-node)")
    nics_per_node: int | None = Field(None, gt=0, le=64)
    method: Method = "full"
    precision: Precision = "bf16-mixed"
    optimizer: Optimizer = "adamw"
    seq_len: int = Field(4096, gt=0, le=10_000_000)
    micro_batch: int = Field(1, gt=0, le=1_000_000)
    grad_accum: int = Field(1, gt=0, le=1_000_000)
    global_batch: int | None = Field(None, gt=0)
    recompute: Recompute = "none"
    recompute_layers: int | None = Field(None, ge=0)
    attention: Attention = "sdpa"
    lora_rank: int = Field(16, gt=0, le=65536)
    lora_alpha: float = Field(32.0, gt=0, allow_inf_nan=False)
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    tokens: float | None = Field(None, gt=0, allow_inf_nan=False, description="token budget of the run")
    generate_len: int = Field(0, ge=0)
    dp: int | None = Field(None, gt=0)
    tp: int = Field(1, gt=0, le=1024)
    pp: int = Field(1, gt=0, le=1024)
    cp: int = Field(1, gt=0, le=1024)
    ep: int = Field(1, gt=0, le=4096)
    sp: bool = True
    vp: int = Field(1, gt=0, le=128)
    pp_schedule: PipelineSchedule | None = None
    zero: int = Field(0, ge=0, le=3)
    hybrid_shard: bool = False
    offload: Offload = "none"
    headroom: float = Field(0.10, ge=0.0, lt=0.9)
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


def build_cluster(inputs: PlanInputs) -> Cluster:
    gpu = load_gpu(inputs.gpu)
    per_node = inputs.gpus_per_node or min(inputs.gpus, 8)
    if inputs.gpus % per_node:
        raise LayoutError(
            f"{inputs.gpus} GPUs do not fill whole nodes of {per_node}; use a multiple of {per_node} "
            f"or set --gpus-per-node"
        )
    nodes = inputs.gpus // per_node
    intra = load_network(inputs.intra or gpu.link)
    inter = None
    if nodes > 1 or inputs.network:
        inter = load_network(inputs.network or "ib-ndr")
    extra: dict[str, Any] = {}
    if inputs.nics_per_node:
        extra["nics_per_node"] = inputs.nics_per_node
    return Cluster(gpu=gpu, gpus_per_node=per_node, nodes=nodes, intra=intra, inter=inter, **extra)


def build_plan(inputs: PlanInputs, model: ModelSpec | None = None) -> Plan:
    """Resolve names (model preset, GPU, links) and validate the whole plan.

    ``model`` replaces ``inputs.model`` (e.g. a config.json the web app parsed from a request body).
    """
    model = model or load_model(inputs.model)
    try:
        recipe = Recipe(
            method=inputs.method, precision=inputs.precision, optimizer=inputs.optimizer,
            seq_len=inputs.seq_len, micro_batch=inputs.micro_batch, grad_accum=inputs.grad_accum,
            global_batch=inputs.global_batch, recompute=inputs.recompute,
            recompute_layers=inputs.recompute_layers, attention=inputs.attention,
            lora_rank=inputs.lora_rank, lora_alpha=inputs.lora_alpha, lora_targets=inputs.lora_targets,
            train_tokens=inputs.tokens, generate_len=inputs.generate_len,
        )
        schedule = inputs.pp_schedule or ("interleaved" if inputs.vp > 1 else "1f1b")
        layout = Layout(
            dp=inputs.dp, tp=inputs.tp, pp=inputs.pp, cp=inputs.cp, ep=inputs.ep, sp=inputs.sp,
            vp=inputs.vp, pp_schedule=schedule, zero=inputs.zero, hybrid_shard=inputs.hybrid_shard,
            offload=inputs.offload,
        )
        cluster = build_cluster(inputs)
        return Plan(model=model, recipe=recipe, layout=layout, cluster=cluster, headroom=inputs.headroom)
    except ValidationError as exc:
        raise spec_error(exc, "plan") from None
