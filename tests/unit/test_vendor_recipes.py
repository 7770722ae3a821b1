"""Current vendor tables: MXFP8 / NVFP4 recipes, Megatron MoE parallel folding (EP > DP, ETP).

Expected values come from the format specifications, the datasheets and the model's published
dimensions, worked out by hand here — never from our own output.
"""

from __future__ import annotations

import pytest

from trainledger.errors import LayoutError, PlanError
from trainledger.estimate.memory.model import Parts, model_states
from trainledger.estimate.time import estimate_compute, matmul_dtype
from trainledger.load.catalog import load_gpu
from trainledger.load.hf import load_model
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.spec.recipe import Recipe
from trainledger.units import DTYPE_BYTES


def plan(**kw):
    kw.setdefault("model", "llama-3.1-8b")
    kw.setdefault("gpu", "b200")
    kw.setdefault("method", "pretrain")
    return build_plan(PlanInputs(**kw))


def parts(**kw) -> Parts:
    x = Parts()
    model_states(plan(**kw), x)
    return x


# ------------------------------------------------------------------ formats
def test_block_scaled_bytes_per_element_follow_the_specs():
    """OCP MX v1.0 Table 1: MXFP8 = 32 8-bit elements + one 8-bit E8M0 scale; MXFP4 = 32 4-bit
    E2M1 elements + one E8M0 scale. NVFP4 (arXiv:2509.25149, "NVFP4 format"): 16 E2M1 elements + one E4M3 scale."""
    assert DTYPE_BYTES["mxfp8"] == (32 * 8 + 8) / 32 / 8 == 1.03125
    assert DTYPE_BYTES["mxfp4"] == (32 * 4 + 8) / 32 / 8 == 0.53125
    assert DTYPE_BYTES["nvfp4"] == (16 * 4 + 8) / 16 / 8 == 0.5625


def test_blackwell_datasheet_fp4_and_mx_rates():
    """Dense = half the starred (sparse) datasheet figure: HGX B200 FP4 18* PF; HGX B300 108 PF
    dense / 8; GB200 NVL72 1,440* PF / 72; GB300 NVL72 1,080 PF dense / 72. MXFP8 at the FP8 rate."""
    expect = {"b200": 9000, "b300": 13500, "gb200": 10000, "gb300": 15000}
    for name, fp4 in expect.items():
        g = load_gpu(name)
        assert g.fp4_tflops == fp4
        assert g.mxfp8_tflops == g.fp8_tflops
        assert g.peak_flop_per_s("nvfp4") == fp4 * 1e12


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "a100-sxm-80gb", "mi300x"])
@pytest.mark.parametrize("precision,field", [("mxfp8-mixed", "mxfp8_tflops"), ("nvfp4-mixed", "fp4_tflops")])
def test_gpus_without_block_scaled_tensor_cores_refuse_the_recipe(gpu, precision, field):
    with pytest.raises(PlanError) as e:
        plan(gpu=gpu, precision=precision)
    assert field in str(e.value) and e.value.field == "precision"


def test_block_scaled_recipes_are_training_only():
    with pytest.raises(PlanError, match="--quantization nvfp4"):
        plan(method="inference", precision="nvfp4-mixed")


# ------------------------------------------------------------------ memory
# Llama-3.1-8B (config.json): h 4096, 32 layers, 32 query / 8 KV heads of 128, FFN 14336.
H, L, KV, F = 4096, 32, 1024, 14336
LINEAR_PER_LAYER = 2 * H * H + 2 * H * KV + 3 * H * F  # q, o; k, v; gate, up, down (no biases)


def test_mxfp8_keeps_rowwise_and_columnwise_quantized_weights():
    """TE saves each linear's MXFP8 weight with both usages: 2 × (1 + 1/32) bytes per weight of
    every decoder linear layer (the lm_head is not quantized)."""
    x = parts(precision="mxfp8-mixed", framework="megatron-core")
    assert x.copies == pytest.approx(L * LINEAR_PER_LAYER * 2 * 1.03125, rel=1e-12)
    assert x.copies_head == 0


def test_nvfp4_copies_leave_out_the_bf16_layers():
    """NVFP4 keeps ceil(32 · 10/62) = 6 of 32 layers in bf16 (the paper keeps 10 of 62): 26 layers
    of 2 × (0.5 + 1/16) bytes per weight."""
    x = parts(precision="nvfp4-mixed", framework="megatron-core")
    assert x.copies == pytest.approx(26 * LINEAR_PER_LAYER * 2 * 0.5625, rel=1e-12)
    y = parts(precision="nvfp4-mixed", framework="megatron-core", fp4_bf16_layers=0)
    assert y.copies == pytest.approx(32 * LINEAR_PER_LAYER * 2 * 0.5625, rel=1e-12)


