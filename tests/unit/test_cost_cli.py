"""The price/facility flags and the `trainledger prices` command."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.cli.cost_opts import cost_options, cost_options_from_kwargs
from trainledger.errors import SpecError


@click.command()
@cost_options
def _probe(**kwargs):
    opts = cost_options_from_kwargs(kwargs)
    click.echo(opts.model_dump_json())
    assert not kwargs  # every cost flag was consumed


def test_flags_become_cost_options():
    res = CliRunner().invoke(_probe, ["--price-per-gpu-hour", "2.5", "--pue", "1.1", "--electricity-price", "0.12",
                                      "--server-price", "300000", "--lifetime-years", "4", "--utilization", "0.6",
                                      "--pricing", "spot", "--provider", "gcp", "--checkpoint-interval", "1800",
                                      "--data-format", "raw", "--dataloader-workers", "8"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["price_per_gpu_hour"] == 2.5 and got["pue"] == 1.1 and got["electricity_usd_per_kwh"] == 0.12
    assert got["server_price_usd"] == 300000 and got["lifetime_years"] == 4 and got["utilization"] == 0.6
    assert got["pricing"] == "spot" and got["provider"] == "gcp" and got["checkpoint_interval_s"] == 1800
    assert got["data_format"] == "raw" and got["dataloader_workers"] == 8


def test_out_of_range_flag_is_one_clear_error():
    with pytest.raises(SpecError, match="pue"):
        cost_options_from_kwargs({"pue": 0.5})


def test_prices_command_lists_the_catalog():
    res = CliRunner().invoke(main, ["prices", "h100", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    providers = {r["provider"] for r in data["cloud"]}
    assert {"aws", "gcp", "azure", "lambda", "coreweave"} <= providers
    assert all(r["gpu"] == "h100-sxm" for r in data["cloud"])
    assert data["servers"][0]["usd"] == 270000
    assert data["facility"]["pue"]["source"]


def test_plan_ranks_by_cost_with_the_users_price():
    res = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--tokens", "2e8", "--gpu", "h100-sxm",
                                    "--max-gpus", "16", "--rank-by", "cost", "--price-per-gpu-hour", "2.0",
                                    "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)["plans"]
    assert plans
    costs = [p["estimate"]["cost_usd"] for p in plans]
    for p in plans:
        assert p["estimate"]["usd_per_gpu_hour"] == 2.0
        assert p["estimate"]["cost_usd"] == pytest.approx(2.0 * p["estimate"]["gpu_hours"])
    assert costs == sorted(costs)


def test_estimate_command_takes_the_flags_and_prints_the_ledger():
    args = ["estimate", "--model", "llama-3.1-8b", "--gpus", "16", "--zero", "3", "--tokens", "2e8",
            "--price-per-gpu-hour", "2.0", "--pue", "1.2", "--server-price", "300000"]
    res = CliRunner().invoke(main, args + ["--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["cost"]["cloud_usd"] == pytest.approx(2.0 * d["time"]["gpu_hours"])
    assert d["energy"]["inputs"]["pue"] == 1.2
    assert d["cost"]["inputs"]["owned"]["server_price_usd"] == 300000
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    for word in ("energy", "cloud", "owned", "data", "checkpoint", "host RAM", "links"):
        assert f"\n{word}" in text.output, word
