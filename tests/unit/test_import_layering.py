"""Module dependencies that must stay one-way (no import cycle, not even a function-level one).

* ``estimate.memory.runtimes`` (the runtimes' terms) is used by ``estimate.memory.model`` and must
  not reach back into it: what both need (the layers on a pipeline stage) is in ``estimate.stage``.
* ``verify.measure`` dispatches sharded plans to ``verify.sharded``; the result type and the shared
  helpers live in ``verify.measurement``, so ``verify.sharded`` never imports ``verify.measure``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "trainledger"


def imported_modules(rel: str) -> set[str]:
    """Every trainledger module a source file imports, at any level (module or function body)."""
    tree = ast.parse((SRC / rel).read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("trainledger")}


def test_runtimes_does_not_import_model():
    mods = imported_modules("estimate/memory/runtimes.py")
    assert not {m for m in mods if m.startswith("trainledger.estimate.memory.model")}, mods
    assert "trainledger.estimate.memory.runtimes" in imported_modules("estimate/memory/model.py") or \
        "trainledger.estimate.memory.runtimes.sixteen_bit_model" in imported_modules("estimate/memory/model.py")


def test_sharded_does_not_import_measure():
    mods = imported_modules("verify/sharded.py")
    assert not {m for m in mods if m.startswith("trainledger.verify.measure.") or m == "trainledger.verify.measure"}, mods
    assert "trainledger.verify.sharded.measure_sharded" in imported_modules("verify/measure.py")


def test_measurement_helpers_import_neither():
    mods = imported_modules("verify/measurement.py")
    assert not {m for m in mods if m.split(".")[:3] in (["trainledger", "verify", "measure"],
                                                        ["trainledger", "verify", "sharded"])}, mods
