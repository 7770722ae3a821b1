"""MemoryTracker: exact storage accounting, checked against hand-computed bytes and against
torch's own CPU allocator accounting (profiler memory events)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainledger.verify.memtrace import (  # noqa: E402
    CATEGORIES,
    MemoryTracker,
    cuda_block_bytes,
    exact_bytes,
)


TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}


@pytest.fixture
def tiny_llama_config():
    return dict(TINY_LLAMA)


def r512(nbytes: int) -> int:
    """CUDA caching allocator block size, written out independently of the code under test."""
    return 0 if nbytes == 0 else ((nbytes + 511) // 512) * 512


def test_cuda_rounding_matches_allocator_rule():
    # kMinBlockSize = 512: round_size() rounds every request up to a multiple of 512 bytes
    assert cuda_block_bytes(0) == 0
    assert cuda_block_bytes(1) == 512
    assert cuda_block_bytes(512) == 512
    assert cuda_block_bytes(513) == 1024
    assert cuda_block_bytes(24000) == 24064
    assert exact_bytes(24000) == 24000


def test_allocation_views_and_frees():
    tr = MemoryTracker()
    with tr:
        a = torch.empty(1000)  # 4000 B -> 4096
        assert tr.current_bytes == 4096
        v1, v2, v3 = a.view(10, 100), a[10:], a.t() if a.dim() == 2 else a.unsqueeze(0)
        assert tr.current_bytes == 4096  # views share the storage: counted once
        b = torch.zeros(3, dtype=torch.int8)  # 3 B -> one 512 B block
        assert tr.current_bytes == 4096 + 512
        del a
        assert tr.current_bytes == 4096 + 512  # the views still hold the storage
        del v1, v2, v3
        assert tr.current_bytes == 512
        del b
        assert tr.current_bytes == 0
    assert tr.peak.bytes == 4096 + 512


def test_resize_is_tracked():
    tr = MemoryTracker(rounding=exact_bytes)
    with tr:
        a = torch.empty(10)
        assert tr.current_bytes == 40
        a.resize_(100)
        assert tr.current_bytes == 400
        del a
    assert tr.current_bytes == 0 and tr.peak.bytes == 400


def test_linear_adamw_exact_bytes_by_phase():
    """Linear(100 -> 60) + AdamW(foreach): every phase peak from the tensor sizes by hand."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(100, 60)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3, foreach=True)
    P = r512(100 * 60 * 4) + r512(60 * 4)  # weight 24000 B -> 24064; bias 240 B -> 512

    def step(tr=None):
        ph = tr.phase if tr else (lambda n: __import__("contextlib").nullcontext())
        with ph("forward"):
            x = torch.randn(8, 100)
            loss = lin(x).sum()
        with ph("backward"):
            loss.backward()
            del loss, x
        if tr:
            tr.label([p.grad for p in lin.parameters()], "gradients")
        with ph("optimizer"):
            opt.step()
        with ph("zero_grad"):
            opt.zero_grad(set_to_none=True)

    step()  # step 1 creates the AdamW states
    tr = MemoryTracker()
    tr.register(lin.parameters(), "weights")
    for st in opt.state.values():
        tr.register([st["exp_avg"], st["exp_avg_sq"]], "optimizer_states")
        tr.ignore([st["step"]])  # host tensors in a CUDA run
    tr.reset_peaks()
    assert tr.current_bytes == 3 * P  # weights + exp_avg + exp_avg_sq
    with tr:
        step(tr)
    rep = tr.report()
    x_b, y_b, scalar = r512(8 * 100 * 4), r512(8 * 60 * 4), 512
    # forward: weights, states, x, addmm output y, loss scalar
    assert rep.phase_peaks["forward"] == 3 * P + x_b + y_b + scalar
    # optimizer: weights + grads + 2 states + foreach sqrt(v) temporary as large as the params
    assert rep.phase_peaks["optimizer"] == 5 * P
    cats = rep.phase_categories["optimizer"]
    assert cats["weights"] == P and cats["gradients"] == P
    assert cats["optimizer_states"] == 2 * P and cats["optimizer_temporaries"] == P
    assert rep.phase_peaks["zero_grad"] == 4 * P  # grads still live when zero_grad begins
    assert tr.current_bytes == 3 * P  # grads freed by zero_grad(set_to_none=True)
    assert rep.peak_phase == "optimizer" and rep.peak_bytes == 5 * P
    assert set(rep.categories_at_peak) == set(CATEGORIES)


def test_sgd_momentum_has_no_temporaries():
    lin = torch.nn.Linear(64, 64, bias=False)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9, foreach=True)
    P = r512(64 * 64 * 4)
    lin(torch.randn(2, 64)).sum().backward()
    opt.step()
    tr = MemoryTracker()
    tr.register(lin.parameters(), "weights")
    tr.register([p.grad for p in lin.parameters()], "gradients")
    tr.register([s["momentum_buffer"] for s in opt.state.values()], "optimizer_states")
    tr.reset_peaks()
    with tr, tr.phase("optimizer"):
        opt.step()
    assert tr.report().phase_peaks["optimizer"] == 3 * P


def test_autocast_weight_copies_and_logits_categories():
    V = 300
    lin = torch.nn.Linear(32, V, bias=False)
    tr = MemoryTracker(vocab_size=V)
    tr.register(lin.parameters(), "weights")
    with tr, tr.phase("forward"), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(4, 32)
        logits = lin(x)
        up = logits.float()
        cats = tr.live_bytes_by_category()
    assert cats["weights"] == r512(V * 32 * 4)
    assert cats["autocast_weight_copies"] == r512(V * 32 * 2)  # the bf16 copy of the weight
    assert cats["logits"] == r512(4 * V * 2) + r512(4 * V * 4)  # bf16 logits + fp32 upcast
    # x (fp32) and its bf16 cast are activations
    assert cats["activations"] == r512(4 * 32 * 4) + r512(4 * 32 * 2)
    del logits, up


def _profiler_peak(fn) -> int:
    """Peak bytes above the start, from the CPU allocator's own memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


def test_matches_cpu_allocator_accounting_for_mlp_training_step():
    """Ground truth independent of the tracker: torch's profiler sees every CPU allocation."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9, foreach=True)

    def step():
        mlp(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    truth = _profiler_peak(step)
    tr = MemoryTracker(rounding=exact_bytes)
    tr.register(mlp.parameters(), "weights")
    tr.register([s["momentum_buffer"] for s in opt.state.values()], "optimizer_states")
    tr.reset_peaks()
    with tr:
        step()
    rep = tr.report()
    assert rep.late_registered == 0
    assert rep.peak_bytes - rep.start_bytes == truth


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_matches_cpu_allocator_accounting_for_tiny_llama(tiny_llama_config, precision):
    from trainledger.spec.recipe import Recipe
    from trainledger.verify.build import build_model
    from trainledger.verify.measure import register_state
    from trainledger.verify.train_step import StepRunner

    recipe = Recipe(precision=precision, optimizer="sgd-momentum", seq_len=32, micro_batch=2)
    built = build_model(tiny_llama_config, recipe, device="cpu")
    runner = StepRunner(built, recipe)
    runner.step()
    truth = _profiler_peak(runner.step)
    tr = MemoryTracker(vocab_size=built.vocab_size, rounding=exact_bytes)
    register_state(tr, runner)
    tr.reset_peaks()
    with tr:
        runner.step(tr.phase)
    rep = tr.report()
    assert rep.late_registered == 0
    assert rep.peak_bytes - rep.start_bytes == truth
