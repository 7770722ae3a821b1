"""trainledger: what hardware an LLM training or fine-tuning job really needs — and proof.

The public API. Importing this package never imports torch (tested).
"""

from __future__ import annotations

__version__ = "0.1.0"

from trainledger.errors import (  # noqa: E402  (cheap: no pydantic)
    CatalogError,
    CorpusError,
    DoesNotFit,
    LayoutError,
    PlanError,
    SpecError,
    TrainledgerError,
    VerifyError,
)

#: public names imported on first use (PEP 562), so `trainledger --version` and commands that need
#: little start fast: pydantic models and the catalog load only when a name below is touched.
#: name -> (module, attribute); attribute None: the module itself, which is callable
#: (``trainledger.estimate(plan)``, ``trainledger.planner.search(job)``).
_LAZY: dict[str, tuple[str, str | None]] = {
    "estimate": ("trainledger.estimate", None),
    "Estimate": ("trainledger.estimate", "Estimate"),
    "EstimateOptions": ("trainledger.estimate", "EstimateOptions"),
    "search": ("trainledger.planner.search", None),
    "Job": ("trainledger.planner.search", "Job"),
    "build_plan": ("trainledger.load.plan", "build_plan"),
    "PlanInputs": ("trainledger.load.plan", "PlanInputs"),
    "Runtime": ("trainledger.spec.runtime", "Runtime"),
    **{n: ("trainledger.spec.cluster", n) for n in ("Cluster", "GpuSpec", "NetworkSpec", "StorageSpec")},
    "from_hf_config": ("trainledger.load.hf", "from_hf_config"),
    "load_model": ("trainledger.load.hf", "load_model"),
    "Layout": ("trainledger.spec.layout", "Layout"), "ModelSpec": ("trainledger.spec.model", "ModelSpec"),
    "Plan": ("trainledger.spec.plan", "Plan"), "Recipe": ("trainledger.spec.recipe", "Recipe"),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'trainledger' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)


__all__ = [
    "__version__",
    "estimate",
    "Estimate",
    "EstimateOptions",
    "search",
    "Job",
    "build_plan",
    "PlanInputs",
    "Runtime",
    "Cluster",
    "GpuSpec",
    "NetworkSpec",
    "StorageSpec",
    "Layout",
    "ModelSpec",
    "Plan",
    "Recipe",
    "from_hf_config",
    "load_model",
    "TrainledgerError",
    "SpecError",
    "CatalogError",
    "LayoutError",
    "PlanError",
    "DoesNotFit",
    "CorpusError",
    "VerifyError",
]
