"""``verify probe``: what hardware is really here, and does it match the plan's cluster?

GPUs come from NVML (nvidia-ml-py, imported lazily): model, memory, driver, CUDA driver version,
current and maximum PCIe generation and width, NVLink state. The GPU-to-GPU topology matrix
uses the levels ``nvidia-smi topo -m`` prints (NVML ``nvmlGpuTopologyLevel_t``,
https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html):

    NV    connected by NVLink (directly, or through NVSwitch)
    PIX   one PCIe switch              (NVML_TOPOLOGY_SINGLE)
    PXB   several PCIe switches        (NVML_TOPOLOGY_MULTIPLE)
    PHB   a PCIe host bridge (the CPU) (NVML_TOPOLOGY_HOSTBRIDGE)
    NODE  host bridges within one NUMA node (NVML_TOPOLOGY_NODE)
    SYS   across NUMA nodes, over the CPU interconnect (NVML_TOPOLOGY_SYSTEM)

NVLink pairs come from ``nvmlDeviceGetNvLinkRemotePciInfo`` on every active link: a link whose
remote end is another GPU joins that pair; links that end on an NVSwitch join every GPU that also
reaches a switch. The host part (CPU cores, NUMA nodes, RAM) reads /proc and /sys — no GPU needed.

``compare_with_plan`` is a pure function over these dicts (tested with synthetic matrices).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from trainledger.units import GIB, fmt_bytes

#: topology levels from closest to farthest.
LEVELS = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
LEVEL_TEXT = {
    "NV": "NVLink", "PIX": "a single PCIe switch", "PXB": "several PCIe switches",
    "PHB": "the PCIe host bridge", "NODE": "host bridges within one NUMA node",
    "SYS": "the CPU interconnect across NUMA nodes",
}
#: NVML nvmlGpuTopologyLevel_t values -> level names (0 = same board counts as a switch).
NVML_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: memory may differ by this fraction from the catalog before it is a finding (ECC, reserved).
MEMORY_TOLERANCE = 0.06


# ---------------------------------------------------------------- host (no GPU needed)
def _physical_cores() -> int | None:
    try:
        pairs = set()
        phys = core = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("physical id"):
                phys = line.split(":")[1].strip()
            elif line.startswith("core id"):
                core = line.split(":")[1].strip()
            elif not line.strip() and core is not None:
                pairs.add((phys, core))
                phys = core = None
        if core is not None:
            pairs.add((phys, core))
        return len(pairs) or None
    except OSError:
        return None


def _numa_nodes() -> list[dict[str, Any]]:
    nodes = []
    for d in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        try:
            cpus = (d / "cpulist").read_text().strip()
        except OSError:
            cpus = ""
        nodes.append({"node": int(d.name[4:]), "cpus": cpus})
    return nodes


def host_info() -> dict[str, Any]:
    """CPU cores (logical and physical), CPU model, NUMA nodes and host RAM."""
    from trainledger.ledger import cpu_model

    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = None
    return {
        "hostname": platform.node(), "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(),
        "physical_cores": _physical_cores(), "numa_nodes": _numa_nodes(), "ram_bytes": ram,
        "python": platform.python_version(),
    }


def software_info() -> dict[str, Any]:
    """torch (with its CUDA build) and transformers versions — from metadata; torch only if loaded."""
    from trainledger.ledger import dist_version

    info: dict[str, Any] = {"torch": dist_version("torch"), "transformers": dist_version("transformers"),
                            "nvidia_ml_py": dist_version("nvidia-ml-py")}
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["torch_cuda_available"] = bool(torch.cuda.is_available())
    except ImportError:
        pass
    return info


# ---------------------------------------------------------------- NVML
def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _try(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises NVMLError_NotSupported etc. per field
        return default


def _nvlinks(nv, handle) -> list[dict[str, Any]]:
    links = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _try(nv.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            continue
        entry: dict[str, Any] = {"link": link, "active": bool(state)}
        if state:
            pci = _try(nv.nvmlDeviceGetNvLinkRemotePciInfo_v2, handle, link) or _try(
                nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            entry["remote_bus_id"] = _s(pci.busId).lower() if pci is not None else None
            rtype = _try(nv.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            entry["remote_type"] = {0: "gpu", 1: "ibmnpu", 2: "switch"}.get(rtype, "unknown")
        links.append(entry)
    return links


def _numa_of(bus_id: str) -> int | None:
    bid = bus_id.lower()
    if len(bid.split(":")[0]) == 8:  # NVML: 00000000:17:00.0 ; sysfs: 0000:17:00.0
        bid = bid[4:]
    try:
        n = int(Path(f"/sys/bus/pci/devices/{bid}/numa_node").read_text().strip())
        return n if n >= 0 else None
    except (OSError, ValueError):
        return None


def _gpu(nv, i: int) -> tuple[dict[str, Any], Any]:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    bus = _s(nv.nvmlDeviceGetPciInfo(h).busId).lower()
    links = _nvlinks(nv, h)
    return {
        "index": i, "name": _s(nv.nvmlDeviceGetName(h)), "uuid": _try(lambda: _s(nv.nvmlDeviceGetUUID(h))),
        "memory_total_bytes": int(mem.total), "bus_id": bus,
        "pcie_gen": _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_gen_max": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_width": _try(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_width_max": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        "nvlinks_active": sum(1 for link in links if link["active"]), "nvlinks": links,
        "numa_node": _numa_of(bus), "power_limit_w": _try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000),
    }, h


def nvlink_pairs(gpus: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """GPU pairs joined by NVLink: direct links to a GPU's bus id, or both on NVSwitches."""
    by_bus = {g["bus_id"]: g["index"] for g in gpus}
    pairs: set[tuple[int, int]] = set()
    switched = []
    for g in gpus:
        on_switch = False
        for link in g.get("nvlinks", []):
            if not link.get("active"):
                continue
            if link.get("remote_type") == "switch":
                on_switch = True
            j = by_bus.get(link.get("remote_bus_id") or "")
            if j is not None and j != g["index"]:
                pairs.add((min(g["index"], j), max(g["index"], j)))
        if on_switch:
            switched.append(g["index"])
    for a in switched:
        for b in switched:
            if a < b:
                pairs.add((a, b))
    return pairs


