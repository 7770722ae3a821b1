"""`verify serve` (vLLM benchmark against the serving model) and inference latency in `verify memory`."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import VerifyError
from trainledger.verify import serve

#: the shape of a `vllm bench serve --save-result` file (vllm/benchmarks/serve.py), values made up
RESULT = {"completed": 80, "request_throughput": 3.1, "output_throughput": 395.2, "mean_ttft_ms": 41.0,
          "median_ttft_ms": 39.5, "p99_ttft_ms": 88.0, "mean_tpot_ms": 9.8, "median_tpot_ms": 9.7,
          "p99_tpot_ms": 14.2}


def test_parse_result_converts_ms_to_seconds() -> None:
    m = serve.parse_result(RESULT)
    assert m["mean_ttft_s"] == pytest.approx(0.041) and m["p99_tpot_s"] == pytest.approx(0.0142)
    assert m["output_throughput"] == 395.2
    with pytest.raises(VerifyError):
        serve.parse_result({"completed": 1})


def test_compare_rows() -> None:
    rows = serve.compare(serve.parse_result(RESULT), {"ttft_s": 0.05, "tpot_s": 0.0098, "tpot_worst_s": 0.02,
                                                      "tpot_p99_s": 0.011, "output_tokens_per_s": 400.0})
    by = {r["name"]: r for r in rows}
    assert by["TPOT mean"]["relative_error"] == pytest.approx(0.0, abs=1e-9)
    assert by["TTFT mean"]["relative_error"] == pytest.approx(0.05 / 0.041 - 1)


@pytest.mark.skipif(serve.skip_reason() is None, reason="vLLM and a GPU are present: the real run is a GPU check")
def test_verify_serve_skips_cleanly_without_vllm_or_gpu() -> None:
    r = CliRunner().invoke(main, ["verify", "serve", "--seq-len", "128", "--generate-len", "8", "--json"])
    assert r.exit_code == 0, r.output
    assert "skipped" in json.loads(r.output)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_verify_memory_inference_runs_generate_with_the_hf_engine() -> None:
    r = CliRunner().invoke(main, ["verify", "memory", "--model", "tiny-llama-debug", "--method", "inference",
                                  "--seq-len", "32", "--generate-len", "2", "--no-ledger", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert abs(d["comparison"]["totals"][0]["relative_error"]) < 0.05
    assert d["measured"]["serving"] == {}  # latency is measured on a GPU only


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_inference_latency_on_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    r = CliRunner().invoke(main, ["verify", "memory", "--device", "cuda", "--model", "llama-3.2-1b", "--method",
                                  "inference", "--seq-len", "1024", "--generate-len", "32", "--micro-batch", "4",
                                  "--no-ledger", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    meas, pred = d["serving"]["measured"], d["serving"]["predicted"]
    assert meas["tpot_s"] > 0 and pred["tpot_s"] > 0


def test_tpot_p99_is_per_request_and_itl_p99_is_the_slow_step() -> None:
    """vLLM's TPOT is each request's mean over its output tokens; its ITL is per token."""
    rows = {r["name"]: r for r in serve.compare({"p99_tpot_s": 0.02, "p99_itl_s": 0.08},
                                                {"tpot_p99_s": 0.021, "tpot_worst_s": 0.08})}
    assert rows["TPOT p99"]["predicted"] == 0.021
    assert rows["ITL p99"]["predicted"] == 0.08 and rows["ITL p99"]["measured"] == 0.08
    assert "p99_itl_s" in serve.parse_result({"mean_ttft_ms": 1, "mean_tpot_ms": 1, "output_throughput": 1,
                                              "p99_itl_ms": 80.0})

