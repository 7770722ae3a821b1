"""`trainledger verify probe|memory|comm|scaling|io|accept`: check the plan on the real machine.

Thin: parse flags, call trainledger.verify, render, store the result in the ledger. Progress goes
to stderr; ``--json`` prints the result; the exit code is 1 when a check fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import MissingDependency, VerifyError
from ..units import parse_bytes
from .options import _FLAG_KEYS, inputs_from_options, plan_options
from .output import echo_json, to_json

INSTALL = "pip install 'trainledger[verify]'"


def register(main: click.Group) -> None:
    main.add_command(verify_group)


@click.group("verify")
def verify_group() -> None:
    """Measure the plan on this machine: probe, memory, comm, scaling, io, accept."""


def _progress(msg: str) -> None:
    click.echo(f"[trainledger] {msg}", err=True)


def _need_torch(device: str | None = None) -> None:
    if importlib.util.find_spec("torch") is None:
        raise MissingDependency(f"trainledger verify needs torch; install it with: {INSTALL}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise VerifyError("--device cuda: torch sees no CUDA GPU on this machine; use --device cpu")


def ledger_options(func):
    func = click.option("--no-ledger", is_flag=True, help="do not store the result in the ledger")(func)
    func = click.option("--ledger", "ledger_path", type=click.Path(dir_okay=False),
                        help="ledger file [$TRAINLEDGER_LEDGER or ~/.local/share/trainledger/ledger.db]")(func)
    return func


def _record(kwargs: dict[str, Any], command: str, result: dict[str, Any], plan: Any = None,
            ok: bool | None = None) -> None:
    path, off = kwargs.pop("ledger_path", None), kwargs.pop("no_ledger", False)
    if off:
        return
    from ..estimate import plan_summary
    from ..ledger import Ledger

    with Ledger(path) as led:
        rid = led.add("measurement", command, json.loads(to_json(result)),
                      plan=plan_summary(plan) if plan is not None else None, ok=ok)
    _progress(f"stored as record {rid} in {led.path}")


def _finish(result: dict[str, Any], text: str, as_json: bool, ok: bool) -> None:
    if as_json:
        echo_json(result)
    else:
        click.echo(text)
    if not ok:
        sys.exit(1)


def _has_plan_flags(kwargs: dict[str, Any]) -> bool:
    return any(kwargs.get(k) is not None for k in _FLAG_KEYS + ("plan_file",))


# ------------------------------------------------------------------------------------------ probe
@verify_group.command("probe")
@plan_options
@click.option("--require-gpu", is_flag=True, help="fail when no NVIDIA GPU is found")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def probe_cmd(require_gpu: bool, as_json: bool, **kwargs: Any) -> None:
    """GPUs, topology, NUMA, CPU and RAM — compared with the plan's cluster when plan flags are given."""
    from ..planfile import build_plan
    from ..verify import probe

    compare = _has_plan_flags(kwargs)
    inputs = inputs_from_options(kwargs)  # also removes the plan flags from kwargs
    plan = build_plan(inputs) if compare else None
    _progress("probing host and GPUs (NVML)")
    found = probe.probe()
    findings = probe.compare_with_plan(found, probe.plan_assumptions(plan)) if plan else None
    ok = not any(f["level"] == "fail" for f in findings or [])
    if require_gpu and not found["gpu"]["available"]:
        ok = False
        findings = (findings or []) + [{"level": "fail", "text": f"--require-gpu: {found['gpu']['reason']}"}]
    result = {**found, "findings": findings, "ok": ok}
    _record(kwargs, "verify probe", result, plan, ok)
    _finish(result, probe.render(found, findings), as_json, ok)


