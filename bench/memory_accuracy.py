"""Accuracy of the memory model: estimate vs measurement for every configuration of
tests/groundtruth/test_memory_accuracy.py (tiny models of several families on the CPU with exact
storage accounting, full-size models on FakeTensors), with the peak phase and the error of every
major term (>= 5% of the measured peak).

Then the sharded table (tests/groundtruth/test_memory_sharded.py: FSDP2, FSDP1, DDP, torch TP,
TP + FSDP2 on torch's fake process group) beside it, with the error range of every major term.

Usage: python bench/memory_accuracy.py [--only SUBSTRING] [--save bench/results/memory_accuracy.json]
       [--single-only] [--sharded-only]
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
    if "--sharded-only" in argv:
        return 0 if sharded_table(only) else 1
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
    ok_single = bool(rows) and max(errs) <= mod.PEAK_TOL and max(terms) <= mod.TERM_TOL
    if "--single-only" in argv:
        return 0 if ok_single else 1
    return 0 if sharded_table(only) and (ok_single or not rows) else 1


def sharded_table(only: str = "") -> bool:
    """The sharded suite: per-rank estimate vs rank 0 of the real runtime on the fake process group
    (measurements from tests/groundtruth/data/sharded_memory_measured.json, made by
    bench/memory_sharded_measure.py)."""
    path = ROOT / "tests" / "groundtruth" / "test_memory_sharded.py"
    spec = importlib.util.spec_from_file_location("memory_sharded_cases", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    print(f"\nsharded (rank 0 on torch's fake process group)\n{'configuration':46s} {'predicted MiB':>14s} "
          f"{'measured MiB':>13s} {'error':>7s}  {'phase (pred/meas)':19s} major-term errors")
    rows = []
    every = [(n, kw, None) for n, kw in mod.CASES_MOD.CASES] + list(mod.CASES_MOD.PIPELINE)
    for name, kw, role in every:
        if (only and only not in name) or name not in mod.MEASURED:
            continue
        row = mod.compare(name, kw, mod.MEASURED[name], role)
        rows.append(row)
        te = ", ".join(f"{k} {v:+.1%}" for k, v in sorted(row["term_errors"].items()))
        print(f"{name:46s} {_mib(row['predicted']):>14s} {_mib(row['measured']):>13s} {row['error']:+7.2%}  "
              f"{row['pred_phase'] + '/' + row['meas_phase']:19s} {te}", flush=True)
    if not rows:
        return True
    errs = [abs(r["error"]) for r in rows]
    terms: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["term_errors"].items():
            terms.setdefault(k, []).append(v)
    print(f"\n{len(rows)} sharded configurations: peak error max {max(errs):.2%}, mean {sum(errs) / len(errs):.2%}; "
          f"phase agreement {sum(r['pred_phase'] == r['meas_phase'] for r in rows)}/{len(rows)}")
    for k, vs in sorted(terms.items()):
        print(f"  {k:24s} error range {min(vs):+.2%} .. {max(vs):+.2%} over {len(vs)} configurations")
    return max(errs) <= mod.PEAK_TOL and all(abs(v) <= mod.TERM_TOL for vs in terms.values() for v in vs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
