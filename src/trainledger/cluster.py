"""Hardware specs: GPU, link/network, node and cluster.

Catalog files carry vendor units (``memory_gb``, ``hbm_tb_per_s``, ``bf16_tflops``,
``gbit_per_s``); the properties below convert them once to canonical units (bytes, bytes/s,
FLOP/s). Throughputs are *dense* (no 2:4 sparsity) unless a field says otherwise.
"""

from __future__ import annotations

import datetime as _dt
from typing import Literal

from pydantic import Field

from ._spec import Spec
from .errors import CatalogError
from .units import GIB, gb_per_s_to_bytes, gbit_per_s_to_bytes, tflops_to_flop_per_s

LinkKind = Literal["nvlink", "pcie", "infinity-fabric", "gaudi-roce", "infiniband", "ethernet", "roce"]


class NetworkSpec(Spec):
    """A link or network: NVLink, PCIe, InfiniBand, Ethernet/RoCE.

    Bandwidth is per direction. NICs are sold in Gbit/s (``gbit_per_s``); NVLink and PCIe in GB/s
    (``gb_per_s``). Exactly one is given in the file.
    """

    name: str
    display_name: str
    kind: LinkKind
    gb_per_s: float | None = Field(None, gt=0, description="GB/s per direction (bytes, decimal)")
    gbit_per_s: float | None = Field(None, gt=0, description="Gbit/s per direction (bits)")
    latency_us: float = Field(gt=0, description="one-way small-message latency, microseconds")
    source: str
    checked: _dt.date
    notes: str | None = None

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth per direction in bytes/s."""
        if self.gb_per_s is not None:
            return gb_per_s_to_bytes(self.gb_per_s)
        if self.gbit_per_s is not None:
            return gbit_per_s_to_bytes(self.gbit_per_s)
        raise CatalogError(f"network {self.name}: needs gb_per_s or gbit_per_s")

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class GpuSpec(Spec):
    """One accelerator model, from its datasheet. Throughputs are dense peak (no sparsity)."""

    name: str = Field(description="catalog key, e.g. 'h100-sxm'")
    display_name: str
    vendor: Literal["nvidia", "amd", "intel"]
    architecture: str
    form_factor: str = Field(description="SXM, PCIe, OAM, NVL, superchip, ...")
    memory_gb: float = Field(gt=0, description="memory as the vendor states it (e.g. 80 for '80GB')")
    memory_bytes: int = Field(gt=0, description="device memory as the runtime reports it (total)")
    memory_type: str
    hbm_tb_per_s: float = Field(gt=0, description="memory bandwidth, TB/s (decimal)")
    fp32_tflops: float | None = Field(None, gt=0)
    tf32_tflops: float | None = Field(None, gt=0, description="dense, no sparsity")
    bf16_tflops: float | None = Field(None, gt=0, description="dense, no sparsity")
    fp16_tflops: float | None = Field(None, gt=0, description="dense, no sparsity")
    fp8_tflops: float | None = Field(None, gt=0, description="dense, no sparsity")
    int8_tops: float | None = Field(None, gt=0, description="dense, no sparsity")
    link: str = Field(description="intra-node link catalog name, e.g. 'nvlink4' or 'pcie5-x16'")
    link_gb_per_s: float = Field(gt=0, description="GPU-to-GPU bandwidth per GPU, per direction, GB/s")
    tdp_w: float = Field(gt=0, description="board power (TDP/TBP), watts")
    idle_w: float | None = Field(None, gt=0, description="idle power, watts (None: 20% of TDP)")
    source: str
    checked: _dt.date
    notes: str | None = None

    @property
    def usable_bytes(self) -> int:
        """Device memory the runtime can address (context and workspaces are separate terms)."""
        return self.memory_bytes

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12

    @property
    def link_bytes_per_s(self) -> float:
        return gb_per_s_to_bytes(self.link_gb_per_s)

    def peak_flop_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype (fp32, tf32, bf16, fp16, fp8, int8).

        fp8 falls back to the 16-bit rate on GPUs without fp8 tensor cores; tf32 to fp32.
        """
        key = {"int8": "int8_tops"}.get(dtype, f"{dtype}_tflops")
        value = getattr(self, key, None)
        if value is None:
            fallback = {"fp8": "bf16", "tf32": "fp32", "bf16": "fp16", "fp16": "bf16", "int8": "fp8"}
            if dtype in fallback and getattr(self, f"{fallback[dtype]}_tflops", None):
                return tflops_to_flop_per_s(getattr(self, f"{fallback[dtype]}_tflops"))
            raise CatalogError(f"{self.display_name} has no {dtype} throughput in its datasheet")
        return tflops_to_flop_per_s(value)

    def has_native(self, dtype: str) -> bool:
        key = {"int8": "int8_tops"}.get(dtype, f"{dtype}_tflops")
        return getattr(self, key, None) is not None


class StorageSpec(Spec):
    """Shared or local storage the training data and checkpoints live on."""

    name: str = "local-nvme"
    read_gb_per_s: float = Field(6.0, gt=0, description="sequential read, GB/s per node")
    write_gb_per_s: float = Field(3.0, gt=0, description="sequential write, GB/s per node")
    random_read_iops: float = Field(500_000, gt=0, description="4 KiB random-read IOPS per node")


class Cluster(Spec):
    """GPU type × GPUs per node × nodes, with the links between them."""

    gpu: GpuSpec
    gpus_per_node: int = Field(8, gt=0, le=1024)
    nodes: int = Field(1, gt=0, le=1_000_000)
    intra: NetworkSpec = Field(description="GPU-to-GPU link inside a node")
    inter: NetworkSpec | None = Field(None, description="node-to-node network (None: single node)")
    nics_per_node: int = Field(8, gt=0, le=64, description="inter-node NICs per node")
    host_ram_bytes: int = Field(2048 * GIB, gt=0, description="host RAM per node")
    host_mem_bw_gb_per_s: float = Field(300.0, gt=0, description="host memory bandwidth per node, GB/s")
    cpu_cores: int = Field(112, gt=0, description="CPU cores per node")
    storage: StorageSpec = StorageSpec()

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes
