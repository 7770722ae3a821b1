"""Cloud and owned-hardware cost, break-even, and the price catalog."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from trainledger.errors import CatalogError, SpecError
from trainledger.estimate.run.cost import (
    break_even_month,
    cloud_cost_usd,
    cost_section,
    owned_fixed_usd_per_gpu_hour,
    owned_monthly_usd,
    owned_run_cost_usd,
    run_cost_usd,
)
from trainledger.estimate.options import CostOptions, EstimateOptions
from trainledger.estimate.run.prices import load_prices
from trainledger.load.plan import build_plan, parse_inputs


def _plan(**kw):
    base = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9, "zero": 3}
    base.update(kw)
    return build_plan(parse_inputs(base))


def _time(plan, gpu_hours):
    return SimpleNamespace(gpu_hours=gpu_hours, total_s=gpu_hours * 3600 / plan.cluster.world_size)


def test_cloud_cost_is_hours_times_price():
    # Llama 2 7B's 184,320 GPU-hours at AWS p5 on-demand ($98.32 / 8 GPUs = $12.29 per GPU-hour)
    assert cloud_cost_usd(184_320, 98.32 / 8) == pytest.approx(2_265_292.8)


def test_owned_fixed_cost_per_used_gpu_hour_by_hand():
    # DGX H100 at $270,000 / 8 GPUs = $33,750 per GPU, 5 years, 20%/year support, fully used
    per_h = owned_fixed_usd_per_gpu_hour(33_750, 5, 0.20, 1.0)
    assert per_h == pytest.approx(33_750 * (0.2 + 0.2) / 8760)  # $1.541 per GPU-hour
    # half the utilization doubles the cost each used hour carries
    assert owned_fixed_usd_per_gpu_hour(33_750, 5, 0.20, 0.5) == pytest.approx(2 * per_h)


def test_owned_run_cost_parts():
    parts = owned_run_cost_usd(8760, 33_750, 5, 0.2, 1.0, kwh=1000, usd_per_kwh=0.1)
    assert parts["depreciation_usd"] == pytest.approx(33_750 / 5)
    assert parts["maintenance_usd"] == pytest.approx(33_750 * 0.2)
    assert parts["electricity_usd"] == pytest.approx(100.0)
    assert parts["total_usd"] == pytest.approx(6750 + 6750 + 100)


def test_monthly_cost_by_hand():
    m = owned_monthly_usd(8, 33_750, 5, 0.2, 0.5, run_w_per_gpu=1275, idle_w_per_gpu=715, pue=1.5,
                          usd_per_kwh=0.10)
    assert m["depreciation_usd"] == pytest.approx(270_000 / 60)
    assert m["maintenance_usd"] == pytest.approx(270_000 * 0.2 / 12)
    assert m["electricity_usd"] == pytest.approx(730 * 8 * (0.5 * 1275 + 0.5 * 715) * 1.5 / 1000 * 0.10)


def test_break_even_by_hand_and_never():
    assert break_even_month(270_000, 50_000, 10_000) == pytest.approx(6.75)
    assert break_even_month(270_000, 10_000, 10_000) is None
    assert break_even_month(270_000, 5_000, 10_000) is None


def test_break_even_comes_earlier_with_higher_utilization():
    plan = _plan()
    months = []
    for u in (0.2, 0.4, 0.6, 0.8, 1.0):
        sec = cost_section(plan, CostOptions(provider="aws", utilization=u), time=_time(plan, 1000.0))
        months.append(sec["break_even_month"])
    assert all(m is not None for m in months)
    assert months == sorted(months, reverse=True) and months[0] > months[-1]
    # and a price below the running cost never breaks even
    cheap = cost_section(plan, CostOptions(price_per_gpu_hour=0.05), time=_time(plan, 1000.0))
    assert cheap["break_even_month"] is None and any("never" in n for n in cheap.notes)


def test_section_traces_price_times_hours():
    plan = _plan()
    sec = cost_section(plan, CostOptions(provider="lambda"), time=_time(plan, 1000.0))
    assert sec["usd_per_gpu_hour"] == 2.99
    assert sec["cloud_usd"] == pytest.approx(2990.0)
    assert "1,000.0 GPU-h" in sec["cloud_trace"] and "$2.99" in sec["cloud_trace"]
    d = sec.to_dict()
    assert d["inputs"]["gpu_hours"] == 1000.0 and "lambda" in d["inputs"]["price"]["source"]
    own = d["inputs"]["owned"]
    parts = sec["owned_breakdown"]
    assert parts["depreciation_usd"] == pytest.approx(
        1000 * own["capex_per_gpu_usd"] / own["lifetime_years"] / (8760 * own["utilization"]))
    assert sec["owned_usd"] == pytest.approx(parts["total_usd"])
    assert [q["usd_per_gpu_hour"] for q in sec["cloud_quotes"]] == sorted(q["usd_per_gpu_hour"] for q in sec["cloud_quotes"])


def test_user_prices_override_catalog():
    plan = _plan()
    sec = cost_section(plan, CostOptions(price_per_gpu_hour=2.0, server_price_usd=400_000,
                                         lifetime_years=4, maintenance_fraction=0.1, utilization=1.0,
                                         electricity_usd_per_kwh=0.2), time=_time(plan, 876.0))
    assert sec["cloud_usd"] == pytest.approx(1752.0)
    assert sec["owned_breakdown"]["depreciation_usd"] == pytest.approx(876 * 50_000 / 4 / 8760)
    assert sec.to_dict()["inputs"]["owned"]["sources"]["server_price_usd"] == "user (--server-price)"


def test_prices_file_adds_a_provider(tmp_path):
    f = tmp_path / "prices.yaml"
    f.write_text("kind: cloud\nprovider: mycloud\nsource: https://example.com/quote\nchecked: 2026-11-01\n"
                 "gpus:\n  h100-sxm:\n    spot: {usd_per_gpu_hour: 1.5}\n")
    plan = _plan()
    opts = CostOptions(prices_file=str(f), provider="mycloud", pricing="spot")
    assert cost_section(plan, opts, time=_time(plan, 100.0))["cloud_usd"] == pytest.approx(150.0)
    assert run_cost_usd(plan, _time(plan, 100.0), EstimateOptions(cost=opts)) == pytest.approx(150.0)


def test_bad_provider_tier_and_file_are_one_line_errors(tmp_path):
    plan = _plan()
    with pytest.raises(CatalogError, match="unknown provider 'awz'.*aws"):
        cost_section(plan, CostOptions(provider="awz"), time=_time(plan, 1.0))
    # a known provider without a price for this GPU or tier: no cloud figure, and a note saying why
    sec = cost_section(plan, CostOptions(provider="azure", pricing="spot"), time=_time(plan, 1.0))
    assert sec["cloud_usd"] is None and any("no spot price" in n for n in sec.notes)
    assert sec["owned_usd"] is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: cloud\nprovider: x\n")
    with pytest.raises(SpecError, match="bad.yaml"):
        load_prices(str(bad))


def test_run_cost_for_ranking():
    plan = _plan()
    assert run_cost_usd(plan, None) == math.inf
    assert run_cost_usd(plan, _time(plan, 10.0), CostOptions(price_per_gpu_hour=3.0)) == pytest.approx(30.0)
    # a step time alone is enough: steps x step time x GPUs
    steps = math.ceil(2e9 / plan.tokens_per_step)
    got = run_cost_usd(plan, SimpleNamespace(step_time_s=1.0), CostOptions(price_per_gpu_hour=1.0))
    assert got == pytest.approx(steps * 16 / 3600)


def test_catalog_prices_are_consistent_and_sourced():
    cat = load_prices()
    assert {"aws", "gcp", "azure", "lambda", "coreweave"} <= set(cat.clouds)
    for cloud in cat.clouds.values():
        assert cloud.source and cloud.checked
        for tiers in cloud.gpus.values():
            for p in tiers.values():
                if p.instance_usd_per_hour and p.gpus_per_instance:
                    assert p.usd_per_gpu_hour == pytest.approx(p.instance_usd_per_hour / p.gpus_per_instance, rel=0.01)
    assert cat.server_for("h100-sxm").usd > 0
    for key, val in cat.facility.values.items():
        assert val.source, key


def test_default_is_the_cheapest_catalog_price_of_the_tier():
    from trainledger.estimate.run.cost import cloud_quote, usd_per_gpu_hour

    cat = load_prices()
    on_demand = [q.usd_per_gpu_hour for q in cat.quotes_for("h100-sxm") if q.tier == "on-demand"]
    q = cloud_quote("h100-sxm")
    assert q.usd_per_gpu_hour == min(on_demand) and q.tier == "on-demand"
    assert usd_per_gpu_hour("h100-sxm", CostOptions(provider="aws")) == 12.29
    assert usd_per_gpu_hour("h100-sxm", CostOptions(price_per_gpu_hour=1.0)) == 1.0
    assert usd_per_gpu_hour("rtx-4090") is None  # no catalog price
    plan = _plan()
    sec = cost_section(plan, CostOptions(), time=_time(plan, 10.0))
    assert sec["provider"] == q.provider and sec["cloud_usd"] == pytest.approx(10 * q.usd_per_gpu_hour)
