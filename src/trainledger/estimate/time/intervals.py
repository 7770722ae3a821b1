"""Uncertainty of every time figure: an interval from the accuracy suite's residuals.

``bench/time_accuracy.py --write-intervals`` records, per stack and GPU family, the 10th and 90th
percentile of the signed error of the predicted *rate* over the measured one (r = pred/meas − 1,
catalog/efficiency/intervals.yaml). A predicted step time t then has the interval

    [t · (1 + p10), t · (1 + p90)]     (rate too high by p90 → the true time is t·(1+p90))

and so has every figure proportional to it (time to train, GPU-hours, cost; tokens/s and MFU
inversely). A stack/family pair with fewer than ``MIN_CASES`` measurements takes the pooled
residuals of all cases, widened by ``UNSEEN_WIDENING`` (an extrapolation, said in ``basis``).
After calibration on a measured run of the same environment the interval narrows to the
calibration-transfer residuals (bench/calibration_transfer.py), stored under ``calibrated``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

#: fewer residuals than this for a stack/family: use the pooled interval, widened
MIN_CASES = 5
#: widening of the pooled interval for a stack/family the suite has no measurement of
UNSEEN_WIDENING = 1.5


def _path() -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / "efficiency" / "intervals.yaml"))


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    p = _path()
    if not p.exists():
        return {}
    d = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    return d if isinstance(d, dict) else {}


def rate_interval(framework: str, family: str, calibrated: bool = False,
                  gpus: int | None = None) -> tuple[float, float, str]:
    """(p10, p90) of the signed rate error for this stack and family, and where it comes from.

    A stack/family measured on single GPUs only (``gpus_max`` 1) bounds single-GPU plans: its
    residuals hold no communication, so a plan on ``gpus`` > 1 takes the widened pooled interval."""
    lo, _, hi, basis = _residuals(framework, family, calibrated, gpus)
    return lo, hi, basis


def _residuals(framework: str, family: str, calibrated: bool,
               gpus: int | None) -> tuple[float, float, float, str]:
    """(p10, median, p90, basis) of the residuals ``rate_interval`` reads. The median is the stored
    one; where none is stored, the middle of the interval."""
    t = _table()
    key = f"{framework}/{family}"
    if calibrated and key in (t.get("calibrated") or {}):
        v = t["calibrated"][key]
        return _row(v) + (f"calibration transfer residuals, {key} (n={v['n']})",)
    v = (t.get("stacks") or {}).get(key)
    one_gpu_only = bool(v) and v.get("gpus_max", 0) == 1 and (gpus or 1) > 1
    if v and v.get("n", 0) >= MIN_CASES and not one_gpu_only:
        return _row(v) + (f"accuracy suite residuals, {key} (n={v['n']})",)
    pooled = t.get("pooled") or {"p10": -0.15, "p90": 0.15, "n": 0}
    w = UNSEEN_WIDENING
    why = f"{key} measured on one GPU only" if one_gpu_only else f"no {key} measurements"
    lo, mid, hi = _row(pooled)
    return lo * w, mid * w, hi * w, f"{why}: pooled residuals (n={pooled.get('n', 0)}) x{w:g}"


def _row(v: dict[str, Any]) -> tuple[float, float, float]:
    lo, hi = float(v["p10"]), float(v["p90"])
    return lo, float(v.get("median", (lo + hi) / 2)), hi


def time_interval(step_time_s: float, framework: str, family: str,
                  calibrated: bool = False, gpus: int | None = None) -> dict[str, Any]:
    """p10/p90 of the step time (see the module docstring), and the median's factor (``factor_p50``:
    the residuals' median, the estimate corrected for the stack and family's typical bias)."""
    lo, mid, hi, basis = _residuals(framework, family, calibrated, gpus)
    return {"p10": step_time_s * (1 + lo), "p50": step_time_s * (1 + mid), "p90": step_time_s * (1 + hi),
            "factor_p10": 1 + lo, "factor_p50": 1 + mid, "factor_p90": 1 + hi, "basis": basis}
