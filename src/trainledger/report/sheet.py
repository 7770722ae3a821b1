"""The procurement and acceptance sheet: what a vendor must deliver for this plan, and how to check it.

Built from the Plan, its Estimate and the catalogs; every figure is the plan's own assumption, so a
delivery that meets the sheet is a machine the estimate holds on. The delivery checks are
``trainledger verify`` commands with pass thresholds:

* collectives: all_reduce bus bandwidth (nccl-tests definition, doc/PERFORMANCE.md) at least what
  the time model assumes — the link's per-direction datasheet bandwidth times the catalog's
  achievable fraction (``catalog/efficiency/interconnect.yaml``); across nodes a ring is bounded by
  each GPU's share of the node's NICs;
* memory: measured peak allocated within :data:`MEMORY_TOLERANCE` of the prediction;
* scaling: efficiency above :data:`trainledger.verify.scaling.GOOD` (issue 7's "good");
* storage: read bandwidth and IOPS at least what the data pipeline needs (io section).
"""

from __future__ import annotations

from typing import Any

from trainledger.estimate.time.efficiency import link_efficiency
from trainledger.spec.plan import Plan
from trainledger.load.plan import PlanInputs
from trainledger.units import GIB, fmt_bytes, fmt_rate
from trainledger.verify.scaling import GOOD as SCALING_GOOD

#: accepted relative difference between measured and predicted peak memory (issue 8).
MEMORY_TOLERANCE = 0.05

#: NVLink bandwidth of one link, GB/s per direction. NVIDIA NVLink page
#: (https://www.nvidia.com/en-us/data-center/nvlink/): V100 300 GB/s over 6 links, A100 600 GB/s
#: over 12, H100 900 GB/s over 18, Blackwell 1.8 TB/s over 18 (totals are bidirectional).
NVLINK_GB_PER_LINK = {2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}

#: Minimum CUDA toolkit and Linux driver per architecture: CUDA Toolkit release notes, Table 3
#: "CUDA Toolkit and Corresponding Driver Versions" (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/)
#: and the CUDA release that first supports each compute capability (9.0: sm_70, 10.0: sm_75,
#: 11.0: sm_80, 11.1: sm_86, 11.8: sm_89/sm_90, 12.8: sm_100/sm_120). AMD: ROCm release notes
#: (https://rocm.docs.amd.com/en/latest/release/versions.html), MI300 support since ROCm 6.0.
SOFTWARE_MINIMUM: tuple[tuple[str, str], ...] = (
    ("volta", "CUDA >= 9.0, driver >= 384.81"),
    ("turing", "CUDA >= 10.0, driver >= 410.48"),
    ("ga102", "CUDA >= 11.1, driver >= 455.23"),
    ("ampere", "CUDA >= 11.0, driver >= 450.36.06"),
    ("ada", "CUDA >= 11.8, driver >= 520.61.05"),
    ("hopper", "CUDA >= 11.8, driver >= 520.61.05 (FP8 in PyTorch needs CUDA 12)"),
    ("blackwell", "CUDA >= 12.8, driver >= 570.26"),
    ("cdna 3", "ROCm >= 6.0"),
    ("cdna 2", "ROCm >= 5.0"),
    ("gaudi", "Intel Gaudi software suite listing Gaudi 3 in its support matrix"),
)
#: PyTorch release the memory model's runtime terms were measured against (DESIGN.md §1).
REFERENCE_TORCH = "2.13"

#: the plan fields that are `estimate` flags, in the order the CLI lists them.
FLAG_FIELDS = ("model", "gpu", "gpus", "gpus_per_node", "network", "method", "precision", "optimizer",
               "seq_len", "micro_batch", "grad_accum", "global_batch", "recompute", "attention",
               "lora_rank", "tokens", "dp", "tp", "pp", "cp", "ep", "vp", "zero", "offload", "headroom")


