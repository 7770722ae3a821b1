"""``verify comm``: are the collectives correct, and how fast are they, on this machine?

Correctness of all_reduce, all_gather, reduce_scatter and all_to_all across ranks, then a size
sweep with *algorithm bandwidth* and *bus bandwidth* as nccl-tests defines them
(NVIDIA nccl-tests, doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

    algbw = S / t
    busbw = algbw · f(n)    with f = 2(n-1)/n for all_reduce,
                                 f = (n-1)/n  for all_gather, reduce_scatter and all_to_all

``S`` is the size of the largest buffer of the operation — the all_reduce buffer, the all_gather
output, the reduce_scatter input, the all_to_all send buffer — as in nccl-tests; ``t`` is the
time of one operation, the slowest rank's mean over the timed iterations. busbw is what one
link must carry, so it compares with the link's per-direction bandwidth from the catalog:
efficiency = peak busbw / link bandwidth.

On a single rank the sweep measures the device-local copy instead (``dst.copy_(src)``): it
reports algbw = S/t and the memory traffic 2S/t (one read and one write of every byte, the
convention of STREAM's Copy kernel, McCalpin, https://www.cs.virginia.edu/stream/ref.html),
which compares with the GPU's HBM bandwidth.

Runs under torchrun (NCCL on GPUs, gloo on CPU); launches torchrun itself when not inside one.

The verdict has two parts. Correctness: every collective returns the right values. Bandwidth:
judged only on GPUs with more than one rank, against the bus bandwidth the link is expected to
reach — its per-direction catalog bandwidth times the achievable fraction of that link kind
(catalog/efficiency/interconnect.yaml, from nccl-tests results); a peak all_reduce busbw below
``BANDWIDTH_OK`` of that fails. gloo on CPU moves host memory through shared memory or sockets,
which says nothing about a GPU interconnect, so its bandwidth is shown but not judged.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError
from trainledger.units import KIB, fmt_bytes, fmt_rate

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
COPY_OP = "copy"
MIN_SIZE = 1 * KIB
#: peak busbw at or above this share of the expected busbw passes. Assumption: nccl-tests reach
#: their peak only at the largest messages (hundreds of MiB); a sweep that stops earlier, or a
#: busy node, lands some 10-20% lower, so 0.75 separates a slow or misconfigured link (PCIe
#: fallback, NVLink off: 5-10x lower) from measurement conditions.
BANDWIDTH_OK = 0.75


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == COPY_OP:
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth S/t in bytes/s."""
    if time_s <= 0:
        raise ValueError("time must be positive")
    return size_bytes / time_s


def busbw(op: str, size_bytes: float, time_s: float, n: int) -> float:
    """Bus bandwidth algbw · f(op, n) in bytes/s (nccl-tests doc/PERFORMANCE.md)."""
    return algbw(size_bytes, time_s) * bus_factor(op, n)


def sweep_sizes(max_size: int, min_size: int = MIN_SIZE, factor: int = 2) -> list[int]:
    """min_size, min_size·factor, ... up to and including max_size (nccl-tests ``-b -e -f``)."""
    if max_size < min_size:
        raise VerifyError(f"--max-size {fmt_bytes(max_size)} is below the smallest size "
                          f"{fmt_bytes(min_size)}")
    sizes, s = [], min_size
    while s <= max_size:
        sizes.append(s)
        s *= factor
    if sizes[-1] != max_size:
        sizes.append(max_size)
    return sizes


