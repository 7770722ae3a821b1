"""`trainledger estimate`: the ledger of one plan — memory term by term, then compute and time.

Thin: build the plan from flags or a plan file, call ``trainledger.estimate.estimate``, render the
sections of ``Estimate.to_dict()``. No arithmetic here beyond unit display.
"""

from __future__ import annotations

from typing import Any

import click

from trainledger.estimate import EstimateOptions, estimate
from trainledger.units import fmt_bytes, gib
from trainledger.cli.ledger_cmds import calibration_line, estimate_ledger_hook, ledger_flags
from trainledger.cli.output import echo_json, table
from trainledger.cli.options import plan_from_options, plan_options, time_options, time_options_from_kwargs


def register(main: click.Group) -> None:
    main.add_command(estimate_cmd)


def _cost_options(func: Any) -> Any:
    from trainledger.cli.cost_opts import cost_options

    return cost_options(func)


@click.command("estimate")
@plan_options
@time_options
@_cost_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output (all sections)")
@ledger_flags
def estimate_cmd(as_json: bool, **kwargs: Any) -> None:
    """Estimate one job: per-GPU memory term by term (peak phase, fit verdict, what to change
    when it does not fit), then compute, step time and the rest of the ledger.

    Example: trainledger estimate --model llama-3.1-8b --gpu h100-sxm --seq-len 4096 --method lora
    """
    from trainledger.cli.cost_opts import cost_options_from_kwargs

    cost = cost_options_from_kwargs(kwargs)
    tm = time_options_from_kwargs(kwargs)  # --mfu, --matmul-efficiency, --runtime, overlaps
    plan = plan_from_options(kwargs)
    est = estimate(plan, EstimateOptions(cost=cost, time=tm))
    d = estimate_ledger_hook(est.to_dict(), kwargs)  # --calibrated; store in the ledger
    if as_json:
        echo_json(d)
        return
    click.echo("\n".join(memory_lines(d["plan"], d["memory"])))
    if d.get("serving"):
        from trainledger.cli.serving_render import serving_lines

        click.echo("\n" + "\n".join(serving_lines(d["serving"])))
    if d.get("compute"):
        from trainledger.cli.time_render import compute_lines

        click.echo("\n" + "\n".join(compute_lines(d["compute"], d["plan"].get("method"))))
    if d.get("time"):
        from trainledger.cli.time_render import time_lines

        lines, g = time_lines(d["time"]), d.get("goodput") or {}
        if g.get("wall_days") is not None:  # goodput section: the same run with interruptions
            lines.insert(2, f"  with interruptions: {g['wall_days']:,.1f} days (goodput {g['goodput']:.1%}, "
                            f"+{g['added_days']:,.1f} days)")
        click.echo("\n" + "\n".join(lines))
    if est.extra:
        from trainledger.cli.cost_opts import ledger_lines

        lines = ledger_lines(est.extra)
        if lines:
            click.echo("\n" + "\n".join(lines))
    click.echo("\n" + calibration_line(d))


def _header(p: dict[str, Any]) -> str:
    extra = [f"{k}={p[k]}" for k in ("dp", "tp", "pp", "vp", "cp", "ep") if p.get(k, 1) != 1]
    extra += [f"ZeRO-{p['zero']}"] if p.get("zero") else []
    extra += [f"offload {p['offload']}"] if p.get("offload") not in (None, "none") else []
    if p.get("serving"):  # inference: the engine and its formats instead of the training recipe
        sv = p["serving"]
        return (f"{p['model']} · inference · {p['precision']} · {sv['engine']} · weights {sv['quantization'] if sv['quantization'] != 'none' else 'as ' + p['precision']} · "
                f"KV {sv['kv_cache_dtype']} · b={p['micro_batch']} in={p['seq_len']} out={p['generate_len']} · "
                f"{p['gpus']}× {p['gpu']}" + (f" (tp={p['tp']}, pp={p['pp']})" if p['tp'] > 1 or p['pp'] > 1 else ""))
    train = p["method"] != "inference"  # inference runs no optimizer and no backward
    return (f"{p['model']} · {p['method']} · {p['precision']} · " + (f"{p['optimizer']} · " if train else "")
            + f"b={p['micro_batch']} s={p['seq_len']}" + (f" (packed docs of {p['doc_len']})" if p.get("doc_len") else "")
            + " · " + (f"recompute {p['recompute']} · " if train else "")
            + f"{p['attention']} · {p.get('framework', 'hf')} · {p['gpus']}× {p['gpu']}"
            + (f" ({', '.join(extra)})" if extra else ""))


def memory_lines(p: dict[str, Any], m: dict[str, Any]) -> list[str]:
    """The memory section as text: term table, runtime terms, verdict, timeline, suggestions."""
    peak = m["peak_allocated_bytes"]
    out = [_header(p)] + ([f"precision {p['precision_policy']}"] if p.get("precision_policy") else []) + (
        [f"stack     {p['stack_note']}"] if p.get("stack_note") else []) + [
        "", f"memory per GPU — peak of a steady-state step, in {m['peak_phase']}"]
    src = {t["name"]: t["source"] for t in m["terms"]}
    rows = [[k, f"{gib(v):.2f}", f"{100 * v / peak:.1f}%" if peak else "-", _short(src.get(k, ""))]
            for k, v in sorted(m["breakdown"].items(), key=lambda kv: -kv[1])]
    rows.append(["= peak allocated", f"{gib(peak):.2f}", "100%", "torch.cuda.max_memory_allocated"])
    for k, v in m["runtime"].items():
        rows.append([f"+ {k}", f"{gib(v):.2f}", "", _short(src.get(k, ""))])
    rows.append(["= on the device", f"{gib(m['device_total_bytes']):.2f}", "", "nvidia-smi"])
    out += ["  " + ln for ln in table(rows, ["term", "GiB", "share", "source"], align="lrrl").splitlines()]
    verdict = "fits" if m["fits"] else "DOES NOT FIT"
    out.append(f"verdict: {verdict} — needs {fmt_bytes(m['device_total_bytes'])} of "
               f"{fmt_bytes(m['usable_bytes'])} ({fmt_bytes(m['budget_bytes'])} after "
               f"{100 * m['headroom']:.0f}% headroom)")
    if m.get("host_bytes"):
        out.append(f"host RAM for offload: {fmt_bytes(m['host_bytes'])} per GPU")
    if m.get("timeline"):
        out.append("timeline: " + " → ".join(f"{t['point']} {gib(t['bytes']):.1f}" for t in m["timeline"]) + " GiB")
    for note in m.get("notes", []):
        out.append(f"note: {note}")
    if not m["fits"]:
        if m.get("suggestions"):
            out.append("to make it fit (cheapest first):")
            out += [f"  - {s['change']}: peak {s['peak_allocated_gib']:.2f} GiB, "
                    f"{gib(s['device_total_bytes']):.2f} GiB on the device" for s in m["suggestions"]]
        else:
            out.append("no single change or combination tried makes it fit; use more or larger GPUs")
    return out


def _short(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
