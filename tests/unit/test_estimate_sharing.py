"""Derive once (issue 13 item 8): every figure shared or remembered for speed equals the figure
derived anew. Each test computes the same quantity by the unshared path and compares exactly."""

from __future__ import annotations

import dataclasses

import pytest

from trainledger.estimate import estimate
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.model import _flow_of, flow_of
from trainledger.estimate.memory.phases import fit_bytes, peak_bytes, step_points
from trainledger.estimate.memory.device import runtime_defaults
from trainledger.estimate.options import EstimateOptions, MemoryOptions, TimeOptions
from trainledger.estimate.stage import Stage, pipeline_role
from trainledger.estimate.time import estimate_compute, scaling_curve
from trainledger.estimate.time.step import StageWork
from trainledger.load.plan import PlanInputs, build_plan
from reference_plans import at_dp

PLANS = {
    "8b-1gpu": dict(model="llama-3.1-8b", seq_len=4096),
    "8b-lora-fsdp2": dict(model="llama-3.1-8b", method="lora", gpus=8, zero=3, framework="fsdp2"),
    "70b-tp8-pp2": dict(model="llama-3.1-70b", seq_len=8192, gpus=64, tp=8, pp=2, zero=1, grad_accum=8),
    "mixtral-ep8": dict(model="mixtral-8x7b", gpus=16, ep=8, zero=3),
    "8b-gb256-megatron": dict(model="llama-3.1-8b", gpus=16, tp=2, global_batch=256,
                              framework="megatron-core"),
}


def _plan(name):
    return build_plan(PlanInputs(**PLANS[name]))


def _curve_unshared(plan, opts, factors=(0.25, 0.5, 1, 2, 4, 8)):
    """The scaling curve as each point's own ``estimate_compute`` gives it (nothing shared)."""
    rows = []
    for f in factors:
        dp = int(round(plan.layout.dp_size * f))
        p = at_dp(plan, dp)
        if p is None:
            continue
        c = estimate_compute(p, opts)
        rows.append((p.cluster.world_size, dp, c.step_time_s, c.tokens_per_s, c.mfu))
    return rows


@pytest.mark.parametrize("name", sorted(PLANS))
def test_scaling_curve_shares_only_what_every_point_has_in_common(name):
    """The stage work shared over the curve's points and the plan's own compute estimate give the
    figures each point's separate estimate gives (a dp-dependent stage work would fail here)."""
    p, opts = _plan(name), TimeOptions()
    own = estimate_compute(p, opts)
    for rows in (scaling_curve(p, opts), scaling_curve(p, opts, own=own)):
        got = [(r["gpus"], r["dp"], r["step_time_s"], r["tokens_per_s"], r["mfu"]) for r in rows]
        assert got == _curve_unshared(p, opts)
        assert len(got) >= (1 if p.cluster.world_size == 1 else 2)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_scaling_curve_reads_the_given_own_estimate_at_the_plans_own_point(name):
    p, opts = _plan(name), TimeOptions()
    own = estimate_compute(p, opts)
    marked = dataclasses.replace(own, step_time_s=own.step_time_s * 2)
    rows = {r["dp"]: r for r in scaling_curve(p, opts, own=marked)}
    assert rows[p.layout.dp_size]["step_time_s"] == marked.step_time_s


def test_shared_work_is_filled_once_and_read_after():
    p, opts = _plan("mixtral-ep8"), TimeOptions()
    shared: list[StageWork] = []
    first = estimate_compute(p, opts, shared_work=shared)
    assert len(shared) == 1
    again = estimate_compute(p, opts, shared_work=shared)
    assert len(shared) == 1 and again == first == estimate_compute(p, opts)


