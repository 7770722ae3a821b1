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
