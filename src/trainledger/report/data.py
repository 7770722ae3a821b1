"""Everything a report shows, computed by the library before any renderer runs.

``build_report`` estimates the plan, runs the what-if sweeps, builds the procurement sheet, the
risks and the upgrade triggers, and attaches planner and verify results when given. The result is
plain data (``ReportData.to_dict()`` is the JSON report); renderers only format and draw it.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainledger import __version__
from trainledger.errors import SpecError
from trainledger.estimate import EstimateOptions, estimate
from trainledger.spec.model import ModelSpec
from trainledger.load.plan import PlanInputs, build_plan, parse_inputs
from trainledger.format import finite_json
from trainledger.planner import risks as _risks
from trainledger.report import sheet as _sheet
from trainledger.planner import sweeps


@dataclass
class ReportData:
    """The content of one report (see the module docstring)."""

    title: str
    generated: str
    version: str
    inputs: dict[str, Any]
    estimate: dict[str, Any]
    gpu_compare: list[dict[str, Any]] = field(default_factory=list)
    seq_sweep: dict[str, Any] | None = None
    mb_sweep: dict[str, Any] | None = None
    count_sweep: dict[str, Any] | None = None
    sheet: dict[str, Any] | None = None
    risks: list[dict[str, str]] = field(default_factory=list)
    triggers: list[dict[str, str]] = field(default_factory=list)
    plan_result: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    facility: dict[str, Any] | None = None
    soak: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return finite_json(asdict(self))


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)))


def read_json(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object written by another trainledger command (plan --json, verify memory --json)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{p}: no such file (expected the output of `{what}`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"{p}: not a JSON file written by `{what}` ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a JSON object written by `{what}`")
    return data


def inputs_from_plan_result(result: dict[str, Any], index: int = 0) -> PlanInputs:
    """Plan inputs of the ``index``-th ranked plan of a ``plan --json`` result."""
    plans = result.get("plans")
    if not isinstance(plans, list) or not plans:
        raise SpecError("plan result: no ranked plans in it (field 'plans' is empty or missing)")
    if not 0 <= index < len(plans):
        raise SpecError(f"plan result: --pick {index + 1} is out of range (1..{len(plans)})")
    job, p = result.get("job") or {}, plans[index]
    lay = p.get("layout") or {}
    data: dict[str, Any] = {k: job[k] for k in ("model", "method", "precision", "optimizer", "attention",
                                                 "seq_len", "tokens", "lora_rank", "headroom") if job.get(k) is not None}
    # the picked plan's stack and optimizer (a search over several stacks ranks plans of each)
    data.update(gpu=p.get("gpu"), gpus=p.get("gpus"), network=p.get("network"),
                framework=p.get("framework") or job.get("framework"), optimizer=p.get("optimizer") or job.get("optimizer"))
    if p.get("nodes"):
        data["gpus_per_node"] = p["gpus"] // p["nodes"]
    for k in ("dp", "tp", "pp", "cp", "ep", "vp", "zero", "offload", "micro_batch", "grad_accum", "recompute", "sp"):
        if lay.get(k) is not None:
            data[k] = lay[k]
    return parse_inputs({k: v for k, v in data.items() if v is not None}, "plan result")


#: plan fields a measurement must share with the report's plan to be shown as its check
_SAME_PLAN = ("model", "params", "method", "precision", "optimizer", "seq_len", "micro_batch", "recompute",
              "attention", "lora_rank", "zero", "tp", "pp", "cp", "offload")
#: relative difference of the peak the measurement's own run predicted above which it is another plan
_SAME_PEAK = 0.01


def check_same_plan(result: dict[str, Any], est: dict[str, Any]) -> None:
    """Refuse a verify result measured for another plan than the report's (model, recipe, layout).

    A ``verify memory --json`` result names its plan (``plan``, the estimate's plan summary); an
    ``accept`` result names its inputs. Fields both name must agree; and the peak that the
    measurement's own estimate predicted must be the report's within 1% (older results without
    ``plan``: this alone decides).
    """
    mine = est.get("plan") or {}
    theirs = result.get("plan") if isinstance(result.get("plan"), dict) else {}
    diffs = [f"{k} {theirs[k]!r} (this report: {mine[k]!r})" for k in _SAME_PLAN
             if theirs.get(k) is not None and mine.get(k) is not None and theirs[k] != mine[k]]
    pred = (result.get("predicted") or {}).get("peak_allocated_bytes")
    ours = (est.get("memory") or {}).get("peak_allocated_bytes")
    if not diffs and pred and ours and abs(pred - ours) > _SAME_PEAK * ours:
        diffs.append(f"its predicted peak {pred / 2**30:.2f} GiB (this report: {ours / 2**30:.2f} GiB)")
    if diffs:
        raise SpecError("--verify-json: the measurement is of another plan: " + "; ".join(diffs[:6])
                        + ". Run `trainledger verify memory` with this report's plan flags and pass its --json")


def verify_section(result: dict[str, Any], est: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measured vs predicted rows of a ``verify memory --json`` (or ``verify accept``) result.

    Terms are compared only where the run measured them: ``verify memory`` records the bytes of
    every category at the peak; ``verify accept`` records allocator totals per phase (CUDA) or
    nothing (CPU), so its rows are the totals and phases, and the rest reads "not measured".
    """
    from trainledger.verify.compare import compare_memory  # torch-free

    measured, predicted = result.get("measured"), result.get("predicted")
    if not isinstance(measured, dict) or not isinstance(predicted, dict):
        raise SpecError("verify result: needs 'measured' and 'predicted' objects (output of `verify memory --json`)")
    if est is not None:
        check_same_plan(result, est)
    cmp = result.get("comparison") or compare_memory(measured, predicted)
    categories = cmp.get("categories", []) if measured.get("categories_at_peak") else []
    m, p = measured.get("peak_allocated_bytes"), predicted.get("peak_allocated_bytes")
    err = (p - m) / m if m and p is not None else None
    return {"device": measured.get("device"), "oom": bool(measured.get("oom")),
            "categories": categories, "terms_measured": bool(categories),
            "totals": cmp.get("totals", []), "phases": cmp.get("phases", []), "peak_relative_error": err,
            "within_tolerance": None if err is None else abs(err) <= _sheet.MEMORY_TOLERANCE,
            "tolerance": _sheet.MEMORY_TOLERANCE, "env": measured.get("env") or {},
            "note": measured.get("note")}


def _prices(options: EstimateOptions | None) -> Any:
    from trainledger.estimate.run.prices import load_prices

    return load_prices(options.cost.prices_file if options else None)


def soak_section(result: dict[str, Any]) -> dict[str, Any]:
    """The parts of a ``verify soak --out`` result a report shows (checks, recovery, series)."""
    if not isinstance(result.get("checks"), list) or "series" not in result:
        raise SpecError("soak result: needs 'checks' and 'series' (output of `trainledger verify soak --out FILE`)")
    return {k: result.get(k) for k in ("plan", "device", "nproc", "duration_s", "checkpoint_interval_s", "fault",
                                       "thresholds", "checks", "crossed", "recovery", "series", "summary", "ok")}


def _estimate(plan: Any, options: EstimateOptions | None) -> tuple[dict[str, Any], str | None]:
    """The estimate as JSON data; a part of the estimator not installed is left out and named."""
    try:
        return _jsonable(estimate(plan, options).to_dict()), None
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("trainledger."):
            raise
        opts = sweeps.quiet_options(options)
        return _jsonable(estimate(plan, opts).to_dict()), f"{exc.name}: not available, left out of this report"


def _title(est: dict[str, Any]) -> str:
    p = est["plan"]
    return f"{p['model']} · {p['method']} · {p['gpus']}× {p['gpu']}"


def build_report(inputs: PlanInputs, options: EstimateOptions | None = None, *,
                 model: ModelSpec | None = None, compare_gpus: list[str] | None = None,
                 plan_result: dict[str, Any] | None = None, verify_result: dict[str, Any] | None = None,
                 checkpoint_dir: str | None = None, sweeps_on: bool = True,
                 soak_result: dict[str, Any] | None = None) -> ReportData:
    """Estimate ``inputs`` and gather every section of the report (see the module docstring)."""
    plan = build_plan(inputs, model)
    est, missing = _estimate(plan, options)
    gpus = list(dict.fromkeys([inputs.gpu, *(compare_gpus or sweeps.DEFAULT_COMPARE_GPUS)]))
    data = ReportData(title=_title(est), version=__version__, inputs=inputs.model_dump(mode="json"),
                      generated=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), estimate=est)
    if sweeps_on:
        data.gpu_compare = sweeps.gpu_comparison(inputs, gpus, model, options)
        data.seq_sweep = sweeps.memory_sweep(inputs, "seq_len", sweeps.seq_len_values(inputs.seq_len),
                                             gpus, model, options)
        data.mb_sweep = sweeps.memory_sweep(inputs, "micro_batch", sweeps.micro_batch_values(inputs.micro_batch),
                                            gpus, model, options)
        data.count_sweep = sweeps.gpu_count_sweep(inputs, None, model, options)
        data.triggers = _risks.triggers(inputs, est, model, options)
    data.sheet = _sheet.procurement_sheet(plan, inputs, est, checkpoint_dir)
    from trainledger.report.facility import facility_sheet  # power, racks, UPS, cooling, floor space (issue 19)

    data.facility = facility_sheet(plan, est, _prices(options))
    if soak_result is not None:
        data.soak = soak_section(soak_result)
    data.risks = _risks.risks(est)
    if plan_result is not None:
        data.plan_result = {k: plan_result.get(k) for k in ("job", "plans", "rejected", "evaluated",
                                                             "elapsed_s", "gpu_count")}
    if verify_result is not None:
        data.verify = verify_section(verify_result, est)
    if missing:
        data.notes.append(missing)
    why = {"time": "run time and cost of the run: not estimated (give a token budget)"}
    for sec in ("compute", "time", "energy", "cost", "io", "checkpoint", "host"):
        if sec not in est:
            data.notes.append(why.get(sec, f"{sec}: not estimated"))
    return data

