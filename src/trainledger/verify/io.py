"""``verify io``: can the storage and host memory feed the training job?

Storage at a path: random 4 KiB read IOPS and sequential read throughput.

* With ``fio`` installed (https://fio.readthedocs.io): ``--direct=1 --ioengine=libaio``, queue
  depth 32 for random 4 KiB reads and 1 MiB sequential reads, JSON output (``jobs[0].read.iops``
  and ``read.bw_bytes``).
* Without fio, a built-in reader: ``os.preadv`` from a pool of threads (each thread keeps one
  read in flight, so the queue depth equals the thread count; ``preadv`` releases the GIL) on a
  file opened with ``O_DIRECT`` into page-aligned buffers, which bypasses the page cache.
  Filesystems that refuse O_DIRECT (tmpfs, some network and FUSE filesystems) fall back to
  buffered reads after ``posix_fadvise(DONTNEED)`` drops the file's cached pages; the result says
  ``mode: buffered`` because the page cache can still inflate it.

The test file (default 256 MiB) is written inside the path and deleted afterwards; every test
stops at its time budget. Host memory bandwidth: numpy copy of a large array, counted as
2 × bytes / t (one read and one write per byte, STREAM's Copy convention, McCalpin,
https://www.cs.virginia.edu/stream/ref.html); numpy copies on one thread, so this is one
core's bandwidth, a lower bound for the socket.

The plan's need: the io section of the estimate when there is one (``Estimate.extra["io"]``);
otherwise tokens/s per node (tokens per step / predicted step time / nodes) × bytes per token,
where a pre-tokenized dataset stores each token id as uint16 when the vocabulary fits in 2^16
ids and as uint32 otherwise (the layout of nanoGPT's ``prepare.py`` .bin files). A shuffled
loader reads one sample per random access: ceil(sample bytes / 4 KiB) reads of 4 KiB.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import random
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError
from trainledger.units import KIB, MIB, fmt_bytes, fmt_rate

RANDOM_BLOCK = 4 * KIB
SEQ_BLOCK = 1 * MIB
UINT16_IDS = 2**16


def parse_fio(data: dict[str, Any]) -> dict[str, float]:
    """IOPS and bytes/s of the first job of a fio ``--output-format=json`` result."""
    try:
        read = data["jobs"][0]["read"]
        return {"iops": float(read["iops"]), "bytes_per_s": float(read["bw_bytes"])}
    except (KeyError, IndexError, TypeError) as exc:
        raise VerifyError(f"unexpected fio JSON output (missing {exc})") from None


def _fio(path: Path, rw: str, bs: int, size: int, runtime_s: float, iodepth: int) -> dict[str, float]:
    cmd = ["fio", "--name=trainledger", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
           "--direct=1", "--ioengine=libaio", f"--iodepth={iodepth}", f"--size={size}",
           f"--runtime={max(1, int(runtime_s))}", "--time_based", "--output-format=json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime_s + 60)
    except subprocess.TimeoutExpired:
        raise VerifyError(f"fio did not finish within {runtime_s + 60:.0f} s") from None
    if out.returncode != 0:
        raise VerifyError(f"fio failed: {out.stderr.strip()[:200]}")
    return parse_fio(json.loads(out.stdout))


def _write_file(path: Path, size: int) -> None:
    chunk = os.urandom(SEQ_BLOCK)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())


def _open(path: Path) -> tuple[int, str]:
    """Open for O_DIRECT reads when the filesystem allows it; else buffered with cache dropped."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            fd = os.open(path, os.O_RDONLY | flag)
            buf = mmap.mmap(-1, RANDOM_BLOCK)
            try:
                os.preadv(fd, [buf], 0)  # some filesystems accept the flag and fail on read
                return fd, "direct"
            except OSError:
                os.close(fd)
            finally:
                buf.close()
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY)
    drop_cache(fd)
    return fd, "buffered"


def drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _reader(fd: int, offsets: list[int], block: int, deadline: float) -> tuple[int, int]:
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
    n = nbytes = 0
    try:
        for off in offsets:
            if time.monotonic() > deadline:
                break
            got = os.preadv(fd, [buf], off)
            n += 1
            nbytes += got
    finally:
        buf.close()
    return n, nbytes


