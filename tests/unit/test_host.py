"""Host RAM and host memory bandwidth per node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainledger.estimate.run.checkpoint import checkpoint_section
from trainledger.estimate.run.host import (
    host_section,
    offload_traffic_bytes_per_param,
    offloaded_bytes_per_param,
    pinned_batch_bytes,
)
from trainledger.estimate.options import CostOptions
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.units import GIB


def _plan(**kw):
    base = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9, "zero": 3}
    base.update(kw)
    return build_plan(parse_inputs(base))


def test_zero_offload_keeps_16_bytes_per_param_on_cpu():
    # ZeRO-Offload with Adam: fp32 master (4) + fp32 gradient (4) + momentum and variance (8)
    assert offloaded_bytes_per_param(8, 2, "optimizer") == 16
    assert offloaded_bytes_per_param(8, 2, "params") == 18
    assert offloaded_bytes_per_param(8, 2, "none") == 0


def test_offload_traffic_per_param():
    # reads 4+4+8, writes 4+8+2, PCIe copies 4 in + 2 out
    assert offload_traffic_bytes_per_param(8, 2) == 16 + 14 + 6


def test_pinned_batches():
    # 4 workers x prefetch 2 x 4096 tokens x 3 int64 tensors
    assert pinned_batch_bytes(4, 1, 4096) == 4 * 2 * 4096 * 3 * 8


def test_no_offload_ram_by_hand():
    plan = _plan()
    ck = checkpoint_section(plan, CostOptions())
    sec = host_section(plan, CostOptions(dataloader_workers=2), checkpoint=ck)
    assert sec["offloaded_states_bytes"] == 0
    assert sec["dataloader_workers_bytes"] == pytest.approx(8 * 2 * 2 * GIB)
    assert sec["checkpoint_staging_bytes"] == pytest.approx(ck["full_bytes"] / 2)
    parts = ("offloaded_states_bytes", "pinned_batch_bytes", "dataloader_workers_bytes", "checkpoint_staging_bytes")
    assert sec["ram_bytes"] == pytest.approx(sum(sec[k] for k in parts))
    assert sec["ram_fits"]


def test_offload_ram_and_bandwidth_by_hand():
    plan = _plan(model="llama-3.1-70b", offload="optimizer")
    n = plan.model.params.total
    sec = host_section(plan, CostOptions(), compute=SimpleNamespace(step_time_s=10.0))
    per_gpu = n / 16  # ZeRO-3 over 16 GPUs
    assert sec["offloaded_states_bytes"] == pytest.approx(8 * per_gpu * 16)
    traffic = 8 * per_gpu * offload_traffic_bytes_per_param(8, 4)  # bf16-mixed keeps fp32 weights
    assert sec["offload_traffic_bytes_per_step"] == pytest.approx(traffic)
    assert sec["offload_bandwidth_bytes_per_s"] == pytest.approx(traffic / 10.0)


def test_flags_when_the_node_is_too_small():
    plan = _plan(model="llama-3.1-70b", offload="optimizer")
    small = plan.model_copy(update={"cluster": plan.cluster.model_copy(
        update={"host_ram_bytes": 64 * GIB, "host_mem_bw_gb_per_s": 10.0})})
    sec = host_section(small, CostOptions(), compute=SimpleNamespace(step_time_s=1.0))
    assert not sec["ram_fits"] and not sec["bandwidth_ok"] and not sec["load_fits"]
    assert len(sec.notes) == 3 and any("at model load" in n for n in sec.notes)
