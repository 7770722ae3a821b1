"""The memory meaning of --framework: DeepSpeed ZeRO terms against DeepSpeed's own estimators and
the ZeRO paper, DDP gradient_as_bucket_view, torch TP replication, runtime notes, export/import.

DeepSpeed cannot run on the CPU fake process group (its engine needs an accelerator and a real
communication backend), so its model-state terms are checked against
``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` (deepspeed
0.19, the functions behind ``..._all_live``) and against Rajbhandari et al. 2020 (arXiv:1910.02054),
Fig. 1 / §5: stage 1 2Ψ+2Ψ+KΨ/N, stage 2 2Ψ+(2+K)Ψ/N, stage 3 (2+2+K)Ψ/N with K = 12 for mixed
precision Adam (DeepSpeed adds the fp32 gradient partition the optimizer steps on: 4Ψ/N).
"""

from __future__ import annotations

import json

import pytest

from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.memory.model import Parts, model_states
from trainledger.load.plan import PlanInputs, build_plan

GIB = 2**30


def _plan(**kw):
    base = dict(model="llama-3.1-8b", gpu="a100-sxm-80gb", gpus=8)
    base.update(kw)
    return build_plan(PlanInputs(**base))


def _states(plan) -> Parts:
    x = Parts()
    model_states(plan, x)
    return x


def _psi(plan) -> int:
    return plan.model.params.total


@pytest.fixture(scope="module")
def ds():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


