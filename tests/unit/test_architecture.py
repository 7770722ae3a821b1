"""The package's floor plan, checked from the code's own imports (issue 13, item 7).

Read with ``ast`` (nothing is imported): every ``import`` / ``from ... import`` of a trainledger
module, at module level or inside a function (both run), except those under ``if TYPE_CHECKING:``.
Rules: imports point down the layer list of README "Package layout"; no two modules import each
other; no module imports another package's ``_private`` name; every subpackage is in the README.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "trainledger"

#: lowest first; a module may import its own layer and the layers below it. Layers of equal rank
#: (planner, ledger, runconfig) never import each other (checked by the rank test: not allowed either way).
LAYERS: dict[str, int] = {
    "errors": 0, "units": 1, "safety": 1, "format": 2, "spec": 2, "corpus": 3, "load": 4, "estimate": 5,
    "planner": 6, "ledger": 6, "runconfig": 6, "verify": 7, "report": 8, "web": 9, "cli": 10, "__main__": 11,
}

#: upward imports kept on purpose (none: a new one fails the test unless listed here with its reason)
UPWARD_ALLOWED: set[tuple[str, str]] = set()

#: two-module cycles still to break (none left; a new one fails the test)
CYCLES_LEFT: set[tuple[str, str]] = set()

#: cycles kept alive only by ``if TYPE_CHECKING:`` imports, allowed with their reason (a new one fails)
TYPE_ONLY_CYCLES_ALLOWED: set[tuple[str, ...]] = {
    # the layer inventory describes the layers of a ModelSpec (its functions take one), and ModelSpec
    # counts its parameters from that inventory: one concept in two files, the annotation only
    ("trainledger.spec.layers", "trainledger.spec.model"),
}

#: cross-package private imports still to remove (none left; a new one fails the test)
PRIVATE_LEFT: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


MODULES = _modules()


def _imports(name: str, typing: bool = False) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) of every run-time import in module ``name``
    (``typing``: the imports under ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(MODULES[name].read_text())
    skip: set[int] = set()
    for n in ast.walk(tree):
        if not typing and isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            skip |= {id(x) for b in n.body for x in ast.walk(b)}
    pkg = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("trainledger")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if not base.startswith("trainledger"):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full, None) if full in MODULES else (base, a.name))
    return out


def _edges(typing: bool = False) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name in MODULES:
        for target, _ in _imports(name, typing):
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                edges.setdefault(name, set()).add(target)
    return edges


EDGES = _edges()


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the top-level package (``__version__``)


def test_every_module_belongs_to_a_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(LAYERS) - {None, "catalog"})
    assert not unknown, f"add these to LAYERS (and README 'Package layout'): {unknown}"


def test_imports_point_down_the_layers():
    upward = []
    for a, targets in EDGES.items():
        for b in targets:
            la, lb = _layer(a), _layer(b)
            if la is None or lb is None or la == lb:
                continue
            if LAYERS[lb] >= LAYERS[la] and (a, b) not in UPWARD_ALLOWED:
                upward.append(f"{a} -> {b}")
    assert not upward, "imports that point up (or sideways between peers):\n" + "\n".join(sorted(upward))


def test_allowed_upward_imports_are_still_needed():
    stale = [pair for pair in UPWARD_ALLOWED if pair[1] not in EDGES.get(pair[0], set())]
    assert not stale, f"no longer imported, remove from UPWARD_ALLOWED: {stale}"


def test_no_new_two_module_cycles():
    cycles = {tuple(sorted((a, b))) for a in EDGES for b in EDGES[a] if a in EDGES.get(b, set())}
    assert cycles - CYCLES_LEFT == set(), f"new import cycles: {sorted(cycles - CYCLES_LEFT)}"
    assert CYCLES_LEFT - cycles == set(), f"broken (remove from CYCLES_LEFT): {sorted(CYCLES_LEFT - cycles)}"


def test_no_cycle_even_through_type_only_imports():
    """A cycle kept alive only by ``if TYPE_CHECKING:`` imports still ties two modules' designs
    together (corpus run/report through Tally, planner search/candidates through Job, spec
    plan/precision through Plan were three); none is left, of any length, but the one allowed
    above with its reason."""
    edges = {m: {t for t in ts if tuple(sorted((m, t))) not in TYPE_ONLY_CYCLES_ALLOWED}
             for m, ts in _edges(typing=True).items()}
    for pair in TYPE_ONLY_CYCLES_ALLOWED:  # still a cycle (else drop it from the list)
        a, b = pair
        full = _edges(typing=True)
        assert b in full.get(a, ()) and a in full.get(b, ()), f"{pair} is no longer a cycle: remove it"
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t] if t in path else [m, t]
            if t not in state and (found := visit(t, path + [t])):
                return found
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m, [m])
            assert found is None, f"import cycle: {' -> '.join(found)}"


def test_no_new_private_imports_across_packages():
    found = set()
    for name in MODULES:
        for target, imported in _imports(name):
            if imported and imported.startswith("_") and not imported.startswith("__"):
                if target.rsplit(".", 1)[0] != name.rsplit(".", 1)[0] and target != name.rsplit(".", 1)[0]:
                    found.add((name, target, imported))
    assert found - PRIVATE_LEFT == set(), f"new private imports: {sorted(found - PRIVATE_LEFT)}"
    assert PRIVATE_LEFT - found == set(), f"gone (remove from PRIVATE_LEFT): {sorted(PRIVATE_LEFT - found)}"


def _readme_layout() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"## Package layout\n\n```\n(.*?)```", text, re.S)
    assert m, "README.md has no 'Package layout' block"
    return m.group(1)


@pytest.mark.parametrize("package", sorted(p.name for p in PKG.iterdir()
                                           if p.is_dir() and (p / "__init__.py").exists()))
def test_readme_layout_names_every_package(package):
    assert re.search(rf"^\s+{re.escape(package)}/", _readme_layout(), re.M), \
        f"README 'Package layout' does not describe {package}/"


def test_checker_sees_a_known_edge_and_a_function_level_import():
    # guards the checker itself: a module-level import and one inside a function are both edges
    assert "trainledger.planner.candidates" in EDGES["trainledger.planner.search"]
    assert "trainledger.load.meta_model" in EDGES["trainledger.load.hf"]  # imported inside a function


def test_every_module_path_named_in_code_and_docs_exists():
    """Docstrings, catalog comments, the README and notes the CLI prints name modules by path
    (``estimate/time/stack.py``); after a move they must follow (the layout move left eleven
    such paths pointing at files that no longer existed)."""
    pat = re.compile(r"(?<![\w/.])(?:src/trainledger/|trainledger/)?((?:estimate|spec|load|planner|ledger|"
                     r"runconfig|verify|report|web|cli|corpus)/[a-z_/]+\.py)")
    files = [ROOT / "README.md", *PKG.rglob("*.py"), *PKG.rglob("*.yaml"), *PKG.rglob("*.md"),
             *(ROOT / "bench").glob("*.py")]
    stale = {(f.relative_to(ROOT).as_posix(), m) for f in files for m in pat.findall(f.read_text())
             if not (PKG / m).exists() and m != "estimate/x.py"}  # bench/mutation_trace.py's format example
    assert not stale, sorted(stale)
