"""Measure every sharded configuration of tests/groundtruth/sharded_cases.py on torch's fake
process group (rank 0 of the real runtime, FakeTensors) and save the measurements to
tests/groundtruth/data/sharded_memory_measured.json (what the accuracy test compares with).

Usage: python bench/memory_sharded_measure.py [--only SUBSTRING[|SUBSTRING...]] [--out PATH]
A full run takes 15-30 minutes on one CPU core; existing entries are kept unless re-measured.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "groundtruth" / "data" / "sharded_memory_measured.json"


def cases():
    """(name, keywords, pipeline role or None) of every sharded case."""
    spec = importlib.util.spec_from_file_location("sharded_cases", ROOT / "tests" / "groundtruth" / "sharded_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [(n, kw, None) for n, kw in mod.CASES] + list(mod.PIPELINE)


def main(argv: list[str]) -> int:
    from trainledger.load.plan import PlanInputs, build_plan
    from trainledger.verify.sharded import measure_pipeline_stage, measure_sharded

    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else DATA
    saved = json.loads(out.read_text()) if out.exists() else {}
    for name, kw, role in cases():
        if only and not any(part in name for part in only.split("|")):
            continue
        t0 = time.time()
        try:
            # bf16-mixed and torch's foreach AdamW unless the case says otherwise: the defaults when
            # the suite was measured (the test pins them the same way: test_memory_sharded.pinned)
            plan = build_plan(PlanInputs(**{"precision": "bf16-mixed", "optimizer": "adamw", **kw}))
            m = measure_pipeline_stage(plan, role) if role else measure_sharded(plan)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next case
            traceback.print_exc()
            print(f"FAILED {name}: {exc}", flush=True)
            continue
        saved[name] = {"inputs": kw, **({"pp_role": role} if role else {}), "peak_allocated_bytes": m.peak_allocated_bytes, "peak_phase": m.peak_phase,
                       "categories_at_peak": m.categories_at_peak, "phase_peaks": m.phase_peaks,
                       "env": m.env, "notes": m.notes}
        out.write_text(json.dumps(saved, indent=1, sort_keys=True))
        print(f"{name:50s} {m.peak_allocated_bytes / 2**30:9.3f} GiB {m.peak_phase:9s} {time.time() - t0:6.1f}s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
