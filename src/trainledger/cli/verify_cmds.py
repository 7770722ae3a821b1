"""`trainledger verify probe|memory|comm|scaling|io|accept|soak`: check the plan on the real machine.

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

from trainledger.errors import MissingDependency, VerifyError
from trainledger.units import parse_bytes
from trainledger.cli.options import _FLAG_KEYS, inputs_from_options, plan_options
from trainledger.cli.output import echo_json, to_json

INSTALL = "pip install 'trainledger[verify]'"


def register(main: click.Group) -> None:
    main.add_command(verify_group)


@click.group("verify")
def verify_group() -> None:
    """Measure the plan on this machine: probe, memory, comm, scaling, io, accept, soak, serve.

    Under the user's torchrun (any --nnodes) or srun every command is one rank of that world and
    rank 0 reports; comm, scaling and accept start a multi-node run themselves with --nnodes N
    --rdzv-endpoint HOST:PORT on every node.
    """
    if importlib.util.find_spec("torch") is not None:
        from trainledger.verify.multinode import apply_slurm_env

        apply_slurm_env()  # srun tasks become torch.distributed ranks


def node_options(func):
    """--nnodes / --rdzv-endpoint / --rdzv-id: this command on every node, joined by torchrun's rendezvous."""
    func = click.option("--rdzv-id", help="rendezvous id, the same on every node [$SLURM_JOB_ID or trainledger]")(func)
    func = click.option("--rdzv-endpoint", help="HOST:PORT of node 0 for torchrun's c10d rendezvous")(func)
    func = click.option("--nnodes", type=int, default=1, show_default=True,
                        help="nodes of a multi-node run (run the same command on each)")(func)
    return func


def _launcher(nnodes: int, endpoint: str | None, rdzv_id: str | None) -> Any:
    if nnodes <= 1:
        return None
    if not endpoint:
        raise VerifyError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address, the same on every node)")
    from trainledger.verify.multinode import node_launcher

    return node_launcher(nnodes, endpoint, rdzv_id)


def _not_reporting(what: str) -> None:
    _progress(f"{what}: this node joined the run; node 0 (global rank 0) reports")


def _rank_zero_only(kwargs: dict[str, Any]) -> bool:
    """Under a launcher: True on ranks other than 0 (they only take part, or exit)."""
    from trainledger.verify.launch import in_torchrun

    return in_torchrun() and int(os.environ.get("RANK", "0")) != 0


def _progress(msg: str) -> None:
    click.echo(f"[trainledger] {msg}", err=True)


def _need_torch(device: str | None = None) -> None:
    if importlib.util.find_spec("torch") is None:
        raise MissingDependency(f"trainledger verify needs torch; install it with: {INSTALL}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise VerifyError("--device cuda: torch sees no CUDA GPU on this machine; use --device cpu")


def _on_this_gpu(inputs: Any, device: str) -> Any:
    """``--device cuda`` with no GPU named (flag or plan file): the plan is for the GPU torch runs
    on, so the comparison is with this machine (a plan for another GPU would compare the wrong
    step time and capacity); a GPU outside the catalog keeps the default and says so."""
    if device != "cuda" or "gpu" in inputs.model_fields_set:
        return inputs
    from trainledger.verify.probe import catalog_gpu_here

    here = catalog_gpu_here()
    if here is None:
        import torch

        _progress(f"{torch.cuda.get_device_name()} is not in the GPU catalog: planned as {inputs.gpu} "
                  "(--gpu NAME or --gpu FILE.yaml to plan it)")
        return inputs
    _progress(f"planned for this machine's GPU: {here} (--gpu to plan another)")
    return type(inputs).model_validate({**inputs.model_dump(exclude_unset=True), "gpu": here})


def ledger_options(func):
    func = click.option("--no-ledger", is_flag=True, help="do not store the result in the ledger")(func)
    func = click.option("--ledger", "ledger_path", type=click.Path(dir_okay=False),
                        help="ledger file [$TRAINLEDGER_LEDGER or ~/.local/share/trainledger/ledger.db]")(func)
    return func


def _record(kwargs: dict[str, Any], command: str, result: dict[str, Any], plan: Any = None,
            ok: bool | None = None) -> None:
    """Store the result; a ledger that cannot take it keeps it in a file (verify/results.py)."""
    from trainledger.verify import results

    path, off = kwargs.pop("ledger_path", None), kwargs.pop("no_ledger", False)
    results.record(command, json.loads(to_json(result)), ledger_path=path, off=off,
                   plan_summary=_plan_summary(plan), ok=ok, say=lambda m: click.echo(m, err=True))


def _plan_summary(plan: Any) -> dict[str, Any] | None:
    if plan is None:
        return None
    from trainledger.estimate import plan_summary

    return plan_summary(plan)


def _failures(kwargs: dict[str, Any], command: str, plan: Any = None):
    """Context: a run that raises is recorded as a failed measurement before the error shows."""
    from trainledger.verify import results

    return results.recording_failures(command, ledger_path=kwargs.get("ledger_path"),
                                      off=bool(kwargs.get("no_ledger")), plan_summary=_plan_summary(plan),
                                      say=lambda m: click.echo(m, err=True))


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
    from trainledger.load.plan import build_plan
    from trainledger.verify import probe
    from trainledger.verify.launch import in_torchrun

    compare = _has_plan_flags(kwargs)
    inputs = inputs_from_options(kwargs)  # also removes the plan flags from kwargs
    plan = build_plan(inputs) if compare else None
    if in_torchrun():  # one probe per node, gathered by global rank 0
        return _probe_nodes(plan, require_gpu, as_json, kwargs)
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


def _probe_nodes(plan: Any, require_gpu: bool, as_json: bool, kwargs: dict[str, Any]) -> None:
    from trainledger.verify import probe
    from trainledger.verify.multinode import gather_nodes

    nodes = gather_nodes(probe.probe)
    if nodes is None:
        return
    out, texts, ok = [], [], True
    for n in nodes:
        found = n["result"]
        if found is None:
            out.append({"host": n["host"], "error": n["error"]})
            texts.append(f"== {n['host']}: probe failed: {n['error']}")
            ok = False
            continue
        findings = probe.compare_with_plan(found, probe.plan_assumptions(plan)) if plan else None
        if require_gpu and not found["gpu"]["available"]:
            findings = (findings or []) + [{"level": "fail", "text": f"--require-gpu: {found['gpu']['reason']}"}]
        node_ok = not any(f["level"] == "fail" for f in findings or [])
        ok = ok and node_ok
        out.append({"host": n["host"], "rank": n["rank"], **found, "findings": findings, "ok": node_ok})
        texts.append(f"== {n['host']} (rank {n['rank']})\n" + probe.render(found, findings))
    result = {"nodes": out, "ok": ok}
    _record(kwargs, "verify probe", result, plan, ok)
    _finish(result, "\n".join(texts), as_json, ok)


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
    if _rank_zero_only(kwargs):  # one replica is measured: rank 0 of the launcher's world
        return
    from trainledger.estimate import estimate
    from trainledger.load.plan import build_plan
    from trainledger.verify.compare import compare_memory, compare_time, render_memory
    from trainledger.verify.measure import measure_memory

    plan = build_plan(_on_this_gpu(inputs_from_options(kwargs), device))
    if not plan.recipe.is_training and plan.serving.engine != "hf":  # what runs here is transformers
        _progress(f"inference: measuring transformers generate (engine hf); the {plan.serving.engine} "
                  f"accounting is in `trainledger estimate`")
        plan = plan.model_copy(update={"serving": plan.serving.model_copy(update={"engine": "hf"})})
    _progress(f"estimating, then measuring {steps} step(s) of {plan.model.name} on {device}")
    from trainledger.estimate.options import EstimateOptions, MemoryOptions

    est = estimate(plan, EstimateOptions(memory=MemoryOptions.for_run(device)))
    predicted = est.memory.to_dict()
    comp = est.compute.to_dict() if est.compute is not None else {}
    predicted["step_time_s"], predicted["mfu"] = comp.get("step_time_s"), comp.get("mfu")
    if device == "cpu":
        from trainledger.verify.preflight import available_host_bytes, check_host_ram

        check_host_ram(plan.model.name, predicted["peak_allocated_bytes"], available_host_bytes())
    with _failures(kwargs, "verify memory", plan):
        m = measure_memory(plan, device=device, steps=steps).to_dict()
    from trainledger.estimate import plan_summary

    result = {"plan": plan_summary(plan), "measured": m, "predicted": predicted,
              "comparison": compare_memory(m, predicted),
              "time": compare_time(m.get("step_time_s"), predicted["step_time_s"], device)}
    ok = not m.get("oom")
    peak_err = result["comparison"]["totals"][0]["relative_error"]
    if tolerance is not None and ok and peak_err is not None and abs(peak_err) > tolerance:
        ok = False
        result["tolerance_failure"] = f"peak error {100 * peak_err:+.1f}% exceeds ±{100 * tolerance:.1f}%"
    text_extra = ""
    if m.get("serving"):  # inference on a GPU: measured latency against the serving model
        from trainledger.estimate.serving import ServingPerf

        r = plan.recipe
        pred = ServingPerf(plan).static_batch(r.micro_batch, r.seq_len, max(r.generate_len, 1))
        result["serving"] = {"measured": m["serving"], "predicted": pred}
        ms = m["serving"]
        text_extra = (f"\nlatency: TTFT measured {1e3 * ms['ttft_s']:.1f} ms, predicted {1e3 * pred['ttft_s']:.1f} ms"
                      + (f"; TPOT measured {1e3 * ms['tpot_s']:.2f} ms, predicted {1e3 * pred['tpot_s']:.2f} ms"
                         if ms.get("tpot_s") else ""))
    result["ok"] = ok
    _record(kwargs, "verify memory", result, plan, ok)
    text = render_memory(result) + text_extra + (f"\nFAIL  {result['tolerance_failure']}" if "tolerance_failure" in result else "")
    _finish(result, text, as_json, ok)


# ------------------------------------------------------------------------------------------ serve
@verify_group.command("serve")
@plan_options
@click.option("--concurrency", type=int, default=None, help="client --max-concurrency [--micro-batch]")
@click.option("--num-prompts", type=int, default=None, help="requests sent [10 x concurrency]")
@click.option("--port", type=int, default=8765, show_default=True, help="port of the vLLM server")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True, help="seconds for start-up and for the client")
@click.option("--logs", "log_dir", type=click.Path(file_okay=False), help="folder for the server log and result")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def serve_cmd(concurrency: int | None, num_prompts: int | None, port: int, timeout_s: float, log_dir: str | None,
              as_json: bool, **kwargs: Any) -> None:
    """Serve the plan with vLLM on this GPU (dummy weights) and measure TTFT, TPOT and tokens/s with
    vLLM's benchmark client; compare with the serving model. Skips cleanly without vLLM or a GPU."""
    from trainledger.load.plan import build_plan
    from trainledger.verify.serve import run

    plan = build_plan(inputs_from_options(dict(kwargs, method="inference")))
    conc = concurrency or plan.recipe.micro_batch
    res = run(plan, conc, num_prompts or 10 * conc, port, timeout_s, log_dir)
    if "skipped" in res:
        kwargs.pop("ledger_path", None), kwargs.pop("no_ledger", None)
        _finish(res, f"skipped: {res['skipped']}", as_json, True)
        return
    _record(kwargs, "verify serve", res, plan, True)
    lines = [f"vLLM measured at concurrency {conc} (logs: {res['logs']})"]
    for row in res["comparison"]:
        m, p, e = row["measured"], row["predicted"], row["relative_error"]
        lines.append(f"  {row['name']:16} measured {m if m is not None else float('nan'):10.4g}  "
                     f"predicted {p if p is not None else float('nan'):10.4g}  "
                     f"{'' if e is None else f'{100 * e:+.1f}%'}")
    _finish(res, "\n".join(lines), as_json, True)


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
@node_options
@ledger_options
def comm_cmd(nproc: int, device: str, max_size: str | None, min_size: str, link: str | None, gpu: str | None,
             timeout_s: float, collective_timeout: float, as_json: bool, nnodes: int, rdzv_endpoint: str | None,
             rdzv_id: str | None, **kwargs: Any) -> None:
    """Correctness of all_reduce/all_gather/reduce_scatter/all_to_all, then algbw/busbw per size."""
    _need_torch(device)
    from trainledger.verify import comm
    from trainledger.verify.launch import in_torchrun

    max_size = max_size or ("1GiB" if device == "cuda" else "64MiB")
    top, bottom = parse_bytes(max_size), parse_bytes(min_size)
    if in_torchrun():  # started by the user's torchrun (multi-node): be one rank
        from trainledger.verify import comm_worker

        raw = comm_worker.run(device, top, bottom, collective_timeout)
        import torch.distributed as dist

        if dist.is_initialized():  # tear the group down before exit, or gloo's threads abort the process
            dist.destroy_process_group()
        if int(os.environ.get("RANK", "0")) != 0:
            return
    else:
        launcher = _launcher(nnodes, rdzv_endpoint, rdzv_id)
        _progress(f"launching torchrun: {nproc} {device} rank(s) × {nnodes} node(s), sizes {min_size}..{max_size}")
        with _failures(kwargs, "verify comm"):
            raw = comm.run_comm(nproc, device, top, timeout_s, collective_timeout, bottom, launcher=launcher)
        if raw is None:
            return _not_reporting("verify comm")
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
@node_options
@ledger_options
def scaling_cmd(device: str, nproc: int, steps: int, warmup: int, timeout_s: float, collective_timeout: float,
                as_json: bool, nnodes: int, rdzv_endpoint: str | None, rdzv_id: str | None, **kwargs: Any) -> None:
    """Step time at 1, 2, 4 ... N ranks under DP/FSDP and the scaling efficiency."""
    _need_torch(device)
    from trainledger.load.plan import build_plan
    from trainledger.verify import scaling

    from trainledger.verify.launch import in_torchrun
    from trainledger.verify import multinode

    inputs = _on_this_gpu(inputs_from_options(kwargs), device)
    plan = build_plan(inputs)
    with _failures(kwargs, "verify scaling", plan):
        if in_torchrun():  # the launcher's world: rank 0 alone (baseline), then all ranks; no nested launch
            raw = multinode.scaling_in_world(inputs.model_dump(mode="json"), device, steps, warmup,
                                             collective_timeout)
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()
            if raw is None:
                return
            result = scaling.finish({"plan": inputs.model_dump(mode="json"), "device": device, "runs": raw["runs"]})
        elif nnodes > 1:
            result = multinode.run_scaling_nodes(inputs, device, nproc, _launcher(nnodes, rdzv_endpoint, rdzv_id),
                                                 steps=steps, warmup=warmup, timeout_s=timeout_s,
                                                 collective_timeout_s=collective_timeout)
            if result is None:
                return _not_reporting("verify scaling")
        else:
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
    from trainledger.verify import io as vio
    from trainledger.verify.launch import in_torchrun

    plan = None
    if _has_plan_flags(kwargs) or tokens_per_s:
        from trainledger.estimate import estimate
        from trainledger.load.plan import build_plan

        plan = build_plan(inputs_from_options(kwargs))
    else:
        inputs_from_options(kwargs)
    def measure() -> dict[str, Any]:
        _progress(f"storage test at {path} ({size}, {budget:g} s per test)")
        st = vio.measure_storage(Path(path), parse_bytes(size), budget, threads, False if no_fio else None)
        _progress("host memory bandwidth")
        return {"storage": st, "memory": vio.memory_bandwidth()}

    need = vio.plan_need(plan, estimate(plan), tokens_per_s) if plan is not None else None
    if in_torchrun():  # one test per node (local rank 0), gathered by global rank 0
        from trainledger.verify.multinode import gather_nodes

        nodes = gather_nodes(measure)
        if nodes is None:
            return
        out, texts = [], []
        for n in nodes:
            if n["result"] is None:
                out.append({"host": n["host"], "error": n["error"], "ok": False})
                texts.append(f"== {n['host']}: {n['error']}")
                continue
            checks = vio.compare(n["result"]["storage"], need)
            r = {**n["result"], "need": need, "checks": checks, "ok": all(c["ok"] for c in checks)}
            out.append({"host": n["host"], "rank": n["rank"], **r})
            texts.append(f"== {n['host']} (rank {n['rank']})\n" + vio.render(r))
        result = {"nodes": out, "ok": all(o["ok"] for o in out)}
        _record(kwargs, "verify io", result, plan, result["ok"])
        return _finish(result, "\n".join(texts), as_json, result["ok"])
    got = measure()
    storage, mem = got["storage"], got["memory"]
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
@node_options
@ledger_options
def accept_cmd(device: str, nproc: int, steps_before: int, steps_after: int, out_path: str | None,
               workdir: str | None, timeout_s: float, collective_timeout: float, as_json: bool,
               nnodes: int, rdzv_endpoint: str | None, rdzv_id: str | None, **kwargs: Any) -> None:
    """The delivery acceptance run: train, checkpoint, restore in fresh processes, compare."""
    _need_torch(device)
    from trainledger.load.plan import build_plan
    from trainledger.verify import accept

    from trainledger.verify import multinode
    from trainledger.verify.launch import in_torchrun

    inputs = _on_this_gpu(inputs_from_options(kwargs), device)
    plan = build_plan(inputs)
    with _failures(kwargs, "verify accept", plan):
        if in_torchrun():  # the launcher's world: run and restore in these processes; rank 0 reports
            report = multinode.accept_in_world(inputs, device, steps_before, steps_after, collective_timeout,
                                               workdir)
            import torch.distributed as dist

            dist.destroy_process_group()
            if report is None:
                return
        elif nnodes > 1:
            if not workdir:
                raise VerifyError("verify accept --nnodes > 1 needs --workdir on a filesystem every node shares "
                                  "(the checkpoint is written by all ranks and read back)")
            _progress(f"acceptance run of {plan.model.name} on {nproc} {device} rank(s) × {nnodes} nodes")
            report = multinode.accept_nodes(inputs, device, nproc, steps_before, steps_after, timeout_s,
                                            collective_timeout, workdir, _launcher(nnodes, rdzv_endpoint, rdzv_id))
            if report is None:
                return _not_reporting("verify accept")
        else:
            _progress(f"acceptance run of {plan.model.name} on {nproc} {device} rank(s) (2 torchrun launches)")
            report = accept.run_accept(inputs, device, nproc, steps_before, steps_after, timeout_s,
                                       collective_timeout, workdir)
    if out_path:
        from trainledger.verify import results

        results.write_out(out_path, to_json(report), "verify accept", lambda m: click.echo(m, err=True))
    _record(kwargs, "verify accept", report, plan, report["ok"])
    _finish(report, accept.render(report), as_json, report["ok"])


