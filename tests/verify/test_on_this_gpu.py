"""verify's GPU commands plan for the GPU they run on unless the user named one (issue 15 review:
an H200 run of `verify memory --device cuda` compared its step time with an H100 plan)."""

from __future__ import annotations

import pytest

from trainledger.cli import verify_cmds
from trainledger.load.catalog import entries
from trainledger.load.plan import PlanInputs
from trainledger.verify import probe


def test_the_h200s_nvml_name_is_the_catalog_h200():
    # the name torch reported on the H200 of bench/results/time_cuda_h200.json
    assert probe.catalog_gpu_for("NVIDIA H200", list(entries("gpus"))) == "h200"


@pytest.fixture
def on_h200(monkeypatch):
    monkeypatch.setattr(probe, "catalog_gpu_here", lambda: "h200")


def test_cuda_without_a_named_gpu_plans_this_gpu(on_h200):
    inputs = PlanInputs(model="llama-3.2-1b", seq_len=2048)
    out = verify_cmds._on_this_gpu(inputs, "cuda")
    assert out.gpu == "h200"
    assert (out.model, out.seq_len) == ("llama-3.2-1b", 2048)


def test_a_named_gpu_or_another_device_is_kept(on_h200):
    named = PlanInputs(model="llama-3.2-1b", gpu="a100-sxm-80gb")
    assert verify_cmds._on_this_gpu(named, "cuda").gpu == "a100-sxm-80gb"
    unnamed = PlanInputs(model="llama-3.2-1b")
    assert verify_cmds._on_this_gpu(unnamed, "cpu").gpu == unnamed.gpu == "h100-sxm"


def test_a_gpu_outside_the_catalog_keeps_the_default_and_says_so(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(probe, "catalog_gpu_here", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Future GPU")
    out = verify_cmds._on_this_gpu(PlanInputs(model="llama-3.2-1b"), "cuda")
    assert out.gpu == "h100-sxm"
    assert "Some Future GPU is not in the GPU catalog" in capsys.readouterr().err
