"""How close the planner's pick for a GPU count is to the best layout of that count (planner quality).

For each job, GPU type and GPU count, ``search`` keeps the fastest plan it finds at that count; a
brute force estimates, independently of the planner's code, every layout of the grid
TP x PP x ZeRO x recomputation x micro-batch x optimizer offload (with ZeRO 1-3) that the job's stack runs and that fits in memory
(with the planner's headroom), at the job's exact global batch; the jobs that need them add
expert parallelism (MoE models: EP 1-8), context parallelism (long sequences: CP 1-8) and
interleaved virtual stages (pipelined stacks that interleave: v 1, 2, 4, 8 where it divides the stage). Both are compared by training
throughput (tokens per second per GPU: the planner may round the global batch by up to
``Job.batch_rounding``, which changes the step but not the work per token). A pick slower than the
brute force's best is a planner miss: the search pruned or never enumerated the better layout.
Where a job's grid has no EP, CP or virtual stages, the planner may still find faster plans with
them; those count as "planner ahead" (a negative gap is a miss, a positive one is not).

Prints one row per case (planner tokens/s/GPU and layout, brute force's, gap) and the miss count;
target: no miss over 1%.
Usage: python bench/plan_optimality.py [--json] [--gpus G1,G2,...] [--counts N1,N2,...]
(the defaults: H100 SXM and A100 SXM 80GB at 8, 16 and 64 GPUs; e.g. ``--gpus b200,mi300x,l40s
--counts 4,24,32,128`` checks other GPUs and whole-node counts that are not powers of two)
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

from trainledger.errors import TrainledgerError
from trainledger.estimate.memory import fit_or_misfit
from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.planner.candidates import memory_options
from trainledger.planner.search import Job, search
from trainledger.spec.runtime import (NO_PIPELINE, NO_ZERO2_SEARCH, SELECTIVE_SEARCH, stack_layout_problem,
                                      stack_zero_max)

#: (name, job fields): the stacks and regimes users plan most (default job, torchtitan's stack at
#: a long sequence, NVIDIA's stack on a 70B, DeepSpeed ZeRO)
JOBS: dict[str, dict[str, Any]] = {
    "8B hf s4096": dict(model="llama-3.1-8b", framework="hf", seq_len=4096, global_batch=256),
    "8B fsdp2 s8192": dict(model="llama-3.1-8b", framework="fsdp2", seq_len=8192, global_batch=128),
    "70B megatron-core s4096": dict(model="llama-3.1-70b", framework="megatron-core", seq_len=4096,
                                    global_batch=256),
    "13B deepspeed s4096": dict(model="llama-2-13b", framework="deepspeed", seq_len=4096, global_batch=256),
    # MoE (expert parallelism), a long sequence (context parallelism), an interleaved pipeline
    "Mixtral 8x7B fsdp2 s4096": dict(model="mixtral-8x7b", framework="fsdp2", seq_len=4096, global_batch=256),
    "Qwen3-30B-A3B megatron-core s4096": dict(model="qwen3-30b-a3b", framework="megatron-core", seq_len=4096,
                                              global_batch=512),
    "8B fsdp2 s65536": dict(model="llama-3.1-8b", framework="fsdp2", seq_len=65536, global_batch=16),
    # a 32B at 8k tokens, where recomputation and optimizer offload combine; DeepSpeed's pipeline
    "Qwen2.5-32B fsdp2 s8192": dict(model="qwen2.5-32b", framework="fsdp2", seq_len=8192, global_batch=64),
    "70B megatron-deepspeed s2048": dict(model="llama-2-70b", framework="megatron-deepspeed", seq_len=2048,
                                         global_batch=512),
}
#: the extra grid axes per job (the rest: EP 1, CP 1, v 1): expert parallelism for the MoE models,
#: context parallelism for the long sequence, virtual stages for the pipelined Megatron jobs
EXTRA_AXES: dict[str, dict[str, tuple[int, ...]]] = {
    "70B megatron-core s4096": {"vp": (1, 2, 4, 8)},
    "Mixtral 8x7B fsdp2 s4096": {"ep": (1, 2, 4, 8)},
    "Qwen3-30B-A3B megatron-core s4096": {"ep": (1, 2, 4, 8), "vp": (1, 2, 4)},
    "8B fsdp2 s65536": {"cp": (1, 2, 4, 8)},
}
GPUS = ("h100-sxm", "a100-sxm-80gb")
COUNTS = (8, 16, 64)
TP, PP, ZERO, MB = (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 3), (1, 2, 4, 8, 16)
OFFLOAD = ("none", "optimizer")  # optimizer offload with ZeRO 1-3 (ZeRO-Offload, Megatron-Core, FSDP CPU offload)
#: a miss is a planner pick slower than the brute force's best by more than this
TOLERANCE = 0.01


def brute_force(job: dict[str, Any], gpu: str, n: int, axes: dict[str, tuple[int, ...]] | None = None
                ) -> tuple[float, str] | None:
    """(tokens/s/GPU, layout) of the fastest fitting grid layout of ``n`` GPUs, or None.
    ``axes``: the job's extra grid axes (``EXTRA_AXES``)."""
    fw, gb = job["framework"], job["global_batch"]
    axes = axes or {}
    recomputes = ("none", "selective", "full") if fw in SELECTIVE_SEARCH else ("none", "full")
    best: tuple[float, str] | None = None
    for tp, pp, zero, rc, mb, off, ep, cp, vp in itertools.product(
            TP, PP, ZERO, recomputes, MB, OFFLOAD, axes.get("ep", (1,)), axes.get("cp", (1,)),
            axes.get("vp", (1,))):
        if n % (tp * pp * cp) or (off != "none" and zero < 1) or (vp > 1 and pp == 1):
            continue
        dp = n // (tp * pp * cp)
        # a micro-batch's samples are split over TP·CP ranks only by sequence: DP sets the batch
        if gb % (mb * dp) or (dp * cp) % ep:
            continue
        # interleaving wants micro-batches in multiples of the depth (the planner's rule, after
        # Megatron-LM's forward_backward_pipelining_with_interleaving)
        if vp > 1 and (gb // (mb * dp)) % pp:
            continue
        inputs = dict(job, gpu=gpu, gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, vp=vp, zero=zero, recompute=rc,
                      micro_batch=mb, offload=off, method="full")
        try:
            plan = build_plan(PlanInputs(**inputs))
        except TrainledgerError:
            continue  # the stack refuses the layout, or it does not divide
        if stack_layout_problem(fw, plan.layout) is not None:
            continue
        # the stack limits the planner searches within by design (spec.runtime): not misses
        if (pp > 1 and fw in NO_PIPELINE) or (zero == 2 and fw in NO_ZERO2_SEARCH) \
                or zero > stack_zero_max(fw, pp, tp):
            continue
        fit = fit_or_misfit(plan, memory_options())
        if fit is None or fit[1] > fit[2]:
            continue
        rate = estimate_compute(plan).tokens_per_s_per_gpu
        label = layout_label(plan)
        if best is None or rate > best[0]:
            best = (rate, label)
    return best


def layout_label(plan) -> str:
    """The grid coordinates of ``plan``: TP, PP (with virtual stages), CP and EP where used, ZeRO,
    micro-batch, recomputation, offload."""
    lay, r = plan.layout, plan.recipe
    extra = "".join(f" {k}{v}" for k, v in (("cp", lay.cp), ("ep", lay.ep)) if v > 1)
    return (f"tp{lay.tp} pp{lay.pp}{f' v{lay.vp}' if lay.vp > 1 else ''}{extra} z{lay.zero} "
            f"mb{r.micro_batch} {r.recompute}{' off-' + lay.offload if lay.offload != 'none' else ''}")


def planner_picks(job: dict[str, Any], gpu: str, counts: tuple[int, ...] = COUNTS) -> dict[int, tuple[float, str]]:
    """The planner's fastest plan per GPU count of ``counts``: (tokens/s/GPU, layout)."""
    res = search(Job(**job, method="full", gpus=(gpu,), max_gpus=max(counts), rank_by="time",
                     deadline_days=None, top=1000))
    out: dict[int, tuple[float, str]] = {}
    for c in res.plans + res.unpriced:
        n = c.plan.cluster.world_size
        label = layout_label(c.plan)
        rate = c.compute.tokens_per_s_per_gpu
        if n in counts and (n not in out or rate > out[n][0]):
            out[n] = (rate, label)
    return out


def main(argv: list[str]) -> int:
    gpus = tuple(argv[argv.index("--gpus") + 1].split(",")) if "--gpus" in argv else GPUS
    counts = (tuple(int(n) for n in argv[argv.index("--counts") + 1].split(",")) if "--counts" in argv
              else COUNTS)
    rows = []
    t0 = time.process_time()
    for name, job in JOBS.items():
        for gpu in gpus:
            picks = planner_picks(job, gpu, counts)
            for n in counts:
                bf = brute_force(job, gpu, n, EXTRA_AXES.get(name))
                pk = picks.get(n)
                gap = None if (bf is None or pk is None) else pk[0] / bf[0] - 1
                rows.append({"job": name, "gpu": gpu, "gpus": n, "planner": pk, "brute_force": bf, "gap": gap})
    misses = [r for r in rows if r["gap"] is not None and r["gap"] < -TOLERANCE]
    lost = [r for r in rows if r["brute_force"] is not None and r["planner"] is None]
    if "--json" in argv:
        print(json.dumps({"rows": rows, "misses": len(misses), "lost": len(lost)}, indent=2))
        return 0
    print(f"{'job':34s} {'gpu':14s} {'gpus':>4s}  {'planner tok/s/GPU':>17s} {'layout':30s} "
          f"{'brute force':>11s} {'layout':30s} {'gap':>7s}")
    for r in rows:
        pk, bf = r["planner"] or (0.0, "-"), r["brute_force"] or (0.0, "-")
        gap = f"{100 * r['gap']:+6.1f}%" if r["gap"] is not None else "      -"
        print(f"{r['job']:34s} {r['gpu']:14s} {r['gpus']:4d}  {pk[0]:17,.0f} {pk[1]:30s} "
              f"{bf[0]:11,.0f} {bf[1]:30s} {gap}")
    print(f"\n{len(rows)} cases; planner slower than the brute force by > {100 * TOLERANCE:.0f}%: "
          f"{len(misses)}; a count that fits by brute force but has no plan: {len(lost)} "
          f"(target: 0 and 0); {time.process_time() - t0:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