# ------------------------------------------------------------------------------------------ soak
def _seconds(text: str) -> float:
    """'90', '90s', '10m', '2h' -> seconds."""
    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    try:
        return float(t[:-1]) * scale if scale else float(t)
    except ValueError:
        raise click.BadParameter(f"{text!r}: give seconds, or a number with s, m or h (e.g. 10m)") from None


@verify_group.command("soak")
@plan_options
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cpu", show_default=True)
@click.option("--nproc", type=int, default=2, show_default=True, help="ranks on this node")
@click.option("--duration", default="10m", show_default=True, help="training time from the first step: seconds or 90s, 10m, 24h")
@click.option("--checkpoint-interval", "checkpoint_interval", default="60s", show_default=True,
              help="time between checkpoints")
@click.option("--sample-interval", default="1s", show_default=True, help="time between telemetry samples")
@click.option("--kill-rank", type=int, help="fault injection: SIGKILL this rank once (needs --kill-after)")
@click.option("--kill-after", help="... after this much training (once a checkpoint exists), e.g. 20s")
@click.option("--max-restarts", type=int, default=1, show_default=True, help="torchrun elastic restarts allowed")
@click.option("--max-temperature", type=float, default=85.0, show_default=True, help="°C")
@click.option("--max-clock-drop", type=float, default=0.10, show_default=True, help="fraction below the early median")
@click.option("--max-step-time-drift", type=float, default=0.10, show_default=True,
              help="last-quarter over first-quarter median step time, minus 1")
