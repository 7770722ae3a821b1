"""Text tables and JSON with finite numbers: what every edge (CLI, verify, report, web) prints.

JSON has neither NaN nor infinity: ``finite_json`` turns them into null (a break-even that never
comes, an unpriced GPU's cost), so every JSON writer produces strict JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
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


def _default(o: Any) -> Any:
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "isoformat"):
        return o.isoformat()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def to_json(obj: Any) -> str:
    """Indented strict JSON of results (pydantic models and ``to_dict()`` objects included)."""
    data = json.loads(json.dumps(obj, default=_default))
    return json.dumps(finite_json(data), indent=2, allow_nan=False)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], align: str | None = None) -> str:
    """A plain-text table; ``align`` holds 'l' or 'r' per column (default: numbers right)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    if align is None:
        align = "".join(
            "r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(headers))
        )

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)).rstrip()

    lines = [fmt(headers), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells]
    return "\n".join(lines)
