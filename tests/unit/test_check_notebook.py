"""`trainledger check` guards a launch script; notebook views of results."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import MissingDependency
from trainledger.estimate import estimate
from trainledger.load.plan import PlanInputs, build_plan

DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "runconfig"


def test_check_exits_1_with_the_reason_when_the_plan_does_not_fit():
    r = CliRunner().invoke(main, ["check", "--model", "llama-3.1-8b", "--gpus", "1", "--method", "full"])
    assert r.exit_code == 1
    assert "does not fit: needs" in r.output and "h100-sxm allows" in r.output and "try:" in r.output


def test_check_exits_0_when_it_fits_and_json():
    r = CliRunner().invoke(main, ["check", "--model", "llama-3.1-8b", "--gpus", "1", "--method", "qlora",
                                  "--seq-len", "2048", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fits"] is True and d["needs_bytes"] < d["budget_bytes"]


def test_check_reads_an_axolotl_config():
    """The issue's mis-read: the axolotl QLoRA file fits one GPU (it was sized as a full fine-tune)."""
    r = CliRunner().invoke(main, ["check", "--from", str(DATA / "axolotl_llama3_qlora.yml"),
                                  "--model", "llama-3.1-8b", "-q"])
    assert r.exit_code == 0, r.output


def test_check_usage_error_is_exit_2():
    r = CliRunner().invoke(main, ["check", "--model", "no-such-model"])
    assert r.exit_code == 2


def test_estimate_repr_html_and_pandas(monkeypatch):
    est = estimate(build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=3)))
    text = repr(est)
    assert text.startswith("<Estimate llama-3.1-8b") and "GiB/GPU" in text and len(text) < 250
    html = est._repr_html_()
    assert "<table>" in html and "peak allocated" in html and "weights" in html
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(MissingDependency, match="pip install pandas"):
        est.to_pandas()


def test_estimate_to_pandas_when_installed():
    pytest.importorskip("pandas")
    est = estimate(build_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=3)))
    df = est.to_pandas()
    assert df["bytes"].sum() > 0 and "summary" in df.attrs


def test_search_result_views():
    from trainledger.planner.search import Job, search

    res = search(Job(model="llama-3.2-1b", gpus=("h100-sxm",), max_gpus=2, tokens=1e8, global_batch=8))
    assert repr(res).startswith("<SearchResult") and "plans" in repr(res)
    assert "<table>" in res._repr_html_()
