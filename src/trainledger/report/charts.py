"""Small SVG charts drawn by our own code: no JavaScript, no network, no chart library.

Each function takes numbers the library already computed and returns one ``<svg>`` string. Only
presentation attributes are used (no ``style=`` attributes), so the charts work in a report
opened from disk and under the web app's Content-Security-Policy alike. All text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

W, H = 720, 340
ML, MR, MT, MB = 64, 16, 28, 84  # margins: left (axis labels), right, top (title), bottom (legend)

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b")
INK, GRID, CAP, BAD = "#222", "#ddd", "#c00", "#c00"


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


#: memory and time terms in a fixed order: a term keeps its colour in every chart, whichever terms
#: the other bars of that chart have (a colour by position shifted when a bar gained a term)
TERM_ORDER = ("weights", "master_weights", "gradients", "optimizer_states", "optimizer_temp",
              "autocast_weight_copies", "activations", "logits", "kv_cache", "ddp_buckets", "zero_buffers",
              "other", "allocator_reserve", "cuda_context", "library_workspaces")


def term_color(name: str) -> str:
    """The colour of a named term, the same in every chart (unknown names: a stable hash)."""
    if name in TERM_ORDER:
        return color(TERM_ORDER.index(name))
    import zlib

    return color(zlib.crc32(name.encode()) % len(PALETTE))


def _t(x: float, y: float, text: str, size: int = 11, anchor: str = "start", fill: str = INK,
       weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-weight="{weight}" font-family="system-ui, sans-serif">{escape(str(text))}</text>')


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str = INK, width: float = 1,
          dash: str | None = None) -> str:
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" stroke-width="{width}"{d}/>'


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str | None = None) -> str:
    t = f"<title>{escape(title)}</title>" if title else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(0.0, w):.1f}" height="{max(0.0, h):.1f}" fill="{fill}">{t}</rect>'


def _svg(title: str, body: list[str], w: int = W, h: int = H) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="100%" role="img" '
            f'aria-label="{escape(title)}" class="chart"><title>{escape(title)}</title>'
            f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>'
            + _t(8, 18, title, 13, weight="bold") + "".join(body) + "</svg>")


def _step(raw: float, mults: tuple[float, ...] = (1, 2, 2.5, 5, 10)) -> float | None:
    """A round step of at least ``raw``; None when ``raw`` is too small or large to round."""
    if not (1e-300 < raw < 1e300):
        return None
    mag = 10 ** math.floor(math.log10(raw))
    return next((m * mag for m in mults if m * mag >= raw), 10 * mag)


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``."""
    if not (top > 0 and math.isfinite(top)):
        return [0.0, 1.0]
    step = _step(top / n)
    if step is None:
        return [0.0, top]
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def _yaxis(ticks: Sequence[float], y_of, unit: str, fmt: str = "{:g}") -> list[str]:
    out = []
    for v in ticks:
        y = y_of(v)
        out.append(_line(ML, y, W - MR, y, GRID))
        out.append(_t(ML - 6, y + 4, fmt.format(v), 10, "end"))
    out.append(_t(12, MT + 10, unit, 10))
    return out


def _legend(items: Sequence[tuple[str, str]], y: float = H - MB + 50, dashed: Sequence[bool] = ()) -> list[str]:
    out, x = [], ML
    for i, (name, col) in enumerate(items):
        if dashed and dashed[i]:
            out.append(_line(x, y - 4, x + 14, y - 4, col, 2, "5 3"))
        else:
            out.append(_rect(x, y - 10, 12, 10, col))
        out.append(_t(x + 17, y, name, 10))
        x += 24 + 6.2 * len(name)
        if x > W - 120:
            x, y = ML, y + 13
    return out


