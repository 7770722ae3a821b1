"""Near-capacity memory: how often per step PyTorch's caching allocator must free its cache and retry.

The caching allocator (c10/cuda/CUDACachingAllocator.cpp, ``DeviceCachingAllocator::malloc``)
serves a request from a cached free block when one fits; otherwise it calls ``cudaMalloc``. When
that fails it frees cached blocks (``release_available_cached_blocks``, then ``release_cached_blocks``:
a wait on every outstanding event, i.e. a device synchronize, and ``cudaFree`` of each cached
segment) and tries ``cudaMalloc`` once more; each such recovery counts one
``torch.cuda.memory_stats()["num_alloc_retries"]``. The path stalls the GPU: ``cudaFree`` waits
for all work on the device (pytorch/pytorch PR #19222, the allocator's author), and waiting on
every event "is very expensive as it will likely stall all the GPU operations" (PR #74261).

Mechanism. At a moment of the step with L live bytes the allocator holds about L·(1 + f) reserved
(f: the reserve fraction of the memory model, catalog/runtime/cuda.yaml: cached-but-free blocks
and split segments). The device offers C = usable bytes - CUDA context - library workspaces. If
L·(1 + f) <= C the moment is served from the cache (no retry). Otherwise the cache cannot be
kept whole: the share of the cache that does not fit, ``miss = (L·(1+f) - C) / (f·L)`` (capped at
1), is the chance that a large allocation made at that moment finds no cached block and must
retry. The large allocations of a moment are the terms that grew since the moment before
(logits, a layer's working set, a gathered FSDP unit, the optimizer's temporaries ...); per-layer
moments (``last layer ...`` / ``first layer ...``) recur once per layer, interpolated between the
two ends, and forward/backward moments once per micro-batch. Expected retries per step =
Σ allocations × miss × repeats. Zero with comfortable headroom; when some moment's L > C the
plan does not fit at all (CUDA OOM): no retry count, only the warning.
"""

from __future__ import annotations

from typing import NamedTuple

from trainledger.spec.plan import Plan
from trainledger.units import gib

Point = tuple[str, str, dict[str, float]]


class Pressure(NamedTuple):
    """Allocator pressure of one plan's step on one rank."""

    retries_per_step: float  # expected num_alloc_retries per optimizer step
    peak_bytes: float        # live bytes at the tightest moment
    capacity_bytes: float    # usable - context - workspaces
    reserve_fraction: float
    fits: bool               # the live peak itself fits (retries cannot save a larger one)

    @property
    def near_capacity(self) -> bool:
        return self.retries_per_step > 0 or not self.fits

    def note(self) -> str | None:
        """The warning shown in memory and time notes (None with comfortable headroom)."""
        if not self.near_capacity:
            return None
        need = self.peak_bytes * (1 + self.reserve_fraction)
        head = (f"near capacity: {gib(self.peak_bytes):.1f} GiB live at the peak + the allocator's "
                f"{100 * self.reserve_fraction:.0f}% cache = {gib(need):.1f} GiB vs {gib(self.capacity_bytes):.1f} "
                "GiB for tensors")
        if not self.fits:
            return head + ": does not fit (the caching allocator's retries cannot help; expect CUDA OOM)"
        return (head + f": the caching allocator frees its cache and retries cudaMalloc ~{self.retries_per_step:.0f} "
                "times per step (torch.cuda.memory_stats()['num_alloc_retries']), each a device synchronize; "
                "a smaller micro-batch or more recomputation restores headroom")


def busier(stages: "list[Pressure]") -> "Pressure":
    """The pipeline stage whose pressure the plan reports: one that does not fit stops the whole
    pipeline; else the stage with more retries (then the larger live peak). The memory note and
    the time term both read this one."""
    return max(stages, key=lambda p: (not p.fits, p.retries_per_step, p.peak_bytes))


def _miss(live: float, capacity: float, f: float) -> float:
    """Share of a moment's large allocations that find no cached block (see module docstring)."""
    over = live * (1 + f) - capacity
    if over <= 0:
        return 0.0
    if f <= 0 or live >= capacity:
        return 1.0
    return min(1.0, over / (f * live))


def _rises(prev: dict[str, float], cur: dict[str, float]) -> int:
    """Terms that grew since the moment before: the large allocations that make this moment."""
    return max(1, sum(1 for k, v in cur.items() if v > prev.get(k, 0.0) * (1 + 1e-9) + 1.0))


def pressure(plan: Plan, points: list[Point], capacity: float, f: float, n_layers: int) -> Pressure:
    """Expected allocator retries per step of ``points`` (one rank's moments, from ``phases``)."""
    r, lay = plan.recipe, plan.layout
    micro = (lay.pp_microbatches or r.grad_accum) if lay.pp > 1 else r.grad_accum
    totals = [sum(d.values()) for _, _, d in points]
    peak = max(totals) if totals else 0.0
    if peak * (1 + f) <= capacity:  # comfortable headroom at every moment (most plans)
        return Pressure(0.0, peak, capacity, f, True)
    if peak > capacity:  # it does not run at all: no step to slow down (the note says so)
        return Pressure(0.0, peak, capacity, f, False)
    retries = 0.0
    by_label = {lb: i for i, (_, lb, _) in enumerate(points)}
    for i, (phase, label, d) in enumerate(points):
        prev = points[i - 1][2]  # the first moment follows the previous step's last
        allocs = _rises(prev, d)
        repeats = 1 if phase == "optimizer" else micro
        if label.startswith("first layer "):
            continue  # counted with its "last layer" partner
        if label.startswith("last layer ") and "first layer " + label[len("last layer "):] in by_label:
            j_end = by_label["first layer " + label[len("last layer "):]]
            # every layer of the loop, its live bytes interpolated between the two ends (the miss
            # is not linear in the layer: only the layers near the fuller end may miss)
            a, b, n = totals[i], totals[j_end], max(n_layers, 1)
            miss = (sum(_miss(a + (b - a) * k / (n - 1), capacity, f) for k in range(n)) if n > 1
                    else _miss(a, capacity, f))
            retries += allocs * miss * repeats
        else:
            retries += allocs * _miss(totals[i], capacity, f) * repeats
    return Pressure(retries, peak, capacity, f, True)
