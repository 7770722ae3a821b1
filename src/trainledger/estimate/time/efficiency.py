"""Achievable fractions of datasheet peaks: one parameter set per GPU family (catalog/efficiency/).

The time model never uses a single fudge factor. Each kind of work runs at its own achievable
rate, described by a documented function of the work's shape:

* GEMM (M×K)·(K×N):  t = max(2MNK / (peak · η), bytes / (HBM · η_hbm)), with the shape penalty
  η(M, N, K) = η_max · Π_x x / (x + d½) over x ∈ {M, N, K}. A GEMM whose dims are all ≫ d½ runs at
  η_max; a thin one (small hidden size, a TP shard of 128 columns, a LoRA rank of 16, an expert fed
  a few hundred tokens) runs slower, and a very thin one falls onto the memory roofline
  (Williams et al. 2009, "Roofline", CACM 52(4)).
* fused attention: executed FLOPs / (peak16 · η_attn · s/(s + s½) · d/(d + d½)) — FlashAttention
  speed grows with sequence length and head dim (Dao 2023, arXiv:2307.08691, Fig. 4);
  η_attn is quoted at head dim :data:`ATTENTION_REF_HEAD_DIM`, d½ is the family's
  ``attention_half_head_dim``.
* streaming kernels (norms, activations, softmax, optimizer): bytes / (HBM · η_hbm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import yaml

from trainledger.spec.cluster import GpuSpec, LinkKind, NetworkSpec
from trainledger.errors import CatalogError

#: head dim at which every family's ``attention_efficiency`` is quoted (the catalog's definition,
#: catalog/efficiency/README.md): the head-dim factor d/(d + d½) is normalised to 1 there
ATTENTION_REF_HEAD_DIM = 128.0


@dataclass(frozen=True, slots=True)
class GpuEfficiency:
    """Efficiency parameters of one GPU family (see catalog/efficiency/README.md)."""

    family: str
    matmul: dict[str, float]
    half_dim: float
    attention: float
    attention_half_seq: float
    attention_half_head_dim: float
    hbm: float
    kernel_overhead_s: float
    matmul_best: dict[str, float] | None = None   # measured best-shape GEMM rate: the stacks' cap
    sm_count: int = 0                              # SMs a GEMM's tiles are scheduled on (0: unknown)
    gemm_tile: tuple[int, int] = (128, 256)        # output tile (M x N) of the large-GEMM kernels

    def matmul_max(self, dtype: str) -> float:
        if dtype not in self.matmul and dtype in ("mxfp8", "nvfp4", "mxfp4") and "fp8" in self.matmul:
            dtype = "fp8"  # no measured block-scaled efficiency yet: the family's fp8 value
        eta = self.matmul.get(dtype)
        return self.matmul["bf16"] if eta is None else eta  # bf16: required at load

    def with_matmul(self, value: float) -> "GpuEfficiency":
        """A copy whose η_max is ``value`` for every dtype (the user's override)."""
        return GpuEfficiency(self.family, {k: value for k in self.matmul}, self.half_dim,
                             self.attention, self.attention_half_seq,
                             self.attention_half_head_dim, self.hbm,
                             self.kernel_overhead_s, self.matmul_best, self.sm_count,
                             self.gemm_tile)


@dataclass(frozen=True, slots=True)
class LinkEfficiency:
    """Interconnect parameters: per-kind bandwidth efficiency and runtime overlap knobs."""

    bandwidth: dict[str, float]
    tp_overlap_fraction: float
    dp_bucket_bytes: float
    step_overhead_s: float
    overlap_slowdown: float = 0.0
    dispatcher: dict[str, float] | None = None  # MoE dispatchers' share of the link rate (1 when absent)

    def dispatcher_efficiency(self, name: str) -> float:
        return (self.dispatcher or {}).get(name, 1.0)

    def bytes_per_s(self, net: NetworkSpec) -> float:
        key = (net.name, net.kind, net.gb_per_s, net.gbit_per_s)
        bw = _BW_CACHE.get(key)
        if bw is None:
            bw = _BW_CACHE[key] = net.bytes_per_s * self.bandwidth[net.kind]  # every kind: at load
        return bw


_BW_CACHE: dict[tuple, float] = {}


def _dir() -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / "efficiency"))