@pytest.mark.parametrize("name", ["70b-tp8-pp2"])
def test_pipeline_memory_builds_the_busier_stage_as_estimated_alone(name):
    """The pipeline estimate's breakdown is the one its busier stage gives when estimated alone."""
    p, opts = _plan(name), MemoryOptions()
    est = estimate_memory(p, opts, suggest=False)
    alone = {}
    for role in ("first", "last"):
        with pipeline_role(role):
            alone[role] = estimate_memory(p, opts, suggest=False)
    busier = max(("first", "last"), key=lambda r: alone[r].peak_allocated_bytes)
    a = alone[busier]
    assert (est.breakdown, est.timeline, est.phases, est.device_total_bytes) == \
        (a.breakdown, a.timeline, a.phases, a.device_total_bytes)
    assert est.notes[-1].startswith(f"pipeline: the busiest rank is the {busier} stage")


@pytest.mark.parametrize("name", sorted(PLANS))
def test_fit_bytes_equals_the_full_peak(name):
    """``fit_bytes`` (no breakdown) reports the allocated and device bytes ``peak_bytes`` does."""
    p, opts, rt = _plan(name), MemoryOptions(), runtime_defaults()
    roles = ("first", "last") if p.layout.pp > 1 else (None,)
    figures = []
    for role in roles:
        with pipeline_role(role):
            pk = peak_bytes(step_points(p, opts, rt)[1], opts, rt, p)
            figures.append((pk.allocated, pk.device_total))
            if role is not None:
                assert fit_bytes(p, opts)[:2] == figures[-1]
    assert fit_bytes(p, opts)[:2] == max(figures, key=lambda f: f[0])


def test_remembered_flow_and_stage_follow_the_plan_object():
    """The last-plan memory of ``flow_of`` and the per-role Stage cache never serve another plan."""
    a = _plan("8b-1gpu")
    b = build_plan(PlanInputs(**dict(PLANS["8b-1gpu"], precision="bf16")))
    assert flow_of(a) == _flow_of(a) and flow_of(b) == _flow_of(b) != _flow_of(a)
    p = _plan("70b-tp8-pp2")
    with pipeline_role("first"):
        first = Stage.of(p)
    with pipeline_role("last"):
        last = Stage.of(p)
    with pipeline_role("first"):
        assert first == Stage._derive(p)
    assert first.inflight > last.inflight == 1.0  # 1F1B: p in flight on the first stage, 1 on the last
    with pipeline_role("first"):
        assert Stage.of(p) is first


@pytest.mark.parametrize("name", sorted(PLANS))
def test_remembered_moments_equal_a_fresh_walk_per_role(name):
    """``step_points`` remembers the last plan's moments (each pipeline role's): served again they
    equal a fresh walk of the same role, never another role's or another plan's."""
    from trainledger.estimate.memory.phases import _step_points

    p, opts, rt = _plan(name), MemoryOptions(), runtime_defaults()
    roles = ("first", "last") if p.layout.pp > 1 else (None,)
    for role in roles + roles:
        with pipeline_role(role):
            x, pts = step_points(p, opts, rt)
            fx, fpts = _step_points(p, opts, rt)
            assert pts == fpts and dataclasses.asdict(x) == dataclasses.asdict(fx)
    other = build_plan(PlanInputs(**dict(PLANS[name], micro_batch=2)))
    with pipeline_role(roles[0]):
        assert step_points(other, opts, rt)[1] == _step_points(other, opts, rt)[1] != step_points(p, opts, rt)[1]


def test_memo_size_changes_no_figure(monkeypatch):
    """The states and activations memos (estimate/memory/phases.py) forget everything when they
    reach ``_MEMO_SIZE`` entries. A memo that forgets before every insertion gives every figure of
    these estimates, suggestions included (the search walks many variants through the memos),
    exactly as the default one does: the size trades only speed (an equivalent mutant for the
    probe)."""
    from trainledger.estimate.memory import phases

    def run():
        phases.clear_memos()
        out = [estimate_memory(_plan(n), MemoryOptions()).to_dict() for n in sorted(PLANS) for _ in (0, 1)]
        return out, len(phases._STATES_MEMO) + len(phases._ACTS_MEMO)

    default, kept = run()
    monkeypatch.setattr(phases._STATES_MEMO, "size", 1)
    monkeypatch.setattr(phases._ACTS_MEMO, "size", 1)
    forgetful, kept_one = run()
    assert kept > 2 and kept_one <= 2  # the default memo kept many entries, the forgetful one one each
    assert forgetful == default


