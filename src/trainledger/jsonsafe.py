"""JSON has neither NaN nor infinity: one helper that every JSON writer (CLI, report, web) uses."""

from __future__ import annotations

import math
from typing import Any


def finite_json(o: Any) -> Any:
    """Non-finite floats -> None, recursively; dict keys become strings; tuples become lists."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_json(v) for v in o]
    return o
