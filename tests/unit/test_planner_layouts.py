"""The planner's layout axes beyond TP, PP and the memory knobs: expert parallelism and interleaved
virtual stages. Each test builds the better layout by hand (no planner code), checks the premise
(it fits, it is faster), and requires the planner's pick for that GPU count to be at least as fast.

The bugs these guard, all found by bench/plan_optimality.py's brute force:
- EP: the planner tried only no EP and the widest EP dividing the experts and DP·CP. The step is
  not monotone in EP; on 16 H100 Mixtral 8x7B under FSDP2 ran 3.2% faster at EP 4 than the
  planner's pick (no EP; EP 8 was slower), and on 64 A100 Qwen3-30B-A3B 5.5% faster at EP 8
  (the planner tried EP 64).
- Interleaving: the walk over virtual stages stopped at the first v that did not fit. The first
  stage's in-flight activations peak at v = 2 and fall after it, so on 64 H100 a 70B at TP4·PP4
  did not fit at v = 2 and was planned without interleaving, 2.2% slower than v = 4.
- Knobs: selective recomputation (fsdp2's per-op SAC) was never combined with optimizer offload,
  and offload ran only with ZeRO-3.
"""

from __future__ import annotations

from trainledger.estimate.memory import fit_or_misfit
from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.planner.candidates import memory_options
from trainledger.planner.search import Job, search


def _rate_if_fits(**kw) -> float | None:
    plan = build_plan(PlanInputs(method="full", **kw))
    fit = fit_or_misfit(plan, memory_options())
    if fit is None or fit[1] > fit[2]:
        return None
    return estimate_compute(plan).tokens_per_s_per_gpu


def _planner_rate(n: int, **job) -> float:
    res = search(Job(method="full", max_gpus=n, rank_by="time", deadline_days=None, top=1000, **job))
    return max(c.compute.tokens_per_s_per_gpu for c in res.plans + res.unpriced
               if c.plan.cluster.world_size == n)


def test_an_expert_parallel_degree_between_none_and_the_widest_is_searched():
    job = dict(model="mixtral-8x7b", framework="fsdp2", seq_len=4096, global_batch=256)
    layout = dict(gpu="h100-sxm", gpus=16, tp=2, zero=3, recompute="full", micro_batch=8)
    ep4 = _rate_if_fits(**job, **layout, ep=4)
    widest = _rate_if_fits(**job, **layout, ep=8)
    none = _rate_if_fits(**job, **layout, ep=1)
    assert ep4 is not None and ep4 > max(widest or 0.0, none or 0.0)  # the premise: EP 4 beats both ends
    assert _planner_rate(16, gpus=("h100-sxm",), **job) >= ep4 * (1 - 1e-9)


def test_interleaving_past_a_depth_that_does_not_fit_is_searched():
    job = dict(model="llama-3.1-70b", framework="megatron-core", seq_len=4096, global_batch=256)
    layout = dict(gpu="h100-sxm", gpus=64, tp=4, pp=4, zero=1, recompute="none", micro_batch=1)
    v1 = _rate_if_fits(**job, **layout)
    assert _rate_if_fits(**job, **layout, vp=2) is None  # v = 2 holds the most in-flight activations
    v4 = _rate_if_fits(**job, **layout, vp=4)
    assert v1 is not None and v4 is not None and v4 > v1
    assert _planner_rate(64, gpus=("h100-sxm",), **job) >= v4 * (1 - 1e-9)


def test_selective_recomputation_with_optimizer_offload_is_a_knob():
    """torchtitan's per-op SAC with the optimizer offloaded: on 8 A100-80GB a 32B at 8k tokens fits
    at TP4 only with the optimizer on the host, and there SAC beats full recomputation (2.7%); the
    knobs went from offload without recomputation straight to offload with full."""
    job = dict(model="qwen2.5-32b", framework="fsdp2", seq_len=8192, global_batch=64)
    layout = dict(gpu="a100-sxm-80gb", gpus=8, tp=4, zero=3, micro_batch=1, offload="optimizer")
    sac = _rate_if_fits(**job, **layout, recompute="selective")
    full = _rate_if_fits(**job, **layout, recompute="full")
    assert sac is not None and full is not None and sac > full
    assert _planner_rate(8, gpus=("a100-sxm-80gb",), **job) >= sac * (1 - 1e-9)


def test_zero2_with_optimizer_offload_is_a_knob():
    """ZeRO-Offload's own setting (ZeRO-2, optimizer on the host): on 4 L40S a 13B under DeepSpeed
    fits it at micro-batch 2 with full recomputation and runs 2.6% faster than ZeRO-3 with offload
    (the only offload knob before), which re-gathers the parameters every layer."""
    job = dict(model="llama-2-13b", framework="deepspeed", seq_len=4096, global_batch=256)
    layout = dict(gpu="l40s", gpus=4, recompute="full", offload="optimizer")
    z2 = _rate_if_fits(**job, **layout, zero=2, micro_batch=2)
    z3 = max(r for r in (_rate_if_fits(**job, **layout, zero=3, micro_batch=b) for b in (1, 2, 4, 8)) if r)
    assert z2 is not None and z2 > z3
    assert _planner_rate(4, gpus=("l40s",), **job) >= z2 * (1 - 1e-9)
