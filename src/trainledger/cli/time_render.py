"""Text rendering of the compute and time sections of an estimate (issue 4). Formats only."""

from __future__ import annotations

from typing import Any

from trainledger.units import fmt_flops, fmt_seconds
from trainledger.cli.output import table


def compute_lines(c: dict[str, Any], method: str | None = None) -> list[str]:
    """The compute section: FLOPs (model, hardware, 6NT), step time breakdown, throughput, MFU.

    ``six_nt_per_step`` is 2·N·T for inference (forward only), 6·N·T for training; the label says which.
    """
    nt = "2·N·T" if method == "inference" else "6·N·T"
    out = [
        "compute",
        f"  FLOPs per step: model {fmt_flops(c['model_flops_per_step'])} (MFU basis), hardware "
        f"{fmt_flops(c['hardware_flops_per_step'])} (HFU basis: executed, recomputation included), {nt} "
        f"{fmt_flops(c['six_nt_per_step'])}, causal-only {fmt_flops(c['model_flops_causal_per_step'])}",
        f"  step {fmt_seconds(c['step_time_s'])}: {c['tokens_per_s']:,.0f} tokens/s, "
        f"{c['tokens_per_s_per_gpu']:,.0f} per GPU, {c['model_tflop_per_s_per_gpu']:.0f} TFLOP/s per GPU, "
        f"MFU {100 * c['mfu']:.1f}%, HFU {100 * c['hfu']:.1f}% (matmuls in {c['matmul_dtype']}, "
        f"efficiency family {c['efficiency_family']})",
    ]
    iv = c.get("step_time_interval_s")
    if iv:
        out.append(f"  step time p10-p90: {fmt_seconds(iv['p10'])} - {fmt_seconds(iv['p90'])}, MFU "
                   f"{100 * c['mfu_interval']['p10']:.1f}-{100 * c['mfu_interval']['p90']:.1f}% "
                   f"({iv['basis']})")
    tc = c.get("time_calibration")
    if tc and tc.get("calibrated"):
        civ = c.get("calibrated_step_time_interval_s") or {}
        out.append(f"  calibrated step {fmt_seconds(tc['step_time_s'])} (x{tc['scale']:.3f}, calibration "
                   f"{tc.get('calibration_id')}; p10-p90 {fmt_seconds(civ.get('p10', 0))} - "
                   f"{fmt_seconds(civ.get('p90', 0))})")
    elif tc:
        out.append(f"  {tc['reason']}")
    step = c["step_time_s"]
    rows = [[k, fmt_seconds(v), f"{100 * v / step:.1f}%"] for k, v in c["breakdown"].items()]
    out += ["  " + line for line in table(rows, ["part", "time", "share"], align="lrr").splitlines()]
    parts = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in c["compute_parts"].items() if v)
    out.append(f"  compute = {parts}")
    if c.get("hidden_comm"):
        hid = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in c["hidden_comm"].items())
        out.append(f"  overlapped (hidden) communication: {hid}")
    out += [f"  note: {n}" for n in c.get("notes", [])]
    return out


def _hours(h: float) -> str:
    """GPU-hours with enough digits that a short run is not shown as 0."""
    return f"{h:,.0f}" if h >= 10 else f"{h:.2g}"


def time_lines(t: dict[str, Any]) -> list[str]:
    """The time section: steps, wall-clock, GPU-hours, predicted scaling efficiency."""
    out = ["time to train",
           f"  {t['tokens']:,.0f} tokens = {t['steps']:,} steps: {fmt_seconds(t['total_s'])} on "
           f"{t['gpus']} GPU{'s' if t['gpus'] != 1 else ''}, {_hours(t['gpu_hours'])} GPU-hours"]
    if t.get("gpu_hours_interval"):
        g = t["gpu_hours_interval"]
        out.append(f"  p10-p90: {fmt_seconds(t['days_interval']['p10'] * 86400)} - "
                   f"{fmt_seconds(t['days_interval']['p90'] * 86400)}, {g['p10']:,.0f} - {g['p90']:,.0f} GPU-hours")
    if t.get("scaling"):
        rows = [[r["gpus"], r["dp"], fmt_seconds(r["step_time_s"]), f"{r['tokens_per_s_per_gpu']:,.0f}",
                 f"{100 * r['mfu']:.1f}%", f"{100 * r['scaling_efficiency']:.0f}%"] for r in t["scaling"]]
        out.append("  predicted scaling (same global batch):")
        out += ["  " + line for line in table(rows, ["gpus", "dp", "step", "tok/s/GPU", "MFU", "efficiency"],
                                              align="rrrrrr").splitlines()]
    return out
