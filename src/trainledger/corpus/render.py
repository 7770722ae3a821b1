"""Terminal rendering of a stats document (reads the numbers; computes nothing new)."""

from __future__ import annotations

from trainledger.units import fmt_bytes, fmt_seconds

_BAR_WIDTH = 40


def _n(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.01 else f"{100 * x:.1f}%"


def histogram_lines(hist: dict, width: int = _BAR_WIDTH) -> list[str]:
    edges, counts = hist["edges"], hist["counts"]
    if not counts:
        return []
    total, top = sum(counts), max(counts) or 1
    labels = []
    for i in range(len(counts)):
        if hist.get("overflow") and i == len(counts) - 1:
            labels.append(f">= {edges[i]:,} (max {edges[i + 1] - 1:,})")
        else:
            labels.append(f"{edges[i]:,} - {edges[i + 1] - 1:,}")
    w = max(len(s) for s in labels)
    lines = []
    for label, c in zip(labels, counts):
        bar = "█" * round(width * c / top) or ("▏" if c else "")
        lines.append(f"  {label.rjust(w)} │{bar.ljust(width)} {c:,} ({_pct(c / total)})")
    return lines


def _header(s: dict) -> list[str]:
    inputs, tok = s["inputs"], s["tokenizer"]
    fmts = sorted({src["format"] for src in inputs["sources"]})
    kind = "ESTIMATE, " + tok["method"].removeprefix("estimate: ") if s["approximate"] else f"{tok['name']} (exact)"
    out = [f"corpus: {inputs['files']} file(s), {fmt_bytes(inputs['bytes'])}, {', '.join(fmts)}; "
           f"{s['records']:,} records", f"tokens: {kind}"]
    if tok.get("chat"):
        out.append(f"chat: {s['chat_records']:,} records, {tok['chat']}")
    return out


def _summary(s: dict) -> list[str]:
    approx = " (approximate)" if s["approximate"] else ""
    rows = [("samples", _n(s["samples"])), ("total tokens" + approx, _n(s["total_tokens"])),
            ("mean ± std", f"{_n(s['mean'])} ± {_n(s['std'])}"), ("min", _n(s["min"])),
            ("median", _n(s["median"])), ("p90", _n(s["p90"])), ("p95", _n(s["p95"])),
            ("p99", _n(s["p99"])), ("max", _n(s["max"]))]
    samp = s.get("sampling")
    if samp:
        ci = samp["confidence"]
        rows[0] = ("samples", f"{s['samples']:,} drawn of {samp['population_records']:,} records "
                   f"(rate {samp['rate']:.4f}, seed {samp['seed']})")
        if ci["mean"]:
            lvl = f"{100 * ci['level']:g}% CI"
            rows[1] = ("total tokens (est.)", f"{_n(s['total_tokens'])}  [{lvl} {_n(ci['total_tokens'][0], 0)} – "
                       f"{_n(ci['total_tokens'][1], 0)}]")
            rows[2] = ("mean ± std", f"{_n(s['mean'])} ± {_n(s['std'])}  [{lvl} {_n(ci['mean'][0])} – "
                       f"{_n(ci['mean'][1])}]")
    w = max(len(k) for k, _ in rows)
    return [f"  {k.ljust(w)}  {v}" for k, v in rows]


def _padding(s: dict) -> list[str]:
    t, b = s["truncation"], s["micro_batch"]
    out = [f"at seq_len {s['seq_len']:,} ({s['seq_len_source']}), micro-batch {b}:",
           f"  truncated: {_pct(t['share'])} of samples ({t['samples']:,}), {_pct(t['token_share'])} of tokens",
           f"  {'strategy':<16}{'padding':>9}{'tokens/seq':>12}{'sequences':>14}{'padded tokens':>16}"]
    for name, row in s["padding"].items():
        mark = "  <- recommended" if name == s["recommendation"]["strategy"] else ""
        out.append(f"  {name:<16}{_pct(row['waste']):>9}{row['tokens_per_sequence']:>12,.1f}"
                   f"{round(row['sequences']):>14,}{round(row['padded_tokens']):>16,}{mark}")
    return out


def render_text(s: dict) -> str:
    """The human-readable report of ``trainledger corpus``."""
    rec = s["recommendation"]
    lines = _header(s) + [""] + _summary(s) + ["", "token length histogram:"]
    lines += histogram_lines(s["histogram"]) + [""] + _padding(s) + [""]
    lines.append(f"recommended: seq_len {rec['seq_len']:,} (covers p99 = {_n(s['p99'])}, multiple of "
                 f"{rec['multiple']}); batching: {rec['strategy']} — {rec['reason']}")
    th = s["throughput"]
    if th.get("tokens_per_s"):
        lines.append(f"read in {fmt_seconds(th['elapsed_s'])} on {th['workers']} worker(s): "
                     f"{th['tokens_per_s']:,.0f} tokens/s, {th['bytes_per_s'] / 1e6:,.1f} MB/s")
    return "\n".join(lines)
