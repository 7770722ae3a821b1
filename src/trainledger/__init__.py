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


__all__ = [
    "__version__",
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
