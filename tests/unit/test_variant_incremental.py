"""Variants built incrementally (issue 13 item 8) equal the same variants built from scratch.

The suggestion search and the scaling curve build a dozen plans per estimate that differ from the
estimated plan in one knob. They copy only the changed parts (``Spec.updated``, ``Plan.variant``),
reuse the terms the knob leaves alone (``phases._training_parts``), stop at a bound of a step that
cannot fit (``phases.fit_or_misfit``) and read a curve point's figures without its notes
(``step.point_figures``). Each test derives the same thing the slow, from-scratch way
(``model_copy``, ``Plan(...)``, a fresh ``estimate_memory`` / ``estimate_compute``) and compares.
"""

from __future__ import annotations

import dataclasses

import pytest

from trainledger.errors import TrainledgerError
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory import suggest
from trainledger.estimate.memory.model import PARTS_FIELDS, Parts, activations, model_states
from trainledger.estimate.memory.phases import _training_parts, clear_memos, fit_bytes, fit_or_misfit
from trainledger.estimate.options import MemoryOptions, TimeOptions
from trainledger.estimate.stage import pipeline_role
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.compute import step_flops
from trainledger.estimate.time.step import point_figures
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.plan import Plan
from reference_plans import at_dp, plan_from_scratch

OPTS = MemoryOptions()

PLANS = {
    "8B full, 1 GPU": dict(model="llama-3.1-8b", seq_len=4096),
    "8B micro-batch 8": dict(model="llama-3.1-8b", seq_len=4096, micro_batch=8),
    "8B LoRA eager": dict(model="llama-3.1-8b", seq_len=4096, method="lora", attention="eager"),
    "70B tp8 pp2 ZeRO-1": dict(model="llama-3.1-70b", seq_len=8192, gpus=64, tp=8, pp=2, zero=1,
                               grad_accum=8),
    "Mixtral ep8 ZeRO-3": dict(model="mixtral-8x7b", seq_len=4096, gpus=16, ep=8, zero=3),
    "8B fsdp2": dict(model="llama-3.1-8b", seq_len=4096, micro_batch=4, gpus=8, zero=3, framework="fsdp2"),
    "8B deepspeed ZeRO-2": dict(model="llama-3.1-8b", seq_len=4096, micro_batch=4, gpus=8, zero=2,
                                framework="deepspeed"),
    "8B megatron tp2 gb256": dict(model="llama-3.1-8b", gpus=16, tp=2, global_batch=256,
                                  framework="megatron-core"),
    "1B on a V100 (bf16 refused)": dict(model="llama-3.2-1b", seq_len=8192, micro_batch=4,
                                        gpu="v100-sxm2-16gb"),
}


def _plan(name: str) -> Plan:
    return build_plan(PlanInputs(**PLANS[name]))


def _outcome(build, *args, **kw):
    try:
        return build(*args, **kw)
    except TrainledgerError as exc:  # the plan's own checks: the same error, field and message
        return (type(exc), exc.field, str(exc))
    except ValueError:  # Plan(...) wraps ValueErrors in a ValidationError
        return ValueError


def test_updated_is_model_copy():
    plan = _plan("70B tp8 pp2 ZeRO-1")
    for spec, changes in ((plan.recipe, {"optimizer": "adamw-8bit", "grad_accum": 3}),
                          (plan.layout, {"zero": 3, "dp": None}),
                          (plan.cluster, {"gpus_per_node": 4, "nodes": 2}),
                          (plan, {"headroom": 0.2}),
                          (plan.model, {"num_layers": 40})):
        fast, slow = spec.updated(changes), spec.model_copy(update=changes)
        assert type(fast) is type(slow)
        assert fast == slow and fast.__dict__ == slow.__dict__
        assert fast.model_fields_set == slow.model_fields_set
        assert fast.__pydantic_extra__ == slow.__pydantic_extra__
        assert fast.__pydantic_private__ == slow.__pydantic_private__
    # a changed model spec forgets the derived values of the original (its parameter counts)
    plan.model.params  # noqa: B018  (computed and kept on the original)
    assert plan.model.updated({"num_layers": 40}).params.total == \
        plan.model.model_copy(update={"num_layers": 40}).params.total != plan.model.params.total


