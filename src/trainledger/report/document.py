"""ReportData -> a document of sections and blocks that every renderer formats the same way.

Blocks: ``("p", text)``, ``("kv", [(label, value)])``, ``("table", headers, rows)``,
``("svg", svg)``, ``("code", text)``, ``("list", [text])``. Only formatting happens here
(bytes -> GiB, seconds -> days, USD with a $); every number comes from the ReportData.
"""

from __future__ import annotations

from typing import Any

from trainledger.units import GIB, fmt_bytes, fmt_params, fmt_seconds
from trainledger.report import charts

Block = tuple
Section = dict[str, Any]

RUNTIME_TERMS = ("allocator_reserve", "cuda_context", "library_workspaces")


def usd(x: float | None) -> str:
    if x is None:
        return "not estimated"
    return f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def days(s: float | None) -> str:
    return "not estimated" if s is None else f"{s / 86400:,.2f} days"


def gib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / GIB:,.2f} GiB"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def verdict(mem: dict[str, Any]) -> str:
    return "FITS" if mem.get("fits") else "DOES NOT FIT"


def summary(est: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures of an estimate (sections that are missing say so)."""
    p, m = est["plan"], est.get("memory") or {}
    c, t, cost, e = (est.get(k) or {} for k in ("compute", "time", "cost", "energy"))
    rows = [
        ("model", f"{p['model']} ({fmt_params(p['params'])} parameters)"),
        ("job", f"{p['method']}, {p['precision']}, seq {p['seq_len']:,}, micro-batch {p['micro_batch']} x "
                f"grad-accum {p['grad_accum']}, global batch {p['global_batch']}"),
        *([("precision", p["precision_policy"])] if p.get("precision_policy") else []),
        ("hardware", f"{p['gpus']} x {p['gpu']} ({p['nodes']} node(s), {p['intra']}"
                     + (f", {p['inter']}" if p.get("inter") else "") + ")"),
        ("layout", f"dp {p['dp']} tp {p['tp']} pp {p['pp']} cp {p['cp']} ep {p['ep']}, ZeRO {p['zero']}, "
                   f"recompute {p['recompute']}, offload {p['offload']}"),
        ("memory per GPU", f"{gib(m.get('device_total_bytes'))} of {gib(m.get('usable_bytes'))} usable "
                           f"(budget {gib(m.get('budget_bytes'))} at {pct(m.get('headroom'))} headroom)"),
        ("fit verdict", verdict(m)),
    ]
    if c:
        rows += [("step time", fmt_seconds(c.get("step_time_s"))),
                 ("throughput", f"{c.get('tokens_per_s_per_gpu', 0):,.0f} tokens/s per GPU, MFU {pct(c.get('mfu'))}")]
    else:
        rows.append(("step time", "not estimated"))
    rows.append(("training time", days(t.get("total_s")) + (f" ({t['gpu_hours']:,.0f} GPU-hours)"
                                                            if t.get("gpu_hours") else "")))
    price = (f"{cost.get('provider')} {cost.get('pricing')}, ${cost['usd_per_gpu_hour']:.2f}/GPU-h"
             if cost.get("usd_per_gpu_hour") else "no catalog price for this GPU")
    if cost.get("cloud_usd") is None and not t.get("total_s"):
        price = "give a token budget; " + price
    unfit = "" if m.get("fits", True) else " — the plan DOES NOT FIT, so this run cannot happen as planned"
    rows.append(("cloud cost", f"{usd(cost.get('cloud_usd'))} ({price}){unfit}"))
    rows += ledger_rows(est, unfit)
    return rows


def ledger_rows(est: dict[str, Any], unfit: str = "") -> list[tuple[str, str]]:
    """Owned vs cloud, break-even, energy with PUE and CO2, host RAM: the rest of the ledger."""
    cost, e, h = (est.get(k) or {} for k in ("cost", "energy", "host"))
    rows: list[tuple[str, str]] = []
    if cost.get("owned_usd") is not None:
        rows.append(("owned cost", f"{usd(cost['owned_usd'])} for the run, {usd(cost.get('owned_usd_per_month'))}"
                                   f"/month{unfit}"))
        cloud_m = cost.get("cloud_usd_per_month")
        rows.append(("owned vs cloud", f"cloud {usd(cloud_m)}/month vs owned {usd(cost.get('owned_usd_per_month'))}"
                                       f"/month" if cloud_m is not None else "no cloud price to compare"))
        be = cost.get("break_even_month")
        rows.append(("break-even", f"{be:,.1f} months" if be is not None else "never (owning costs more per month)"
                     if cost.get("cloud_usd_per_month") is not None else "not estimated"))
    else:
        rows.append(("owned cost", "not estimated (give --server-price, or a GPU with a server price)"))
    if e.get("kwh") is not None:
        pue = ((e.get("inputs") or {}).get("pue"))
        rows.append(("energy", f"{e['kwh']:,.0f} kWh" + (f" at PUE {pue:g}" if isinstance(pue, (int, float)) else "")
                     + (f", facility {e['facility_power_kw']:,.1f} kW" if e.get("facility_power_kw") else "")))
        if e.get("co2_kg") is not None:
            rows.append(("CO2", f"{e['co2_kg']:,.1f} kg"))
    elif e.get("facility_power_kw") is not None:
        rows.append(("energy", f"not estimated (no run length); facility {e['facility_power_kw']:,.1f} kW"))
    if h:
        inst = h.get("installed_ram_bytes")
        rows.append(("host RAM", f"{gib(h.get('ram_bytes'))} per node of " + (
            f"{gib(inst)} installed" + ("" if h.get("ram_fits") else " — DOES NOT FIT") if inst is not None
            else "an unknown installed RAM (give --host-ram-gib)")))
        if h.get("model_load_bytes"):
            rows.append(("host RAM at model load", f"{gib(h['model_load_bytes'])} per node ({h['model_loading']})"
                         + (" — DOES NOT FIT" if h.get("load_fits") is False else "")))
    from trainledger.report.longrun import goodput_rows

    return rows + goodput_rows(est.get("goodput") or {})


def memory_terms(est: dict[str, Any]) -> list[tuple[str, int]]:
    m = est.get("memory") or {}
    items = list((m.get("breakdown") or {}).items()) + list((m.get("runtime") or {}).items())
    return [(k, int(v)) for k, v in items if v]


def memory_table(est: dict[str, Any]) -> Block:
    m = est.get("memory") or {}
    total = m.get("device_total_bytes") or 1
    src = {t["name"]: t.get("source", "") for t in m.get("terms") or []}
    rows = [[k, gib(v), pct(v / total), src.get(k, "")] for k, v in memory_terms(est)]
    rows.append(["total (device)", gib(m.get("device_total_bytes")), "100.0%", f"peak in {m.get('peak_phase')}"])
    return ("table", ["term", "GiB", "share", "source"], rows)


def compare_chart(rows: list[dict[str, Any]]) -> str:
    terms: list[str] = []
    for r in rows:
        for k in list(r.get("breakdown", {})) + list(r.get("runtime", {})):
            if k not in terms:
                terms.append(k)
    bars = []
    for r in rows:
        if r.get("error"):
            bars.append({"label": r["gpu"], "values": {}, "note": "invalid", "bad": True})
            continue
        vals = {**r["breakdown"], **r["runtime"]}
        bars.append({"label": r["gpu"], "values": {k: v / GIB for k, v in vals.items()},
                     "capacity": r["usable_bytes"] / GIB, "budget": r["budget_bytes"] / GIB,
                     "note": "fits" if r["fits"] else "does not fit", "bad": not r["fits"]})
    return charts.stacked_bars("Per-GPU memory by term on each candidate GPU", bars, terms)


def compare_table(rows: list[dict[str, Any]]) -> Block:
    out = []
    for r in rows:
        if r.get("error"):
            out.append([r["gpu"], "-", "-", "invalid: " + r["error"], "-"])
            continue
        out.append([r["gpu"], gib(r["device_total_bytes"]), gib(r["usable_bytes"]),
                    "fits" if r["fits"] else "does not fit", fmt_seconds(r.get("step_time_s"))])
    return ("table", ["GPU", "memory per GPU", "usable", "verdict", "step time"], out)


def _same(a: list, b: list, rel: float = 0.01) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and abs(x - y) <= rel * max(x, y, 1))
               for x, y in zip(a, b))


def sweep_chart(sw: dict[str, Any], title: str, x_label: str) -> str:
    """One line per GPU (one shared line when the GPUs' per-GPU memory agrees within 1%), each GPU's
    budget dashed and labelled with where it runs out; the y axis stops at 1.3x the largest budget."""
    items = list(sw["gpus"].items())
    series, hlines = [], []
    shared = all(_same(items[0][1]["bytes"], s["bytes"]) for _, s in items[1:])
    for i, (g, s) in enumerate(items):
        if not shared or i == 0:
            series.append({"name": "memory per GPU (all GPUs)" if shared else g,
                           "ys": [None if b is None else b / GIB for b in s["bytes"]],
                           "fits": None if shared else s["fits"], "color": "#222" if shared else charts.color(i)})
        out = "" if s["runs_out_at"] is None else f", runs out at {s['runs_out_at']:,}"
        y = (s["budget_bytes"] or 0) / GIB
        twin = next((h for h in hlines if abs(h["y"] - y) <= 0.01 * max(y, 1) and h["out"] == out), None)
        if twin:  # GPUs with the same budget share one line
            twin["gpus"].append(g)
            twin["name"] = f"{', '.join(twin['gpus'])} budget{out}"
            continue
        hlines.append({"name": f"{g} budget{out}", "y": y, "color": charts.color(i), "out": out, "gpus": [g]})
    marks = [{"x": sw["current"], "label": "this plan"}]
    clip = 1.3 * max([h["y"] for h in hlines] + [1e-9])
    return charts.line_chart(title, sw["values"], series, "GiB", x_label, True, hlines, marks, clip)


def sweep_table(sw: dict[str, Any], name: str) -> Block:
    rows = []
    for g, s in sw["gpus"].items():
        rows.append([g, "none" if s["limit"] is None else f"{s['limit']:,}",
                     "-" if s["runs_out_at"] is None else f"{s['runs_out_at']:,}"])
    return ("table", ["GPU", f"largest {name} that fits", "runs out at"], rows)


def timeline_chart(est: dict[str, Any]) -> str | None:
    m = est.get("memory") or {}
    tl = m.get("timeline") or []
    if not tl:
        return None
    pts = [{"label": p.get("point", ""), "y": p["bytes"] / GIB} for p in tl]
    return charts.timeline("Allocated memory through one training step", pts, (m.get("usable_bytes") or 0) / GIB)


def step_chart(est: dict[str, Any]) -> str | None:
    c = est.get("compute") or {}
    parts = sorted(((k, v * 1e3) for k, v in (c.get("breakdown") or {}).items() if v), key=lambda kv: -kv[1])
    if not parts:
        return None
    return charts.hbars(f"Step time breakdown (step {fmt_seconds(c.get('step_time_s'))})", parts, "ms")


def step_table(est: dict[str, Any]) -> Block:
    c = est.get("compute") or {}
    total = c.get("step_time_s") or 1.0
    parts = sorted((c.get("breakdown") or {}).items(), key=lambda kv: -kv[1])
    rows = [[k, f"{v * 1e3:,.2f} ms", pct(v / total)] for k, v in parts if v]
    rows.append(["step", fmt_seconds(c.get("step_time_s")), "100.0%"])
    return ("table", ["part", "time", "share of step"], rows)


def count_chart(cs: dict[str, Any]) -> str:
    key = cs.get("cost_key", "cost_usd")
    pts = [{"x": p["total_s"] / 86400, "y": p[key], "label": f"{p['gpus']} GPUs", "front": p.get("pareto"),
            "bad": not p.get("fits")} for p in cs["points"]
           if not p.get("error") and p.get("total_s") is not None and p.get(key) is not None]
    tok = f"{fmt_params(cs['tokens'])} tokens" + (" (assumed)" if cs["tokens_assumed"] else "")
    what, unit = ("cloud cost", "USD") if key == "cost_usd" else ("GPU-hours", "GPU-hours")
    return charts.scatter(f"Time and {what} vs GPU count, {tok}", pts, "days", unit)


def count_note(cs: dict[str, Any]) -> str:
    parts = [f"Same GPU, TP/PP and ZeRO at each count; {fmt_params(cs['tokens'])} tokens"
             + (" (assumed: no token budget given)" if cs["tokens_assumed"] else "") + "."]
    if cs.get("cost_key") == "gpu_hours":
        parts.append("No catalog price for this GPU: cost is shown in GPU-hours.")
    return " ".join(parts)


def count_table(cs: dict[str, Any]) -> Block:
    rows = []
    for p in cs["points"]:
        if p.get("error"):
            rows.append([str(p["gpus"]), "-", "-", "-", "-", "-", "invalid: " + p["error"]])
            continue
        rows.append([str(p["gpus"]), days(p.get("total_s")), usd(p.get("cost_usd")), f"{p.get('gpu_hours') or 0:,.1f}",
                     "fits" if p.get("fits") else "does not fit", "yes" if p.get("pareto") else "",
                     f"dp {p['layout']['dp']} tp {p['layout']['tp']} pp {p['layout']['pp']} ZeRO {p['layout']['zero']}"])
    return ("table", ["GPUs", "time", "cloud cost", "GPU-hours", "memory", "Pareto", "layout"], rows)


def _layout_words(lay: dict[str, Any]) -> str:
    return (f"dp {lay.get('dp')} tp {lay.get('tp')} pp {lay.get('pp')} ZeRO {lay.get('zero')} "
            f"mb {lay.get('micro_batch')} ga {lay.get('grad_accum')} rc {lay.get('recompute')}")


def limits_phrases(stack_limits: dict[str, list[str]]) -> list[str]:
    """"hf runs no PP, CP, ..." for each searched stack that lacks a parallelism (search's
    ``stack_limits``)."""
    return [f"{fw} runs no {', '.join(lim)}" for fw, lim in stack_limits.items() if lim]


def alternative_text(alt: dict[str, Any], layout_text: Any = _layout_words) -> str:
    """The same job under another stack (``planner.search.alternatives``), in one line: its fastest
    plan within the budget, else the deadline bound past it (``layout_text``: how a layout reads)."""
    fw, p = alt["framework"], alt["plan"]
    if p is not None:
        e = p["estimate"]
        d = e.get("days_with_failures") or e.get("days")
        days = f", {d:.1f} days with interruptions" if d is not None else ""
        return (f"{p['gpus']} {p['gpu']} ({layout_text(p['layout'])}){days} within the budget "
                f"(--framework {fw})")
    beyond = [(b["deadline_beyond_budget_gpus"], b["gpu"]) for b in alt["gpu_count"]
              if b.get("deadline_beyond_budget_gpus")]
    if beyond:
        n, gpu = min(beyond)
        return f"the deadline needs {n:,} {gpu}, past the budget (--framework {fw} --max-gpus {n})"
    return "no plan either"


def plans_blocks(pr: dict[str, Any]) -> list[Block]:
    plans, rej = pr.get("plans") or [], pr.get("rejected") or []
    rows = []
    for i, p in enumerate(plans, 1):
        e, lay = p.get("estimate") or {}, p.get("layout") or {}
        rows.append([str(i), f"{p['gpus']} x {p['gpu']}", _layout_words(lay),
                     f"{e.get('memory_gib', 0):.1f} / {e.get('usable_gib', 0):.1f} GiB", days(e.get("total_s")),
                     usd(e.get("cost_usd")), "yes" if p.get("pareto") else "", "; ".join(p.get("risks") or [])])
    out: list[Block] = [("p", f"{pr.get('evaluated', 0):,} candidates evaluated in {pr.get('elapsed_s') or 0:.2f} s; "
                              f"{len(plans)} ranked, {len(rej)} rejected.")]
    limits = limits_phrases(pr.get("stack_limits") or {})
    if limits:
        out.append(("p", f"Layouts not searched: {'; '.join(limits)}."))
    if pr.get("alternatives"):
        out.append(("table", ["under another stack", "answer"],
                    [[a["framework"], alternative_text(a)] for a in pr["alternatives"]]))
    pts = [{"x": (p["estimate"].get("total_s") or 0) / 86400, "y": p["estimate"].get("cost_usd"),
            "label": f"#{i} {p['gpus']}x{p['gpu']}", "front": p.get("pareto")}
           for i, p in enumerate(plans, 1) if (p.get("estimate") or {}).get("cost_usd") is not None
           and p["estimate"].get("total_s") is not None]
    if pts:
        out.append(("svg", charts.scatter("Ranked plans: time vs cloud cost", pts, "days", "USD")))
    out.append(("table", ["#", "hardware", "layout", "memory", "time", "cost", "Pareto", "risks"], rows))
    if rej:
        out.append(("table", ["rejected", "GPUs", "reason"], [[r.get("gpu", ""), str(r.get("gpus", "")),
                                                                 r.get("reason", "")] for r in rej]))
    return out


def _scale(top: float) -> tuple[str, float]:
    """GiB, MiB or KiB, whichever shows ``top`` bytes with digits to spare (tiny CPU-verified models)."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20)):
        if top >= size:
            return unit, size
    return "KiB", 1 << 10


def verify_blocks(v: dict[str, Any]) -> list[Block]:
    top = max([max(r.get("measured") or 0, r.get("predicted") or 0) for r in v["categories"]] + [0])
    unit, size = _scale(top)
    rows = [(r["name"], (r.get("measured") or 0) / size, (r.get("predicted") or 0) / size) for r in v["categories"]]
    if v.get("peak_relative_error") is None:
        head = (f"measured on {v.get('device')}: no peak measured" + (f" ({v['note']})" if v.get("note") else "")
                + "; nothing to compare with the prediction")
    else:
        head = (f"measured on {v.get('device')}: peak allocated off by {pct(v.get('peak_relative_error'))} "
                f"({'within' if v.get('within_tolerance') else 'OUTSIDE'} the {pct(v.get('tolerance'))} "
                "acceptance band)")
    if not v.get("terms_measured", True):
        head += "; this run records allocator totals, not terms: only totals and phases are compared"
    if v.get("oom"):
        head = "the measured run ran out of memory: " + head
    def b(x: float | None) -> str:
        return "not measured" if x is None else fmt_bytes(x)

    table = [[r["name"], b(r.get("measured")), b(r.get("predicted")), pct(r.get("relative_error"))]
             for r in v["categories"] + v["totals"] + v.get("phases", [])]
    out: list[Block] = [("p", head)]
    if rows:
        out.append(("svg", charts.grouped_bars("Measured vs predicted memory per term (at the peak)", rows,
                                               ("measured", "predicted"), unit)))
    out.append(("table", ["term", "measured", "predicted", "error"], table))
    return out


def _sheet_blocks(sh: dict[str, Any]) -> list[Block]:
    return [
        ("h3", "What the vendor delivers"),
        ("table", ["item", "requirement", "how it is checked"], [[r["item"], r["value"], r["check"]] for r in sh["hardware"]]),
        ("h3", "What will run on it"),
        ("table", ["item", "plan"], [[r["item"], r["value"]] for r in sh["training"]]),
        ("h3", "Checks on delivery"),
        ("table", ["command", "pass threshold", "why"], [[r["command"], r["pass"], r["why"]] for r in sh["checks"]]),
    ]


def build_document(d: Any) -> list[Section]:
    """The report's sections, in reading order, from a ReportData."""
    est = d.estimate
    secs: list[Section] = [{"id": "summary", "title": "Summary", "blocks": [("kv", summary(est))]}]
    mem_blocks: list[Block] = [memory_table(est)]
    tl = timeline_chart(est)
    if tl:
        mem_blocks.append(("svg", tl))
    secs.append({"id": "memory", "title": "Memory per GPU", "blocks": mem_blocks})
    if d.gpu_compare:
        secs.append({"id": "gpus", "title": "Candidate GPUs",
                     "blocks": [("svg", compare_chart(d.gpu_compare)), compare_table(d.gpu_compare)]})
    for sw, sid, title, name, xl in ((d.seq_sweep, "seq", "Peak memory vs sequence length", "sequence length",
                                      "sequence length (tokens)"),
                                     (d.mb_sweep, "mb", "Peak memory vs micro-batch", "micro-batch", "micro-batch")):
        if sw:
            secs.append({"id": sid, "title": title, "blocks": [("svg", sweep_chart(sw, title, xl)), sweep_table(sw, name)]})
    if est.get("serving"):  # inference: latency, throughput, concurrency, cost per token (issue 16)
        from trainledger.report.serving import serving_blocks

        secs.append({"id": "serving", "title": "Serving: latency, throughput and cost per token",
                     "blocks": serving_blocks(est["serving"])})
    sc = step_chart(est)
    secs.append({"id": "time", "title": "Step time",
                 "blocks": [("svg", sc), step_table(est)] if sc else [("p", "step time: not estimated")]})
    if d.count_sweep:
        secs.append({"id": "scaling", "title": "Time and cost vs GPU count",
                     "blocks": [("p", count_note(d.count_sweep)), ("svg", count_chart(d.count_sweep)),
                                count_table(d.count_sweep)]})
    if d.plan_result:
        secs.append({"id": "plans", "title": "Planner results", "blocks": plans_blocks(d.plan_result)})
    if d.verify:
        secs.append({"id": "verify", "title": "Measured vs predicted", "blocks": verify_blocks(d.verify)})
    if d.sheet:
        secs.append({"id": "sheet", "title": "Procurement and acceptance sheet", "blocks": _sheet_blocks(d.sheet)})
    from trainledger.report import longrun

    if getattr(d, "facility", None):
        secs.append({"id": "facility", "title": "Facility sheet", "blocks": longrun.facility_blocks(d.facility)})
    if getattr(d, "soak", None):
        secs.append({"id": "soak", "title": "Soak test", "blocks": longrun.soak_blocks(d.soak)})
    risk_blocks: list[Block] = [("table", ["risk", "level", "value", "meaning"],
                                 [[r["name"], r["level"], r["value"], r["text"]] for r in d.risks])]
    if d.triggers:
        risk_blocks += [("h3", "Recompute the plan when"),
                        ("table", ["condition", "what the estimator says"], [[t["condition"], t["effect"]] for t in d.triggers])]
    secs.append({"id": "risks", "title": "Risks and upgrade triggers", "blocks": risk_blocks})
    notes = list(d.notes) + list((est.get("memory") or {}).get("notes") or [])
    if notes:
        secs.append({"id": "notes", "title": "Notes", "blocks": [("list", notes)]})
    return secs

