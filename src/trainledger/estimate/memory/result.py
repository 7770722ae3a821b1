"""The memory section of an Estimate (:class:`MemoryEstimate`) and how its terms map to a measurement's.

A result type only: ``estimate_memory`` (the package) builds it for training and plain inference,
``trainledger.estimate.serving.section`` for paged serving engines; neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainledger.units import gib
from trainledger.estimate.terms import Term


#: breakdown term -> the category ``trainledger.verify.memtrace`` files the same bytes under
#: (used to compare an estimate with a measurement term by term).
MEASURED_CATEGORY: dict[str, str] = {
    "weights": "weights", "master_weights": "weights", "gradients": "gradients",
    "optimizer_states": "optimizer_states", "optimizer_temporaries": "optimizer_temporaries",
    "autocast_weight_copies": "autocast_weight_copies", "activations": "activations",
    "logits": "logits", "dynamic_cache": "activations", "kv_cache": "activations",
    "ddp_buckets": "sharding_buffers", "zero_buffers": "sharding_buffers", "other": "activations",
    "pipeline_buffers": "other",
}


def by_measured_category(breakdown: dict[str, int]) -> dict[str, int]:
    """Fold an estimate's breakdown into the measurement's categories."""
    out: dict[str, int] = {}
    for k, v in breakdown.items():
        cat = MEASURED_CATEGORY.get(k, "other")
        out[cat] = out.get(cat, 0) + v
    return out


@dataclass
class MemoryEstimate:
    """The memory section of an Estimate (bytes per GPU)."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    phases: dict[str, int]
    timeline: list[tuple[str, int]]
    usable_bytes: int
    headroom: float
    host_bytes: int
    terms: list[Term]
    runtime_terms: dict[str, int]
    suggestions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    framework: str = "hf"  # the runtime whose memory semantics were assumed

    @property
    def budget_bytes(self) -> int:
        return int(self.usable_bytes * (1 - self.headroom))

    @property
    def fits(self) -> bool:
        return self.device_total_bytes <= self.budget_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_total_bytes": self.device_total_bytes,
            "peak_phase": self.peak_phase,
            "breakdown": dict(self.breakdown),
            "phases": dict(self.phases),
            "timeline": [{"point": p, "bytes": b} for p, b in self.timeline],
            "fits": self.fits,
            "usable_bytes": self.usable_bytes,
            "budget_bytes": self.budget_bytes,
            "headroom": self.headroom,
            "host_bytes": self.host_bytes,
            "runtime": dict(self.runtime_terms),
            "terms": [t.to_dict() for t in self.terms],
            "suggestions": list(self.suggestions),
            "notes": list(self.notes),
            "framework": self.framework,
        }

    def summary(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (f"peak {gib(self.peak_allocated_bytes):.2f} GiB allocated ({self.peak_phase}), "
                f"{gib(self.device_total_bytes):.2f} GiB on the device: {verdict} in "
                f"{gib(self.budget_bytes):.2f} GiB usable under {self.framework}")
