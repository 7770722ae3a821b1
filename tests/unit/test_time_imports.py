"""The time package's modules import one way: no module imports the package façade, and no
module of the package reaches another one through a function-level import (a cycle worked around).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import trainledger.estimate.time as time_pkg

PKG = "trainledger.estimate.time"
DIR = pathlib.Path(time_pkg.__file__).parent


def _imports(path: pathlib.Path) -> list[tuple[str, bool]]:
    """(imported module, at function level?) for each ``from X import`` of one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, bool]] = []
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, id(node) not in top))
    return out


def test_no_module_of_the_time_package_imports_the_package_facade() -> None:
    offenders = [p.name for p in DIR.glob("*.py") if p.name != "__init__.py"
                 and any(mod == PKG for mod, _ in _imports(p))]
    assert offenders == []


def test_no_function_level_import_between_time_modules() -> None:
    offenders = [(p.name, mod) for p in DIR.glob("*.py")
                 for mod, nested in _imports(p) if nested and mod.startswith(PKG)]
    assert offenders == []


def test_scaling_imports_first_in_a_fresh_interpreter() -> None:
    # import order must not matter: the submodule first, then the façade, one object
    code = f"import {PKG}.scaling as s; import {PKG} as t; assert s.ComputeEstimate is t.ComputeEstimate"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_facade_reexports_the_step_model() -> None:
    step = importlib.import_module(f"{PKG}.step")
    assert time_pkg.estimate_compute is step.estimate_compute
    assert time_pkg.scaling_curve is importlib.import_module(f"{PKG}.scaling").scaling_curve
