"""estimate() carries the energy/cost/io/host/checkpoint sections, consistent with the time model."""

from __future__ import annotations

import pytest

from trainledger.estimate import EstimateOptions, estimate
from trainledger.estimate.options import CostOptions
from trainledger.load.plan import build_plan, parse_inputs


@pytest.fixture(scope="module")
def est():
    plan = build_plan(parse_inputs({"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9,
                                    "zero": 3, "global_batch": 64}))
    return estimate(plan, EstimateOptions(cost=CostOptions(provider="aws")))


def test_required_keys_next_to_their_inputs(est):
    d = est.to_dict()
    for section, key in (("energy", "kwh"), ("cost", "cloud_usd"), ("cost", "owned_usd"),
                         ("io", "read_bytes_per_s"), ("host", "ram_bytes"), ("checkpoint", "full_bytes"),
                         ("checkpoint", "write_s")):
        assert d[section][key] is not None and d[section][key] > 0, (section, key)
        assert "inputs" in d[section] and d[section]["terms"], section


def test_sections_agree_with_the_time_model(est):
    d = est.to_dict()
    gpu_h = est.time.gpu_hours
    assert d["energy"]["inputs"]["gpu_hours"] == pytest.approx(gpu_h)
    assert d["cost"]["cloud_usd"] == pytest.approx(gpu_h * 12.29)  # AWS p5 on-demand, per GPU
    assert d["io"]["read_bytes_per_s"] == pytest.approx(est.compute.tokens_per_s * 4)  # Llama 3: 4-byte ids
    assert d["checkpoint"]["full_bytes"] == pytest.approx(est.plan.model.params.total * 12)
