"""Energy: the power model and kWh, checked by hand against published figures."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from trainledger.estimate.run.energy import (
    carbon_kg,
    energy_kwh,
    energy_section,
    gpu_average_power_w,
    node_overhead_w,
)
from trainledger.estimate.options import CostOptions
from trainledger.load.plan import build_plan, parse_inputs

# Touvron et al. 2023, "Llama 2", arXiv:2307.09288, Table 2: GPU-hours on A100-80GB at a 400 W
# power figure per GPU, and the emissions reported for each model (tCO2eq).
LLAMA2 = {"7B": (184_320, 31.22), "13B": (368_640, 62.44), "70B": (1_720_320, 291.42)}


def _plan(**kw):
    base = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9, "zero": 3}
    base.update(kw)
    return build_plan(parse_inputs(base))


def test_llama2_7b_gpu_energy_by_hand():
    # 184,320 GPU-h x 400 W = 73,728 kWh = 73.7 MWh of GPU energy
    assert energy_kwh(184_320, 400.0, pue=1.0) == pytest.approx(73_728.0)


def test_llama2_emissions_are_proportional_to_our_kwh():
    # Table 2's tCO2eq divided by our kWh must give one grid intensity for all three sizes
    intensities = [t * 1000 / energy_kwh(h, 400.0, pue=1.0) for h, t in LLAMA2.values()]
    assert max(intensities) / min(intensities) == pytest.approx(1.0, abs=2e-4)
    assert intensities[0] == pytest.approx(0.4234, abs=1e-3)  # kg CO2 per kWh
    assert carbon_kg(energy_kwh(184_320, 400.0), intensities[1]) / 1000 == pytest.approx(31.22, rel=1e-3)


def test_power_interpolates_between_idle_and_tdp():
    tdp, idle = 700.0, 140.0
    assert gpu_average_power_w(tdp, idle, 1.0) == 700.0
    assert gpu_average_power_w(tdp, idle, 0.0) == 140.0
    assert gpu_average_power_w(tdp, idle, 0.5) == pytest.approx(420.0)
    assert gpu_average_power_w(tdp, idle, 1.0, busy_power_fraction=0.9) == pytest.approx(630.0)


def test_dgx_h100_node_overhead():
    # DGX H100: 10.2 kW system maximum, 8 x 700 W GPUs -> 4.6 kW for CPUs, NICs, fans, storage
    assert node_overhead_w(8, 700.0, system_max_w=10_200, gpus_per_server=8) == pytest.approx(4600.0)
    assert node_overhead_w(4, 700.0, system_max_w=10_200, gpus_per_server=8) == pytest.approx(2300.0)
    assert node_overhead_w(8, 700.0, overhead_fraction=0.5) == pytest.approx(2800.0)


def test_overhead_and_pue_multiply():
    # 80 GPU-hours at 700 W on 8-GPU nodes: 10 node-hours x 4.6 kW overhead; x PUE 1.5
    kwh = energy_kwh(80, 700.0, gpus_per_node=8, node_overhead_w=4600.0, pue=1.5)
    assert kwh == pytest.approx((80 * 700 + 10 * 4600) * 1.5 / 1000)


def test_section_with_a_step_time_by_hand():
    plan = _plan()
    compute = SimpleNamespace(step_time_s=2.0)
    sec = energy_section(plan, CostOptions(pue=1.2, electricity_usd_per_kwh=0.1), compute=compute)
    steps = math.ceil(2e9 / plan.tokens_per_step)
    gpu_h = steps * 2.0 * 16 / 3600
    assert sec["kwh"] == pytest.approx((gpu_h * 700 + gpu_h / 8 * 4600) * 1.2 / 1000)
    assert sec["gpu_kwh"] + sec["node_overhead_kwh"] + sec["cooling_and_losses_kwh"] == pytest.approx(sec["kwh"])
    assert sec["kwh_per_token"] == pytest.approx(sec["kwh"] / 2e9)
    d = sec.to_dict()
    assert d["inputs"]["gpu_hours"] == pytest.approx(gpu_h)
    assert d["inputs"]["pue"] == 1.2
    assert any(t["name"] == "node_overhead_w" and "10200" in t["source"] for t in d["terms"])


def test_user_power_overrides_reproduce_llama2_style_accounting():
    plan = _plan()
    time = SimpleNamespace(gpu_hours=184_320.0, total_s=184_320.0 * 3600 / 16)
    sec = energy_section(plan, CostOptions(gpu_power_w=400, node_overhead_w=0, pue=1.0), time=time)
    assert sec["kwh"] == pytest.approx(73_728.0)


def test_lower_busy_fraction_lowers_energy():
    plan = _plan()
    full = energy_section(plan, CostOptions(), compute=SimpleNamespace(step_time_s=2.0))
    half = energy_section(plan, CostOptions(), compute=SimpleNamespace(step_time_s=2.0, busy_fraction=0.5))
    gpu = plan.cluster.gpu
    idle = gpu.idle_w if gpu.idle_w is not None else 0.2 * gpu.tdp_w
    assert half["gpu_kwh"] == pytest.approx(full["gpu_kwh"] * (idle + 0.5 * (gpu.tdp_w - idle)) / gpu.tdp_w)


def test_without_a_run_length_gives_power_only():
    sec = energy_section(_plan(tokens=None), CostOptions())
    assert sec["kwh"] is None
    # 2 nodes x (8 x 700 W + 4600 W) x PUE 1.58 (Uptime Institute 2023 default)
    assert sec["facility_power_kw"] == pytest.approx(2 * (8 * 700 + 4600) * 1.58 / 1000)
    assert sec.notes


def test_busy_fraction_from_the_time_models_breakdown():
    plan = _plan()
    bd = {"compute": 6.0, "overlap_contention": 1.0, "comm_tp": 1.0, "bubble": 1.5, "data": 0.5}
    sec = energy_section(plan, CostOptions(), compute=SimpleNamespace(step_time_s=10.0, breakdown=bd))
    assert sec.to_dict()["inputs"]["busy_fraction"] == pytest.approx(0.7)  # 1 - (1 + 1.5 + 0.5) / 10
