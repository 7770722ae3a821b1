"""Near-capacity memory (issue 15): the caching allocator's retries, and the memory of torchtitan's
per-op SAC / Float8-on-FSDP2 plans that decide whether a plan is near capacity.

The retry mechanism (estimate/memory/pressure.py): a moment with L live bytes needs L·(1+f)
reserved (f the allocator reserve fraction); when that exceeds the capacity C the share
(L·(1+f) - C)/(f·L) of its large allocations miss the cache and retry cudaMalloc
(c10/cuda/CUDACachingAllocator.cpp ``malloc`` -> ``release_cached_blocks``). The expected values
below are worked out by hand from that rule, not read from the code's output.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.model import Parts, activations, model_states
from trainledger.estimate.memory.pressure import pressure
from trainledger.estimate.options import MemoryOptions
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.allocator import allocator_retries, retry_cost
from trainledger.load.plan import PlanInputs, build_plan

GIB = 2**30


def _plan(**kw):
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8)
    base.update(kw)
    return build_plan(PlanInputs(**base))


def _one_moment(live: float, capacity: float = 100.0, f: float = 0.1, grad_accum: int = 1):
    plan = _plan(grad_accum=grad_accum) if grad_accum > 1 else _plan()
    points = [("forward", "loss (forward end)", {"activations": live})]
    return pressure(plan, points, capacity, f, n_layers=32)


def test_no_retries_with_comfortable_headroom():
    # L(1+f) = 90·1.1 = 99 <= 100: every allocation is served from the cache
    assert _one_moment(90.0).retries_per_step == 0.0
    assert _one_moment(90.0).note() is None


def test_retries_follow_the_missing_share_of_the_cache():
    # L = 95: L(1+f) - C = 4.5 of a 9.5 cache missing -> 4.5/9.5 of one allocation retries
    assert _one_moment(95.0).retries_per_step == pytest.approx(4.5 / 9.5)
    # at L = C the cache is gone: every large allocation retries
    assert _one_moment(100.0).retries_per_step == pytest.approx(1.0)


def test_retries_grow_towards_capacity_and_repeat_per_micro_batch():
    r = [_one_moment(x).retries_per_step for x in (91.0, 93.0, 95.0, 97.0, 99.0)]
    assert all(a < b for a, b in zip(r, r[1:])) and r[0] > 0
    # a forward moment recurs in every micro-batch of the step
    assert _one_moment(95.0, grad_accum=4).retries_per_step == pytest.approx(4 * 4.5 / 9.5)


def test_layer_loop_moments_recur_once_per_layer():
    plan = _plan()
    # both ends of the layer loop at the same pressure: n_layers times the moment's retries
    pts = [("backward", "last layer backward", {"activations": 95.0}),
           ("backward", "first layer backward", {"activations": 95.0})]
    assert pressure(plan, pts, 100.0, 0.1, n_layers=32).retries_per_step == pytest.approx(32 * 4.5 / 9.5)


def test_layer_loop_retries_are_the_sum_over_its_layers():
    """The layer loop's moments recur once per layer, the live bytes interpolated between its two ends
    (estimate/memory/pressure.py docstring), so its retries are the sum of each layer's miss. 32
    layers from L = 92 (last layer) down to 80 (first): layer l holds 92 - 12·l/31; with C = 100 and
    f = 0.1 only L > 100/1.1 = 90.91 misses, i.e. layers 0-2 (92, 91.61, 91.23):
    1.2/9.2 + 0.774/9.161 + 0.348/9.123 = 0.253 retries (one allocation rises at the moment: the
    activations term)."""
    plan = _plan()
    pts = [("backward", "last layer backward", {"activations": 92.0}),
           ("backward", "first layer backward", {"activations": 80.0})]
    layers = [92.0 - 12.0 * k / 31 for k in range(32)]
    by_hand = sum(max(0.0, 1.1 * x - 100.0) / (0.1 * x) for x in layers)
    assert by_hand == pytest.approx(1.2 / 9.2 + 0.7742 / 9.1613 + 0.3484 / 9.1226, rel=1e-3)
    assert pressure(plan, pts, 100.0, 0.1, n_layers=32).retries_per_step == pytest.approx(by_hand, rel=0.02)


def test_a_plan_that_does_not_fit_has_no_step_to_slow_only_the_warning():
    p = _one_moment(120.0)
    assert not p.fits and p.retries_per_step == 0.0
    assert "does not fit" in p.note()


def _near_capacity_plan():
    # torchtitan's Llama 2 13B row without AC (64 A100-80GB, local batch 2, seq 4096): the live
    # peak sits within the allocator's cache of the 80 GiB
    return _plan(model="llama-2-13b", gpu="a100-sxm-80gb", gpus=64, framework="fsdp2", zero=3,
                 micro_batch=2, seq_len=4096, attention="flash")


def test_near_capacity_plan_warns_and_pays_in_the_time_breakdown():
    plan = _near_capacity_plan()
    term = allocator_retries(plan)
    assert term.pressure.fits and term.pressure.retries_per_step > 0
    assert term.seconds == pytest.approx(term.pressure.retries_per_step * retry_cost()[0])
    comp = estimate_compute(plan)
    assert comp.breakdown["allocator_retries"] == pytest.approx(term.seconds)
    assert any("near capacity" in n and "num_alloc_retries" in n for n in comp.notes)
    mem = estimate_memory(plan, MemoryOptions(suggestions=False))
    assert any(n.startswith("near capacity") for n in mem.notes)


def test_comfortable_plan_has_no_retry_term():
    plan = _plan(model="llama-3.2-1b", gpus=8, framework="fsdp2", zero=3, micro_batch=1, seq_len=2048)
    comp = estimate_compute(plan)
    assert "allocator_retries" not in comp.breakdown
    assert not any("near capacity" in n for n in comp.notes)


def test_smaller_micro_batch_restores_headroom():
    big = allocator_retries(_near_capacity_plan()).pressure.retries_per_step
    small = allocator_retries(_plan(model="llama-2-13b", gpu="a100-sxm-80gb", gpus=64, framework="fsdp2",
                                    zero=3, micro_batch=1, seq_len=4096, attention="flash"))
    assert big > 0 and small.pressure.retries_per_step == 0.0


def _acts(plan) -> Parts:
    x = Parts()
    model_states(plan, x)
    activations(plan, MemoryOptions(), x)
    return x


def test_fsdp2_selective_is_torchtitans_per_op_sac():
    # torchtitan/distributed/activation_checkpoint.py (_save_list, _custom_policy): a Llama block
    # keeps its input and the outputs of mm 1, 3, 5, 7 of (wq, wk, wv, wo, w1, w3, w2) plus the
    # SDPA output and logsumexp. Llama-3.1-8B, bf16 (FSDP2 param_dtype): per token and layer
    # 2·(h + q + kv + f + h) + 2·q + 4·a = 2·(4096+4096+1024+14336+4096) + 2·4096 + 4·32
    per_token_layer = 2 * (4096 + 4096 + 1024 + 14336 + 4096) + 2 * 4096 + 4 * 32
    plan = _plan(framework="fsdp2", zero=3, micro_batch=2, seq_len=8192, recompute="selective", attention="flash")
    assert _acts(plan).acts == pytest.approx(per_token_layer * 2 * 8192 * 32)


def test_fsdp2_fp8_keeps_the_fp32_parameter_shard():
    # torchao Float8Linear under FSDP2 keeps the fp32 weight (WeightWithDynamicFloat8CastTensor) and
    # casts at all-gather time: the shard, its gradient and the states are those of bf16-mixed
    kw = dict(framework="fsdp2", zero=3, micro_batch=1, seq_len=2048)
    a = estimate_memory(_plan(precision="bf16-mixed", **kw), MemoryOptions(suggestions=False)).breakdown
    b = estimate_memory(_plan(precision="fp8-mixed", **kw), MemoryOptions(suggestions=False)).breakdown
    assert b["weights"] == a["weights"] and b["optimizer_states"] == a["optimizer_states"]


def test_layernorm_saves_its_input_and_row_statistics_only():
    # aten native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias):
    # a LayerNorm keeps its input (2h in 16 bits, no autocast) and fp32 mean + rstd (8 per token),
    # where an HF RMSNorm keeps the fp32 input (4h), rsqrt (4) and x.to(dtype) (2h): 4h - 4 more
    from trainledger.estimate.memory.activations import Flow, layer_bytes

    m = _plan(model="llama-3.2-1b").model
    ln = m.model_copy(update={"norm_type": "layernorm"})
    flow = Flow(c=2, R=2, autocast=False, adapter=2)
    h = m.hidden_size
    d = layer_bytes(m, flow, "flash", False).replicated - layer_bytes(ln, flow, "flash", False).replicated
    assert d == pytest.approx(m.norms_per_layer * (4 * h - 4))


def test_fused_loss_keeps_the_logits_once():
    # flash-attn CrossEntropyLoss: forward saves the 16-bit logits and an fp32 log-sum-exp per token;
    # backward writes a 16-bit gradient beside the saved logits
    kw = dict(model="llama-3.2-1b", framework="pytorch-fsdp", zero=3, precision="bf16", micro_batch=2, seq_len=1024)
    plan = _plan(fused_loss=True, **kw)
    x = _acts(plan)
    V, T = plan.model.vocab_size, 2 * 1024
    assert x.logits_fwd == pytest.approx(2 * V * T + 4 * T)
    assert x.logits_bwd == pytest.approx(2 * 2 * V * T + 4 * T)
    assert _acts(_plan(**kw)).logits_fwd > 4 * x.logits_fwd  # bf16 + fp32 upcast + fp32 log-softmax


def test_fsdp2_pipeline_stage_keeps_its_unsharded_fp32_gradients_between_micro_batches():
    # torch.distributed.pipelining stage.py backward_maybe_with_nosync: FSDP2 stages run every
    # backward with set_requires_gradient_sync(False) and reduce-scatter after the last; FSDP2 keeps
    # the unsharded gradient in the reduce dtype (fp32) meanwhile: 4 bytes per parameter of the stage
    from trainledger.estimate.memory.phases import step_points
    from trainledger.estimate.memory.device import runtime_defaults
    from trainledger.estimate.memory.states import model_shape
    from trainledger.estimate.stage import pipeline_role

    kw = dict(model="llama-3.2-1b", gpus=4, pp=2, framework="fsdp2", zero=3, micro_batch=1, seq_len=1024,
              reshard_after_forward=False, grad_accum=4)
    plan = _plan(**kw)
    sh = model_shape(plan.model)
    with pipeline_role("first"):
        x, pts = step_points(plan, MemoryOptions(), runtime_defaults())
    fwd = next(d for ph, lb, d in pts if lb == "loss (forward end)")
    stage_params = sh.layers / 2 + sh.embedding
    assert fwd["gradients"] - x.grads == pytest.approx(4 * stage_params, rel=2e-3)
    opt = next(d for ph, lb, d in pts if ph == "optimizer")
    assert opt["gradients"] == pytest.approx(x.grads)  # reduce-scattered before the step


@pytest.mark.parametrize("framework,gpus,pp,zero,micro_batch", [
    ("fsdp2", 64, 1, 3, 1), ("fsdp2", 64, 1, 3, 2), ("fsdp2", 128, 2, 1, 1), ("fsdp2", 64, 2, 1, 1),
    ("fsdp2", 64, 2, 1, 2), ("hf", 8, 1, 0, 1), ("hf", 16, 2, 0, 1), ("hf", 64, 2, 1, 1),
    ("hf-3b", 8, 1, 0, 1), ("hf-3b", 16, 2, 0, 1)])
def test_brief_pressure_gives_the_same_retries_as_the_walk(framework, gpus, pp, zero, micro_batch):
    # the scaling curve's points ask only for the retry count: a stage whose resident states alone
    # exceed the capacity is called unfit without its walk. Llama 2 13B on A100-80GB, s = 4096: these
    # plans fit with headroom, fit near capacity (8 and 20 retries), do not fit by their activations,
    # or by their states alone (DDP: fp32 weights and AdamW states), with and without a pipeline
    from trainledger.estimate.memory.phases import allocator_pressure

    model = "llama-3.2-3b" if framework == "hf-3b" else "llama-2-13b"  # 3B: resident states ~half the GPU
    plan = _plan(model=model, gpu="a100-sxm-80gb", gpus=gpus, pp=pp, framework=framework[:2] if framework.startswith("hf") else framework, zero=zero,
                 micro_batch=micro_batch, seq_len=4096, attention="flash", grad_accum=4)
    full, brief = allocator_pressure(plan), allocator_pressure(plan, brief=True)
    assert (brief.retries_per_step, brief.fits) == (full.retries_per_step, full.fits)


def test_pipeline_memory_note_names_the_stage_the_time_term_prices():
    """Qwen2.5-14B, 16 H100, PP 4, micro-batch 4, full recomputation: the last stage has the larger
    live peak (head and loss), the first stage more retries (four micro-batches in flight, each
    allocation a miss). The memory note and the time term read the same stage, the one with more
    retries (``pressure.busier``)."""
    from trainledger.estimate.memory import estimate_memory
    from trainledger.estimate.memory.phases import allocator_pressure, peak_bytes, step_points
    from trainledger.estimate.memory.device import runtime_defaults
    from trainledger.estimate.options import MemoryOptions
    from trainledger.estimate.stage import pipeline_role
    from trainledger.estimate.time.allocator import allocator_retries
    from trainledger.load.plan import PlanInputs, build_plan

    p = build_plan(PlanInputs(model="qwen2.5-14b", gpus=16, pp=4, seq_len=2048, micro_batch=4,
                              grad_accum=8, recompute="full", zero=1))
    peaks = {}
    for role in ("first", "last"):
        with pipeline_role(role):
            peaks[role] = peak_bytes(step_points(p, MemoryOptions(), runtime_defaults())[1],
                                     MemoryOptions(), runtime_defaults(), p).allocated
            with_role = allocator_pressure(p)
        peaks[role + " retries"] = with_role.retries_per_step
    assert peaks["last"] > peaks["first"] and peaks["first retries"] > peaks["last retries"] > 0
    priced = allocator_retries(p).pressure
    assert priced.retries_per_step == peaks["first retries"]
    notes = [n for n in estimate_memory(p).notes if n.startswith("near capacity")]
    assert notes == [priced.note()]
