"""Full recomputation with torch's early stop: which GEMMs are not run again, checked against torch.

torch's non-reentrant checkpoint stops re-running a checkpointed layer once the last tensor its
backward unpacks is rebuilt (torch/utils/checkpoint.py, ``set_checkpoint_early_stop``). The time
model leaves those GEMM forwards out of the recompute (``compute.early_stop_skips``). Here the same
tiny Hugging Face models run one forward and backward on CPU with activation checkpointing, once
with early stop and once without, and the matrix multiplies of each are counted: the difference is
the number of GEMM forwards early stop saved, which must equal what the model leaves out.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import set_checkpoint_early_stop

from trainledger.estimate.options import TimeOptions
from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.compute import (checkpoint_stops_early, early_stop_skips, layer_kinds,
                                               step_flops)
from trainledger.estimate.time.stack import stack_profile
from trainledger.load.catalog import load_gpu
from trainledger.load.hf import load_model
from trainledger.load.plan import PlanInputs, build_plan

transformers = pytest.importorskip("transformers")

_MM = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
if hasattr(torch.ops.aten, "_grouped_mm"):  # transformers' MoE experts (torch >= 2.8)
    _MM.add(torch.ops.aten._grouped_mm.default)

TINY = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 128,
              "tie_word_embeddings": False},
    # sandwich norms: a norm follows the MLP and saves the down projection's output
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256,
               "max_position_embeddings": 128, "sliding_window": 64},
    # MoE: the combine weighs each expert's output by its router probability and saves it
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 128,
                "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False},
    # GPT-2: dropout after the MLP's projection (resid_pdrop), and a plain 4h MLP
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_head": 4,
             "n_layer": 2, "vocab_size": 256, "n_positions": 128, "resid_pdrop": 0.1,
             "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}
TINY["gpt2-no-dropout"] = {**TINY["gpt2"], "resid_pdrop": 0.0}


class MatmulCount(TorchDispatchMode):
    """Matrix multiplies by (k, n): the inner and output widths of (m x k) @ (k x n)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _MM:
            a, b = (args[1], args[2]) if func is torch.ops.aten.addmm.default else (args[0], args[1])
            self.shapes[(a.shape[-1], b.shape[-1])] += 1
        return func(*args, **(kwargs or {}))


