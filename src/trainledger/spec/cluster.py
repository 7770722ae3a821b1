"""Hardware specs: GPU, link/network, node and cluster.

Catalog files carry vendor units (``memory_gb``, ``hbm_tb_per_s``, ``bf16_tflops``,
``gbit_per_s``); the properties below convert them once to canonical units (bytes, bytes/s,
FLOP/s). Throughputs are *dense* (no 2:4 sparsity) unless a field says otherwise.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Literal

from pydantic import Field, model_validator

from trainledger.spec.base import Spec
from trainledger.errors import CatalogError
from trainledger.units import GB, GIB, gb_per_s_to_bytes, gbit_per_s_to_bytes, tflops_to_flop_per_s

LinkKind = Literal["nvlink", "pcie", "infinity-fabric", "gaudi-roce", "infiniband", "ethernet", "roce"]


class NetworkSpec(Spec):
    """A link or network: NVLink, PCIe, Infinity Fabric, InfiniBand, Ethernet/RoCE.

    Bandwidth is per direction. NICs are sold in Gbit/s (``gbit_per_s``, bits); NVLink, PCIe and
    Infinity Fabric in GB/s (``gb_per_s``, decimal bytes). Exactly one of the two is given; the
    other unit is never inferred from a name (a 400 Gbit/s port moves 50e9 bytes/s, not 400e9).

    ``latency_us`` is the per-hop latency of one ring step as NCCL's (RCCL's) own tuning model
    states it for this class of link (``hwLat``, ring, Simple protocol): the alpha of an
    alpha-beta collective model, to be multiplied by the number of steps. NCCL adds a fixed base
    latency per collective on top (several us), which is not a property of the link.
    """

    name: str
    display_name: str
    kind: LinkKind
    scope: Literal["intra-node", "inter-node"] = Field(
        description="GPU-to-GPU inside a node, or node-to-node")
    per: str = Field("per direction", description="what one unit of bandwidth is: per GPU, per port, ...")
    gb_per_s: float | None = Field(None, gt=0, le=10_000, description="GB/s per direction (bytes, decimal)")
    gbit_per_s: float | None = Field(None, gt=0, le=80_000, description="Gbit/s per direction (bits)")
    latency_us: float = Field(gt=0, le=10_000, description=(
        "latency of one step of a ring collective (one hop, small message, Simple protocol), us"))
    latency_source: str | None = Field(None, description="where latency_us comes from (URL)")
    source: str = Field(min_length=1, description="URL of the datasheet or standard")
    checked: _dt.date | None = Field(None, description="date the numbers were checked against source")
    notes: str | None = None

    @model_validator(mode="after")
    def _one_unit(self) -> NetworkSpec:
        if (self.gb_per_s is None) == (self.gbit_per_s is None):
            raise ValueError("gb_per_s / gbit_per_s: give exactly one (GB/s for NVLink/PCIe, "
                             "Gbit/s for NICs)")
        return self

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

    @property
    def bandwidth_label(self) -> str:
        """The bandwidth in the unit it is sold in, bits or bytes spelled out."""
        if self.gbit_per_s is not None:
            return f"{self.gbit_per_s:g} Gbit/s ({self.bytes_per_s / 1e9:g} GB/s)"
        return f"{self.gb_per_s:g} GB/s"


#: dense tensor rates that must not fall below the rate named second (same GPU, datasheet order).
_RATE_ORDER: tuple[tuple[str, str], ...] = (
    ("tf32_tflops", "fp32_tflops"),
    ("bf16_tflops", "fp32_tflops"),
    ("fp16_tflops", "fp32_tflops"),
    ("fp8_tflops", "bf16_tflops"),
    ("fp8_tflops", "fp16_tflops"),
    ("mxfp8_tflops", "bf16_tflops"),
    ("fp4_tflops", "fp8_tflops"),
)
#: catalog field of each compute dtype's peak rate.
_RATE_FIELD = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops",
               "fp16": "fp16_tflops", "fp8": "fp8_tflops", "int8": "int8_tops",
               "mxfp8": "mxfp8_tflops", "mxfp4": "fp4_tflops", "nvfp4": "fp4_tflops"}
#: when a GPU has no rate for a dtype, the rates used instead, in order (the unit that would run it).
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": (), "tf32": ("fp32",), "bf16": ("fp16",), "fp16": ("bf16",),
    "fp8": ("bf16", "fp16"), "int8": ("fp8", "bf16", "fp16"),
    # block-scaled formats have no fallback: a plan refuses them where the rate is missing
    "mxfp8": (), "mxfp4": (), "nvfp4": (),
}
_LINK_RE = re.compile(r"^(?:nvlink(?P<nv>\d)|pcie(?P<pg>\d)-x(?P<pl>\d+))$")


class GpuSpec(Spec):
    """One accelerator model, from its datasheet. Throughputs are dense peak (no sparsity).

    ``memory_gb`` is the capacity as the vendor prints it ("80GB"); ``memory_bytes`` is the total
    device memory the driver reports (``nvidia-smi`` "FB Memory Usage: Total"; ``rocminfo`` global
    pool size) when a published observation exists (``memory_bytes_basis: reported``, URL in
    ``memory_source``), otherwise the printed size taken as GiB (``memory_bytes_basis: stated``).
    """

    name: str = Field(description="catalog key, e.g. 'h100-sxm'")
    display_name: str
    vendor: Literal["nvidia", "amd", "intel"]
    architecture: str
    form_factor: str = Field(description="SXM, PCIe, OAM, NVL, superchip, ...")
    launch_year: int | None = Field(None, ge=2010, le=2035)
    memory_gb: float = Field(gt=0, le=4096, description="memory as the vendor states it (e.g. 80 for '80GB')")
    memory_bytes: int = Field(gt=0, le=4096 * GIB, description="device memory as the runtime reports it "
                              "(total); default: memory_gb taken as GiB")
    memory_bytes_basis: Literal["reported", "stated"] = Field(
        "stated", description="reported: observed driver total (see memory_source); stated: memory_gb as GiB")
    memory_source: str | None = Field(None, description="where the reported total was observed (URL)")
    cuda_total_bytes: int | None = Field(
        None, gt=0, description="device memory CUDA offers a process (cudaMemGetInfo's total, "
        "torch.cuda.get_device_properties().total_memory, the 'total capacity' of a PyTorch OOM message): "
        "the driver total less what the driver keeps for itself; None: not observed, the driver total stands in")
    cuda_total_source: str | None = Field(None, description="where cuda_total_bytes was observed (URL)")
    memory_type: str
    hbm_tb_per_s: float = Field(gt=0, le=50, description="device memory bandwidth, TB/s (decimal)")
    fp32_tflops: float | None = Field(None, gt=0, le=10_000, description="dense FP32 (non-tensor on NVIDIA)")
    tf32_tflops: float | None = Field(None, gt=0, le=100_000, description="dense, no sparsity")
    bf16_tflops: float | None = Field(None, gt=0, le=100_000, description="dense, no sparsity, fp32 accumulate")
    fp16_tflops: float | None = Field(None, gt=0, le=100_000, description="dense, no sparsity, fp32 accumulate")
    fp8_tflops: float | None = Field(None, gt=0, le=100_000, description="dense, no sparsity")
    int8_tops: float | None = Field(None, gt=0, le=100_000, description="dense, no sparsity")
    mxfp8_tflops: float | None = Field(
        None, gt=0, le=100_000, description="dense MXFP8 (block-scaled, OCP MX) tensor rate; None: no MX "
        "tensor cores (Hopper and older)")
    fp4_tflops: float | None = Field(
        None, gt=0, le=100_000, description="dense FP4 (NVFP4/MXFP4, block-scaled E2M1) tensor rate; None: no "
        "FP4 tensor cores")
    link: str = Field(description="intra-node link catalog name, e.g. 'nvlink4' or 'pcie5-x16'")
    link_gb_per_s: float = Field(gt=0, le=10_000,
                                 description="GPU-to-GPU bandwidth per GPU, per direction, GB/s")
    nvlink_generation: int | None = Field(None, ge=1, le=9)
    nvlink_bridge_gb_per_s: float | None = Field(
        None, gt=0, description="optional NVLink bridge between a pair of cards, per direction, GB/s")
    nvlink_domain_size: int | None = Field(None, ge=2, le=1024,
                                           description="GPUs in one NVLink domain (8 for HGX, 72 for NVL72)")
    pcie_gen: int | None = Field(None, ge=1, le=7, description="host interface PCIe generation")
    pcie_lanes: int = Field(16, ge=1, le=32)
    max_gpus_per_node: int | None = Field(None, ge=1, le=1024)
    devices_per_package: int = Field(1, ge=1, le=8, description="runtime devices per sold module")
    sm_count: int | None = Field(None, gt=0, le=4096, description="streaming multiprocessors: the slots a "
                                 "GEMM's output tiles are scheduled on (None: the GPU family's count)")
    tdp_w: float = Field(gt=0, le=5000, description="board power (TDP/TBP), watts")
    idle_w: float | None = Field(None, gt=0, description="idle power, watts (None: 20% of TDP)")
    power_limit_w: float | None = Field(
        None, gt=0, le=5000, description="configured board power limit, watts (nvidia-smi -pl); "
        "below TDP the tensor clock drops (time model: estimate/time/stack.py clock_scale)")
    sparsity_note: str | None = Field(None, description="how sparse datasheet figures were made dense")
    source: str = Field(min_length=1, description="datasheet URL (every bundled file has one)")
    checked: _dt.date | None = Field(None, description="date the numbers were checked against source")
    notes: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_memory_bytes(cls, data: object) -> object:
        if isinstance(data, dict) and "memory_bytes" not in data:
            gb = data.get("memory_gb")
            if isinstance(gb, (int, float)) and not isinstance(gb, bool) and 0 < gb <= 4096:
                data = {**data, "memory_bytes": int(gb * GIB), "memory_bytes_basis": "stated"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GpuSpec:
        problems = gpu_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def usable_bytes(self) -> int:
        """Device memory the runtime can address (context and workspaces are separate terms): what
        CUDA reports as the device's total, which excludes the memory the driver reserves for
        itself (0.25-0.75 GiB on the NVIDIA parts observed, none under ROCm on the MI300X; catalog/gpus
        ``cuda_total_bytes``); where that
        was never observed, the driver's total (optimistic by about that much). The CUDA context
        term (catalog/runtime/cuda.yaml) is measured against the same CUDA total."""
        return self.cuda_total_bytes or self.memory_bytes

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12

    @property
    def link_bytes_per_s(self) -> float:
        return gb_per_s_to_bytes(self.link_gb_per_s)

    def peak_flop_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype (fp32, tf32, bf16, fp16, fp8, int8).

        A dtype the datasheet gives no rate for falls back to the unit that would run it (fp8 and
        int8 to the 16-bit tensor rate, tf32 to fp32, bf16 <-> fp16); see :meth:`has_native`.
        """
        for candidate in (dtype, *_FALLBACK.get(dtype, ())):
            value = getattr(self, _RATE_FIELD.get(candidate, f"{candidate}_tflops"), None)
            if value is not None:
                return tflops_to_flop_per_s(value)
        if dtype not in _RATE_FIELD and dtype not in _FALLBACK:
            raise CatalogError(f"unknown compute dtype {dtype!r}: use one of {', '.join(_FALLBACK)}")
        raise CatalogError(f"{self.display_name} has no {dtype} throughput in its datasheet")

    def has_native(self, dtype: str) -> bool:
        """Whether the datasheet gives a rate for ``dtype`` itself (no fallback)."""
        return getattr(self, _RATE_FIELD.get(dtype, f"{dtype}_tflops"), None) is not None


