"""What the web endpoints do, without the web framework: validate names, call the library, shape views.

Everything a page shows is formatted here (GiB, days, $) from what the library returned, with the
same helpers as the reports — the page computes nothing. Errors are :class:`WebError` (an HTTP
status, a message and the form field that caused it).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from trainledger.load.catalog import all_gpus, all_networks, names
from trainledger.errors import TrainledgerError, did_you_mean
from trainledger.estimate import EstimateOptions
from trainledger.estimate.options import CostOptions
from trainledger.load.hf import from_hf_config, load_model, preset_names
from trainledger.spec.layout import Offload
from trainledger.spec.model import ModelSpec
from trainledger.load.plan import PlanInputs, parse_inputs
from trainledger.spec.recipe import ATTENTIONS, METHODS, OPTIMIZERS, PRECISIONS, RECOMPUTES
from trainledger.report import build_report, render
from trainledger.report.document import build_document, summary
from trainledger.planner.sweeps import DEFAULT_COMPARE_GPUS
from trainledger.units import GIB, fmt_params
from trainledger.web.schemas import EstimateRequest, ExportRequest, PlanRequest, ReportRequest, WebInputs

#: fields a library error message may name, in the words it uses, -> the form field.
_FIELD_WORDS = (
    ("config.json", "config_json"), ("model_type", "config_json"), ("unknown model", "model"),
    ("unknown gpu", "gpu"), ("network", "network"), ("dp·tp", "dp"), ("tp·", "tp"), ("tp=", "tp"), ("pp=", "pp"), ("cp=", "cp"),
    ("ep=", "ep"), ("vp", "vp"), ("zero", "zero"), ("global batch", "global_batch"),
    ("micro-batch", "micro_batch"), ("seq_len", "seq_len"), ("gpus-per-node", "gpus_per_node"),
    ("whole nodes", "gpus_per_node"), ("dp", "dp"), ("world size", "gpus"), ("gpus", "gpus"),
)


class WebError(Exception):
    """A request the app cannot answer as asked: HTTP status, message, and the field to blame."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field, self.status = field, status

    def __reduce__(self) -> tuple:  # crosses the pipe from a request's worker process intact
        return (WebError, (str(self), self.field, self.status))


def child_error(exc: BaseException) -> BaseException:
    """An exception raised in a request's worker process, as the parent should raise it."""
    if isinstance(exc, WebError):
        return exc
    if isinstance(exc, TrainledgerError):
        return library_error(exc)
    if isinstance(exc, MemoryError):
        return WebError("the request needs more memory than one web request may use; narrow it "
                        "(a smaller model, fewer GPUs)", None, 503)
    return RuntimeError(f"{type(exc).__name__}: {exc}"[:2000])


def finite(obj: Any) -> Any:
    """JSON has no NaN or infinity: such values (e.g. a break-even that never comes) become null."""
    from trainledger.format import finite_json

    return finite_json(obj)


def field_of(message: str) -> str | None:
    low = message.lower()
    return next((f for word, f in _FIELD_WORDS if word in low), None)


def library_error(exc: TrainledgerError) -> WebError:
    """The library names the input an error concerns (``exc.field``); older errors fall back to words."""
    return WebError(str(exc), getattr(exc, "field", None) or field_of(str(exc)))


# ---- catalogs -------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def presets() -> list[dict[str, Any]]:
    out = []
    for n in preset_names():
        m = load_model(n)
        out.append({"name": n, "source": m.source, "model_type": m.model_type, "params": m.params.total,
                    "params_label": fmt_params(m.params.total), "layers": m.num_layers, "hidden": m.hidden_size,
                    "moe": m.moe is not None})
    return out


def search_presets(q: str | None) -> list[dict[str, Any]]:
    q = (q or "").strip().lower()
    return [p for p in presets() if not q or q in p["name"] or q in (p["source"] or "").lower()]


@lru_cache(maxsize=1)
def gpus() -> list[dict[str, Any]]:
    return [{"name": g.name, "display_name": g.display_name, "vendor": g.vendor, "memory_gib": g.memory_bytes / GIB,
             "label": f"{g.display_name} ({g.memory_bytes / GIB:.0f} GiB)", "bf16_tflops": g.bf16_tflops,
             "link": g.link} for g in all_gpus()]


from trainledger.spec.serving import ENGINES, KV_CACHE_DTYPES, QuantizationInput  # noqa: E402 - serving menus (issue 16)


