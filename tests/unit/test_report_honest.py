"""Issue 18: the report carries the whole ledger and checks that a measurement belongs to its plan."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_report_carries_owned_vs_cloud_break_even_pue_co2_and_host_ram():
    r = run("report", "-m", "qwen2.5-0.5b", "--tokens", "1B", "--server-price", "300000", "--compare-gpus", "h100-sxm")
    assert r.exit_code == 0, r.output
    summary = r.stdout.split("Memory per GPU")[0]
    for label in ("owned cost", "owned vs cloud", "break-even", "PUE 1.58", "CO2", "host RAM", "precision"):
        assert label in summary, label


def test_host_ram_is_not_a_2_tib_default_for_a_pcie_card():
    r = run("report", "-m", "qwen2.5-0.5b", "--gpu", "rtx-4090", "--compare-gpus", "rtx-4090")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("host RAM"))
    assert "2,048" not in line and "2.00 TiB" not in line and "--host-ram-gib" in line
    r = run("report", "-m", "qwen2.5-0.5b", "--gpu", "rtx-4090", "--host-ram-gib", "64", "--compare-gpus", "rtx-4090")
    assert "of 64.00 GiB installed" in r.stdout


def test_cost_of_a_plan_that_does_not_fit_is_flagged():
    r = run("report", "-m", "llama-3.1-70b", "--tokens", "1B", "--compare-gpus", "h100-sxm")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("cloud cost"))
    assert "DOES NOT FIT" in line


@pytest.fixture(scope="module")
def tiny_verify(tmp_path_factory):
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("v") / "verify.json"
    r = run("verify", "memory", "--device", "fake", "-m", "tiny-llama-debug", "--seq-len", "64", "--json", "--no-ledger")
    assert r.exit_code in (0, 1), r.output
    path.write_text(r.stdout)
    return path


def test_verify_json_of_another_plan_is_refused(tiny_verify):
    r = run("report", "-m", "llama-3.1-8b", "--gpus", "8", "--verify-json", str(tiny_verify), "--compare-gpus", "h100-sxm")
    assert r.exit_code != 0
    assert "the measurement is of another plan" in r.output and "tiny-llama-debug" in r.output


def test_verify_json_of_the_same_plan_is_shown(tiny_verify):
    r = run("report", "-m", "tiny-llama-debug", "--seq-len", "64", "--verify-json", str(tiny_verify),
            "--compare-gpus", "h100-sxm")
    assert r.exit_code == 0, r.output
    assert "Measured vs predicted" in r.stdout and "peak allocated off by" in r.stdout


def test_verify_json_without_plan_is_matched_by_its_predicted_peak(tiny_verify, tmp_path):
    d = json.loads(tiny_verify.read_text())
    d.pop("plan", None)
    p = tmp_path / "old.json"
    p.write_text(json.dumps(d))
    r = run("report", "-m", "llama-3.1-8b", "--verify-json", str(p), "--compare-gpus", "h100-sxm")
    assert r.exit_code != 0 and "predicted peak" in r.output


def test_accept_json_shows_not_measured_instead_of_zero_bytes(tmp_path):
    from trainledger.estimate import estimate
    from trainledger.load.plan import PlanInputs, build_plan

    inputs = PlanInputs(model="tiny-llama-debug", seq_len=64)
    accept = {"plan": inputs.model_dump(mode="json"), "device": "cpu", "nproc": 2,
              "measured": {"peak_allocated_bytes": None, "device": "cpu",
                           "note": "CPU has no allocator statistics"},
              "predicted": estimate(build_plan(inputs)).memory.to_dict(), "items": [], "ok": True}
    p = tmp_path / "accept.json"
    p.write_text(json.dumps(accept))
    r = run("report", "-m", "tiny-llama-debug", "--seq-len", "64", "--verify-json", str(p), "--compare-gpus", "h100-sxm")
    assert r.exit_code == 0, r.output
    sec = r.stdout.split("Measured vs predicted")[1].split("Procurement")[0]
    assert "0 B" not in sec and "not measured" in sec and "within the" not in sec


def test_a_term_keeps_its_colour_in_every_chart():
    from trainledger.report import charts

    one = charts.stacked_bars("a", [{"label": "x", "values": {"weights": 1.0, "activations": 2.0}}],
                              ["weights", "activations"])
    two = charts.stacked_bars("b", [{"label": "y", "values": {"master_weights": 1.0, "activations": 2.0}}],
                              ["master_weights", "activations"])
    colour = charts.term_color("activations")
    assert f'fill="{colour}"' in one and f'fill="{colour}"' in two
    assert charts.term_color("weights") != colour


def test_off_scale_values_are_labelled_not_drawn_flat():
    from trainledger.report import charts

    svg = charts.line_chart("t", [1, 2, 4], [{"name": "s", "ys": [1.0, 2.0, 500.0]}], "GiB", "x", y_clip=10.0)
    assert "↑ 500" in svg
