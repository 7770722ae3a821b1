"""Unit tests of the serving model (issue 16): KV geometry, engine memory, step times, section, planner, export."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import PlanError, SpecError
from trainledger.estimate import estimate
from trainledger.estimate.serving import ServingPerf, engine_memory, serving_section
from trainledger.estimate.serving.kv import kv_layout
from trainledger.estimate.serving.quant import weight_format
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import export_plan, import_configs
from trainledger.planner.serve import serve_plan
from trainledger.units import GIB


def plan(**kw):
    base = dict(model="llama-3.1-8b", method="inference", gpu="h100-sxm", seq_len=2048, generate_len=256)
    base.update(kw)
    return build_plan(PlanInputs(**base))


# ------------------------------------------------------------------ KV geometry
def test_sliding_window_layers_stop_growing_at_the_window() -> None:
    p = plan(model="mistral-7b-v0.1", seq_len=32000)
    m = p.model
    assert m.sliding_window == 4096
    kv = kv_layout(m, 1, 1, "bf16", False)
    short, long_ = kv.sequence_bytes(4000, 16), kv.sequence_bytes(32000, 16)
    assert long_ == pytest.approx(short * (4096 + 16) / 4000, rel=0.01)


def test_paged_blocks_round_the_context_up() -> None:
    kv = kv_layout(plan().model, 1, 1, "bf16", False)
    assert kv.sequence_bytes(17, 16) == kv.sequence_bytes(32, 16) == 32 * kv.bytes_per_token


def test_pipeline_stage_holds_its_share_of_layers() -> None:
    m = plan().model
    assert kv_layout(m, 1, 2, "bf16", False).bytes_per_token == kv_layout(m, 1, 1, "bf16", False).bytes_per_token / 2


def test_weight_formats_bytes_per_weight() -> None:
    assert weight_format("bf16", "bf16", "none", 128).linear_bytes(4096, 4096) == 2
    assert weight_format("bf16", "bf16", "int8", 128).linear_bytes(4096, 4096) == pytest.approx(1 + 4 / 4096)
    gptq = weight_format("bf16", "bf16", "gptq", 128)
    assert gptq.linear_bytes(4096, 4096) == pytest.approx(0.5 + 2.5 / 128 + 4 / 4096)
    assert gptq.dequant and gptq.gemm_dtype == "bf16"
    assert weight_format("bf16", "bf16", "awq", -1).linear_bytes(4096, 1024) == pytest.approx(0.5 + 2.5 / 4096)


# ------------------------------------------------------------------ engine memory
def test_vllm_pool_identity_and_concurrency() -> None:
    p = plan()
    em = engine_memory(p)
    total = p.cluster.gpu.usable_bytes  # vLLM's fraction applies to cudaMemGetInfo's total
    assert total < p.cluster.gpu.memory_bytes
    assert em.kv_pool == pytest.approx(0.9 * total - em.weights - em.activations - em.non_torch - em.cuda_graphs)
    assert em.max_concurrency == pytest.approx(em.num_blocks * 16 / (2048 + 256), rel=1e-9)
    fp8 = engine_memory(plan(kv_cache_dtype="fp8"))
    assert fp8.max_concurrency == pytest.approx(2 * em.max_concurrency, rel=0.01)
    capped = engine_memory(plan(max_num_seqs=8))
    assert capped.concurrency == 8


def test_longest_context_and_model_limit() -> None:
    em = engine_memory(plan())
    assert em.longest_context == 131072  # the pool holds more; the model has 131072 positions
    em = engine_memory(plan(model="llama-3.1-70b", tp=4, gpus=4, gpu="l40s", seq_len=1024))
    assert 0 < em.longest_context < 131072


def test_weights_that_do_not_fit_leave_no_pool_and_suggest_changes() -> None:
    p = plan(model="llama-3.1-70b")
    est = estimate(p)
    assert not est.memory.fits
    changes = [s["change"] for s in est.memory.suggestions]
    assert any("awq" in c for c in changes) and any("--tp 2" in c for c in changes)


# ------------------------------------------------------------------ step times
def test_batch_one_decode_streams_the_weights() -> None:
    p = plan()
    perf = ServingPerf(p)
    em = engine_memory(p)
    floor = em.weights / p.cluster.gpu.hbm_bytes_per_s
    tpot = perf.decode_s(1, 2048)
    assert floor < tpot < 2.0 * floor


def test_throughput_grows_and_latency_grows_with_batch() -> None:
    perf = ServingPerf(plan())
    rows = [perf.continuous(c, 2048, 256) for c in (1, 8, 64)]
    assert rows[0]["tpot_s"] < rows[1]["tpot_s"] < rows[2]["tpot_s"]
    assert rows[0]["output_tokens_per_s"] < rows[1]["output_tokens_per_s"] < rows[2]["output_tokens_per_s"]


def test_prefill_attention_grows_quadratically() -> None:
    perf = ServingPerf(plan(seq_len=65536))
    a16 = perf.step(0, 0, 1, 16384).attention
    a32 = perf.step(0, 0, 1, 32768).attention
    assert a32 / a16 == pytest.approx(4.0, rel=0.05)


def test_moe_small_batch_reads_few_experts() -> None:
    perf = ServingPerf(plan(model="mixtral-8x7b", tp=2, gpus=2))
    one, many = perf.step(1, 1024).gemm, perf.step(256, 1024).gemm
    assert many > 2.5 * one  # batch 1 touches 2 of 8 experts per layer; 256 tokens touch all


def test_tp_adds_all_reduce_time() -> None:
    assert ServingPerf(plan()).step(8, 1024).comm == 0
    assert ServingPerf(plan(tp=2, gpus=2)).step(8, 1024).comm > 0


def test_int4_is_faster_at_batch_one_not_at_large_batch() -> None:
    bf16, awq = ServingPerf(plan()), ServingPerf(plan(quantization="awq"))
    assert awq.decode_s(1, 1024) < 0.6 * bf16.decode_s(1, 1024)
    big_bf16, big_awq = bf16.step(0, 0, 4, 4096).gemm, awq.step(0, 0, 4, 4096).gemm
    assert big_awq >= big_bf16  # dequantization inside a 16-bit GEMM


# ------------------------------------------------------------------ section, planner, export
def test_serving_section_has_curve_and_cost() -> None:
    s = serving_section(plan(micro_batch=4)).to_dict()
    assert s["at_batch"]["concurrency"] == 4
    tps = [c["output_tokens_per_s"] for c in s["curve"]]
    assert tps == sorted(tps)
    assert s["cost"]["cloud_usd_per_million_output_tokens"] > 0
    assert s["cost"]["kwh_per_million_output_tokens"] > 0
    assert any("speculative" in n for n in s["not_modelled"])


def test_serve_plan_meets_the_slo_and_needs_a_load() -> None:
    inp = PlanInputs(model="llama-3.1-8b", method="inference", seq_len=1024, generate_len=128,
                     requests_per_s=5, ttft_p99_s=1.0, tpot_p99_s=0.05)
    res = serve_plan(inp, ["h100-sxm", "a100-sxm-80gb", "l4"], (1, 2))
    best = res["best"]
    assert best is not None
    assert best["figures"]["tpot_p99_s"] <= 0.05 and best["figures"]["ttft_p99_s"] <= 1.0
    assert best["replicas"] * best["figures"]["requests_per_s_per_replica"] >= 5
    usd = [c["cost"]["cloud_usd_per_hour"] for c in res["candidates"] if "cloud_usd_per_hour" in c["cost"]]
    assert usd == sorted(usd)
    with pytest.raises(PlanError):
        serve_plan(inp.model_copy(update={"requests_per_s": None}), ["h100-sxm"], (1,))


def test_vllm_and_sglang_export_round_trip(tmp_path) -> None:
    inp = PlanInputs(model="llama-3.1-70b", method="inference", gpus=4, tp=4, seq_len=8192, generate_len=512,
                     kv_cache_dtype="fp8", quantization="awq")
    for fmt in ("vllm", "sglang"):
        (f,) = export_plan(inp, fmt)
        assert ("--tensor-parallel-size 4" if fmt == "vllm" else "--tp-size 4") in f.text
        assert "--quantization awq" in f.text
        path = tmp_path / f.name
        path.write_text("\n".join(ln for ln in f.text.splitlines() if "trainledger-plan" not in ln))
        got = import_configs([path]).merged()
        assert got["tp"] == 4 and got["kv_cache_dtype"] == "fp8" and got["quantization"] == "awq"
        assert got["model"] == "llama-3.1-70b" and got["max_model_len"] == 8704
        assert got["serving_engine"] == fmt
    with pytest.raises(SpecError):
        export_plan(PlanInputs(model="llama-3.1-8b"), "vllm")


def test_cli_estimate_and_serve_plan() -> None:
    r = CliRunner().invoke(main, ["estimate", "--method", "inference", "--seq-len", "1024", "--generate-len", "128"])
    assert r.exit_code == 0, r.output
    assert "serving — vLLM" in r.output and "TPOT" in r.output
    r = CliRunner().invoke(main, ["serve-plan", "--seq-len", "1024", "--generate-len", "128", "--requests-per-s", "2",
                                  "--tpot-p99-s", "0.1", "--gpu-types", "h100-sxm,l40s", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["best"]["gpu"] in ("h100-sxm", "l40s")
    r = CliRunner().invoke(main, ["serve-plan", "--seq-len", "1024"])
    assert r.exit_code != 0 and "requests-per-s" in r.output


def test_inference_default_memory_is_not_fp32() -> None:
    est = estimate(plan(model="llama-3.1-8b"))
    assert est.memory.breakdown["weights"] / GIB < 16  # bf16: 14.96 GiB, fp32 would be 29.9


def test_report_and_web_show_serving_for_inference(tmp_path) -> None:
    from trainledger.web.schemas import EstimateRequest, WebInputs
    from trainledger.web.service import estimate_view, options

    v = estimate_view(EstimateRequest(inputs=WebInputs(method="inference", seq_len=2048, generate_len=256,
                                                       micro_batch=8, kv_cache_dtype="fp8")))
    sec = {s["id"]: s for s in v["sections"]}["serving"]
    kinds = [b["kind"] for b in sec["blocks"]]
    assert kinds[:3] == ["kv", "svg", "table"]
    assert "concurrency" in sec["blocks"][2]["headers"]
    assert "fp8" in options()["kv_cache_dtype"] and "vllm" in options()["serving_engine"]
    train = estimate_view(EstimateRequest(inputs=WebInputs(method="lora")))
    assert "serving" not in {s["id"] for s in train["sections"]}
    out = tmp_path / "r.md"
    r = CliRunner().invoke(main, ["report", "--method", "inference", "--seq-len", "1024", "--generate-len", "64",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "Serving: latency, throughput and cost per token" in out.read_text()


def test_prefill_queueing_grows_with_load() -> None:
    from trainledger.estimate.serving.perf import prefill_queueing

    assert prefill_queueing(0.4, 0.02, 500, 1) == (0.0, 0.0)  # one user never waits for another
    w_lo, p99_lo = prefill_queueing(0.4, 0.02, 500, 0, arrival_rate=0.5)  # rho = 0.2
    assert w_lo == pytest.approx(0.2 * 0.4 / (2 * 0.8))
    w_hi, p99_hi = prefill_queueing(0.4, 0.02, 500, 0, arrival_rate=2.0)  # rho = 0.8
    assert w_hi > 5 * w_lo and p99_hi > w_hi


def test_nvfp4_weights_and_export() -> None:
    assert weight_format("bf16", "bf16", "nvfp4", 128).linear_bytes(8192, 8192) == pytest.approx(0.5 + 1 / 16)
    b200 = ServingPerf(plan(gpu="b200", quantization="nvfp4"))
    h100 = ServingPerf(plan(gpu="h100-sxm", quantization="nvfp4"))
    assert not b200.fmt.dequant and h100.fmt.dequant  # FP4 tensor cores on Blackwell only
    (f,) = export_plan(PlanInputs(model="llama-3.1-8b", method="inference", quantization="nvfp4"), "vllm")
    assert "--quantization modelopt_fp4" in f.text
