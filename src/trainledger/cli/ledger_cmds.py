"""`trainledger ledger list|show|export` and `trainledger calibrate`."""

from __future__ import annotations

from typing import Any

import click

from trainledger.cli.output import echo_json, table

LEDGER_HELP = "ledger file [$TRAINLEDGER_LEDGER or ~/.local/share/trainledger/ledger.db]"


def _plan_options(func: Any) -> Any:
    from trainledger.cli.options import plan_options

    return plan_options(func)


def register(main: click.Group) -> None:
    main.add_command(ledger_group)
    main.add_command(calibrate_cmd)


@click.group("ledger")
def ledger_group() -> None:
    """The local ledger of estimates and measurements (SQLite)."""


def _summary(result: dict[str, Any]) -> str:
    try:
        return _summary_of(result)
    except (TypeError, KeyError, AttributeError, ValueError):  # a record of another shape: no summary
        return ""


def _summary_of(result: dict[str, Any]) -> str:
    m = result.get("measured")
    if isinstance(m, dict) and m.get("peak_allocated_bytes") is not None:
        from trainledger.units import fmt_bytes

        return f"peak {fmt_bytes(m['peak_allocated_bytes'])} on {m.get('device')}"
    if "items" in result:
        return f"{sum(i['status'] == 'pass' for i in result['items'])}/{len(result['items'])} items pass"
    if "crossed" in result and "checks" in result:  # verify soak
        rec = (result.get("recovery") or {}).get("recovery_s")
        return (f"{sum(c['status'] == 'pass' for c in result['checks'])}/{len(result['checks'])} checks pass"
                + (f", recovery {rec:.0f} s" if rec is not None else ""))
    if "verdict" in result:
        return f"efficiency {result.get('efficiency', 0):.2f} ({result['verdict']})"
    if "n_measurements" in result:
        return f"fitted from {result['n_measurements']} measurement(s)"
    from trainledger.units import fmt_rate

    if "peak" in result:
        return "peak busbw " + ", ".join(f"{op} {fmt_rate(v['busbw_bytes_per_s'])}" for op, v in result["peak"].items())
    if "storage" in result:
        st = result["storage"]
        return f"read {fmt_rate(st['seq_read_bytes_per_s'])}, {st['random_4k_iops']:,.0f} IOPS"
    mem = result.get("memory")
    if isinstance(mem, dict) and mem.get("device_total_bytes") is not None:  # an estimate
        from trainledger.units import fmt_bytes, fmt_seconds

        step = (result.get("compute") or {}).get("step_time_s")
        return (f"predicted {fmt_bytes(mem['device_total_bytes'])} per GPU on the device "
                f"({'fits' if mem.get('fits') else 'does not fit'})"
                + (f", step {fmt_seconds(step)}" if step else ""))
    if "findings" in result and "gpu" in result:
        fails = sum(f["level"] == "fail" for f in result["findings"] or [])
        return f"{len(result['gpu'].get('gpus', []))} GPU(s), {fails} failing finding(s)"
    return ""


@ledger_group.command("list")
@click.option("--ledger", "path", type=click.Path(dir_okay=False), help=LEDGER_HELP)
@click.option("--kind", type=click.Choice(("estimate", "measurement", "calibration")))
@click.option("--env", "env_id", help="only this environment id")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def list_cmd(path: str | None, kind: str | None, env_id: str | None, limit: int, as_json: bool) -> None:
    """Records, newest first."""
    from trainledger.ledger import Ledger

    with Ledger(path) as led:
        recs = led.list(kind=kind, env_id=env_id, limit=limit)
    if as_json:
        echo_json({"records": [{k: v for k, v in r.to_dict().items() if k != "result"} for r in recs]})
        return
    ok = {True: "pass", False: "FAIL", None: ""}
    rows = [[r.id, r.created_at[:19].replace("T", " "), r.kind, r.command, r.env_id,
             (r.plan or {}).get("model", ""), ok[r.ok],
             f"damaged row: {r.damaged}" if r.damaged else _summary(r.result)] for r in recs]
    click.echo(table(rows, ["id", "time (UTC)", "kind", "command", "env", "model", "ok", "summary"],
                     "rllllll" + "l"))