def stacked_bars(title: str, bars: Sequence[dict], terms: Sequence[str], unit: str = "GiB") -> str:
    """Vertical stacked bars. Each bar: ``label``, ``values`` (term -> number in ``unit``),
    ``capacity`` and ``budget`` (drawn as lines over the bar), ``note`` (shown above it)."""
    top = max([sum(b["values"].values()) for b in bars] + [b.get("capacity") or 0 for b in bars] + [1e-9])
    ticks = nice_ticks(top * 1.05)
    ymax = ticks[-1]
    plot_h = H - MT - MB - 14

    def y_of(v: float) -> float:
        return MT + 14 + plot_h * (1 - v / ymax)

    body = _yaxis(ticks, y_of, unit)
    slot = (W - ML - MR) / max(1, len(bars))
    bw = min(70.0, slot * 0.55)
    for i, b in enumerate(bars):
        x = ML + slot * i + (slot - bw) / 2
        acc = 0.0
        for term in terms:
            v = b["values"].get(term, 0.0)
            if v <= 0:
                continue
            body.append(_rect(x, y_of(acc + v), bw, y_of(acc) - y_of(acc + v), term_color(term),
                              f"{term}: {v:.2f} {unit}"))
            acc += v
        for key, dash in (("capacity", None), ("budget", "4 3")):
            if b.get(key):
                y = y_of(b[key])
                body.append(_line(x - 8, y, x + bw + 8, y, CAP, 2, dash))
                if key == "capacity":
                    body.append(_t(x + bw + 10, y + 4, f"{b[key]:.0f}", 9, fill=CAP))
        body.append(_t(x + bw / 2, H - MB + 16, b["label"], 10, "middle"))
        if b.get("note"):
            body.append(_t(x + bw / 2, min(y_of(acc), y_of(b.get("capacity") or 0)) - 6, b["note"], 10, "middle",
                           fill=BAD if b.get("bad") else INK, weight="bold"))
    body += _legend([(t, term_color(t)) for t in terms] + [("capacity", CAP), ("headroom budget", CAP)],
                    dashed=[False] * len(terms) + [False, True])
    return _svg(title, body)


def line_chart(title: str, xs: Sequence[float], series: Sequence[dict], unit: str, x_label: str,
               log_x: bool = True, hlines: Sequence[dict] = (), marks: Sequence[dict] = (),
               y_clip: float | None = None) -> str:
    """Lines over ``xs``. series: ``name``, ``ys`` (None = gap); hlines: ``name``, ``y`` (dashed, in
    the color of the series with the same index, labelled at the right end); marks: ``x``, ``label``
    (vertical marker). Values above ``y_clip`` are drawn at the top edge (hollow: off the scale)."""
    vals = [y for s in series for y in s["ys"] if y is not None] + [h["y"] for h in hlines if h.get("y")]
    top = max(vals + [1e-9])
    if y_clip:
        top = min(top, y_clip)
    ticks = nice_ticks(top * 1.05)
    ymax = ticks[-1]
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    span = (x1 - x0) or 1.0
    plot_h = H - MT - MB - 14

    def X(v: float) -> float:
        return ML + (W - ML - MR - 10) * (fx(v) - x0) / span

    def Y(v: float) -> float:
        return MT + 14 + plot_h * (1 - min(v, ymax) / ymax)

    body = _yaxis(ticks, Y, unit)
    for v in xs:
        body.append(_t(X(v), H - MB + 16, f"{v:,.0f}", 9, "middle"))
    body.append(_t((ML + W) / 2, H - MB + 31, x_label, 10, "middle"))
    last_label = -1e9
    for i, h in sorted(enumerate(hlines), key=lambda ih: -(ih[1].get("y") or 0)):
        if h.get("y"):
            body.append(_line(ML, Y(h["y"]), W - MR, Y(h["y"]), h.get("color", color(i)), 1.5, "6 4"))
            ly = max(Y(h["y"]) - 3, last_label + 11)  # labels never overlap: push down
            body.append(_t(W - MR - 2, ly, h["name"], 9, "end", fill=h.get("color", color(i))))
            last_label = ly
    for i, s in enumerate(series):
        pts = [(X(x), Y(y)) for x, y in zip(xs, s["ys"]) if y is not None]
        if len(pts) > 1:
            body.append(f'<polyline fill="none" stroke="{s.get("color", color(i))}" stroke-width="2" points="'
                        + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        oks = [f and y <= ymax for f, y in zip(s.get("fits") or [True] * len(xs), s["ys"]) if y is not None]
        for (a, b), ok in zip(pts, oks):
            body.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{s.get("color", color(i)) if ok else "#fff"}" '
                        f'stroke="{s.get("color", color(i))}" stroke-width="1.5"/>')
        for x, y in zip(xs, s["ys"]):  # off the scale: an arrow and the real value, not a flat line
            if y is not None and y > ymax:
                body.append(_t(X(x), MT + 10, f"↑ {y:,.0f}", 9, "middle", fill=s.get("color", color(i))))
    for m in marks:
        x = X(m["x"])
        body.append(_line(x, MT + 14, x, H - MB - 12, "#666", 1, "2 3"))
        body.append(_t(x + 3, MT + 24, m["label"], 9))
    body += _legend([(s["name"], s.get("color", color(i))) for i, s in enumerate(series)]
                    + [("capacity budgets (dashed)", "#666")], dashed=[False] * len(series) + [True])
    return _svg(title, body)


