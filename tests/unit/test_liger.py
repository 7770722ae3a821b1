"""Liger Kernel (``--liger-kernel``): what its kernels keep for backward, what they move, and its
fused linear cross-entropy's chunks, each from Liger's source (github:linkedin/Liger-Kernel @
ead96b61) or its published kernel timings; and where the option is refused or has no effect."""

from __future__ import annotations

import pytest

from trainledger.errors import PlanError
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.activations import Flow, LoraShape, layer_bytes
from trainledger.estimate.memory.device import runtime_defaults
from trainledger.estimate.memory.phases import clear_memos, step_points
from trainledger.estimate.options import MemoryOptions, TimeOptions
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.stack import stack_profile
from trainledger.estimate.time.step import _peak16
from trainledger.estimate.time.work import head_s
from trainledger.load.hf import load_model
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.runtime import LigerOps, liger_flce_chunk

ALL = LigerOps(rms_norm=True, rope=True, glu=True, flce=True)


def _plan(**kw):
    return build_plan(PlanInputs(**kw))


def test_liger_layer_keeps_norm_inputs_and_glu_inputs_only():
    # transformers' RMSNorm saves x.float() (4h), rsqrt (4) and x.to(dtype) (R·h); Liger's saves X
    # (R·h) and RSTD (4): 4h less per norm. Its SwiGLU saves gate and up, not act(gate) as well: c·f
    # less. Llama: two norms per layer, no q/k norms.
    m = load_model("llama-3.1-8b")
    h, f = m.hidden_size, m.intermediate_size
    for c, R, autocast in ((2, 4, True), (2, 2, False)):
        eager = layer_bytes(m, Flow(c=c, R=R, autocast=autocast), "sdpa", False)
        liger = layer_bytes(m, Flow(c=c, R=R, autocast=autocast, liger=ALL), "sdpa", False)
        assert eager.total(4096) - liger.total(4096) == 2 * 4 * h + c * f
    # Qwen3's q/k norms are Liger's too (the same RMSNorm class): 4·d less per head as well
    q = load_model("qwen3-8b")
    eager = layer_bytes(q, Flow(c=2, R=4, autocast=True), "sdpa", False)
    liger = layer_bytes(q, Flow(c=2, R=4, autocast=True, liger=ALL), "sdpa", False)
    heads = q.num_heads + q.num_kv_heads
    assert eager.total(1) - liger.total(1) == 2 * 4 * q.hidden_size + 2 * q.intermediate_size + 4 * q.head_dim * heads


def test_liger_lora_first_norm_saving_is_what_liger_would_have_kept():
    # LoRA: layer 0's first norm has a frozen weight and an input without grad, so no autograd node
    # is recorded and nothing is kept: with Liger that is its X and RSTD (R·h + 4)
    m = load_model("llama-3.1-8b")
    lora = LoraShape(rank=16, targets=("q_proj", "v_proj"), dropout=False)
    eager = layer_bytes(m, Flow(c=2, R=2, autocast=False), "sdpa", False, lora)
    liger = layer_bytes(m, Flow(c=2, R=2, autocast=False, liger=ALL), "sdpa", False, lora)
    assert eager.first_layer_saving == 4 * m.hidden_size + 4
    assert liger.first_layer_saving == 2 * m.hidden_size + 4


def test_flce_chunk_follows_liger_rule():
    # the example in Liger's own comment (ops/fused_linear_cross_entropy.py): BT = 4096*4,
    # V = 32000, H = 4096 => inc_factor = 8, chunk_size = 2048
    assert liger_flce_chunk(4096 * 4, 4096, 32000) == 2048
    # next power of two, never more rows than the batch
    assert liger_flce_chunk(3000, 4096, 32000) == 512   # cdiv(3000, 8) = 375 -> 512
    assert liger_flce_chunk(100, 4096, 4096) == 100


@pytest.mark.parametrize("method", ["full", "lora"])
def test_flce_holds_no_logits(method):
    # forward end: grad_input (R·h·T), one chunk of c-byte logits, the fp32 loss per token, and
    # grad_weight (V·h in the weight dtype) when the head trains; nothing V·T-sized
    kw = dict(model="llama-3.1-8b", gpu="h100-sxm", seq_len=4096, micro_batch=2, method=method,
              precision="bf16", liger_kernel=True)
    plan = _plan(**kw)
    clear_memos()
    x, _ = step_points(plan, MemoryOptions(), runtime_defaults())
    m = plan.model
    h, V, T = m.hidden_size, m.vocab_size, 2 * 4096
    chunk = liger_flce_chunk(T, h, V)
    grad_w = 2 * V * h if method == "full" else 0
    assert x.logits_fwd == 2 * h * T + chunk * V * 2 + 4 * T + grad_w
    assert x.logits_bwd == 2 * h * T + grad_w
    assert x.logits_grad == 0
    eager, _ = step_points(_plan(**{**kw, "liger_kernel": False}), MemoryOptions(), runtime_defaults())
    assert eager.logits_fwd > 3 * V * T  # the whole logits (and more) without Liger


