"""The model/recipe/layout/cluster flags shared by estimate, plan, verify, report and export."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from typing import Any

import click
from pydantic_core import PydanticUndefined

from trainledger.errors import SpecError
from trainledger.load.plan import PlanInputs, build_plan, load_plan_file, parse_inputs
from trainledger.spec.plan import Plan
from trainledger.units import parse_count


def _count(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return None
    try:
        return float(parse_count(value))
    except Exception as exc:  # noqa: BLE001 - shown as a usage error
        raise click.BadParameter(str(exc)) from None


#: what the CLI adds to a PlanInputs field: short names and parsers (the field itself is declared once)
_SHORT: dict[str, str] = {"model": "-m"}
_CALLBACKS: dict[str, Callable] = {"tokens": _count}
_PATHS = ("corpus",)


def _click_type(annotation: Any) -> Any:
    """The click type of a PlanInputs field annotation (Optional unwrapped, Literal as choices)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        values = typing.get_args(annotation)
        if all(isinstance(v, int) for v in values):
            return click.IntRange(min(values), max(values))
        return click.Choice([str(v) for v in values])
    if annotation is int:
        return int
    if annotation is float:
        return float
    return None  # str, tuple[str, ...]: taken as text


def _default_text(info: Any) -> str:
    default = info.default
    if default is None or default is PydanticUndefined:
        return ""
    if isinstance(default, tuple):
        return ""
    if isinstance(default, bool):
        return ""
    return f" [{default}]"


def _field_option(name: str, info: Any, default_text: str | None = None) -> Callable:
    """One click option generated from one PlanInputs field (None when not given on the line).

    ``default_text`` replaces the field's own default in the help, for a command whose default is
    not the field's (``plan`` plans the built-in example job: 20B tokens, ranked by cost).
    """
    flag = "--" + name.replace("_", "-")
    help_text = info.description or name
    if default_text is None:
        help_text += _default_text(info)
    else:  # the description's own "[default]" is the field's, not this command's: replace it
        help_text = re.sub(r"\s*\[[^\]]*\]$", "", help_text) + f" [{default_text}]"
    decls = [flag] + ([_SHORT[name]] if name in _SHORT else [])
    if info.annotation in (bool, bool | None):
        on = "on" if info.default else "off"
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=f"{help_text} [{on}]")
    kwargs: dict[str, Any] = {"help": help_text, "default": None}
    if name in _CALLBACKS:
        kwargs["callback"] = _CALLBACKS[name]
    elif name in _PATHS:
        kwargs["type"] = click.Path(dir_okay=False)
    else:
        ctype = _click_type(info.annotation)
        if ctype is not None:
            kwargs["type"] = ctype
    return click.option(*decls, name, **kwargs)


#: the plan flags of estimate, verify, report and export: --plan, --from, then one per PlanInputs field
PLAN_OPTIONS: list[Callable] = [
    click.option("--plan", "plan_file", type=click.Path(dir_okay=False), help="plan file (YAML/TOML/JSON) with the same keys as these flags"),
    click.option("--from", "from_files", multiple=True, type=click.Path(dir_okay=False),
                 help="read the plan from existing configs: DeepSpeed JSON, Accelerate YAML, TrainingArguments/TRL, peft, axolotl, LLaMA-Factory, torchtitan TOML, Megatron/NeMo args (repeatable)"),
    *[_field_option(name, info) for name, info in PlanInputs.model_fields.items()],
]

_FLAG_KEYS: tuple[str, ...] = tuple(PlanInputs.model_fields)


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
        from trainledger.runconfig.guards import keep_train_batch

        data = keep_train_batch(data, checks, flags)
    if from_files:
        from trainledger.runconfig.importers import require_essentials

        require_essentials(data, from_files)
    try:
        inputs = parse_inputs(data, "plan")
    except SpecError as exc:
        raise with_flags(exc, "plan", {k: flag_of(k) for k in flags}) from None
    warn_unused(inputs, flags)
    return inputs


def flag_of(field: str) -> str:
    """The command-line flag of a PlanInputs field: ``seq_len`` -> ``--seq-len``."""
    return "--" + field.replace("_", "-")