def options() -> dict[str, Any]:
    """Choices and defaults of every form field (the page builds its menus from this)."""
    from trainledger.runconfig import EXPORT_FORMATS, SERVING_EXPORT_FORMATS

    return {"method": list(METHODS), "precision": list(PRECISIONS), "optimizer": list(OPTIMIZERS),
            "recompute": list(RECOMPUTES), "attention": list(ATTENTIONS), "offload": list(Offload.__args__),  # type: ignore[attr-defined]
            "network": [n.name for n in all_networks("inter-node")], "export_formats": list(EXPORT_FORMATS + SERVING_EXPORT_FORMATS),
            "compare_gpus": list(DEFAULT_COMPARE_GPUS), "defaults": WebInputs().model_dump(mode="json"),
            "serving_engine": list(ENGINES), "quantization": list(QuantizationInput.__args__),  # type: ignore[attr-defined]
            "kv_cache_dtype": list(KV_CACHE_DTYPES)}


# ---- inputs ---------------------------------------------------------------------------------

def _check_name(value: str | None, kind: str, field: str) -> None:
    if value is None:
        return
    choices = names(kind)
    if value.lower() not in choices:
        raise WebError(f"unknown {kind[:-1]} {value!r}.{did_you_mean(value, choices)}", field)


def parse_config(text: str) -> ModelSpec:
    """A pasted config.json, parsed in memory (never written, never executed)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, ints over 4300 digits
        raise WebError(f"config.json is not valid JSON: {exc}", "config_json") from None
    if not isinstance(data, dict):
        raise WebError("config.json must be a JSON object with a 'model_type' field", "config_json")
    try:
        return from_hf_config(data, name=str(data.get("_name_or_path") or "pasted config.json")[:80])
    except TrainledgerError as exc:
        raise WebError(str(exc), "config_json") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # hostile values the readers do not expect
        raise WebError(f"config.json: {exc}", "config_json") from None


#: the name a pasted config.json goes by in the commands and files the page hands out
PASTED_NAME = "config.json"


def precheck(req: Any) -> None:
    """Cheap checks done before a worker process is started: a pasted config that cannot be read
    (a 10,000-layer config, bad JSON) is refused without a process (issue 20)."""
    text = getattr(req, "config_json", None)
    if text and text.strip():
        parse_config(text)


def resolve(inputs: WebInputs, config_json: str | None) -> tuple[PlanInputs, ModelSpec | None]:
    """PlanInputs (catalog names checked) and the pasted model, if any."""
    model = parse_config(config_json) if config_json and config_json.strip() else None
    if model is None and inputs.model.lower() not in preset_names():
        raise WebError(f"unknown model preset {inputs.model!r}.{did_you_mean(inputs.model, preset_names())} "
                       "Pick a preset or paste a config.json.", "model")
    _check_name(inputs.gpu, "gpus", "gpu")
    _check_name(inputs.network, "networks", "network")
    _check_name(inputs.intra, "networks", "intra")
    data = inputs.model_dump(exclude_unset=True)
    # a pasted config is the model: commands and exports name the file the user saves it as
    data["model"] = PASTED_NAME if model is not None else inputs.model.lower()
    try:
        return parse_inputs(data, "inputs"), model
    except TrainledgerError as exc:
        raise library_error(exc) from None


def estimate_options(req: EstimateRequest) -> EstimateOptions:
    p = req.prices
    if p.provider is not None:
        from trainledger.estimate.run.prices import load_prices

        providers = sorted({q.provider for g in names("gpus") for q in load_prices().quotes_for(g)})
        if p.provider not in providers:
            raise WebError(f"unknown provider {p.provider!r}; known: {', '.join(providers)}", "provider")
    cost = CostOptions(**{k: v for k, v in p.model_dump().items() if v is not None})
    return EstimateOptions(cost=cost)


def _compare(req: EstimateRequest) -> list[str]:
    for g in req.compare_gpus:
        _check_name(g, "gpus", "compare_gpus")
    return [g.lower() for g in req.compare_gpus] or list(DEFAULT_COMPARE_GPUS)


# ---- endpoints ------------------------------------------------------------------------------

def _block_json(b: tuple) -> dict[str, Any]:
    kind = b[0]
    if kind == "table":
        return {"kind": "table", "headers": b[1], "rows": b[2]}
    if kind == "kv":
        return {"kind": "kv", "items": [list(x) for x in b[1]]}
    return {"kind": kind, "content": b[1]}


def estimate_view(req: EstimateRequest) -> dict[str, Any]:
    """The live panel: verdict, headline figures, charts and tables of one plan."""
    inputs, model = resolve(req.inputs, req.config_json)
    try:
        data = build_report(inputs, estimate_options(req), model=model, compare_gpus=_compare(req))
    except TrainledgerError as exc:
        raise library_error(exc) from None
    mem = data.estimate.get("memory") or {}
    order = ("summary", "gpus", "memory", "serving", "seq", "mb", "time", "scaling", "risks", "sheet", "facility",
             "notes")
    docs = sorted((s for s in build_document(data) if s["id"] in order), key=lambda s: order.index(s["id"]))
    sections = [{"id": s["id"], "title": s["title"], "blocks": [_block_json(b) for b in s["blocks"]]} for s in docs]
    return finite({"title": data.title, "fits": bool(mem.get("fits")),
            "verdict": "FITS" if mem.get("fits") else "DOES NOT FIT",
            "summary": [list(x) for x in summary(data.estimate)], "sections": sections,
            "risks": data.risks, "estimate": data.estimate, "model_label": data.estimate["plan"]["model"]})


def report_file(req: ReportRequest) -> tuple[str, str, str]:
    """(text, media type, file name) of the full report."""
    inputs, model = resolve(req.inputs, req.config_json)
    try:
        data = build_report(inputs, estimate_options(req), model=model, compare_gpus=_compare(req),
                            checkpoint_dir=req.checkpoint_dir)
    except TrainledgerError as exc:
        raise library_error(exc) from None
    media = {"html": "text/html", "md": "text/markdown", "json": "application/json", "txt": "text/plain"}[req.format]
    stem = "".join(c if c.isalnum() or c in "-." else "-" for c in data.estimate["plan"]["model"])[:60]
    return render(data, req.format), media, f"trainledger-report-{stem}.{req.format}"


def plan_view(req: PlanRequest) -> dict[str, Any]:
    """Run the planner; ranked plans and rejected candidates, with their formatted rows."""
    from trainledger.report.document import plans_blocks
    from trainledger.planner.search import Job, search

    model = parse_config(req.config_json) if req.config_json and req.config_json.strip() else None
    if model is None and req.model.lower() not in preset_names():
        raise WebError(f"unknown model preset {req.model!r}.{did_you_mean(req.model, preset_names())}", "model")
    for g in req.gpus:
        _check_name(g, "gpus", "plan_gpus")
    if req.rank_by in ("time", "cost") and not req.tokens:
        raise WebError(f"ranking by {req.rank_by} needs a token budget: give one, or rank by GPU count", "tokens")
    job_data = req.model_dump(exclude={"gpus", "config_json"})
    if req.precision is None:  # the method's default, as the estimate panel uses it
        from trainledger.load.hf import load_model
        from trainledger.spec.precision import default_precision

        job_data["precision"] = default_precision(req.method, model or load_model(req.model.lower()), None)[0]
    job_data.update(model=PASTED_NAME if model is not None else req.model.lower(),
                    gpus=tuple(g.lower() for g in req.gpus))
    try:
        res = search(Job(**job_data), model=model).to_dict()
    except TrainledgerError as exc:
        raise library_error(exc) from None
    blocks = [_block_json(b) for b in plans_blocks(res)]
    return finite({"result": res, "blocks": blocks, "count": len(res["plans"]),
                   "rejected_count": len(res["rejected"])})


def export_files(req: ExportRequest) -> dict[str, Any]:
    from trainledger.runconfig import EXPORT_FORMATS, SERVING_EXPORT_FORMATS, export_plan

    if req.format not in EXPORT_FORMATS + SERVING_EXPORT_FORMATS:
        raise WebError(f"unknown export format {req.format!r}; formats: "
                       f"{', '.join(EXPORT_FORMATS + SERVING_EXPORT_FORMATS)}", "export_format")
    inputs, model = resolve(req.inputs, req.config_json)
    try:
        files = export_plan(inputs, req.format, model)
    except TrainledgerError as exc:
        raise library_error(exc) from None
    return {"files": [{"name": f.name, "format": f.fmt, "text": f.text} for f in files]}