def timeline(title: str, points: Sequence[dict], capacity: float | None, unit: str = "GiB") -> str:
    """Memory through one step: ``points`` = [{label, y}] drawn as a step line, capacity dashed."""
    ys = [p["y"] for p in points]
    ticks = nice_ticks(max(ys + [capacity or 0, 1e-9]) * 1.05)
    ymax = ticks[-1]
    plot_h = H - MT - MB - 14
    n = max(1, len(points) - 1)

    def X(i: int) -> float:
        return ML + (W - ML - MR - 20) * i / n

    def Y(v: float) -> float:
        return MT + 14 + plot_h * (1 - v / ymax)

    body = _yaxis(ticks, Y, unit)
    path = []
    for i, p in enumerate(points):
        if i:
            path.append(f"{X(i):.1f},{Y(points[i - 1]['y']):.1f}")
        path.append(f"{X(i):.1f},{Y(p['y']):.1f}")
    body.append(f'<polyline fill="none" stroke="{color(0)}" stroke-width="2.5" points="{" ".join(path)}"/>')
    last = None
    for i, p in enumerate(points):
        body.append(f'<circle cx="{X(i):.1f}" cy="{Y(p["y"]):.1f}" r="3" fill="{color(0)}"/>')
        if p["label"] != last:
            body.append(_t(X(i), H - MB + 16 + 11 * (i % 2), p["label"], 9, "middle"))
        last = p["label"]
    if capacity:
        body.append(_line(ML, Y(capacity), W - MR, Y(capacity), CAP, 1.5, "6 4"))
    body += _legend([("allocated", color(0)), ("capacity", CAP)], dashed=[False, True])
    return _svg(title, body)


def hbars(title: str, items: Sequence[tuple[str, float]], unit: str, fmt: str = "{:.1f}") -> str:
    """Horizontal bars, one per (label, value), largest first as given."""
    h = MT + 24 + 26 * max(1, len(items)) + 20
    top = max([v for _, v in items] + [1e-12])
    body = []
    x0, wmax = 170, W - 170 - 90
    for i, (lab, v) in enumerate(items):
        y = MT + 14 + 26 * i
        body.append(_t(x0 - 8, y + 14, lab, 11, "end"))
        body.append(_rect(x0, y + 3, wmax * v / top, 16, color(i), f"{lab}: {fmt.format(v)} {unit}"))
        body.append(_t(x0 + wmax * v / top + 6, y + 15, f"{fmt.format(v)} {unit}", 10))
    return _svg(title, body, h=h)


def range_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round ticks covering [lo, hi] (not necessarily from zero)."""
    if hi <= lo:
        hi = lo + abs(lo) * 0.1 + 1e-9
    step = _step((hi - lo) / n, (1, 2, 5, 10))
    if step is None:
        return [lo, hi]
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step)) + 1)]


def tick_format(ticks: Sequence[float]) -> str:
    """A format with just enough decimals to tell the ticks apart."""
    step = (ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    if not (step > 0 and math.isfinite(step)):
        return "{:,g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return "{:,.%df}" % decimals if decimals <= 6 else "{:.3g}"


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks between lo and hi (both > 0)."""
    out, e = [], math.floor(math.log10(lo))
    while 10 ** e <= hi * 10:
        out += [m * 10 ** e for m in (1, 2, 5) if lo <= m * 10 ** e <= hi]
        e += 1
    return out or [lo, hi]


