"""Launch verification workers under torchrun — with a deadline, never a hang.

``torchrun(module, args, nproc)`` starts ``python -m torch.distributed.run`` on this host
(rendezvous on a free port of 127.0.0.1, no restarts) in its own process group, waits at most
``timeout_s`` and then kills the whole group and every descendant (ranks run in sessions of their
own, so the group alone does not reach them; a SIGSTOPped rank is killed too). Each rank records the phase it is in under a
shared status folder, so a failure names the rank and the phase ("rank 1 exited with SIGKILL
during 'backward, step 1'").

Worker-side helpers: ``init_distributed`` (NCCL on GPUs, gloo on CPU, with a timeout on every
collective), ``RankStatus`` and ``maybe_fault`` (faults injected by tests through
``$TRAINLEDGER_FAULT``: ``kill:RANK:PHASE``, ``hang:RANK:PHASE``, ``stop:RANK:PHASE`` (SIGSTOP),
``oom:RANK:PHASE``).

Multi-node runs use torchrun's own rendezvous: start the same ``trainledger verify ...``
command under ``torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` on every
node; the command sees it is already inside torchrun and runs as a worker (README).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError

FAULT_ENV = "TRAINLEDGER_FAULT"
STATUS_ENV = "TRAINLEDGER_STATUS_DIR"
#: seconds every collective may take before the process group raises (gloo and NCCL).
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0


def in_torchrun() -> bool:
    """True inside a worker started by torchrun (or any launcher that sets RANK/WORLD_SIZE)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LaunchResult:
    """What a torchrun launch left behind."""

    returncode: int
    elapsed_s: float
    timed_out: bool
    log_tail: str
    rank_status: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def failure(self, what: str) -> str:
        """One line naming what went wrong: timeout, the rank that died and its last phase."""
        if self.timed_out:
            head = f"{what} did not finish within {self.elapsed_s:.0f} s and was stopped"
        else:
            head = f"{what} failed (exit code {self.returncode})"
        parts = [head]
        for rank, st in sorted(self.rank_status.items()):
            if st.get("state") == "running":
                parts.append(f"rank {rank} stopped during '{st.get('phase')}'")
        for rank, st in sorted(self.rank_status.items()):
            if st.get("state") == "error":
                err = str(st.get("error"))
                err = err if len(err) <= 160 else err[:157] + "..."
                parts.append(f"rank {rank} raised during '{st.get('phase')}': {err}")
        died = _dead_ranks(self.log_tail)
        if died:
            parts.append("torchrun: " + "; ".join(died))
        return "; ".join(parts)

    def failed_phase(self) -> str | None:
        """The phase of the rank that failed first: a rank that stopped, else one that raised."""
        for state in ("running", "error"):
            for _rank, st in sorted(self.rank_status.items()):
                if st.get("state") == state and (state == "running" or "Connection closed" not in str(st.get("error"))):
                    return st.get("phase")
        return None


def _dead_ranks(log: str) -> list[str]:
    """Lines of torchrun's failure summary that name a rank and its exit code or signal."""
    out: list[str] = []
    rank = None
    for line in log.splitlines():
        s = line.strip()
        if s.startswith("rank") and ":" in s and "(local_rank" in s:
            rank = s.split(":", 1)[1].split("(")[0].strip()
        elif s.startswith("exitcode") and rank is not None:
            code = s.split(":", 1)[1].strip()
            out.append(f"rank {rank} exitcode {code}")
            rank = None
    return out[:4]


