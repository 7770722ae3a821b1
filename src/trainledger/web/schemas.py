"""Request bodies of the web API (pydantic: validation, OpenAPI schema and error locations for free).

The web app never reads or writes a file the client names: model, GPU and network fields accept
catalog names only (checked in :mod:`trainledger.web.service`), the corpus and price-file fields of
the CLI do not exist here, and a pasted config.json travels in the body as text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .._spec import Spec
from ..layout import Offload, PipelineSchedule
from ..planfile import DEFAULT_GPU, DEFAULT_MODEL
from ..recipe import Attention, Method, Optimizer, Precision, Recompute

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


class WebInputs(JsonSpec):
    """Plan inputs of the web form; names as the CLI flags. Catalog names only, no paths."""

    model: str = Field(DEFAULT_MODEL, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
                       description="model preset name (see GET /api/presets); ignored when config_json is given")
    gpu: str = Field(DEFAULT_GPU, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                     description="catalog GPU (GET /api/gpus)")
    gpus: int = Field(1, gt=0, le=MAX_WEB_GPUS, description="total GPUs")
    gpus_per_node: int | None = Field(None, gt=0, le=72)
    network: str | None = Field(None, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                description="inter-node network (catalog name)")
    method: Method = "full"
    precision: Precision | None = Field(None, description="precision policy [the method's default, see the CLI]")
    optimizer: Optimizer = "adamw"
    seq_len: int = Field(4096, gt=0, le=1_048_576)
    micro_batch: int = Field(1, gt=0, le=4096)
    grad_accum: int = Field(1, gt=0, le=65536)
    global_batch: int | None = Field(None, gt=0, le=1 << 24)
    recompute: Recompute = "none"
    attention: Attention = "sdpa"
    lora_rank: int = Field(16, gt=0, le=4096)
    tokens: float | None = Field(None, gt=0, le=1e15, description="token budget of the run")
    dp: int | None = Field(None, gt=0, le=MAX_WEB_GPUS)
    tp: int = Field(1, gt=0, le=64)
    pp: int = Field(1, gt=0, le=256)
    cp: int = Field(1, gt=0, le=64)
    ep: int = Field(1, gt=0, le=256)
    vp: int = Field(1, gt=0, le=64)
    pp_schedule: PipelineSchedule | None = None
    zero: int = Field(0, ge=0, le=3)
    offload: Offload = "none"
    headroom: float = Field(0.10, ge=0.0, lt=0.9)


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


class PlanRequest(JsonSpec):
    """POST /api/plan: a planner job (see `trainledger plan`)."""

    model: str = Field(DEFAULT_MODEL, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    method: Method = "full"
    precision: Precision | None = Field(None, description="precision policy [the method's default, as estimate]")
    optimizer: Optimizer = "adamw"
    attention: Attention = "sdpa"
    seq_len: int = Field(4096, gt=0, le=1_048_576)
    global_batch: int | None = Field(None, gt=0, le=1 << 24)
    tokens: float | None = Field(None, gt=0, le=1e15)
    deadline_days: float | None = Field(None, gt=0, le=3650)
    max_gpus: int = Field(512, gt=0, le=MAX_WEB_GPUS)
    gpus: list[str] = Field(default_factory=list, max_length=40, description="candidate GPUs [all catalog GPUs]")
    lora_rank: int = Field(16, gt=0, le=4096)
    headroom: float = Field(0.10, ge=0.0, lt=0.9)
    rank_by: Literal["time", "cost", "gpus"] = "time"
    top: int = Field(10, gt=0, le=50)
    config_json: str | None = Field(None, max_length=MAX_CONFIG_CHARS,
                                    description="a pasted Hugging Face config.json (text); replaces the preset")


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
