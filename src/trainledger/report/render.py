"""Renderers: the report document as HTML, Markdown, plain text or JSON, and an atomic writer.

HTML is one self-contained file: inline CSS, inline SVG, no script, no external URL — it opens
offline from disk, prints, and can be mailed. Markdown embeds the same SVGs as data: images and
keeps every figure as a table too.
"""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path
from typing import Any

from trainledger.errors import SpecError
from trainledger.report.document import build_document

FORMATS = ("html", "md", "txt", "json")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:1000px;margin:0 auto;
padding:16px 24px;line-height:1.45;font-size:15px}
h1{font-size:1.6em;margin-bottom:.1em}h2{border-bottom:2px solid #4e79a7;padding-bottom:2px;margin-top:1.8em}
h3{margin-bottom:.3em}.meta{color:#555;font-size:.9em}nav a{margin-right:12px}
table{border-collapse:collapse;margin:8px 0 16px;width:100%;font-size:.9em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f2f4f7}
td.num{text-align:right;white-space:nowrap}dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px}
dt{font-weight:600}dd{margin:0}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.88em}
.verdict-fits{color:#2a7d2a;font-weight:700}.verdict-nofit{color:#c00;font-weight:700}
.level-warn{background:#fff4d6}.level-fail{background:#fde2e2}.chart{max-width:100%;height:auto;margin:8px 0}
@media print{nav{display:none}h2{page-break-after:avoid}svg{page-break-inside:avoid}}
"""


def _cell(v: Any) -> str:
    """A table cell: commands as code, `backticked` spans as inline code, the rest escaped."""
    s = str(v)
    if s.startswith("trainledger "):
        return f"<code>{escape(s)}</code>"
    parts = s.split("`")
    if len(parts) % 2 == 0:  # unbalanced: show as is
        return escape(s)
    return "".join(f"<code>{escape(p)}</code>" if i % 2 else escape(p) for i, p in enumerate(parts))


def _html_block(b: tuple) -> str:
    kind = b[0]
    if kind == "p":
        return f"<p>{escape(b[1])}</p>"
    if kind == "h3":
        return f"<h3>{escape(b[1])}</h3>"
    if kind == "svg":
        return b[1]
    if kind == "code":
        return f"<pre><code>{escape(b[1])}</code></pre>"
    if kind == "list":
        return "<ul>" + "".join(f"<li>{escape(x)}</li>" for x in b[1]) + "</ul>"
    if kind == "kv":
        items = []
        for k, v in b[1]:
            cls = ""
            if k == "fit verdict":
                cls = ' class="verdict-fits"' if v == "FITS" else ' class="verdict-nofit"'
            items.append(f"<dt>{escape(k)}</dt><dd{cls}>{escape(v)}</dd>")
        return "<dl>" + "".join(items) + "</dl>"
    if kind == "table":
        head = "".join(f"<th>{escape(h)}</th>" for h in b[1])
        rows = []
        for r in b[2]:
            lvl = f' class="level-{r[1]}"' if len(r) > 1 and r[1] in ("warn", "fail") else ""
            rows.append(f"<tr{lvl}>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    raise ValueError(f"unknown block {kind}")


def to_html(d: Any) -> str:
    secs = build_document(d)
    nav = "".join(f'<a href="#{s["id"]}">{escape(s["title"])}</a>' for s in secs)
    body = "".join(f'<section id="{s["id"]}"><h2>{escape(s["title"])}</h2>'
                   + "".join(_html_block(b) for b in s["blocks"]) + "</section>" for s in secs)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>trainledger report: {escape(d.title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(d.title)}</h1><p class=\"meta\">trainledger {escape(d.version)} · generated "
            f"{escape(d.generated)} · memory in GiB (2<sup>30</sup> bytes), parameters in decimal units</p>"
            f"<nav>{nav}</nav>{body}</body></html>\n")


def _md_escape(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_block(b: tuple) -> str:
    kind = b[0]
    if kind == "p":
        return b[1]
    if kind == "h3":
        return f"### {b[1]}"
    if kind == "svg":
        data = base64.b64encode(b[1].encode()).decode()
        return f"![chart](data:image/svg+xml;base64,{data})"
    if kind == "code":
        return f"```\n{b[1]}\n```"
    if kind == "list":
        return "\n".join(f"- {x}" for x in b[1])
    if kind == "kv":
        return "\n".join(f"- **{k}**: {v}" for k, v in b[1])
    if kind == "table":
        lines = ["| " + " | ".join(_md_escape(h) for h in b[1]) + " |", "|" + "---|" * len(b[1])]
        lines += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in b[2]]
        return "\n".join(lines)
    raise ValueError(f"unknown block {kind}")


def to_markdown(d: Any) -> str:
    parts = [f"# {d.title}", f"_trainledger {d.version} · generated {d.generated} · memory in GiB_"]
    for s in build_document(d):
        parts.append(f"## {s['title']}")
        parts += [_md_block(b) for b in s["blocks"]]
    return "\n\n".join(parts) + "\n"


def _txt_table(headers: list[str], rows: list[list[Any]], width: int = 110) -> str:
    """A plain table; rows too wide for ``width`` columns become one 'header: value' block each."""
    cells = [[str(c) for c in r] for r in rows]
    w = [max([len(h)] + [len(r[i]) for r in cells if i < len(r)]) for i, h in enumerate(headers)]
    if sum(w) + 2 * len(w) > width:
        hw = max(len(h) for h in headers)
        return "\n\n".join("\n".join(f"{h.ljust(hw)}  {c}" for h, c in zip(headers, r)) for r in cells)
    fmt = lambda r: "  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
    return "\n".join([fmt(headers), "  ".join("-" * x for x in w)] + [fmt(r) for r in cells])


def to_text(d: Any) -> str:
    parts = [d.title, "=" * len(d.title)]
    for s in build_document(d):
        parts.append(f"\n{s['title']}\n{'-' * len(s['title'])}")
        for b in s["blocks"]:
            if b[0] in ("p", "code"):
                parts.append(b[1])
            elif b[0] == "h3":
                parts.append(f"\n{b[1]}:")
            elif b[0] == "list":
                parts += [f"  - {x}" for x in b[1]]
            elif b[0] == "kv":
                width = max(len(k) for k, _ in b[1])
                parts += [f"{k.ljust(width)}  {v}" for k, v in b[1]]
            elif b[0] == "table":
                parts.append(_txt_table(b[1], b[2]))
    return "\n".join(parts) + "\n"


def to_json(d: Any) -> str:
    return json.dumps(d.to_dict(), indent=2, allow_nan=False) + "\n"


def render(d: Any, fmt: str) -> str:
    """Render ReportData as ``html``, ``md``, ``txt`` or ``json``."""
    fn = {"html": to_html, "md": to_markdown, "txt": to_text, "json": to_json}.get(fmt)
    if fn is None:
        raise SpecError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")
    return fn(d)


def format_for(path: str | Path) -> str:
    """Report format from a file name: .html/.htm, .md/.markdown, .txt, .json."""
    suffix = Path(path).suffix.lower()
    fmt = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".txt": "txt", ".json": "json"}.get(suffix)
    if fmt is None:
        raise SpecError(f"{path}: cannot tell the report format from {suffix or 'no suffix'!s}; "
                        "use .html, .md, .txt or .json, or give --format")
    return fmt


