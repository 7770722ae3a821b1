"""Report sections of a long run: goodput, the facility sheet, and a soak's time series.

Formats and draws what the library computed (``estimate/run/goodput.py``, ``report/facility.py``,
``verify/soak.py``); no arithmetic beyond unit display. The soak charts draw every rank's series
against time with the pass threshold as a dashed line and the injected kill and the recovery as
vertical markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainledger.units import fmt_seconds
from trainledger.report import charts as C

Block = tuple

#: (series key, chart title, unit, threshold key, scale) of the soak charts, when the key has data.
SOAK_CHARTS = (
    ("temperature_c", "Temperature", "°C", "max_temperature_c", 1.0),
    ("clock_mhz", "SM clock (CPU clock on the host)", "MHz", None, 1.0),
    ("power_w", "Power", "W", None, 1.0),
    ("utilization_pct", "Utilization", "%", None, 1.0),
    ("step_time_s", "Step time (median per sample)", "s", None, 1.0),
    ("loss", "Loss", "", None, 1.0),
)


def time_series(title: str, series: Sequence[dict], unit: str, hlines: Sequence[dict] = (),
                marks: Sequence[dict] = ()) -> str:
    """Lines of (x, y) pairs against seconds. series: ``name``, ``xs``, ``ys``; hlines: ``name``, ``y``;
    marks: ``x``, ``label``."""
    xs = [x for s in series for x in s["xs"]] or [0.0, 1.0]
    ys = [y for s in series for y in s["ys"] if y is not None] + [h["y"] for h in hlines]
    x0, x1 = min(xs), max(xs + [min(xs) + 1e-9])
    lo, hi = min(ys + [0.0]), max(ys + [1e-9])
    ticks = C.nice_ticks(hi * 1.05) if lo >= 0 else C.range_ticks(lo, hi)
    y0, ym = ticks[0], ticks[-1]
    plot_h = C.H - C.MT - C.MB - 14

    def X(v: float) -> float:
        return C.ML + (C.W - C.ML - C.MR - 10) * (v - x0) / ((x1 - x0) or 1.0)

    def Y(v: float) -> float:
        return C.MT + 14 + plot_h * (1 - (v - y0) / ((ym - y0) or 1.0))

    body = C._yaxis(ticks, Y, unit, C.tick_format(ticks))
    for v in C.range_ticks(x0, x1):
        if x0 <= v <= x1:
            body.append(C._t(X(v), C.H - C.MB + 16, fmt_seconds(v) if v else "0", 9, "middle"))
    body.append(C._t((C.ML + C.W) / 2, C.H - C.MB + 31, "time since the start", 10, "middle"))
    for h in hlines:
        body.append(C._line(C.ML, Y(h["y"]), C.W - C.MR, Y(h["y"]), C.BAD, 1.5, "6 4"))
        body.append(C._t(C.W - C.MR - 2, Y(h["y"]) - 3, h["name"], 9, "end", fill=C.BAD))
    for i, s in enumerate(series):
        pts = [(X(x), Y(y)) for x, y in zip(s["xs"], s["ys"]) if y is not None]
        if len(pts) > 1:
            body.append(f'<polyline fill="none" stroke="{C.color(i)}" stroke-width="1.5" points="'
                        + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        elif pts:
            body.append(f'<circle cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" r="3" fill="{C.color(i)}"/>')
    for m in marks:
        x = X(m["x"])
        body.append(C._line(x, C.MT + 14, x, C.H - C.MB - 12, "#666", 1, "2 3"))
        body.append(C._t(x + 3, C.MT + 24, m["label"], 9))
    body += C._legend([(s["name"], C.color(i)) for i, s in enumerate(series)]
                      + ([("threshold", C.BAD)] if hlines else []), dashed=[False] * len(series) + [True] * bool(hlines))
    return C._svg(title, body)


def soak_blocks(r: dict[str, Any]) -> list[Block]:
    """The soak section: verdict, checks table, recovery, one chart per recorded quantity."""
    p = r.get("plan") or {}
    head = (f"{p.get('model')}: {r.get('nproc')} {r.get('device')} rank(s) for {fmt_seconds(r.get('duration_s') or 0)}, "
            f"a checkpoint every {fmt_seconds(r.get('checkpoint_interval_s') or 0)}"
            + (f", fault {r['fault']}" if r.get("fault") else "") + f" — verdict {'PASS' if r.get('ok') else 'FAIL'}")
    out: list[Block] = [("p", head)]
    if r.get("crossed"):
        out.append(("list", [f"crossed: {x}" for x in r["crossed"]]))
    out.append(("table", ["check", "status", "detail"], [[c["check"], c["status"], c["detail"]] for c in r["checks"]]))
    rec = r.get("recovery") or {}
    marks = []
    if rec.get("kill_t") is not None:
        marks.append({"x": rec["kill_t"], "label": f"rank {rec['killed_rank']} killed"})
    if rec.get("recovered_t") is not None:
        marks.append({"x": rec["recovered_t"], "label": f"recovered ({rec['recovery_s']:.0f} s)"})
    th = r.get("thresholds") or {}
    series = r.get("series") or {}
    for key, title, unit, tkey, _ in SOAK_CHARTS:
        lines = [{"name": f"rank {k}", "xs": [s["t"] for s in ss if s.get(key) is not None],
                  "ys": [s[key] for s in ss if s.get(key) is not None]} for k, ss in sorted(series.items())]
        lines = [ln for ln in lines if ln["ys"]]
        if not lines:
            continue
        hl = [{"name": f"limit {th[tkey]:g} {unit}", "y": th[tkey]}] if tkey and th.get(tkey) is not None else []
        out.append(("svg", time_series(title, lines, unit, hl, marks)))
    return out


def facility_blocks(sheet: dict[str, Any]) -> list[Block]:
    return [("p", "Before the order: power, racks, UPS, cooling and floor space for the plan's GPU nodes "
                  "(network, storage and management racks are not counted). Every row names its source."),
            ("table", ["item", "value", "source"], [[r["item"], r["value"], r["source"]] for r in sheet["rows"]])]


def goodput_rows(g: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary rows of the goodput section (none when it was not modeled)."""
    if not g or g.get("goodput") is None or g.get("daly_interval_s") is None:
        return []
    rows = [("goodput", f"{100 * g['goodput']:.1f}% with a checkpoint every {fmt_seconds(g['interval_s'])} "
                        f"(Daly optimum {fmt_seconds(g['daly_interval_s'])}; job MTBF {fmt_seconds(g['mtbf_s'])})")]
    if g.get("wall_days") is not None:
        cost = "" if g.get("added_usd") is None else f", ${g['added_usd']:,.0f}"
        rows.append(("with interruptions", f"{g['wall_days']:,.1f} days (+{g['added_days']:,.1f} days{cost}; "
                                           f"{g['interruptions']:,.0f} expected interruptions)"))
    return rows
