"""Clusters: the verify commands under the user's torchrun (any ``--nnodes``) or Slurm's ``srun``,
and a ``--launch`` that starts a multi-node run through torchrun's rendezvous.

* **Slurm**: under ``srun`` (one task per GPU) every task has ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
  ``SLURM_LOCALID`` and ``SLURM_STEP_NODELIST``; :func:`apply_slurm_env` turns them into the
  ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` torch.distributed reads
  (the first host of the node list is the master; the port is ``$MASTER_PORT`` or derived from
  ``SLURM_JOB_ID``), so every command then behaves as under torchrun.
* **Inside a launcher** (torchrun or srun) a command is one rank of the launcher's world: nothing is
  launched again; rank 0 gathers every rank's result and prints/stores it.
* **--launch on several nodes**: run the same command on every node with ``--nnodes N
  --rdzv-endpoint HOST:PORT``; :func:`torchrun_nodes` starts ``torchrun --nnodes N --rdzv-backend
  c10d`` (torch.distributed.run's rendezvous) and node 0 reports.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from trainledger.errors import VerifyError

#: the variables srun sets for each task of a job step
#: (https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES); SLURM_STEP_NUM_TASKS
#: is what tells an srun task from the batch script itself (which has SLURM_NTASKS of the whole
#: allocation but is one process)
SLURM_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID")
DEFAULT_PORT = 29500


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[003-005,007],cpu1`` -> ``gpu003``."""
    nodelist = nodelist.strip()
    m = re.match(r"^([^\[,]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        raise VerifyError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read the first host")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_env(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """torch.distributed variables for this srun task, or None outside a multi-task Slurm step."""
    env = os.environ if environ is None else environ
    if any(v not in env for v in SLURM_VARS) or int(env.get("SLURM_STEP_NUM_TASKS", "1")) < 2:
        return None
    ntasks = int(env["SLURM_STEP_NUM_TASKS"])
    nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE") or ""
    local_world = per_node.split("(")[0].split(",")[0] or str(max(1, ntasks // nnodes))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    port = env.get("MASTER_PORT") or str(DEFAULT_PORT + int(env.get("SLURM_JOB_ID", "0") or 0) % 1000)
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(ntasks), "LOCAL_RANK": env["SLURM_LOCALID"],
            "LOCAL_WORLD_SIZE": local_world, "GROUP_RANK": env.get("SLURM_NODEID", "0"),
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodelist),
            "MASTER_PORT": port}


def apply_slurm_env() -> bool:
    """Under srun (and not already under torchrun): export the torch.distributed variables."""
    from trainledger.verify.launch import in_torchrun

    if in_torchrun():
        return False
    env = slurm_env()
    if env is None:
        return False
    os.environ.update(env)
    return True


def in_launcher() -> bool:
    from trainledger.verify.launch import in_torchrun

    return in_torchrun() or slurm_env() is not None


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


# ----------------------------------------------------------------------------- multi-node launch
def torchrun_nodes(module: str, args: list[str], nproc: int, timeout_s: float, env: dict[str, str] | None = None,
                   *, nnodes: int, endpoint: str, rdzv_id: str) -> Any:
    """This node's part of an ``nnodes``-node run: torchrun with the c10d rendezvous at ``endpoint``."""
    from trainledger.verify.launch import STATUS_ENV, LaunchResult, read_rank_status, run_bounded

    if nnodes < 1 or nproc < 1:
        raise VerifyError(f"--nnodes and --nproc must be at least 1 (got {nnodes}, {nproc})")
    if ":" not in endpoint:
        endpoint = f"{endpoint}:{DEFAULT_PORT}"
    status_dir = tempfile.mkdtemp(prefix="trainledger-ranks-")
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env[STATUS_ENV] = status_dir
    full_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
           "--max-restarts", "0", "--monitor-interval", "0.2", "-m", module, *args]
    try:
        rc, timed_out, tail, elapsed = run_bounded(cmd, timeout_s, env=full_env)
        status = read_rank_status(status_dir)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    return LaunchResult(rc, elapsed, timed_out, tail, status)


def node_launcher(nnodes: int, endpoint: str, rdzv_id: str | None = None) -> Any:
    """A ``torchrun``-compatible launcher for ``nnodes`` nodes; each launch gets its own rendezvous
    (id and port + k), so two launches in a row (accept: run, restore) never meet a stale store."""
    host, _, port = endpoint.partition(":")
    base = int(port or DEFAULT_PORT)
    rid = rdzv_id or os.environ.get("SLURM_JOB_ID") or "trainledger"
    count = {"k": 0}

    def launch(module: str, args: list[str], nproc: int, timeout_s: float, env: dict[str, str] | None = None):
        k = count["k"]
        count["k"] += 1
        return torchrun_nodes(module, args, nproc, timeout_s, env, nnodes=nnodes, endpoint=f"{host}:{base + k}",
                              rdzv_id=f"{rid}-{k}")

    return launch