def gpu_problems(g: GpuSpec) -> list[str]:
    """Cross-field contradictions in a GPU spec, each starting with the field it names."""
    problems = []
    for hi, lo in _RATE_ORDER:
        a, b = getattr(g, hi), getattr(g, lo)
        if a is not None and b is not None and a < b:
            problems.append(f"{hi}: {a:g} is below {lo} {b:g}; tensor rates are at least the rate "
                            f"of the wider type (was a sparse or vector figure used?)")
    if g.int8_tops is not None and g.int8_tops < (g.fp16_tflops or g.bf16_tflops or 0):
        problems.append(f"int8_tops: {g.int8_tops:g} is below the 16-bit tensor rate")
    as_gb, as_gib = g.memory_bytes / (g.memory_gb * GB), g.memory_bytes / (g.memory_gb * GIB)
    if not (0.9 <= as_gb <= 1.1 or 0.9 <= as_gib <= 1.1):
        problems.append(f"memory_bytes: {g.memory_bytes} is not within 10% of memory_gb {g.memory_gb:g} "
                        f"(as GB {as_gb:.2f}x, as GiB {as_gib:.2f}x)")
    if g.memory_bytes_basis == "reported" and not g.memory_source:
        problems.append("memory_source: a reported memory_bytes needs the URL where it was observed")
    if g.cuda_total_bytes is not None:
        if not g.cuda_total_source:
            problems.append("cuda_total_source: cuda_total_bytes needs the URL where it was observed")
        if not 0.95 * g.memory_bytes <= g.cuda_total_bytes <= g.memory_bytes:
            problems.append(f"cuda_total_bytes: {g.cuda_total_bytes} is not within 5% below memory_bytes "
                            f"{g.memory_bytes} (the driver reserves well under a GiB)")
    problems += _link_problems(g)
    return problems


def _link_problems(g: GpuSpec) -> list[str]:
    m = _LINK_RE.match(g.link)
    if m is None:
        return []  # vendor fabrics (infinity-fabric-*, gaudi3-roce) carry no generation in the name
    if m["nv"] is not None and g.nvlink_generation not in (None, int(m["nv"])):
        return [f"nvlink_generation: {g.nvlink_generation} does not match link {g.link!r}"]
    if m["pg"] is not None and g.pcie_gen is not None and (g.pcie_gen, g.pcie_lanes) != (int(m["pg"]), int(m["pl"])):
        return [f"pcie_gen: gen {g.pcie_gen} x{g.pcie_lanes} does not match link {g.link!r}"]
    return []


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
    host_ram_bytes: int | None = Field(2048 * GIB, gt=0, description="host RAM per node (None: not known, not judged)")
    host_mem_bw_gb_per_s: float = Field(300.0, gt=0, description="host memory bandwidth per node, GB/s")
    cpu_cores: int = Field(112, gt=0, description="CPU cores per node")
    storage: StorageSpec = StorageSpec()

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes
