"""Property-based tests of ``estimate(plan)`` over the whole input space (issue 9, "Inputs").

* any PlanInputs mapping -> a TrainledgerError or a ledger whose every number is finite and >= 0;
* memory grows (non-strictly) with the micro-batch and with the sequence length;
* ZeRO-3 per-GPU model states shrink as DP grows, and ZeRO-sharded terms times the shard count
  add back to the unsharded term (ZeRO paper, Rajbhandari et al. 2020, arXiv:1910.02054, Fig. 1);
* adding data-parallel GPUs at a fixed global batch shrinks the compute part of a step, and any
  step-time increase is accounted for by named communication/bubble terms of the breakdown.

Example counts are bounded and derandomized (same examples on every run, CI stable).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from reliability_strategies import bad_numbers, models, raw_inputs, valid_case

from trainledger.errors import TrainledgerError
from trainledger.estimate import EstimateOptions, estimate
from trainledger.estimate.options import CostOptions, MemoryOptions, TimeOptions
from trainledger.load.plan import build_plan, parse_inputs

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                print_blob=True)
#: the invariants compare memory models only; the "how to make it fit" search is exercised by the
#: two whole-ledger properties below.
NO_SUGGEST = EstimateOptions(memory=MemoryOptions(suggestions=False))
STATE_TERMS = ("weights", "master_weights", "optimizer_states")


def _estimate(d, model=None, options=None):
    return estimate(build_plan(parse_inputs(d), model=model), options)


def _try(d, model=None, options=NO_SUGGEST):
    """The estimate, or None when the library refuses the inputs with its own error."""
    try:
        return _estimate(d, model, options)
    except TrainledgerError:
        return None


def _check_ledger(est) -> None:
    d = est.to_dict()
    bad = bad_numbers(d)
    assert not bad, bad[:5]
    mem = est.memory
    assert sum(mem.breakdown.values()) == mem.peak_allocated_bytes
    assert mem.peak_allocated_bytes <= mem.peak_reserved_bytes <= mem.device_total_bytes
    # phase totals truncate the float sum, the breakdown truncates each term: <= 1 B per term apart
    assert abs(max(mem.phases.values()) - mem.peak_allocated_bytes) <= len(mem.breakdown)
    for t in mem.terms:
        assert math.isfinite(t.value) and t.value >= 0, t
        assert t.source, f"term {t.name} has no source"


@settings(max_examples=120, **SETTINGS)
@given(raw_inputs())
def test_any_inputs_give_own_error_or_finite_ledger(d):
    """Independent draws of every field (most combinations are inconsistent)."""
    try:
        est = _estimate(d)
    except TrainledgerError as exc:
        assert str(exc).strip(), "an error without a message"
        assert "\n" not in str(exc).strip(), f"error message spans lines: {exc}"
        return
    _check_ledger(est)


@settings(max_examples=120, **SETTINGS)
@given(valid_case())
def test_consistent_plans_give_finite_ledger(case):
    d, m = case
    try:
        est = _estimate(d, m)
    except TrainledgerError as exc:
        assert str(exc).strip()
        return
    _check_ledger(est)
    comp = est.compute
    assert comp.step_time_s > 0
    assert sum(comp.breakdown.values()) == pytest.approx(comp.step_time_s, rel=1e-9)


@settings(max_examples=60, **SETTINGS)
@given(valid_case(), st.integers(1, 16))
def test_memory_grows_with_micro_batch(case, extra):
    d, m = case
    a = _try(d, m)
    b = _try(dict(d, micro_batch=d["micro_batch"] + extra), m)
    assume(a is not None and b is not None)
    assert b.memory.peak_allocated_bytes >= a.memory.peak_allocated_bytes
    assert b.memory.device_total_bytes >= a.memory.device_total_bytes


@settings(max_examples=60, **SETTINGS)
@given(valid_case(), st.sampled_from([2, 3, 4, 16]))
def test_memory_grows_with_sequence_length(case, factor):
    d, m = case
    a = _try(d, m)
    b = _try(dict(d, seq_len=d["seq_len"] * factor), m)
    assume(a is not None and b is not None)
    assert b.memory.peak_allocated_bytes >= a.memory.peak_allocated_bytes
    assert b.memory.device_total_bytes >= a.memory.device_total_bytes


def _zero_case(d, **kw):
    out = dict(d, offload="none", hybrid_shard=False, **kw)
    out["gpus"] = out["dp"] * out["tp"] * out["pp"] * out["cp"]
    out["gpus_per_node"] = math.gcd(out["gpus"], 8)
    return out


@settings(max_examples=60, **SETTINGS)
@given(valid_case(training=True), st.sampled_from([2, 4, 8]))
def test_zero3_states_shrink_as_dp_grows(case, factor):
    d, m = case
    d = dict(d, method=d["method"] if d["method"] != "inference" else "full")
    a = _try(_zero_case(d, zero=3), m)
    b = _try(_zero_case(d, zero=3, dp=d["dp"] * factor), m)
    assume(a is not None and b is not None)
    for term in STATE_TERMS:
        wa, wb = a.memory.breakdown.get(term, 0), b.memory.breakdown.get(term, 0)
        assert wb <= wa, f"{term}: {wb} B/GPU at dp={d['dp'] * factor} > {wa} at dp={d['dp']}"
        if wa > 2 * factor:  # truncation to whole bytes aside, the share strictly shrinks
            assert wb < wa, term


@settings(max_examples=60, **SETTINGS)
@given(valid_case(training=True), st.integers(1, 3))
def test_zero_sharded_terms_sum_to_unsharded(case, stage):
    """Each of the N = dp·cp ranks holds 1/N of what ZeRO shards at this stage: N·share == whole."""
    d, m = case
    d = dict(d, method=d["method"] if d["method"] != "inference" else "full")
    whole = _try(_zero_case(d, zero=0), m)
    part = _try(_zero_case(d, zero=stage), m)
    assume(whole is not None and part is not None)
    n = d["dp"] * d["cp"]
    sharded = {1: ("master_weights", "optimizer_states"),
               2: ("master_weights", "optimizer_states"),
               3: STATE_TERMS}[stage]
    for term in sharded:
        w, p = whole.memory.breakdown.get(term, 0), part.memory.breakdown.get(term, 0)
        assert abs(p * n - w) <= n, f"ZeRO-{stage}: {n} x {p} B of {term} != {w} B unsharded"
    for term in set(STATE_TERMS) - set(sharded):  # what this stage does not shard stays whole
        assert part.memory.breakdown.get(term, 0) == whole.memory.breakdown.get(term, 0), term


#: terms that data parallelism itself adds (a step may grow by them on more GPUs): its
#: communication and DDP's bucket copies (dp > 1 only), the bubble, overlap, optimizer, host
NON_COMPUTE = ("comm", "bubble", "overlap", "optimizer", "data", "ddp_copy")


@settings(max_examples=60, **SETTINGS)
@given(valid_case(training=True), st.sampled_from([2, 4]))
def test_more_gpus_less_time_or_named_reason(case, factor):
    """Same job and global batch over factor x more data-parallel GPUs."""
    d, m = case
    gb = d["dp"] * d["micro_batch"] * d["grad_accum"] * factor
    base = dict(d, global_batch=gb, tokens=1e9)
    base.pop("grad_accum")
    a = _try(_zero_case(base, zero=d["zero"]), m)
    b = _try(_zero_case(base, zero=d["zero"], dp=d["dp"] * factor), m)
    assume(a is not None and b is not None)
    ca, cb = a.compute, b.compute
    assert cb.breakdown["compute"] <= ca.breakdown["compute"] * (1 + 1e-9)
    assert b.time.total_s > 0 and a.time.total_s > 0
    if cb.step_time_s <= ca.step_time_s * (1 + 1e-9):
        assert b.time.total_s <= a.time.total_s * (1 + 1e-9)
        return
    grew = sum(max(0.0, cb.breakdown.get(k, 0.0) - ca.breakdown.get(k, 0.0))
               for k in set(ca.breakdown) | set(cb.breakdown) if k.startswith(NON_COMPUTE))
    assert cb.step_time_s - ca.step_time_s <= grew * (1 + 1e-6) + 1e-12, (ca.breakdown, cb.breakdown)


@settings(max_examples=25, **SETTINGS)
@given(models())
def test_default_options_with_suggestions_never_crash(m):
    """The default estimate (with the does-not-fit suggestion search) on one GPU of each size."""
    for gpu in ("a10", "h100-sxm"):
        try:
            est = _estimate({"model": m.name, "gpu": gpu, "gpus": 1, "seq_len": 4096}, m, None)
        except TrainledgerError:
            continue
        _check_ledger(est)


def _edge(lo: float, hi: float):
    return st.one_of(st.none(), st.sampled_from([lo, hi]), st.floats(lo, hi))


#: every numeric estimate option at and between its accepted limits (None = catalog default).
#: dataloader_workers from 0: with none, each training process reads in its main loop.
OPTIONS = st.builds(
    lambda mfu, eff, price, elec, pue, util, life, ckpt, bpt, workers, rd, iops: EstimateOptions(
        memory=MemoryOptions(suggestions=False), time=TimeOptions(mfu=mfu, matmul_efficiency=eff),
        cost=CostOptions(price_per_gpu_hour=price, electricity_usd_per_kwh=elec, pue=pue, utilization=util,
                         lifetime_years=life, checkpoint_interval_s=ckpt, bytes_per_token=bpt,
                         dataloader_workers=workers, storage_read_gb_per_s=rd, storage_iops=iops)),
    _edge(1e-9, 1.0), _edge(1e-9, 1.0), _edge(1e-9, 1e6), _edge(0.0, 100.0), _edge(1.0, 5.0),
    _edge(1e-9, 1.0), _edge(1e-6, 30.0), _edge(1e-6, 1e9), _edge(1e-6, 1e3),
    st.one_of(st.none(), st.integers(0, 1024)), _edge(1e-9, 1e6), _edge(1e-3, 1e9))


@settings(max_examples=120, **SETTINGS)
@given(valid_case(training=True), OPTIONS)
def test_extreme_options_give_finite_ledger(case, options):
    d, m = case
    try:
        est = _estimate(dict(d, tokens=1e9), m, options)
    except TrainledgerError as exc:
        assert str(exc).strip() and "\n" not in str(exc).strip()
        return
    _check_ledger(est)
