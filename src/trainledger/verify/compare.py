"""Measured vs predicted memory, term by term (``verify memory``).

The estimator (``estimate/memory/``) names its terms after the formulas; the measurement
(``verify/memtrace.py``) names categories after what owns a tensor. This table maps each
estimator term onto the measured category that holds the same tensors:

    estimator term           measured category        why
    weights                  weights                  parameter storages
    master_weights           weights                  an fp32 master copy is a parameter-owned tensor
    gradients                gradients                ``.grad`` of parameters
    optimizer_states         optimizer_states         tensors in ``optimizer.state``
    optimizer_temporaries    optimizer_temporaries    allocated inside ``optimizer.step()``
    autocast_weight_copies   autocast_weight_copies   dtype casts of parameters under autocast
    logits                   logits                   last dim = vocabulary (and fp32 upcasts)
    activations              activations              saved for backward during forward
    dynamic_cache            activations              allocated during the forward
    kv_cache                 activations              allocated during the (inference) forward
    ddp_buckets              other                    not in a single-replica measurement
    zero_buffers             other                    not in a single-replica measurement
    other                    other                    inputs, rotary tables, ...

Terms the estimator adds later map to ``other`` until listed here. Runtime terms (allocator
reserve, CUDA context, library workspaces) are not tensors: the reserve is compared with the
measured ``peak_reserved - peak_allocated`` on CUDA only.
"""

from __future__ import annotations

from typing import Any

from trainledger.estimate.memory import MEASURED_CATEGORY

#: estimator term -> measured category: the one mapping the accuracy suite validates
#: (``trainledger.estimate.memory.MEASURED_CATEGORY``; the estimator's "other" — input ids, rotary
#: tables — is allocated in forward, so the tracker files it under activations).
TERM_TO_CATEGORY: dict[str, str] = MEASURED_CATEGORY
CATEGORIES = ("weights", "gradients", "optimizer_states", "autocast_weight_copies", "logits",
              "optimizer_temporaries", "activations", "other", "sharding_buffers")


def category_of(term: str) -> str:
    return TERM_TO_CATEGORY.get(term, "other")


def predicted_by_category(breakdown: dict[str, int]) -> dict[str, int]:
    """Sum the estimator's terms into the measured categories."""
    out = {c: 0 for c in CATEGORIES}
    for term, value in breakdown.items():
        out[category_of(term)] += int(value)
    return out


def _row(name: str, measured: float | None, predicted: float | None) -> dict[str, Any]:
    err = None
    if measured is not None and predicted is not None and measured > 0:
        err = (predicted - measured) / measured
    return {"name": name, "measured": measured, "predicted": predicted,
            "difference": None if measured is None or predicted is None else predicted - measured,
            "relative_error": err}


def compare_memory(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """Rows of measured vs predicted bytes: per category at the peak, then the totals.

    ``measured`` is ``MemoryMeasurement.to_dict()``; ``predicted`` is ``MemoryEstimate.to_dict()``.
    Relative error = (predicted - measured) / measured.
    """
    pred_cat = predicted_by_category(predicted.get("breakdown", {}))
    meas_cat = measured.get("categories_at_peak") or {}
    rows = [_row(c, meas_cat.get(c, 0), pred_cat.get(c, 0)) for c in CATEGORIES
            if meas_cat.get(c, 0) or pred_cat.get(c, 0)]
    totals = [_row("peak allocated", measured.get("peak_allocated_bytes"), predicted.get("peak_allocated_bytes"))]
    if measured.get("peak_reserved_bytes") is not None:
        totals.append(_row("peak reserved", measured["peak_reserved_bytes"], predicted.get("peak_reserved_bytes")))
    phases = []
    for ph, b in (measured.get("phase_peaks") or {}).items():
        phases.append(_row(ph, b, (predicted.get("phases") or {}).get(ph)))
    return {
        "categories": rows, "totals": totals, "phases": phases,
        "peak_phase": {"measured": measured.get("peak_phase"), "predicted": predicted.get("peak_phase")},
        "mapping": {t: category_of(t) for t in predicted.get("breakdown", {})},
    }


def compare_time(measured_s: float | None, predicted_s: float | None, device: str) -> dict[str, Any] | None:
    """Measured vs predicted step time; only meaningful on the GPU the plan names."""
    if measured_s is None:
        return None
    row = _row("step time", measured_s, predicted_s)
    if device != "cuda":
        row["note"] = "measured on CPU; the prediction is for the plan's GPU — not comparable"
    return row


def render_memory(result: dict[str, Any]) -> str:
    from trainledger.format import table
    from trainledger.units import fmt_bytes, fmt_seconds

    m, cmp = result["measured"], result["comparison"]
    if m.get("oom"):
        head = (f"does not fit: out of memory in {m.get('oom_phase')} "
                f"({fmt_bytes(m.get('peak_allocated_bytes') or 0)} allocated)")
    else:
        head = (f"measured on {m['device']}: peak {fmt_bytes(m['peak_allocated_bytes'])} allocated in "
                f"{m.get('peak_phase')}; predicted {fmt_bytes(result['predicted']['peak_allocated_bytes'])} "
                f"in {result['predicted'].get('peak_phase')}")

    def pct(r: dict[str, Any]) -> str:
        return "" if r["relative_error"] is None else f"{100 * r['relative_error']:+.1f}%"

    rows = [[r["name"], fmt_bytes(r["measured"] or 0), fmt_bytes(r["predicted"] or 0), pct(r)]
            for r in cmp["categories"] + cmp["totals"]]
    lines = [head, table(rows, ["term (at peak)", "measured", "predicted", "error"], "lrrr")]
    if cmp["phases"]:
        lines.append("phase peaks: " + ", ".join(
            f"{r['name']} {fmt_bytes(r['measured'] or 0)} (predicted "
            f"{'n/a' if r['predicted'] is None else fmt_bytes(r['predicted'])})" for r in cmp["phases"]))
    t = result.get("time")
    if t:
        pred = fmt_seconds(t["predicted"]) if t.get("predicted") else "n/a"
        ratio = m.get("backward_forward_ratio")
        lines.append(f"step time: measured {fmt_seconds(t['measured'])}, predicted {pred}"
                     + (f" ({t['note']})" if t.get("note") else "")
                     + (f"; backward/forward time {ratio:.2f}" if ratio else ""))
    for n in m.get("notes") or []:
        lines.append(f"  note: {n}")
    return "\n".join(lines)
