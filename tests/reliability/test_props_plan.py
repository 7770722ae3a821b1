"""Property-based tests of the planner's library entry point ``trainledger.planner.search.search(Job)``.

* any job -> a SearchResult or a TrainledgerError, nothing else;
* every plan it recommends fits the GPU's memory budget, respects the GPU budget, multiplies its
  degrees to its GPU count, and has finite, non-negative figures; every rejection has a reason;
* the ranking is sorted by the job's criterion and the first plan is on the Pareto front;
* the GPU count reported is the larger of the memory bound and the deadline bound;
* more GPUs allowed never makes the fastest plan slower (the candidates are a superset);
* a shorter deadline never needs fewer GPUs.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from reliability_strategies import SMALL_PRESETS, bad_numbers

from trainledger.errors import TrainledgerError
from trainledger.spec.recipe import ATTENTIONS, OPTIMIZERS, PRECISIONS
from trainledger.planner.search import Job, search

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                print_blob=True)
FEW_GPUS = ("h100-sxm", "a100-sxm-80gb", "l40s", "mi300x", "rtx-4090", "a10")
_TMP = tempfile.mkdtemp(prefix="tl-rel-plan-")


@st.composite
def synthetic_config_path(draw: st.DrawFn) -> str:
    """A generic config.json on disk (the planner takes a model reference, not a ModelSpec)."""
    heads = draw(st.sampled_from([1, 4, 8, 16, 32]))
    cfg = {"model_type": "generic", "hidden_size": heads * 64, "num_attention_heads": heads,
           "num_key_value_heads": draw(st.sampled_from([k for k in (1, 2, 4, 8) if heads % k == 0])),
           "head_dim": 64, "num_hidden_layers": draw(st.integers(1, 64)),
           "intermediate_size": draw(st.integers(1, 30000)),
           "vocab_size": draw(st.integers(2, 200_000))}
    path = os.path.join(_TMP, f"cfg-{abs(hash(json.dumps(cfg, sort_keys=True)))}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


@st.composite
def jobs(draw: st.DrawFn, max_gpus: int | None = None) -> Job:
    return Job(
        model=draw(st.one_of(st.sampled_from(SMALL_PRESETS), synthetic_config_path())),
        method=draw(st.sampled_from(["pretrain", "full", "lora", "qlora"])),
        precision=draw(st.sampled_from(PRECISIONS)),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        attention=draw(st.sampled_from(ATTENTIONS)),
        seq_len=draw(st.sampled_from([1, 128, 2048, 8192, 131072])),
        global_batch=draw(st.one_of(st.none(), st.sampled_from([1, 3, 64, 512]))),
        tokens=draw(st.one_of(st.none(), st.sampled_from([1e6, 1e10, 1e13]))),
        deadline_days=draw(st.one_of(st.none(), st.sampled_from([0.01, 1.0, 30.0]))),
        max_gpus=max_gpus or draw(st.sampled_from([1, 2, 8, 64, 256])),
        gpus=tuple(draw(st.lists(st.sampled_from(FEW_GPUS), min_size=1, max_size=2, unique=True))),
        gpus_per_node=tuple(draw(st.lists(st.sampled_from([1, 4, 8]), min_size=0, max_size=1))),
        rank_by=draw(st.sampled_from(["time", "cost", "gpus"])),
        top=draw(st.sampled_from([1, 5, 50])),
        headroom=draw(st.sampled_from([0.0, 0.1, 0.5])),
    )


def _search(job: Job):
    try:
        return search(job)
    except TrainledgerError as exc:
        assert str(exc).strip() and "\n" not in str(exc).strip(), repr(exc)
        return None


def _rank_key(c, by: str) -> tuple:
    """The job's criterion: run time (seconds per token without a budget), cost, GPU count."""
    t = c.total_s if c.total_s is not None else c.compute.step_time_s / c.compute.tokens_per_step
    cost = c.cost_usd if c.cost_usd is not None else math.inf
    return {"cost": (cost,), "gpus": (c.plan.cluster.world_size,), "time": (t,)}[by]


@settings(max_examples=80, **SETTINGS)
@given(jobs())
def test_planner_answers_every_job(job):
    res = _search(job)
    if res is None:
        return
    d = res.to_dict()
    json.dumps(d)  # serializable as the CLI's --json
    assert not bad_numbers(d["plans"]), bad_numbers(d["plans"])[:5]
    assert len(res.plans) <= job.top
    for c in res.plans:
        lay, cl = c.plan.layout, c.plan.cluster
        assert c.memory.fits, "a recommended plan does not fit"
        assert c.memory.device_total_bytes <= c.memory.budget_bytes
        assert cl.world_size <= job.max_gpus
        assert lay.dp_size * lay.tp * lay.pp * lay.cp == cl.world_size
        # the job's batch, rounded to a multiple of micro-batch x DP by at most the planner's
        # tolerance (any whole-node GPU count can run the job; issue 15)
        from trainledger.planner.search import default_global_batch

        asked = job.global_batch or default_global_batch(job)
        assert abs(c.plan.global_batch - asked) <= job.batch_rounding * asked + 1e-9
        if job.deadline_days and c.total_s is not None:
            assert c.total_s <= job.deadline_days * 86400 * (1 + 1e-9)
    for r in res.rejected:
        assert r.reason.strip(), r
    keys = [_rank_key(c, job.rank_by) for c in res.plans]
    assert keys == sorted(keys)
    if res.plans:
        assert res.plans[0].pareto or job.rank_by == "gpus" or any(
            _rank_key(c, job.rank_by) == keys[0] and c.pareto for c in res.plans)
    for row in res.gpu_count:
        if row["gpus_needed"] is not None:
            bounds = [b for b in (row["memory_bound_gpus"], row["deadline_bound_gpus"]) if b]
            assert row["gpus_needed"] == max(bounds)


@settings(max_examples=25, **SETTINGS)
@given(jobs(max_gpus=8), st.sampled_from([2, 8]))
def test_more_gpus_allowed_never_slower(job, factor):
    job = job.model_copy(update={"rank_by": "time", "deadline_days": None, "top": 1000})
    small = _search(job)
    big = _search(job.model_copy(update={"max_gpus": job.max_gpus * factor}))
    assume(small is not None and big is not None and small.plans)
    assert big.plans, "a plan found with fewer GPUs allowed vanished with more allowed"
    t_small = _rank_key(small.plans[0], "time")[0]
    t_big = _rank_key(big.plans[0], "time")[0]
    assert t_big <= t_small * (1 + 1e-9)


@settings(max_examples=25, **SETTINGS)
@given(jobs(max_gpus=64))
def test_shorter_deadline_never_needs_fewer_gpus(job):
    job = job.model_copy(update={"tokens": job.tokens or 1e10})
    long = _search(job.model_copy(update={"deadline_days": 30.0}))
    short = _search(job.model_copy(update={"deadline_days": 0.5}))
    assume(long is not None and short is not None)
    for a, b in zip(long.gpu_count, short.gpu_count):
        assert (a["gpu"], a["gpus_per_node"]) == (b["gpu"], b["gpus_per_node"])
        if b["gpus_needed"] is not None:
            assert a["gpus_needed"] is not None, "feasible in 0.5 days but not in 30"
            assert b["gpus_needed"] >= a["gpus_needed"]
