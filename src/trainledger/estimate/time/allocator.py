"""Step-time cost of near-capacity memory: the caching allocator's retries (issue 15).

When a plan's predicted memory leaves the caching allocator too little room for its cache, large
allocations miss the cache and the allocator frees every cached block and retries ``cudaMalloc``
(a device synchronize each time). ``estimate.memory.pressure`` counts the expected retries per step
from the step's moments and the GPU's usable bytes; this module prices them with the cost of one
retry (catalog/runtime/cuda.yaml ``allocator_retry_ms``, an estimate with its reasoning there).
Zero when the plan has comfortable headroom; a plan whose live peak exceeds the device gets only
the warning (it will not run, so there is no step to slow down).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from trainledger.estimate.memory.phases import allocator_pressure
from trainledger.estimate.memory.pressure import Pressure
from trainledger.load.catalog import catalog_dir, read_data_file
from trainledger.spec.plan import Plan


class RetryTerm(NamedTuple):
    seconds: float          # added to the step ("allocator_retries" in the breakdown)
    pressure: Pressure
    retry_s: float          # cost of one retry
    source: str


@lru_cache(maxsize=1)
def retry_cost() -> tuple[float, str]:
    """(seconds per allocator retry, its source) from catalog/runtime/cuda.yaml."""
    data = read_data_file(catalog_dir("runtime") / "cuda.yaml")
    return float(data["allocator_retry_ms"]) / 1e3, str(data["allocator_retry_source"])


def allocator_retries(plan: Plan, brief: bool = False) -> RetryTerm:
    """Seconds per step lost to caching-allocator retries (zero with comfortable headroom).
    ``brief``: only the seconds are read (``phases.allocator_pressure``)."""
    p = allocator_pressure(plan, brief=brief)
    cost, src = retry_cost()
    return RetryTerm(p.retries_per_step * cost, p, cost, src)