def scatter(title: str, points: Sequence[dict], x_unit: str, y_unit: str,
            legend: Sequence[tuple[str, str]] | None = None) -> str:
    """points: ``x`` (> 0, log scale), ``y``, ``label``, ``front`` (Pareto: filled and joined),
    ``bad`` (hollow red). The y axis spans the points' range, not from zero."""
    good = [p for p in points if p.get("x") and p.get("y") is not None]
    if not good:
        return _svg(title, [_t(ML, H / 2, "no points to draw", 12)])
    xlo, xhi = min(p["x"] for p in good) / 1.3, max(p["x"] for p in good) * 1.3
    ylo, yhi = min(p["y"] for p in good), max(p["y"] for p in good)
    pad = (yhi - ylo) * 0.1 or abs(yhi) * 0.05 or 1.0
    yt = range_ticks(max(0.0, ylo - pad), yhi + pad)
    plot_h = H - MT - MB - 14

    def X(v: float) -> float:
        return ML + (W - ML - MR - 20) * (math.log(v) - math.log(xlo)) / (math.log(xhi) - math.log(xlo))

    def Y(v: float) -> float:
        return MT + 14 + plot_h * (1 - (v - yt[0]) / (yt[-1] - yt[0]))

    body = _yaxis(yt, Y, y_unit, tick_format(yt))
    for v in log_ticks(xlo, xhi):
        body.append(_line(X(v), MT + 14, X(v), H - MB, GRID))
        body.append(_t(X(v), H - MB + 16, f"{v:,.4g}", 9, "middle"))
    body.append(_t((ML + W) / 2, H - MB + 31, f"{x_unit} (log scale)", 10, "middle"))
    front = sorted((p for p in good if p.get("front")), key=lambda p: p["x"])
    if len(front) > 1:
        body.append(f'<polyline fill="none" stroke="{color(1)}" stroke-width="2" points="'
                    + " ".join(f"{X(p['x']):.1f},{Y(p['y']):.1f}" for p in front) + '"/>')
    for i, p in enumerate(sorted(good, key=lambda q: q["x"])):
        fill = color(1) if p.get("front") else "#fff" if p.get("bad") else color(0)
        stroke = BAD if p.get("bad") else color(1) if p.get("front") else color(0)
        body.append(f'<circle cx="{X(p["x"]):.1f}" cy="{Y(p["y"]):.1f}" r="5" fill="{fill}" stroke="{stroke}" '
                    f'stroke-width="1.5"><title>{escape(p["label"])}</title></circle>')
        body.append(_t(X(p["x"]), Y(p["y"]) + (-9 if i % 2 else 17), p["label"], 9, "middle"))
    body += _legend(legend if legend is not None else [("Pareto front", color(1)), ("dominated", color(0)),
                                                       ("does not fit", BAD)])
    return _svg(title, body)


def grouped_bars(title: str, rows: Sequence[tuple[str, float, float]], names: tuple[str, str],
                 unit: str = "GiB") -> str:
    """Two bars per row (e.g. measured vs predicted)."""
    top = max([max(a, b) for _, a, b in rows] + [1e-9])
    ticks = nice_ticks(top * 1.05)
    plot_h = H - MT - MB - 14

    def Y(v: float) -> float:
        return MT + 14 + plot_h * (1 - v / ticks[-1])

    body = _yaxis(ticks, Y, unit)
    slot = (W - ML - MR) / max(1, len(rows))
    bw = min(30.0, slot * 0.35)
    for i, (lab, a, b) in enumerate(rows):
        x = ML + slot * i + slot / 2 - bw
        body.append(_rect(x, Y(a), bw, Y(0) - Y(a), color(0), f"{names[0]} {lab}: {a:.3g} {unit}"))
        body.append(_rect(x + bw, Y(b), bw, Y(0) - Y(b), color(1), f"{names[1]} {lab}: {b:.3g} {unit}"))
        body.append(_t(x + bw, H - MB + 16 + 11 * (i % 2), lab, 9, "middle"))
    body += _legend([(names[0], color(0)), (names[1], color(1))])
    return _svg(title, body)
