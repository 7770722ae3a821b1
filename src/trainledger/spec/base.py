"""Base class of every input spec: frozen, validated pydantic v2 models (DESIGN.md §3.4)."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from trainledger.errors import SpecError
from trainledger.safety import clip


class Spec(BaseModel):
    """A frozen, validated spec. Unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def updated(self, changes: Mapping[str, Any]) -> Any:
        """``model_copy(update=changes)`` (no validation either), without pydantic's generic copy
        machinery: the suggestion variants and the scaling curve's points build several per
        estimate. A shallow copy of the field values with ``changes`` applied; the fields set are
        the original's and the changed ones, as ``model_copy`` leaves them."""
        new = object.__new__(type(self))
        values = self.__dict__.copy()
        values.update(changes)
        object.__setattr__(new, "__dict__", values)
        object.__setattr__(new, "__pydantic_fields_set__", self.__pydantic_fields_set__ | changes.keys())
        object.__setattr__(new, "__pydantic_extra__", None)
        object.__setattr__(new, "__pydantic_private__", None)
        return new


def spec_error(exc: ValidationError, where: str) -> SpecError:
    """Turn a pydantic ValidationError into one readable SpecError line naming each field."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(root)"
        msg = err.get("msg", "invalid")
        shown = clip(err.get("input"))  # bounded: a megabyte string or a deep list stays short
        parts.append(f"{loc}: {msg} (got {shown})")
    more = "" if len(exc.errors()) <= 5 else f"; and {len(exc.errors()) - 5} more"
    first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
    field = str(first[-1]) if first and isinstance(first[-1], str) else (str(first[0]) if first else None)
    return SpecError(f"{where}: " + "; ".join(parts) + more, field=field)
