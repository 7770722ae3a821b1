"""`trainledger check`: exit non-zero when the plan does not fit — a guard for launch scripts.

Exit status: 0 the plan fits (peak on the device within the budget after headroom), 1 it does not
(the reason and the cheapest changes that make it fit are printed), 2 a usage error (bad flags,
unknown model, a config that does not state the model or sequence length).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from trainledger.estimate import EstimateOptions
from trainledger.estimate.memory import estimate_memory
from trainledger.units import GIB
from trainledger.cli.options import plan_from_options, plan_options
from trainledger.cli.output import echo_json

#: exit status of a plan that does not fit (2 is taken by usage errors)
EXIT_DOES_NOT_FIT = 1


def register(main: click.Group) -> None:
    main.add_command(check_cmd)


def check_result(plan: Any) -> dict[str, Any]:
    """The verdict of one plan: fits, needs/budget bytes, and the reason when it does not fit."""
    mem = estimate_memory(plan, EstimateOptions().memory)
    d = mem.to_dict()
    gpu = plan.cluster.gpu.name
    out: dict[str, Any] = {
        "fits": d["fits"], "needs_bytes": d["device_total_bytes"], "budget_bytes": d["budget_bytes"],
        "usable_bytes": d["usable_bytes"], "headroom": d["headroom"], "gpu": gpu,
        "peak_phase": d.get("peak_phase"), "suggestions": d.get("suggestions", []),
    }
    if not d["fits"]:
        out["reason"] = (f"needs {d['device_total_bytes'] / GIB:.2f} GiB per GPU on the device, {gpu} "
                         f"allows {d['budget_bytes'] / GIB:.2f} GiB ({d['usable_bytes'] / GIB:.2f} GiB usable "
                         f"less {100 * d['headroom']:.0f}% headroom); peak in {d.get('peak_phase')}")
    return out


@click.command("check")
@click.argument("plan_path", required=False, type=click.Path(dir_okay=False))
@plan_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--quiet", "-q", is_flag=True, help="print nothing; only the exit status")
def check_cmd(plan_path: str | None, as_json: bool, quiet: bool, **kwargs: Any) -> None:
    """Exit 0 when the plan (file PLAN_PATH and/or flags) fits in GPU memory, 1 (with the reason)
    when it does not.

    Example, in a launch script: trainledger check --from axolotl.yml --gpus 8 && accelerate launch ...
    """
    if plan_path and kwargs.get("plan_file"):
        raise click.UsageError("give the plan file once: as PLAN_PATH or as --plan, not both")
    if plan_path:  # as `export PLAN_PATH`: `trainledger check plan.yaml`
        kwargs["plan_file"] = plan_path
    plan = plan_from_options(kwargs)
    res = check_result(plan)
    if as_json:
        echo_json(res)
    elif not quiet:
        if res["fits"]:
            click.echo(f"fits: needs {res['needs_bytes'] / GIB:.2f} of {res['budget_bytes'] / GIB:.2f} GiB "
                       f"per {res['gpu']}")
        else:
            click.echo(f"does not fit: {res['reason']}")
            for s in res["suggestions"][:3]:
                click.echo(f"  try: {s['change']} (peak {s['peak_allocated_gib']:.2f} GiB)")
    if not res["fits"]:
        sys.exit(EXIT_DOES_NOT_FIT)