@pytest.mark.parametrize("name", list(PLANS))
def test_variant_equals_plan_constructor(name):
    """Every suggestion candidate (and a few invalid ones) built by ``Plan.variant`` equals the plan
    ``Plan(...)`` builds from the same parts, or fails where it fails."""
    plan = _plan(name)
    changes = [
        ({"optimizer": "adamw-fused"}, None, None), ({"recompute": "full"}, None, None),
        ({"precision": "bf16"}, None, None), ({"method": "lora"}, None, None), ({"method": "qlora"}, None, None),
        ({"micro_batch": 3, "global_batch": None}, None, None), (None, {"zero": 3}, None),
        (None, {"offload": "optimizer"}, None), (None, {"offload": "params"}, None),
        (None, {"zero": 3}, 2 * plan.cluster.world_size), (None, {"zero": 3}, 3),  # 3 GPUs: tp/pp may not divide
        (None, {"tp": 7}, None), ({"precision": "fp8-mixed"}, None, None), ({"seq_len": 4097}, {"cp": 2}, None),
        ({"lora_targets": ("nothing",), "method": "lora"}, None, None),
    ]
    compared = 0
    for recipe, layout, gpus in changes:
        fast = _outcome(suggest._with, plan, recipe, layout, gpus)
        slow = _outcome(plan_from_scratch, plan, recipe, layout, gpus)
        if isinstance(slow, Plan):
            assert isinstance(fast, Plan), (recipe, layout, gpus, fast)
            assert fast == slow and fast.model_fields_set == slow.model_fields_set
            assert estimate_memory(fast, OPTS).to_dict() == estimate_memory(slow, OPTS).to_dict()
            compared += 1
        else:  # both refuse the variant (the search skips it either way), for the same reason
            assert not isinstance(fast, Plan), (recipe, layout, gpus)
            if isinstance(slow, tuple):
                assert fast == slow
    assert compared >= 5


def test_variant_checks_every_part_it_replaces():
    """``Plan.variant`` runs again each group of checks that reads a replaced part: the model, the
    serving options and the headroom too (here each made invalid on purpose)."""
    plan = _plan("8B full, 1 GPU")
    moe = _plan("Mixtral ep8 ZeRO-3")
    cases = [dict(model=moe.model.updated({"num_heads": 30})),  # ModelSpec._check runs again in Plan(...)
             dict(model=_plan("70B tp8 pp2 ZeRO-1").model),
             dict(serving=plan.serving.model_copy(update={"quantization": "mxfp4"})),
             dict(runtime=plan.runtime.model_copy(update={"framework": "deepspeed"}),
                  layout=plan.layout.model_copy(update={"offload": "params", "zero": 1})),
             dict(headroom=0.95), dict(headroom=0.2)]
    for parts in cases:
        fast = _outcome(plan.variant, **parts)
        slow = _outcome(Plan, **{**{k: getattr(plan, k) for k in Plan.model_fields}, **parts})
        if isinstance(slow, Plan):
            assert fast == slow
        else:
            assert fast == slow, parts


@pytest.mark.parametrize("name", list(PLANS))
def test_incremental_variant_fit_equals_aplan_from_scratch_estimate(name):
    """Each variant measured after its siblings (the terms they share remembered) equals its own
    full estimate with nothing remembered."""
    plan = _plan(name)
    estimate_memory(plan, OPTS, suggest=False)
    variants = []
    for _, _, build in suggest._candidates(plan):
        try:
            variants.append(build())
        except (TrainledgerError, ValueError):
            pass
    warm = [(fit_bytes(v, OPTS), fit_or_misfit(v, OPTS)) for v in variants]
    for v, (fit, early) in zip(variants, warm):
        clear_memos()
        cold = estimate_memory(plan_from_scratch(v), OPTS, suggest=False)
        assert fit == (cold.peak_allocated_bytes, cold.device_total_bytes, fit[2])
        assert early is None or early == fit
        if early is None:
            assert fit[1] > fit[2]  # called a misfit early: it does not fit


