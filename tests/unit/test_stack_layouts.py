"""Which layouts each software stack runs (spec.runtime's table): DeepSpeed's pipeline engine refuses
ZeRO-2/3 and interleaving; the planner searches only the parallelisms a stack's drivers run, and an
estimate of another layout says so."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import LayoutError
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.planner.search import Job, search
from trainledger.spec.runtime import stack_layout_note, stack_limits


def _plan(**kw):
    base = dict(model="llama-3.1-70b", gpus=64, tp=8, seq_len=4096)
    return build_plan(PlanInputs(**{**base, **kw}))


@pytest.mark.parametrize("fw", ["deepspeed", "megatron-deepspeed"])
@pytest.mark.parametrize("zero", [2, 3])
def test_deepspeed_pipeline_refuses_zero_2_and_3(fw, zero):
    with pytest.raises(LayoutError) as e:
        _plan(framework=fw, pp=2, zero=zero)
    assert e.value.field == "zero"
    assert "incompatible with pipeline parallelism" in str(e.value)
    assert _plan(framework=fw, pp=2, zero=1).layout.zero == 1  # ZeRO-1 pipelines
    assert _plan(framework=fw, pp=1, tp=1, zero=zero).layout.zero == zero  # no pipeline, no TP: any stage


@pytest.mark.parametrize("fw", ["deepspeed", "megatron-deepspeed"])
def test_deepspeed_pipeline_has_no_interleaving(fw):
    with pytest.raises(LayoutError) as e:
        _plan(framework=fw, pp=2, vp=2, zero=1)
    assert e.value.field == "vp"
    # the same layout runs interleaved under Megatron-Core
    assert _plan(framework="megatron-core", pp=2, vp=2, zero=1).layout.vp == 2


def test_stack_limits_table():
    assert stack_limits("hf") == ["PP", "CP", "EP", "ZeRO > 2 with TP"]
    assert stack_limits("pytorch-fsdp") == ["PP", "CP"]
    assert stack_limits("deepspeed") == ["interleaved PP", "ZeRO > 1 with PP", "ZeRO > 2 with TP"]
    assert stack_limits("fsdp2") == [] and stack_limits("megatron-core") == []


def test_estimate_notes_a_layout_the_stack_does_not_run():
    hf_pp = _plan(pp=2)  # hf: priced, with a note naming the stacks that pipeline
    from trainledger.estimate import estimate

    note = estimate(hf_pp).to_dict()["plan"]["stack_note"]
    assert note.startswith("hf ") and "pp=2: no pipeline schedule" in note and "megatron-core" in note
    assert estimate(_plan()).to_dict()["plan"]["stack_note"] is None
    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2"])
    assert r.exit_code == 0 and r.output.splitlines()[2] == f"stack     {note}"
    assert stack_layout_note("hf", _plan().layout) is None  # TP alone: transformers' tp_plan
    assert stack_layout_note("megatron-core", _plan(framework="megatron-core", pp=2).layout) is None
    assert "cp=2" in stack_layout_note("pytorch-fsdp", _plan(framework="pytorch-fsdp", tp=1, cp=2).layout)


def _built(monkeypatch, **job):
    """Every plan the planner builds for ``job`` (fitting or not), in order."""
    import trainledger.planner.space as space

    seen = []
    make = space._make_plan

    def record(*a, **kw):
        p = make(*a, **kw)
        if p is not None:
            seen.append(p)
        return p

    monkeypatch.setattr(space, "_make_plan", record)
    search(Job(**job))
    monkeypatch.setattr(space, "_make_plan", make)
    return seen


JOB_70B = dict(model="llama-3.1-70b", method="pretrain", tokens=1e11, seq_len=4096, global_batch=512,
               gpus=("h100-sxm",), max_gpus=64, rank_by="time")


def test_planner_searches_only_what_the_stack_runs(monkeypatch):
    mcore = _built(monkeypatch, framework="megatron-core", **JOB_70B)
    assert any(p.layout.pp > 1 for p in mcore) and any(p.layout.vp > 1 for p in mcore)
    hf = _built(monkeypatch, framework="hf", **JOB_70B)
    assert hf and all(p.layout.pp == 1 for p in hf)
    assert any(p.layout.tp > 1 for p in hf)  # transformers' tp_plan: TP is searched
    ds = _built(monkeypatch, framework="deepspeed", **JOB_70B)
    piped = [p for p in ds if p.layout.pp > 1]
    assert piped and all(p.layout.zero <= 1 and p.layout.vp == 1 for p in piped)
    assert any(p.layout.zero == 3 for p in ds if p.layout.pp == 1)


def test_planner_shards_no_experts_and_no_sequence_under_hf(monkeypatch):
    job = dict(model="mixtral-8x7b", method="pretrain", tokens=1e10, seq_len=32768, global_batch=64,
               gpus=("h100-sxm",), max_gpus=32, rank_by="time")
    fsdp2 = _built(monkeypatch, framework="fsdp2", **job)
    assert any(p.layout.ep > 1 for p in fsdp2) and any(p.layout.cp > 1 for p in fsdp2)
    hf = _built(monkeypatch, framework="hf", **job)
    assert hf and all(p.layout.ep == 1 and p.layout.cp == 1 and p.layout.pp == 1 for p in hf)
    fsdp1 = _built(monkeypatch, framework="pytorch-fsdp", **job)
    assert fsdp1 and all(p.layout.cp == 1 and p.layout.pp == 1 for p in fsdp1)
    assert any(p.layout.ep > 1 for p in fsdp1)  # Composer + MegaBlocks


def test_plan_cli_states_the_stack_limits():
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--max-gpus", "64"])
    assert r.exit_code == 0, r.output
    assert "layouts: hf runs no PP, CP, EP, ZeRO > 2 with TP (not searched" in r.output
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--max-gpus", "64",
                                  "--framework", "fsdp2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["stack_limits"] == {"fsdp2": []}


JOB_70B_30D = dict(model="llama-3.1-70b", method="full", tokens=2e12, deadline_days=30, gpus=("h100-sxm",),
                   max_gpus=64, global_batch=256)


def test_no_plan_under_a_limited_stack_names_the_stacks_that_spread_further():
    # hf cannot spread a 256-sample batch past ~256 GPUs (no PP): nothing meets 30 days; the same
    # job under each stack that pipelines is searched and its own deadline bound reported
    res = search(Job(framework="hf", **JOB_70B_30D))
    assert not res.plans and not res.unpriced
    alts = {a["framework"]: a for a in res.alternatives}
    assert set(alts) == {"megatron-core", "fsdp2"}
    for fw, alt in alts.items():
        direct = search(Job(framework=fw, **JOB_70B_30D), with_alternatives=False)
        assert alt["gpu_count"] == direct.gpu_count  # the same search, not a guess
        assert alt["gpu_count"][0]["deadline_beyond_budget_gpus"] > 64
    # a stack that runs every layout has no alternative to offer
    assert search(Job(framework="megatron-core", **JOB_70B_30D)).alternatives == []


def test_plan_cli_prints_the_alternatives():
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-70b", "--tokens", "2T", "--deadline-days", "30",
                                  "--gpu", "h100-sxm"])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    i = lines.index("  hf runs no PP, CP, EP, ZeRO > 2 with TP: under a stack that runs them")
    assert lines[i + 1].startswith("    megatron-core: the deadline needs ")
    assert "--framework megatron-core --max-gpus " in lines[i + 1]
    assert lines[i + 2].startswith("    fsdp2: ")


def test_planner_pipelines_deeper_while_it_pays():
    # fsdp2 fits the 70B at TP 4 without a pipeline (ZeRO-1, full recomputation), but with 256
    # samples over ~1k GPUs its step is the data-parallel and TP traffic of a whole replica; PP 4
    # splits that replica and is faster despite its bubble. The search used to stop at the first
    # depth without ZeRO-3 or offload and answered 3,152 GPUs for 30 days.
    job = Job(framework="fsdp2", **{**JOB_70B_30D, "max_gpus": 1280})
    res = search(job, with_alternatives=False)
    need = res.gpu_count[0]["deadline_bound_gpus"]
    assert need is not None and need <= 1280
    meets = [c for c in res.plans if c.plan.cluster.world_size == need]
    assert meets and meets[0].plan.layout.pp > 1


def test_deepspeed_autotp_runs_with_zero_up_to_2():
    # deepspeed.ai/tutorials/autotp-training: TP with ZeRO stage 0, 1 or 2
    with pytest.raises(LayoutError) as e:
        _plan(framework="deepspeed", zero=3)
    assert e.value.field == "zero" and "AutoTP" in str(e.value)
    assert _plan(framework="deepspeed", zero=2).layout.zero == 2
    assert _plan(framework="megatron-deepspeed", zero=3).layout.zero == 3  # Megatron's TP, not AutoTP
    hf = _plan(zero=3)  # hf: priced, with a note; the planner does not search it
    assert "tp=8 with --zero 3" in stack_layout_note("hf", hf.layout)
    assert stack_layout_note("hf", _plan(zero=2).layout) is None


def test_planner_clamps_zero_under_tp_for_autotp_stacks(monkeypatch):
    for fw in ("hf", "deepspeed"):
        built = _built(monkeypatch, framework=fw, **JOB_70B)
        assert all(p.layout.zero <= 2 for p in built if p.layout.tp > 1)
        assert any(p.layout.zero == 2 for p in built if p.layout.tp > 1)  # clamped, not dropped
        assert any(p.layout.zero == 3 for p in built if p.layout.tp == 1)


def test_report_and_web_blocks_show_the_limits_and_the_alternatives():
    from trainledger.report.document import plans_blocks

    res = search(Job(framework="hf", **JOB_70B_30D)).to_dict()
    blocks = plans_blocks(res)
    assert ("p", "Layouts not searched: hf runs no PP, CP, EP, ZeRO > 2 with TP.") in blocks
    (alt,) = [b for b in blocks if b[0] == "table" and b[1] == ["under another stack", "answer"]]
    assert [r[0] for r in alt[2]] == ["megatron-core", "fsdp2"]
    n = res["alternatives"][0]["gpu_count"][0]["deadline_beyond_budget_gpus"]
    assert alt[2][0][1] == f"the deadline needs {n:,} h100-sxm, past the budget (--framework megatron-core --max-gpus {n})"


@pytest.mark.parametrize("fw", ["deepspeed", "megatron-deepspeed", "megatron-core"])
def test_optimizer_offload_needs_a_zero_optimizer(fw):
    """DeepSpeed's offload_optimizer is a ZeRO stage 1-3 option and Megatron-Core offloads from its
    distributed optimizer: --offload with --zero 0 describes no run (DeepSpeed at stage 0 ignores it,
    and the plan's memory would not be what runs). FSDP's zero 0 is FULL_SHARD: it offloads; the
    Trainer pages the states with bitsandbytes' paged optimizers (QLoRA's setting) without ZeRO."""
    with pytest.raises(LayoutError) as e:
        _plan(framework=fw, gpus=1, tp=1, zero=0, offload="optimizer")
    assert e.value.field == "offload" and "--zero 1, 2 or 3" in str(e.value)
    assert _plan(framework=fw, gpus=1, tp=1, zero=1, offload="optimizer").layout.offload == "optimizer"
    for other in ("fsdp2", "pytorch-fsdp", "hf"):
        assert _plan(framework=other, gpus=1, tp=1, zero=0, offload="optimizer").layout.offload == "optimizer"


def test_planner_offloads_on_one_gpu_with_a_zero_stage():
    """On one GPU there is nothing to shard, but ZeRO-Offload still runs in a ZeRO optimizer: the
    planner's offload plans keep their stage (it used to label them ZeRO-0)."""
    res = search(Job(model="llama-3.1-8b", framework="deepspeed", gpus=("a100-pcie-40gb",), max_gpus=1,
                     rank_by="time", deadline_days=None, seq_len=2048))
    offloaded = [c for c in res.plans + res.unpriced if c.plan.layout.offload != "none"]
    assert offloaded and all(c.plan.layout.zero >= 1 for c in offloaded)