def test_nvfp4_bf16_layer_count_follows_the_paper():
    r = Recipe(precision="nvfp4-mixed")
    assert r.bf16_layers(62) == 10  # arXiv:2509.25149, "selective high-precision layers": first two and last eight of 62 blocks
    assert r.bf16_layers(32) == 6
    assert Recipe(precision="mxfp8-mixed").bf16_layers(62) == 0


def test_block_scaled_recipes_keep_fp32_weight_gradients():
    """hf stack: fp8-mixed keeps bf16 gradients; the block-scaled recipes fp32 (NVFP4 paper §4)."""
    fp8, mx = parts(precision="fp8-mixed"), parts(precision="mxfp8-mixed")
    assert mx.grads == pytest.approx(2 * fp8.grads)
    assert mx.weights == fp8.weights and mx.master == fp8.master


# ------------------------------------------------------------------ time
def test_gemm_dtype_and_rates():
    assert matmul_dtype(plan(precision="mxfp8-mixed")) == "mxfp8"
    assert matmul_dtype(plan(precision="nvfp4-mixed")) == "nvfp4"
    kw = dict(framework="megatron-core", gpus=8, zero=1)
    t_mx = estimate_compute(plan(precision="mxfp8-mixed", **kw)).compute_parts["matmul"]
    t_fp4 = estimate_compute(plan(precision="nvfp4-mixed", **kw)).compute_parts["matmul"]
    assert t_fp4 < t_mx


def test_nvfp4_with_every_layer_in_bf16_runs_the_bf16_gemms():
    """All decoder layers kept in bf16: the linear GEMMs take exactly the bf16 recipe's time."""
    kw = dict(framework="megatron-core", gpus=8, zero=1)
    hp = estimate_compute(plan(precision="nvfp4-mixed", fp4_bf16_layers=32, **kw)).compute_parts["matmul"]
    bf = estimate_compute(plan(precision="bf16-mixed", **kw)).compute_parts["matmul"]
    assert hp == pytest.approx(bf, rel=1e-12)


# ------------------------------------------------------------------ MoE parallel folding
MOE = dict(model="qwen3-30b-a3b", framework="megatron-core", gpus=8)


def test_megatron_folds_ep_beyond_dp():
    """tp 4 × dp 2 ranks hold ep 8 × etp 1 expert shards (arXiv:2504.14960): accepted."""
    p = plan(tp=4, ep=8, etp=1, **MOE)
    assert p.layout.dp_size == 2 and p.layout.expert_dp == 1


def test_other_stacks_keep_ep_within_dp():
    with pytest.raises(LayoutError) as e:
        plan(**{**MOE, "framework": "fsdp2"}, tp=4, ep=8, zero=3)
    assert e.value.field == "ep"
    with pytest.raises(LayoutError) as e:
        plan(**{**MOE, "framework": "hf"}, tp=2, etp=1)
    assert e.value.field == "etp"


def test_megatron_needs_etp_times_ep_to_divide_the_ranks():
    with pytest.raises(LayoutError, match="etp·ep"):
        plan(tp=4, ep=8, etp=2, **MOE)


def _experts() -> int:
    # Qwen3-30B-A3B config.json: 48 layers × 128 experts × (gate, up, down) of 2048 × 768
    return 48 * 128 * 3 * 2048 * 768


def test_expert_weights_divide_by_ep_times_etp():
    a = parts(tp=2, ep=4, etp=1, **MOE).weights
    b = parts(tp=2, ep=4, etp=2, **MOE).weights
    assert a - b == pytest.approx(2 * _experts() * (1 / 4 - 1 / 8), rel=1e-9)


def test_distributed_optimizer_shards_experts_over_the_expert_data_parallel_group():
    """tp 1, dp 8, ep 8: each rank holds 1/8 of the experts and no other rank holds them
    (EDP = 8 / 8 = 1), so their fp32 master copy is not sharded; dense parameters are (over 8)."""
    m = load_model("qwen3-30b-a3b")
    dense = m.params.total - m.params.breakdown["experts"]
    assert m.params.breakdown["experts"] == _experts()
    x = parts(ep=8, zero=1, **MOE)
    assert x.master == pytest.approx(4 * (dense / 8 + _experts() / 8), rel=1e-9)


