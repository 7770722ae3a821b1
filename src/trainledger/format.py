"""Text tables, JSON with finite numbers, and the notebook views of result objects.

Tables and JSON are what every edge (CLI, verify, report, web) prints.

JSON has neither NaN nor infinity: ``finite_json`` turns them into null (a break-even that never
comes, an unpriced GPU's cost), so every JSON writer produces strict JSON.

Notebook views: a one-line ``repr``, an HTML table (``_repr_html_``) and ``to_pandas()`` for
:class:`~trainledger.estimate.Estimate` and :class:`~trainledger.planner.search.SearchResult`
(their methods call the ``estimate_*`` / ``search_*`` functions here); pandas is optional.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from trainledger.errors import MissingDependency
from trainledger.units import GIB


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


# ---------------------------------------------------------------- notebook views


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise MissingDependency("to_pandas() needs pandas: pip install pandas") from None
    return pd


def _layout(plan: Any) -> str:
    lay, c = plan.layout, plan.cluster
    return (f"{c.world_size}× {c.gpu.name} dp{lay.dp_size} tp{lay.tp} pp{lay.pp} cp{lay.cp} "
            f"zero{lay.zero} [{plan.runtime.framework}]")


# ----------------------------------------------------------------------------- Estimate
def estimate_repr(est: Any) -> str:
    p, m = est.plan, est.memory
    verdict = "fits" if m.fits else "DOES NOT FIT"
    step = f"; step {est.compute.step_time_s:.3g} s" if est.compute is not None else ""
    return (f"<Estimate {p.model.name} {p.recipe.method} {p.recipe.precision} seq {p.recipe.seq_len} on "
            f"{_layout(p)}: {m.device_total_bytes / GIB:.2f} GiB/GPU of {m.budget_bytes / GIB:.2f} — "
            f"{verdict}{step}>")


def estimate_rows(est: Any) -> list[tuple[str, str]]:
    p, m = est.plan, est.memory
    rows = [("model", f"{p.model.name} ({p.model.params.total / 1e9:.2f} B params)"),
            ("recipe", f"{p.recipe.method}, {p.recipe.precision}, seq {p.recipe.seq_len}, "
                       f"mb {p.recipe.micro_batch} × ga {p.recipe.grad_accum}"),
            ("layout", _layout(p)),
            ("peak allocated", f"{m.peak_allocated_bytes / GIB:.2f} GiB ({m.peak_phase})"),
            ("on the device", f"{m.device_total_bytes / GIB:.2f} GiB of {m.budget_bytes / GIB:.2f} GiB budget"),
            ("verdict", "fits" if m.fits else "DOES NOT FIT")]
    if est.compute is not None:
        c = est.compute
        rows += [("step time", f"{c.step_time_s:.4g} s"), ("tokens/s", f"{c.tokens_per_s:,.0f}"),
                 ("MFU", f"{100 * c.mfu:.1f}%")]
    if est.time is not None and getattr(est.time, "total_s", None):
        rows.append(("run time", f"{est.time.total_s / 3600:.1f} h"))
    return rows


def estimate_html(est: Any) -> str:
    m = est.memory
    head = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in estimate_rows(est))
    terms = sorted(m.breakdown.items(), key=lambda kv: -kv[1])
    body = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{v / GIB:.2f}</td></tr>"
                   for k, v in terms)
    return (f"<table>{head}</table><table><thead><tr><th>memory term</th><th>GiB</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def estimate_frame(est: Any) -> Any:
    """Memory terms as rows (term, bytes, GiB, share of the peak); the summary in ``df.attrs``."""
    pd = _pandas()
    m = est.memory
    peak = m.peak_allocated_bytes or 1
    rows = [{"term": k, "bytes": v, "gib": v / GIB, "share": v / peak}
            for k, v in sorted(m.breakdown.items(), key=lambda kv: -kv[1])]
    df = pd.DataFrame(rows, columns=["term", "bytes", "gib", "share"])
    df.attrs["summary"] = dict(estimate_rows(est))
    return df


# ----------------------------------------------------------------------------- SearchResult
def _cand_row(c: Any) -> dict[str, Any]:
    d = c.to_dict()
    e, lay = d["estimate"], d["layout"]
    return {"gpu": d["gpu"], "gpus": d["gpus"], "layout": " ".join(f"{k}{v}" for k, v in lay.items()
                                                                    if isinstance(v, (int, bool))),
            "memory_gib": e["memory_gib"], "step_time_s": e["step_time_s"], "mfu": e["mfu"],
            "days": e.get("days"), "cost_usd": e.get("cost_usd"), "pareto": d["pareto"]}


def search_repr(res: Any) -> str:
    best = res.plans[0] if res.plans else None
    top = f"; best {_layout(best.plan)}" if best else ""
    return f"<SearchResult {len(res.plans)} plans, {len(res.rejected)} rejected of {res.evaluated}{top}>"


def search_html(res: Any, limit: int = 20) -> str:
    rows = [_cand_row(c) for c in res.plans[:limit]]
    if not rows:
        return f"<p>{html.escape(search_repr(res))}</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)

    def cell(v: Any) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v)
        return f"<td>{html.escape(text)}</td>"

    body = "".join("<tr>" + "".join(cell(r[c]) for c in cols) + "</tr>" for r in rows)
    return f"<p>{html.escape(search_repr(res))}</p><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def search_frame(res: Any) -> Any:
    pd = _pandas()
    return pd.DataFrame([_cand_row(c) for c in res.plans])