def aligned_size(size: int, n: int, elem: int = 4) -> int:
    """Largest size <= ``size`` divisible into ``n`` equal chunks of whole elements (>= n elems)."""
    unit = n * elem
    return max(unit, size // unit * unit)


def iterations_for(size: int, budget_bytes: int = 256 * 1024**2, lo: int = 3, hi: int = 50) -> int:
    """Timed iterations per size: many for small messages, few for large, bounded either way."""
    return max(lo, min(hi, budget_bytes // max(1, size)))


def peaks(sweep: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The highest bus bandwidth reached per operation, and at which size."""
    best: dict[str, dict[str, Any]] = {}
    for row in sweep:
        op = row["op"]
        if op not in best or row["busbw_bytes_per_s"] > best[op]["busbw_bytes_per_s"]:
            best[op] = {"busbw_bytes_per_s": row["busbw_bytes_per_s"], "size_bytes": row["size_bytes"],
                        "algbw_bytes_per_s": row["algbw_bytes_per_s"]}
    return best


def efficiency(peak: dict[str, dict[str, Any]], link_bytes_per_s: float | None) -> dict[str, float]:
    """Peak busbw / link bandwidth per operation (None link: no comparison)."""
    if not link_bytes_per_s:
        return {}
    return {op: p["busbw_bytes_per_s"] / link_bytes_per_s for op, p in peak.items()}


def reference_link(device: str, world: int, link: str | None, gpu: str | None) -> dict[str, Any] | None:
    """The catalog bandwidth the sweep is judged against: a network by name, or a GPU's link/HBM.

    On CUDA without either, the GPU NVML reports is looked up in the catalog.
    """
    from trainledger.load import catalog

    if link:
        net = catalog.load_network(link)
        return {"name": net.name, "what": f"{net.display_name}, per direction",
                "bytes_per_s": net.bytes_per_s}
    if not gpu and device == "cuda":  # the GPU in this machine, when the catalog knows it
        from trainledger.verify.probe import catalog_gpu_for, probe_gpus

        found = probe_gpus()
        if found.get("gpus"):
            gpu = catalog_gpu_for(found["gpus"][0]["name"], catalog.names("gpus"))
    if gpu:
        g = catalog.load_gpu(gpu)
        if world == 1:
            return {"name": g.name, "what": f"{g.display_name} HBM bandwidth",
                    "bytes_per_s": g.hbm_bytes_per_s, "compare": "copy memory traffic"}
        return {"name": g.link, "what": f"{g.display_name} {g.link}, per GPU per direction",
                "bytes_per_s": g.link_bytes_per_s}
    return None


def run_comm(nproc: int, device: str, max_size: int, timeout_s: float = 600.0,
             collective_timeout_s: float = 60.0, min_size: int = MIN_SIZE,
             env: dict[str, str] | None = None, launcher: Any = None) -> dict[str, Any] | None:
    """Launch the comm worker on ``nproc`` local ranks under torchrun and return rank 0's result.

    ``launcher``: a multi-node launcher (verify/multinode.py ``node_launcher``); on a node that
    does not hold global rank 0 the result is None (node 0 reports)."""
    from trainledger.verify.launch import torchrun

    with tempfile.TemporaryDirectory(prefix="trainledger-comm-") as tmp:
        out = Path(tmp) / "comm.json"
        args = ["--device", device, "--max-size", str(max_size), "--min-size", str(min_size),
                "--timeout", str(collective_timeout_s), "--out", str(out)]
        res = (launcher or torchrun)("trainledger.verify.comm_worker", args, nproc, timeout_s, env=env)
        if res.ok and not out.exists() and launcher is not None:
            return None
        if not res.ok or not out.exists():
            raise VerifyError(res.failure(f"verify comm on {nproc} {device} rank(s)"))
        return json.loads(out.read_text())


def finish(result: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any]:
    """Add peaks, the reference link and efficiencies; ``ok`` is False when any check failed."""
    result = dict(result)
    pk = peaks(result.get("sweep", []))
    result["peak"] = pk
    result["link"] = ref
    result["bandwidth"] = judge_bandwidth(result, pk, ref)
    if ref and not result["bandwidth"].get("gloo"):
        if result.get("world_size", 1) == 1 and COPY_OP in pk:
            traffic = 2 * pk[COPY_OP]["algbw_bytes_per_s"]
            result["efficiency"] = {COPY_OP: traffic / ref["bytes_per_s"]}
        else:
            result["efficiency"] = efficiency(pk, ref["bytes_per_s"])
    checks = result.get("checks", {})
    result["correct"] = all(c["status"] in ("ok", "unsupported by backend") for c in checks.values())
    result["ok"] = result["correct"] and result["bandwidth"].get("ok") is not False
    return result


def judge_bandwidth(result: dict[str, Any], peak: dict[str, dict[str, Any]],
                    ref: dict[str, Any] | None) -> dict[str, Any]:
    """Whether the sweep's bandwidth is judged, against what, and the outcome (``ok`` None: not judged)."""
    if result.get("backend") == "gloo" or result.get("device") == "cpu":
        return {"judged": False, "ok": None, "gloo": True,
                "why": "not judged on CPU/gloo: it moves host memory, not a GPU interconnect; run "
                       "--device cuda on the GPUs to judge the link"}
    if result.get("world_size", 1) < 2:
        return {"judged": False, "ok": None, "why": "one rank: the device-local copy is shown, no link is used"}
    if not ref or "all_reduce" not in peak:
        return {"judged": False, "ok": None,
                "why": "no reference link for this GPU: give --gpu or --link to judge the bandwidth"}
    from trainledger.load.catalog import load_network
    from trainledger.estimate.time.efficiency import link_efficiency

    try:
        kind = load_network(ref["name"]).kind
    except Exception:  # noqa: BLE001 - a GPU's link name that is not a catalog network
        kind = ""
    frac = link_efficiency().bandwidth.get(kind, 0.7)
    expected = ref["bytes_per_s"] * frac
    got = peak["all_reduce"]["busbw_bytes_per_s"]
    return {"judged": True, "ok": got >= BANDWIDTH_OK * expected, "expected_busbw_bytes_per_s": expected,
            "achievable_fraction": frac, "fraction_of_expected": got / expected,
            "why": f"peak all_reduce busbw {fmt_rate(got)} is {100 * got / expected:.0f}% of the expected "
                   f"{fmt_rate(expected)} ({100 * frac:.0f}% of {ref['what']}); pass at >= "
                   f"{100 * BANDWIDTH_OK:.0f}%"}


def render(result: dict[str, Any]) -> str:
    """The text report: one line per check, the sweep table, peaks and efficiency."""
    from trainledger.format import table

    lines = [f"collectives on {result['world_size']} rank(s), backend {result['backend']}, "
             f"device {result['device']}"]
    for op, c in result.get("checks", {}).items():
        mark = "PASS" if c["status"] == "ok" else ("SKIP" if "unsupported" in c["status"] else "FAIL")
        extra = f" ({c['detail']})" if c.get("detail") else ""
        lines.append(f"  {mark}  {op:<15} {c['status']}{extra}")
    rows = [[r["op"], fmt_bytes(r["size_bytes"]), f"{r['time_s'] * 1e6:.1f}",
             fmt_rate(r["algbw_bytes_per_s"]), fmt_rate(r["busbw_bytes_per_s"])]
            for r in result.get("sweep", [])]
    if rows:
        lines.append(table(rows, ["op", "size", "time us", "algbw", "busbw"], "lrrrr"))
    ref = result.get("link")
    for op, p in result.get("peak", {}).items():
        eff = result.get("efficiency", {}).get(op)
        e = f", {100 * eff:.3g}% of {ref['what']} ({fmt_rate(ref['bytes_per_s'])})" if eff else ""
        what = "busbw" if op != COPY_OP else "copy algbw"
        lines.append(f"  peak {op:<15} {what} {fmt_rate(p['busbw_bytes_per_s'])} "
                     f"at {fmt_bytes(p['size_bytes'])}{e}")
    bw = result.get("bandwidth") or {}
    if bw.get("why"):
        lines.append(f"  bandwidth: {bw['why']}")
    correct = result.get("correct", result.get("ok"))
    lines.append("verdict: " + ("PASS" if result.get("ok") else "FAIL") + " (collectives "
                 + ("correct" if correct else "WRONG") + "; bandwidth "
                 + ("not judged" if bw.get("ok") is None else "ok" if bw["ok"] else "BELOW expected") + ")")
    return "\n".join(lines)