def topology_matrix(n: int, pcie_level, nv_pairs: set[tuple[int, int]]) -> list[list[str]]:
    """n×n matrix of levels: 'X' on the diagonal, 'NV' for NVLink pairs, else pcie_level(i, j)."""
    m = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j:
                m[i][j] = "NV" if (min(i, j), max(i, j)) in nv_pairs else pcie_level(i, j)
    return m


def probe_gpus() -> dict[str, Any]:
    """Everything NVML tells about the GPUs; {'available': False, 'reason': ...} without one."""
    try:
        import pynvml as nv
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed "
                "(pip install 'trainledger[verify]')", "gpus": []}
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded
        return {"available": False, "reason": f"no NVIDIA driver or GPU found ({_s(exc)})", "gpus": []}
    try:
        count = nv.nvmlDeviceGetCount()
        pairs = [_gpu(nv, i) for i in range(count)]
        gpus = [p[0] for p in pairs]
        handles = [p[1] for p in pairs]

        def pcie_level(i: int, j: int) -> str:
            lvl = _try(nv.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
            return NVML_LEVEL.get(lvl, "SYS") if lvl is not None else "?"

        cuda = _try(nv.nvmlSystemGetCudaDriverVersion)
        return {
            "available": count > 0, "reason": None if count else "NVML found no GPU",
            "driver": _try(lambda: _s(nv.nvmlSystemGetDriverVersion())),
            "cuda_driver": f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None,
            "gpus": gpus, "topology": topology_matrix(count, pcie_level, nvlink_pairs(gpus)),
        }
    finally:
        _try(nv.nvmlShutdown)


def probe() -> dict[str, Any]:
    """The whole probe: host, software and GPUs."""
    return {"host": host_info(), "software": software_info(), "gpu": probe_gpus()}


# ---------------------------------------------------------------- comparison (pure)
def _finding(level: str, text: str) -> dict[str, str]:
    return {"level": level, "text": text}


def compare_topology(matrix: list[list[str]], intra_kind: str, gpus_per_node: int) -> list[dict[str, str]]:
    """Pairs among the first ``gpus_per_node`` GPUs whose link is worse than the plan assumes.

    ``intra_kind`` is the plan's intra-node link kind: 'nvlink' expects NV between every pair;
    'pcie' expects at most a host bridge (PHB) — NODE/SYS pairs cross the CPU.
    """
    n = min(len(matrix), gpus_per_node)
    out = []
    for i in range(n):
        for j in range(i + 1, n):
            lvl = matrix[i][j]
            if intra_kind == "nvlink" and lvl != "NV":
                out.append(_finding("fail", f"plan assumes NVLink between GPU{i} and GPU{j}; "
                                    f"topology shows {LEVEL_TEXT.get(lvl, lvl)} ({lvl})"))
            elif intra_kind == "pcie" and lvl in ("NODE", "SYS"):
                out.append(_finding("warn", f"GPU{i} and GPU{j} talk through "
                                    f"{LEVEL_TEXT[lvl]} ({lvl}); the plan assumes one PCIe fabric"))
    return out


def compare_pcie(gpus: list[dict[str, Any]]) -> list[dict[str, str]]:
    """GPUs whose PCIe link trains below its maximum generation or width.

    Idle GPUs lower their PCIe generation to save power, so a lower generation is a warning to
    re-check under load; a narrower width does not change at idle and is a failure.
    """
    out = []
    for g in gpus:
        gen, gmax, w, wmax = (g.get(k) for k in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"))
        if w and wmax and w < wmax:
            out.append(_finding("fail", f"GPU{g['index']} PCIe link is x{w}, the GPU supports x{wmax}"))
        if gen and gmax and gen < gmax:
            out.append(_finding("warn", f"GPU{g['index']} PCIe runs at Gen{gen} (max Gen{gmax}); "
                                "idle GPUs downclock the link — re-check under load"))
    return out


def gpu_name_matches(seen: str, catalog_name: str) -> bool:
    """Is the NVML name ``seen`` (e.g. 'NVIDIA H100 80GB HBM3') the catalog GPU (e.g. 'h100-sxm')?

    Every part of the catalog name must be a word of the NVML name, except the SXM form factor
    (NVML does not always print it: 'NVIDIA H100 80GB HBM3' is the SXM board) and a memory size
    when NVML prints none; PCIe and NVL must agree both ways ('NVIDIA H100 PCIe', 'NVIDIA H100 NVL').
    """
    import re

    words = set(re.split(r"[^a-z0-9]+", seen.lower())) - {""}
    tokens = [t for t in re.split(r"[^a-z0-9]+", catalog_name.lower()) if t]
    if not tokens or tokens[0] not in words:
        return False
    seen_mem = any(re.fullmatch(r"\d+gb", w) for w in words)
    for t in tokens[1:]:
        if t.startswith("sxm") or t in ("pcie", "nvl") or (re.fullmatch(r"\d+gb", t) and not seen_mem):
            continue
        if t not in words:
            return False
    return all((f in tokens) == (f in words) for f in ("pcie", "nvl"))


def catalog_gpu_for(nvml_name: str, catalog_names: list[str]) -> str | None:
    """The catalog GPU an NVML name belongs to; the most specific (longest) matching name wins."""
    hits = [n for n in catalog_names if gpu_name_matches(nvml_name, n)]
    return max(hits, key=len) if hits else None


def catalog_gpu_here() -> str | None:
    """The catalog GPU torch's current CUDA device is (None without a GPU or outside the catalog)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from trainledger.load.catalog import entries

    return catalog_gpu_for(torch.cuda.get_device_name(), list(entries("gpus")))


def compare_with_plan(found: dict[str, Any], plan: dict[str, Any]) -> list[dict[str, str]]:
    """Findings ('fail'/'warn'/'ok') of a probe against the plan's cluster assumptions.

    ``plan`` keys: gpu_name, gpu_display_name, gpu_memory_bytes, gpus_per_node, intra_kind,
    host_ram_bytes, cpu_cores.
    """
    out: list[dict[str, str]] = []
    gpu = found.get("gpu", {})
    gpus = gpu.get("gpus", [])
    want = plan["gpus_per_node"]
    if len(gpus) < want:
        out.append(_finding("fail", f"plan assumes {want} GPU(s) per node; found {len(gpus)}"
                            + ("" if gpus else f" ({gpu.get('reason') or 'no GPU'})")))
    for g in gpus[:want]:
        if not gpu_name_matches(g["name"], plan["gpu_name"]):
            out.append(_finding("fail", f"plan assumes {plan['gpu_display_name']}; GPU{g['index']} is {g['name']}"))
        mem, plan_mem = g["memory_total_bytes"], plan["gpu_memory_bytes"]
        if abs(mem - plan_mem) > MEMORY_TOLERANCE * plan_mem:
            out.append(_finding("fail" if mem < plan_mem else "warn",
                                f"GPU{g['index']} has {fmt_bytes(mem)}; plan assumes {fmt_bytes(plan_mem)}"))
    if gpus and gpu.get("topology"):
        out += compare_topology(gpu["topology"], plan["intra_kind"], want)
    out += compare_pcie(gpus)
    host = found.get("host", {})
    ram = host.get("ram_bytes")
    if ram and plan.get("host_ram_bytes") and ram < 0.95 * plan["host_ram_bytes"]:
        out.append(_finding("warn", f"host RAM {fmt_bytes(ram)} < plan's {fmt_bytes(plan['host_ram_bytes'])}"))
    cores = host.get("physical_cores") or host.get("logical_cpus")
    if cores and plan.get("cpu_cores") and cores < plan["cpu_cores"]:
        out.append(_finding("warn", f"{cores} CPU cores < plan's {plan['cpu_cores']}"))
    if not any(f["level"] == "fail" for f in out):
        out.append(_finding("ok", "hardware matches the plan's cluster assumptions"
                            if not out else "no failing finding"))
    return out


def plan_assumptions(plan) -> dict[str, Any]:
    """The cluster facts of a Plan that a probe can check."""
    c = plan.cluster
    return {"gpu_name": c.gpu.name, "gpu_display_name": c.gpu.display_name,
            "gpu_memory_bytes": c.gpu.memory_bytes, "gpus_per_node": c.gpus_per_node,
            "intra_kind": c.intra.kind, "host_ram_bytes": c.host_ram_bytes, "cpu_cores": c.cpu_cores}


def render(found: dict[str, Any], findings: list[dict[str, str]] | None) -> str:
    h, sw, g = found["host"], found["software"], found["gpu"]
    lines = [f"host {h['hostname']}: {h['cpu_model']}, {h['physical_cores']} cores "
             f"({h['logical_cpus']} logical), {len(h['numa_nodes'])} NUMA node(s), "
             f"RAM {fmt_bytes(h['ram_bytes'] or 0)}",
             f"software: torch {sw.get('torch')} (CUDA {sw.get('torch_cuda')}), "
             f"transformers {sw.get('transformers')}"]
    if not g.get("available"):
        lines.append(f"GPU: none — {g.get('reason')}")
    else:
        lines.append(f"driver {g['driver']}, CUDA driver {g['cuda_driver']}")
        for x in g["gpus"]:
            lines.append(f"  GPU{x['index']} {x['name']}  {x['memory_total_bytes'] / GIB:.1f} GiB  "
                         f"PCIe Gen{x['pcie_gen']} x{x['pcie_width']} (max Gen{x['pcie_gen_max']} "
                         f"x{x['pcie_width_max']})  NVLinks {x['nvlinks_active']}  NUMA {x['numa_node']}")
        n = len(g["gpus"])
        lines.append("  topology: " + " ".join(f"GPU{j}" for j in range(n)))
        for i, row in enumerate(g["topology"]):
            lines.append(f"  GPU{i:<7} " + " ".join(f"{c:<4}" for c in row))
    for f in findings or []:
        lines.append(f"  {f['level'].upper():<4}  {f['text']}")
    return "\n".join(lines)
