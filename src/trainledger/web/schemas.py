"""Request bodies of the web API (pydantic: validation, OpenAPI schema and error locations for free).

The web app never reads or writes a file the client names: model, GPU and network fields accept
catalog names only (checked in :mod:`trainledger.web.service`), the corpus and price-file fields of
the CLI do not exist here, and a pasted config.json travels in the body as text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, create_model, model_validator
from pydantic.fields import FieldInfo

from trainledger.spec.base import Spec
from trainledger.load.plan import PlanInputs
from trainledger.planner.search import Job

#: longest pasted config.json accepted (characters); real ones are a few KB.
MAX_CONFIG_CHARS = 200_000
#: most GPUs a web request may plan for (keeps one planner request inside the time limit).
MAX_WEB_GPUS = 4096


#: JSON types as the OpenAPI schema states them: no bool for a number, no "8" for an integer
STRICT = ConfigDict(frozen=True, extra="forbid", validate_default=True, strict=True)


class JsonSpec(Spec):
    """A strict request body that still reads integers as JSON Schema does: 8.0 is the integer 8."""

    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _integral_floats(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ints = {k for k, f in cls.model_fields.items() if f.annotation in (int, int | None)}
        return {k: int(v) if k in ints and type(v) is float and v.is_integer() and abs(v) < 2**63 else v
                for k, v in data.items()}


_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

#: what the web app narrows on a PlanInputs field: catalog names only (no paths), and request sizes
#: that keep one request inside its time budget. Everything else is PlanInputs' own declaration.
WEB_LIMITS: dict[str, dict[str, Any]] = {
    "model": {"max_length": 100, "pattern": r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
              "description": "model preset name (see GET /api/presets); ignored when config_json is given"},
    "gpu": {"max_length": 80, "pattern": _NAME, "description": "catalog GPU (GET /api/gpus)"},
    "intra": {"max_length": 80, "pattern": _NAME},
    "network": {"max_length": 80, "pattern": _NAME, "description": "inter-node network (catalog name)"},
    "gpus": {"le": MAX_WEB_GPUS}, "gpus_per_node": {"le": 72}, "dp": {"le": MAX_WEB_GPUS},
    "seq_len": {"le": 1_048_576}, "doc_len": {"le": 1_048_576}, "micro_batch": {"le": 4096}, "grad_accum": {"le": 65536},
    "global_batch": {"le": 1 << 24}, "lora_rank": {"le": 4096}, "lora_targets": {"max_length": 64, "strict": False},  # JSON has lists, not tuples
    "tokens": {"le": 1e15}, "tp": {"le": 64}, "pp": {"le": 256}, "cp": {"le": 64}, "ep": {"le": 256},
    "vp": {"le": 64}, "generate_len": {"le": 1_048_576}, "recompute_layers": {"le": 100_000},
}
#: PlanInputs fields the web app does not take: they name files on the server
WEB_EXCLUDED = ("corpus",)


def web_fields(source: type[Spec], names: Any, limits: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``create_model`` field definitions: each field as declared in ``source``, narrowed by ``limits``."""
    out: dict[str, Any] = {}
    for name in names:
        info = source.model_fields[name]
        if name in limits:
            info = FieldInfo.merge_field_infos(info, Field(**limits[name]))
        out[name] = (info.annotation, info)
    return out


#: Plan inputs of the web form: the PlanInputs fields (same names, units, defaults and help),
#: catalog names only, no paths.
WebInputs = create_model(
    "WebInputs", __base__=JsonSpec, __doc__="Plan inputs of the web form; names as the CLI flags.",
    **web_fields(PlanInputs, [n for n in PlanInputs.model_fields if n not in WEB_EXCLUDED], WEB_LIMITS),
)


class Prices(JsonSpec):
    """Cost inputs the page may set (the rest come from the price catalog)."""

    provider: str | None = Field(None, max_length=40, pattern=r"^[a-z0-9-]+$",
                                 description="cloud provider in the price catalog")
    pricing: Literal["on-demand", "reserved", "spot"] = "on-demand"
    price_per_gpu_hour: float | None = Field(None, gt=0, le=1000, description="USD per GPU-hour")


class EstimateRequest(Spec):
    """POST /api/estimate and /api/report."""

    inputs: WebInputs = WebInputs()
    config_json: str | None = Field(None, max_length=MAX_CONFIG_CHARS,
                                    description="a pasted Hugging Face config.json (text); replaces the preset")
    compare_gpus: list[str] = Field(default_factory=list, max_length=8,
                                    description="candidate GPUs for the comparison chart [a default set]")
    prices: Prices = Prices()


class ReportRequest(EstimateRequest):
    """POST /api/report: the estimate request plus report-only fields."""

    format: Literal["html", "md", "json", "txt"] = "html"
    checkpoint_dir: str | None = Field(None, max_length=200, description="shown on the acceptance sheet only")


#: the planner fields of the web app: the Job's own declarations (shared with PlanInputs), narrowed
PLAN_LIMITS: dict[str, dict[str, Any]] = {
    **{k: WEB_LIMITS[k] for k in ("model", "seq_len", "doc_len", "global_batch", "tokens", "lora_rank")},
    "deadline_days": {"le": 3650}, "max_gpus": {"default": 512, "le": MAX_WEB_GPUS}, "top": {"le": 50},
}
_PLAN_FIELDS = ("model", "framework", "method", "precision", "optimizer", "attention", "seq_len", "doc_len",
                "global_batch", "tokens", "deadline_days", "deadline_quantile", "max_gpus", "lora_rank", "headroom",
                "rank_by", "top")

#: POST /api/plan: a planner job (see `trainledger plan`); ``gpus`` are candidate GPU names.
PlanRequest = create_model(
    "PlanRequest", __base__=JsonSpec, __doc__="POST /api/plan: a planner job (see `trainledger plan`).",
    gpus=(list[str], Field(default_factory=list, max_length=40, description="candidate GPUs [all catalog GPUs]")),
    config_json=(str | None, Field(None, max_length=MAX_CONFIG_CHARS,
                                   description="a pasted Hugging Face config.json (text); replaces the preset")),
    **web_fields(Job, _PLAN_FIELDS, PLAN_LIMITS),
)


class ExportRequest(Spec):
    """POST /api/export: launch/config files of the plan (issue 10), returned as text."""

    inputs: WebInputs = WebInputs()
    format: str = Field(max_length=20, pattern=r"^[a-z-]+$", description="torchrun, accelerate, deepspeed, ...")
    config_json: str | None = Field(None, max_length=MAX_CONFIG_CHARS,
                                    description="a pasted Hugging Face config.json (text); replaces the preset")


class ErrorBody(Spec):
    """Every 4xx/5xx answer of the API: the message and the form field that caused it (or null)."""

    error: str
    field: str | None = None


#: the error answers every API route documents in the OpenAPI schema.
ERROR_RESPONSES: dict[int | str, dict] = {
    code: {"model": ErrorBody, "description": what} for code, what in (
        (400, "the inputs cannot be planned as given"), (413, "request body too large"),
        (422, "a field is out of range or of the wrong type"), (503, "the request took too long"))
}