@ledger_group.command("show")
@click.argument("record_id", type=int)
@click.option("--ledger", "path", type=click.Path(dir_okay=False), help=LEDGER_HELP)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def show_cmd(record_id: int, path: str | None, as_json: bool) -> None:
    """One record: plan, environment and result."""
    from trainledger.ledger import Ledger

    with Ledger(path) as led:
        rec = led.get(record_id)
    if as_json:
        echo_json(rec.to_dict())
        return
    status = "ok" if rec.ok else "failed" if rec.ok is False else None  # an estimate has no pass/fail
    click.echo(f"record {rec.id}: {rec.kind} by `{rec.command}` at {rec.created_at}" + (f", {status}" if status else ""))
    env = rec.env
    click.echo(f"environment {rec.env_id}: GPU {env.get('gpu_name') or 'none'} x{env.get('gpu_count', 0)}, "
               f"driver {env.get('driver')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
               f"CPU {env.get('cpu_model')}")
    if rec.plan:
        click.echo("plan: " + ", ".join(f"{k}={v}" for k, v in rec.plan.items() if v is not None))
    if rec.damaged:
        click.echo(f"damaged row: {rec.damaged} (the fields that could be read are shown)")
    click.echo("summary: " + (_summary(rec.result) or "(see --json)"))


@ledger_group.command("export")
@click.option("--ledger", "path", type=click.Path(dir_okay=False), help=LEDGER_HELP)
@click.option("--format", "fmt", type=click.Choice(("jsonl", "json", "csv")), default="jsonl", show_default=True)
@click.option("--kind", type=click.Choice(("estimate", "measurement", "calibration")))
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="write here instead of stdout")
@click.option("--json", "as_json", is_flag=True, help="the same as --format json")
def export_cmd(path: str | None, fmt: str, kind: str | None, out_path: str | None, as_json: bool) -> None:
    """Every record, oldest first, as JSON lines, a JSON array or CSV."""
    from trainledger.ledger import Ledger

    fmt = "json" if as_json else fmt
    with Ledger(path) as led:
        text = led.export(fmt, kind=kind)
    if out_path:
        from trainledger.safety import write_atomic

        write_atomic(out_path, text, what="ledger export")
        click.echo(f"wrote {out_path}", err=True)
    else:
        click.echo(text, nl=False)


def _time_calibration_flags(func: Any) -> Any:
    from trainledger.cli.options import plan_options

    func = click.option("--at-seq-len", "at_seq_len", type=int, multiple=True,
                        help="sequence length of each measured run when they differ (two runs at "
                        "different lengths separate GEMM from attention)")(func)
    func = click.option("--log", "logs", multiple=True, type=click.Path(dir_okay=False),
                        help="measured run: trainer_state.json, torchtitan or Megatron log, verify "
                        "result JSON (repeatable)")(func)
    func = click.option("--measured-step-time", "measured", type=click.FloatRange(0, min_open=True),
                        multiple=True, help="measured seconds per optimizer step of the plan "
                        "given by the plan flags (repeatable)")(func)
    return plan_options(func)