def _matmuls(cfg: dict, early_stop: bool | None, kw: dict | None = None) -> Counter:
    """Matrix multiplies of one checkpointed forward + backward of the tiny model on CPU
    (``early_stop`` None: torch's checkpoint keywords ``kw`` alone decide)."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.train()
    kw = kw or {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    ids = torch.randint(0, 256, (2, 16))
    count = MatmulCount()
    if early_stop is None:
        with count:
            model(input_ids=ids, labels=ids).loss.backward()
    else:
        with set_checkpoint_early_stop(early_stop), count:
            model(input_ids=ids, labels=ids).loss.backward()
    return count.shapes


def _spec(cfg: dict, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return load_model(p)


@pytest.mark.parametrize("name", sorted(TINY))
def test_early_stop_leaves_out_the_gemms_torch_does_not_rerun(name, tmp_path):
    """The GEMMs torch does not run again, by shape, are those the model leaves out (a down
    projection is (f -> h), told apart from the up/gate projections (h -> f) by its shape)."""
    cfg = TINY[name]
    saved = _matmuls(cfg, early_stop=False) - _matmuls(cfg, early_stop=True)
    m = _spec(cfg, tmp_path)
    dropout = float(cfg.get("resid_pdrop", 0.0))
    modelled: Counter = Counter()
    for kind in layer_kinds(m):
        for g in early_stop_skips(kind, dropout):
            modelled[(g.k, g.n)] += kind.count
    assert saved == modelled
    if name in ("llama", "gpt2-no-dropout"):  # the down projection of each of the two layers
        h = cfg.get("hidden_size", cfg.get("n_embd"))
        assert sum(saved.values()) == 2 and all(n == h for _, n in saved)


def _plan(**kw):
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, framework="fsdp2",
                micro_batch=2, seq_len=4096, recompute="full")
    base.update(kw)
    return build_plan(PlanInputs(**base))


def test_hardware_flops_drop_by_the_down_projection_forward():
    on, off = _plan(checkpoint_early_stop=True), _plan(checkpoint_early_stop=False)
    m = on.model
    down = sum(k.count * g.flops_per_token for k in layer_kinds(m) for g in k.gemms if g.name == "down")
    assert down > 0
    diff = step_flops(off).hardware - step_flops(on).hardware
    assert diff == pytest.approx(down * on.tokens_per_step, rel=1e-9)
    # model FLOPs (what MFU divides) do not depend on how the stack recomputes
    assert step_flops(off).model == step_flops(on).model


def test_no_early_stop_without_full_recompute():
    a = step_flops(_plan(recompute="none", checkpoint_early_stop=True)).hardware
    b = step_flops(_plan(recompute="none", checkpoint_early_stop=False)).hardware
    assert a == b


def test_early_stop_shortens_the_step_by_about_a_third_of_the_recomputed_mlp():
    on, off = _plan(checkpoint_early_stop=True), _plan(checkpoint_early_stop=False)
    t_on = estimate_compute(on, TimeOptions()).compute_parts["matmul"]
    t_off = estimate_compute(off, TimeOptions()).compute_parts["matmul"]
    # down is a third of the MLP's gated GEMM FLOPs (gate, up, down of equal size) and the
    # recompute is one forward of four GEMM passes (fwd, recompute, dgrad, wgrad): the matmul
    # seconds fall by roughly down / (4 x all linear GEMMs)
    m = on.model
    kinds = layer_kinds(m)
    down = sum(k.count * g.flops_per_token for k in kinds for g in k.gemms if g.name == "down")
    total = sum(k.count * k.gemm_flops_per_token for k in kinds)
    assert 1 - t_on / t_off == pytest.approx(down / (4 * total), rel=0.15)


def test_stack_defaults_follow_the_checkpoint_each_stack_calls():
    gpu = load_gpu("h100-sxm")
    # transformers >= 5 and accelerate/Composer call torch's non-reentrant checkpoint; torchtitan
    # turns early stop off (PR #1580); Megatron and DeepSpeed re-run their own reentrant function
    want = {"hf": True, "pytorch-fsdp": True, "deepspeed": True, "fsdp2": False,
            "megatron-core": False, "megatron-deepspeed": False}
    for fw, stops in want.items():
        assert stack_profile(fw, gpu).checkpoint_early_stop is stops, fw
        assert checkpoint_stops_early(_plan(framework=fw, zero=1 if fw.startswith("megatron") else 3)) is stops
    # the plan's own setting wins over the stack's
    assert checkpoint_stops_early(_plan(framework="megatron-core", zero=1, checkpoint_early_stop=True))
    assert not checkpoint_stops_early(_plan(framework="hf", checkpoint_early_stop=False))


# ------------------------------------------------------------------ the setting through the edges
@pytest.mark.parametrize("framework", ["hf", "fsdp2"])
@pytest.mark.parametrize("kwargs,want", [({"use_reentrant": True}, False), ({"use_reentrant": False}, None),
                                         ({"use_reentrant": False, "early_stop": True}, True),
                                         ({"use_reentrant": False, "early_stop": False}, False),
                                         ({}, None)])
def test_trainer_checkpoint_kwargs_set_early_stop(tmp_path, kwargs, want, framework):
    """What the Trainer's checkpoint keywords say reaches the plan (None: the stack's default)."""
    from trainledger.runconfig import import_configs
    p = tmp_path / "training_args.json"
    args = {"per_device_train_batch_size": 2, "output_dir": "x", "gradient_checkpointing": True,
            "gradient_checkpointing_kwargs": kwargs}
    if framework == "fsdp2":
        args.update(fsdp="full_shard auto_wrap", fsdp_config={"version": 2})
    p.write_text(json.dumps(args))
    m = import_configs([p]).merged()
    plan = build_plan(PlanInputs(**{**m, "gpus": 8}))
    default = framework == "hf"  # transformers >= 5 stops early; torchtitan-style fsdp2 does not
    assert checkpoint_stops_early(plan) is (default if want is None else want)


@pytest.mark.parametrize("value", [True, False])
def test_torchtitan_early_stop_key_is_read(tmp_path, value):
    from trainledger.runconfig import import_configs
    p = tmp_path / "t.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n'
                 f'[activation_checkpoint]\nmode = "full"\nearly_stop = {str(value).lower()}\n')
    m = import_configs([p]).merged()
    assert m["recompute"] == "full"
    assert checkpoint_stops_early(build_plan(PlanInputs(**{**m, "gpus": 8}))) is value


def test_trainer_export_carries_early_stop_off():
    """The exported checkpoint keywords, run through transformers and torch, recompute what the plan
    priced: with early_stop False every GEMM forward again, by default all but the down projections."""
    from trainledger.runconfig.export import trainer_arguments
    off = trainer_arguments(_plan(framework="hf", gpus=1, zero=0, checkpoint_early_stop=False))
    on = trainer_arguments(_plan(framework="hf", gpus=1, zero=0))
    assert off["gradient_checkpointing_kwargs"] == {"use_reentrant": False, "early_stop": False}
    cfg = TINY["llama"]
    n_off = _matmuls(cfg, None, off["gradient_checkpointing_kwargs"])
    n_on = _matmuls(cfg, None, on["gradient_checkpointing_kwargs"])
    assert sum((n_off - n_on).values()) == 2


def test_the_estimate_says_whether_the_recompute_stops_early():
    def notes(**kw):
        return " ".join(estimate_compute(_plan(**kw), TimeOptions()).notes)
    assert "stops early" in notes(checkpoint_early_stop=True)
    assert "stops early" not in notes(checkpoint_early_stop=False)
    assert "re-runs every GEMM" in notes(model="mixtral-8x7b", checkpoint_early_stop=True)
    assert "early" not in notes(recompute="none", checkpoint_early_stop=True)


def test_torchtitan_export_carries_early_stop_and_reads_back(tmp_path):
    from trainledger.runconfig import import_configs
    from trainledger.runconfig.export_tools import torchtitan_config, torchtitan_toml
    titan = dict(wrap="layers+embed+head")  # torchtitan's own FSDP grouping (runconfig/export_tools.py)
    plan = _plan(checkpoint_early_stop=True, **titan)
    assert torchtitan_config(plan)["activation_checkpoint"] == {"mode": "full", "early_stop": True}
    assert "early_stop" not in torchtitan_config(_plan(**titan))["activation_checkpoint"]  # torchtitan's default
    p = tmp_path / "t.toml"
    p.write_text(torchtitan_toml(plan, "# test\n"))
    back = build_plan(PlanInputs(**{**import_configs([p]).merged(), "gpus": 8}))
    assert checkpoint_stops_early(back)


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("q_proj", "v_proj", "up_proj", "down_proj")])
def test_lora_early_stop_skips_what_torch_skips(targets):
    """peft runs a wrapped projection's base layer first and adds lora_B(lora_A(x)) after it: with
    an adapter on down_proj torch stops after lora_A and re-runs the base down GEMM, skipping the
    adapter's B; without one it skips the base down GEMM, as for full fine-tuning."""
    peft = pytest.importorskip("peft")
    cfg, r = TINY["llama"], 4

    def skipped() -> Counter:
        out = []
        for early in (False, True):
            torch.manual_seed(0)
            config = transformers.AutoConfig.for_model(**cfg)
            config._attn_implementation = "eager"
            base = transformers.AutoModelForCausalLM.from_config(config)
            kw = {"use_reentrant": False}
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            model = peft.get_peft_model(base, peft.LoraConfig(r=r, target_modules=list(targets), lora_dropout=0.0))
            model.enable_input_require_grads()
            model.train()
            ids = torch.randint(0, 256, (2, 16))
            count = MatmulCount()
            with set_checkpoint_early_stop(early), count:
                model(input_ids=ids, labels=ids).loss.backward()
            out.append(count.shapes)
        return out[0] - out[1]

    from trainledger.estimate.time.compute import lora_gemms
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        m = _spec(cfg, Path(d))
    modelled: Counter = Counter()
    for kind in layer_kinds(m):
        for g in early_stop_skips(kind, 0.0, lora_gemms(m, kind, tuple(sorted(targets)), r)):
            modelled[(g.k, g.n)] += kind.count
    assert skipped() == modelled
    assert sum(modelled.values()) == 2
