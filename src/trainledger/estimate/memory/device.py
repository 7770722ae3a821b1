"""Runtime knobs of the memory model: CUDA context, library workspaces, allocator reserve.

Defaults come from ``catalog/runtime/cuda.yaml`` (each with its source); ``MemoryOptions``
overrides them. None of these is part of ``torch.cuda.max_memory_allocated``: the context and the
allocator's cached-but-free memory show up only in ``nvidia-smi`` / ``memory_reserved``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainledger.load.catalog import catalog_dir, read_data_file
from trainledger.errors import CatalogError
from trainledger.units import MIB


@dataclass(frozen=True, slots=True)
class RuntimeDefaults:
    context_bytes: int
    context_source: str
    workspace_bytes: int
    workspace_source: str
    reserve_fraction: float
    reserve_source: str
    segment_bytes: int
    ddp_bucket_bytes: int
    paged_block_tokens: int
    paged_block_source: str


@lru_cache(maxsize=1)
def runtime_defaults() -> RuntimeDefaults:
    """Load ``catalog/runtime/cuda.yaml`` once."""
    path = catalog_dir("runtime") / "cuda.yaml"
    data = read_data_file(path)
    try:
        return RuntimeDefaults(
            context_bytes=int(data["cuda_context_mib"] * MIB),
            context_source=str(data["cuda_context_source"]),
            workspace_bytes=int((data["cublas_workspace_mib"] + data["cublaslt_workspace_mib"]) * MIB),
            workspace_source=str(data["cublas_workspace_source"]),
            reserve_fraction=float(data["allocator_reserve_fraction"]),
            reserve_source=str(data["allocator_reserve_source"]),
            segment_bytes=int(data["allocator_segment_mib"] * MIB),
            ddp_bucket_bytes=int(data["ddp_bucket_mib"] * MIB),
            paged_block_tokens=int(data["paged_kv_block_tokens"]),
            paged_block_source=str(data["paged_kv_block_source"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"{path}: missing or invalid field {exc}; see the file's comments") from None