def _children_map() -> dict[int, list[int]]:
    """ppid -> pids of every process (Linux /proc); empty where /proc is missing."""
    out: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, whatever session or process group it moved to.

    torchrun starts each rank in a new session (torch.distributed.elastic SubprocessHandler,
    ``start_new_session=True``), so killing torchrun's process group never reached the ranks: a
    SIGSTOPped rank ignored torchrun's SIGTERM and stayed behind as a stopped orphan (issue 20).
    """
    kids = _children_map()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(proc: subprocess.Popen, grace_s: float = 5.0, extra: set[int] | None = None) -> None:
    """Stop the launcher, its process group and every descendant (stopped ones included)."""
    tree = _descendants(proc.pid) | (extra or set())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        tree |= _descendants(proc.pid)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        _signal_all(tree, sig)
        if sig == signal.SIGTERM:
            _signal_all(tree, signal.SIGCONT)  # a stopped process sees SIGTERM only once continued
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + min(grace_s, 2.0)
            while time.monotonic() < deadline and any(_alive(p) for p in tree):
                time.sleep(0.05)
    _signal_all({p for p in tree if _alive(p)}, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def run_bounded(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None,
                cwd: str | None = None, extra_pids: Any = None) -> tuple[int, bool, str, float]:
    """Run ``cmd`` in its own process group; at the deadline kill it and every descendant.

    ``extra_pids()``: more pids to kill (ranks that recorded their pid in the status folder).
    Returns (returncode, timed_out, last 8 KB of output, elapsed seconds).
    """
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+b") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True)
        except OSError as exc:
            raise VerifyError(f"cannot start {cmd[0]}: {exc.strerror}") from None
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc, extra=extra_pids() if extra_pids else None)
            rc = proc.returncode if proc.returncode is not None else -9
        except BaseException:
            _kill_group(proc, extra=extra_pids() if extra_pids else None)
            raise
        leftover = {p for p in (extra_pids() if extra_pids else set()) if _alive(p)}
        if leftover:  # the launcher ended but a rank did not (stopped, or ignoring SIGTERM)
            _signal_all(leftover, signal.SIGKILL)
        log.seek(0, os.SEEK_END)
        size = log.tell()
        log.seek(max(0, size - 8192))
        tail = log.read().decode("utf-8", errors="replace")
    return rc, timed_out, tail, time.monotonic() - t0


def torchrun(module: str, args: list[str], nproc: int, timeout_s: float,
             env: dict[str, str] | None = None) -> LaunchResult:
    """Run ``python -m module args`` on ``nproc`` local ranks under torchrun, bounded in time."""
    if nproc < 1:
        raise VerifyError(f"--nproc must be at least 1 (got {nproc})")
    status_dir = tempfile.mkdtemp(prefix="trainledger-ranks-")
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env[STATUS_ENV] = status_dir
    full_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
        str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "--max-restarts", "0", "--monitor-interval", "0.2", "-m", module, *args,
    ]
    try:
        rc, timed_out, tail, elapsed = run_bounded(cmd, timeout_s, env=full_env,
                                                   extra_pids=lambda: _rank_pids(status_dir))
        status = read_rank_status(status_dir)
    finally:
        import shutil

        shutil.rmtree(status_dir, ignore_errors=True)
    return LaunchResult(rc, elapsed, timed_out, tail, status)


def _rank_pids(status_dir: str | Path) -> set[int]:
    out = set()
    for st in read_rank_status(status_dir).values():
        pid = st.get("pid")
        if isinstance(pid, int) and pid > 1 and pid != os.getpid():
            out.add(pid)
    return out


def read_rank_status(status_dir: str | Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in Path(status_dir).glob("rank*.json"):
        try:
            out[int(p.stem[4:])] = json.loads(p.read_text())
        except (ValueError, OSError):
            continue
    return out


class RankStatus:
    """Worker side: record the phase this rank is in (read back by the launcher on failure)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        d = os.environ.get(STATUS_ENV)
        self.path = Path(d) / f"rank{rank}.json" if d else None
        self.phase = "start"

    def _write(self, **data: Any) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"phase": self.phase, "pid": os.getpid(), **data}))
        os.replace(tmp, self.path)

    def enter(self, phase: str) -> None:
        self.phase = phase
        self._write(state="running")
        maybe_fault(self.rank, phase)

    def error(self, exc: BaseException) -> None:
        self._write(state="error", error=error_line(exc))

    def done(self) -> None:
        self.phase = "done"
        self._write(state="done")


def _root_causes(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes/contexts, and the per-rank failures a torch CheckpointException wraps."""
    out, todo, seen = [], [exc], set()
    while todo and len(out) < 32:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()
                     if isinstance(f[0] if isinstance(f, tuple) else f, BaseException)]
    return out


def error_line(exc: BaseException, limit: int = 300) -> str:
    """One line for a rank's failure; a full disk (ENOSPC/EDQUOT/EFBIG) is named as such."""
    import errno

    for e in _root_causes(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            where = f" writing {e.filename}" if e.filename else ""
            return f"disk full: {e.strerror or 'no space left on device'}{where}"[:limit]
        if "No space left on device" in str(e):  # an OSError re-raised as text by another rank
            return "disk full: No space left on device"
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


def parse_fault(spec: str | None) -> tuple[str, int, str] | None:
    """``kill:1:backward`` -> ('kill', 1, 'backward'); None when no fault is set."""
    if not spec:
        return None
    parts = spec.split(":", 2)
    if len(parts) != 3 or parts[0] not in ("kill", "hang", "stop", "oom", "corrupt-checkpoint"):
        raise VerifyError(f"{FAULT_ENV}={spec!r}: use kill|hang|stop|oom|corrupt-checkpoint:RANK:PHASE")
    return parts[0], int(parts[1]), parts[2]


def maybe_fault(rank: int, phase: str) -> None:
    """Inject the fault named in $TRAINLEDGER_FAULT when this rank reaches ``phase``."""
    fault = parse_fault(os.environ.get(FAULT_ENV))
    if fault is None:
        return
    kind, frank, fphase = fault
    if frank != rank or not phase.startswith(fphase):
        return
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "stop":  # SIGSTOP: the process cannot catch it, and SIGTERM waits until SIGCONT
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "oom":
        import torch

        raise torch.OutOfMemoryError(f"injected out-of-memory at {phase} (test fault)")


def init_distributed(device: str, timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S):
    """Join the process group torchrun set up: NCCL on CUDA, gloo on CPU. Returns (rank, world, dev)."""
    import datetime

    import torch
    import torch.distributed as dist

    if device == "cuda":
        if not torch.cuda.is_available():
            raise VerifyError("--device cuda: no CUDA GPU visible to torch (try --device cpu)")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if backend == "nccl":
            kwargs["device_id"] = dev
        dist.init_process_group(backend, **kwargs)
    return dist.get_rank(), dist.get_world_size(), dev
