"""measure_memory: real CPU runs, fake full-size runs, recipes, errors.

Expected numbers are derived from parameter counts and tensor shapes by hand, never copied from
the code's output; CPU-vs-fake agreement checks the fake path against real tensors.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainledger.errors import VerifyError  # noqa: E402
from trainledger.spec.recipe import Recipe  # noqa: E402
from trainledger.verify.measure import measure_memory, measure_memory_from_config  # noqa: E402

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
TINY_QWEN3_MOE = {
    "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 512, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 500, "n_positions": 128}

# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json): h=4096, L=32, a=32, k=8, d=128, f=14336,
# V=128256, untied embeddings. N = 2·V·h + L·(2·h·a·d + 2·h·k·d + 3·h·f + 2·h) + h
H, L, A, K, D, F, V = 4096, 32, 32, 8, 128, 14336, 128256
N_8B = 2 * V * H + L * (2 * H * A * D + 2 * H * K * D + 3 * H * F + 2 * H) + H


def r512(n: int) -> int:
    return 0 if n == 0 else (n + 511) // 512 * 512


def lora_param_bytes(cfg: dict, rank: int, dtype_bytes: int = 4) -> int:
    """LoRA A (r×in) and B (out×r) for q,k,v,o,gate,up,down of every layer, each rounded."""
    h, f, a, k, d = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                     cfg["num_key_value_heads"], cfg["head_dim"])
    shapes = [(h, a * d), (h, k * d), (h, k * d), (a * d, h), (h, f), (h, f), (f, h)]  # (in, out)
    per_layer = sum(r512(rank * i * dtype_bytes) + r512(o * rank * dtype_bytes) for i, o in shapes)
    return cfg["num_hidden_layers"] * per_layer


@pytest.mark.parametrize("cfg", [TINY_LLAMA, TINY_QWEN3_MOE, TINY_GPT2], ids=["llama", "qwen3_moe", "gpt2"])
def test_fake_run_equals_real_cpu_run(cfg):
    """FakeTensors must reproduce the real run byte for byte (same ops, same shapes)."""
    recipe = Recipe(precision="bf16-mixed", optimizer="adamw", seq_len=32, micro_batch=2)
    real = measure_memory_from_config(cfg, recipe, device="cpu")
    fake = measure_memory_from_config(cfg, recipe, device="fake")
    assert real.peak_allocated_bytes == fake.peak_allocated_bytes > 0
    assert real.phase_peaks == fake.phase_peaks
    assert real.categories_at_peak == fake.categories_at_peak
    assert real.peak_phase == fake.peak_phase


def test_tiny_llama_state_terms_exact():
    """fp32 + AdamW: weights, grads, states and the foreach temporary at the optimizer peak."""
    recipe = Recipe(precision="fp32", optimizer="adamw", seq_len=32, micro_batch=2, grad_clip=None)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="cpu")
    h, f, V_, kd, L_ = 64, 176, 512, 2 * 16, 2
    per_layer = [h * h, h * kd, h * kd, h * h, h * f, h * f, f * h, h, h]  # q k v o gate up down norms
    P = 2 * r512(V_ * h * 4) + L_ * sum(r512(n * 4) for n in per_layer) + r512(h * 4)
    opt = m.phase_categories["optimizer"]
    assert opt["weights"] == P and opt["gradients"] == P and opt["optimizer_states"] == 2 * P
    assert opt["optimizer_temporaries"] == P  # sqrt(v) of torch's foreach AdamW
    assert m.phase_peaks["optimizer"] == 5 * P + opt["other"]
    assert m.start_bytes == 3 * P + opt["other"]  # weights + 2 states (+ rotary buffer)


def test_llama_8b_fake_is_exact_and_fast():
    """Full-size Llama-3.1-8B on fake tensors: exact state bytes from the parameter count."""
    import time

    from trainledger.load.hf import load_hf_config

    t0 = time.perf_counter()
    recipe = Recipe(precision="bf16-mixed", optimizer="adamw", seq_len=256, micro_batch=1)
    m = measure_memory_from_config(load_hf_config("llama-3.1-8b"), recipe, device="fake")
    assert time.perf_counter() - t0 < 60
    assert N_8B == 8_030_261_248
    opt = m.phase_categories["optimizer"]
    assert opt["weights"] == 4 * N_8B  # every Llama-8B tensor is a multiple of 512 B in fp32
    assert opt["gradients"] == 4 * N_8B
    assert opt["optimizer_states"] == 8 * N_8B
    assert abs(opt["optimizer_temporaries"] - 4 * N_8B) < 2**20
    assert m.peak_phase == "optimizer" and m.peak_allocated_bytes >= 20 * N_8B
    # the bf16 logits (b·s·V·2) and their fp32 upcast (·4) are alive at the forward peak
    assert m.phase_categories["forward"]["logits"] >= 256 * V * (2 + 4)
    assert m.step_time_s is None and m.device == "fake"


def test_pure_bf16_halves_state_bytes():
    recipe = Recipe(precision="bf16", optimizer="sgd-momentum", seq_len=32, micro_batch=2, grad_clip=None)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="cpu")
    m32 = measure_memory_from_config(TINY_LLAMA, recipe.model_copy(update={"precision": "fp32"}), device="cpu")
    o16, o32 = m.phase_categories["optimizer"], m32.phase_categories["optimizer"]
    assert o16["weights"] * 2 >= o32["weights"] >= o16["weights"] * 2 - 512 * 20  # rounding of small norms
    assert o16["optimizer_states"] == o16["weights"] == o16["gradients"]
    assert o16["autocast_weight_copies"] == 0


def test_lora_frozen_base_has_no_grads():
    recipe = Recipe(method="lora", precision="fp32", optimizer="adamw", seq_len=32, micro_batch=2,
                    lora_rank=4, grad_clip=None)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="cpu")
    lora = lora_param_bytes(TINY_LLAMA, 4)
    opt = m.phase_categories["optimizer"]
    assert opt["gradients"] == lora
    assert opt["optimizer_states"] == 2 * lora
    assert opt["optimizer_temporaries"] == lora


def test_full_recompute_reduces_activations():
    base = Recipe(precision="bf16-mixed", optimizer="sgd", seq_len=64, micro_batch=4)
    none = measure_memory_from_config(TINY_LLAMA, base, device="fake")
    full = measure_memory_from_config(TINY_LLAMA, base.model_copy(update={"recompute": "full"}), device="fake")
    assert full.phase_categories["forward"]["activations"] < none.phase_categories["forward"]["activations"]
    assert full.peak_allocated_bytes < none.peak_allocated_bytes


def test_eager_attention_keeps_scores_and_selective_recompute_drops_them():
    s, b, a = 128, 2, 4
    base = Recipe(precision="fp32", optimizer="sgd", seq_len=s, micro_batch=b, attention="eager")
    eager = measure_memory_from_config(TINY_LLAMA, base, device="fake")
    sdpa = measure_memory_from_config(TINY_LLAMA, base.model_copy(update={"attention": "sdpa"}), device="fake")
    sel = measure_memory_from_config(TINY_LLAMA, base.model_copy(update={"recompute": "selective"}), device="fake")
    scores = b * a * s * s * 4  # one layer's fp32 softmax output, saved for backward
    fwd = {k: x.phase_categories["forward"]["activations"] for k, x in
           (("eager", eager), ("sdpa", sdpa), ("sel", sel))}
    assert fwd["eager"] - fwd["sdpa"] >= 2 * scores  # both layers keep s×s probabilities
    # selective recompute of the attention core keeps no s×s tensor (only q, k, v and the mask)
    assert fwd["sel"] < fwd["sdpa"] + scores // 2


def test_grad_accum_keeps_grads_through_second_forward():
    recipe = Recipe(precision="fp32", optimizer="sgd", seq_len=32, micro_batch=1, grad_accum=2)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="fake")
    one = measure_memory_from_config(TINY_LLAMA, recipe.model_copy(update={"grad_accum": 1}), device="fake")
    assert m.phase_categories["forward"]["gradients"] == one.phase_categories["optimizer"]["gradients"]


@pytest.mark.parametrize("opt", ["adamw-fused", "sgd-momentum", "adafactor", "lion"])
def test_other_optimizers_run(opt):
    recipe = Recipe(precision="fp32", optimizer=opt, seq_len=16, micro_batch=1, grad_clip=None)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="fake")
    st = m.phase_categories["optimizer"]
    W = st["weights"]
    expected_states = {"adamw-fused": 2 * W, "sgd-momentum": W, "lion": W}
    if opt in expected_states:
        # fused AdamW also keeps one 4-byte step counter per parameter on the device
        extra = 512 * (2 * 9 + 3) if opt == "adamw-fused" else 0  # 9 tensors per layer + 3
        assert st["optimizer_states"] - expected_states[opt] == extra
    else:  # Adafactor: factored row/col second moments, far below W
        assert 0 < st["optimizer_states"] < W // 4


def test_inference_kv_cache_exact():
    recipe = Recipe(method="inference", precision="bf16", seq_len=64, micro_batch=2, generate_len=2)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="cpu")
    fwd = m.phase_categories["forward"]
    assert fwd["gradients"] == fwd["optimizer_states"] == 0
    L_, b, k, s, d = 2, 2, 2, 64, 16
    kv = L_ * 2 * r512(b * k * s * d * 2)  # L × (K, V) × b·k·s·d in bf16
    assert m.kv_cache_bytes == kv and m.peak_phase == "forward"  # the cache is whole at the peak
    assert fwd["activations"] >= kv  # the cache is counted inside the activations category
    assert fwd["logits"] == 0  # generate-style prefill keeps only the last position's logits
    assert set(m.phase_peaks) == {"forward", "decode"} and m.peak_phase == "forward"


@pytest.mark.parametrize("kw", [
    dict(precision="fp16-mixed"), dict(precision="fp16"), dict(recompute="full", recompute_layers=1),
    dict(dropout=0.1), dict(method="lora", lora_rank=8),
], ids=["fp16-mixed", "fp16", "recompute-1-layer", "dropout", "lora"])
def test_fake_equals_cpu_for_recipes(kw):
    recipe = Recipe(seq_len=32, micro_batch=2, **kw)
    real = measure_memory_from_config(TINY_LLAMA, recipe, device="cpu")
    fake = measure_memory_from_config(TINY_LLAMA, recipe, device="fake")
    assert (real.peak_allocated_bytes, real.phase_peaks) == (fake.peak_allocated_bytes, fake.phase_peaks)


def test_cpu_sdpa_with_dropout_materializes_scores():
    """CPU SDPA falls back to its math kernel when dropout > 0 (a documented CPU-vs-CUDA difference)."""
    b, a, s = 2, 4, 64
    base = Recipe(precision="fp32", optimizer="sgd", seq_len=s, micro_batch=b)
    m0 = measure_memory_from_config(TINY_LLAMA, base, device="fake")
    m1 = measure_memory_from_config(TINY_LLAMA, base.model_copy(update={"dropout": 0.1}), device="fake")
    extra = m1.phase_categories["forward"]["activations"] - m0.phase_categories["forward"]["activations"]
    assert extra >= 2 * b * a * s * s * 4  # at least one fp32 s×s tensor kept per layer
    assert any("dropout" in n for n in m1.notes)


def test_measure_memory_from_plan_and_to_dict(tmp_path):
    from trainledger.load.plan import PlanInputs, build_plan

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    plan = build_plan(PlanInputs(model=str(path), seq_len=32, micro_batch=2, precision="bf16-mixed"))
    m = measure_memory(plan, device="cpu")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["peak_allocated_bytes"] == m.peak_allocated_bytes
    assert d["peak_phase"] in ("forward", "backward", "optimizer", "zero_grad")
    assert sum(d["categories_at_peak"].values()) == m.peak_allocated_bytes
    assert d["env"]["torch"].startswith("2.") and d["step_time_s"] > 0
    assert any("autocast" in n for n in d["notes"])


@pytest.mark.parametrize("kw, words", [
    (dict(method="qlora"), "qlora"),
    (dict(optimizer="adamw-8bit"), "adamw-8bit"),
    (dict(precision="fp8-mixed"), "fp8"),
])
def test_unsupported_on_cpu_is_a_clear_error(kw, words):
    with pytest.raises(VerifyError, match=words):
        measure_memory_from_config(TINY_LLAMA, Recipe(seq_len=16, **kw), device="cpu")


def test_bad_device_and_steps():
    with pytest.raises(VerifyError, match="device"):
        measure_memory_from_config(TINY_LLAMA, Recipe(seq_len=16), device="tpu")
    with pytest.raises(VerifyError, match="steps"):
        measure_memory_from_config(TINY_LLAMA, Recipe(seq_len=16), device="cpu", steps=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_counters_agree_with_tracker():
    recipe = Recipe(precision="bf16-mixed", optimizer="adamw", seq_len=128, micro_batch=2)
    m = measure_memory_from_config(TINY_LLAMA, recipe, device="cuda")
    assert not m.oom and m.peak_reserved_bytes >= m.peak_allocated_bytes
    # the tracker misses only kernel-internal scratch: it may be lower, never higher
    assert m.tracker_peak_bytes <= m.peak_allocated_bytes
    assert m.tracker_peak_bytes >= 0.9 * m.peak_allocated_bytes


def test_cuda_autocast_policy_matches_cuda_op_lists():
    """CUDA's AT_FORALL_FP32 / AT_FORALL_FP32_SET_OPT_DTYPE ops give fp32 under the emulation."""
    import torch.nn.functional as F

    from trainledger.verify.autocast_cuda import CudaAutocastPolicy

    x, w, ln = torch.randn(4, 8), torch.randn(8, 8), torch.nn.LayerNorm(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = (x @ w).softmax(-1).dtype
    with CudaAutocastPolicy(), torch.autocast("cpu", dtype=torch.bfloat16):
        h = x @ w
        assert h.dtype == torch.bfloat16  # matmuls stay in the lower precision
        for out in (ln(h), F.softmax(h, -1), h.softmax(-1), h.pow(2), h**3, h.sum(), torch.exp(h),
                    F.log_softmax(h, dim=-1)):
            assert out.dtype == torch.float32
        assert F.softmax(h, dim=-1, dtype=torch.bfloat16).dtype == torch.bfloat16  # explicit dtype wins
        assert F.silu(h).dtype == torch.bfloat16  # not in CUDA's fp32 lists
    assert native == torch.bfloat16  # plain CPU autocast differs from CUDA here
    assert (x @ w).softmax(-1).dtype == torch.float32


def test_cuda_autocast_changes_gpt2_not_llama():
    """gpt2's gelu_new calls pow (fp32 on CUDA); Llama upcasts explicitly and is unaffected."""
    r = Recipe(precision="bf16-mixed", seq_len=32, micro_batch=2)
    llama = [measure_memory_from_config(TINY_LLAMA, r, device="fake", cuda_autocast=c).peak_allocated_bytes
             for c in (False, True)]
    gpt2 = [measure_memory_from_config(TINY_GPT2, r, device="fake", cuda_autocast=c).peak_allocated_bytes
            for c in (False, True)]
    assert llama[0] == llama[1]
    assert gpt2[1] > gpt2[0]


def test_timeline_keeps_the_peak():
    m = measure_memory_from_config(TINY_LLAMA, Recipe(seq_len=32, micro_batch=2), device="fake")
    assert 0 < len(m.timeline) <= 400
    assert max(b for _, b in m.timeline) == m.peak_allocated_bytes
    phases = [p for p, _ in m.timeline]
    assert phases.index("forward") < phases.index("backward") < phases.index("optimizer")


class _FakeCuda:
    """Stand-ins for torch.cuda's counters so the CUDA code path runs on a CPU machine."""

    def __init__(self):
        self.allocated, self.peak, self.resets = 1000, 1000, 0

    def install(self, monkeypatch):
        c = torch.cuda
        monkeypatch.setattr(c, "synchronize", lambda *a, **k: None)
        monkeypatch.setattr(c, "reset_peak_memory_stats", self._reset)
        monkeypatch.setattr(c, "max_memory_allocated", lambda *a, **k: self._bump())
        monkeypatch.setattr(c, "max_memory_reserved", lambda *a, **k: self.peak + 4096)
        monkeypatch.setattr(c, "memory_allocated", lambda *a, **k: self.allocated)
        monkeypatch.setattr(c, "empty_cache", lambda *a, **k: None)

    def _reset(self, *a, **k):
        self.resets += 1
        self.peak = self.allocated

    def _bump(self):
        self.peak += 512  # each phase "allocates" one more block
        return self.peak


def test_cuda_path_control_flow_without_a_gpu(monkeypatch):
    from trainledger.verify.build import build_model
    from trainledger.verify.cuda_run import run_cuda

    recipe = Recipe(precision="fp32", optimizer="sgd", seq_len=16, micro_batch=1)
    built = build_model(TINY_LLAMA, recipe, device="cpu")
    fc = _FakeCuda()
    fc.install(monkeypatch)
    m = run_cuda(built, recipe, steps=2, seed=0)
    assert not m.oom and m.device == "cuda"
    assert set(m.phase_peaks) == {"forward", "backward", "optimizer", "zero_grad"}
    assert m.peak_allocated_bytes == max(m.phase_peaks.values())
    assert m.peak_reserved_bytes == m.peak_allocated_bytes + 4096
    assert m.step_time_s > 0 and m.backward_forward_ratio > 0
    assert fc.resets >= 8  # reset_peak_memory_stats before every phase of both steps


def test_cuda_oom_is_a_result(monkeypatch):
    from trainledger.verify.build import build_model
    from trainledger.verify.cuda_run import run_cuda

    recipe = Recipe(precision="fp32", optimizer="sgd", seq_len=16, micro_batch=1)
    built = build_model(TINY_LLAMA, recipe, device="cpu")
    _FakeCuda().install(monkeypatch)

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(torch.Tensor, "backward", oom)
    m = run_cuda(built, recipe, steps=2, seed=0)
    assert m.oom and m.oom_phase == "backward"
    assert m.oom_message.startswith("does not fit: failed at backward with")
    assert "GiB allocated" in m.oom_message


def test_family_without_sdpa_falls_back_to_eager():
    """gemma2 has no SDPA path in transformers (logit soft-capping): measured with eager attention."""
    gemma2 = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
              "max_position_embeddings": 128, "sliding_window": 16}
    recipe = Recipe(seq_len=32, micro_batch=1, precision="fp32", optimizer="sgd")
    m = measure_memory_from_config(gemma2, recipe, device="fake")
    assert any("eager" in n for n in m.notes)
    eager = measure_memory_from_config(gemma2, recipe.model_copy(update={"attention": "eager"}), device="fake")
    assert m.peak_allocated_bytes == eager.peak_allocated_bytes
