"""Data loading: bandwidth, IOPS, workers and tokenizer cores, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainledger.estimate.run.io import (
    blocks_per_sample,
    io_section,
    read_bytes_per_s,
    required_iops,
    tokenized_bytes_per_token,
    tokenizer_cores,
    worker_iops,
)
from trainledger.estimate.options import CostOptions
from trainledger.load.plan import build_plan, parse_inputs


def _plan(**kw):
    base = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 16, "tokens": 2e9, "zero": 3}
    base.update(kw)
    return build_plan(parse_inputs(base))


def test_token_id_width_follows_vocab():
    assert tokenized_bytes_per_token(50_257) == 2   # GPT-2 vocabulary fits uint16
    assert tokenized_bytes_per_token(65_536) == 2
    assert tokenized_bytes_per_token(128_256) == 4  # Llama 3 does not


def test_mlperf_gpt3_read_bandwidth_is_small():
    # MLPerf v3.1 GPT-3 on Eos: 5,154,997 tokens/s over 10,752 H100s (training_runs_reported.yaml,
    # secondary); GPT-3's 51,200-token vocabulary -> 2-byte ids -> 10.3 MB/s for the whole cluster
    assert read_bytes_per_s(5_154_997, tokenized_bytes_per_token(51_200)) == pytest.approx(10_309_994)


def test_iops_for_a_sample():
    # a 4096-token sample of 4-byte ids is 16 KiB; read at a random offset it touches 5 blocks
    assert blocks_per_sample(16_384) == 5
    assert blocks_per_sample(100) == 2
    assert required_iops(1000, 16_384) == 5000
    assert worker_iops(8, 100e-6) == pytest.approx(80_000)


def test_tokenizer_cores():
    # 1M tokens/s of raw text at 4 bytes/token with a 2.3 MB/s-per-core tokenizer
    assert tokenizer_cores(1e6 * 4, 2.3e6) == pytest.approx(1.739, rel=1e-3)


def test_section_by_hand():
    plan = _plan()
    sec = io_section(plan, CostOptions(), compute=SimpleNamespace(step_time_s=0.5))
    t = plan.tokens_per_step / 0.5
    assert sec["read_bytes_per_s"] == pytest.approx(t * 4)
    assert sec["read_bytes_per_s_per_node"] == pytest.approx(t * 4 / 2)
    assert sec["iops_per_node"] == pytest.approx(t / 2 / 4096 * 5)
    assert sec["starved"] is False and sec["tokenizer_cores_per_node"] == 0
    assert sec.to_dict()["inputs"]["tokens_per_s"] == pytest.approx(t)


def test_slow_storage_starves_the_gpus():
    plan = _plan()
    sec = io_section(plan, CostOptions(storage_read_gb_per_s=1e-4), compute=SimpleNamespace(step_time_s=0.5))
    assert sec["starved"] and "storage read" in sec["reasons"][0]


def test_raw_text_needs_tokenizer_cores_and_workers():
    plan = _plan(seq_len=2048, micro_batch=8)
    fast = SimpleNamespace(step_time_s=0.01)  # deliberately fast GPUs: 52M tokens/s over 2 nodes
    sec = io_section(plan, CostOptions(data_format="raw", dataloader_workers=1), compute=fast)
    t_node = plan.tokens_per_step / 0.01 / 2
    assert sec["tokenizer_cores_per_node"] == pytest.approx(t_node * 4 / 2.3e6)
    assert sec["starved"]
    assert any("workers" in r for r in sec["reasons"])
    assert any("cores" in r for r in sec["reasons"])


def test_without_step_time_only_sizes():
    sec = io_section(_plan(), CostOptions(bytes_per_token=2))
    assert sec["read_bytes_per_s"] is None
    assert sec["dataset_bytes"] == pytest.approx(4e9)
    assert sec.notes
