"""Worker of ``verify soak``, one process per rank under torchrun with elastic restarts.

Trains the plan's acceptance loop (:class:`~trainledger.verify._trainloop.DistTrainer`) for
``--duration`` seconds from the first attempt's first step (restarts included), writing one sample every ``--sample-interval`` seconds (median
and max step time of the steps since the last sample, loss, device telemetry) and a full checkpoint
every ``--checkpoint-interval`` seconds (the ``verify accept`` atomic save: temporary folder, sha256
manifest, one rename); rank 0's clock decides both for every rank. Before each save every rank's parameter checksum is gathered and
written next to the checkpoints (``checksums/step-N.json``).

When torchrun restarts the group (``TORCHELASTIC_RESTART_COUNT`` > 0) the worker verifies the
manifest, loads the last checkpoint and compares each rank's restored checksum with the one it
had when the checkpoint was written. ``--fault kill:RANK:SECONDS`` SIGKILLs that rank at the first
step boundary past SECONDS of training, in the first attempt only, once a checkpoint exists
and a step has run since (so the restart has work to redo). Every rank appends its samples and events (start, restore, checkpoint,
fault) to JSON-lines files in ``--workdir``, which outlive the restarts; the launcher reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trainledger.verify._accept_worker import MANIFEST, save_atomic, verify_manifest
from trainledger.errors import VerifyError
from trainledger.verify.launch import error_line


class Journal:
    """This rank's append-only series and event files (one JSON object per line, flushed)."""

    def __init__(self, work: Path, rank: int) -> None:
        (work / "series").mkdir(parents=True, exist_ok=True)
        (work / "events").mkdir(parents=True, exist_ok=True)
        self.series = open(work / "series" / f"rank{rank}.jsonl", "a", encoding="utf-8")
        self.events = open(work / "events" / f"rank{rank}.jsonl", "a", encoding="utf-8")
        self.rank = rank

    @staticmethod
    def _write(f: Any, obj: dict[str, Any]) -> None:
        f.write(json.dumps(obj) + "\n")
        f.flush()  # in the OS's hands: a SIGKILL loses nothing

    def sample(self, **obj: Any) -> None:
        self._write(self.series, {"rank": self.rank, **obj})

    def event(self, name: str, **obj: Any) -> None:
        self._write(self.events, {"rank": self.rank, "event": name, "t": time.time(), **obj})


def _fault(spec: str | None) -> tuple[int, float] | None:
    """``kill:RANK:SECONDS`` -> (rank, seconds after the launch); the launcher validated it."""
    if not spec:
        return None
    kind, rank, after = spec.split(":")
    assert kind == "kill", spec
    return int(rank), float(after)


def _restore(tr: Any, ckpt: Path, work: Path, rank: int, j: Journal) -> int:
    """Load the last checkpoint; journal whether this rank's checksum equals the one saved. Returns its step."""
    t0 = time.perf_counter()
    want = verify_manifest(ckpt)
    step = int(json.loads((ckpt / MANIFEST).read_text())["step"])
    tr.load(str(ckpt))
    saved = json.loads((work / "checksums" / f"step-{step}.json").read_text())["checksums"]
    got = tr.checksum()
    j.event("restore", step=step, files=len(want), seconds=time.perf_counter() - t0,
            checksum=got, saved_checksum=saved[rank], match=got == saved[rank])
    return step


def _training_start(work: Path, rank: int) -> float:
    """Epoch seconds the soak's training began: rank 0's clock at the first attempt's first step,
    kept in ``clock.json`` so that restarted attempts share the same deadline."""
    import torch
    import torch.distributed as dist

    t = torch.zeros(1, dtype=torch.float64)
    if rank == 0:
        f = work / "clock.json"
        if not f.exists():
            f.write_text(json.dumps({"t_start": time.time()}))
        t[0] = json.loads(f.read_text())["t_start"]
    dist.broadcast(t, 0)
    return float(t.item())


def _checkpoint(tr: Any, ckpt: Path, work: Path, step: int, rank: int, world: int, j: Journal) -> None:
    import torch.distributed as dist

    sums: list[Any] = [None] * world
    dist.all_gather_object(sums, tr.checksum())
    if rank == 0:
        (work / "checksums").mkdir(exist_ok=True)
        tmp = work / "checksums" / f"step-{step}.json.tmp"
        tmp.write_text(json.dumps({"step": step, "checksums": sums}))
        os.replace(tmp, work / "checksums" / f"step-{step}.json")
    info = save_atomic(tr, ckpt, step, rank)
    j.event("checkpoint", step=step, seconds=info["seconds"], checksums=sums, bytes=info.get("bytes"))


