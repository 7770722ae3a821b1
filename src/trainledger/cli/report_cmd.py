"""`trainledger report`: a report to hand to a CTO or a vendor (HTML, Markdown, text or JSON)."""

from __future__ import annotations

from typing import Any

import click

from trainledger.estimate.options import EstimateOptions
from trainledger.load.plan import parse_inputs
from trainledger.report import (
    FORMATS, build_report, format_for, inputs_from_plan_result, read_json, render, write_atomic,
)
from trainledger.cli.cost_opts import cost_options, cost_options_from_kwargs
from trainledger.cli.options import inputs_from_options, plan_options
from trainledger.cli.output import echo_json


def register(main: click.Group) -> None:
    main.add_command(report_cmd)


def _gpu_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("give GPU names separated by commas, e.g. h100-sxm,h200,l40s")
    from trainledger.errors import CatalogError
    from trainledger.load.catalog import load_gpu

    for name in names:  # a typo is an error now, not a row of the report saying "invalid"
        try:
            load_gpu(name)
        except CatalogError as exc:
            raise click.BadParameter(str(exc)) from None
    return names


@click.command("report")
@click.argument("plan_path", required=False, type=click.Path(dir_okay=False))
@plan_options
@cost_options
@click.option("--out", "-o", "out", type=click.Path(dir_okay=False),
              help="file to write: .html (self-contained, offline), .md, .txt or .json [print text]")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="format [from the --out suffix]")
@click.option("--compare-gpus", callback=_gpu_list,
              help="candidate GPUs for the comparison charts, comma-separated [h100-sxm,h200,a100-sxm-80gb,l40s,rtx-4090]")
@click.option("--from-plan-json", type=click.Path(dir_okay=False),
              help="output of `trainledger plan --json`: report on a ranked plan (flags override it)")
@click.option("--pick", type=click.IntRange(1), default=1, show_default=True,
              help="which ranked plan of --from-plan-json")
@click.option("--verify-json", type=click.Path(dir_okay=False),
              help="output of `trainledger verify memory --json`: adds measured vs predicted")
@click.option("--checkpoint-dir", help="where checkpoints will be written (shown on the acceptance sheet)")
@click.option("--soak-json", type=click.Path(dir_okay=False),
              help="output of `trainledger verify soak --out FILE`: adds the soak checks and time series")
@click.option("--json", "as_json", is_flag=True, help="print what was written as JSON")
def report_cmd(plan_path: str | None, out: str | None, fmt: str | None, compare_gpus: list[str] | None,
               from_plan_json: str | None, pick: int, verify_json: str | None, checkpoint_dir: str | None,
               soak_json: str | None, as_json: bool, **kwargs: Any) -> None:
    """Write a report of one plan: memory per GPU by term on candidate GPUs, memory against
    sequence length and micro-batch, the memory timeline of a step, the step-time breakdown, time
    and cost against GPU count (Pareto front), the procurement and acceptance sheet, risks and
    upgrade triggers; planner and verify results when given. Takes the same plan flags as
    `estimate` (or a plan file)."""
    if plan_path and not kwargs.get("plan_file"):
        kwargs["plan_file"] = plan_path
    cost = cost_options_from_kwargs(kwargs)
    given = inputs_from_options(kwargs)
    plan_result = read_json(from_plan_json, "trainledger plan --json") if from_plan_json else None
    inputs = given
    if plan_result is not None:
        base = inputs_from_plan_result(plan_result, pick - 1)
        inputs = parse_inputs({**base.model_dump(exclude_unset=True), **given.model_dump(exclude_unset=True)},
                              "plan")
    verify_result = read_json(verify_json, "trainledger verify memory --json") if verify_json else None
    soak_result = read_json(soak_json, "trainledger verify soak --out FILE") if soak_json else None
    fmt = fmt or (format_for(out) if out else "txt")
    data = build_report(inputs, EstimateOptions(cost=cost), compare_gpus=compare_gpus, plan_result=plan_result,
                        verify_result=verify_result, checkpoint_dir=checkpoint_dir, soak_result=soak_result)
    text = render(data, fmt)
    if out is None:
        click.echo(text, nl=False)
        return
    path = write_atomic(out, text)
    if as_json:
        echo_json({"path": str(path), "format": fmt, "bytes": len(text.encode()), "title": data.title})
    else:
        click.echo(f"wrote {path} ({fmt}, {len(text.encode()):,} bytes): {data.title}")
