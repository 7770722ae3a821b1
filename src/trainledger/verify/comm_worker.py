"""Worker of ``verify comm``, one process per rank under torchrun.

Usage (torchrun sets RANK/WORLD_SIZE):
    python -m torch.distributed.run --nproc-per-node N -m trainledger.verify.comm_worker \
        --device cpu --max-size 1MiB --out result.json

Every check fills buffers with small integers so the expected result is exact in fp32, then
all ranks agree on the verdict with an all_reduce(MIN) — a rank with a wrong result fails the
check everywhere. Rank 0 writes the result JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from trainledger.verify.comm import COPY_OP, OPS, aligned_size, bus_factor, iterations_for, sweep_sizes
from trainledger.verify.launch import RankStatus, init_distributed

_UNSUPPORTED_HINTS = ("not support", "unsupported", "not implemented")


def _is_unsupported(exc: BaseException) -> bool:
    return isinstance(exc, NotImplementedError) or any(h in str(exc).lower() for h in _UNSUPPORTED_HINTS)


def _native(op: str, out, inp, n: int) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(out)
    elif op == "all_gather":  # all_gather_single replaces all_gather_into_tensor in newer torch
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, inp)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, inp)
    elif op == "all_to_all":
        dist.all_to_all_single(out, inp)


def _emulated(op: str, out, inp, n: int, rank: int) -> None:
    """The same result through all_reduce / all_gather lists (for backends lacking ``op``)."""
    import torch.distributed as dist

    if op == "reduce_scatter":
        buf = inp.clone()
        dist.all_reduce(buf)
        out.copy_(buf.chunk(n)[rank])
    elif op == "all_gather":
        parts = list(out.chunk(n))
        dist.all_gather(parts, inp)
    elif op == "all_to_all":
        dist.all_to_all(list(out.chunk(n)), list(inp.chunk(n)))
    else:
        raise NotImplementedError(op)


def _buffers(op: str, k: int, n: int, rank: int, dev):
    """(out, inp, expected) for a check with k elements per chunk."""
    import torch

    base = torch.arange(n * k, dtype=torch.float32, device=dev) % 251
    if op == "all_reduce":
        out = (rank + 1) * base[:k].clone()
        return out, None, base[:k] * (n * (n + 1) // 2)
    if op == "all_gather":
        inp = base[rank * k:(rank + 1) * k] + rank
        expected = torch.cat([base[j * k:(j + 1) * k] + j for j in range(n)])
        return torch.empty(n * k, device=dev), inp, expected
    if op == "reduce_scatter":
        inp = (rank + 1) * base
        return torch.empty(k, device=dev), inp, base[rank * k:(rank + 1) * k] * (n * (n + 1) // 2)
    if op == "all_to_all":  # chunk j of rank r holds r·n + j (+ a pattern)
        inp = torch.cat([torch.full((k,), float(rank * n + j), device=dev) + base[:k] for j in range(n)])
        expected = torch.cat([torch.full((k,), float(j * n + rank), device=dev) + base[:k] for j in range(n)])
        return torch.empty(n * k, device=dev), inp, expected
    raise ValueError(op)


def _agree(flag: bool, dev) -> bool:
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def check(op: str, n: int, rank: int, dev, k: int = 1024) -> dict[str, Any]:
    """Run ``op`` once natively (or emulated when unsupported) and compare with the exact result."""
    out, inp, expected = _buffers(op, k, n, rank, dev)
    status, detail = "ok", ""
    try:
        _native(op, out, inp, n)
    except Exception as exc:  # noqa: BLE001 - classified below
        if not _is_unsupported(exc):
            raise
        out, inp, expected = _buffers(op, k, n, rank, dev)
        _emulated(op, out, inp, n, rank)
        status, detail = "unsupported by backend", f"native call: {str(exc)[:80]}; emulated result"
    err = float((out - expected).abs().max().item())
    good = _agree(err == 0.0, dev)
    if not good:
        status = "wrong"
        detail = f"max abs error {err:g} on rank {rank} (expected exact integers)"
    elif detail:
        detail += " correct"
    return {"status": status, "max_abs_err": err, "detail": detail}


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time(fn, iters: int, dev, world: int) -> float:
    """Mean seconds per call over ``iters`` after one warm-up; the slowest rank's value."""
    import torch
    import torch.distributed as dist

    fn()
    _sync(dev)
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(dev)
    dt = (time.perf_counter() - t0) / iters
    if world > 1:
        t = torch.tensor([dt], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dt = float(t.item())
    return dt


def sweep(ops: list[str], sizes: list[int], n: int, rank: int, dev, status: RankStatus) -> list[dict]:
    import torch

    rows = []
    for op in ops:
        for size in sizes:
            status.enter(f"sweep {op} {size} B")
            s = aligned_size(size, n)
            elems = s // 4
            if op == COPY_OP:
                src = torch.ones(elems, device=dev)
                dst = torch.empty_like(src)
                fn = lambda dst=dst, src=src: dst.copy_(src)  # noqa: E731
            else:
                big = torch.ones(elems, device=dev)
                small = torch.ones(elems // n, device=dev)
                out, inp = {"all_reduce": (big, None), "all_gather": (big, small),
                            "reduce_scatter": (small, big), "all_to_all": (big, big.clone())}[op]
                fn = lambda op=op, out=out, inp=inp: _native(op, out, inp, n)  # noqa: E731
            t = _time(fn, iterations_for(s), dev, n)
            ab = s / t
            rows.append({"op": op, "size_bytes": s, "time_s": t, "algbw_bytes_per_s": ab,
                         "busbw_bytes_per_s": ab * bus_factor(op, n)})
            del fn
    return rows


def run(device: str, max_size: int, min_size: int, timeout_s: float) -> dict[str, Any]:
    """The whole worker: checks then sweep. Returns the result on every rank."""
    import torch
    import torch.distributed as dist

    rank, n, dev = init_distributed(device, timeout_s)
    status = RankStatus(rank)
    try:
        checks: dict[str, Any] = {}
        unsupported: set[str] = set()
        for op in OPS:
            status.enter(f"check {op}")
            checks[op] = check(op, n, rank, dev)
            if checks[op]["status"] != "ok":
                unsupported.add(op)
        sizes = sweep_sizes(max_size, min_size)
        ops = [COPY_OP] if n == 1 else [op for op in OPS if op not in unsupported]
        rows = sweep(ops, sizes, n, rank, dev, status)
        status.enter("finish")
        if n > 1:
            dist.barrier()
        status.done()
        return {"backend": dist.get_backend(), "device": str(dev.type), "world_size": n,
                "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
                "torch": torch.__version__, "checks": checks, "sweep": rows}
    except BaseException as exc:
        status.error(exc)
        raise


def main(argv: list[str] | None = None) -> int:
    from trainledger.units import parse_bytes

    p = argparse.ArgumentParser(prog="trainledger.verify.comm_worker")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--max-size", default="1MiB")
    p.add_argument("--min-size", default="1KiB")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch.distributed as dist

    result = run(a.device, parse_bytes(a.max_size), parse_bytes(a.min_size), a.timeout)
    if dist.get_rank() == 0:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, a.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
