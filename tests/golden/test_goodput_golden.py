"""Golden tests of the goodput model: Young's and Daly's checkpoint intervals, Daly's wall-clock
model, and the interruption rate against the Llama 3 405B pre-training numbers."""

from __future__ import annotations

import math

import pytest

from trainledger.estimate.run.goodput import (LLAMA3_CAUSES, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS, LLAMA3_SNAPSHOT_HOURS,
                                          cause_breakdown, daly_interval_s, daly_wall_s, expected_interruptions,
                                          goodput, job_mtbf_s, young_interval_s)
from trainledger.estimate.run.checkpoint import FAILURES_PER_GPU_HOUR

MIN, HOUR = 60.0, 3600.0


@pytest.mark.parametrize("mtbf_s, published_min, digits", [
    (24 * HOUR, 117, 0),   # Daly 2006, Fig. 3: M = 24 h, R = 10 min, delta = 5 min -> tau_opt = 117 min
    (6 * HOUR, 57, 0),     # Fig. 4: M = 6 h -> 57 min
    (15 * MIN, 9.1, 1),    # Fig. 5: M = 15 min -> 9.1 min
])
def test_daly_interval_reproduces_the_papers_figures(mtbf_s, published_min, digits):
    assert round(daly_interval_s(5 * MIN, mtbf_s) / MIN, digits) == published_min


def test_daly_interval_is_the_optimum_of_dalys_wall_time():
    # two ways: the closed form vs a numerical minimum of T_w(tau) (golden-section search)
    delta, r, m = 5 * MIN, 10 * MIN, 6 * HOUR
    lo, hi = 1.0, 10 * HOUR
    f = lambda t: daly_wall_s(500 * HOUR, t, delta, r, m)  # noqa: E731
    for _ in range(200):
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if f(a) < f(b) else (a, hi)
    assert daly_interval_s(delta, m) == pytest.approx(lo, rel=0.01)
    # Young's first-order interval overshoots the optimum by ~2/3 delta (delta - delta/3 in the series)
    assert young_interval_s(delta, m) - lo == pytest.approx(2 * delta / 3, rel=0.05)


def test_daly_interval_when_the_dump_outlasts_twice_the_mtbf():
    assert daly_interval_s(3 * HOUR, 1 * HOUR) == 1 * HOUR


def test_young_interval_reproduces_distributed_graphlab():
    # Low et al. 2012 (Distributed GraphLab, PVLDB 5(8), section 4.3): 64 machines, per-machine MTBF
    # of 1 year, 2-minute checkpoint -> "optimal checkpoint intervals of 3 hrs"
    m = 365 * 24 * HOUR / 64
    assert young_interval_s(2 * MIN, m) / HOUR == pytest.approx(3.0, abs=0.05)


def test_interruption_model_reproduces_llama3():
    # Dubey et al. 2024 section 3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs
    assert expected_interruptions(FAILURES_PER_GPU_HOUR, 16_384, 54 * 24) == pytest.approx(419)
    assert (LLAMA3_INTERRUPTIONS, LLAMA3_SNAPSHOT_HOURS, LLAMA3_GPUS) == (419, 54 * 24, 16_384)
    # "one failure every three hours" (the press summaries of the same paper)
    assert job_mtbf_s(FAILURES_PER_GPU_HOUR, 16_384) / HOUR == pytest.approx(3.09, abs=0.01)
    # half the GPUs: half the interruptions, twice the MTBF
    assert job_mtbf_s(FAILURES_PER_GPU_HOUR, 8192) == pytest.approx(2 * job_mtbf_s(FAILURES_PER_GPU_HOUR, 16_384))


#: Table 5's printed shares (percent), in row order; the first row prints 30.1% for 148 of 419.
TABLE5_PERCENT = (30.1, 17.2, 12.9, 8.4, 7.6, 4.5, 4.1, 1.7, 1.7, 1.4, 1.4, 0.7, 0.7, 0.5, 0.5, 0.5, 0.5, 0.5)


def test_llama3_cause_table():
    assert sum(k for _, _, k in LLAMA3_CAUSES) == 419
    assert len(LLAMA3_CAUSES) == len(TABLE5_PERCENT)
    for (_c, _cat, k), pct in list(zip(LLAMA3_CAUSES, TABLE5_PERCENT))[1:]:
        assert 100 * k / 419 == pytest.approx(pct, abs=0.051)
    rows = cause_breakdown(419)
    assert sum(r["interruptions"] for r in rows) == pytest.approx(419)
    hbm = next(r for r in rows if r["component"] == "GPU HBM3 Memory")
    assert hbm["interruptions"] == pytest.approx(72)


def test_daly_wall_time_split_and_limits():
    g = goodput(500 * HOUR, 57 * MIN, 5 * MIN, 10 * MIN, 6 * HOUR)
    assert g.checkpoint_s + g.restart_s + g.lost_work_s == pytest.approx(g.added_s, rel=1e-9)
    assert g.checkpoint_s == pytest.approx(500 * HOUR / (57 * MIN) * 5 * MIN)
    assert g.interruptions == pytest.approx(g.wall_s / (6 * HOUR))
    # no failures (M -> inf): only the checkpoint writes remain
    g = goodput(100 * HOUR, 1 * HOUR, 60.0, 600.0, 1e15)
    assert g.wall_s == pytest.approx(100 * HOUR * (1 + 60 / 3600), rel=1e-6)
    # first order: lost work per interruption ~ (tau + delta)/2 when tau << M
    g = goodput(1000 * HOUR, 10 * MIN, 10.0, 0.0, 100 * HOUR)
    assert g.lost_work_s / g.interruptions == pytest.approx((10 * MIN + 10) / 2, rel=0.01)
    with pytest.raises(OverflowError):
        goodput(HOUR, 1e6 * HOUR, 60.0, 60.0, 1.0)
    assert math.isfinite(daly_wall_s(HOUR, HOUR, 60.0, 60.0, HOUR))
