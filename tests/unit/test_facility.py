"""The report's facility sheet: datasheet server power, racks, UPS, cooling, floor space; in the HTML."""

from __future__ import annotations

import pytest

from trainledger.estimate.run.prices import load_prices
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.report import build_report, render
from trainledger.report.document import summary
from trainledger.report.facility import BTU_PER_H_PER_W, W_PER_TON, facility_sheet, ups_modules


def sheet(**kw):
    return facility_sheet(build_plan(parse_inputs({"model": "llama-3.1-8b", **kw}, "t")))


def test_unit_definitions():
    # 1 ton of refrigeration = 12,000 BTU/h = 3.517 kW; 1 kW = 3,412 BTU/h
    assert W_PER_TON == pytest.approx(3516.85, abs=0.01)
    assert 1000 * BTU_PER_H_PER_W == pytest.approx(3412.14, abs=0.01)


def test_dgx_h100_nodes_use_the_datasheet_power():
    f = sheet(gpus=128)["figures"]  # 16 DGX H100
    assert f["node_power_w"] == 10_200  # NVIDIA DGX H100 User Guide: ~10.2 kW max
    assert f["nodes_per_rack"] == 4 and f["limited_by"] == "power" and f["racks"] == 4
    assert f["it_peak_w"] == 16 * 10_200
    assert f["cooling_tons"] == pytest.approx(163.2 / 3.51685, rel=1e-4)
    assert f["ups_kva"] == pytest.approx(163.2 / 0.95)
    assert f["ups_modules_n_plus"] == 2 and f["ups_modules_2n"] == 2
    assert f["facility_peak_w"] == pytest.approx(163_200 * 1.58)
    assert f["floor_m2"] == pytest.approx(4 * 2.5)


def test_gpus_without_a_server_file_and_partial_nodes():
    f = sheet(gpu="l40s", gpus=64)["figures"]
    tdp = 350  # L40S board power
    assert f["node_power_w"] == pytest.approx(8 * tdp * (1 + 0.8214))
    assert f["limited_by"] == "rack space" and f["nodes_per_rack"] == 5  # 42U / 8U
    a100 = sheet(gpu="a100-sxm-80gb", gpus=4)["figures"]  # half a DGX A100 (6.5 kW for 8 GPUs)
    assert a100["node_power_w"] == pytest.approx(6500 / 2)


def test_ups_modules():
    assert ups_modules(1000, 500, 1) == 3 and ups_modules(1001, 500, 1) == 4 and ups_modules(10, 500, 0) == 1


def test_every_row_has_a_source_and_the_html_report_shows_it():
    rows = sheet(gpus=64)["rows"]
    assert all(r["source"] for r in rows)
    data = build_report(parse_inputs({"model": "llama-3.1-8b", "gpus": 64, "zero": 3, "tokens": 2e9}, "t"),
                        sweeps_on=False)
    html = render(data, "html")
    assert "Facility sheet" in html and "DGX SuperPOD Reference Architecture" in html and "tons of refrigeration" in html
    assert "Facility sheet" in render(data, "md")
    rows = dict(summary(data.estimate))
    assert rows["goodput"].startswith("99.") and "with interruptions" in rows


def test_a_prices_file_overrides_the_datacenter_defaults(tmp_path):
    p = tmp_path / "dc.yaml"
    p.write_text("kind: facility\nchecked: 2026-12-01\nvalues:\n  rack_power_kw: {value: 25, source: our hall}\n")
    plan = build_plan(parse_inputs({"model": "llama-3.1-8b", "gpus": 128}, "t"))
    f = facility_sheet(plan, None, load_prices(str(p)))
    assert f["figures"]["nodes_per_rack"] == 2 and "our hall" in f["rows"][1]["source"]