def init_attempt(device: str, timeout_s: float, attempt: int) -> tuple[int, int]:
    """Join this attempt's process group through a store prefix of its own.

    torchrun's static rendezvous keeps one TCPStore across elastic restarts, and the default
    env:// init does not prefix keys per attempt (torch/distributed/rendezvous.py: "We create a new
    TCPStore for every retry"), so a restarted gloo rank can read a dead peer's address left from
    the previous attempt and wait on it forever. ``trainledger-soak/attempt-N/`` keeps them apart.
    """
    import datetime

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=timeout_s)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=not agent_store and rank == 0, timeout=timeout)
    store = dist.PrefixStore(f"trainledger-soak/attempt-{attempt}/", base)
    kwargs: dict[str, Any] = {"store": store, "rank": rank, "world_size": world, "timeout": timeout}
    if device == "cuda":
        if not torch.cuda.is_available():
            raise VerifyError("--device cuda: no CUDA GPU visible to torch (try --device cpu)")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        kwargs["device_id"] = torch.device("cuda", local)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", **kwargs)
    return rank, world


def run(a: argparse.Namespace) -> Journal:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    work = Path(a.workdir)
    j = Journal(work, int(os.environ.get("RANK", "0")))
    j.event("start", attempt=attempt, pid=os.getpid())
    try:
        rank, world = init_attempt(a.device, a.timeout, attempt)
        _train(a, rank, world, attempt, work, j)
    except BaseException as exc:
        j.event("error", attempt=attempt, error=error_line(exc))
        raise
    return j


def _train(a: argparse.Namespace, rank: int, world: int, attempt: int, work: Path, j: Journal) -> None:
    import torch
    import torch.distributed as dist

    from trainledger.verify._trainloop import DistTrainer
    from trainledger.verify.telemetry import open_sampler

    ckpt = work / "checkpoint"
    sampler = open_sampler(a.device, int(os.environ.get("LOCAL_RANK", "0")), a.telemetry_fixture)
    j.event("sampler", kind=sampler.kind, device=sampler.device_name)
    tr = DistTrainer(json.loads(Path(a.inputs).read_text()), a.device, rank, world, seed=a.seed)
    restored = (ckpt / MANIFEST).exists()
    step = _restore(tr, ckpt, work, rank, j) if restored else 0
    t_start = _training_start(work, rank)
    deadline = t_start + a.duration
    fault = _fault(a.fault)
    flags = torch.zeros(2)  # [stop, checkpoint now], decided by rank 0's clock for every rank
    first, saved, since, last_ckpt, last_sample, window = True, 0, 0, time.time(), 0.0, []
    while True:
        now = time.time()
        # a restored group trains at least one step, past the deadline if need be (recovery)
        flags[0] = float(now >= deadline and not (restored and first))
        flags[1] = float(now - last_ckpt >= a.checkpoint_interval)
        dist.broadcast(flags, 0)
        if flags[0].item():
            break
        if flags[1].item():
            _checkpoint(tr, ckpt, work, step, rank, world, j)
            saved, since, last_ckpt = saved + 1, 0, time.time()
        if fault and attempt == 0 and rank == fault[0] and since and now >= t_start + fault[1]:
            j.event("fault", what="kill", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        out = tr.step(step)
        window.append(time.perf_counter() - t0)
        step, since = step + 1, since + (1 if saved else 0)
        if first or time.time() - last_sample >= a.sample_interval:
            last_sample = time.time()
            j.sample(t=last_sample, step=step, attempt=attempt, steps=len(window),
                     step_time_s=statistics.median(window), step_time_max_s=max(window), loss=out["loss"],
                     grad_norm=out["grad_norm"], **sampler.sample())
            window = []
        if first:
            j.event("first_step", step=step, attempt=attempt)
            first = False
    sums: list[Any] = [None] * world
    dist.all_gather_object(sums, tr.checksum())
    j.event("end", step=step, attempt=attempt, checksums=sums)
    sampler.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainledger.verify._soak_worker")
    p.add_argument("--inputs", required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--workdir", required=True)
    p.add_argument("--duration", type=float, required=True, help="seconds of training (restarts included)")
    p.add_argument("--checkpoint-interval", type=float, default=60.0, help="seconds between checkpoints")
    p.add_argument("--sample-interval", type=float, default=1.0, help="seconds between telemetry samples")
    p.add_argument("--fault", default=None)
    p.add_argument("--telemetry-fixture", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    a = p.parse_args(argv)
    import torch.distributed as dist

    j = run(a)
    # Training ended and every rank journaled its checksums. The barrier keeps a rank from leaving
    # while its peer still talks to it; a failure there (a peer that closed its gloo sockets first
    # resets the connection) is the harness's, not the job's: journaled, shown beside the verdict.
    try:
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - any teardown failure, recorded
        j.event("teardown", attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                error=error_line(exc))
    return 0


def _leave(code: int) -> None:
    """Exit without destroying the process group or running the interpreter's teardown: a restarted
    gloo group's rank aborted there once in 8 CPU soaks, after its journal was complete (std::terminate
    of a still-joinable C++ thread, "terminate called without an active exception", SIGABRT), and
    torchrun then failed the whole soak. The journal is flushed line by line; stdout and stderr here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(main())