def test_model_hash_is_the_field_hash_and_a_changed_copy_gets_its_own():
    m = _plan("mixtral-ep8").model
    fields = tuple(m.__dict__[k] for k in type(m).model_fields)
    assert hash(m) == hash(fields) == hash(m)
    changed = m.model_copy(update={"num_layers": 3})
    assert hash(changed) == hash(tuple(changed.__dict__[k] for k in type(changed).model_fields))
    assert hash(changed) != hash(m) and changed != m
    assert hash(m.model_copy()) == hash(m) and m.model_copy() == m


def test_full_estimate_of_a_copied_plan_is_identical():
    """Caches keyed on plan objects give the same ledger for a fresh (equal) plan object."""
    for name in PLANS:
        p = _plan(name)
        assert estimate(p).to_dict() == estimate(p.model_copy()).to_dict()
    assert EstimateOptions().time.scaling  # the curve is part of the ledger compared


@pytest.mark.parametrize("kw", [PLANS["70b-tp8-pp2"],  # nothing fits alone: the combined search runs
                                dict(model="llama-3.1-70b", gpus=16, tp=8, pp=2, grad_accum=4)])
def test_pipeline_suggestions_pruned_at_a_misfit_stage_equal_the_full_search(kw, monkeypatch):
    """A variant whose first stage alone is over the budget is dropped without walking its last
    stage; the suggestions (and the combined change) equal those of the unpruned search."""
    from trainledger.estimate.memory import suggest as S

    p, opts = build_plan(PlanInputs(**kw)), MemoryOptions()
    est = estimate_memory(p, opts, suggest=False)
    assert not est.fits
    pruned = S.suggestions(p, opts, est)
    monkeypatch.setattr(S, "fit_or_misfit", lambda plan, o, limit=None: fit_bytes(plan, o))
    assert pruned == S.suggestions(p, opts, est) != []


def test_serving_section_shares_engine_memory_and_concurrency_points():
    """The memory and serving sections read one engine accounting; the serving section evaluates
    the batch, each curve point and the largest concurrency once: every figure equals its own
    evaluation, and each is its own dict."""
    from trainledger.estimate.serving.memory import _engine_memory, engine_memory
    from trainledger.estimate.serving.perf import ServingPerf
    from trainledger.estimate.serving.section import curve_points, serving_section

    plan = build_plan(PlanInputs(model="llama-3.1-8b", method="inference", seq_len=2048, generate_len=256,
                                 micro_batch=8))
    em = engine_memory(plan)
    assert engine_memory(plan) is em
    assert dataclasses.asdict(em) == dataclasses.asdict(_engine_memory(plan))
    sec = serving_section(plan)
    perf = ServingPerf(plan)
    limit = max(1, em.steady_concurrency(2048, 256))
    assert 8 in curve_points(limit)  # the batch is also a curve point: shared
    assert sec.at_batch == perf.continuous(8, 2048, 256)
    assert sec.curve == [perf.continuous(c, 2048, 256) for c in curve_points(limit)]
    assert sec.max_throughput == perf.continuous(limit, 2048, 256)
    assert sec.max_throughput is not sec.curve[-1]
    assert all(sec.at_batch is not c for c in sec.curve)


def test_clear_memos_forgets_every_keyed_memo_including_the_communicators():
    """A cold estimate (bench/estimate_speed.py's fresh plan) derives its communicators again: the
    time model's group memo is a KeyedMemo, emptied with the memory terms."""
    from trainledger.estimate import estimate
    from trainledger.estimate.memory import phases
    from trainledger.estimate.memory.model import _LOCAL_PARAMS
    from trainledger.estimate.time import comm

    estimate(_plan(sorted(PLANS)[0]))
    assert len(comm._GROUPS) and len(phases._STATES_MEMO)
    phases.clear_memos()
    assert len(comm._GROUPS) == len(phases._STATES_MEMO) == len(phases._ACTS_MEMO) == len(_LOCAL_PARAMS) == 0
