"""Step-time mechanisms of issue 15 (items 2-4): wave quantization of split TP GEMMs (AsyncTP),
op-level SAC re-gathering sequence-parallel activations, context-parallel K/V exchange and merge.

Expected values are derived by hand from the mechanism, not read back from the model.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.efficiency import for_gpu, gemm_time_s, wave_efficiency
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import PlanInputs, build_plan


def _plan(**kw):
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, seq_len=8192,
                framework="fsdp2")
    base.update(kw)
    return build_plan(PlanInputs(**base))


def test_wave_quantization_on_hopper_by_hand():
    eff = for_gpu(load_gpu("h100-sxm"))
    # 132 SMs, 128x256 tiles: (12288 x 512) -> 96 x 2 = 192 tiles -> 2 waves of 132 slots
    assert wave_efficiency(12288, 512, eff) == pytest.approx(192 / 264)
    # the unsplit (98304 x 512): 768 x 2 = 1536 tiles -> 12 waves
    assert wave_efficiency(98304, 512, eff) == pytest.approx(1536 / 1584)
    # fewer tiles than SMs and a deep K: split-K over min(132 // 16, 16384 // 256) = 8 -> 128 tiles
    assert wave_efficiency(2048, 128, eff, K=16384) == pytest.approx(128 / 132)
    # a shallow K cannot be split: 16 tiles in one wave of 132
    assert wave_efficiency(2048, 128, eff, K=256) == pytest.approx(16 / 132)
    # K limits the split: each split keeps 4 stages of 64-deep K tiles busy (CUTLASS sm90 mainloop
    # defaults), so K = 1024 splits 1024 / (4 * 64) = 4 ways: 64 tiles
    assert wave_efficiency(2048, 128, eff, K=1024) == pytest.approx(64 / 132)
    assert wave_efficiency(2048, 128, eff, K=1023) == pytest.approx(48 / 132)


def test_asynctp_split_costs_thin_shards_only():
    opts = TimeOptions(tp_comm_overlap=True)
    small = estimate_compute(_plan(gpus=64, tp=8, micro_batch=12, global_batch=96), opts)
    vanilla = estimate_compute(_plan(gpus=64, tp=8, micro_batch=12, global_batch=96))
    assert small.breakdown.get("tp_split_waves", 0) > 0.02 * small.compute_parts["matmul"]
    assert "tp_split_waves" not in vanilla.breakdown          # no overlap, no split
    # Megatron-Core's userbuffer overlap is not modelled as a split (its profile has no chunks)
    mc = estimate_compute(_plan(gpus=64, tp=8, micro_batch=12, global_batch=96,
                                framework="megatron-core", zero=1), opts)
    assert "tp_split_waves" not in mc.breakdown


def test_op_level_sac_regathers_the_sequence_parallel_activations():
    # per layer: 2 all-reduce equivalents forward + 2 backward; SAC re-runs the two SP all-gathers
    # (one more all-reduce's traffic); +2 for embedding/head. Same collective size in both plans.
    L = 32
    none = estimate_compute(_plan(gpus=8, tp=8, micro_batch=1, global_batch=8, recompute="none"))
    sac = estimate_compute(_plan(gpus=8, tp=8, micro_batch=1, global_batch=8, recompute="selective"))
    assert sac.breakdown["comm_tp"] / none.breakdown["comm_tp"] == pytest.approx((5 * L + 2) / (4 * L + 2))
    mc_none = estimate_compute(_plan(gpus=8, tp=8, framework="megatron-core", zero=1, recompute="none"))
    mc_sel = estimate_compute(_plan(gpus=8, tp=8, framework="megatron-core", zero=1,
                                    recompute="selective"))
    assert mc_sel.breakdown["comm_tp"] == pytest.approx(mc_none.breakdown["comm_tp"])


def test_megatron_selective_recompute_reruns_the_flash_attention_forward():
    # Megatron-Core checkpoints core_attention under recompute_granularity=selective whatever
    # kernel computes it (attention.py _checkpointed_attention_forward): the flash/cuDNN forward
    # runs again in the backward. Per layer and token a causal forward is 2·heads·(d_qk + d_v)
    # FLOPs per attended key, (s + 1) / 2 keys on average: 32 layers, 32 heads, d 128, s 8192.
    mc = {rc: estimate_compute(_plan(framework="megatron-core", zero=1, recompute=rc))
          for rc in ("none", "selective")}
    tokens = mc["none"].tokens_per_step
    extra = (mc["selective"].flops.hardware - mc["none"].flops.hardware) / tokens
    assert extra == pytest.approx(32 * 2 * 32 * 256 * 8192 / 2, rel=1e-3)
    # the attention kernel time: forward 1 + backward 2.5 (the flash backward's recomputed QKᵀ),
    # plus the re-run forward
    att = {rc: e.compute_parts["attention"] for rc, e in mc.items()}
    assert att["selective"] / att["none"] == pytest.approx(4.5 / 3.5)
    # torchtitan's op-level SAC keeps the SDPA output: the kernel does not run again
    tt = {rc: estimate_compute(_plan(recompute=rc)).compute_parts["attention"] for rc in ("none", "selective")}
    assert tt["selective"] == pytest.approx(tt["none"])


def test_context_parallel_merge_grows_with_the_ring_steps():
    # same tokens per rank (s/c = 16384), c = 2 vs 4: the merge per layer runs c steps over the
    # same output, so it doubles
    p2 = estimate_compute(_plan(gpus=8, cp=2, seq_len=32768, recompute="full"))
    p4 = estimate_compute(_plan(gpus=8, cp=4, seq_len=65536, recompute="full"))
    assert p4.breakdown["cp_merge"] / p2.breakdown["cp_merge"] == pytest.approx(2.0)
    mc = estimate_compute(_plan(gpus=8, cp=2, seq_len=32768, recompute="full", framework="megatron-core",
                                zero=1))
    assert "cp_merge" not in mc.breakdown


def test_allgather_rotation_hides_behind_the_diagonal_step_only():
    # 405B-like CP across nodes (TP 8 inside the node): the all-gather of c chunks of expanded
    # K/V waits after the first of c steps; the ring (P2P per step) hides behind all c steps
    kw = dict(model="llama-3.1-405b", gpus=64, tp=8, cp=8, seq_len=262144, recompute="full",
              gpu="h100-sxm-96gb", network="roce-400", micro_batch=1, global_batch=1)
    fsdp2 = estimate_compute(_plan(**kw))
    assert fsdp2.breakdown.get("comm_cp", 0) > 0
    mc = estimate_compute(_plan(**dict(kw, framework="megatron-core", zero=1)))
    assert mc.breakdown.get("comm_cp", 0) == 0 and mc.hidden_comm.get("cp", 0) > 0


# -- context parallelism under torchtitan / FSDP2 (torch context_parallel, all-gather rotater) --

def _cp8b(**kw):
    # Llama-3.1-8B, 32768 tokens per rank, one node of NVLink H100s, full AC (as torchtitan Table 2)
    base = dict(gpus=8, cp=2, seq_len=65536, recompute="full", micro_batch=1, global_batch=4)
    base.update(kw)
    return _plan(**base)


def test_compiled_context_parallel_exchanges_are_all_exposed():
    # torch.compile traces the ring into the block's graph, where each functional collective is
    # waited on at once; eager overlaps part of it. The traffic is the same either way: what
    # eager hides plus what it exposes is what the compiled run exposes.
    p = _cp8b()
    eager = estimate_compute(p)
    compiled = estimate_compute(p, TimeOptions(runtime="megatron"))
    assert eager.hidden_comm.get("cp", 0) > 0
    assert compiled.hidden_comm.get("cp", 0) == 0
    assert compiled.breakdown["comm_cp"] == pytest.approx(
        eager.breakdown.get("comm_cp", 0) + eager.hidden_comm["cp"])
    # Megatron-Core's TE ring keeps overlapping with fused kernels (no cp_fused_sync)
    mc = estimate_compute(_cp8b(framework="megatron-core", zero=1), TimeOptions(runtime="megatron"))
    assert mc.hidden_comm.get("cp", 0) > 0


def test_last_dkv_send_of_each_layer_backward_is_exposed():
    # eager, intra-node: the K/V all-gather (c-1 chunks of 0.5 GiB) hides behind the diagonal
    # step and every dK/dV send behind the next step's backward, except the last one, waited
    # after the loop (_templated_ring_attention_backward: dkv_rotater.next_buffer() after it).
    # One fp32 send of the expanded dK|dV per layer: 32768 tok x 2 x 4096 x 4 B = 1 GiB.
    from trainledger.estimate.time.comm import topology
    p = _cp8b()
    lay = p.layout
    topo = topology(p.cluster, lay.tp, lay.cp, lay.ep, lay.dp_size, lay.pp)
    dkv = 32768 * 2 * 4096 * 4 / topo.cp.beta + topo.cp.alpha
    est = estimate_compute(p)
    assert est.breakdown["comm_cp"] == pytest.approx(32 * dkv)


def test_compiled_merge_is_fused_and_drops_the_kv_copies():
    # per step and output element: eager 35 B forward (x2 with full AC) + 54 B backward, plus c
    # copies (read+write) of the expanded K|V chunk per pass -- 2 elements x 2 B x 2 = 8 B per
    # output element per copy, 3 passes; compiled 10 + 10 + 30 and no copies (stacks/fsdp2.yaml)
    p = _cp8b()
    eager = estimate_compute(p).breakdown["cp_merge"]
    compiled = estimate_compute(p, TimeOptions(runtime="megatron")).breakdown["cp_merge"]
    assert compiled / eager == pytest.approx((2 * 10 + 30) / (2 * 35 + 54 + 3 * 8))


def test_attention_kernel_efficiency_follows_the_rank_chunk_not_the_sequence():
    # cp=2 at 2S against cp=1 at S: the same S tokens per rank, causal keys (2S+1)/2 against
    # (S+1)/2; every blockwise kernel runs on S keys, so its speed is the cp=1 kernel's and the
    # attention time scales with the keys only (at S = 1024 the kernel rate still grows with s:
    # 1024/(1024+512) against 2048/(2048+512) on Hopper would be a 20% difference)
    one = estimate_compute(_plan(gpus=8, seq_len=1024, micro_batch=1, global_batch=8))
    two = estimate_compute(_plan(gpus=8, cp=2, seq_len=2048, micro_batch=1, global_batch=4))
    ratio = two.compute_parts["attention"] / one.compute_parts["attention"]
    assert ratio == pytest.approx((2048 + 1) / (1024 + 1))


def test_float8_tp_all_gathers_move_one_byte():
    # torchao Float8 TP styles cast before the sequence-parallel all-gather (forward) and before
    # the backward all-gather of the reduce-scatter's output gradient; reduce-scatters stay bf16.
    # Full AC, 32 layers: 2+2+2 all-reduce equivalents per layer (+2 outside the layers) = 194,
    # of which 192 all-gathers at half the bytes: each saves a quarter of an all-reduce's
    # bandwidth time -> 1 - 192/4/194 of the bf16 time (the large activation makes latency small)
    from trainledger.estimate.time.stack import stack_profile
    kw = dict(gpus=8, tp=8, micro_batch=8, global_batch=8, recompute="full")
    bf16 = _plan(**kw)
    fp8 = _plan(precision="fp8-mixed", **kw)
    launch = 194 * stack_profile("fsdp2", bf16.cluster.gpu).collective_launch_s
    t16 = estimate_compute(bf16).breakdown["comm_tp"] - launch
    t8 = estimate_compute(fp8).breakdown["comm_tp"] - launch
    assert t8 / t16 == pytest.approx(1 - 192 / 4 / 194, rel=0.01)
    # without sequence parallelism TP all-reduces 16-bit GEMM outputs: nothing is gathered in fp8
    nosp = dict(kw, sp=False)
    assert estimate_compute(_plan(precision="fp8-mixed", **nosp)).breakdown["comm_tp"] == pytest.approx(
        estimate_compute(_plan(**nosp)).breakdown["comm_tp"])
# Megatron's vocab-parallel cross-entropy, bytes per logit counted from its ops by hand
# (megatron/core/tensor_parallel/cross_entropy.py @ core_r0.8.0): unfused forward .float() 2 + 4,
# max 4, subtract 4 + 4, exp 4 + 4, sum 4, divide 4 + 4; backward multiply 4 + 4, cast down 4 + 2.
# Fused (megatron/core/fusions/fused_cross_entropy.py): cast+max 2 + 4, subtract+exp+sum 4 + 4,
# divide 4 + 4; backward multiply+cast 4 + 2.
MEGATRON_XENT_UNFUSED = (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 4) + (4 + 2)
MEGATRON_XENT_FUSED = (2 + 4) + (4 + 4) + (4 + 4) + (4 + 2)


def test_megatron_cross_entropy_passes_over_the_logits():
    assert (MEGATRON_XENT_UNFUSED, MEGATRON_XENT_FUSED) == (52, 28)
    gpu = load_gpu("h100-sxm")
    kw = dict(framework="megatron-core", zero=1, gpus=8, seq_len=4096, micro_batch=1,
              global_batch=8)
    unfused = estimate_compute(_plan(**kw))
    fused = estimate_compute(_plan(fused_loss=True, **kw))
    V, tokens = 128256, 4096  # llama-3.1-8b vocabulary, one micro-batch of one sequence, tp 1
    hbm = gpu.hbm_bytes_per_s * for_gpu(gpu).hbm
    diff = unfused.compute_parts["elementwise"] - fused.compute_parts["elementwise"]
    assert diff == pytest.approx(tokens * V * (MEGATRON_XENT_UNFUSED - MEGATRON_XENT_FUSED) / hbm)
    # only Megatron-Core's profile has a fused byte count: on PyTorch stacks the flag changes the
    # loss's memory (estimate/memory/model.py), not the step time
    kw_t = dict(gpus=8, seq_len=4096, micro_batch=1, global_batch=8)
    assert estimate_compute(_plan(fused_loss=True, **kw_t)).step_time_s == \
        pytest.approx(estimate_compute(_plan(**kw_t)).step_time_s)
    prof = fused.to_dict()["stack_profile"]
    assert (prof["xent_bytes_per_vocab"], prof["xent_bytes_per_vocab_fused"]) == \
        (MEGATRON_XENT_UNFUSED, MEGATRON_XENT_FUSED)
    p = _plan(fused_loss=True, **kw)
    assert p.runtime.summary()["fused_loss"] is True
    assert _plan(fused_loss=True, **kw_t).runtime.summary()["fused_loss"] is True
    assert "fused_loss" not in _plan(**kw_t).runtime.summary()


def test_fp8_gemm_half_depth_along_k_is_twice_the_16bit_one():
    # A tile's fixed cost stays while the fp8 main loop runs twice as fast, so the K depth at which
    # the two are equal doubles: at K = half_dim a 16-bit GEMM runs at 1/2 of eta_max along K, an
    # fp8 one at 1/3 (half_dim / (half_dim + 2 half_dim)); M and N are large enough not to matter.
    eff = for_gpu(load_gpu("h100-sxm"))
    d = eff.half_dim
    big = 1e12
    t16 = gemm_time_s(big, d, big, 1e15, 1e30, eff, 1.0, 2.0)
    t8 = gemm_time_s(big, d, big, 1e15, 1e30, eff, 1.0, 1.0)
    assert t8 / t16 == pytest.approx(1.5, rel=1e-6)
    # deep K: both approach eta_max, the fp8 one from further below
    t16, t8 = (gemm_time_s(big, 64 * d, big, 1e15, 1e30, eff, 1.0, b) for b in (2.0, 1.0))
    assert t8 / t16 == pytest.approx((1 + 2 / 64) / (1 + 1 / 64), rel=1e-6)


def test_quantized_gemm_writes_a_16bit_output():
    # A memory-bound GEMM (shallow K, unbounded tensor rate) moves its inputs at their width and
    # its M×N output in bf16: fp8 (1 byte) and nvfp4 (0.5) inputs, a 2-byte output (TE and torchao
    # scaled GEMMs emit bf16); a 16-bit GEMM moves 2 bytes everywhere, tf32/fp32 4.
    eff = for_gpu(load_gpu("h100-sxm"))
    M = N = 8192
    K = 16
    bw = 1e12 * eff.hbm
    for b, out in ((1.0, 2.0), (0.5, 2.0), (2.0, 2.0), (4.0, 4.0)):
        t = gemm_time_s(M, K, N, 1e30, 1e12, eff, 1.0, b)
        assert t == pytest.approx((b * (M * K + K * N) + out * M * N) / bw, rel=1e-9)


@pytest.mark.parametrize("framework", ["pytorch-fsdp", "fsdp2"])
def test_fsdp_bf16_reduce_halves_the_gradient_reduce_scatter(framework):
    # MixedPrecision(reduce_dtype=bf16) (Composer's 'PURE'): each layer's reduce-scatter moves 2
    # bytes per parameter instead of the fp32 gradient's 4. A ring reduce-scatter of S bytes over n
    # ranks costs (n-1)/n * S / beta plus a latency that does not depend on S, so summed over the
    # layers the FSDP traffic (exposed + hidden) of one micro-batch drops by (n-1)/n * 2 * P / beta.
    from trainledger.estimate.time.efficiency import link_efficiency
    from trainledger.estimate.time.step import topology
    kw = dict(framework=framework, precision="bf16-mixed", micro_batch=1, global_batch=8, seq_len=2048)
    f32, b16 = _plan(**kw), _plan(**kw, reduce_dtype="bf16")
    assert f32.runtime.reduce_dtype == "fp32"
    c32, c16 = estimate_compute(f32), estimate_compute(b16)
    lay = f32.layout
    beta = topology(f32.cluster, lay.tp, lay.cp, lay.ep, lay.dp_size, lay.pp, link_efficiency(),
                    lay.expert_tp).dp.beta
    n = lay.dp_size
    traffic = [c.breakdown["comm_dp"] + c.hidden_comm.get("dp", 0.0) for c in (c32, c16)]
    P = f32.model.params.total  # pp = 1: the stage holds every parameter
    grad_accum = f32.recipe.grad_accum
    assert traffic[0] - traffic[1] == pytest.approx(grad_accum * (n - 1) / n * 2.0 * P / beta, rel=1e-6)


def test_distributed_optimizer_bf16_gradient_buffer_halves_the_reduce_scatter():
    # ZeRO-1 (Megatron-Core DistributedOptimizer; --grad-reduce-in-bf16 / NeMo grad_sync_dtype bf16):
    # one reduce-scatter of the whole gradient per step, 2 bytes per parameter instead of 4; the
    # bf16 parameter all-gather is the same in both. Ring: (n-1)/n * S / beta plus an S-free latency.
    from trainledger.estimate.time.efficiency import link_efficiency
    from trainledger.estimate.time.step import topology
    kw = dict(framework="megatron-core", precision="bf16-mixed", zero=1, gpus=16, micro_batch=1,
              global_batch=64, seq_len=2048)
    f32, b16 = _plan(**kw), _plan(**kw, reduce_dtype="bf16")
    lay = f32.layout
    beta = topology(f32.cluster, lay.tp, lay.cp, lay.ep, lay.dp_size, lay.pp, link_efficiency(),
                    lay.expert_tp).dp.beta
    n = lay.dp_size
    c32, c16 = estimate_compute(f32), estimate_compute(b16)
    traffic = [c.breakdown["comm_dp"] + c.hidden_comm.get("dp", 0.0) for c in (c32, c16)]
    P = f32.model.params.total
    assert traffic[0] - traffic[1] == pytest.approx((n - 1) / n * 2.0 * P / beta, rel=1e-6)


def test_fsdp2_pipeline_stage_keeps_its_gathered_weights_by_default():
    """fsdp2 under PP, reshard_after_forward unstated: the stage keeps its gathered parameters
    across micro-batches (torchtitan's default policy), so it gathers once per step instead of in
    every micro-batch's forward and backward. The default equals the stated False, and with m
    micro-batches a stage that reshards (True) moves more all-gather traffic and holds fewer
    gathered bytes at its peak; without PP the default is True."""
    from trainledger.estimate.memory import estimate_memory
    kw = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=16, zero=3, pp=2, seq_len=4096,
              framework="fsdp2", micro_batch=1, grad_accum=8)
    dflt, keep, free = (_plan(**kw), _plan(**kw, reshard_after_forward=False),
                        _plan(**kw, reshard_after_forward=True))
    assert dflt.runtime.reshard_after_forward is None
    t = [estimate_compute(p) for p in (dflt, keep, free)]
    traffic = [c.breakdown["comm_dp"] + c.hidden_comm.get("dp", 0.0) + c.breakdown.get("fsdp_copy", 0.0)
               for c in t]
    assert traffic[0] == traffic[1] and t[0].step_time_s == t[1].step_time_s
    assert traffic[2] > 2 * traffic[1]  # every micro-batch's backward gathers again
    m = [estimate_memory(p).peak_allocated_bytes for p in (dflt, keep, free)]
    assert m[0] == m[1] > m[2]
    assert _plan(**{**kw, "pp": 1}).runtime.reshards_after_forward(1) is True
