"""The planner's memory knobs: a costlier knob (ZeRO-3, recomputation, offload) is tried where it
buys a larger micro-batch, so the plan it picks for a GPU count is as fast as any layout of that
count that fits.

The bug this guards: the search stopped at the first memory knob without recomputation or offload
that fitted, even when memory capped its micro-batch. On 16 A100-PCIe-80GB the default job's
ZeRO-3 fitted only at micro-batch 1 (16 micro-batches per step, each re-gathering the FSDP
parameters over the host bridge), ZeRO-3 with full recomputation at micro-batch 4 was never tried,
and the planner listed a TP2 plan 43% slower than it. ZeRO-2 (DeepSpeed ZeRO-2, FSDP SHARD_GRAD_OP)
was not among the knobs at all (with the GPU's 80 GiB taken as CUDA's total it was that count's
best plan, ZeRO-2 with recomputation at micro-batch 2; with CUDA's measured 79.14 GiB, ZeRO-3).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from trainledger.estimate.memory import fit_or_misfit
from trainledger.estimate.time import estimate_compute
from trainledger.errors import TrainledgerError
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.planner.candidates import memory_options
from trainledger.planner.search import Job, search
from trainledger.planner.space import _costlier, _knobs


def _fastest_by_hand(gpu: str, n: int, gb: int, framework: str, seq: int,
                     recompute: tuple[str, ...]) -> tuple[float, tuple]:
    """The fastest fitting data-/tensor-parallel layout of ``n`` GPUs over every knob and
    micro-batch, each estimated on its own (no planner code)."""
    best = (float("inf"), ())
    for tp, zero, rc, mb in itertools.product((1, 2), (1, 2, 3), recompute, (1, 2, 4, 8, 16)):
        if gb % (mb * n // tp):
            continue
        try:
            p = build_plan(PlanInputs(model="llama-3.1-8b", method="full", gpu=gpu, gpus=n, tp=tp,
                                      zero=zero, recompute=rc, micro_batch=mb, global_batch=gb,
                                      seq_len=seq, framework=framework))
        except TrainledgerError:
            continue
        fit = fit_or_misfit(p, memory_options())
        if fit is None or fit[1] > fit[2]:
            continue
        best = min(best, (estimate_compute(p).step_time_s, (tp, zero, rc, mb)))
    return best


@pytest.mark.parametrize("gpu,framework,seq,recompute", [
    ("a100-pcie-80gb", "hf", 4096, ("none", "full")),
    ("h100-sxm", "hf", 4096, ("none", "full")),
    # torchtitan's stack: its per-op SAC (selective) is a third recomputation knob
    ("h100-sxm", "fsdp2", 8192, ("none", "selective", "full")),
])
def test_planner_plan_is_as_fast_as_any_fitting_knob(gpu, framework, seq, recompute):
    res = search(Job(gpus=(gpu,), max_gpus=16, rank_by="time", deadline_days=None,
                     framework=framework, seq_len=seq))
    (cand,) = [c for c in res.plans + res.unpriced if c.plan.cluster.world_size == 16]
    hand, knobs = _fastest_by_hand(gpu, 16, cand.plan.recipe.global_batch, framework, seq, recompute)
    assert cand.compute.step_time_s <= hand * 1.0001, (cand.plan.layout, knobs)


def test_selective_recompute_is_searched_where_it_is_a_trade():
    # fsdp2's selective (per-op SAC) is between none and full in memory and time; Megatron's
    # selective frees only the softmax statistics under a fused attention kernel, and the Trainer
    # checkpoints whole layers: the search leaves it out there
    def recomputes(framework):
        space = SimpleNamespace(framework=framework, job=None)  # _knobs reads the stack searched
        return {rc for _, rc, _ in _knobs(space, 1, 1)}
    assert recomputes("fsdp2") == {"none", "selective", "full"}
    assert recomputes("megatron-core") == recomputes("hf") == {"none", "full"}


def test_pcie_80gb_picks_recomputation_for_a_larger_micro_batch():
    res = search(Job(gpus=("a100-pcie-80gb",), max_gpus=16, rank_by="time", deadline_days=None))
    (cand,) = [c for c in res.plans + res.unpriced if c.plan.cluster.world_size == 16]
    lay, rec = cand.plan.layout, cand.plan.recipe
    # full recomputation at a larger micro-batch, without TP's per-layer all-reduces over the host
    # bridge: fewer micro-batches per step, each re-gathering or reducing its gradients once
    assert (lay.tp, rec.recompute) == (1, "full") and rec.micro_batch > 1


def test_costlier_orders_the_knobs():
    assert _costlier((3, "none", "none"), (1, "none", "none"))
    assert _costlier((3, "full", "optimizer"), (3, "full", "none"))
    assert _costlier((1, "full", "none"), (1, "selective", "none"))
    assert not _costlier((1, "full", "none"), (3, "none", "none"))  # a trade, both are tried
    assert not _costlier((3, "none", "none"), (3, "none", "none"))


def test_a_deeper_pipeline_that_drops_recomputation_is_searched():
    # a 13B under DeepSpeed on 8 H100 (its pipeline engine runs ZeRO <= 1): tp1 pp2 and pp4 fit only
    # with full recomputation and are slower than pp1, while pp8 fits without it. A depth whose plans
    # recompute must not end the search over depths (space.cheapest).
    job = dict(model="llama-2-13b", framework="deepspeed", seq_len=4096, global_batch=256)
    res = search(Job(**job, gpus=("h100-sxm",), max_gpus=8, rank_by="time", deadline_days=None))
    (cand,) = [c for c in res.plans + res.unpriced if c.plan.cluster.world_size == 8]
    by_hand = build_plan(PlanInputs(**job, gpu="h100-sxm", gpus=8, pp=8, zero=1, recompute="none",
                                    micro_batch=1, method="full"))
    fit = fit_or_misfit(by_hand, memory_options())
    assert fit is not None and fit[1] <= fit[2]
    assert cand.compute.tokens_per_s_per_gpu >= estimate_compute(by_hand).tokens_per_s_per_gpu * 0.9999


def test_optimizer_offload_fits_a_70b_on_one_node():
    # ZeRO-3 with the optimizer (fp32 master, gradients' fp32 copy, Adam moments) offloaded to host
    # RAM (Ren et al. 2021, ZeRO-Offload): a 70B trains on 8 H100 where the states alone would need
    # 70.6e9 x 16 B / 8 = 141 GB per GPU. The planner's lower bound counts only what stays on the
    # GPUs (16-bit weights and gradients), so it searches that count.
    res = search(Job(model="llama-3.1-70b", framework="megatron-core", tokens=2e9, gpus=("h100-sxm",),
                     max_gpus=8, rank_by="time", deadline_days=None))
    (cand,) = [c for c in res.plans + res.unpriced if c.plan.cluster.world_size == 8]
    assert cand.plan.layout.offload == "optimizer"


def test_offloaded_states_must_fit_the_node_host_ram():
    from trainledger.estimate.run.host import offloaded_states_bytes
    from trainledger.planner.space import _host_fits

    def plan(ram_gib):
        return build_plan(PlanInputs(model="llama-3.1-70b", framework="megatron-core", gpu="h100-sxm", gpus=16,
                                     zero=3, offload="optimizer", recompute="full", host_ram_gib=ram_gib))

    p = plan(2048)
    n = p.model.params.total
    # each node holds its 8 GPUs' shares (1/16 each) of fp32 master + fp32 gradient + two fp32 moments
    assert offloaded_states_bytes(p) == pytest.approx(8 * n / 16 * 16, rel=1e-3)
    assert _host_fits(p)
    assert not _host_fits(plan(512))  # 565 GB of states > 512 GiB installed


def test_host_ram_flag_reaches_the_planner():
    # one 8-GPU node holds all of a 70B's offloaded states: 70.6e9 x 16 B = 1.13 TB, within the
    # 2 TiB default of a DGX-class node, not within 512 GiB
    from click.testing import CliRunner

    from trainledger.cli import main as cli

    job = dict(model="llama-3.1-70b", framework="megatron-core", tokens=2e9, gpus=("h100-sxm",), max_gpus=8,
               rank_by="time", deadline_days=None)
    assert any(c.plan.cluster.world_size == 8 for c in search(Job(**job)).plans)
    small = search(Job(**job, host_ram_gib=512))
    assert not any(c.plan.cluster.world_size == 8 for c in small.plans + small.unpriced)
    (why,) = [r.reason for r in small.rejected if r.gpus == 8]
    assert "of host RAM per node" in why and "has 512" in why
    out = CliRunner().invoke(cli, ["plan", "-m", "llama-3.1-70b", "--framework", "megatron-core", "--tokens", "2B",
                                   "--gpu", "h100-sxm", "--max-gpus", "8", "--host-ram-gib", "512", "--json"])
    assert out.exit_code == 1 and "of host RAM per node" in out.output
