"""Accuracy of the memory model: estimate vs measurement for every configuration of
tests/groundtruth/test_memory_accuracy.py (tiny models of several families on the CPU with exact
storage accounting, full-size models on FakeTensors), with the peak phase and the error of every
major term (>= 5% of the measured peak).

Usage: python bench/memory_accuracy.py [--only SUBSTRING] [--save bench/results/memory_accuracy.json]
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cases_module():
    path = ROOT / "tests" / "groundtruth" / "test_memory_accuracy.py"
    spec = importlib.util.spec_from_file_location("memory_accuracy_cases", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f}"


def main(argv: list[str]) -> int:
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    mod = _cases_module()
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="tl-tiny-"))
    print(f"{'configuration':40s} {'dev':4s} {'predicted MiB':>14s} {'measured MiB':>13s} {'error':>7s}  "
          f"{'phase (pred/meas)':19s} major-term errors")
    for name, device, kw in mod.CASES:
        if only and only not in name:
            continue
        row = mod.compare(mod._plan(kw, folder), device)
        terms = mod.major_term_errors(row)
        row.update(name=name, device=device, term_errors=terms)
        rows.append(row)
        te = ", ".join(f"{k} {v:+.1%}" for k, v in sorted(terms.items()))
        print(f"{name:40s} {device:4s} {_mib(row['predicted']):>14s} {_mib(row['measured']):>13s} "
              f"{row['error']:+7.2%}  {row['pred_phase'] + '/' + row['meas_phase']:19s} {te}", flush=True)
    errs = [abs(r["error"]) for r in rows]
    terms = [abs(v) for r in rows for v in r["term_errors"].values()]
    if rows:
        print(f"\n{len(rows)} configurations: peak error max {max(errs):.2%}, mean {sum(errs) / len(errs):.2%}; "
              f"major-term error max {max(terms):.2%}; phase agreement "
              f"{sum(r['pred_phase'] == r['meas_phase'] for r in rows)}/{len(rows)}")
    if save:
        Path(save).write_text(json.dumps(rows, indent=1, default=str))
    return 0 if rows and max(errs) <= mod.PEAK_TOL and max(terms) <= mod.TERM_TOL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
