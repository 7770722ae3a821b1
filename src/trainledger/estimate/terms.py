"""Term: one line of the ledger — a value in canonical units, its formula's source, assumptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Term:
    """One named quantity of an estimate.

    ``value`` is in canonical units named by ``unit`` ('bytes', 's', 'flop', 'flop/s', 'bytes/s',
    'kWh', 'usd', 'count'); ``source`` cites the formula (paper, table, equation or measurement);
    ``assumptions`` says what the formula takes for granted.
    """

    name: str
    value: float
    unit: str
    source: str
    assumptions: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "value": self.value, "unit": self.unit, "source": self.source}
        if self.assumptions:
            d["assumptions"] = self.assumptions
        if self.detail:
            d["detail"] = self.detail
        return d
