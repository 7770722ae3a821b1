"""A plan meets the deadline by its step-time estimate; its risks say where the deadline falls in
the interval around that estimate (the accuracy suite's p10/p90 residuals for its stack and GPU
family). Expected texts are derived from the candidate's own wall time and interval factors."""

from __future__ import annotations

import pytest

from trainledger.planner.candidates import deadline_wall_s
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
    assert r.startswith("deadline at risk") and "sits at about p50 " in r
    assert f"{lo / DAY:.1f}-{hi / DAY:.1f} days with interruptions" in r and iv["basis"] in r
    (r,) = _risks(c, job, (lo + 0.25 * (hi - lo)) / DAY)
    assert "about p30 " in r


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


def test_deadline_quantile_p90_plans_for_the_interval_upper_end():
    # the smallest count that meets a deadline by the estimate, with the deadline just above its
    # run time: at p90 of its interval that count misses, so the planner answers with more GPUs,
    # each plan within the deadline at its interval's upper end
    base = Job(gpus=("h100-sxm",), max_gpus=64, tokens=20e9, rank_by="gpus", deadline_days=30)
    first = search(base).plans[0]
    wall = first.wall_s(base.cost_options)
    assert first.time.interval["factor_p90"] > 1.01  # the interval reaches past the estimate
    job = base.model_copy(update={"deadline_days": wall * 1.005 / DAY})
    est = search(job).plans[0]
    p90_job = job.model_copy(update={"deadline_quantile": "p90"})
    res = search(p90_job)
    assert est.plan.cluster.world_size == first.plan.cluster.world_size
    assert res.plans[0].plan.cluster.world_size > est.plan.cluster.world_size
    for c in res.plans:
        assert deadline_wall_s(c, p90_job) == pytest.approx(
            c.wall_s(job.cost_options) * c.time.interval["factor_p90"])
        assert deadline_wall_s(c, p90_job) <= job.deadline_days * DAY
        assert not any(r.startswith("deadline") for r in c.risks)
    # the count it missed on says so, at p90
    assert any("at the p90 of its interval" in r.reason for r in res.rejected
               if r.gpus == est.plan.cluster.world_size)


def test_deadline_quantile_p50_reads_the_interval_median(cand_job):
    c, job = cand_job
    iv = c.time.interval
    wall = c.wall_s(job.cost_options)
    at = {q: deadline_wall_s(c, job.model_copy(update={"deadline_quantile": q})) for q in ("estimate", "p50", "p90")}
    assert at["estimate"] == wall
    assert at["p50"] == pytest.approx(wall * iv["factor_p50"])
    assert at["p90"] == pytest.approx(wall * iv["factor_p90"])