def _count(v: float) -> str:
    """A token count as the CLI reads it: 2000000000 -> 2B (exact multiples only)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if v >= size and v % size == 0:
            return f"{int(v // size)}{unit}"
    return f"{int(v)}" if float(v).is_integer() else f"{v:g}"


def plan_flags(inputs: PlanInputs) -> str:
    """The `estimate`-style flags that reproduce ``inputs`` (non-default values only)."""
    default = PlanInputs()
    parts = []
    for f in FLAG_FIELDS:
        v = getattr(inputs, f)
        if v is None or (v == getattr(default, f) and f not in ("model", "gpu", "gpus")):
            continue
        text = _count(v) if f == "tokens" else f"{v:g}" if isinstance(v, float) else str(v)
        parts.append(f"--{f.replace('_', '-')} {text}")
    if inputs.lora_targets != default.lora_targets:
        parts.append("--lora-targets " + ",".join(inputs.lora_targets))
    return " ".join(parts)


def software(arch: str) -> str:
    a = arch.lower()
    for key, text in SOFTWARE_MINIMUM:
        if key in a:
            return text
    return "the vendor's current driver and runtime for this GPU"


def topology_expectation(plan: Plan) -> str:
    """What `nvidia-smi topo -m` (or `rocm-smi --showtopo`) must show between the node's GPUs."""
    g, per = plan.cluster.gpu, plan.cluster.gpus_per_node
    if per == 1:
        return "one GPU per node: no GPU-to-GPU links needed"
    if g.vendor == "amd":
        return "`rocm-smi --showtopo`: link type XGMI between every GPU pair (fully connected, 1 hop)"
    if g.vendor == "intel":
        return "`hl-smi`: all on-board RoCE links between every Gaudi pair up"
    gen = g.nvlink_generation if g.link.startswith("nvlink") else None
    if gen and g.nvlink_domain_size and per <= g.nvlink_domain_size:
        links = round(g.link_gb_per_s / NVLINK_GB_PER_LINK.get(gen, 25.0))
        return (f"`nvidia-smi topo -m`: NV{links} between every GPU pair (NVSwitch, {g.link_gb_per_s:g} GB/s "
                "per GPU per direction); any PIX/PXB/NODE/SYS entry between GPUs is a reject")
    if gen:
        return ("`nvidia-smi topo -m`: NV1/NV2 between hybrid cube-mesh neighbours; pairs without NVLink "
                "must not share a tensor-parallel group")
    return ("`nvidia-smi topo -m`: PIX or PXB between GPUs that share a tensor-parallel group (same PCIe "
            f"switch, P2P at PCIe Gen{g.pcie_gen or '?'} x{g.pcie_lanes}); SYS means traffic crosses the CPU "
            "sockets — acceptable only between data-parallel replicas")


def expected_busbw(plan: Plan) -> tuple[float, str]:
    """All-reduce bus bandwidth (bytes/s) the time model assumes, and over which link."""
    eff = link_efficiency()
    cl = plan.cluster
    intra = eff.bytes_per_s(cl.intra)
    if cl.nodes == 1 or cl.inter is None:
        return intra, cl.intra.name
    nic_share = eff.bytes_per_s(cl.inter) * cl.nics_per_node / cl.gpus_per_node
    return min(intra, nic_share), f"{cl.inter.name} ring ({cl.nics_per_node} NICs per {cl.gpus_per_node} GPUs)"


def _row(item: str, value: str, check: str = "") -> dict[str, str]:
    return {"item": item, "value": value, "check": check}


def hardware_rows(plan: Plan, est: dict[str, Any]) -> list[dict[str, str]]:
    cl, g = plan.cluster, plan.cluster.gpu
    host, io, ck = est.get("host") or {}, est.get("io") or {}, est.get("checkpoint") or {}
    rows = [
        _row("GPU", f"{g.display_name} ({g.form_factor}, {g.architecture})", "`verify probe`: model name"),
        _row("GPU count", f"{cl.world_size} = {cl.nodes} node(s) x {cl.gpus_per_node}", "`verify probe`"),
        _row("GPU memory", f"{g.memory_gb:g} GB {g.memory_type}; runtime total {g.memory_bytes / GIB:.1f} GiB",
             "`nvidia-smi` FB total"),
        _row("GPU-to-GPU link", f"{cl.intra.display_name}: {cl.intra.bandwidth_label} per GPU",
             topology_expectation(plan)),
        _row("NUMA / PCIe", f"each GPU on PCIe Gen{g.pcie_gen or '?'} x{g.pcie_lanes}; GPUs split evenly over the "
             "CPU sockets", "`nvidia-smi topo -m` CPU/NUMA affinity columns; `verify probe`"),
    ]
    if cl.inter is not None:
        rows.append(_row("node network", f"{cl.nics_per_node} x {cl.inter.display_name} ({cl.inter.bandwidth_label}) "
                         "per node", "each GPU shares a PCIe switch with one NIC (PIX/PXB to mlx5_*)"))
    if host:
        load = host.get("model_load_bytes") or 0.0
        need = (f">= {fmt_bytes(load)} per node (while the model loads, {host.get('model_loading')})"
                if load > host["ram_bytes"] else f">= {fmt_bytes(host['ram_bytes'])} per node")
        rows.append(_row("host RAM", need,
                         f"plan assumes {fmt_bytes(host['installed_ram_bytes'])} installed"
                         if host.get("installed_ram_bytes") is not None else "`verify probe` reads it"))
    if io.get("read_bytes_per_s_per_node") is not None:
        rows.append(_row("storage read", f">= {fmt_rate(io['read_bytes_per_s_per_node'])} and "
                         f"{io['iops_per_node']:,.0f} IOPS (4 KiB) per node", "`verify io`"))
    if ck:
        rows.append(_row("storage write / size", f"checkpoint {fmt_bytes(ck['full_bytes'])} written in "
                         f"{ck['write_s']:.0f} s at {ck['inputs']['storage_write_gb_per_s_per_node']:g} GB/s per node; "
                         f"keep {fmt_bytes(ck['storage_bytes'])}", "`verify io` (write)"))
    rows.append(_row("driver / CUDA", software(g.architecture), "`verify probe`"))
    rows.append(_row("PyTorch", f"{REFERENCE_TORCH} (reference runtime of the memory model)", "`verify probe`"))
    return rows