@click.option("--max-recovery", "max_recovery", default="600s", show_default=True,
              help="kill to every rank training again [the goodput model's restart time]")
@click.option("--max-ecc-uncorrected", type=int, default=0, show_default=True)
@click.option("--max-xid-events", type=int, default=0, show_default=True)
@click.option("--max-link-errors", type=int, default=0, show_default=True, help="NVLink errors + PCIe replays")
@click.option("--fail-on-slowdown/--no-fail-on-slowdown", default=True, show_default=True,
              help="a thermal / power-brake / hardware slowdown throttle reason fails the soak")
@click.option("--telemetry-fixture", type=click.Path(dir_okay=False, exists=True),
              help="replay a recorded NVML fixture (python -m trainledger.verify.telemetry record) instead of sensors")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="write the result JSON here")
@click.option("--workdir", type=click.Path(file_okay=False), help="keep checkpoints and journals here (empty folder)")
@click.option("--timeout", "timeout_s", type=float, help="seconds for the whole launch [duration + 600 per attempt]")
@click.option("--collective-timeout", type=float, default=120.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@ledger_options
def soak_cmd(device: str, nproc: int, duration: str, checkpoint_interval: str, sample_interval: str,
             kill_rank: int | None, kill_after: str | None, max_restarts: int, max_temperature: float,
             max_clock_drop: float, max_step_time_drift: float, max_recovery: str, max_ecc_uncorrected: int,
             max_xid_events: int, max_link_errors: int, fail_on_slowdown: bool, telemetry_fixture: str | None,
             out_path: str | None, workdir: str | None, timeout_s: float | None, collective_timeout: float,
             as_json: bool, **kwargs: Any) -> None:
    """Train the plan's acceptance loop for a duration: per-rank telemetry, checkpoints with checksums,
    optional rank kill and measured recovery, thresholds and a verdict naming each one crossed."""
    _need_torch(device)
    from pydantic import ValidationError

    from trainledger.spec.base import spec_error
    from trainledger.load.plan import build_plan
    from trainledger.verify import soak
    from trainledger.verify.launch import in_torchrun

    if in_torchrun():
        raise VerifyError("verify soak starts its own torchrun (with elastic restarts); run it without torchrun, "
                          "once, on the node to soak")

    try:
        th = soak.SoakThresholds(max_temperature_c=max_temperature, max_clock_drop=max_clock_drop,
                                 max_step_time_drift=max_step_time_drift, max_recovery_s=_seconds(max_recovery),
                                 max_ecc_uncorrected=max_ecc_uncorrected, max_xid_events=max_xid_events,
                                 max_link_errors=max_link_errors, fail_on_slowdown=fail_on_slowdown)
    except ValidationError as exc:
        raise spec_error(exc, "soak thresholds") from None
    inputs = _on_this_gpu(inputs_from_options(kwargs), device)
    plan = build_plan(inputs)
    dur = _seconds(duration)
    _progress(f"soak of {plan.model.name} on {nproc} {device} rank(s) for {dur:g} s under torchrun "
              f"(max {max_restarts} restart(s))" + (f", killing rank {kill_rank}" if kill_rank is not None else ""))
    result = soak.run_soak(inputs, device, nproc, dur, _seconds(checkpoint_interval), _seconds(sample_interval),
                           kill_rank, _seconds(kill_after) if kill_after else None, max_restarts, th, timeout_s,
                           collective_timeout, workdir, telemetry_fixture)
    if out_path:
        tmp = Path(out_path + ".tmp")
        tmp.write_text(to_json(result))
        os.replace(tmp, out_path)
        _progress(f"result written to {out_path}")
    _record(kwargs, "verify soak", result, plan, result["ok"])
    _finish(result, soak.render(result), as_json, result["ok"])


__all__ = ["register", "verify_group", "VerifyError"]