def _parallel_read(fd: int, offsets: list[int], block: int, threads: int, budget_s: float) -> dict[str, float]:
    parts = [offsets[i::threads] for i in range(threads)]
    t0 = time.monotonic()
    deadline = t0 + budget_s
    with ThreadPoolExecutor(threads) as pool:
        res = list(pool.map(lambda p: _reader(fd, p, block, deadline), parts))
    dt = time.monotonic() - t0
    n = sum(r[0] for r in res)
    nbytes = sum(r[1] for r in res)
    return {"iops": n / dt, "bytes_per_s": nbytes / dt, "reads": n, "seconds": dt}


def builtin_storage(path: Path, size: int, budget_s: float, threads: int, seed: int = 0) -> dict[str, Any]:
    """Sequential and random-4KiB read rates of a fresh test file at ``path`` (no fio)."""
    fd, mode = _open(path)
    try:
        seq_offsets = list(range(0, size - SEQ_BLOCK + 1, SEQ_BLOCK))
        seq = _parallel_read(fd, seq_offsets, SEQ_BLOCK, 1, budget_s)
        if mode == "buffered":
            drop_cache(fd)
        rng = random.Random(seed)
        blocks = size // RANDOM_BLOCK
        rand_offsets = [rng.randrange(blocks) * RANDOM_BLOCK for _ in range(200_000)]
        rnd = _parallel_read(fd, rand_offsets, RANDOM_BLOCK, threads, budget_s)
    finally:
        os.close(fd)
    return {"tool": "builtin", "mode": mode, "queue_depth": threads,
            "seq_read_bytes_per_s": seq["bytes_per_s"], "random_4k_iops": rnd["iops"],
            "random_reads": rnd["reads"], "seq_bytes_read": seq["bytes_per_s"] * seq["seconds"]}


