"""Knobs of an estimate that are not part of the Plan: overrides, prices, facility inputs.

Each section owns its options class; ``EstimateOptions`` bundles them. Empirical defaults live in
the catalog (DESIGN.md §3.2), these are the user's overrides.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainledger.spec.base import Spec


class MemoryOptions(Spec):
    """Overrides for the memory model (issue 3)."""

    allocator_reserve_fraction: float | None = Field(
        None, ge=0, le=1, description="caching-allocator reserve as a fraction of peak allocated"
    )
    cuda_context_bytes: int | None = Field(None, ge=0, description="CUDA context + kernels, bytes")
    workspace_bytes: int | None = Field(None, ge=0, description="cuBLAS/cuBLASLt workspaces, bytes")
    use_cache: bool = Field(
        False, description="training forward also builds transformers' DynamicCache (use_cache=True)"
    )
    kv_cache: Literal["hf", "paged"] = Field(
        "hf", description="inference KV cache: transformers DynamicCache, or a paged engine (vLLM blocks)"
    )
    suggestions: bool = Field(True, description="when it does not fit, search the cheapest changes")
    device: Literal["gpu", "cpu"] = Field(
        "gpu", description="where the step runs: gpu (the plan's), or cpu for a verification run on the "
        "host, where torch's SDPA dispatches to other kernels (MLA's unequal head dims: math, not fused)"
    )

    @classmethod
    def for_run(cls, torch_device: str) -> "MemoryOptions":
        """The options that predict a verification run on ``torch_device`` (cuda, cpu, or fake:
        FakeTensors live on the CPU and dispatch its kernels)."""
        return cls(device="cpu" if torch_device in ("cpu", "fake") else "gpu")


class TimeOptions(Spec):
    """Overrides for the time model (issue 4)."""

    mfu: float | None = Field(None, gt=0, le=1, description="force this model-FLOPs utilization")
    matmul_efficiency: float | None = Field(
        None, gt=0, le=1, description="achievable fraction of dense peak for matmuls"
    )
    tp_comm_overlap: bool | None = Field(
        None, description="override: the runtime overlaps TP collectives with GEMMs (Megatron-Core "
        "--tp-comm-overlap, torch AsyncTP) [the stack profile's]"
    )
    overlap_grad_reduce: bool = Field(
        True, description="DP gradient reduction bucketed and overlapped with backward"
    )
    ep_comm_overlap: bool = Field(
        False, description="runtime hides the EP all-to-all behind compute (DeepSeek-V3 DualPipe)"
    )
    runtime: Literal["hf", "megatron"] | None = Field(
        None, description="override of the small-op kernels: hf = PyTorch eager + transformers "
        "modules (unfused RMSNorm/RoPE/SwiGLU), megatron = fused kernels (Transformer Engine, "
        "Apex, torch.compile) [the stack profile's]"
    )
    scaling: bool = Field(True, description="add predicted scaling efficiency over GPU counts")


class CostOptions(Spec):
    """Prices, facility and data-pipeline inputs of the energy/cost/io/host/checkpoint sections.

    ``None`` means: take the default from ``catalog/prices/facility.yaml`` (each default has its
    source there) or from the price catalog. Units are in the field names.
    """

    provider: str | None = Field(
        None, description="cloud provider in catalog/prices (aws, gcp, azure, lambda, coreweave); "
        "None: the cheapest catalog price of the tier for the GPU")
    pricing: Literal["on-demand", "reserved", "spot"] = Field("on-demand", description="pricing tier")
    price_per_gpu_hour: float | None = Field(None, gt=0, description="USD per GPU-hour; overrides the catalog")
    prices_file: str | None = Field(None, description="YAML/JSON price file (same shape as catalog/prices/*.yaml)")
    electricity_usd_per_kwh: float | None = Field(None, ge=0, description="electricity price, USD/kWh")
    pue: float | None = Field(None, ge=1.0, le=5.0, description="power usage effectiveness of the facility")
    carbon_kg_per_kwh: float | None = Field(None, ge=0, description="grid CO2 intensity, kg/kWh")
    gpu_power_w: float | None = Field(None, gt=0, description="average power per GPU, W (overrides the model)")
    node_overhead_w: float | None = Field(None, ge=0, description="non-GPU power per node (CPUs, NICs, fans), W")
    server_price_usd: float | None = Field(None, gt=0, description="purchase price of one GPU server, USD")
    gpus_per_server: int | None = Field(None, gt=0, le=1024, description="GPUs in the priced server")
    lifetime_years: float | None = Field(None, gt=0, le=30, description="years the server is written off over")
    maintenance_fraction: float | None = Field(
        None, ge=0, le=2, description="yearly maintenance/support as a fraction of the purchase price"
    )
    utilization: float | None = Field(
        None, gt=0, le=1, description="share of the owned hardware's hours spent on useful jobs"
    )
    storage_read_gb_per_s: float | None = Field(None, gt=0, description="override: storage read GB/s per node")
    storage_write_gb_per_s: float | None = Field(None, gt=0, description="override: storage write GB/s per node")
    storage_iops: float | None = Field(None, gt=0, description="override: 4 KiB random-read IOPS per node")
    data_format: Literal["tokenized", "raw"] = Field(
        "tokenized", description="tokenized: token ids on disk; raw: text tokenized on the fly"
    )
    bytes_per_token: float | None = Field(
        None, gt=0, description="bytes on disk per token (tokenized: 2 or 4 per id; raw: ~4 of text)"
    )
    dataloader_workers: int | None = Field(None, ge=0, le=1024, description="DataLoader workers per GPU")
    tokenizer_bytes_per_s_per_core: float | None = Field(None, gt=0, description="tokenizer speed, bytes/s/core")
    checkpoint_interval_s: float | None = Field(None, gt=0, description="seconds of training between checkpoints")
    checkpoints_kept: int | None = Field(None, gt=0, le=10_000, description="full checkpoints kept on storage")
    failures_per_gpu_hour: float | None = Field(
        None, ge=1e-12, le=1.0, description="unexpected job interruptions per GPU-hour [Llama 3: 419 in 54 days "
        "on 16,384 GPUs = 1.97e-5]")
    restart_s: float | None = Field(None, ge=0, le=7 * 86400, description="seconds from an interruption to "
                                    "training again: detect, reschedule, reload the checkpoint")


class EstimateOptions(Spec):
    memory: MemoryOptions = MemoryOptions()
    time: TimeOptions = TimeOptions()
    cost: CostOptions = CostOptions()
