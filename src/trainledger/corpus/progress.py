"""A one-line progress bar with rate and ETA on stderr (only on a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from trainledger.units import fmt_bytes

_WIDTH = 30
_MIN_INTERVAL_S = 0.2


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class ProgressBar:
    """Call with (done, total) bytes; draws at most every 0.2 s; ``close()`` ends the line."""

    def __init__(self, label: str = "reading", stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.t0, self.last, self.drawn = label, time.monotonic(), 0.0, False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < _MIN_INTERVAL_S and done < total):
            return
        self.last, elapsed = now, now - self.t0
        frac = min(done / total, 1.0) if total else 1.0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        bar = "█" * int(_WIDTH * frac)
        self.stream.write(f"\r{self.label} {100 * frac:5.1f}% |{bar:<{_WIDTH}}| {fmt_bytes(done)}/{fmt_bytes(total)} "
                          f"{rate / 1e6:6.1f} MB/s  ETA {_clock(eta)} ")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
