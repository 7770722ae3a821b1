"""Risks of a plan and the triggers that make it stale (issue 8).

Risks read the estimate (headroom, exposed communication, pipeline bubble, data starvation, host
RAM, interconnect); the thresholds are the planner's (:mod:`trainledger.planner.search`). Upgrade triggers
call the estimator on changed inputs — a longer context, a full fine-tune instead of LoRA, more
tokens, more nodes — and say where the current plan stops holding.
"""

from __future__ import annotations

from typing import Any

from trainledger.errors import TrainledgerError
from trainledger.estimate import EstimateOptions, estimate
from trainledger.spec.model import ModelSpec
from trainledger.load.plan import PlanInputs
from trainledger.planner.candidates import RISK_BUBBLE, RISK_EXPOSED_COMM, RISK_HEADROOM
from trainledger.units import fmt_bytes, fmt_seconds
from trainledger.planner.sweeps import max_fitting, memory_row, quiet_options, variant

#: the longest context a trigger looks for (tokens); beyond it "fits up to at least this".
MAX_CONTEXT_PROBE = 1 << 20


def _risk(name: str, level: str, value: str, text: str) -> dict[str, str]:
    return {"name": name, "level": level, "value": value, "text": text}


def risks(est: dict[str, Any]) -> list[dict[str, str]]:
    """One row per risk with level ok / warn / fail, from the estimate's sections (those present)."""
    out = []
    m = est.get("memory") or {}
    if m.get("usable_bytes"):
        left = 1 - m["device_total_bytes"] / m["usable_bytes"]
        level = "fail" if not m.get("fits") else "warn" if left < RISK_HEADROOM else "ok"
        out.append(_risk("memory headroom", level, f"{100 * left:.0f}%",
                         f"{fmt_bytes(m['device_total_bytes'])} of {fmt_bytes(m['usable_bytes'])} per GPU; "
                         f"below {100 * RISK_HEADROOM:.0f}% free, fragmentation or a longer sample can run out"))
    c = est.get("compute")
    if c:
        ex = c.get("exposed_comm_fraction") or 0.0
        out.append(_risk("communication exposure", "warn" if ex > RISK_EXPOSED_COMM else "ok",
                         f"{100 * ex:.1f}% of the step",
                         f"communication not hidden behind compute; above {100 * RISK_EXPOSED_COMM:.0f}% "
                         "the network, not the GPUs, sets the pace"))
        bub = c.get("bubble_fraction") or 0.0
        out.append(_risk("pipeline bubble", "warn" if bub > RISK_BUBBLE else "ok", f"{100 * bub:.1f}% of the step",
                         f"idle pipeline stages; above {100 * RISK_BUBBLE:.0f}% add micro-batches or "
                         "interleave stages"))
    else:
        out.append(_risk("communication exposure", "n/a", "not estimated", "no time model in this estimate"))
    io = est.get("io")
    if io:
        starved = bool(io.get("starved"))
        out.append(_risk("data starvation", "fail" if starved else "ok",
                         f"{100 * (io.get('read_utilization') or 0):.2f}% of storage read bandwidth",
                         "; ".join(io.get("reasons") or []) or "storage and tokenizers keep up with the GPUs"))
    h = est.get("host")
    if h:
        known = h.get("installed_ram_bytes") is not None
        out.append(_risk("host RAM", "warn" if not known else "ok" if h.get("ram_fits") else "fail",
                         f"{fmt_bytes(h['ram_bytes'])} per node",
                         (f"of {fmt_bytes(h['installed_ram_bytes'])} installed" if known else
                          "installed RAM not given (--host-ram-gib)")
                         + " (pinned batches, data workers, checkpoint staging, offloaded states)"))
    ic = est.get("interconnect")
    if ic:
        out.append(_risk("interconnect", "ok" if ic.get("ok") else "warn",
                         ", ".join(f"{k} {100 * (v.get('utilization') or 0):.0f}% busy"
                                   for k, v in (ic.get("groups") or {}).items()) or "no collectives",
                         "share of each link's bandwidth the plan's collectives need per step"))
    return out