def measure_storage(directory: str | Path, size: int = 256 * MIB, budget_s: float = 5.0,
                    threads: int = 16, use_fio: bool | None = None) -> dict[str, Any]:
    """Random 4 KiB read IOPS and sequential read bytes/s at ``directory``, bounded in size and time."""
    d = Path(directory)
    if not d.is_dir():
        raise VerifyError(f"--path {d}: not a directory; give the folder the dataset lives in")
    size = max(SEQ_BLOCK, size // SEQ_BLOCK * SEQ_BLOCK)
    free = shutil.disk_usage(d).free
    if free < 2 * size:
        raise VerifyError(f"--path {d}: {fmt_bytes(free)} free, the test needs {fmt_bytes(2 * size)}; "
                          f"lower --size")
    fd, tmp = tempfile.mkstemp(prefix=".trainledger-io-", suffix=".bin", dir=d)
    os.close(fd)
    path = Path(tmp)
    try:
        _write_file(path, size)
        if use_fio is None:
            use_fio = shutil.which("fio") is not None
        if use_fio:
            rnd = _fio(path, "randread", RANDOM_BLOCK, size, budget_s, 32)
            seq = _fio(path, "read", SEQ_BLOCK, size, budget_s, 8)
            res = {"tool": "fio", "mode": "direct", "queue_depth": 32,
                   "seq_read_bytes_per_s": seq["bytes_per_s"], "random_4k_iops": rnd["iops"]}
        else:
            res = builtin_storage(path, size, budget_s, threads)
    finally:
        path.unlink(missing_ok=True)
    res.update({"path": str(d), "file_bytes": size, "budget_s": budget_s})
    return res


def memory_bandwidth(size: int = 256 * MIB, repeats: int = 5) -> dict[str, Any]:
    """Host memory copy bandwidth: best of ``repeats`` numpy copies, 2 × bytes / t."""
    import numpy as np

    n = max(1, size // 8)
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return {"array_bytes": n * 8, "copy_bytes_per_s": 2 * n * 8 / best, "threads": 1,
            "convention": "2 x bytes / t (read + write), STREAM Copy"}


def bytes_per_token(vocab_size: int) -> int:
    """uint16 token ids when the vocabulary fits in 2^16, else uint32."""
    return 2 if vocab_size <= UINT16_IDS else 4


def need_from_rate(tokens_per_s: float, seq_len: int, vocab_size: int, nodes: int = 1,
                   source: str = "") -> dict[str, Any]:
    """Per-node read rate and 4 KiB IOPS a loader needs for ``tokens_per_s`` (cluster-wide)."""
    bpt = bytes_per_token(vocab_size)
    per_node = tokens_per_s / max(1, nodes)
    samples_per_s = per_node / seq_len
    reads_per_sample = math.ceil(seq_len * bpt / RANDOM_BLOCK)
    return {"tokens_per_s_per_node": per_node, "bytes_per_token": bpt,
            "read_bytes_per_s": per_node * bpt, "random_4k_iops": samples_per_s * reads_per_sample,
            "source": source or "tokens/s x bytes per token (uint16 ids if vocab <= 65536, else uint32)"}


def plan_need(plan, est=None, tokens_per_s: float | None = None) -> dict[str, Any] | None:
    """What the plan's data loading needs per node, or None when no step time is known.

    Order: an explicit ``tokens_per_s``; the estimate's io section (``read_bytes_per_s_per_node``,
    ``iops_per_node``); tokens per step / the estimate's step time.
    """
    if tokens_per_s:
        return need_from_rate(tokens_per_s, plan.recipe.seq_len, plan.model.vocab_size, plan.cluster.nodes,
                              "--tokens-per-s x bytes per token")
    if est is not None and "io" in getattr(est, "extra", {}):
        io = est.extra["io"]
        d = io.to_dict() if hasattr(io, "to_dict") else dict(io)
        rate = d.get("read_bytes_per_s_per_node", d.get("read_bytes_per_s"))
        if isinstance(rate, (int, float)):
            return {"read_bytes_per_s": float(rate), "random_4k_iops": d.get("iops_per_node"),
                    "source": "the estimate's io section (trainledger estimate)"}
    if est is not None and getattr(est, "compute", None) is not None:
        t = getattr(est.compute, "step_time_s", None)
        if t:
            return need_from_rate(plan.tokens_per_step / t, plan.recipe.seq_len, plan.model.vocab_size,
                                  plan.cluster.nodes)
    return None


def compare(storage: dict[str, Any], need: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One check per need: measured / needed, passing at >= 1."""
    if not need:
        return []
    out = []
    for key, label, fmt in (("read_bytes_per_s", "sequential read", fmt_rate),
                            ("random_4k_iops", "random 4 KiB reads", lambda v: f"{v:,.0f} IOPS")):
        want = need.get(key)
        have = storage.get("seq_read_bytes_per_s" if key == "read_bytes_per_s" else "random_4k_iops")
        if want is None or have is None:
            continue
        ratio = have / want if want else math.inf
        out.append({"check": label, "measured": have, "needed": want, "ratio": ratio, "ok": ratio >= 1.0,
                    "text": f"{label}: {fmt(have)} measured vs {fmt(want)} needed ({ratio:.1f}x)"})
    return out


def render(res: dict[str, Any]) -> str:
    s, m = res["storage"], res["memory"]
    lines = [f"storage at {s['path']} ({s['tool']}, {s['mode']} I/O, queue depth {s['queue_depth']}, "
             f"{fmt_bytes(s['file_bytes'])} test file)",
             f"  sequential read   {fmt_rate(s['seq_read_bytes_per_s'])}",
             f"  random 4 KiB read {s['random_4k_iops']:,.0f} IOPS",
             f"host memory copy    {fmt_rate(m['copy_bytes_per_s'])} (one thread, {m['convention']})"]
    need = res.get("need")
    if need:
        lines.append(f"plan needs per node: {fmt_rate(need['read_bytes_per_s'])} "
                     f"({need['source']})")
    for c in res.get("checks", []):
        lines.append(f"  {'PASS' if c['ok'] else 'FAIL'}  {c['text']}")
    if s["mode"] == "buffered":
        lines.append("  note: the filesystem refused O_DIRECT; buffered reads may be served from the page cache")
    return "\n".join(lines)
