"""trainledger: what hardware an LLM training or fine-tuning job really needs — and proof.

The public API. Importing this package never imports torch (tested).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .cluster import Cluster, GpuSpec, NetworkSpec, StorageSpec  # noqa: E402
from .errors import (  # noqa: E402
    CatalogError,
    CorpusError,
    DoesNotFit,
    LayoutError,
    PlanError,
    SpecError,
    TrainledgerError,
    VerifyError,
)
from .hfconfig import from_hf_config, load_model  # noqa: E402
from .layout import Layout  # noqa: E402
from .model import ModelSpec  # noqa: E402
from .plan import Plan  # noqa: E402
from .recipe import Recipe  # noqa: E402

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