# ----------------------------------------------------------------------------- scaling in one world
def scaling_in_world(inputs: dict[str, Any], device: str, steps: int, warmup: int,
                     collective_timeout_s: float) -> dict[str, Any] | None:
    """``verify scaling`` inside a launcher's world of W ranks: rank 0 times the plan alone (the
    baseline, the others wait), then all W ranks train together. Rank 0 returns both rows."""
    import socket

    import torch.distributed as dist

    from trainledger.verify._scaling_worker import scaling_row, timed_steps
    from trainledger.verify._trainloop import DistTrainer
    from trainledger.verify.launch import RankStatus, init_distributed

    rank, world, dev = init_distributed(device, collective_timeout_s)
    status = RankStatus(rank)
    rows = []
    try:
        status.enter("baseline (rank 0 alone)")
        if rank == 0:
            solo = DistTrainer(inputs, device, 0, 1)
            times, tokens = timed_steps(solo, dev, status, warmup, steps, sync_world=False)
            rows.append(scaling_row(1, times, tokens, False, None))
            del solo
        dist.barrier()
        status.enter("load")
        tr = DistTrainer(inputs, device, rank, world)
        times, tokens = timed_steps(tr, dev, status, warmup, steps)
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        rows.append({**scaling_row(world, times, tokens, tr.sharded, dist.get_backend()), "nodes": len(set(hosts)),
                     "ranks_per_host": {h: hosts.count(h) for h in sorted(set(hosts))}})
        status.done()
    except BaseException as exc:
        status.error(exc)
        raise
    return {"runs": rows} if rank == 0 else None


