"""One error tree for trainledger (DESIGN.md §3.7).

Every error a user can cause is a :class:`TrainledgerError`; its message says what was wrong and
what to do next. The CLI prints it as one line and exits non-zero — never a stack trace. An error
about one input carries that input's name in ``field`` (a ``PlanInputs`` field such as ``"tp"``), so
the web page puts the message next to the right box without reading the message.

    TrainledgerError            (exit 2; .field: the input it concerns, or None)
    ├── SpecError               a model config, recipe or plan file is malformed or unsupported
    ├── CatalogError            unknown or invalid GPU, network, preset or price entry
    ├── LayoutError             parallel degrees that do not fit the model or the cluster
    ├── PlanError               contradictory inputs
    ├── DoesNotFit              the job does not fit in the memory it is given
    ├── CorpusError             a dataset that cannot be read or tokenized
    ├── VerifyError             a verification run failed or could not start (exit 1)
    ├── LedgerError             the measurement ledger cannot be read or written
    └── MissingDependency       an optional extra is not installed; the message gives the pip command
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "TrainledgerError",
    "SpecError",
    "CatalogError",
    "LayoutError",
    "PlanError",
    "DoesNotFit",
    "CorpusError",
    "VerifyError",
    "LedgerError",
    "MissingDependency",
    "did_you_mean",
]


class TrainledgerError(Exception):
    """Base of every error trainledger raises on purpose; ``field`` names the input it concerns."""

    exit_code = 2

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SpecError(TrainledgerError):
    """A model config, recipe or plan file is malformed or unsupported."""


class CatalogError(TrainledgerError):
    """An unknown or invalid catalog entry (GPU, network, preset, price)."""


class LayoutError(TrainledgerError):
    """Parallelism degrees that do not fit the model or the cluster."""


class PlanError(TrainledgerError):
    """A plan that cannot be evaluated as given (contradictory inputs)."""


class DoesNotFit(TrainledgerError):
    """The job does not fit in the memory it is given."""


class CorpusError(TrainledgerError):
    """A dataset that cannot be read or tokenized."""


class VerifyError(TrainledgerError):
    """A verification run failed or could not start."""

    exit_code = 1


class LedgerError(TrainledgerError):
    """The measurement ledger cannot be read or written."""


class MissingDependency(TrainledgerError):
    """An optional dependency is not installed; the message gives the pip command."""


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean: a, b?' for the closest names, or '' when none is close."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not close:
        # substring matches help with short names like "h100" -> "h100-sxm"
        close = [c for c in lowered if name.lower() in c][:n]
    if not close:
        return ""
    return " Did you mean: " + ", ".join(lowered[c] for c in close) + "?"
