"""Canonical units and their formatting (DESIGN.md §3.1).

Inside trainledger: bytes (int), seconds (float), FLOP counts, FLOP/s and bytes/s. Vendor units
(GB/s, Gbit/s, TFLOP/s, "80GB") are converted once, at the edges, with the helpers below.

Reports show GiB (what ``nvidia-smi`` and ``torch.cuda`` show) and decimal parameter counts
(8.03 B — never 1024-based).
"""

from __future__ import annotations

import math
import re

from trainledger.errors import SpecError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4

TERA = 1e12
PETA = 1e15
BITS_PER_BYTE = 8

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

#: bytes per element of each dtype name used in recipes.
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    # block-scaled formats, payload + shared scale per element (OCP Microscaling Formats (MX) v1.0
    # spec, Table 1: MXFP8 E4M3/E5M2 and MXFP4 E2M1 elements, one 8-bit E8M0 scale per 32-element
    # block; NVIDIA NVFP4 (arXiv:2509.25149, "NVFP4 format"): E2M1 elements, one E4M3 scale per 16 elements plus
    # one fp32 scale per tensor, which is negligible per element and left out)
    "mxfp8": 1 + 1 / 32,
    "mxfp4": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "int8": 1,
    "nf4": 0.5,
    "int4": 0.5,
}


def gib(n_bytes: float) -> float:
    """Bytes -> GiB (2**30)."""
    return n_bytes / GIB


def gbit_per_s_to_bytes(gbit_per_s: float) -> float:
    """A link rate in Gbit/s (how NICs are sold) -> bytes/s."""
    return gbit_per_s * 1e9 / BITS_PER_BYTE


def gb_per_s_to_bytes(gb_per_s: float) -> float:
    """A rate in decimal GB/s (how datasheets state HBM, NVLink, PCIe) -> bytes/s."""
    return gb_per_s * 1e9


def tflops_to_flop_per_s(tflops: float) -> float:
    """TFLOP/s (datasheets) -> FLOP/s."""
    return tflops * TERA


def fmt_bytes(n_bytes: float, digits: int = 2) -> str:
    """Format bytes in binary units, e.g. 85899345920 -> '80.00 GiB'."""
    if n_bytes is None or (isinstance(n_bytes, float) and not math.isfinite(n_bytes)):
        return "n/a"
    sign = "-" if n_bytes < 0 else ""
    v = abs(float(n_bytes))
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if v >= size:
            return f"{sign}{v / size:.{digits}f} {unit}"
    return f"{sign}{v:.0f} B"


def fmt_params(n: float) -> str:
    """Format a parameter count in decimal units: 8030261248 -> '8.03 B'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f}"


def fmt_flops(n: float) -> str:
    """Format a FLOP count: 1.2e18 -> '1.20 EFLOP'."""
    for unit, size in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} FLOP"


def fmt_rate(bytes_per_s: float) -> str:
    """Format a bandwidth in decimal GB/s (how links are sold)."""
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.2f} TB/s"
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.1f} GB/s"
    return f"{bytes_per_s / 1e6:.1f} MB/s"


def fmt_seconds(s: float) -> str:
    """Format a duration: 0.0123 -> '12.3 ms', 3e6 -> '34.7 days'."""
    if s is None or not math.isfinite(s):
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    if s < 2 * SECONDS_PER_DAY:
        return f"{s / 3600:.1f} h"
    return f"{s / SECONDS_PER_DAY:.1f} days"


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]?i?B?)?\s*$", re.I)
_SIZE_MULT = {
    "": 1, "B": 1,
    "K": KB, "KB": KB, "KIB": KIB, "KI": KIB,
    "M": MB, "MB": MB, "MIB": MIB, "MI": MIB,
    "G": GB, "GB": GB, "GIB": GIB, "GI": GIB,
    "T": TB, "TB": TB, "TIB": TIB, "TI": TIB,
}


def parse_bytes(text: str | int | float) -> int:
    """Parse '1GiB', '512 MiB', '4k' or 1024 into bytes. Decimal suffixes are powers of 1000."""
    if isinstance(text, (int, float)):
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m:
        raise SpecError(f"cannot read size {text!r}: use a number with a unit such as 512MiB or 1GiB")
    value, unit = m.groups()
    mult = _SIZE_MULT.get((unit or "").upper())
    if mult is None:
        raise SpecError(f"unknown size unit in {text!r}: use B, KiB, MiB, GiB, TiB (or KB, MB, GB)")
    return int(float(value) * mult)


_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBT]?)\s*$", re.I)


def parse_count(text: str | int | float) -> int:
    """Parse a decimal count such as '2B' tokens, '300M', '1.5T' or '1e9'."""
    if isinstance(text, (int, float)):
        return int(text)
    m = _COUNT_RE.match(str(text))
    if not m:
        raise SpecError(f"cannot read count {text!r}: use e.g. 2B, 300M, 1.5T or 1e9")
    value, unit = m.groups()
    mult = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[unit.upper()]
    return int(float(value) * mult)
