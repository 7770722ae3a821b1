"""`trainledger export`: write a plan as ready-to-launch configuration files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trainledger.errors import SpecError, TrainledgerError
from trainledger.runconfig import EXPORT_FORMATS, SERVING_EXPORT_FORMATS, export_plan
from trainledger.cli.options import inputs_from_options, plan_options
from trainledger.cli.output import echo_json


def register(main: click.Group) -> None:
    main.add_command(export_cmd)


@click.command("export")
@click.argument("plan_path", required=False, type=click.Path(dir_okay=False))
@plan_options
@click.option("--to", "formats", multiple=True, required=True,
              type=click.Choice(EXPORT_FORMATS + SERVING_EXPORT_FORMATS + ("all",)),
              help="output format (repeatable, or 'all'); vllm/sglang for --method inference")
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="directory to write the files into")
@click.option("--force", is_flag=True, help="overwrite existing files")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def export_cmd(plan_path: str | None, formats: tuple[str, ...], out_dir: str, force: bool,
               as_json: bool, **kwargs: Any) -> None:
    """Export a plan (file PLAN_PATH and/or flags) as ready-to-launch files: torchrun, accelerate,
    deepspeed, fsdp, trainer-args, slurm, torchtitan, megatron or nemo for training; vllm or sglang
    for --method inference. Each file's header names the plan and its predictions.

    Example: trainledger export --to deepspeed --gpus 8 --zero 3 -o launch/
    """
    if plan_path and not kwargs.get("plan_file"):
        kwargs["plan_file"] = plan_path
    inputs = inputs_from_options(kwargs)
    every = SERVING_EXPORT_FORMATS if inputs.method == "inference" else EXPORT_FORMATS
    fmts = every if "all" in formats else formats
    files = []
    for fmt in fmts:
        try:
            files += export_plan(inputs, fmt)
        except SpecError as exc:
            if "all" in formats:
                click.echo(f"skipped {fmt}: {exc}", err=True)
                continue
            raise
    from trainledger.safety import write_atomic

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only folder, a file in the path: one line, no traceback
        raise TrainledgerError(f"--out {out}: cannot create the folder ({exc.strerror or exc}); "
                               "choose a writable --out") from None
    written = []
    for f in files:
        target = out / f.name
        if target.exists() and not force:
            raise SpecError(f"{target} exists; pass --force to overwrite or choose another --out")
        write_atomic(target, f.text, what=f"{f.fmt} file")
        if f.name.endswith((".sh", ".sbatch")):
            target.chmod(0o755)
        written.append({"format": f.fmt, "path": str(target)})
    if as_json:
        echo_json({"files": written})
        return
    for w in written:
        click.echo(f"wrote {w['path']}  ({w['format']})")
