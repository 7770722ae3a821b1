"""Interconnect sanity: bytes per step of the layout's collectives, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainledger.estimate.run.fabric import (
    interconnect_section,
    pp_bytes,
    ring_all_reduce_bytes,
    tp_bytes,
    zero3_bytes,
)
from trainledger.load.plan import build_plan, parse_inputs


def _plan(**kw):
    base = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9}
    base.update(kw)
    return build_plan(parse_inputs(base))


def test_collective_volumes():
    assert ring_all_reduce_bytes(1000, 4) == pytest.approx(1500)
    assert ring_all_reduce_bytes(1000, 1) == 0
    # ZeRO-3 with one micro-batch moves 1.5x DDP's volume (Rajbhandari et al. 2020, §7.2.2)
    assert zero3_bytes(1000, 4, 1) == pytest.approx(1.5 * ring_all_reduce_bytes(1000, 4))
    assert tp_bytes(2, 1, 1, 10, 10, 2, 2) == pytest.approx(4 * 2 * 200)
    assert pp_bytes(4, 1, 10, 10, 2) == 1600


def test_ddp_across_two_nodes_by_hand():
    plan = _plan()
    n = plan.model.params.total
    sec = interconnect_section(plan, compute=SimpleNamespace(step_time_s=1.0))
    dp = sec["groups"]["dp"]
    assert dp["bytes_per_step"] == pytest.approx(2 * 15 / 16 * n * 4)  # fp32 grads in bf16-mixed
    assert dp["link"] == plan.cluster.inter.name
    # 8 ranks per node share the node's 8 NICs: one ring per NIC crosses each node boundary
    per_gpu = plan.cluster.inter.bytes_per_s * plan.cluster.nics_per_node / 8
    assert dp["available_bytes_per_s"] == pytest.approx(min(plan.cluster.intra.bytes_per_s, 8 * per_gpu))
    assert dp["required_bytes_per_s"] == pytest.approx(dp["bytes_per_step"] / 1.0)
    assert "tp" not in sec["groups"]


def test_too_slow_network_is_flagged():
    plan = _plan(network="eth-10", gpus_per_node=1)
    sec = interconnect_section(plan, compute=SimpleNamespace(step_time_s=1.0))
    assert not sec["ok"] and "dp" in sec.notes[0]


def test_tp_stays_on_nvlink():
    plan = _plan(tp=8)
    sec = interconnect_section(plan, compute=SimpleNamespace(step_time_s=1.0))
    assert sec["groups"]["tp"]["link"] == plan.cluster.intra.name
