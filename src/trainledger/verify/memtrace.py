"""Storage-exact accounting of live tensor memory, by phase and by category.

:class:`MemoryTracker` is a ``TorchDispatchMode``: it sees the outputs of every ATen op, keys live
memory by the *untyped storage* behind each output (views share a storage and are counted once),
and learns about frees through a weak reference on the storage (torch keeps one Python object per
live storage, so the callback fires exactly when the storage's memory is released). Sizes are
rounded the way CUDA's caching allocator counts them in ``torch.cuda.max_memory_allocated()``:
every block is a multiple of 512 bytes (``kMinBlockSize`` and ``round_size()`` in
c10/cuda/CUDACachingAllocator.cpp), a zero-byte tensor takes no block.

It works the same on real CPU tensors, on FakeTensors (no memory at all: enter the tracker
*inside* ``FakeTensorMode``) and on CUDA tensors (a second opinion beside torch.cuda's counters).

What it cannot see (documented differences from ``torch.cuda.max_memory_allocated``):

* scratch memory that one ATen kernel allocates and frees inside itself (for example the fp32
  ``dq_accum`` buffer of the CUDA flash-attention backward, cuBLAS/cuBLASLt workspaces);
* the caching allocator's unsplit large blocks: a large-pool block (requests > 1 MiB) is split
  only when more than 1 MiB would be left over (``should_split``: ``remaining > kSmallSize``), and a
  fresh segment for a request >= 10 MiB is rounded up to 2 MiB (``get_allocation_size``), so CUDA
  may book up to 1 MiB more than the 512-byte-rounded size for such a tensor.

Categories (the keys of every breakdown) are listed in :data:`CATEGORIES`; see their docstring.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: Smallest block of CUDA's caching allocator; every block size is a multiple of it.
#: Source: c10/cuda/CUDACachingAllocator.cpp, ``constexpr size_t kMinBlockSize = 512``.
CUDA_MIN_BLOCK_BYTES = 512

#: Categories of live memory, in report order:
#:   weights                 parameter storages (registered before the step)
#:   gradients               storages that are some parameter's ``.grad`` at the end of a backward
#:   optimizer_states        tensors held in ``optimizer.state`` (after a step)
#:   autocast_weight_copies  outputs of a dtype cast whose input is a parameter (autocast's copies)
#:   logits                  tensors whose last dim is the vocabulary size (and their fp32 upcasts,
#:                           log-softmax outputs and gradients)
#:   optimizer_temporaries   allocated during the optimizer phase and not optimizer states
#:   activations             everything else allocated during forward, backward or decode
#:                           (in inference this includes the KV cache; see ``tag``)
#:   other                   everything else (buffers, inputs, tensors made between phases)
#:   sharding_buffers        a distributed runtime's own buffers: FSDP's gathered (unsharded)
#:                           parameters and all-gather / reduce-scatter buffers, DDP's gradient
#:                           buckets (sharded runs only, see verify/sharded.py)
CATEGORIES: tuple[str, ...] = (
    "weights", "gradients", "optimizer_states", "autocast_weight_copies", "logits",
    "optimizer_temporaries", "activations", "other", "sharding_buffers",
)

#: Phases of one training step, in order.
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "zero_grad")

_CAST_OPS = {"_to_copy"}
#: ``torch.tensor(x)`` constants: made on the host without the dispatcher, then lifted. In a CUDA
#: run the ones the optimizer makes stay on the host (AdamW's step increment), so none is counted.
_UNCOUNTED_OPS = {"lift_fresh", "lift_fresh_copy"}


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes CUDA's caching allocator books for a request of ``nbytes`` (``round_size``).

    Requests below 512 bytes take one 512-byte block; larger ones round up to a multiple of 512;
    a zero-byte request takes no memory (the allocator returns a null pointer).
    """
    if nbytes <= 0:
        return 0
    return -(-nbytes // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES


def exact_bytes(nbytes: int) -> int:
    """No rounding: the storage's own byte size."""
    return max(nbytes, 0)


@dataclass
class _Storage:
    """One live (or once live) storage."""

    sid: int
    nbytes: int
    kind: str  # category decided at allocation
    label: str | None = None  # category learnt later (gradients, optimizer_states, weights)
    ref: weakref.ref | None = None
    tag: str | None = None  # a sub-part of the category worth reporting (e.g. "kv_cache")
    op: str = ""  # the op that allocated it ("" when registered), for diagnostics
    phase: str | None = None
    shape: tuple[int, ...] = ()
    dtype: str = ""

    @property
    def category(self) -> str:
        return self.label or self.kind


@dataclass
class PeakInfo:
    """A peak: its bytes and the event index where it happened (for the category breakdown)."""

    bytes: int = 0
    event: int = -1
    phase: str | None = None


@dataclass
class TrackerReport:
    """Peaks and breakdowns of one tracked window (see :meth:`MemoryTracker.report`)."""

    peak_bytes: int
    peak_phase: str | None
    phase_peaks: dict[str, int]
    categories_at_peak: dict[str, int]
    phase_categories: dict[str, dict[str, int]]
    start_bytes: int
    end_bytes: int
    late_registered: int = 0
    storages_seen: int = 0
    timeline: list[tuple[str, int]] = field(default_factory=list)
    tags_at_peak: dict[str, int] = field(default_factory=dict)


class MemoryTracker(TorchDispatchMode):
    """Count live tensor storage bytes, exactly, while the mode is active.

    Usage::

        tracker = MemoryTracker(vocab_size=V)
        tracker.register(model.parameters(), "weights")
        with tracker:
            with tracker.phase("forward"):
                loss = model(ids, labels=ids).loss
            ...
        report = tracker.report()

    ``rounding`` maps a storage's byte size to the bytes booked for it (default: CUDA's 512-byte
    blocks); ``device_type`` limits the count to tensors on that device type (e.g. ``"cuda"``). Storages first seen as an *input* of an op (made before the mode started and never
    registered) are counted from that moment and tallied in ``late_registered`` — a run that
    registers its model state beforehand should have none.
    """

    def __init__(self, vocab_size: int | None = None,
                 rounding: Callable[[int], int] = cuda_block_bytes,
                 device_type: str | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.device_type = device_type  # count only tensors on this device type (None: all)
        self._ignored: dict[int, weakref.ref] = {}
        self.rounding = rounding
        self._live: dict[int, _Storage] = {}  # storage _cdata -> record
        self._all: dict[int, _Storage] = {}  # sid -> record (kept for breakdowns)
        self._events: list[tuple[int, int]] = []  # (sid, +bytes / -bytes)
        self._trace: list[tuple[str | None, int]] = []  # (phase, live bytes) after each event
        self._next_sid = 0
        self.current_bytes = 0
        self.current_phase: str | None = None
        self._start_bytes = 0
        self._start_event = -1
        self.peak = PeakInfo()
        self.phase_peak: dict[str, PeakInfo] = {}
        self.late_registered = 0

    # ----------------------------------------------------------------- registration
    def _record(self, st: torch.UntypedStorage, kind: str) -> _Storage:
        key = st._cdata
        rec = self._live.get(key)
        if rec is not None:
            self._maybe_resized(rec, st)
            return rec
        rec = _Storage(self._next_sid, self.rounding(st.nbytes()), kind)
        self._next_sid += 1
        rec.ref = weakref.ref(st, self._make_free_cb(key, rec.sid))
        self._live[key] = rec
        self._all[rec.sid] = rec
        self._add(rec.sid, rec.nbytes)
        return rec

    def _make_free_cb(self, key: int, sid: int) -> Callable[[object], None]:
        def _freed(_ref: object) -> None:
            rec = self._live.get(key)
            if rec is not None and rec.sid == sid:
                del self._live[key]
                self._add(sid, -rec.nbytes)
        return _freed

    def _maybe_resized(self, rec: _Storage, st: torch.UntypedStorage) -> None:
        nb = self.rounding(st.nbytes())
        if nb != rec.nbytes:
            self._add(rec.sid, nb - rec.nbytes)
            rec.nbytes = nb

    def register(self, tensors: Iterable[torch.Tensor | None], category: str) -> None:
        """Count already-existing tensors (parameters, grads, states) under ``category``."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {CATEGORIES}")
        for t in tensors:
            if self._counted(t):
                rec = self._record(t.untyped_storage(), category)
                rec.label = category

    def label(self, tensors: Iterable[torch.Tensor | None], category: str) -> None:
        """Re-label live tensors: their storages count as ``category`` for their whole life."""
        self.register(tensors, category)

    def tag(self, tensors: Iterable[torch.Tensor | None], name: str) -> None:
        """Mark live tensors' storages with ``name`` (kept in their category; see bytes_by_tag)."""
        for t in tensors:
            if self._counted(t):
                self._record(t.untyped_storage(), "other" if self.current_phase is None else
                             "activations").tag = name

    def ignore(self, tensors: Iterable[torch.Tensor | None]) -> None:
        """Never count these storages (e.g. optimizer step counters CUDA keeps on the host)."""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            rec = self._live.pop(key, None)
            if rec is not None:
                self._add(rec.sid, -rec.nbytes)
            if key not in self._ignored:
                self._ignored[key] = weakref.ref(st, lambda _r, k=key: self._ignored.pop(k, None))

    def _counted(self, t: object) -> bool:
        if not isinstance(t, torch.Tensor) or not _has_storage(t):
            return False
        if self.device_type is not None and t.device.type != self.device_type:
            return False
        return t.untyped_storage()._cdata not in self._ignored

    # ----------------------------------------------------------------- accounting
    def _add(self, sid: int, delta: int) -> None:
        self._events.append((sid, delta))
        self.current_bytes += delta
        self._trace.append((self.current_phase, self.current_bytes))
        if delta <= 0:
            return
        idx = len(self._events) - 1
        ph = self.current_phase
        if self.current_bytes > self.peak.bytes:
            self.peak = PeakInfo(self.current_bytes, idx, ph)
        if ph is not None:
            pk = self.phase_peak.get(ph)
            if pk is None or self.current_bytes > pk.bytes:
                self.phase_peak[ph] = PeakInfo(self.current_bytes, idx, ph)

    def _kind_for(self, func: object, args: tuple, out: torch.Tensor) -> str:
        ph = self.current_phase
        if _op_name(func) in _CAST_OPS:
            src = args[0] if args else None
            if isinstance(src, torch.Tensor):
                rec = self._live.get(src.untyped_storage()._cdata)
                if rec is not None and rec.category == "weights" and src.dtype != out.dtype:
                    return "autocast_weight_copies"
        if self.vocab_size and out.dim() >= 2 and out.shape[-1] == self.vocab_size and ph in (
            "forward", "backward", "decode"
        ):
            return "logits"
        if ph == "optimizer":
            return "optimizer_temporaries"
        if ph in ("forward", "backward", "decode"):
            return "activations"
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if _op_name(func) in _UNCOUNTED_OPS:
            return func(*args, **kwargs)
        self.note_inputs(func, args, kwargs)
        out = func(*args, **kwargs)
        self.note_outputs(func, args, out)
        return out

    def note_inputs(self, func: object, args: tuple, kwargs: dict) -> None:
        """Count op inputs never seen before (made before the tracker started, not registered)."""
        for t in tree_flatten((args, kwargs))[0]:
            if self._counted(t) and t.untyped_storage()._cdata not in self._live:
                if t.dim() == 0 or t.untyped_storage().nbytes() == 0:
                    continue  # host scalars (torch.tensor(1.0) step increments) and empty tensors
                self.late_registered += 1
                rec = self._record(t.untyped_storage(), "other")
                rec.op, rec.phase = f"input of {func}", self.current_phase
                rec.shape, rec.dtype = tuple(t.shape), str(t.dtype).replace("torch.", "")

    def note_outputs(self, func: object, args: tuple, out: object) -> None:
        """Record the storages an op's outputs brought to life (or grew, for a resized one)."""
        for t in tree_flatten(out)[0]:
            if self._counted(t):
                st = t.untyped_storage()
                if st._cdata in self._live:
                    self._maybe_resized(self._live[st._cdata], st)
                else:
                    rec = self._record(st, self._kind_for(func, args, t))
                    rec.op, rec.phase = str(func), self.current_phase
                    rec.shape, rec.dtype = tuple(t.shape), str(t.dtype).replace("torch.", "")

    # ----------------------------------------------------------------- phases and peaks
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute allocations in this block to phase ``name``."""
        prev = self.current_phase
        self.current_phase = name
        pk = self.phase_peak.get(name)
        if pk is None or self.current_bytes > pk.bytes:
            self.phase_peak[name] = PeakInfo(self.current_bytes, len(self._events) - 1, name)
        try:
            yield
        finally:
            self.current_phase = prev

    def reset_peaks(self) -> None:
        """Start a new measurement window at the current live bytes (like reset_peak_memory_stats)."""
        idx = len(self._events) - 1
        self.peak = PeakInfo(self.current_bytes, idx)
        self.phase_peak = {}
        self._start_bytes = self.current_bytes
        self._start_event = idx
        self.late_registered = 0

    def live_bytes_by_category(self, event: int | None = None) -> dict[str, int]:
        """Live bytes per category after event ``event`` (default: now)."""
        if event is None:
            event = len(self._events) - 1
        live: dict[int, int] = {}
        for sid, delta in self._events[: event + 1]:
            live[sid] = live.get(sid, 0) + delta
        out = dict.fromkeys(CATEGORIES, 0)
        for sid, nb in live.items():
            if nb:
                out[self._all[sid].category] += nb
        return out

    def bytes_by_tag(self, event: int | None = None) -> dict[str, int]:
        """Live bytes per tag after event ``event`` (default: now)."""
        if event is None:
            event = len(self._events) - 1
        live: dict[int, int] = {}
        for sid, delta in self._events[: event + 1]:
            live[sid] = live.get(sid, 0) + delta
        out: dict[str, int] = {}
        for sid, nb in live.items():
            tag = self._all[sid].tag
            if nb and tag:
                out[tag] = out.get(tag, 0) + nb
        return out

    def live_storages(self, event: int | None = None) -> list[dict[str, object]]:
        """The storages live after event ``event`` (default: now), largest first (diagnostics)."""
        if event is None:
            event = len(self._events) - 1
        live: dict[int, int] = {}
        for sid, delta in self._events[: event + 1]:
            live[sid] = live.get(sid, 0) + delta
        rows = []
        for sid, nb in live.items():
            if nb:
                r = self._all[sid]
                rows.append(dict(sid=sid, bytes=nb, category=r.category, op=r.op, phase=r.phase,
                                 shape=r.shape, dtype=r.dtype))
        return sorted(rows, key=lambda d: (-int(d["bytes"]), int(d["sid"])))

    def timeline(self, max_points: int = 400) -> list[tuple[str, int]]:
        """Live bytes over the window as (phase, bytes) points, at most ``max_points``.

        The window is cut into equal runs of events; each run keeps its largest value, so every
        peak survives the downsampling.
        """
        trace = self._trace[self._start_event + 1:]
        if not trace:
            return []
        step = max(1, -(-len(trace) // max_points))
        out = []
        for i in range(0, len(trace), step):
            ph, nb = max(trace[i:i + step], key=lambda t: t[1])
            out.append((ph or "", nb))
        return out

    def report(self) -> TrackerReport:
        """Peaks and category breakdowns since the last :meth:`reset_peaks`."""
        phases = {k: v.bytes for k, v in self.phase_peak.items()}
        peak_phase = self.peak.phase
        if peak_phase is None and phases:  # the peak was already reached when the window began
            peak_phase = max(phases, key=lambda k: (phases[k], -_phase_order(k)))
        return TrackerReport(
            peak_bytes=self.peak.bytes,
            peak_phase=peak_phase,
            phase_peaks=phases,
            categories_at_peak=self.live_bytes_by_category(self.peak.event),
            phase_categories={k: self.live_bytes_by_category(v.event) for k, v in self.phase_peak.items()},
            start_bytes=self._start_bytes,
            end_bytes=self.current_bytes,
            late_registered=self.late_registered,
            storages_seen=self._next_sid,
            timeline=self.timeline(),
            tags_at_peak=self.bytes_by_tag(self.peak.event),
        )


def _phase_order(name: str) -> int:
    return PHASES.index(name) if name in PHASES else len(PHASES)


def _op_name(func: object) -> str:
    pkt = getattr(func, "_overloadpacket", None)
    return getattr(pkt, "__name__", "") if pkt is not None else ""


def _has_storage(t: torch.Tensor) -> bool:
    try:
        t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return False
    return True
