"""The suggestion search (estimate/memory/suggest.py) and the fast paths it runs on.

The search measures each variant plan with ``phases.fit_bytes`` (no terms, notes or timeline),
builds a variant copying only the parts it changes, and its combined search reuses the first round. The expected results come
from the slow definition, written out here: every variant validated as ``Plan(...)`` and measured
by the full ``estimate_memory``, the combined search re-measuring every round.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainledger.errors import TrainledgerError
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory import phases, suggest
from trainledger.estimate.options import MemoryOptions
from trainledger.estimate.run import common
from trainledger.estimate.stage import Stage
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.plan import Plan
from trainledger.units import gib
from reference_plans import plan_from_scratch

OPTS = MemoryOptions()
MEMORY = Path(suggest.__file__).parent

CASES = {
    "8B full, 1 GPU": dict(model="llama-3.1-8b", seq_len=4096),
    "8B micro-batch 8": dict(model="llama-3.1-8b", seq_len=4096, micro_batch=8),
    "8B LoRA eager": dict(model="llama-3.1-8b", seq_len=4096, method="lora", attention="eager"),
    "70B tp8 pp2 ZeRO-1 (combined)": dict(model="llama-3.1-70b", seq_len=8192, gpus=64, tp=8, pp=2,
                                          zero=1, grad_accum=8),
    "Mixtral ep8 ZeRO-3": dict(model="mixtral-8x7b", seq_len=4096, gpus=16, ep=8, zero=3),
    "8B fsdp2": dict(model="llama-3.1-8b", seq_len=4096, micro_batch=4, gpus=8, zero=3, framework="fsdp2"),
    "8B deepspeed ZeRO-2": dict(model="llama-3.1-8b", seq_len=4096, micro_batch=4, gpus=8, zero=2,
                                framework="deepspeed"),
    "1B on a V100 (bf16 refused)": dict(model="llama-3.2-1b", seq_len=8192, micro_batch=4, gpu="v100-sxm2-16gb"),
    "70B inference, hf engine": dict(model="llama-3.1-70b", method="inference", serving_engine="hf",
                                     micro_batch=8, seq_len=32768),
    "405B, 1 GPU": dict(model="llama-3.1-405b", seq_len=8192),
}


def _plan(kw):
    return build_plan(PlanInputs(**kw))


# ---------------------------------------------------------------- the slow definition
def _slow_row(change, est, current):
    return {"change": change, "peak_allocated_bytes": est.peak_allocated_bytes,
            "device_total_bytes": est.device_total_bytes,
            "peak_allocated_gib": round(gib(est.peak_allocated_bytes), 2),
            "saves_gib": round(gib(current.device_total_bytes - est.device_total_bytes), 2), "fits": True}


def _slow_suggestions(plan, current, monkeypatch):
    monkeypatch.setattr(suggest, "_with", plan_from_scratch)  # the candidates build through Plan(...)
    out, seen_micro, seen_gpus = [], False, False
    for knob, label, build in suggest._candidates(plan):
        if (knob == "micro_batch" and seen_micro) or (knob == "gpus" and seen_gpus):
            continue
        try:
            new = build()
        except (TrainledgerError, ValueError):
            continue
        est = estimate_memory(new, OPTS, suggest=False)
        if not est.fits:
            continue
        seen_micro = seen_micro or knob == "micro_batch"
        seen_gpus = seen_gpus or knob == "gpus"
        out.append(_slow_row(label, est, current))
        if len(out) >= suggest.MAX_SUGGESTIONS:
            break
    if not out:
        labels, best, p = [], current, plan
        for _ in range(8):
            step = None
            for knob, label, build in suggest._candidates(p):
                try:
                    new = build()
                except (TrainledgerError, ValueError):
                    continue
                est = estimate_memory(new, OPTS, suggest=False)
                if est.device_total_bytes <= 0.9 * best.device_total_bytes:
                    step = ((knob, label), new, est)
                    break
            if step is None:
                break
            labels = [kl for kl in labels if kl[0] != step[0][0]] + [step[0]]
            p, best = step[1], step[2]
            if best.fits:
                out.append(_slow_row(" + ".join(lb for _, lb in labels), best, current))
                break
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_suggestions_equal_the_slow_definition(name, monkeypatch):
    plan = _plan(CASES[name])
    current = estimate_memory(plan, OPTS, suggest=False)
    assert not current.fits, "each case is chosen not to fit"
    expected = _slow_suggestions(plan, current, monkeypatch)
    assert suggest.suggestions(plan, OPTS, current) == expected
    assert estimate_memory(plan, OPTS).suggestions == expected


def test_the_combined_search_measures_no_plan_twice(monkeypatch):
    """Its first round is the single-change round already measured (70B: no single change fits)."""
    plan = _plan(CASES["70B tp8 pp2 ZeRO-1 (combined)"])
    seen: list[Plan] = []
    real = phases.fit_or_misfit

    def measured(p, o, limit=None):  # the combined search passes its 10% limit, the first round none
        if limit is not None:
            seen.append(p)
        return real(p, o, limit)
    monkeypatch.setattr(suggest, "fit_or_misfit", measured)
    out = suggest.suggestions(plan, OPTS, estimate_memory(plan, OPTS, suggest=False))
    assert " + " in out[0]["change"]  # the combined search ran
    assert seen and len(seen) == len({(p.recipe, p.layout, p.cluster, p.runtime) for p in seen})


@pytest.mark.parametrize("name", list(CASES))
def test_fit_bytes_are_the_estimates_figures(name):
    plan = _plan(CASES[name])
    variants = [plan]
    for _, _, build in suggest._candidates(plan):
        try:
            variants.append(build())
        except (TrainledgerError, ValueError):
            pass
    for p in variants:
        est = estimate_memory(p, OPTS, suggest=False)
        assert phases.fit_bytes(p, OPTS) == (est.peak_allocated_bytes, est.device_total_bytes, est.budget_bytes)


# ---------------------------------------------------------------- cached derivations
def test_lora_params_cached_per_spec_values():
    """peft's count for Llama-3.1-8B, r=16 on all seven linear modules: 41,943,040 (r·(in+out) per
    module: q 4096+4096, k 4096+1024, v 4096+1024, o 4096+4096, gate/up 4096+14336, down
    14336+4096, times 32 layers); a copy with half the layers is a new key with half the count."""
    m = _plan(dict(model="llama-3.1-8b")).model
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert m.lora_params(targets, 16) == 41_943_040
    assert m.lora_params(list(targets), 16) == 41_943_040  # a list is accepted as before
    half = m.model_copy(update={"num_layers": 16})
    assert half.lora_params(targets, 16) == 41_943_040 // 2


def test_stage_moe_layers_from_the_mask():
    """DeepSeek-V3: 61 layers, the first 3 dense (first_k_dense_replace=3): 58 MoE layers; with
    pp=4 the busiest stage holds ceil(61/4) = 16 layers, ceil(58/4) = 15 of them MoE."""
    p = _plan(dict(model="deepseek-v3", gpus=256, ep=64, pp=4, seq_len=4096))
    st = Stage.of(p)
    assert (st.layers, st.moe_layers) == (16, 15)
    assert Stage.of(_plan(dict(model="llama-3.1-8b"))).moe_layers == 0


def test_run_figures_derived_once_for_frozen_inputs_only():
    p = _plan(dict(model="llama-3.2-1b", tokens=1e9))
    from trainledger.estimate.time import estimate_compute

    comp = estimate_compute(p)
    assert common.run_figures(p, comp) is common.run_figures(p, comp)
    mutable = SimpleNamespace(step_time_s=2.0)
    first = common.run_figures(p, mutable)
    mutable.step_time_s = 4.0  # a mutable input is read again
    assert common.run_figures(p, mutable).step_time_s == 4.0 != first.step_time_s


# ---------------------------------------------------------------- no import cycle
def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level?) of every import in ``path`` (TYPE_CHECKING included)."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.extend((f"{node.module}.{a.name}" if node.module == "trainledger.estimate.memory"
                        else node.module, id(node) in top) for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, id(node) in top) for a in node.names)
    return out


def test_suggest_does_not_import_the_memory_package():
    """memory/__init__ imports suggest at module level; suggest reads the step's peak from phases,
    never from the package (no function-level import standing in for a cycle)."""
    for name in ("suggest.py", "phases.py"):
        for mod, at_top in _imports(MEMORY / name):
            assert mod not in ("trainledger.estimate.memory", "trainledger.estimate.memory.estimate_memory",
                               "trainledger.estimate.memory.MemoryEstimate"), (name, mod)
            if name == "suggest.py":
                assert at_top, mod
    assert ("trainledger.estimate.memory.suggest", True) in _imports(MEMORY / "__init__.py")
    assert "import" not in inspect.getsource(suggest.suggestions)


@pytest.mark.parametrize("framework,zero", [("deepspeed", 2), ("fsdp2", 3), ("megatron-core", 1)])
def test_every_variant_keeps_the_plans_runtime(framework, zero):
    """A suggestion is scored under the stack the user runs: each variant keeps ``runtime`` and
    ``serving`` (they were dropped, so a DeepSpeed plan's variants were judged as plain hf)."""
    plan = build_plan(PlanInputs(model="llama-3.1-8b", method="full", gpu="a100-sxm-80gb", gpus=8,
                                 framework=framework, zero=zero, micro_batch=4, seq_len=4096))
    variants = [(knob, build()) for knob, _, build in suggest._candidates(plan)]
    assert variants
    for knob, v in variants:
        assert v.serving == plan.serving
        # the Liger suggestion changes that one runtime option and keeps the stack's others
        want = plan.runtime.updated({"liger_kernel": True}) if knob == "liger" else plan.runtime
        assert v.runtime == want
    assert ("liger" in [k for k, _ in variants]) == (framework != "megatron-core")


def test_deepspeed_zero2_recompute_alone_fits():
    """8B full fine-tune, DeepSpeed ZeRO-2 on 8x A100-80GB, micro-batch 4, 4096 tokens: full
    recomputation alone fits under DeepSpeed's memory (16-bit weights, partitioned master and
    states: 2Ψ + 2Ψ + 12Ψ/8 ≈ 41 GiB of model states for Ψ = 8.03B); under hf semantics (fp32
    weights on every GPU) it does not, which is what the dropped runtime used to suggest."""
    plan = build_plan(PlanInputs(model="llama-3.1-8b", method="full", gpu="a100-sxm-80gb", gpus=8,
                                 framework="deepspeed", zero=2, micro_batch=4, seq_len=4096))
    est = estimate_memory(plan, OPTS)
    assert not est.fits
    assert any(s["change"].startswith("full recomputation") and " + " not in s["change"]
               for s in est.suggestions), [s["change"] for s in est.suggestions]


def test_a_combined_change_names_each_setting_once_and_its_flags_rebuild_it():
    # 70B QLoRA on one 24 GB card: no single change fits; the combined one recomputes and shards over
    # more GPUs. Its rounds grow the GPU count 2 -> 4 -> 8; the row names the last count only, and
    # the flags it prints give the plan whose peak it reports
    kw = dict(model="llama-3.1-70b", method="qlora", gpu="rtx-4090", seq_len=2048)
    m = estimate_memory(build_plan(PlanInputs(**kw)), MemoryOptions())
    (row,) = m.suggestions
    parts = row["change"].split(" + ")
    assert sum("GPUs with" in p for p in parts) == 1 and len(parts) == len(set(parts))
    flags = " ".join(p[p.index("(") + 1:p.rindex(")")] for p in parts).split()
    upd = {}
    for i, k in enumerate(flags):
        if not k.startswith("--"):
            continue
        key = k.removeprefix("--").replace("-", "_")
        v = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else True  # a switch
        upd[key] = int(v) if isinstance(v, str) and v.isdigit() else v
    assert "recompute" in upd and "gpus" in upd and upd["zero"] == 3
    rebuilt = estimate_memory(build_plan(PlanInputs(**{**kw, **upd})), MemoryOptions(suggestions=False),
                              suggest=False)
    assert rebuilt.peak_allocated_bytes == pytest.approx(row["peak_allocated_bytes"])


def test_each_candidate_names_the_setting_its_builder_changes():
    """A combined suggestion drops an earlier change of the same setting: the setting each
    candidate declares is the one its plan differs in (not read from the label's words)."""
    plan = build_plan(PlanInputs(model="llama-3.1-8b", gpus=2, micro_batch=4, optimizer="adamw"))
    fields = {"optimizer": lambda p: p.recipe.optimizer, "micro_batch": lambda p: p.recipe.micro_batch,
              "recompute": lambda p: p.recipe.recompute, "precision": lambda p: p.recipe.precision,
              "zero": lambda p: p.layout.zero, "offload": lambda p: p.layout.offload,
              "method": lambda p: p.recipe.method, "gpus": lambda p: p.cluster.world_size,
              "liger": lambda p: p.runtime.liger_kernel}
    seen = set()
    for knob, label, build in suggest._candidates(plan):
        new = build()
        assert fields[knob](new) != fields[knob](plan), label
        changed = {k for k, f in fields.items() if f(new) != f(plan)}
        assert knob in changed and changed <= {knob, "zero"}, (label, changed)  # more GPUs come with ZeRO-3
        seen.add(knob)
    assert seen == set(fields)
