"""Interleaved 1F1B: the bubble is (p-1)/v of a micro-batch's stage time when each stage's layers
split into v equal chunks (Narayanan et al. 2021, arXiv:2104.04473 §2.2.2); with uneven chunks the
deepest one sets it. The planner interleaves with micro-batches in multiples of
the pipeline depth (Megatron-LM's interleaved schedule requires it)."""

from __future__ import annotations

import pytest

from trainledger.estimate import estimate_job
from trainledger.estimate.time.step import chunk_share
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.planner.search import Job, search


def _plan(vp, pp=8, **kw):
    return build_plan(parse_inputs({"model": "llama-2-70b", "method": "pretrain", "gpu": "h100-sxm", "gpus": 64 * pp // 8,
                                    "tp": 8, "pp": pp, "vp": vp, "global_batch": 64, **kw}))


@pytest.mark.parametrize("vp, share", [(1, 1.0), (2, 0.5), (5, 0.2), (8, 0.2), (10, 0.1)])
def test_deepest_chunk_share(vp, share):
    # Llama-2-70B: 80 layers, 10 per stage at pp=8; 8 chunks of 10 layers are 1 or 2 deep
    assert chunk_share(_plan(vp)) == pytest.approx(share)


def test_uneven_chunks_say_so():
    uneven = estimate_job(_plan(8)).compute.notes
    assert any("uneven virtual stages" in n and "2 layers deep" in n for n in uneven)
    assert not any("uneven virtual stages" in n for n in estimate_job(_plan(5)).compute.notes)


def test_planner_interleaves_with_whole_rounds_of_micro_batches():
    job = Job(model="llama-2-70b", method="pretrain", tokens=2e12, deadline_days=26, gpus=("h100-sxm",),
              max_gpus=2048, rank_by="gpus", frameworks=("megatron-core",), global_batch=512, top=40)
    res = search(job)
    inter = [c.plan for c in res.plans if c.plan.layout.vp > 1]
    assert inter
    for p in inter:
        lay = p.layout
        assert p.recipe.grad_accum % lay.pp == 0
        # Megatron's virtual stages hold equal layer counts (what export gives as
        # --num-layers-per-virtual-pipeline-stage)
        assert p.model.num_layers % (lay.pp * lay.vp) == 0


def test_megatron_export_states_equal_virtual_stages_or_refuses():
    from trainledger.errors import SpecError
    from trainledger.runconfig.export_tools import megatron_args

    args = megatron_args(_plan(5, framework="megatron-core"))
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "2"   # 80 / (8·5)
    with pytest.raises(SpecError, match="equal virtual stages"):
        megatron_args(_plan(8, framework="megatron-core"))   # 80 / (8·8) is not whole