@pytest.mark.parametrize("gpus", [8, 64])
def test_zero2_model_states_equal_deepspeeds_estimator(ds, gpus):
    plan = _plan(framework="deepspeed", zero=2, gpus=gpus)
    x = _states(plan)
    ours = x.weights + x.master + x.states + x.grads + x.grads_static + x.opt_temp
    _, gpu = ds[0](_psi(plan), num_gpus_per_node=min(gpus, 8), num_nodes=max(gpus // 8, 1), cpu_offload=False)
    assert ours == pytest.approx(gpu, rel=1e-6)
    # ZeRO paper, stage 2 (P_os+g): 2Ψ + (2 + 12)Ψ/N, plus DeepSpeed's fp32 gradient partition 4Ψ/N
    psi = _psi(plan)
    assert ours == pytest.approx(2 * psi + (2 + 12 + 4) * psi / gpus, rel=1e-6)


def test_zero2_offload_gpu_and_host_equal_deepspeeds_estimator(ds):
    plan = _plan(framework="deepspeed", zero=2, offload="optimizer")
    x = _states(plan)
    cpu, gpu = ds[0](_psi(plan), num_gpus_per_node=8, num_nodes=1, cpu_offload=True)
    assert x.weights + x.master + x.states + x.grads + x.grads_static + x.opt_temp == pytest.approx(gpu, rel=1e-6)
    # DeepSpeed's host figure is max(4·gpus, 16)·Ψ·1.5 per node: the 4·gpus is every rank loading
    # the fp32 model; the training-time part is the 16Ψ (master + Adam + fp32 grads) · 1.5
    assert x.host * 8 == pytest.approx(16 * _psi(plan) * 1.5, rel=1e-6)
    assert cpu == pytest.approx(max(4 * 8, 16) * _psi(plan) * 1.5, rel=1e-6)


@pytest.mark.parametrize("offload", ["none", "optimizer"])
def test_zero3_model_states_equal_deepspeeds_estimator(ds, offload):
    plan = _plan(model="llama-3.1-70b", gpu="h100-sxm", framework="deepspeed", zero=3, offload=offload)
    x = _states(plan)
    psi = _psi(plan)
    largest = plan.model.vocab_size * plan.model.hidden_size  # DeepSpeed's largest module: embedding
    cpu, gpu, largest_mem = ds[1](psi, largest, num_gpus_per_node=8, num_nodes=1,
                                  cpu_offload=offload != "none", cpu_offload_params=False, zero_init=True)
    from trainledger.estimate.memory.runtimes import _persistent_params

    persist = 2 * _persistent_params(plan, 100_000)  # norms stay whole (param_persistence_threshold)
    ours = x.weights + x.master + x.states + x.grads + x.grads_static + x.opt_temp - persist
    assert ours + largest_mem == pytest.approx(gpu, rel=1e-6)
    # the buffers hold at least DeepSpeed's 4·largest layer (its gathered weights and gradients)
    assert x.zero_buf >= largest_mem
    if offload != "none":
        assert x.host * 8 == pytest.approx(cpu, rel=1e-6)


def test_issue_cases_fit_under_deepspeed_semantics():
    """The two cases of issue 14: judged under torch-AMP semantics they did not fit."""
    z2 = _plan(framework="deepspeed", zero=2)
    e = estimate_memory(z2)
    assert e.fits and e.breakdown["weights"] == pytest.approx(2 * _psi(z2), rel=1e-6)
    assert not estimate_memory(_plan(zero=2)).fits  # hf: fp32 weights + autocast copies on every GPU
    z3 = _plan(model="llama-3.1-70b", gpu="h100-sxm", framework="deepspeed", zero=3, offload="optimizer",
               recompute="full")
    e3 = estimate_memory(z3)
    assert e3.fits and e3.breakdown["weights"] < 2 * _psi(z3) / 8 * 1.01
    assert any("deepspeed" in n for n in e3.notes)


def test_ds_bucket_sizes_change_the_buffers():
    small = _states(_plan(framework="deepspeed", zero=2, ds_reduce_bucket_size=50_000_000))
    dflt = _states(_plan(framework="deepspeed", zero=2))
    assert dflt.zero_buf == 500_000_000 * 2  # DeepSpeed default 5e8 elements, 16-bit
    assert small.zero_buf == 50_000_000 * 2
    assert _states(_plan(framework="deepspeed", zero=2, ds_overlap_comm=True)).zero_buf == 2 * dflt.zero_buf


def test_ddp_gradient_as_bucket_view_drops_the_copy():
    plain = estimate_memory(_plan(model="llama-3.2-1b"))
    view = estimate_memory(_plan(model="llama-3.2-1b", gradient_as_bucket_view=True))
    grads = 4 * _psi(_plan(model="llama-3.2-1b"))
    assert plain.phases["optimizer"] - view.phases["optimizer"] == pytest.approx(grads, rel=1e-6)


def test_hf_single_gpu_unchanged_by_runtime_fields():
    a = estimate_memory(_plan(model="llama-3.2-1b", gpus=1))
    b = estimate_memory(_plan(model="llama-3.2-1b", gpus=1, reshard_after_forward=False, wrap="layers+embed+head",
                              loss_parallel=True))
    assert a.breakdown == b.breakdown


def test_torch_tp_keeps_embedding_and_logits_replicated():
    m = _plan(model="llama-3.2-1b", gpus=2, tp=2, sp=False, framework="megatron-core")
    t = _plan(model="llama-3.2-1b", gpus=2, tp=2, sp=False)
    lp = _plan(model="llama-3.2-1b", gpus=2, tp=2, sp=False, loss_parallel=True)
    V, h, T = 128256, 2048, 4096
    et, em, elp = (estimate_memory(p) for p in (t, m, lp))
    # replicated head output: log-softmax backward holds 3 fp32 tensors of the whole vocabulary
    assert et.breakdown["logits"] == pytest.approx(12 * V * T, rel=1e-9)
    # Megatron's vocab-parallel cross entropy: bf16 logits + one fp32 copy (softmax, then its
    # gradient, in place) of V/t columns (megatron/core/fusions/fused_cross_entropy.py)
    assert em.breakdown["logits"] == pytest.approx(6 * V * T / 2, rel=1e-9)
    # loss_parallel: torch's local log-softmax on V/t columns; its fused nll+log-softmax backward
    # holds the saved output, zeros_like, exp and their sum (torch/distributed/tensor/parallel/loss.py)
    assert elp.breakdown["logits"] == pytest.approx(16 * V * T / 2, rel=1e-9)
    # decoder projections split in two, the (tied) embedding and the norms whole: fp32 on each rank
    pc = t.model.params
    expected = 4 * (sum(pc.per_layer) / 2 + pc.embedding + h)
    norms = pc.breakdown.get("norms", 0) - h  # layer norms are replicated too
    assert _states(t).weights == pytest.approx(expected + 4 * norms / 2, rel=1e-6)
    del T, V


def test_fsdp2_shards_with_dim0_padding():
    """qwen2.5-0.5b's k_proj has 128 rows: over 256 ranks rank 0 still holds one row."""
    from trainledger.estimate.memory.runtimes import shapes

    p = _plan(model="qwen2.5-0.5b", gpus=256, gpus_per_node=8, framework="fsdp2")
    s = shapes(p)
    assert s.layer_local * 256 > s.layer_full  # padding
    assert _states(p).weights == pytest.approx(4 * (s.layers_local + s.emb_local + s.head_local + s.norm_local))


def test_framework_named_in_notes_and_json():
    e = estimate_memory(_plan(framework="fsdp2"))
    assert any(n.startswith("runtime fsdp2") for n in e.notes)


def test_deepspeed_export_import_round_trip(tmp_path):
    from trainledger.runconfig.export import export_plan
    from trainledger.runconfig.importer import import_configs

    inputs = PlanInputs(model="llama-3.1-8b", gpu="a100-sxm-80gb", gpus=8, zero=2, ds_reduce_bucket_size=200_000_000)
    (f,) = export_plan(inputs, "deepspeed")
    cfg = json.loads(f.text)
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 200_000_000
    path = tmp_path / "ds_config.json"
    path.write_text(f.text)
    res = import_configs([path])
    merged = res.merged()
    assert merged["framework"] == "deepspeed" and merged["ds_reduce_bucket_size"] == 200_000_000
    back = PlanInputs(**{**inputs.model_dump(), **merged})
    before = estimate_memory(build_plan(inputs.model_copy(update={"framework": "deepspeed"})))
    after = estimate_memory(build_plan(back))
    assert after.peak_allocated_bytes == before.peak_allocated_bytes
    assert cfg["_trainledger"]["predicted"]["peak_allocated_gib"] == round(before.peak_allocated_bytes / GIB, 2)


def test_readme_runtime_example_is_real():
    """The README's --framework example: every output line shown comes from running the command."""
    import re
    import shlex
    from pathlib import Path

    from click.testing import CliRunner

    from trainledger.cli import main

    text = Path(__file__).resolve().parents[2].joinpath("README.md").read_text()
    block = text.split("### Runtimes: `--framework`")[1].split("```")[1]
    runs: list[tuple[str, list[str]]] = []
    for line in block.strip().splitlines():
        if line.startswith("$ "):
            runs.append((line[2:], []))
        elif line.strip():
            runs[-1][1].append(line)
    assert len(runs) == 2
    for cmd, expected in runs:
        r = CliRunner().invoke(main, shlex.split(cmd)[1:])
        out = re.sub(r"\s+\n", "\n", r.output)
        for line in expected:
            assert line in out, (cmd, line)


def test_gemma2_softcap_defaults_follow_transformers():
    """transformers' Gemma2Config: final_logit_softcapping=30.0, attn_logit_softcapping=50.0 when
    config.json omits them; an explicit null turns a cap off."""
    from trainledger.load.hf import from_hf_config, load_hf_config

    cfg = dict(load_hf_config("gemma-2-2b"))
    cfg.pop("final_logit_softcapping")
    cfg.pop("attn_logit_softcapping")
    m = from_hf_config(cfg)
    assert (m.logit_softcap, m.attn_softcap) == (30.0, 50.0)
    cfg["attn_logit_softcapping"] = None
    assert from_hf_config(cfg).attn_softcap is None


def test_gemma2_eager_softcap_adds_the_saved_tanh_outputs():
    from trainledger.load.hf import from_hf_config, load_hf_config

    cfg = dict(load_hf_config("gemma-2-2b"))
    capped = from_hf_config(cfg)
    plain = from_hf_config({**cfg, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    kw = dict(gpu="h100-sxm", gpus=1, attention="eager", seq_len=1024)
    a = estimate_memory(build_plan(PlanInputs(model="gemma-2-2b", **kw), model=capped), suggest=False)
    b = estimate_memory(build_plan(PlanInputs(model="gemma-2-2b", **kw), model=plain), suggest=False)
    T, V, s, heads, layers = 1024, 256000, 1024, 8, 26
    # attention: one bf16 a·s·s tanh output per layer; logits: one bf16 V·T tanh output
    assert a.phases["forward"] - b.phases["forward"] == pytest.approx(2 * heads * s * T * layers + 2 * V * T, rel=1e-6)


def test_phi3_fused_qkv_output_stays_alive_through_v():
    """Phi-3 slices q, k, v out of one qkv_proj output; SDPA saves v (a view), so the whole fused
    buffer lives until backward: c·(q + kv) more per token and layer than separate projections.
    (Measured on Llama-size phi-3-mini, fake tensors: forward peak 12.264 GiB; was modeled 11.70.)"""
    from trainledger.load.hf import from_hf_config, load_hf_config

    cfg = dict(load_hf_config("phi-3-mini"))
    m = from_hf_config(cfg)
    kw = dict(gpu="h100-sxm", gpus=1, seq_len=1024, precision="bf16", optimizer="sgd")
    fused = estimate_memory(build_plan(PlanInputs(model="phi-3-mini", **kw), model=m), suggest=False)
    other = m.model_copy(update={"model_type": "phi3-unfused"})
    split = estimate_memory(build_plan(PlanInputs(model="phi-3-mini", **kw), model=other), suggest=False)
    q = kv = 3072  # 32 heads × 96, 32 KV heads
    assert fused.phases["forward"] - split.phases["forward"] == pytest.approx(2 * (q + kv) * 1024 * 32, rel=1e-6)


def test_fsdp1_lora_norms_save_their_input_as_if_trained():
    """FSDP1 flattens a decoder layer into one FlatParameter that requires grad when a LoRA adapter
    in it does, so the frozen norm weights require grad in autograd and each RMSNorm keeps the
    R-byte x.to(dtype) its weight multiplies (FSDP2 keeps frozen weights as they are): 2 norms
    per layer, R = 2 bytes under MixedPrecision(param_dtype=bf16), every layer."""
    kw = dict(model="llama-3.2-1b", gpus=8, method="lora", seq_len=2048, precision="bf16-mixed")
    f1 = _states_and_acts(_plan(framework="pytorch-fsdp", **kw))
    f2 = _states_and_acts(_plan(framework="fsdp2", **kw))
    m = _plan(framework="fsdp2", **kw).model
    assert f1.acts - f2.acts == pytest.approx(m.num_layers * 2 * 2 * m.hidden_size * 2048, rel=1e-9)


def _states_and_acts(plan):
    from trainledger.estimate.memory.model import Parts, activations
    from trainledger.estimate.options import MemoryOptions

    x = Parts()
    activations(plan, MemoryOptions(), x)
    return x


def test_megatron_main_grad_buffer_lives_all_step():
    """Megatron's DDP allocates the fp32 main_grad buffer once (param_and_grad_buffer.py
    ``_ParamAndGradBuffer``) and zeroes it between steps: 4 bytes per parameter at every moment,
    the forward included, even without gradient accumulation."""
    p = _plan(model="llama-3.2-1b", gpus=8, framework="megatron-core", grad_accum=1, zero=1)
    e = estimate_memory(p)
    assert e.peak_phase == "forward"  # the loss: no gradient computed yet, the buffer already there
    assert e.breakdown["gradients"] == pytest.approx(4 * p.model.params.total, rel=1e-6)


# ------------------------------------------------------------------ Megatron optimizer semantics
def _llama32_1b_decoder_linear() -> int:
    """Decoder-layer linear weights of Llama 3.2 1B from its config.json (meta-llama/Llama-3.2-1B:
    hidden 2048, 16 layers, 32 heads of 64, 8 KV heads, intermediate 8192, no biases)."""
    h, kv, f, L = 2048, 8 * 64, 8192, 16
    return L * (h * h + 2 * h * kv + h * h + 3 * h * f)


def test_megatron_bf16_gradient_buffer():
    """--grad-reduce-in-bf16 (Megatron-LM core_r0.12.0) / NeMo grad_sync_dtype=bf16: the main-grad
    buffer holds 2 bytes per parameter; Megatron-Core's DistributedOptimizer then casts its shard to
    fp32 for the step (``_copy_model_grads_to_main_grads``: ``shard_model_grad.float()``): 4/N bytes."""
    fp32 = _states(_plan(model="llama-3.2-1b", framework="megatron-core", zero=1))
    bf16 = _states(_plan(model="llama-3.2-1b", framework="megatron-core", zero=1, reduce_dtype="bf16"))
    psi = fp32.weights / 2
    assert fp32.grads_static == pytest.approx(4 * psi, rel=1e-9)
    assert bf16.grads_static == pytest.approx(2 * psi, rel=1e-9)
    assert fp32.opt_temp == 0.0  # fp32 buffer: the shard is a view, no copy
    assert bf16.opt_temp == pytest.approx(4 * psi / 8, rel=1e-9)
    assert bf16.master == fp32.master and bf16.states == fp32.states


def test_apex_distributed_fused_adam_keeps_remainders():
    """NeMo 1.x distributed_fused_adam with bf16 weights (NeMo v2.0.0rc0 ``setup_optimization``:
    store_params=False, store_param_remainders=True): Apex's StateBucket holds per shard element an
    int16 remainder and fp32 exp_avg / exp_avg_sq: (2 + 8)/N bytes, and the reduce-scatter output
    (``sync_grads_shard``, grad_sync_dtype) lives until zero_grad; with fp8_params store_params=True:
    an fp32 master shard (4/N)."""
    n = 8
    mc = _states(_plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1))
    ap = _states(_plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1,
                       dist_optimizer="apex"))
    psi = mc.weights / 2
    assert mc.master == pytest.approx(4 * psi / n, rel=1e-9)  # Megatron-Core: fp32 main params
    assert ap.master == pytest.approx(2 * psi / n, rel=1e-9)
    assert ap.states == pytest.approx(8 * psi / n, rel=1e-9) == mc.states
    assert ap.grads_static == pytest.approx(4 * psi, rel=1e-9)  # grad_sync_dtype defaults to fp32
    assert ap.opt_temp == pytest.approx(4 * psi / n, rel=1e-9)
    ap8 = _states(_plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1,
                        dist_optimizer="apex", precision="fp8-mixed", fp8_params=True, reduce_dtype="bf16"))
    assert ap8.master == pytest.approx(4 * psi / n, rel=1e-9)
    assert ap8.opt_temp == pytest.approx(2 * psi / n, rel=1e-9)


def test_te_fp8_weight_cache():
    """fp8-mixed under Megatron-Core + Transformer Engine: each decoder linear keeps its fp8 weight
    and transpose in TE's workspace cache (Megatron-Core passes is_first_microbatch; TE v1.8
    ``get_fp8_workspace(cache_name="weight", with_transpose=True)``): +2 bytes per linear weight
    beside the bf16 parameters. With fp8 parameters (--fp8-param-gather / NeMo fp8_params) the
    weight is 1 byte plus its cached 1-byte transpose: no more than bf16."""
    bf16 = _states(_plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1))
    fp8 = _states(_plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1,
                        precision="fp8-mixed"))
    fp8p = _states(_plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1,
                         precision="fp8-mixed", fp8_params=True))
    assert fp8.weights - bf16.weights == pytest.approx(2 * _llama32_1b_decoder_linear(), rel=1e-9)
    assert fp8p.weights == pytest.approx(bf16.weights, rel=1e-9)


