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
from trainledger.spec.plan import Plan
from trainledger.spec.runtime import DEEPEP_CONFIGS, DEEPEP_NVL_PEERS
from trainledger.units import DTYPE_BYTES, MIB


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


#: DeepEP's normal kernels run on ``Buffer.num_sms`` SMs, two per channel (deep_ep/buffers/legacy.py
#: ``num_sms = 20``; Megatron-Core's --moe-deepep-num-sms and torchtitan keep 20)
DEEPEP_NUM_SMS = 20
#: per-token metadata slots of its buffers (csrc/legacy/config.hpp): top-k indices and weights for
#: up to 128 experts, 128 scales, the SourceMeta (two ints) and an int4
_DEEPEP_TOPK, _DEEPEP_SCALES, _DEEPEP_META, _INT4 = 128, 128, 8, 16
#: bytes of its element types: topk_idx_t (int64 in the legacy kernels), the fp32 weights and
#: scales, and the int32 head/tail counters per channel
_IDX, _F32, _I32 = 8, 4, 4


def deepep_buffer_bytes(ep: int, hidden: int, element_bytes: float) -> int:
    """Bytes of the DeepEP ``Buffer`` an EP rank allocates once for dispatch and combine: its NVLink
    buffer (cudaMalloc, IPC-shared) plus, beyond one node, its RDMA buffer (NVSHMEM symmetric heap)
    -- ``Config.get_nvl_buffer_size_hint`` / ``get_rdma_buffer_size_hint`` (csrc/legacy/config.hpp @
    dd758ca) at the larger of the dispatch and combine configs, for ``hidden · max(element, 2)``
    bytes per token (Megatron's and torchtitan's ``get_hidden_bytes``). Outside PyTorch's caching
    allocator: not in ``max_memory_allocated``."""
    if ep <= 1 or ep not in DEEPEP_CONFIGS:
        return 0
    hb = int(hidden * max(element_bytes, 2))
    channels = DEEPEP_NUM_SMS // 2
    rdma = max(ep // DEEPEP_NVL_PEERS, 1)
    nvl = min(ep, DEEPEP_NVL_PEERS)
    per_token = hb + _DEEPEP_META + _DEEPEP_TOPK * (_IDX + _F32) + _DEEPEP_SCALES * _F32
    nvl_bytes = rdma_bytes = 0
    for nvl_recv, rdma_send, rdma_recv in DEEPEP_CONFIGS[ep]:
        b = channels * nvl * ((2 * rdma + 3) * _I32 + nvl_recv * per_token)
        nvl_bytes = max(nvl_bytes, -(-b // 128) * 128)
        if ep > DEEPEP_NVL_PEERS:
            recv = -(-rdma_recv // rdma_send) * rdma_send   # aligned up to the send chunk
            b = channels * rdma * ((DEEPEP_NVL_PEERS * 2 + 2) * 2 * _I32 + recv * 2 * (per_token + _INT4))
            rdma_bytes = max(rdma_bytes, -(-b // 128) * 128)
    return nvl_bytes + rdma_bytes


#: where the ``comm_buffers`` term comes from
DEEPEP_BUFFER_SOURCE = ("DeepEP Buffer (NVLink buffer + RDMA buffer beyond one node) as Megatron-Core / torchtitan "
                        "get_buffer size it: csrc/legacy/config.hpp buffer size hints, deep_ep/buffers/legacy.py configs")


def comm_buffer_bytes(plan: Plan) -> int:
    """Communication buffers a training plan's stack allocates outside the caching allocator:
    DeepEP's (``--moe-dispatcher deepep`` with expert parallelism), else none."""
    m, lay = plan.model, plan.layout
    if plan.runtime.moe_dispatcher != "deepep" or m.moe is None or lay.ep <= 1 or not plan.recipe.is_training:
        return 0
    return deepep_buffer_bytes(lay.ep, m.hidden_size, DTYPE_BYTES.get(plan.recipe.policy["compute"], 2))
