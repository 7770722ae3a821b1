"""Serving-engine defaults and serving-kernel knobs, read from catalog/serving/*.yaml.

``resolve(plan)`` turns the plan's ``Serving`` settings (``None`` = engine default) into concrete
numbers once per plan: block size, max sequences, tokens per step, memory utilization.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from trainledger.errors import CatalogError
from trainledger.spec.plan import Plan
from trainledger.units import GIB
from trainledger.estimate.time.efficiency import for_gpu


def _dir() -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / "serving"))


@lru_cache(maxsize=None)
def _read(name: str) -> dict[str, Any]:
    path = _dir() / name
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping")
    return data


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """One engine's resolved settings for one plan."""

    engine: str
    text: str
    block_size: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    cuda_graphs: bool
    cuda_graph_max_batch: int
    cuda_graph_bytes_per_graph: float
    kv_budget: str
    non_torch_bytes: float
    step_overhead_s: float
    latent: bool
    source: str
    native_launch: bool = False  # no per-kernel Python dispatch (TensorRT engines)
    static_batch: bool = False  # the whole batch is prefilled at once (no step budget)
    kv_reads_per_query_head: bool = False  # GQA decode kernel loads K/V once per query head


@dataclass(frozen=True, slots=True)
class ServingKernels:
    """Per-family serving kernel knobs (catalog/serving/kernels.yaml)."""

    decode_hbm_efficiency: float
    attention_decode_efficiency: float
    int4_gemm_efficiency: float
    kernel_overhead_graph_s: float
    kernels_per_layer: int
    fp4_over_fp8: float = 0.0  # dense FP4 tensor rate / dense FP8 rate (0: no FP4 tensor cores)


def kernels_for(plan: Plan) -> ServingKernels:
    data = _read("kernels.yaml")
    fam = for_gpu(plan.cluster.gpu).family
    d = data.get(fam) or data["default"]
    try:
        return ServingKernels(float(d["decode_hbm_efficiency"]), float(d["attention_decode_efficiency"]),
                              float(d["int4_gemm_efficiency"]), float(d["kernel_overhead_graph_s"]),
                              int(d["kernels_per_layer"]), float(d.get("fp4_over_fp8", 0.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"catalog/serving/kernels.yaml: invalid entry {fam!r} ({exc})") from None


def engine_data(engine: str) -> dict[str, Any]:
    data = _read("engines.yaml")
    if engine not in data:
        raise CatalogError(f"catalog/serving/engines.yaml has no engine {engine!r}")
    return data[engine]


def resolve(plan: Plan) -> EngineSettings:
    """Concrete engine settings of ``plan`` (its Serving fields, else the engine's defaults)."""
    s, r = plan.serving, plan.recipe
    d = engine_data(s.engine)
    gpu = plan.cluster.gpu
    large = gpu.memory_bytes >= float(d["large_gpu_gib"]) * GIB and not any(
        x in (gpu.name + " " + gpu.display_name).lower() for x in d.get("large_excludes") or ())
    size = "large" if large else "small"
    latent = s.mla_latent_cache if s.mla_latent_cache is not None else s.engine != "hf"
    util = 1.0 if s.engine == "hf" else s.gpu_memory_utilization
    tp_key = "tp" if plan.layout.tp > 1 else "tp1"
    return EngineSettings(
        engine=s.engine, text=str(d["text"]), block_size=int(s.block_size or d["block_size"]),
        gpu_memory_utilization=util,
        max_num_seqs=int(s.max_num_seqs or d["max_num_seqs"][size]),
        max_num_batched_tokens=int(s.max_num_batched_tokens or d["max_num_batched_tokens"][size]),
        max_model_len=int(s.max_model_len or (r.seq_len + r.generate_len)),
        cuda_graphs=bool(s.cuda_graphs and int(d["cuda_graph_max_batch"]) > 0),
        cuda_graph_max_batch=int(d["cuda_graph_max_batch"]),
        cuda_graph_bytes_per_graph=float(d["cuda_graph_bytes_per_graph"]),
        kv_budget=str(d["kv_budget"]), non_torch_bytes=float(d["non_torch_bytes"][tp_key]),
        step_overhead_s=float(d["step_overhead_s"]), latent=latent, source=str(d["source"]),
        native_launch=bool(d.get("native_launch", False)), static_batch=bool(d.get("static_batch", False)),
        kv_reads_per_query_head=d.get("decode_kv_reads") == "per_query_head",
    )


@lru_cache(maxsize=256)
def capture_summary(max_num_seqs: int, cap: int) -> tuple[int, int]:
    """(how many, the largest) of ``graph_capture_sizes(max_num_seqs, cap)``, remembered per
    argument pair (the engine memory of every serving variant asks)."""
    sizes = graph_capture_sizes(max_num_seqs, cap)
    return len(sizes), max(sizes)


def graph_capture_sizes(max_num_seqs: int, cap: int) -> list[int]:
    """vLLM's default CUDA-graph batch sizes: 1, 2, 4, then multiples of 8 up to 256 and of 16 up
    to min(2·max_num_seqs, cap) (vllm/config/compilation.py, ``cudagraph_capture_sizes``)."""
    top = min(2 * max_num_seqs, cap)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return [x for x in sizes if x <= top]
