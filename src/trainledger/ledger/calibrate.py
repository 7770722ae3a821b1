"""Per-environment corrections fitted from the measurements in the ledger.

``fit(records)`` reads ``verify memory`` measurements (each holds the ``measured`` and the
``predicted`` numbers of one plan) of one environment and fits three corrections, each the
*median* over the measurements that have it (robust to one odd run):

* ``runtime_overhead_fraction``  = median(measured peak allocated / predicted - 1): tensors the
  analytical model does not see on this stack (all devices);
* ``allocator_reserve_fraction`` = median((peak reserved - peak allocated) / peak allocated):
  the caching allocator's reserve on this GPU (CUDA measurements only; the estimator assumes a
  default, see ``estimate/memory/device.py``);
* ``step_time_scale`` = median(measured / predicted step time) and the achievable matmul
  efficiency it implies, ``achieved MFU = predicted MFU / step_time_scale`` (CUDA only: a CPU step
  time says nothing about the plan's GPU).

``apply(estimate_dict, env)`` adds the calibrated numbers next to the analytical ones (it never
overwrites them) and a ``calibration`` block saying whether the estimate is calibrated, for which
environment and from how many measurements. Never imports torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from trainledger.errors import LedgerError
from trainledger.ledger import Ledger, Record

MEMORY_COMMAND = "verify memory"
CALIBRATION_COMMAND = "calibrate"
#: every command whose records hold ``measured`` and ``predicted`` of one plan: ``verify memory``,
#: a run recorded by the training callbacks (verify/callbacks.py), a training log imported with
#: ``trainledger ledger import``
MEASURED_COMMANDS = (MEMORY_COMMAND, "train run", "ledger import")


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf") and v > 0


def fit(records: Iterable[Record]) -> dict[str, Any]:
    """Fit the corrections from measured records (all of one environment): ``verify memory``
    runs, training runs recorded by the callbacks and imported training logs."""
    overhead, reserve, time_scale, mfu = [], [], [], []
    used = []
    for r in records:
        if r.kind != "measurement" or r.command not in MEASURED_COMMANDS:
            continue
        m, p = r.result.get("measured") or {}, r.result.get("predicted") or {}
        if not isinstance(m, dict) or not isinstance(p, dict):
            continue  # a damaged or foreign record (issue 20): not a measurement to fit from
        has_mem = all(_number(d.get(k)) for d, k in ((m, "peak_allocated_bytes"), (p, "peak_allocated_bytes")))
        t = r.result.get("time") or {}
        has_time = (m.get("device") == "cuda" and isinstance(t, dict) and _number(t.get("measured"))
                    and _number(t.get("predicted")))
        if m.get("oom") or not (has_mem or has_time):
            continue
        used.append(r.id)
        if not has_mem:  # a training log with step times only (e.g. trainer_state.json)
            scale = t["measured"] / t["predicted"]
            time_scale.append(scale)
            if _number(p.get("mfu")):
                mfu.append(p["mfu"] / scale)
            continue
        overhead.append(m["peak_allocated_bytes"] / p["peak_allocated_bytes"] - 1.0)
        if m.get("device") == "cuda" and _number(m.get("peak_reserved_bytes")):
            reserve.append((m["peak_reserved_bytes"] - m["peak_allocated_bytes"]) / m["peak_allocated_bytes"])
            t = r.result.get("time") or {}
            if isinstance(t, dict) and _number(t.get("measured")) and _number(t.get("predicted")):
                scale = t["measured"] / t["predicted"]
                time_scale.append(scale)
                if _number(p.get("mfu")):
                    mfu.append(p["mfu"] / scale)
    return {
        "n_measurements": len(used), "record_ids": used,
        "terms": {
            "runtime_overhead_fraction": {"value": _median(overhead), "n": len(overhead)},
            "allocator_reserve_fraction": {"value": _median(reserve), "n": len(reserve)},
            "step_time_scale": {"value": _median(time_scale), "n": len(time_scale)},
            "achievable_mfu": {"value": _median(mfu), "n": len(mfu)},
        },
    }


def calibrate(ledger: Ledger, env: Mapping[str, Any]) -> dict[str, Any]:
    """Fit the corrections for ``env`` from its measurements and store them in the ledger."""
    env_id = env["env_id"]
    fitted = fit(ledger.list(kind="measurement", env_id=env_id))
    fitted["env_id"] = env_id
    if fitted["n_measurements"] == 0:
        raise LedgerError(f"no usable measurement for environment {env_id} in {ledger.path}; run "
                          "`trainledger verify memory ...`, train with trainledger's callback, or "
                          "`trainledger ledger import` a training log first")
    fitted["id"] = ledger.add("calibration", CALIBRATION_COMMAND, fitted, env=env)
    return fitted


def latest(ledger: Ledger, env_id: str) -> dict[str, Any] | None:
    recs = ledger.list(kind="calibration", env_id=env_id, command=CALIBRATION_COMMAND, limit=1)
    if not recs:
        return None
    out = dict(recs[0].result)
    out["id"], out["created_at"] = recs[0].id, recs[0].created_at
    return out


def apply_terms(estimate: Mapping[str, Any], cal: Mapping[str, Any] | None, env_id: str | None) -> dict[str, Any]:
    """Pure part of :func:`apply`: add calibrated values from a fitted calibration."""
    d = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in estimate.items()}
    if not cal or not cal.get("n_measurements"):
        d["calibration"] = {"calibrated": False, "env_id": env_id, "n_measurements": 0,
                            "reason": "no calibration for this environment (run `trainledger calibrate`)"}
        return d
    terms = {k: v["value"] for k, v in cal["terms"].items() if v.get("value") is not None}
    mem = d.get("memory")
    if isinstance(mem, dict) and mem.get("peak_allocated_bytes"):
        alloc = mem["peak_allocated_bytes"] * (1 + terms.get("runtime_overhead_fraction", 0.0))
        mem["calibrated_peak_allocated_bytes"] = int(round(alloc))
        if "allocator_reserve_fraction" in terms:
            mem["calibrated_peak_reserved_bytes"] = int(round(alloc * (1 + terms["allocator_reserve_fraction"])))
    comp = d.get("compute")
    if isinstance(comp, dict) and comp.get("step_time_s") and "step_time_scale" in terms \
            and "calibrated_step_time_s" not in comp:
        comp["calibrated_step_time_s"] = comp["step_time_s"] * terms["step_time_scale"]
    d["calibration"] = {"calibrated": True, "env_id": env_id, "n_measurements": cal["n_measurements"],
                        "calibration_id": cal.get("id"), "terms": terms}
    return d


def apply(estimate: Mapping[str, Any], env: Mapping[str, Any] | None = None,
          ledger: Ledger | None = None) -> dict[str, Any]:
    """Add this environment's latest calibration to an estimate dict (``Estimate.to_dict()``).

    A time calibration (``trainledger calibrate --measured-step-time / --log``) is applied when its
    stack fingerprint matches the estimate's (any machine: it describes the measured cluster, not
    this one); otherwise the estimate says why it was refused.
    """
    from trainledger.ledger import fingerprint

    env = env or fingerprint()
    own = ledger is None
    ledger = ledger or Ledger()
    try:
        d = apply_time(estimate, ledger)
        mem_cal = latest(ledger, env["env_id"])
        out = apply_terms(d, mem_cal, env["env_id"])
        tc = (d.get("compute") or {}).get("time_calibration")
        if tc and tc.get("calibrated") and not out["calibration"].get("calibrated"):
            out["calibration"] = {"calibrated": True, "env_id": env["env_id"],
                                  "n_measurements": tc.get("n_runs") or 1,
                                  "calibration_id": tc.get("calibration_id"), "terms": {},
                                  "time_only": True}
        return out
    finally:
        if own:
            ledger.close()


TIME_COMMAND = "calibrate time"


def apply_time(estimate: Mapping[str, Any], ledger: Ledger) -> dict[str, Any]:
    """The estimate with ``compute.time_calibration`` (and ``calibrated_step_time_s``) added."""
    from trainledger.estimate.time import calibration as tcal

    d = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in estimate.items()}
    comp = d.get("compute")
    if not isinstance(comp, dict) or not comp.get("stack_profile"):
        return d
    fp = tcal.fingerprint(comp, d.get("plan") or {})
    refused = None
    for rec in ledger.list(kind="calibration", command=TIME_COMMAND, limit=50):
        got = tcal.apply(comp, fp, rec.result)
        if got["calibrated"]:
            got["calibration_id"] = rec.id
            comp["time_calibration"] = got
            comp["calibrated_step_time_s"] = got["step_time_s"]
            from trainledger.estimate.time.intervals import time_interval

            comp["calibrated_step_time_interval_s"] = time_interval(
                got["step_time_s"], str(fp.get("framework")), str(fp.get("gpu_family")), calibrated=True)
            return d
        refused = refused or got["reason"]
    if refused:
        comp["time_calibration"] = {"calibrated": False, "reason": refused}
    return d


def calibrate_time(ledger: Ledger, runs: list[tuple[Any, float]], source: str) -> dict[str, Any]:
    """Fit time factors from measured runs [(Plan, measured step seconds)] and store them."""
    from trainledger.estimate.time import calibration as tcal
    from trainledger.estimate.time import estimate_compute

    fit_runs = []
    for plan, meas in runs:
        comp = estimate_compute(plan).to_dict()
        fp = tcal.fingerprint(comp, {"attention": plan.recipe.attention,
                                     "stack_version": plan.runtime.stack_version})
        fit_runs.append((comp, fp, meas))
    fitted = tcal.fit(fit_runs)
    fitted["source"] = source
    fitted["id"] = ledger.add("calibration", TIME_COMMAND, fitted)
    return fitted


def render_time(fitted: Mapping[str, Any]) -> str:
    fp = fitted["fingerprint"]
    lines = [f"time calibration {fitted.get('id')} ({fitted['method']}) from {fitted['n_runs']} run(s), "
             f"{fitted.get('source', '')}",
             f"  environment: {fp.get('gpu')}"
             + (f" at {fp['power_limit_w']:g} W" if fp.get("power_limit_w") else "")
             + f", {fp.get('framework')}"
             + (f" {fp['stack_version']}" if fp.get("stack_version") else "")
             + f", {fp.get('matmul_dtype')} GEMMs, {fp.get('kernels')} kernels, attention {fp.get('attention')}"]
    for k, v in fitted["factors"].items():
        lines.append(f"  {k:<10} x{v:.3f}")
    for m, p in zip(fitted["measured_step_s"], fitted["predicted_step_s"]):
        lines.append(f"  measured {m:.4g} s per step, predicted {p:.4g} s before calibration")
    lines.append("  applies to estimates of the same GPU, power limit, stack (release, where both state it), "
                 "attention kernel and precision (estimate --calibrated); others are refused")
    return "\n".join(lines)


def render(fitted: Mapping[str, Any]) -> str:
    lines = [f"calibration {fitted.get('id')} for environment {fitted['env_id']} from "
             f"{fitted['n_measurements']} measurement(s)"]
    for name, t in fitted["terms"].items():
        v = t["value"]
        shown = "n/a (no measurement has it)" if v is None else f"{v:.4g}"
        lines.append(f"  {name:<28} {shown}  (n={t['n']})")
    return "\n".join(lines)


def finish_estimate(estimate: Mapping[str, Any], *, calibrated: bool = False, store: bool = True,
                    ledger_path: str | None = None, command: str = "estimate") -> dict[str, Any]:
    """The estimate command's hook: apply the calibration when asked, store the estimate.

    ``estimate`` is ``Estimate.to_dict()`` (its ``plan`` block is stored as the record's plan).
    Without ``calibrated`` the result still says ``calibration: {calibrated: false}``, so every
    estimate output states whether it is calibrated. Returns the (possibly calibrated) dict.
    """
    from trainledger.ledger import fingerprint

    env = fingerprint()
    with Ledger(ledger_path) as led:
        if calibrated:
            out = apply(estimate, env, led)
        else:
            out = apply_terms(estimate, None, env["env_id"])
            out["calibration"]["reason"] = "not asked; --calibrated applies this machine's calibration"
        if store:
            out["ledger_id"] = led.add("estimate", command, out, env=env, plan=out.get("plan"))
    return out