def test_flce_timings_match_ligers_measurements():
    # Liger's published kernel timings (benchmark/data/all_benchmark_data.csv @ 2120862b, A100-SXM4-80GB,
    # H 4096, V 128256, bf16, forward + backward): (B·T, Liger FLCE ms, torch Linear + CE ms)
    measured = [(4096, 121.43, 55.97), (8192, 166.71, 111.45), (16384, 277.12, 220.78),
                (32768, 511.06, 452.47)]
    for bt, liger_ms, torch_ms in measured:
        got = {}
        for liger in (True, False):
            plan = _plan(model="llama-3.1-8b", gpu="a100-sxm-80gb", precision="bf16", seq_len=bt,
                         liger_kernel=liger)
            prof = stack_profile("hf", plan.cluster.gpu)
            # torch's CE on bf16 logits (the benchmark's baseline): 12 bytes per entry
            mm, ew = head_s(plan, bt, prof.eff, _peak16(plan), prof.eff.matmul_max("bf16"), "hf",
                            None if liger else 12.0)
            got[liger] = (mm + ew) * 1e3
        assert got[True] == pytest.approx(liger_ms, rel=0.10), bt
        assert got[False] == pytest.approx(torch_ms, rel=0.05), bt
        # and the chunks' cost over torch's path, about 55-65 ms on this GPU
        assert got[True] - got[False] == pytest.approx(liger_ms - torch_ms, rel=0.25), bt


def test_liger_per_layer_bytes_are_the_fused_kernels():
    # Liger's RMSNorm, RoPE and SwiGLU move what the fused stacks' kernels move: on a Llama layer the
    # hf stack with Liger streams as many bytes as with --runtime megatron (head and loss apart)
    kw = dict(model="llama-3.1-8b", gpu="h100-sxm", seq_len=4096, micro_batch=1)
    liger, plain = _plan(liger_kernel=True, **kw), _plan(**kw)
    prof = stack_profile("hf", liger.cluster.gpu)
    args = (4096, prof.eff, _peak16(liger), prof.eff.matmul_max("bf16"))
    ew_liger = estimate_compute(liger).compute_parts["elementwise"] - head_s(liger, *args, "hf")[1]
    fused = estimate_compute(plain, TimeOptions(runtime="megatron"))
    ew_fused = fused.compute_parts["elementwise"] - head_s(plain, *args, "megatron")[1]
    assert ew_liger == pytest.approx(ew_fused, rel=1e-9)
    assert ew_liger < estimate_compute(plain).compute_parts["elementwise"]


def test_liger_is_refused_where_no_transformers_modules_run():
    with pytest.raises(PlanError) as err:
        _plan(framework="megatron-core", liger_kernel=True)
    assert err.value.field == "liger_kernel"
    assert "transformers" in str(err.value)


def test_liger_without_a_patch_for_the_model_changes_nothing_and_says_so():
    kw = dict(model="gpt2", seq_len=1024, micro_batch=4)
    on, off = _plan(liger_kernel=True, **kw), _plan(**kw)
    assert on.liger is None
    assert estimate_memory(on).peak_allocated_bytes == estimate_memory(off).peak_allocated_bytes
    assert estimate_compute(on).step_time_s == estimate_compute(off).step_time_s
    assert any("no patch for model_type gpt2" in n for n in estimate_memory(on).notes)


def test_liger_under_tensor_parallelism_keeps_the_models_loss():
    plan = _plan(model="llama-3.1-8b", gpus=2, tp=2, liger_kernel=True)
    assert plan.liger is not None and not plan.liger.flce and plan.liger.rms_norm
    assert any("DTensor" in n for n in estimate_memory(plan).notes)


