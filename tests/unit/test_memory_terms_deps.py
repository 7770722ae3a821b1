"""The memory terms' declared dependencies (estimate/memory/phases.py ``states_key`` / ``acts_key``)
are complete: plans whose key for a term is equal have equal bytes for that term.

Each base plan is perturbed in every field of its recipe, layout, cluster, runtime, serving and
headroom (and the memory options), one field at a time, over every value a Literal or bool field
takes and a few values of the numeric fields; for every perturbed plan that is valid and every
pipeline role, a term is computed afresh (``model_states`` / ``activations`` on an empty Parts) and
compared with the base plan's whenever the two keys agree. A field a term reads but whose key
leaves out makes some pair of equal keys differ in bytes and fails here. The test also checks
that the comparisons happen: every field a key leaves out is perturbed with the key unchanged.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from trainledger.errors import TrainledgerError
from trainledger.estimate.memory.model import (
    Parts, _local_params_uncached, activations, local_params_key, model_states,
)
from trainledger.estimate.memory.device import runtime_defaults
from trainledger.estimate.memory.runtimes import fsdp_sharded
from trainledger.estimate.memory.phases import (
    _FORWARD_END_SLACK, ACT_FIELDS, _acts_values, _forward_end_floor, _states_values, _step_points,
    _training_parts, acts_key, clear_memos, fit_bytes, fit_or_misfit, states_key,
)
from trainledger.estimate.options import MemoryOptions
from trainledger.estimate.stage import pipeline_role
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.plan import Plan
from trainledger.spec.runtime import ZERO_OFFLOAD_STACKS

BASES = {
    "hf-1gpu": dict(model="llama-3.1-8b", seq_len=2048),
    "hf-ddp-tp2": dict(model="llama-3.1-8b", gpus=8, tp=2, grad_accum=2, seq_len=2048),
    "hf-zero3": dict(model="llama-3.1-8b", gpus=8, zero=3, seq_len=2048),
    "hf-pp2-lora": dict(model="llama-3.1-8b", method="lora", gpus=4, pp=2, grad_accum=4, seq_len=2048),
    "fsdp2-sel": dict(model="llama-3.1-8b", gpus=8, zero=3, framework="fsdp2", recompute="selective"),
    "pytorch-fsdp-lora": dict(model="llama-3.1-8b", gpus=4, zero=3, framework="pytorch-fsdp", method="lora"),
    "fsdp2-hsdp": dict(model="llama-3.1-8b", gpus=16, zero=3, framework="fsdp2", hybrid_shard=True),
    "deepspeed-z3-hsdp": dict(model="llama-3.1-8b", gpus=16, zero=3, framework="deepspeed", hybrid_shard=True),
    "deepspeed-z2-off": dict(model="llama-3.1-8b", gpus=4, zero=2, offload="optimizer", framework="deepspeed"),
    "deepspeed-z3": dict(model="llama-3.1-8b", gpus=8, zero=3, framework="deepspeed", micro_batch=2),
    "mcore-tp2-pp2-fp8": dict(model="llama-3.1-8b", gpus=8, tp=2, pp=2, grad_accum=4, zero=1,
                              precision="fp8-mixed", framework="megatron-core"),
    "mcore-interleaved": dict(model="llama-3.1-8b", gpus=8, tp=2, pp=2, vp=2, pp_schedule="interleaved",
                              grad_accum=8, framework="megatron-core"),
    "nvfp4-b200": dict(model="llama-3.1-8b", gpu="b200", gpus=8, tp=2, precision="nvfp4-mixed",
                       framework="megatron-core", zero=1),
    "mixtral-tp2-ep8": dict(model="mixtral-8x7b", gpus=32, tp=2, ep=8, zero=1, framework="megatron-core",
                            seq_len=2048),
    "mixtral-ep": dict(model="mixtral-8x7b", gpus=16, ep=8, zero=3, seq_len=2048),
    "gemma2-eager": dict(model="gemma-2-9b", attention="eager", micro_batch=2, seq_len=8192, gpus=2),
    "qlora": dict(model="llama-3.1-8b", method="qlora", micro_batch=2),
    # context parallelism: the ring's forward transient (Parts.cp_fwd) is written by activations
    "fsdp2-cp2": dict(model="llama-3.1-8b", gpus=8, cp=2, zero=3, framework="fsdp2", seq_len=8192),
    "mcore-cp2-tp2": dict(model="llama-3.1-8b", gpus=8, cp=2, tp=2, zero=1, framework="megatron-core",
                          seq_len=8192),
}

#: values tried for the fields that are neither Literal nor bool (Literal and bool fields take all)
NUMERIC = {
    "seq_len": (1024, 4096, 8192), "micro_batch": (1, 2, 4), "grad_accum": (1, 2, 8),
    "global_batch": (None,), "recompute_layers": (None, 2), "lora_rank": (8, 64), "lora_alpha": (8.0,),
    "lora_targets": (("q_proj", "v_proj"),), "train_tokens": (None, 1e9), "generate_len": (0, 64),
    "dropout": (0.0, 0.1), "grad_clip": (None, 0.5), "fp4_bf16_layers": (None, 3),
    "tp": (1, 2, 4), "pp": (1, 2, 4), "cp": (1, 2), "ep": (1, 2, 8), "etp": (None, 1, 2), "vp": (1, 2),
    "pp_microbatches": (None, 4, 16),
    "gpus_per_node": (1, 2, 4, 8), "nodes": (1, 2, 4), "nics_per_node": (1, 8),
    "host_ram_bytes": (None, 2 ** 40), "host_mem_bw_gb_per_s": (50.0,), "cpu_cores": (16,),
    "quant_group_size": (64,), "block_size": (None, 32), "gpu_memory_utilization": (0.8,),
    "max_num_seqs": (None, 64), "max_num_batched_tokens": (None, 4096), "max_model_len": (None, 4096),
    "requests_per_s": (None, 2.0), "ttft_p50_s": (None, 0.5), "ttft_p99_s": (None, 1.0),
    "tpot_p50_s": (None, 0.05), "tpot_p99_s": (None, 0.1),
    "ds_reduce_bucket_size": (None, 2 ** 24), "ds_allgather_bucket_size": (None, 2 ** 24),
    "ds_stage3_prefetch_bucket_size": (None, 2 ** 24), "ds_stage3_param_persistence_threshold": (None, 10 ** 7),
    "ds_stage3_max_live_parameters": (None, 10 ** 8), "ds_overlap_comm": (None, True, False),
    "mla_latent_cache": (None, True, False), "stack_version": (None, "nemo-24.07"),
    "checkpoint_early_stop": (None, True, False), "reshard_after_forward": (None, True, False),
    "doc_len": (None, 512), "model_loading": (None, "every-rank", "rank0", "sharded"),
    "moe_capacity_factor": (None, 0.5, 2.0), "optimizer_states_dtype": (None, "fp32", "bf16"),
    "kernels": (None, "fused", "unfused"), "tp_comm_overlap": (None, True, False),
}
SKIP = {"dp"}  # resolved from the world size (perturbed through tp/pp/cp/gpus_per_node/nodes)


def _values(cls, name):
    if name in NUMERIC:
        return NUMERIC[name]
    ann = cls.model_fields[name].annotation
    if typing.get_origin(ann) is typing.Literal:
        return typing.get_args(ann)
    if ann is bool:
        return (True, False)
    raise AssertionError(f"{cls.__name__}.{name}: add the values to try to NUMERIC")


def _perturbed(plan: Plan):
    """(field, plan) for every one-field change of ``plan`` that makes a valid plan."""
    specs = {"recipe": plan.recipe, "layout": plan.layout, "cluster": plan.cluster, "runtime": plan.runtime,
             "serving": plan.serving}
    for part, obj in specs.items():
        for name in type(obj).model_fields:
            if name in SKIP:
                continue
            if name in ("gpu", "intra", "inter", "storage"):
                continue  # object fields: the gpu below; networks and storage are not memory inputs
            for v in _values(type(obj), name):
                if getattr(obj, name) == v:
                    continue
                yield f"{part}.{name}", _rebuild(plan, part, {name: v})
    world = plan.cluster.world_size
    for per_node in (1, 2, 4, 8, 16):  # the same world in other node shapes (hybrid sharding reads it)
        if world % per_node == 0 and per_node != plan.cluster.gpus_per_node:
            yield "cluster.gpus_per_node+nodes", _rebuild(plan, "cluster", {"gpus_per_node": per_node,
                                                                            "nodes": world // per_node})
    for gpu in ("a100-sxm-80gb", "b200"):
        yield "cluster.gpu", _rebuild(plan, "cluster", {"gpu": load_gpu(gpu)})
    for h in (0.0, 0.3):
        yield "headroom", _rebuild(plan, None, {"headroom": h})


def _rebuild(plan: Plan, part, update):
    kw = dict(model=plan.model, recipe=plan.recipe, layout=plan.layout.model_copy(update={"dp": None}),
              cluster=plan.cluster, runtime=plan.runtime, serving=plan.serving, headroom=plan.headroom)
    if part is None:
        kw.update(update)
    else:
        obj = kw[part].model_copy(update=update)
        kw[part] = type(obj).model_validate(obj.model_dump())  # field constraints checked
    try:
        return Plan(**kw)
    except (TrainledgerError, ValueError):
        return None


def _roles(plan):
    return ("first", "last", None) if plan.layout.pp > 1 else (None,)


def _states(plan):
    x = Parts()
    model_states(plan, x)
    return dataclasses.astuple(x)


def _acts(plan, opts):
    x = Parts()
    activations(plan, opts, x)
    return tuple(getattr(x, f) for f in ACT_FIELDS)


OPTS = MemoryOptions()


@pytest.mark.parametrize("name", BASES)
def test_equal_keys_mean_equal_terms(name):
    base = build_plan(PlanInputs(**BASES[name]))
    ref = {}
    for role in _roles(base):
        with pipeline_role(role):
            ref[role] = (states_key(base), _states(base), acts_key(base, OPTS), _acts(base, OPTS))
    same_key = {"states": set(), "acts": set()}
    for field, p in _perturbed(base):
        if p is None:
            continue
        for role in _roles(p):
            if role not in ref:
                continue
            sk, s, ak, a = ref[role]
            with pipeline_role(role):
                if states_key(p) == sk:
                    assert _states(p) == s, f"{name}: model_states reads {field} (role {role})"
                    same_key["states"].add(field)
                if p.recipe.is_training and acts_key(p, OPTS) == ak:
                    # what the memo answers for p while it holds the base plan's terms is p's own
                    # terms (a pipeline's receive buffers are kept per micro-batch and rescaled)
                    clear_memos()
                    assert tuple(_acts_values(base, OPTS)) == a
                    assert tuple(_acts_values(p, OPTS)) == _acts(p, OPTS), (
                        f"{name}: activations read {field} (role {role})")
                    same_key["acts"].add(field)
    # the keys leave out what they claim to: these changes kept the key and were compared
    assert {"recipe.micro_batch", "recipe.recompute", "recipe.attention", "recipe.seq_len"} <= same_key["states"]
    compared = {"recipe.optimizer", "headroom", "runtime.stack_version"}
    if base.layout.zero or base.runtime.framework not in ZERO_OFFLOAD_STACKS:  # else refused at ZeRO-0
        compared.add("layout.offload")
    assert compared <= same_key["acts"]
    assert "runtime.stack_version" in same_key["states"]  # a release tag keys calibrations, not memory


@pytest.mark.parametrize("name", BASES)
def test_local_params_key_is_complete(name):
    """The per-layout parameter counts are remembered by ``local_params_key``: a plan that keeps the
    key keeps the counts (computed afresh here, bypassing the memo)."""
    base = build_plan(PlanInputs(**BASES[name]))
    kept = 0
    for role in _roles(base):
        with pipeline_role(role):
            ref = (local_params_key(base), _local_params_uncached(base))
            for field, p in _perturbed(base):
                if p is not None and local_params_key(p) == ref[0]:
                    assert _local_params_uncached(p) == ref[1], f"{name}: _local_params reads {field} ({role})"
                    kept += 1
    assert kept  # the key leaves fields out (dp, optimizer, batch shape ...) and was compared


@pytest.mark.parametrize("name", BASES)
def test_resident_states_bound_every_peak(name):
    """``fit_or_misfit`` calls a plan misfit from its weights, master weights and optimizer states
    alone (resident at every moment of a training step): that must never exceed the walked peak, and
    a plan it calls misfit must not fit by the full walk."""
    base = build_plan(PlanInputs(**BASES[name]))
    seen = floors = 0
    for _, p in [("base", base), *_perturbed(base)]:
        if p is None or not p.recipe.is_training:
            continue
        for role in _roles(p):
            if role is None and p.layout.pp > 1:
                continue
            with pipeline_role(role):
                x = Parts(*_states_values(p))
                low = sum(int(v) for v in (x.weights, x.master, x.states) if v > 0)
                assert low <= fit_bytes(p, OPTS)[0], f"{name}: resident states above the peak ({role})"
                parts = _training_parts(p, OPTS)
                # the forward-end moment (FSDP's without its gathered units), less its slack, bounds
                # the peak too (where ``_fit`` uses it)
                fwd = _forward_end_floor(p, parts)
                if fwd is not None:
                    assert fwd - _FORWARD_END_SLACK <= fit_bytes(p, OPTS)[0], f"{name}: forward end ({role})"
                    assert fwd <= max(sum(d.values()) for _, _, d in _step_points(p, OPTS, runtime_defaults())[1])
                    floors += fsdp_sharded(p)
                seen += 1
        full = fit_bytes(p, OPTS)
        if fit_or_misfit(p, OPTS) is None:
            assert full[1] > full[2]
        else:
            assert fit_or_misfit(p, OPTS) == full
        for share in (0.5, 0.9, 1.0, 1.1):  # the combined search's limit: misfit only when above it
            limit = share * full[1]
            got = fit_or_misfit(p, OPTS, limit)
            assert got == full if got is not None else full[1] > limit
    assert seen
    if "fsdp" in BASES[name].get("framework", ""):
        assert floors  # the FSDP floor was checked


@pytest.mark.parametrize("name", ["hf-1gpu", "hf-pp2-lora", "mcore-tp2-pp2-fp8"])
def test_use_cache_option_is_declared(name):
    plan = build_plan(PlanInputs(**BASES[name]))
    on = MemoryOptions(use_cache=True)
    for role in _roles(plan):
        with pipeline_role(role):
            if _acts(plan, on) != _acts(plan, OPTS):
                assert acts_key(plan, on) != acts_key(plan, OPTS)
            for f, v in (("allocator_reserve_fraction", 0.2), ("cuda_context_bytes", 0), ("workspace_bytes", 0),
                         ("kv_cache", "paged"), ("suggestions", False)):
                o = MemoryOptions(**{f: v})
                assert acts_key(plan, o) == acts_key(plan, OPTS)
                assert _acts(plan, o) == _acts(plan, OPTS)


def test_activations_write_only_their_fields_and_read_none():
    """``ACT_FIELDS`` is what ``activations`` writes, and it reads no field ``model_states`` wrote:
    the memo may lay the two terms' values side by side."""
    for kw in BASES.values():
        plan = build_plan(PlanInputs(**kw))
        for role in _roles(plan):
            with pipeline_role(role):
                x = Parts()
                model_states(plan, x)
                before = dataclasses.asdict(x)
                activations(plan, OPTS, x)
                after = dataclasses.asdict(x)
                changed = {k for k in before if before[k] != after[k]}
                assert changed <= set(ACT_FIELDS)
                fresh = Parts()
                activations(plan, OPTS, fresh)
                assert all(getattr(fresh, f) == after[f] for f in ACT_FIELDS)
                # model_states leaves every ACT_FIELDS entry at its default
                assert all(before[f] == getattr(Parts(), f) for f in ACT_FIELDS)


def test_memoized_walk_equals_a_fresh_walk():
    """A step walked with the terms of earlier plans (suggestion variants of each other) equals the
    same step walked with nothing remembered."""
    from trainledger.estimate.memory.suggest import _candidates

    rt = runtime_defaults()
    plans = []
    for kw in BASES.values():
        base = build_plan(PlanInputs(**kw))
        plans.append(base)
        for _, _, build in _candidates(base):
            try:
                plans.append(build())
            except (TrainledgerError, ValueError):
                pass
    warm = {}
    for p in plans:  # warm: each variant finds its siblings' terms
        for role in _roles(p):
            with pipeline_role(role):
                warm[(id(p), role)] = _step_points(p, OPTS, rt)
    for p in plans:
        for role in _roles(p):
            clear_memos()
            with pipeline_role(role):
                x, pts = _step_points(p, OPTS, rt)
            wx, wpts = warm[(id(p), role)]
            assert dataclasses.astuple(wx) == dataclasses.astuple(x)
            assert wpts == pts
