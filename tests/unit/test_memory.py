"""Unit tests of the memory model: interface, layouts, methods, inference, fit verdict, speed."""

from __future__ import annotations

import json
import sys
import time

import pytest
from click.testing import CliRunner

from trainledger.estimate import estimate
from trainledger.estimate.memory.activations import Flow, layer_bytes
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.model import Parts, activations, inflight_microbatches, model_states
from trainledger.estimate.options import MemoryOptions
from trainledger.load.plan import PlanInputs, build_plan

GIB = 2**30
NO_SUGGEST = MemoryOptions(suggestions=False)


def plan(**kw):
    kw.setdefault("model", "llama-3.1-8b")
    return build_plan(PlanInputs(**kw))


def mem(**kw):
    return estimate_memory(plan(**kw), NO_SUGGEST, suggest=False)


def parts(**kw) -> Parts:
    p = plan(**kw)
    x = Parts()
    model_states(p, x)
    if p.recipe.is_training:
        activations(p, MemoryOptions(), x)
    return x


def test_to_dict_has_the_interface_keys():
    d = estimate(plan(seq_len=2048)).to_dict()["memory"]
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "breakdown",
                "peak_phase", "fits", "host_bytes", "usable_bytes", "headroom", "terms", "timeline",
                "suggestions"):
        assert key in d, key
    assert sum(d["breakdown"].values()) == d["peak_allocated_bytes"]
    assert d["peak_reserved_bytes"] >= d["peak_allocated_bytes"]
    assert d["device_total_bytes"] > d["peak_reserved_bytes"]
    assert all(t["source"] for t in d["terms"])
    assert max(t["bytes"] for t in d["timeline"]) == d["peak_allocated_bytes"]
    json.dumps(d)


def test_peak_phase_flips_between_backward_and_optimizer():
    """Long sequences peak in backward (activations + logits), short ones in the optimizer step
    (foreach AdamW's temporary); fused AdamW has no temporary."""
    assert mem(model="llama-3.2-1b", seq_len=8192, optimizer="adamw").peak_phase == "backward"
    assert mem(model="llama-3.2-1b", seq_len=128, optimizer="adamw").peak_phase == "optimizer"
    assert mem(model="llama-3.2-1b", seq_len=128, optimizer="adamw-fused").peak_phase != "optimizer"
    # the hf stack's default AdamW is fused (transformers' Trainer with torch >= 2.8)
    assert mem(model="llama-3.2-1b", seq_len=128).peak_phase != "optimizer"


def test_activations_are_the_closed_form_per_layer_sum():
    """Check two ways: the stage total equals L × per-layer bytes × tokens (+ final norm/lm_head)."""
    p = plan(model="llama-3.1-8b", seq_len=1024, micro_batch=2)
    x = parts(model="llama-3.1-8b", seq_len=1024, micro_batch=2)
    lb = layer_bytes(p.model, Flow(c=2, R=4, autocast=True), "sdpa", False, None, False)
    assert x.acts == pytest.approx(p.model.num_layers * lb.total(1024) * 2048)


def test_eager_scores_grow_with_s_squared_and_sdpa_does_not():
    def act(s: int, attn: str) -> float:
        return parts(model="llama-3.2-1b", seq_len=s, attention=attn).acts
    assert act(4096, "sdpa") / act(2048, "sdpa") == pytest.approx(2.0, rel=1e-6)
    eager_extra = [act(s, "eager") - act(s, "sdpa") for s in (1024, 2048)]
    assert eager_extra[1] / eager_extra[0] == pytest.approx(4.0, rel=0.05)


def test_full_recompute_keeps_only_layer_inputs():
    x = parts(model="llama-3.1-8b", seq_len=4096, recompute="full")
    m = plan().model
    assert x.acts == pytest.approx(m.num_layers * 4 * m.hidden_size * 4096)  # fp32 residual
    assert x.act_layer > 0


def test_tensor_parallel_divides_weights_and_activations():
    # Megatron TP + SP (torch's parallelize_module keeps more: tests/unit/test_memory_runtimes.py)
    one = parts(seq_len=2048, framework="megatron-core")
    tp = parts(seq_len=2048, gpus=8, tp=8, framework="megatron-core")
    assert tp.weights == pytest.approx(one.weights / 8, rel=0.01)
    assert tp.acts == pytest.approx(one.acts / 8, rel=0.01)  # with sequence parallelism


def test_zero_stages_shard_states_then_grads_then_weights():
    x = [parts(seq_len=2048, gpus=8, zero=z) for z in range(4)]
    assert x[1].states == pytest.approx(x[0].states / 8)
    assert x[2].grads == pytest.approx(x[0].grads / 8)
    assert x[3].weights == pytest.approx(x[0].weights / 8)
    assert x[0].ddp == x[0].grads  # DDP bucket copy of the gradients
    totals = [mem(seq_len=2048, gpus=8, zero=z).peak_allocated_bytes for z in range(4)]
    assert totals == sorted(totals, reverse=True)