# ------------------------------------------------------------------------------------------ memory
@verify_group.command("memory")
@plan_options
@click.option("--device", type=click.Choice(("cuda", "cpu", "fake")), default="cpu", show_default=True)
@click.option("--steps", type=int, default=2, show_default=True, help="training steps (the last is measured)")
@click.option("--tolerance", type=float, help="fail when |predicted - measured| / measured of the peak exceeds this")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def memory_cmd(device: str, steps: int, tolerance: float | None, as_json: bool, **kwargs: Any) -> None:
    """Run real training steps of the plan and compare peak memory with the estimate, term by term."""
    _need_torch(device)
    from ..estimate import estimate
    from ..planfile import build_plan
    from ..verify.compare import compare_memory, compare_time, render_memory
    from ..verify.measure import measure_memory

    plan = build_plan(inputs_from_options(kwargs))
    _progress(f"estimating, then measuring {steps} step(s) of {plan.model.name} on {device}")
    est = estimate(plan)
    predicted = est.memory.to_dict()
    comp = est.compute.to_dict() if est.compute is not None else {}
    predicted["step_time_s"], predicted["mfu"] = comp.get("step_time_s"), comp.get("mfu")
    if device == "cpu":
        from ..verify.preflight import available_host_bytes, check_host_ram

        check_host_ram(plan.model.name, predicted["peak_allocated_bytes"], available_host_bytes())
    m = measure_memory(plan, device=device, steps=steps).to_dict()
    from ..estimate import plan_summary

    result = {"plan": plan_summary(plan), "measured": m, "predicted": predicted,
              "comparison": compare_memory(m, predicted),
              "time": compare_time(m.get("step_time_s"), predicted["step_time_s"], device)}
    ok = not m.get("oom")
    peak_err = result["comparison"]["totals"][0]["relative_error"]
    if tolerance is not None and ok and peak_err is not None and abs(peak_err) > tolerance:
        ok = False
        result["tolerance_failure"] = f"peak error {100 * peak_err:+.1f}% exceeds ±{100 * tolerance:.1f}%"
    result["ok"] = ok
    _record(kwargs, "verify memory", result, plan, ok)
    text = render_memory(result) + (f"\nFAIL  {result['tolerance_failure']}" if "tolerance_failure" in result else "")
    _finish(result, text, as_json, ok)


# ------------------------------------------------------------------------------------------ comm
@verify_group.command("comm")
@click.option("--nproc", type=int, default=2, show_default=True, help="ranks on this node")
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cpu", show_default=True)
@click.option("--max-size", help="largest message [1GiB on cuda, 64MiB on cpu]")
@click.option("--min-size", default="1KiB", show_default=True)
@click.option("--link", help="catalog network to judge busbw against, e.g. nvlink4")
@click.option("--gpu", help="catalog GPU whose link (or HBM, on one rank) judges the result")
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True, help="seconds for the whole run")
@click.option("--collective-timeout", type=float, default=120.0, show_default=True, help="seconds per collective")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def comm_cmd(nproc: int, device: str, max_size: str | None, min_size: str, link: str | None, gpu: str | None,
             timeout_s: float, collective_timeout: float, as_json: bool, **kwargs: Any) -> None:
    """Correctness of all_reduce/all_gather/reduce_scatter/all_to_all, then algbw/busbw per size."""
    _need_torch(device)
    from ..verify import comm
    from ..verify.launch import in_torchrun

    max_size = max_size or ("1GiB" if device == "cuda" else "64MiB")
    top, bottom = parse_bytes(max_size), parse_bytes(min_size)
    if in_torchrun():  # started by the user's torchrun (multi-node): be one rank
        from ..verify import _comm_worker

        raw = _comm_worker.run(device, top, bottom, collective_timeout)
        import torch.distributed as dist

        if dist.is_initialized():  # tear the group down before exit, or gloo's threads abort the process
            dist.destroy_process_group()
        if int(os.environ.get("RANK", "0")) != 0:
            return
    else:
        _progress(f"launching torchrun: {nproc} {device} rank(s), sizes {min_size}..{max_size}")
        raw = comm.run_comm(nproc, device, top, timeout_s, collective_timeout, bottom)
    result = comm.finish(raw, comm.reference_link(device, raw["world_size"], link, gpu))
    _record(kwargs, "verify comm", result, None, result["ok"])
    _finish(result, comm.render(result), as_json, result["ok"])


