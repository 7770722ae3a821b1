"""Worker of ``verify scaling``: time training steps of the plan's model on this world size.

Each rank trains ``--warmup`` untimed steps, then ``--steps`` timed ones; a step's time is the
slowest rank's (all_reduce MAX), and the result is the median over the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from trainledger.verify.launch import RankStatus, init_distributed


def timed_steps(tr: Any, dev: Any, status: RankStatus, warmup: int, steps: int,
                sync_world: bool = True) -> tuple[list[float], int]:
    """Train ``warmup`` untimed then ``steps`` timed steps; (step times, tokens of one rank's step).

    With ``sync_world`` the ranks start each step together (barrier) and a step's time is the
    slowest rank's (all_reduce MAX); without it one rank times itself alone.
    """
    import torch
    import torch.distributed as dist

    times, out = [], {"tokens": 0}
    for s in range(warmup + steps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if sync_world:
            dist.barrier()
        t0 = time.perf_counter()
        out = tr.step(s, status)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        if sync_world:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if s >= warmup:
            times.append(float(t.item()))
    return times, out["tokens"]


def scaling_row(world: int, times: list[float], tokens_per_rank: int, sharded: bool, backend: str | None) -> dict:
    """One row of ``verify scaling``: the median step time of ``world`` ranks and its throughput."""
    import torch

    step_time = statistics.median(times)
    tokens = tokens_per_rank * world
    return {"world_size": world, "step_time_s": step_time, "step_times_s": times, "tokens_per_step": tokens,
            "tokens_per_s": tokens / step_time, "sharded": sharded, "backend": backend,
            "threads_per_rank": torch.get_num_threads()}


def run(a: argparse.Namespace) -> dict:
    import torch.distributed as dist

    from trainledger.verify._trainloop import DistTrainer

    rank, world, dev = init_distributed(a.device, a.timeout)
    status = RankStatus(rank)
    try:
        status.enter("load")
        tr = DistTrainer(json.loads(Path(a.inputs).read_text()), a.device, rank, world)
        times, tokens = timed_steps(tr, dev, status, a.warmup, a.steps)
        status.done()
        return scaling_row(world, times, tokens, tr.sharded, dist.get_backend())
    except BaseException as exc:
        status.error(exc)
        raise


def worker_args(prog: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments of a scaling worker (this module's, and ``verify.multinode``'s over nodes)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--inputs", required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = worker_args("trainledger.verify._scaling_worker", argv)
    import torch.distributed as dist

    result = run(a)
    if dist.get_rank() == 0:
        Path(a.out + ".tmp").write_text(json.dumps(result))
        os.replace(a.out + ".tmp", a.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