def training_rows(plan: Plan, checkpoint_dir: str | None) -> list[dict[str, str]]:
    r, lay = plan.recipe, plan.layout
    method = f"{r.method} (rank {r.lora_rank})" if r.method in ("lora", "qlora") else r.method
    return [
        _row("model", f"{plan.model.name} ({plan.model.params.total / 1e9:.2f} B parameters)"),
        _row("method / precision", f"{method}, {r.precision}, optimizer {r.optimizer}"),
        _row("layout", f"dp {lay.dp_size} x tp {lay.tp} x pp {lay.pp} x cp {lay.cp} x ep {lay.ep}, "
             f"ZeRO {lay.zero}, offload {lay.offload}, recompute {r.recompute}"),
        _row("sequence and batch", f"seq {r.seq_len:,}, micro-batch {r.micro_batch}, grad-accum "
             f"{plan.global_batch // max(1, r.micro_batch * lay.dp_size)}, global batch {plan.global_batch}"),
        _row("checkpoint location", checkpoint_dir or "to be named (shared storage reachable from every node)"),
    ]


def acceptance_checks(plan: Plan, inputs: PlanInputs, est: dict[str, Any]) -> list[dict[str, str]]:
    """`trainledger verify` commands to run on delivery, each with its pass threshold."""
    flags = plan_flags(inputs)
    cl = plan.cluster
    bw, over = expected_busbw(plan)
    mem = est.get("memory") or {}
    peak = mem.get("peak_allocated_bytes")
    out = [{"command": "trainledger verify probe --json", "pass": "GPU model, count, memory, driver, CUDA "
            "and PyTorch as in this sheet; topology as above", "why": "the machine is the one planned"}]
    if cl.world_size > 1:
        nproc = cl.gpus_per_node if cl.nodes > 1 else cl.world_size
        out.append({"command": f"trainledger verify comm --nproc {nproc} --device cuda --max-size 1GiB",
                    "pass": f"all checks correct; all_reduce busbw >= {bw / 1e9:.0f} GB/s at 1 GiB",
                    "why": f"the step time assumes {fmt_rate(bw)} over {over}"})
    if peak:
        lo, hi = peak * (1 - MEMORY_TOLERANCE), peak * (1 + MEMORY_TOLERANCE)
        out.append({"command": f"trainledger verify memory {flags} --device cuda --json",
                    "pass": f"peak allocated {fmt_bytes(lo)} .. {fmt_bytes(hi)} (predicted {fmt_bytes(peak)} "
                            f"+/- {100 * MEMORY_TOLERANCE:.0f}%); no OOM",
                    "why": "the memory ledger holds on this runtime"})
    if cl.world_size > 1:
        out.append({"command": f"trainledger verify scaling {flags} --nproc {min(cl.world_size, cl.gpus_per_node)} "
                               "--device cuda",
                    "pass": f"scaling efficiency > {SCALING_GOOD:.2f}", "why": "adding GPUs adds throughput"})
    io = est.get("io") or {}
    if io.get("read_bytes_per_s_per_node") is not None:
        out.append({"command": "trainledger verify io --path <dataset dir>",
                    "pass": f"read >= {fmt_rate(io['read_bytes_per_s_per_node'])} and >= "
                            f"{io['iops_per_node']:,.0f} IOPS per node", "why": "the GPUs are never starved"})
    out.append({"command": f"trainledger verify accept {flags} --device cuda",
                "pass": "every item passes (step, checkpoint save, restore in a fresh process, loss continues)",
                "why": "the planned job runs end to end"})
    return out


def procurement_sheet(plan: Plan, inputs: PlanInputs, est: dict[str, Any],
                      checkpoint_dir: str | None = None) -> dict[str, Any]:
    """Hardware, software and training rows, and the delivery checks with thresholds."""
    return {"hardware": hardware_rows(plan, est), "training": training_rows(plan, checkpoint_dir),
            "checks": acceptance_checks(plan, inputs, est), "plan_flags": plan_flags(inputs)}