def with_flags(exc: SpecError, where: str, flag_names: dict[str, str]) -> SpecError:
    """``exc`` with each ``where: field:`` part about a flag given on the line named by that flag.

    ``plan: gpus: Input should be greater than 0 (got 0)`` becomes ``--gpus: Input should be greater
    than 0 (got 0)``: the user typed ``--gpus``, not the field name. Parts about plan-file keys stay.
    """
    msg = str(exc)
    if not msg.startswith(where + ": "):
        return exc
    parts = msg[len(where) + 2:].split("; ")
    named = []
    for part in parts:
        field, sep, rest = part.partition(": ")
        named.append(f"{flag_names[field]}: {rest}" if sep and field in flag_names else part)
    if named == parts:
        return exc
    renamed = [p for p, q in zip(named, parts) if p != q]
    kept = [q for p, q in zip(named, parts) if p == q]  # plan-file keys
    more = [q for q in kept if re.fullmatch(r"and \d+ more", q)]  # spec_error's tail
    kept = [q for q in kept if q not in more]
    out = "; ".join(renamed + ([f"{where}: " + "; ".join(kept)] if kept else []) + more)
    return type(exc)(out, field=exc.field)


def warn_unused(inputs: PlanInputs, flags: set[str]) -> None:
    """One stderr warning per flag given on the line that this plan never reads (never silent)."""
    from trainledger.load.plan import unused_inputs

    for key, why in unused_inputs(inputs, flags):
        click.echo(f"warning: {flag_of(key)} is ignored: {why}", err=True)


def _imported(paths: tuple[str, ...], checks: list | None = None) -> dict[str, Any]:
    """Plan inputs read from the user's configs; unknown keys and notes are reported on stderr."""
    from trainledger.runconfig import import_configs

    res = import_configs(list(paths))
    if checks is not None:
        checks.extend(res.checks)
    for key in res.unknown_keys:
        click.echo(f"warning: unknown key {key} (not understood, not used for sizing)", err=True)
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    return res.merged()


def plan_from_options(kwargs: dict[str, Any]) -> Plan:
    inputs = inputs_from_options(kwargs)
    plan = build_plan(inputs)
    if inputs.mla_latent_cache and inputs.method == "inference" and plan.model.mla is None:
        click.echo(f"warning: --mla-latent-cache is ignored: {plan.model.name} has no multi-head latent "
                   "attention (MLA: DeepSeek-V2/V3, Kimi K2); its KV cache holds per-head K and V", err=True)
    return plan


#: time-model overrides (issue 4); ``time_options_from_kwargs`` turns them into TimeOptions.
#: (``--tp-comm-overlap`` and ``--ep-comm-overlap`` are plan flags: the plan's ``Runtime`` fields, which
#: an imported Megatron script or torchtitan TOML states too; ``--runtime`` overrides ``--kernels``.)
TIME_OPTIONS: list[Callable] = [
    click.option("--mfu", type=click.FloatRange(0, 1, min_open=True), help="force this model-FLOPs utilization (sets the step time)"),
    click.option("--matmul-efficiency", type=click.FloatRange(0, 1, min_open=True), help="override the GPU family's achievable fraction of dense peak for GEMMs"),
    click.option("--no-grad-overlap", is_flag=True, default=None, help="DP gradient reduction not overlapped with backward"),
    click.option("--runtime", type=click.Choice(["hf", "megatron"]), default=None, help="override the plan's kernel fusion (--kernels) for the time model: hf (PyTorch eager modules) or megatron (fused: TE, Apex, torch.compile) [the plan's --kernels, else the --framework profile's]"),
]


def time_options(func: Callable) -> Callable:
    """Decorator adding the time-model override flags."""
    for opt in reversed(TIME_OPTIONS):
        func = opt(func)
    return func


def time_options_from_kwargs(kwargs: dict[str, Any]):
    """Pop the time flags from kwargs into a TimeOptions."""
    from trainledger.estimate.options import TimeOptions

    return TimeOptions(mfu=kwargs.pop("mfu", None), matmul_efficiency=kwargs.pop("matmul_efficiency", None),
                       overlap_grad_reduce=not kwargs.pop("no_grad_overlap", None),
                       runtime=kwargs.pop("runtime", None))
