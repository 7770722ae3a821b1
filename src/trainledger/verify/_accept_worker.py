"""Worker of ``verify accept``, one process per rank under torchrun.

``--mode run``: build the plan's model, check gradient accumulation, train ``--steps-before``
steps, save a checkpoint atomically (``torch.distributed.checkpoint`` into ``DIR.tmp``, a sha256
manifest of every file, then one ``rename`` to ``DIR``), train ``--steps-after`` more steps.
``--mode restore`` (a fresh launch): verify the manifest, load the checkpoint and train the same
``--steps-after`` steps. Rank 0 writes the JSON result: losses, per-rank work and checksums.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError
from trainledger.verify.launch import RankStatus, init_distributed

MANIFEST = "manifest.json"


def file_digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[str(p.relative_to(folder))] = h.hexdigest()
    return out


def verify_manifest(folder: Path) -> dict[str, str]:
    """Check every file of a checkpoint against its manifest; VerifyError naming the bad file."""
    mf = folder / MANIFEST
    if not mf.exists():
        raise VerifyError(f"checkpoint {folder} has no {MANIFEST}: incomplete or not written by trainledger")
    try:
        want = json.loads(mf.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise VerifyError(f"checkpoint {folder}: {MANIFEST} is unreadable ({exc})") from None
    have = file_digests(folder)
    for name, digest in want.items():
        if name not in have:
            raise VerifyError(f"checkpoint {folder}: file {name} is missing")
        if have[name] != digest:
            raise VerifyError(f"checkpoint {folder}: file {name} is corrupted (sha256 {have[name][:12]}... "
                              f"!= manifest {digest[:12]}...)")
    return want


def save_atomic(tr: Any, final: Path, step: int, rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    t0 = time.perf_counter()
    tr.save(str(tmp))
    dist.barrier()
    info: dict[str, Any] = {}
    if rank == 0:
        files = file_digests(tmp)
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "world_size": dist.get_world_size(),
                                                "files": files}, indent=1))
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():  # keep the previous checkpoint until the new one is in place
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        info = {"path": str(final), "files": len(files),
                "bytes": sum(p.stat().st_size for p in final.rglob("*") if p.is_file())}
    dist.barrier()
    info["seconds"] = time.perf_counter() - t0
    return info


def _rank_summary(tr: Any, steps: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    return {"rank": rank, "steps": len(steps), "tokens": sum(s["tokens"] for s in steps),
            "nonzero_grad_steps": sum(1 for s in steps if s["grad_norm"] > 0),
            "finite": all(s["loss"] == s["loss"] and abs(s["loss"]) != float("inf") for s in steps),
            "checksum": tr.checksum()}


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist

    from trainledger.verify._trainloop import DistTrainer, grad_accum_check

    rank, world, _dev = init_distributed(a.device, a.timeout)
    status = RankStatus(rank)
    try:
        status.enter("load")
        inputs = json.loads(Path(a.inputs).read_text())
        t0 = time.perf_counter()
        tr = DistTrainer(inputs, a.device, rank, world, seed=a.seed)
        info: dict[str, Any] = {"world_size": world, "backend": dist.get_backend(), "device": a.device,
                                "params": tr.n_params, "load_seconds": time.perf_counter() - t0,
                                "param_dtype": str(next(tr.raw.parameters()).dtype).replace("torch.", ""),
                                "sharded": tr.sharded, "notes": tr.notes,
                                "seq_len": tr.recipe.seq_len, "micro_batch": tr.recipe.micro_batch,
                                "grad_accum": tr.recipe.grad_accum}
        ckpt = Path(a.ckpt)
        if a.mode == "run":
            status.enter("grad-accum check")
            info["grad_accum_check"] = grad_accum_check(tr, a.accum_rtol)
            c0 = tr.checksum()
            before = []
            for s in range(a.steps_before):
                before.append(tr.step(s, status))
                if s == 0:
                    info["params_changed_by_step"] = tr.checksum() != c0
            status.enter("save checkpoint")
            info["checkpoint"] = save_atomic(tr, ckpt, a.steps_before, rank)
            first = before
        else:
            status.enter("verify checkpoint")
            verify_manifest(ckpt)
            status.enter("load checkpoint")
            tr.load(str(ckpt))
            first = []
        after = [tr.step(a.steps_before + s, status) for s in range(a.steps_after)]
        status.enter("gather")
        ranks: list[Any] = [None] * world
        dist.all_gather_object(ranks, _rank_summary(tr, first + after, rank))
        mems: list[Any] = [None] * world
        dist.all_gather_object(mems, tr.memory.to_dict())
        info["memory_per_rank"] = mems
        info.update({"losses_before": [s["loss"] for s in first], "losses_after": [s["loss"] for s in after],
                     "grad_norms": [s["grad_norm"] for s in first + after], "ranks": ranks})
        status.done()
        return info
    except BaseException as exc:
        status.error(exc)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainledger.verify._accept_worker")
    p.add_argument("--mode", choices=("run", "restore"), required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steps-before", type=int, default=2)
    p.add_argument("--steps-after", type=int, default=2)
    p.add_argument("--accum-rtol", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch.distributed as dist

    result = run(a)
    if dist.get_rank() == 0:
        tmp = a.out + ".tmp"
        Path(tmp).write_text(json.dumps(result))
        os.replace(tmp, a.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
