"""Knobs of an estimate that are not part of the Plan: overrides, prices, facility inputs.

Each section owns its options class; ``EstimateOptions`` bundles them. Empirical defaults live in
the catalog (DESIGN.md §3.2), these are the user's overrides.
"""

from __future__ import annotations

from pydantic import Field

from .._spec import Spec


class MemoryOptions(Spec):
    """Overrides for the memory model (issue 3)."""

    allocator_reserve_fraction: float | None = Field(
        None, ge=0, le=1, description="caching-allocator reserve as a fraction of peak allocated"
    )


class TimeOptions(Spec):
    """Overrides for the time model (issue 4)."""

    mfu: float | None = Field(None, gt=0, le=1, description="force this model-FLOPs utilization")
    matmul_efficiency: float | None = Field(
        None, gt=0, le=1, description="achievable fraction of dense peak for matmuls"
    )


class CostOptions(Spec):
    """Prices and facility inputs (issue 5)."""


class EstimateOptions(Spec):
    memory: MemoryOptions = MemoryOptions()
    time: TimeOptions = TimeOptions()
    cost: CostOptions = CostOptions()