def _context_trigger(inputs: PlanInputs, model: ModelSpec | None, opts: EstimateOptions) -> dict[str, str]:
    edge = max_fitting(inputs, "seq_len", MAX_CONTEXT_PROBE, model, opts, step=256)
    if edge is None:
        text = "the plan does not fit at any context length; change the layout first"
    elif edge >= MAX_CONTEXT_PROBE:
        text = f"fits up to at least {MAX_CONTEXT_PROBE:,} tokens"
    else:
        text = (f"fits up to about {edge:,} tokens per sample on this GPU and layout; "
                f"recompute before training on longer sequences")
    return {"condition": f"longer context (now {inputs.seq_len:,})", "effect": text}


def _method_trigger(inputs: PlanInputs, model: ModelSpec | None, opts: EstimateOptions) -> dict[str, str] | None:
    if inputs.method not in ("lora", "qlora"):
        return None
    try:
        row = memory_row(variant(inputs, model, method="full"), opts)
    except TrainledgerError as exc:
        return {"condition": f"{inputs.method} -> full fine-tune", "effect": f"cannot be planned as is: {exc}"}
    verdict = "still fits" if row["fits"] else "does NOT fit"
    return {"condition": f"{inputs.method} -> full fine-tune",
            "effect": f"needs {fmt_bytes(row['device_total_bytes'])} per GPU: {verdict} "
                      f"({fmt_bytes(row['budget_bytes'])} budget); recompute the layout"}


def _tokens_trigger(inputs: PlanInputs, model: ModelSpec | None, opts: EstimateOptions) -> dict[str, str]:
    if not inputs.tokens:
        return {"condition": "a token budget", "effect": "no token budget given: run time and cost are per step only"}
    try:
        est = estimate(variant(inputs, model, tokens=2 * inputs.tokens), opts).to_dict()
    except TrainledgerError as exc:
        return {"condition": "2x the tokens", "effect": str(exc)}
    tm, cost = est.get("time") or {}, est.get("cost") or {}
    usd = cost.get("cloud_usd")
    return {"condition": f"2x the tokens ({2 * inputs.tokens:,.3g})",
            "effect": f"{fmt_seconds(tm.get('total_s'))} of training"
                      + (f", ${usd:,.0f} in the cloud" if usd is not None else "")
                      + "; the deadline or budget may need more GPUs"}


def _nodes_trigger(inputs: PlanInputs, model: ModelSpec | None, opts: EstimateOptions,
                   est: dict[str, Any]) -> dict[str, str] | None:
    plan = est.get("plan") or {}
    per_node = plan.get("gpus_per_node") or inputs.gpus_per_node or 8
    n = (plan.get("nodes") or 1) * 2 * per_node
    try:
        other = estimate(variant(inputs, model, gpus=n, gpus_per_node=per_node, dp=None), opts).to_dict()
    except TrainledgerError as exc:
        return {"condition": f"{n} GPUs over {n // per_node} nodes", "effect": f"cannot be planned as is: {exc}"}
    a, b = est.get("compute") or {}, other.get("compute") or {}
    if not a or not b:
        return None
    return {"condition": f"moving to {n // per_node} nodes ({n} GPUs, {other['plan'].get('inter') or 'no network'})",
            "effect": f"exposed communication {100 * (a.get('exposed_comm_fraction') or 0):.1f}% -> "
                      f"{100 * (b.get('exposed_comm_fraction') or 0):.1f}% of the step, "
                      f"{a.get('tokens_per_s_per_gpu', 0):,.0f} -> {b.get('tokens_per_s_per_gpu', 0):,.0f} "
                      "tokens/s per GPU; recompute with the real network"}


def triggers(inputs: PlanInputs, est: dict[str, Any], model: ModelSpec | None = None,
             options: EstimateOptions | None = None) -> list[dict[str, str]]:
    """Conditions under which the plan must be recomputed, each with the estimator's answer."""
    opts = quiet_options(options)
    out = [_context_trigger(inputs, model, opts)]
    for t in (_method_trigger(inputs, model, opts), _tokens_trigger(inputs, model, opts),
              _nodes_trigger(inputs, model, opts, est)):
        if t is not None:
            out.append(t)
    mb = max_fitting(inputs, "micro_batch", max(64, 8 * inputs.micro_batch), model, opts)
    out.append({"condition": f"larger micro-batch (now {inputs.micro_batch})",
                "effect": "does not fit at micro-batch 1" if mb is None else
                f"fits up to micro-batch {mb} at seq {inputs.seq_len:,}"})
    out.append({"condition": "another GPU model, driver/CUDA/PyTorch version or attention kernel",
                "effect": "memory and speed terms change: re-run `trainledger report` and the delivery checks"})
    return out
