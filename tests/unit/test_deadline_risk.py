"""A plan meets the deadline by its step-time estimate; its risks say where the deadline falls in
the interval around that estimate (the accuracy suite's p10/p90 residuals for its stack and GPU
family). Expected texts are derived from the candidate's own wall time and interval factors."""

from __future__ import annotations

import pytest

from trainledger.planner.search import Job, deadline_risks, search

DAY = 86400.0


@pytest.fixture(scope="module")
def cand_job():
    job = Job(gpus=("a100-sxm-80gb",), max_gpus=8, tokens=2e9, deadline_days=None, rank_by="time")
    res = search(job)
    return res.plans[0], job


def _risks(cand, job, days):
    return deadline_risks(cand, job.model_copy(update={"deadline_days": days}))


def test_deadline_beyond_the_interval_is_no_risk(cand_job):
    c, job = cand_job
    iv = c.time.interval
    hi = c.wall_s(job.cost_options) * iv["factor_p90"]
    assert _risks(c, job, hi * 1.001 / DAY) == []
    assert _risks(c, job, None) == []


def test_deadline_inside_the_interval_names_its_percentile(cand_job):
    c, job = cand_job
    iv = c.time.interval
    wall = c.wall_s(job.cost_options)
    lo, hi = wall * iv["factor_p10"], wall * iv["factor_p90"]
    (r,) = _risks(c, job, (lo + hi) / 2 / DAY)  # halfway from p10 to p90
    assert r.startswith("deadline at risk") and r.endswith("sits at about p50")
    assert f"{lo / DAY:.1f}-{hi / DAY:.1f} days with interruptions" in r and iv["basis"] in r
    (r,) = _risks(c, job, (lo + 0.25 * (hi - lo)) / DAY)
    assert r.endswith("about p30")


def test_deadline_before_the_interval_is_likely_missed(cand_job):
    c, job = cand_job
    lo = c.wall_s(job.cost_options) * c.time.interval["factor_p10"]
    (r,) = _risks(c, job, lo * 0.999 / DAY)
    assert r.startswith("deadline likely missed") and "all past the" in r


def test_search_lists_the_risk_on_a_plan_that_meets_the_deadline_by_its_estimate(cand_job):
    c, job = cand_job
    wall = c.wall_s(job.cost_options)
    # a deadline just above the plan's wall time: it meets it, with the interval's upper end past it
    tight = job.model_copy(update={"deadline_days": wall * 1.0001 / DAY})
    res = search(tight)
    same = [p for p in res.plans if p.plan.cluster.world_size == c.plan.cluster.world_size
            and p.plan.layout == c.plan.layout]
    lo = wall * c.time.interval["factor_p10"]
    word = "deadline likely missed" if lo > wall * 1.0001 else "deadline at risk"
    assert same and any(r.startswith(word) for r in same[0].risks)