def _scaling_worker_main(argv: list[str] | None = None) -> int:
    import json
    from pathlib import Path

    import torch.distributed as dist

    from trainledger.verify._scaling_worker import worker_args

    a = worker_args("trainledger.verify.multinode", argv)
    res = scaling_in_world(json.loads(Path(a.inputs).read_text()), a.device, a.steps, a.warmup, a.timeout)
    if res is not None:
        Path(a.out + ".tmp").write_text(json.dumps(res))
        os.replace(a.out + ".tmp", a.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_scaling_nodes(inputs: Any, device: str, nproc: int, launcher: Any, steps: int = 5, warmup: int = 2,
                      timeout_s: float = 1800.0, collective_timeout_s: float = 120.0) -> dict[str, Any] | None:
    """``verify scaling --nnodes N``: one launch over all nodes; node 0 returns the result."""
    import json
    from pathlib import Path

    from trainledger.verify.scaling import finish

    with tempfile.TemporaryDirectory(prefix="trainledger-scaling-") as tmp:
        ip = Path(tmp) / "plan_inputs.json"
        ip.write_text(json.dumps(inputs.model_dump(mode="json")))
        out = Path(tmp) / "world.json"
        args = ["--inputs", str(ip), "--device", device, "--steps", str(steps), "--warmup", str(warmup),
                "--timeout", str(collective_timeout_s), "--out", str(out)]
        res = launcher("trainledger.verify.multinode", args, nproc, timeout_s)
        if not res.ok:
            raise VerifyError(res.failure("verify scaling over the nodes"))
        if not out.exists():
            return None  # not the node of global rank 0: node 0 reports
        raw = json.loads(out.read_text())
    return finish({"plan": inputs.model_dump(mode="json"), "device": device, "runs": raw["runs"]})


# ----------------------------------------------------------------------------- accept in one world
def accept_in_world(inputs: Any, device: str, steps_before: int, steps_after: int, collective_timeout_s: float,
                    workdir: str | None) -> dict[str, Any] | None:
    """``verify accept`` inside a launcher's world: the run and the restore in the same processes
    (the restore loads the checkpoint into a new model and optimizer). Rank 0 returns the report."""
    import argparse
    import json
    from pathlib import Path

    import torch.distributed as dist

    from trainledger.verify import _accept_worker
    from trainledger.verify.accept import ACCUM_RTOL, _finish
    from trainledger.load.plan import build_plan

    plan = build_plan(inputs)
    work = Path(workdir or os.environ.get("TRAINLEDGER_ACCEPT_DIR") or tempfile.gettempdir()) / \
        f"trainledger-accept-{os.environ.get('TORCHELASTIC_RUN_ID') or os.environ.get('SLURM_JOB_ID') or 'run'}"
    work.mkdir(parents=True, exist_ok=True)
    ip = work / "plan_inputs.json"
    if global_rank() == 0:
        ip.write_text(json.dumps(inputs.model_dump(mode="json")))

    def ns(mode: str) -> argparse.Namespace:
        return argparse.Namespace(mode=mode, inputs=str(ip), device=device, ckpt=str(work / "checkpoint"),
                                  steps_before=steps_before, steps_after=steps_after,
                                  accum_rtol=ACCUM_RTOL.get(plan.recipe.precision, 5e-2), seed=0,
                                  timeout=collective_timeout_s, out="")

    from trainledger.verify.launch import init_distributed

    init_distributed(device, collective_timeout_s)
    dist.barrier()  # the inputs file exists before any rank reads it
    first = _accept_worker.run(ns("run"))
    dist.barrier()
    second = _accept_worker.run(ns("restore"))
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    report: dict[str, Any] = {"plan": inputs.model_dump(mode="json"), "device": device,
                              "nproc": dist.get_world_size(), "steps_before": steps_before,
                              "steps_after": steps_after, "run": first, "restore": second,
                              "note": "under a launcher the restore runs in the same processes (new model "
                                      "and optimizer loaded from the checkpoint)"}
    return _finish(report, plan, first, second)


if __name__ == "__main__":
    raise SystemExit(_scaling_worker_main())


def accept_nodes(inputs: Any, device: str, nproc: int, steps_before: int, steps_after: int, timeout_s: float,
                 collective_timeout_s: float, workdir: str, launcher: Any) -> dict[str, Any] | None:
    """``verify accept --nnodes N`` on one node: join both launches (run, then restore in fresh
    processes) with the checkpoint in ``workdir`` (shared by every node). Global rank 0 of each
    launch writes its result there (the rendezvous may put it on another node each time); the
    node that claims ``report.claim`` first returns the report, the others None."""
    import json
    from pathlib import Path

    from trainledger.verify.accept import ACCUM_RTOL, _failure_text, _finish, _launch
    from trainledger.load.plan import build_plan

    plan = build_plan(inputs)
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    ip = work / f"plan_inputs.{os.getpid()}.json"
    ip.write_text(json.dumps(inputs.model_dump(mode="json")))
    claim = work / "report.claim"
    for stale in ("run.json", "restore.json", claim.name):  # before the first rendezvous: no one wrote yet
        (work / stale).unlink(missing_ok=True)
    o = {"device": device, "nproc": nproc, "steps_before": steps_before, "steps_after": steps_after,
         "accum_rtol": ACCUM_RTOL.get(plan.recipe.precision, 5e-2), "collective_timeout_s": collective_timeout_s,
         "timeout_s": timeout_s, "env": None, "launcher": launcher}
    for mode in ("run", "restore"):
        _, res = _launch(mode, ip, work / "checkpoint", work / f"{mode}.json", o)
        if not res.ok:
            raise VerifyError(_failure_text(res, f"the acceptance {mode} over the nodes"))
    ip.unlink(missing_ok=True)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    outs = {m: json.loads((work / f"{m}.json").read_text()) for m in ("run", "restore")}
    report: dict[str, Any] = {"plan": inputs.model_dump(mode="json"), "device": device, "nproc": nproc,
                              "steps_before": steps_before, "steps_after": steps_after,
                              "run": outs["run"], "restore": outs["restore"]}
    return _finish(report, plan, outs["run"], outs["restore"])


def gather_nodes(fn: Any, collective_timeout_s: float = 600.0) -> list[dict[str, Any]] | None:
    """Under a launcher: ``fn()`` on local rank 0 of every node, gathered to global rank 0 (gloo).

    Returns ``[{"host", "rank", "result"}, ...]`` (one per node) on global rank 0, None elsewhere."""
    import socket

    import torch.distributed as dist

    from trainledger.verify.launch import init_distributed

    rank, world, _ = init_distributed("cpu", collective_timeout_s)
    mine = None
    error = None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            mine = fn()
        except Exception as exc:  # noqa: BLE001 - reported by rank 0 for this node
            error = f"{type(exc).__name__}: {exc}"
    out: list[Any] = [None] * world
    dist.all_gather_object(out, {"host": socket.gethostname(), "rank": rank, "result": mine, "error": error})
    dist.destroy_process_group()
    if rank != 0:
        return None
    return [o for o in out if o["result"] is not None or o["error"] is not None]