@click.command("calibrate")
@click.option("--ledger", "path", type=click.Path(dir_okay=False), help=LEDGER_HELP)
@click.option("--env", "env_id", help="fit another environment of the ledger (default: this machine)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_time_calibration_flags
def calibrate_cmd(path: str | None, env_id: str | None, as_json: bool, measured: tuple[float, ...] = (),
                  logs: tuple[str, ...] = (), at_seq_len: tuple[int, ...] = (), **plan_kw: Any) -> None:
    """Fit allocator reserve, runtime overhead and achievable efficiency from stored measurements.

    With --measured-step-time or --log (and the plan flags of the measured run): fit the time
    model's per-term factors for that GPU, stack and precision (one run: one compute factor; two
    runs at different --at-seq-len: GEMM and attention apart). Estimates use the fit when asked
    (`estimate --calibrated`).
    """
    from trainledger.ledger import calibrate
    from trainledger.errors import LedgerError
    from trainledger.ledger import Ledger, fingerprint

    if measured or logs:
        from trainledger.cli.time_calibrate import run_time_calibration

        fitted = run_time_calibration(path, measured, logs, at_seq_len, plan_kw)
        if as_json:
            echo_json(fitted)
        else:
            click.echo(calibrate.render_time(fitted))
        return

    with Ledger(path) as led:
        if env_id:
            recs = led.list(env_id=env_id, limit=1)
            if not recs:
                raise LedgerError(f"no record of environment {env_id} in {led.path} (`trainledger ledger list`)")
            env = recs[0].env
            env["env_id"] = env_id
        else:
            env = fingerprint()
        try:
            fitted = calibrate.calibrate(led, env)
        except LedgerError as exc:
            if env_id:
                raise
            # imported logs are stored under the environment they ran on (`ledger import` says which):
            # name the environments that do have measurements, so --env is one copy away
            others = sorted({r.env_id for r in led.list(kind="measurement", limit=1000)} - {env["env_id"]})
            if not others:
                raise
            raise LedgerError(f"{exc}. This machine is environment {env['env_id']}; the ledger has measurements "
                              f"of {', '.join(others[:5])}: fit one with `trainledger calibrate --env "
                              f"{others[0]}`") from None
    if as_json:
        echo_json(fitted)
    else:
        click.echo(calibrate.render(fitted))


def ledger_flags(func: Any) -> Any:
    """--calibrated / --ledger / --no-ledger for the estimate command."""
    func = click.option("--no-ledger", is_flag=True, help="do not store this estimate in the ledger")(func)
    func = click.option("--ledger", "ledger_path", type=click.Path(dir_okay=False), help=LEDGER_HELP)(func)
    func = click.option("--calibrated", is_flag=True,
                        help="add this machine's calibration (`trainledger calibrate`) to the estimate")(func)
    return func


def estimate_ledger_hook(d: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Apply the calibration when asked and store the estimate; a ledger problem only warns."""
    from trainledger.ledger import calibrate
    from trainledger.errors import LedgerError

    calibrated = kwargs.pop("calibrated", False)
    path, off = kwargs.pop("ledger_path", None), kwargs.pop("no_ledger", False)
    try:
        return calibrate.finish_estimate(d, calibrated=calibrated, store=not off, ledger_path=path)
    except LedgerError as exc:
        click.echo(f"warning: {exc}", err=True)
        return calibrate.apply_terms(d, None, None)


def calibration_line(d: dict[str, Any]) -> str:
    """'calibration: ...' — whether the estimate is calibrated and from how many measurements."""
    from trainledger.units import fmt_bytes

    c = d.get("calibration") or {}
    if not c.get("calibrated"):
        return f"calibration: not calibrated ({c.get('reason', 'no calibration')})"
    mem = d.get("memory") or {}
    extra = ""
    if mem.get("calibrated_peak_allocated_bytes"):
        extra = f"; calibrated peak allocated {fmt_bytes(mem['calibrated_peak_allocated_bytes'])}"
    if mem.get("calibrated_peak_reserved_bytes"):
        extra += f", reserved {fmt_bytes(mem['calibrated_peak_reserved_bytes'])}"
    return (f"calibration: calibrated for environment {c['env_id']} from {c['n_measurements']} "
            f"measurement(s){extra}")


@ledger_group.command("import")
@click.argument("log_path", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(("auto", "hf-trainer-state", "wandb", "torchtitan", "megatron")),
              help="log format (auto: from the content)")
@click.option("--warmup", type=int, default=1, show_default=True, help="reported steps left out of averages")
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cuda", show_default=True,
              help="what the logged run ran on (calibration uses CUDA step times only)")
@click.option("--ledger", "path", type=click.Path(dir_okay=False), help=LEDGER_HELP)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@_plan_options
def import_cmd(log_path: str, fmt: str, warmup: int, device: str, path: str | None, as_json: bool,
               **kwargs: Any) -> None:
    """Store a training log (trainer_state.json, W&B export, torchtitan or Megatron log) as a
    measurement of its plan (give the plan as for `estimate`, e.g. --from the run's configs)."""
    from trainledger.ledger.importer import import_log
    from trainledger.units import fmt_bytes
    from trainledger.cli.options import inputs_from_options

    inputs = inputs_from_options(kwargs)
    rec = import_log(log_path, inputs, fmt=fmt, warmup=warmup, ledger_path=path, device=device)
    if as_json:
        echo_json(rec)
        return
    m, p = rec["measured"], rec["predicted"]
    click.echo(f"imported {rec['file']} ({rec['source']}) as record {rec['id']} of environment {rec['env_id']}")
    for key, label in (("peak_allocated_bytes", "peak allocated"), ("peak_reserved_bytes", "peak reserved"),
                       ("device_used_bytes", "device used")):
        if m.get(key):
            pred = f" (estimate {fmt_bytes(p['peak_allocated_bytes'])})" if key == "peak_allocated_bytes" else ""
            click.echo(f"  {label}: {fmt_bytes(m[key])}{pred}")
    if m.get("step_time_s"):
        click.echo(f"  step time: {m['step_time_s']:.4g} s (estimate {p['step_time_s']:.4g} s)")
    click.echo(f"fit it with: trainledger calibrate --env {rec['env_id']}")
