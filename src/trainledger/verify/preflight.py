"""Checks before a measurement starts: will the run fit in this machine's host RAM?

``verify memory --device cpu`` holds the plan's weights, gradients, optimizer states and
activations in host RAM. A plan larger than the RAM is killed by the kernel's OOM killer with no
message, so the predicted peak (the estimate's ``peak_allocated_bytes``, the tensors the run
allocates) is checked against ``MemAvailable`` (Linux ``/proc/meminfo``: the memory that can be
given to a new process without swapping, kernel Documentation/filesystems/proc.rst) first.
"""

from __future__ import annotations

import os

from trainledger.errors import VerifyError
from trainledger.units import fmt_bytes


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, else free physical pages; None when neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_host_ram(model: str, need_bytes: float, available: int | None) -> None:
    """Refuse a CPU measurement whose predicted tensors exceed the available host RAM."""
    if available is None or need_bytes <= available:
        return
    raise VerifyError(
        f"measuring {model} on the CPU needs about {fmt_bytes(need_bytes)} of host RAM (the predicted peak "
        f"of its tensors), this machine has {fmt_bytes(available)} available; the kernel would kill the run. "
        f"Use --device fake (fake-tensor mode: every tensor's shape and dtype, no memory), a smaller model "
        f"or --seq-len, or a machine with more RAM")
