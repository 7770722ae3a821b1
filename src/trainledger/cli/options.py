"""The model/recipe/layout/cluster flags shared by estimate, plan, verify, report and export."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..layout import Offload
from ..planfile import PlanInputs, build_plan, load_plan_file, parse_inputs
from ..plan import Plan
from ..recipe import ATTENTIONS, METHODS, OPTIMIZERS, PRECISIONS, RECOMPUTES
from ..units import parse_count

_OFFLOADS = Offload.__args__  # type: ignore[attr-defined]


def _count(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return None
    try:
        return float(parse_count(value))
    except Exception as exc:  # noqa: BLE001 - shown as a usage error
        raise click.BadParameter(str(exc)) from None


PLAN_OPTIONS: list[Callable] = [
    click.option("--plan", "plan_file", type=click.Path(dir_okay=False), help="plan file (YAML/TOML/JSON) with the same keys as these flags"),
    click.option("--from", "from_files", multiple=True, type=click.Path(dir_okay=False),
                 help="read the plan from existing configs: DeepSpeed JSON, Accelerate YAML, TrainingArguments, peft (repeatable)"),
    click.option("--model", "-m", help="preset name, config.json path/folder, or cached Hub id [llama-3.1-8b]"),
    click.option("--gpu", help="catalog GPU (see `trainledger gpus`) or a GPU spec file [h100-sxm]"),
    click.option("--gpus", type=int, help="total number of GPUs [1]"),
    click.option("--gpus-per-node", type=int, help="GPUs per node [min(gpus, 8)]"),
    click.option("--network", help="inter-node network, e.g. ib-ndr, roce-400 [ib-ndr]"),
    click.option("--method", type=click.Choice(METHODS), help="training method [full]"),
    click.option("--precision", type=click.Choice(PRECISIONS), help="precision policy [bf16-mixed]"),
    click.option("--optimizer", type=click.Choice(OPTIMIZERS), help="optimizer [adamw = torch foreach]"),
    click.option("--seq-len", type=int, help="sequence length in tokens [4096]"),
    click.option("--micro-batch", type=int, help="samples per GPU per forward pass [1]"),
    click.option("--grad-accum", type=int, help="micro-batches per optimizer step [1]"),
    click.option("--global-batch", type=int, help="samples per optimizer step over all replicas"),
    click.option("--recompute", type=click.Choice(RECOMPUTES), help="activation recomputation [none]"),
    click.option("--attention", type=click.Choice(ATTENTIONS), help="attention kernel [sdpa]"),
    click.option("--lora-rank", type=int, help="LoRA rank [16]"),
    click.option("--lora-targets", help="comma-separated module names LoRA wraps [all linear]"),
    click.option("--tokens", callback=_count, help="token budget of the run, e.g. 2B"),
    click.option("--dp", type=int, help="data-parallel degree [gpus / (tp·pp·cp)]"),
    click.option("--tp", type=int, help="tensor-parallel degree [1]"),
    click.option("--pp", type=int, help="pipeline-parallel degree [1]"),
    click.option("--cp", type=int, help="context-parallel degree [1]"),
    click.option("--ep", type=int, help="expert-parallel degree [1]"),
    click.option("--vp", type=int, help="virtual pipeline stages per rank (interleaved 1F1B) [1]"),
    click.option("--zero", type=click.IntRange(0, 3), help="ZeRO stage; 3 = FSDP full shard [0]"),
    click.option("--offload", type=click.Choice(_OFFLOADS), help="CPU offload [none]"),
    click.option("--headroom", type=float, help="memory kept free for the fit verdict [0.10]"),
    click.option("--corpus", type=click.Path(dir_okay=False),
                 help="stats JSON of `trainledger corpus --json`: sets --seq-len and --tokens (padding included)"),
]

_FLAG_KEYS = (
    "model", "gpu", "gpus", "gpus_per_node", "network", "method", "precision", "optimizer", "seq_len",
    "micro_batch", "grad_accum", "global_batch", "recompute", "attention", "lora_rank",
    "lora_targets", "tokens", "dp", "tp", "pp", "cp", "ep", "vp", "zero", "offload", "headroom",
    "corpus",
)


def plan_options(func: Callable) -> Callable:
    """Decorator adding every plan flag to a click command."""
    for opt in reversed(PLAN_OPTIONS):
        func = opt(func)
    return func


def inputs_from_options(kwargs: dict[str, Any]) -> PlanInputs:
    """Merge a plan file (if any) with the flags given; pops the plan keys from kwargs."""
    data: dict[str, Any] = {}
    plan_file = kwargs.pop("plan_file", None)
    if plan_file:
        data.update(load_plan_file(plan_file))
    from_files = kwargs.pop("from_files", None)
    checks: list = []
    if from_files:
        data.update(_imported(from_files, checks))
    flags: set[str] = set()
    for key in _FLAG_KEYS:
        value = kwargs.pop(key, None)
        if value is None:
            continue
        if key == "lora_targets":
            value = tuple(t.strip() for t in str(value).split(",") if t.strip())
        data[key] = value
        flags.add(key)
    if checks:
        from ..runconfig.guards import keep_train_batch

        data = keep_train_batch(data, checks, flags)
    return parse_inputs(data, "plan")


def _imported(paths: tuple[str, ...], checks: list | None = None) -> dict[str, Any]:
    """Plan inputs read from the user's configs; unknown keys and notes are reported on stderr."""
    from ..runconfig import import_configs

    res = import_configs(list(paths))
    if checks is not None:
        checks.extend(res.checks)
    for key in res.unknown_keys:
        click.echo(f"warning: unknown key {key} (not understood, not used for sizing)", err=True)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    return res.merged()


