"""The CUDA measurement: torch.cuda's own counters around each phase, CUDA-event timing.

For the measured (last) step, ``torch.cuda.reset_peak_memory_stats()`` is called as each phase
begins and ``max_memory_allocated()`` / ``max_memory_reserved()`` are read as it ends, so each
phase's peak is exactly what torch reports; the step's peak is the largest of them. Phase times
are wall times between ``torch.cuda.synchronize()`` calls. Afterwards one more step runs under
the :class:`~trainledger.verify.memtrace.MemoryTracker` (``device_type="cuda"``) for the category
breakdown; its own peak is kept as ``tracker_peak_bytes`` (a cross-check of the tracker).

An out-of-memory error is a result: the measurement comes back with ``oom=True``, the phase that
failed and the bytes allocated when it failed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from trainledger.spec.recipe import Recipe
from trainledger.units import GIB

_GIB = GIB


class _CudaPhases:
    """Phase context: per-phase peak allocated/reserved bytes and wall time."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        self.times: dict[str, float] = {}
        self.current: str | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.current = name
        t0 = time.perf_counter()
        yield
        torch.cuda.synchronize()
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
        self.peaks[name] = max(self.peaks.get(name, 0), torch.cuda.max_memory_allocated())
        self.reserved[name] = max(self.reserved.get(name, 0), torch.cuda.max_memory_reserved())


def run_cuda(built: Any, recipe: Recipe, steps: int, seed: int) -> Any:
    """Run ``steps`` steps on the GPU; measure the last (see the module docstring)."""
    import torch

    from trainledger.verify.measurement import MemoryMeasurement, register_state, tracked_notes
    from trainledger.verify.memtrace import MemoryTracker
    from trainledger.verify.train_step import StepRunner

    runner = StepRunner(built, recipe, seed=seed)
    ph = _CudaPhases()
    try:
        for _ in range(steps - 1):
            runner.step(ph.phase)
        ph = _CudaPhases()
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        runner.step(ph.phase)
        step_time = time.perf_counter() - t0
    except torch.OutOfMemoryError as exc:
        return _oom_result(ph, exc)
    peak_phase = max(ph.peaks, key=ph.peaks.get)
    latency = dict(getattr(runner, "latency", {}) or {}) if not recipe.is_training else {}
    m = MemoryMeasurement(
        peak_allocated_bytes=max(ph.peaks.values()), peak_phase=peak_phase, phase_peaks=dict(ph.peaks),
        categories_at_peak={}, phase_categories={}, device="cuda", start_bytes=start,
        peak_reserved_bytes=max(ph.reserved.values()), phase_reserved=dict(ph.reserved),
        step_time_s=step_time, forward_time_s=ph.times.get("forward"),
        backward_time_s=ph.times.get("backward"), serving=latency,
    )
    tracker = MemoryTracker(vocab_size=built.vocab_size, device_type="cuda")
    register_state(tracker, runner)
    tracker.reset_peaks()
    runner.on_grads = lambda grads: tracker.label(grads, "gradients")
    runner.on_states = lambda opt: tracker.label(_states(opt), "optimizer_states")
    runner.on_cache = lambda tensors: tracker.tag(tensors, "kv_cache")
    try:
        with tracker:
            runner.step(tracker.phase)
    except torch.OutOfMemoryError:
        m.notes.append("the extra tracked step for the category breakdown ran out of memory")
        return m
    rep = tracker.report()
    m.categories_at_peak = rep.categories_at_peak
    m.phase_categories = rep.phase_categories
    m.tracker_peak_bytes = rep.peak_bytes
    m.timeline = rep.timeline
    if not recipe.is_training:
        m.kv_cache_bytes = rep.tags_at_peak.get("kv_cache", 0)
    m.notes.extend(runner.notes)
    m.notes.append(f"tracker cross-check: tracked peak {rep.peak_bytes} B vs cuda {m.peak_allocated_bytes} B; "
                   + tracked_notes(built, recipe, False)[0])
    return m


def _states(opt: Any) -> list[Any]:
    from trainledger.verify.measurement import optimizer_states as states

    return states(opt)


def _oom_result(ph: _CudaPhases, exc: BaseException) -> Any:
    import torch

    from trainledger.verify.measurement import MemoryMeasurement

    allocated = torch.cuda.max_memory_allocated()
    phase = ph.current or "forward"
    msg = f"does not fit: failed at {phase} with {allocated / _GIB:.2f} GiB allocated"
    torch.cuda.empty_cache()
    return MemoryMeasurement(
        peak_allocated_bytes=allocated, peak_phase=phase, phase_peaks=dict(ph.peaks),
        categories_at_peak={}, phase_categories={}, device="cuda", oom=True, oom_phase=phase,
        oom_message=msg, peak_reserved_bytes=torch.cuda.max_memory_reserved(),
        notes=[msg, str(exc).splitlines()[0] if str(exc) else "CUDA out of memory"],
    )