def test_pipeline_first_stage_holds_p_microbatches():
    p = plan(seq_len=2048, gpus=4, pp=4, grad_accum=8)
    assert inflight_microbatches(p) == 4
    pi = plan(seq_len=2048, gpus=4, pp=4, vp=2, grad_accum=8)
    assert inflight_microbatches(pi) == pytest.approx(4 * (1 + 3 / 8))
    # with as many micro-batches as stages the interleaved warm-up runs out of them: Megatron's
    # rank-0 warm-up is min((p - 1)·2 + (v - 1)·p, m·v) = min(10, 8) chunk forwards, i.e. every
    # chunk of all 4 micro-batches in flight = 4 stage-micro-batches (not 5.5)
    few = plan(seq_len=2048, gpus=4, pp=4, vp=2, grad_accum=4)
    assert inflight_microbatches(few) == pytest.approx(4.0)
    one = parts(seq_len=2048, grad_accum=8)
    staged = parts(seq_len=2048, gpus=4, pp=4, grad_accum=8)
    assert staged.acts == pytest.approx(one.acts, rel=0.01)  # 4 micro-batches × L/4 layers


def test_offload_moves_states_to_host():
    e = mem(seq_len=2048, offload="optimizer")
    assert "optimizer_states" not in e.breakdown
    assert e.host_bytes >= 8 * plan().model.params.total


def test_lora_trains_only_adapters():
    x = parts(seq_len=2048, method="lora")
    full = parts(seq_len=2048)
    assert x.states < full.states / 50
    assert x.grads < full.grads / 50
    q = parts(seq_len=2048, method="qlora")
    # both default to the checkpoint's bf16 base: NF4 is ~4x smaller on the linear layers only
    assert q.weights < x.weights / 2.5
    assert parts(seq_len=2048, method="lora", precision="bf16-mixed").weights == pytest.approx(2 * x.weights, rel=0.01)


def test_inference_kv_cache():
    p = plan(method="inference", precision="bf16", seq_len=8192, micro_batch=4)
    m = p.model
    e = estimate_memory(p, NO_SUGGEST, suggest=False)
    assert e.breakdown["kv_cache"] == 4 * 8192 * m.num_layers * 2 * m.kv_dim * 2
    paged = estimate_memory(plan(method="inference", precision="bf16", seq_len=8190, micro_batch=4),
                            MemoryOptions(kv_cache="paged"), suggest=False)
    assert paged.breakdown["kv_cache"] == e.breakdown["kv_cache"]  # 8190 rounds up to 16-token blocks


def test_does_not_fit_comes_with_suggestions_that_fit():
    e = estimate_memory(plan(seq_len=4096, micro_batch=2), MemoryOptions())
    assert not e.fits
    assert e.suggestions
    for s in e.suggestions:
        assert s["fits"] and s["device_total_bytes"] < e.device_total_bytes
    assert estimate_memory(plan(model="llama-3.2-1b", seq_len=1024)).fits


def test_headroom_changes_the_verdict():
    small = mem(model="llama-3.2-1b", seq_len=8192, micro_batch=4)
    tight = estimate_memory(plan(model="llama-3.2-1b", seq_len=8192, micro_batch=4, headroom=0.0),
                            NO_SUGGEST, suggest=False)
    assert tight.budget_bytes > small.budget_bytes


def test_one_estimate_takes_well_under_a_millisecond():
    p = plan(seq_len=4096, gpus=16, tp=2, zero=1)
    estimate_memory(p, NO_SUGGEST, suggest=False)
    n = 300
    t0 = time.process_time()
    for _ in range(n):
        estimate_memory(p, NO_SUGGEST, suggest=False)
    assert (time.process_time() - t0) / n < 1e-3


def test_estimator_does_not_import_torch():
    import subprocess

    code = ("import sys\n"
            "from trainledger.load.plan import PlanInputs, build_plan\n"
            "from trainledger.estimate.memory import estimate_memory\n"
            "e = estimate_memory(build_plan(PlanInputs(model='llama-3.1-8b', seq_len=8192, micro_batch=4)))\n"
            "assert e.suggestions and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_cli_estimate_json_and_text():
    from trainledger.cli import main

    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.2-1b", "--seq-len", "1024", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["memory"]
    assert d["fits"] and d["peak_phase"] in ("forward", "backward", "optimizer")
    r = CliRunner().invoke(main, ["estimate", "--model", "llama-3.1-8b", "--seq-len", "4096"])
    assert r.exit_code == 0, r.output
    assert "DOES NOT FIT" in r.output and "to make it fit" in r.output
    assert "= peak allocated" in r.output