def test_liger_only_where_the_model_has_the_module():
    # gpt-oss: Liger leaves its MLP alone (swiglu=False by default); gemma: GeGLU
    assert not _plan(model="gpt-oss-20b", liger_kernel=True).liger.glu
    assert _plan(model="gemma-2-2b", liger_kernel=True).liger.glu
    # Nemotron (squared-ReLU MLP, LayerNorm1P): Liger patches the activation and the loss only
    from trainledger.spec.runtime import liger_ops

    assert liger_ops(True, "hf", "nemotron", "layernorm", "plain", "rope") == LigerOps(False, False, False, True)
    assert liger_ops(True, "hf", "llama", "rmsnorm", "gated", "rope") == ALL
    summary = _plan(liger_kernel=True).runtime.summary()
    assert summary["liger_kernel"] is True
    assert "liger_kernel" not in _plan().runtime.summary()


def test_trainer_callback_predicts_with_liger_when_the_trainer_runs_it():
    from types import SimpleNamespace

    from trainledger.verify.callbacks import _hf_hints

    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True, fp16=False,
                           gradient_checkpointing=False, optim="adamw_torch_fused", max_grad_norm=1.0,
                           use_liger_kernel=True)
    assert _hf_hints(args)["liger_kernel"] is True
    args.use_liger_kernel = False
    assert "liger_kernel" not in _hf_hints(args)


def test_verify_refuses_to_measure_a_liger_plan_without_liger():
    from trainledger.errors import VerifyError
    from trainledger.verify.build import check_measurable

    with pytest.raises(VerifyError, match="LedgerCallback"):
        check_measurable(_plan(model="tiny-llama-debug", liger_kernel=True))
    check_measurable(_plan(model="tiny-llama-debug"))
    check_measurable(_plan(model="gpt2", liger_kernel=True))  # no Liger patch: the model as it runs


def test_planner_plans_the_transformers_stacks_with_liger_and_megatron_without():
    from trainledger.planner.search import Job, search

    job = dict(model="qwen2.5-7b", tokens=1e9, global_batch=64, seq_len=4096, max_gpus=8, gpus=("h100-sxm",),
               frameworks=("hf", "megatron-core"), top=50)
    res = search(Job(liger_kernel=True, **job))
    by_stack = {c.plan.runtime.framework: c.plan.runtime.liger_kernel for c in res.plans}
    assert by_stack == {"hf": True, "megatron-core": False}


def test_liger_is_suggested_first_where_it_applies_and_its_figures_are_the_plans():
    kw = dict(model="qwen2.5-7b", gpu="h100-sxm", gpus=8, zero=3, framework="fsdp2", seq_len=4096, micro_batch=2)
    est = estimate_memory(_plan(**kw))
    assert not est.fits
    first = est.suggestions[0]
    assert first["change"].startswith("Liger Kernel (--liger-kernel)")
    with_liger = estimate_memory(_plan(liger_kernel=True, **kw))
    assert with_liger.fits
    assert (first["peak_allocated_bytes"], first["device_total_bytes"]) == \
        (with_liger.peak_allocated_bytes, with_liger.device_total_bytes)
    # nowhere Liger cannot run: a Megatron stack, a model type it does not patch
    for other in (dict(kw, framework="megatron-core", zero=1), dict(kw, model="gpt2", micro_batch=64)):
        e = estimate_memory(_plan(**other))
        assert not any("Liger" in s["change"] for s in e.suggestions)


def test_liger_under_deepspeed_zero3_warns_of_the_ungathered_head():
    notes = estimate_memory(_plan(framework="deepspeed", gpus=8, zero=3, liger_kernel=True)).notes
    assert any("ZeRO-3 never gathers it" in n for n in notes)
    for other in (dict(framework="deepspeed", zero=2), dict(framework="fsdp2", zero=3)):
        notes = estimate_memory(_plan(gpus=8, liger_kernel=True, **other)).notes
        assert not any("never gathers" in n for n in notes)


def test_pipeline_last_stage_keeps_no_logits_under_liger():
    # torch.distributed.pipelining keeps the last stage's output until its backward: the logits
    # without Liger, nothing V-wide with its fused loss
    from trainledger.estimate.stage import pipeline_role

    kw = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=2, pp=2, seq_len=4096, grad_accum=4)
    T, m = 4096, load_model("llama-3.1-8b")
    with pipeline_role("last"):
        clear_memos()
        liger, _ = step_points(_plan(liger_kernel=True, **kw), MemoryOptions(), runtime_defaults())
        eager, _ = step_points(_plan(**kw), MemoryOptions(), runtime_defaults())
    # bf16-mixed on the hf stack: fp32 residual (grad_input) and fp32 weights (grad_weight)
    assert liger.logits_bwd == 4 * m.hidden_size * T + 4 * m.vocab_size * m.hidden_size
    assert eager.logits_bwd > 4 * m.vocab_size * T