# ------------------------------------------------------------------------------------------ scaling
@verify_group.command("scaling")
@plan_options
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cpu", show_default=True)
@click.option("--nproc", type=int, default=2, show_default=True, help="largest number of ranks")
@click.option("--steps", type=click.IntRange(1), default=10, show_default=True,
              help="timed steps per world size (a verdict needs at least 10)")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True,
              help="untimed warm-up steps before timing")
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True)
@click.option("--collective-timeout", type=float, default=120.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def scaling_cmd(device: str, nproc: int, steps: int, warmup: int, timeout_s: float, collective_timeout: float,
                as_json: bool, **kwargs: Any) -> None:
    """Step time at 1, 2, 4 ... N ranks under DP/FSDP and the scaling efficiency."""
    _need_torch(device)
    from ..planfile import build_plan
    from ..verify import scaling

    inputs = inputs_from_options(kwargs)
    plan = build_plan(inputs)
    result = scaling.run_scaling(inputs, device, nproc, steps=steps, warmup=warmup, timeout_s=timeout_s,
                                 collective_timeout_s=collective_timeout, progress=_progress)
    _record(kwargs, "verify scaling", result, plan, result["ok"])
    _finish(result, scaling.render(result), as_json, result["ok"])


# ------------------------------------------------------------------------------------------ io
@verify_group.command("io")
@click.option("--path", "path", type=click.Path(file_okay=False), default=".", show_default=True,
              help="folder the dataset lives in")
@plan_options
@click.option("--size", default="256MiB", show_default=True, help="test file size")
@click.option("--budget", type=float, default=5.0, show_default=True, help="seconds per test")
@click.option("--threads", type=int, default=16, show_default=True, help="built-in reader queue depth")
@click.option("--tokens-per-s", type=float, help="training throughput to feed (default: from the estimate)")
@click.option("--no-fio", is_flag=True, help="use the built-in reader even when fio is installed")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def io_cmd(path: str, size: str, budget: float, threads: int, tokens_per_s: float | None, no_fio: bool,
           as_json: bool, **kwargs: Any) -> None:
    """Storage IOPS and read throughput at --path, host memory bandwidth, vs the plan's loading need."""
    from ..verify import io as vio

    plan = None
    if _has_plan_flags(kwargs) or tokens_per_s:
        from ..estimate import estimate
        from ..planfile import build_plan

        plan = build_plan(inputs_from_options(kwargs))
    else:
        inputs_from_options(kwargs)
    _progress(f"storage test at {path} ({size}, {budget:g} s per test)")
    storage = vio.measure_storage(Path(path), parse_bytes(size), budget, threads, False if no_fio else None)
    _progress("host memory bandwidth")
    mem = vio.memory_bandwidth()
    need = vio.plan_need(plan, estimate(plan), tokens_per_s) if plan is not None else None
    checks = vio.compare(storage, need)
    ok = all(c["ok"] for c in checks)
    result = {"storage": storage, "memory": mem, "need": need, "checks": checks, "ok": ok}
    _record(kwargs, "verify io", result, plan, ok)
    _finish(result, vio.render(result), as_json, ok)


# ------------------------------------------------------------------------------------------ accept
@verify_group.command("accept")
@plan_options
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cpu", show_default=True)
@click.option("--nproc", type=int, default=2, show_default=True, help="ranks on this node")
@click.option("--steps-before", type=int, default=2, show_default=True, help="steps before the checkpoint")
@click.option("--steps-after", type=int, default=2, show_default=True, help="steps after it (both runs)")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="write the report JSON here")
@click.option("--workdir", type=click.Path(file_okay=False), help="keep the checkpoint here (default: temporary)")
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True, help="seconds per launch")
@click.option("--collective-timeout", type=float, default=120.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def accept_cmd(device: str, nproc: int, steps_before: int, steps_after: int, out_path: str | None,
               workdir: str | None, timeout_s: float, collective_timeout: float, as_json: bool,
               **kwargs: Any) -> None:
    """The delivery acceptance run: train, checkpoint, restore in fresh processes, compare."""
    _need_torch(device)
    from ..planfile import build_plan
    from ..verify import accept

    inputs = inputs_from_options(kwargs)
    plan = build_plan(inputs)
    _progress(f"acceptance run of {plan.model.name} on {nproc} {device} rank(s) (2 torchrun launches)")
    report = accept.run_accept(inputs, device, nproc, steps_before, steps_after, timeout_s,
                               collective_timeout, workdir)
    if out_path:
        tmp = Path(out_path + ".tmp")
        tmp.write_text(to_json(report))
        os.replace(tmp, out_path)
        _progress(f"report written to {out_path}")
    _record(kwargs, "verify accept", report, plan, report["ok"])
    _finish(report, accept.render(report), as_json, report["ok"])


__all__ = ["register", "verify_group", "VerifyError"]