def test_megatron_runtime_options_are_stated():
    p = _plan(model="llama-3.2-1b", gpu="h100-sxm", framework="megatron-core", zero=1,
              precision="fp8-mixed", dist_optimizer="apex", reduce_dtype="bf16")
    s = p.runtime.summary()
    assert (s["dist_optimizer"], s["reduce_dtype"], s["fp8_params"]) == ("apex", "bf16", False)
    note = " ".join(estimate_memory(p).notes)
    assert "Apex DistributedFusedAdam" in note and "bf16 gradient buffer" in note
    assert "TE's cached fp8 copies" in note


def test_fsdp2_with_expert_parallelism_gathers_a_ranks_experts_only():
    """torchtitan wraps moe.experts in its own FSDP unit over the data-parallel mesh less EP, on
    expert tensors already split by EP: a rank gathers its E/ep experts beside the block's dense
    part (they were gathered whole, so DeepSeek-V3 on 256 H100 with EP 64 needed 1.4 TB a GPU)."""
    from trainledger.estimate.memory.runtimes import shapes

    kw = dict(model="mixtral-8x7b", gpus=16, zero=3, seq_len=4096, framework="fsdp2")
    one, eight = (build_plan(PlanInputs(ep=ep, **kw)) for ep in (1, 8))
    layer = one.model.layer_params(0)
    experts = layer["experts"]
    dense = sum(layer.values()) - experts
    assert shapes(one).layer_full == dense + experts
    assert shapes(eight).layer_full == dense + experts / 8
    # the padded gather: the dense part over 16 ranks, the experts' unit (1 expert a rank) over 2
    assert shapes(eight).layer_padded == pytest.approx(shapes(eight).layer_full, rel=1e-3)
    # a rank stores E/n experts' worth; without EP 8 experts over 16 ranks pad dim 0 to one expert a
    # rank, with EP the 2-rank expert unit shards dim 1 (torchtitan's Shard(1) rule): half of one
    expert = experts / 8
    assert shapes(one).layer_local - shapes(eight).layer_local == pytest.approx(expert / 2, rel=1e-3)
    z1, z8 = (estimate_memory(p).breakdown.get("zero_buffers", 0) for p in (one, eight))
    assert z8 < z1 / 3
    # FSDP1's flat units are taken whole
    flat = [build_plan(PlanInputs(**dict(kw, framework="pytorch-fsdp", ep=ep))) for ep in (1, 8)]
    assert shapes(flat[0]).layer_full == shapes(flat[1]).layer_full