def test_memoized_terms_laid_side_by_side_equal_one_parts():
    """A walk's terms (``phases._training_parts``: the model-state and activation memos' values laid
    side by side) equal one Parts on which ``model_states`` and then ``activations`` ran."""
    assert len(PARTS_FIELDS) == len(dataclasses.fields(Parts))
    for name in PLANS:
        plan = _plan(name)
        for role in ((None,) if plan.layout.pp == 1 else ("first", "last")):
            with pipeline_role(role):
                clear_memos()
                x = Parts()
                model_states(plan, x)
                activations(plan, OPTS, x)
                assert _training_parts(plan, OPTS) == x, (name, role)
                assert _training_parts(plan, OPTS) == x  # and from the memos


@pytest.mark.parametrize("name", ["8B megatron tp2 gb256", "70B tp8 pp2 ZeRO-1", "Mixtral ep8 ZeRO-3"])
@pytest.mark.parametrize("mfu", [None, 0.4])
def test_point_figures_are_estimate_computes(name, mfu):
    """A scaling-curve point's figures equal those ``estimate_compute`` reports for the point's plan."""
    plan, opts = _plan(name), TimeOptions(mfu=mfu)
    seen = 0
    for f in (0.5, 2, 4):
        p = at_dp(plan, int(plan.layout.dp_size * f))
        if p is None:
            continue
        c = estimate_compute(p, opts)
        assert step_flops(p) == step_flops(plan)  # what a curve shares between its points
        assert point_figures(p, opts, [], [step_flops(plan)]) == point_figures(p, opts, []) == {
            "step_time_s": c.step_time_s, "tokens_per_s": c.tokens_per_s,
            "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "mfu": c.mfu}
        seen += 1
    assert seen


def test_serving_variants_equal_plan_constructor():
    """The serving section's variants (estimate/serving/section.py ``_variant``) equal the plans
    ``Plan(...)`` builds from the same parts, and fail where they fail."""
    from trainledger.estimate.serving import section
    from trainledger.spec.cluster import Cluster

    for kw in (dict(model="deepseek-v3", method="inference", precision="bf16", gpus=16, tp=16, seq_len=8192),
               dict(model="llama-3.1-70b", method="inference", gpus=4, tp=4, micro_batch=8, seq_len=32768),
               dict(model="llama-3.1-8b", method="inference", micro_batch=64, seq_len=8192)):
        plan = build_plan(PlanInputs(**kw))
        for serv, lay in (({"kv_cache_dtype": "fp8"}, {}), ({"quantization": "fp8"}, {}), ({"quantization": "awq"}, {}),
                          ({}, {"tp": plan.layout.tp * 2}), ({}, {"tp": plan.layout.tp * 4}), ({}, {"tp": 3}),
                          ({}, {"batch": True})):
            def slow(serv=serv, lay=lay, plan=plan):
                data = {k: getattr(plan, k) for k in Plan.model_fields}
                if serv:
                    data["serving"] = plan.serving.model_copy(update=serv)
                if lay.get("batch"):
                    data["recipe"] = plan.recipe.model_copy(update={"micro_batch": max(plan.recipe.micro_batch // 2, 1)})
                if "tp" in lay:
                    n = lay["tp"] * plan.layout.pp
                    per_node = min(n, plan.cluster.gpus_per_node if n >= plan.cluster.gpus_per_node else n)
                    data["cluster"] = Cluster(gpu=plan.cluster.gpu, gpus_per_node=per_node, nodes=max(1, n // per_node),
                                              intra=plan.cluster.intra, inter=plan.cluster.inter)
                    data["layout"] = plan.layout.model_copy(update={"tp": lay["tp"], "dp": 1})
                return Plan(**data)
            fast, ref = _outcome(section._variant, plan, serv, lay), _outcome(slow)
            if isinstance(ref, Plan):
                assert fast == ref
            else:
                assert fast == ref or not isinstance(fast, Plan), (kw, serv, lay)