def plan_from_options(kwargs: dict[str, Any]) -> Plan:
    return build_plan(inputs_from_options(kwargs))


#: time-model overrides (issue 4); ``time_options_from_kwargs`` turns them into TimeOptions.
TIME_OPTIONS: list[Callable] = [
    click.option("--mfu", type=click.FloatRange(0, 1, min_open=True), help="force this model-FLOPs utilization (sets the step time)"),
    click.option("--matmul-efficiency", type=click.FloatRange(0, 1, min_open=True), help="override the GPU family's achievable fraction of dense peak for GEMMs"),
    click.option("--tp-comm-overlap", is_flag=True, default=None, help="the runtime overlaps TP collectives with GEMMs (Megatron-Core + TE)"),
    click.option("--no-grad-overlap", is_flag=True, default=None, help="DP gradient reduction not overlapped with backward"),
    click.option("--ep-comm-overlap", is_flag=True, default=None, help="the runtime hides the MoE all-to-all behind compute (DualPipe)"),
    click.option("--runtime", type=click.Choice(["hf", "megatron"]), default=None, help="kernel fusion of the training runtime: hf (PyTorch eager + transformers) or megatron (fused) [hf]"),
]


def time_options(func: Callable) -> Callable:
    """Decorator adding the time-model override flags."""
    for opt in reversed(TIME_OPTIONS):
        func = opt(func)
    return func


def time_options_from_kwargs(kwargs: dict[str, Any]):
    """Pop the time flags from kwargs into a TimeOptions."""
    from ..estimate.options import TimeOptions

    return TimeOptions(mfu=kwargs.pop("mfu", None), matmul_efficiency=kwargs.pop("matmul_efficiency", None),
                       tp_comm_overlap=bool(kwargs.pop("tp_comm_overlap", None)),
                       overlap_grad_reduce=not kwargs.pop("no_grad_overlap", None),
                       ep_comm_overlap=bool(kwargs.pop("ep_comm_overlap", None)),
                       runtime=kwargs.pop("runtime", None) or "hf")