def _read(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping of efficiency parameters")
    return data


def _shared(path: Path, d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with the fields it takes from another family's file (``shared_from: {family: [field,
    ...]}``): a value derived once, on one GPU, is written once, in the file that derives it."""
    out = dict(d)
    for fam, keys in (d.get("shared_from") or {}).items():
        src = _dir() / f"{fam}.yaml"
        if not src.is_file():
            raise CatalogError(f"{path}: shared_from names {fam!r}, which has no {src.name}")
        other = _read(src)
        for k in keys:
            if k in d:
                raise CatalogError(f"{path}: {k} is both set here and shared from {fam}.yaml")
            if k not in other:
                raise CatalogError(f"{path}: shared_from {fam}.yaml: it has no {k}")
            out[k] = other[k]
    return out


@lru_cache(maxsize=None)
def _families() -> tuple[tuple[str, GpuEfficiency, tuple[str, ...]], ...]:
    out = []
    for p in sorted(_dir().glob("*.yaml")):
        if p.stem in ("interconnect", "intervals"):
            continue
        d = _shared(p, _read(p))
        try:
            eff = GpuEfficiency(
                family=str(d["family"]), matmul={k: float(v) for k, v in d["matmul_efficiency"].items()},
                half_dim=float(d["matmul_half_dim"]), attention=float(d["attention_efficiency"]),
                attention_half_seq=float(d["attention_half_seq"]),
                attention_half_head_dim=float(d["attention_half_head_dim"]), hbm=float(d["hbm_efficiency"]),
                kernel_overhead_s=float(d["kernel_overhead_s"]),
                matmul_best={k: float(v) for k, v in (d.get("matmul_best_shape") or {}).items()},
                sm_count=int(d.get("sm_count", 0)),
                gemm_tile=tuple(int(x) for x in d.get("gemm_tile", (128, 256))),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CatalogError(f"{p}: missing or invalid efficiency field ({exc})") from None
        if "bf16" not in eff.matmul:
            raise CatalogError(f"{p}: matmul_efficiency needs a bf16 value (the fallback of the "
                               "dtypes it does not list)")
        out.append((p.stem, eff, tuple(a.lower() for a in d.get("architectures") or ())))
    return tuple(out)


@lru_cache(maxsize=None)
def family_names() -> tuple[str, ...]:
    return tuple(f for f, _, _ in _families())


@lru_cache(maxsize=256)
def gpu_efficiency(architecture: str) -> GpuEfficiency:
    """Efficiency parameters for a GPU architecture name ('Hopper', 'Ampere', 'CDNA3', ...)."""
    arch = architecture.lower().strip()
    fams = _families()
    for _, eff, archs in fams:
        if arch in archs:
            return eff
    for _, eff, archs in fams:  # 'NVIDIA Hopper', 'CDNA 3 (gfx942)'
        if any(a and a in arch for a in archs):
            return eff
    for name, eff, _ in fams:
        if name == "default":
            return eff
    raise CatalogError("catalog/efficiency/default.yaml is missing")


def for_gpu(gpu: GpuSpec) -> GpuEfficiency:
    """The family's efficiency parameters, with this GPU's own SM count where its catalog entry
    gives one and the family models wave quantization (A10 and RTX A6000 are Ampere with 72 and 84
    SMs, not the A100's 108; H100 PCIe has 114 of Hopper's 132)."""
    eff = gpu_efficiency(gpu.architecture)
    if gpu.sm_count and eff.sm_count and gpu.sm_count != eff.sm_count:
        return replace(eff, sm_count=gpu.sm_count)
    return eff


@lru_cache(maxsize=None)
def link_efficiency() -> LinkEfficiency:
    d = _read(_dir() / "interconnect.yaml")
    bw = {k: float(v) for k, v in d["bandwidth_efficiency"].items()}
    missing = sorted(set(get_args(LinkKind)) - set(bw))
    if missing:
        raise CatalogError(f"catalog/efficiency/interconnect.yaml: bandwidth_efficiency lacks the link "
                           f"kind(s) {', '.join(missing)}")
    return LinkEfficiency(
        bandwidth=bw,
        tp_overlap_fraction=float(d["tp_overlap_fraction"]),
        dp_bucket_bytes=float(d["dp_bucket_bytes"]),
        step_overhead_s=float(d["step_overhead_s"]),
        overlap_slowdown=float(d.get("overlap_slowdown", 0.0)),
        dispatcher={k: float(v) for k, v in (d.get("dispatcher_efficiency") or {}).items()},
    )


def gemm_time_s(M: float, K: float, N: float, peak: float, hbm: float, eff: GpuEfficiency,
                eta_max: float, bytes_per_el: float) -> float:
    """Seconds for one (M×K)·(K×N) GEMM: compute at η(M,N,K)·peak or the memory roofline.

    ``half_dim`` is measured on 16-bit GEMMs. Along K it is the depth at which a tile's fixed
    cost (prologue, epilogue: loading the first stages, writing and scaling the M×N tile) equals
    its main loop; the main loop runs at the dtype's tensor-core rate, which is 2/bytes-per-element
    times the 16-bit rate on Hopper and Blackwell (fp8 2x, tf32 1/2x: H100 SXM datasheet), while the
    fixed cost does not shrink, so the half depth along K scales by the same 2/bytes-per-element.
    """
    if M <= 0 or K <= 0 or N <= 0:
        return 0.0
    d = eff.half_dim
    dk = d * 2.0 / bytes_per_el
    eta = eta_max * (M / (M + d)) * (N / (N + d)) * (K / (K + dk))
    t_compute = 2.0 * M * N * K / (peak * eta)
    # the output is written in the 16-bit compute dtype (or fp32) whatever the inputs' width: the
    # fp8 / mxfp8 / nvfp4 GEMMs of Transformer Engine and torchao emit bf16 (TE ``te_gemm``'s D
    # in the activation dtype; torchao ``torch._scaled_mm(..., out_dtype=bf16)``)
    t_memory = (bytes_per_el * (M * K + K * N) + max(bytes_per_el, 2.0) * M * N) / (hbm * eff.hbm)
    return max(t_compute, t_memory)


#: K depth one split of a split-K GEMM needs to keep its pipeline busy: 4 stages of the 64-deep
#: K tile of the Hopper/Ampere bf16 kernels (CUTLASS sm90 / sm80 default mainloops: 64-deep tiles,
#: 3-5 stages)
SPLIT_K_MIN_DEPTH = 256


def wave_efficiency(M: float, N: float, eff: GpuEfficiency, K: float = 0.0) -> float:
    """Share of the SM-slots a GEMM's output tiles fill: tiles / (waves · SMs).

    A GEMM's (M×N) output is cut into tiles, one per thread block, scheduled on the SMs in waves;
    the last wave runs partly empty ("wave quantization", NVIDIA Matrix Multiplication Background
    User's Guide, §"Wave Quantization"). With fewer tiles than SMs the library splits K over up to
    SMs/tiles blocks (split-K: CUTLASS "Efficient GEMM in CUDA", §"Parallelized Reductions"), each
    split at least ``SPLIT_K_MIN_DEPTH`` deep. 1 when the family's SM count is unknown.
    """
    sms = eff.sm_count
    if sms <= 0 or M <= 0 or N <= 0:
        return 1.0
    tm, tn = eff.gemm_tile
    tiles = math.ceil(M / tm) * math.ceil(N / tn)
    if tiles < sms and K > 0:
        tiles *= max(1, min(sms // tiles, int(K // SPLIT_K_MIN_DEPTH)))
    return tiles / (math.ceil(tiles / sms) * sms)


#: Speed of FlashAttention-2 over the FlashAttention-1 generation of fused attention kernels,
#: forward + backward on A100 (Dao 2023, arXiv:2307.08691, §4.1): FA2 is 1.7-3.0x FlashAttention
#: (CUDA), 1.3-2.5x FlashAttention in Triton (1.3-1.5x forward, ~2x backward) and ~2x xformers'
#: kernel. Estimate: 1.9, inside both ranges (the Triton kernel's docstring, flash_attn_triton.py:
#: "Overall Triton forward + backward is slightly slower than CUDA forward + backward").
FA2_OVER_FA1 = 1.9


def attention_efficiency(eff: GpuEfficiency, s: float, d: float, kernel: str = "flash") -> float:
    """η of a fused attention kernel at sequence length s (keys) and head dim d.

    ``eff.attention`` is the rate of the stack's FlashAttention-2-class kernel; ``kernel="flash1"``
    (FA1, Triton FA, xformers: PyTorch < 2.2 era stacks) runs :data:`FA2_OVER_FA1` times slower.
    """
    dh, ref = eff.attention_half_head_dim, ATTENTION_REF_HEAD_DIM
    eta = eff.attention * (s / (s + eff.attention_half_seq)) * (d / (d + dh)) / (ref / (ref + dh))
    return eta / FA2_OVER_FA1 if kernel == "flash1" else eta
