"""trainledger: what hardware an LLM training or fine-tuning job really needs — and proof.

The public API. Importing this package never imports torch (tested).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (  # noqa: E402  (cheap: no pydantic)
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
#: little start fast: pydantic models and the catalog load only when a name below is touched
_LAZY = {
    "Cluster": "cluster", "GpuSpec": "cluster", "NetworkSpec": "cluster", "StorageSpec": "cluster",
    "from_hf_config": "hfconfig", "load_model": "hfconfig", "Layout": "layout", "ModelSpec": "model",
    "Plan": "plan", "Recipe": "recipe",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trainledger' has no attribute {name!r}")


#: the library's entry points, imported on first use (``import trainledger`` stays light)
_LAZY = {
    "estimate": ("trainledger.estimate", None),  # the package is callable: trainledger.estimate(plan)
    "Estimate": ("trainledger.estimate", "Estimate"),
    "EstimateOptions": ("trainledger.estimate", "EstimateOptions"),
    "search": ("trainledger.search", None),  # the module is callable: trainledger.search(job)
    "Job": ("trainledger.search", "Job"),
    "build_plan": ("trainledger.planfile", "build_plan"),
    "PlanInputs": ("trainledger.planfile", "PlanInputs"),
    "Runtime": ("trainledger.runtime", "Runtime"),
}


def __getattr__(name: str):
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
