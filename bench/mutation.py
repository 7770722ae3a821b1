"""Mutation probe of the estimator's constants: does some test fail when a constant changes?

Finds every module-level numeric constant (``UPPER_CASE = <number or arithmetic of numbers>``) in
``src/trainledger/estimate/`` and ``units.py``, multiplies it by 1.25 (ints: rounded, at least +1)
in a scratch copy of ``src/``, and runs the chosen tests against that copy (first failure stops
the run). A mutant is *caught* when the tests fail. Prints one line per constant and the caught
fraction; ``--json`` writes the table.

    python bench/mutation.py                       # tests/unit + tests/golden
    python bench/mutation.py --tests tests/golden --only memory
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "trainledger"


def constants(files: list[Path]) -> list[tuple[Path, int, str, str]]:
    """(file, line, name, source of the value) of every module-level numeric constant."""
    out = []
    for f in files:
        tree = ast.parse(f.read_text())
        for node in tree.body:
            if not (isinstance(node, (ast.Assign, ast.AnnAssign))):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) != 1 or not isinstance(targets[0], ast.Name):
                continue
            name = targets[0].id
            if not name.isupper() or node.value is None or not _numeric(node.value):
                continue
            out.append((f, node.value.lineno, name, ast.get_source_segment(f.read_text(), node.value)))
    return out


def _numeric(v: ast.AST) -> bool:
    if isinstance(v, ast.Constant):
        return isinstance(v.value, (int, float)) and not isinstance(v.value, bool)
    if isinstance(v, ast.BinOp):
        return _numeric(v.left) and _numeric(v.right)
    if isinstance(v, ast.UnaryOp):
        return _numeric(v.operand)
    return False


def mutate(text: str, line: int, src: str) -> str:
    value = eval(src, {})  # noqa: S307 - a numeric literal expression from our own source
    new = repr(max(value + 1, round(value * 1.25))) if isinstance(value, int) else f"(({src}) * 1.25)"
    lines = text.splitlines(keepends=True)
    i = line - 1
    joined = "".join(lines[i:])
    k = joined.index(src)
    return "".join(lines[:i]) + joined[:k] + new + joined[k + len(src):]


def run_tests(src_dir: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """'caught' (a test failed), 'survived' (all passed) or 'timeout' (neither; not counted as caught)."""
    env = dict(os.environ, PYTHONPATH=str(src_dir), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd=ROOT, env=env, capture_output=True, timeout=timeout)
        verdict = "caught" if r.returncode != 0 else "survived"
    except subprocess.TimeoutExpired:
        verdict = "timeout"
    return verdict, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", nargs="+", default=["tests/unit", "tests/golden"])
    ap.add_argument("--only", default="", help="substring of the file path to restrict the constants")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", dest="json_out", help="write the table here")
    a = ap.parse_args()
    files = sorted([*PKG.joinpath("estimate").rglob("*.py"), PKG / "units.py"])
    found = [c for c in constants(files) if a.only in str(c[0])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "src"
        shutil.copytree(PKG.parent, scratch, ignore=shutil.ignore_patterns("__pycache__"))
        for f, line, name, src in found:
            rel = f.relative_to(PKG.parent)
            target = scratch / rel
            original = target.read_text()
            target.write_text(mutate(original, line, src))
            verdict, secs = run_tests(scratch, a.tests, a.timeout)
            target.write_text(original)
            rows.append({"file": str(rel), "line": line, "constant": name, "value": src, "verdict": verdict,
                         "seconds": round(secs, 1)})
            print(f"{verdict:8s} {rel}:{line} {name} = {src}  ({secs:.0f} s)", flush=True)
    judged = [r for r in rows if r["verdict"] != "timeout"]
    n, k = len(judged), sum(r["verdict"] == "caught" for r in judged)
    print(f"\n{k}/{n} mutants caught ({100 * k / n:.0f}%) by {' '.join(a.tests)}; "
          f"{len(rows) - n} timed out (not counted)" if n else "no mutant judged")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"tests": a.tests, "rows": rows, "caught": k, "judged": n}, indent=1))


if __name__ == "__main__":
    main()