# ------------------------------------------------------------------ FSDP + pipeline parallelism
def test_fsdp2_with_pipeline_stages_shards_only_the_stage():
    """torchtitan composes FSDP2 with PP: each stage fully_shards its own modules. Llama-3.1-8B on
    pp 2 × dp 4: the busiest (last) stage holds 16 layers (linears + 2 RMSNorms of h), the final
    norm and the untied lm_head (V = 128256), fp32, sharded 4 ways (every dimension divides by 4)."""
    V = 128256
    stage = 16 * (LINEAR_PER_LAYER + 2 * H) + V * H + H
    x = parts(model="llama-3.1-8b", gpu="h100-sxm", method="full", framework="fsdp2", gpus=8, pp=2, zero=3)
    assert x.weights == pytest.approx(4 * stage / 4, rel=1e-12)


# ------------------------------------------------------------------ launchers
def test_megatron_export_and_import_of_the_block_scaled_recipes(tmp_path):
    """Megatron-LM arguments (megatron/training/arguments.py): --fp8-recipe mxfp8; --fp4-format e2m1
    --fp4-recipe nvfp4 with --first-last-layers-bf16 and the layer counts at start and end."""
    from trainledger.runconfig.export import export_plan
    from trainledger.runconfig.importer import import_configs

    base = dict(model="llama-3.1-8b", gpu="b200", gpus=8, framework="megatron-core", tp=2, zero=1)
    for precision, flags in (("mxfp8-mixed", "--fp8-format e4m3 --fp8-recipe mxfp8"),
                             ("nvfp4-mixed", "--fp4-format e2m1 --fp4-recipe nvfp4 --first-last-layers-bf16 "
                                             "--num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 5")):
        (f,) = export_plan(PlanInputs(**base, precision=precision), "megatron")
        assert flags in " ".join(f.text.split())
        p = tmp_path / f"{precision}.sh"
        p.write_text(f.text)
        back = import_configs([p]).merged()
        assert back["precision"] == precision
        if precision == "nvfp4-mixed":
            assert back["fp4_bf16_layers"] == 6
    with pytest.raises(Exception, match="export megatron"):
        export_plan(PlanInputs(**base, precision="mxfp8-mixed"), "accelerate")


# ------------------------------------------------------------------ gpt-oss served in MXFP4
def test_gpt_oss_120b_served_with_mxfp4_experts_fits_one_80gb_gpu():
    """Experts in MXFP4 (0.5 + 1/32 bytes), everything else bf16, biases aside. gpt-oss-120b
    config.json: 36 layers, 128 experts of 2880 → 2·2880 and 2880 → 2880, 64 q / 8 kv heads of 64,
    vocabulary 201088 untied. OpenAI's model card: it "fits into a single 80GB GPU"."""
    from trainledger.estimate.serving.memory import weight_bytes

    h, L, E, V = 2880, 36, 128, 201088
    experts = L * E * (h * 2 * h + h * h) * (0.5 + 1 / 32)
    attention = L * (2 * h * 64 * 64 + 2 * h * 8 * 64) * 2
    router = L * h * E * 2
    ends = 2 * V * h * 2
    norms = (2 * L + 1) * h * 2
    p = plan(model="gpt-oss-120b", gpu="h100-sxm", method="inference", quantization="mxfp4")
    assert weight_bytes(p) == pytest.approx(experts + attention + router + ends + norms, rel=1e-9)
    assert weight_bytes(p) < 80e9
    with pytest.raises(PlanError, match="routed experts"):
        plan(model="llama-3.1-8b", method="inference", quantization="mxfp4")


def test_fabric_syncs_expert_gradients_over_the_expert_data_parallel_group():
    """16 GPUs, tp 4 × dp 4, ep 8, etp 1: EDP = 16/8 = 2 ranks, 8 GPUs apart (across the two
    nodes). Each rank holds 1/8 of the experts; fp32 main grads, ring all-reduce 2(2-1)/2 = 1 ×."""
    from trainledger.estimate.run.fabric import interconnect_section

    p = plan(model="qwen3-30b-a3b", framework="megatron-core", gpus=16, tp=4, ep=8, etp=1, zero=1)
    g = interconnect_section(p).values["groups"]
    assert g["edp"]["bytes_per_step"] == pytest.approx(_experts() / 8 * 4 * 1.0, rel=1e-12)
    assert g["edp"]["link"] != "nvlink5"  # the two ranks sit on different nodes
