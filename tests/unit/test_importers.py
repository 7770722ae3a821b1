"""Importers of other tools' configs, on real example configs of those projects (tests/data/runconfig,
each file names its source URL) and on the mis-read cases of issue 17; round trips of every export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import SpecError
from trainledger.estimate import estimate
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import EXPORT_FORMATS, export_plan, import_configs

DATA = Path(__file__).resolve().parents[1] / "data" / "runconfig"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _read(name: str):
    return import_configs([DATA / name])


def _peak(inputs: dict) -> float:
    return estimate(build_plan(PlanInputs(**inputs))).memory.peak_allocated_bytes


def test_every_data_file_names_its_source():
    for p in DATA.iterdir():
        assert re.search(r"^# source: https://github\.com/\S+/blob/[0-9a-f]{40}/", p.read_text(), re.M), p.name


# ----------------------------------------------------------------------------- axolotl
def test_axolotl_qlora_is_read_as_qlora_not_a_full_fine_tune():
    res = _read("axolotl_llama3_qlora.yml")
    m = res.merged()
    assert res.formats == {"axolotl_llama3_qlora.yml": "axolotl"}
    assert m["model"] == "NousResearch/Meta-Llama-3-8B"
    assert (m["method"], m["lora_rank"], m["seq_len"], m["micro_batch"], m["grad_accum"]) == ("qlora", 32, 4096, 2, 4)
    assert (m["recompute"], m["attention"]) == ("full", "flash")
    assert "precision" not in m  # bf16: auto is autocast; LoRA's frozen base dtype is the method default
    assert "lora_targets" not in m  # lora_target_linear: all linear layers = the default
    same = {**m, "model": "llama-3.1-8b"}  # same architecture; the NousResearch id is not cached here
    full = {**same, "method": "full"}
    assert _peak(same) < 0.3 * _peak(full)  # the issue: 23.4 vs 162.9 GiB


def test_axolotl_fsdp_qlora_70b_reads_sharding_offload_and_lists_what_it_does_not_model():
    res = _read("axolotl_llama3_qlora_fsdp_70b.yaml")
    m = res.merged()
    assert (m["method"], m["zero"], m["offload"], m["framework"]) == ("qlora", 3, "params", "pytorch-fsdp")
    assert any("fsdp_limit_all_gathers" in u for u in res.unknown_keys)


def test_axolotl_unmodeled_memory_keys_are_listed(tmp_path):
    p = tmp_path / "a.yml"
    p.write_text("base_model: x/y\nsequence_len: 1024\nmicro_batch_size: 1\nadapter: lora\nlora_r: 8\n"
                 "unsloth_lora_mlp: true\nliger_rms_norm: true\nlr_scheduler: cosine\n")
    res = import_configs([p])
    assert "a.yml: unsloth_lora_mlp" in res.unknown_keys
    assert not any("lr_scheduler" in u or "liger" in u for u in res.unknown_keys)
    # the Liger plugin's switch is read (sized as all of Liger's default kernels, and said so)
    assert res.merged()["liger_kernel"] is True
    assert any("liger_fused_linear_cross_entropy" in n and "defaults" in n for n in res.notes)


def test_liger_switches_of_trl_trainer_and_llamafactory_are_read(tmp_path):
    trl = tmp_path / "sft.yaml"
    trl.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\nper_device_train_batch_size: 2\n"
                   "max_length: 4096\nuse_liger_kernel: true\noutput_dir: out\n")
    res = import_configs([trl])
    assert res.merged()["liger_kernel"] is True and not res.unknown_keys
    lf = tmp_path / "lf.yaml"
    lf.write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\nfinetuning_type: lora\n"
                  "cutoff_len: 2048\nper_device_train_batch_size: 1\nenable_liger_kernel: true\n")
    res = import_configs([lf])
    assert res.merged()["liger_kernel"] is True
    assert not any("liger" in u for u in res.unknown_keys)


def test_axolotl_dpo_holds_chosen_and_rejected(tmp_path):
    p = tmp_path / "a.yml"
    p.write_text("base_model: x/y\nsequence_len: 1024\nmicro_batch_size: 2\nadapter: lora\nlora_r: 8\nrl: dpo\n")
    assert import_configs([p]).merged()["micro_batch"] == 4


def test_axolotl_gradient_checkpointing_offload_is_recompute_and_listed(tmp_path):
    p = tmp_path / "a.yml"
    p.write_text("base_model: x/y\nsequence_len: 1024\nmicro_batch_size: 1\ngradient_checkpointing: offload\n")
    res = import_configs([p])
    assert res.merged()["recompute"] == "full"
    assert any("gradient_checkpointing=offload" in u for u in res.unknown_keys)


# ----------------------------------------------------------------------------- LLaMA-Factory
def test_llamafactory_lora_defaults_to_gradient_checkpointing():
    m = _read("llamafactory_llama3_lora_sft.yaml").merged()
    assert (m["model"], m["method"], m["lora_rank"], m["seq_len"]) == ("meta-llama/Meta-Llama-3-8B-Instruct", "lora", 8, 2048)
    assert (m["micro_batch"], m["grad_accum"], m["recompute"]) == (1, 8, "full")


def test_llamafactory_4bit_is_qlora():
    assert _read("llamafactory_llama3_lora_sft_otfq.yaml").merged()["method"] == "qlora"


# ----------------------------------------------------------------------------- TRL
def test_trl_dpo_qlora_recipe():
    res = _read("trl_alignment_handbook_zephyr_dpo_qlora.yaml")
    m = res.merged()
    assert res.formats[next(iter(res.formats))] == "trl"
    assert (m["method"], m["lora_rank"], m["seq_len"], m["optimizer"]) == ("qlora", 128, 1024, "adamw")
    assert m["micro_batch"] == 8  # chosen + rejected of 4 pairs in one forward
    assert set(m["lora_targets"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not res.unknown_keys


def test_trl_sft_full_recipe_reads_model_and_max_seq_length():
    m = _read("trl_alignment_handbook_zephyr_sft_full.yaml").merged()
    assert (m["model"], m["seq_len"], m["micro_batch"], m["grad_accum"]) == ("mistral-7b-v0.1", 2048, 32, 2)
    assert m.get("method", "full") == "full"


def test_trl_lora_keys_without_use_peft_are_a_full_fine_tune(tmp_path):
    p = tmp_path / "sft.yaml"
    p.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 512\nlora_r: 8\noutput_dir: x\n")
    res = import_configs([p])
    assert res.merged().get("method", "full") == "full" and any("use_peft" in n for n in res.notes)
    p.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 512\nlora_r: 8\nuse_peft: true\noutput_dir: x\n")
    assert import_configs([p]).merged()["method"] == "lora"


def test_trl_config_without_max_length_is_an_error_naming_the_key():
    r = CliRunner().invoke(main, ["estimate", "--from", str(DATA / "trl_cli_example_config.yaml"), "--json"])
    assert r.exit_code != 0
    assert "sequence length" in r.output and "max_length" in r.output and "--seq-len" in r.output


def test_missing_model_is_an_error_never_the_default(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}))
    r = CliRunner().invoke(main, ["estimate", "--from", str(ds), "--seq-len", "2048", "--json"])
    assert r.exit_code != 0 and "--model" in r.output and "base_model" in r.output
    r = CliRunner().invoke(main, ["estimate", "--from", str(ds), "--seq-len", "2048", "--model", "llama-3.2-1b",
                                  "--gpus", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["plan"]["framework"] == "deepspeed"


# ----------------------------------------------------------------------------- torchtitan
def test_torchtitan_llama3_8b_toml():
    res = _read("torchtitan_llama3_8b.toml")
    m = res.merged()
    assert (m["model"], m["seq_len"], m["micro_batch"], m["framework"]) == ("llama-3.1-8b", 8192, 1, "fsdp2")
    assert (m["zero"], m["recompute"], m["tp"]) == (3, "selective", 1)
    assert any("pass --gpus" in n for n in res.notes)  # dp_shard -1: the world size is the launcher's


def test_torchtitan_llama3_70b_toml_keeps_tp8():
    m = _read("torchtitan_llama3_70b.toml").merged()
    assert (m["model"], m["tp"], m["recompute"], m["loss_parallel"], m["micro_batch"]) == ("llama-3.1-70b", 8, "full", True, 8)
    plan = build_plan(PlanInputs(**{**m, "gpus": 64}))
    assert plan.layout.dp_size == 8


@pytest.mark.parametrize("impl,want", [(None, "adamw-fused"), ("fused", "adamw-fused"), ("foreach", "adamw"),
                                       ("for-loop", "adamw-loop"), ("fused_opt_states_bf16", "adamw-fused")])
def test_torchtitan_optimizer_implementation(tmp_path, impl, want):
    """torchtitan's [optimizer] implementation defaults to "fused" (PR #881, 2025-02); foreach is
    torch's multi-tensor AdamW, for-loop its per-tensor loop; fused_opt_states_bf16 keeps bf16 moments."""
    p = tmp_path / "t.toml"
    opt = '[optimizer]\nname = "AdamW"\n' + (f'implementation = "{impl}"\n' if impl else "")
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n' + opt)
    res = import_configs([p])
    assert res.merged()["optimizer"] == want
    # fused_opt_states_bf16: the fused kernel with bf16 moments (--optimizer-states-dtype bf16)
    assert res.merged().get("optimizer_states_dtype") == ("bf16" if impl == "fused_opt_states_bf16" else None)
    assert not res.unknown_keys


def test_torchtitan_unknown_flavor_is_an_error(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n[training]\nseq_len = 2048\n[parallelism]\n')
    with pytest.raises(SpecError, match="debugmodel"):
        import_configs([p])


# ----------------------------------------------------------------------------- Megatron / NeMo
def test_megatron_gpt3_example_keeps_tp2_pp2_and_builds_the_model_from_its_dimensions():
    res = _read("megatron_train_gpt3_175b_distributed.sh")
    m = res.merged()
    assert (m["tp"], m["pp"], m["sp"], m["gpus"], m["seq_len"]) == (2, 2, False, 8, 512)
    assert (m["precision"], m["framework"], m["micro_batch"], m["dropout"]) == ("fp16-mixed", "megatron-core", 1, 0.1)
    plan = build_plan(PlanInputs(**m))
    assert (plan.model.num_layers, plan.model.hidden_size, plan.model.vocab_size) == (8, 256, 50432)  # 50257 padded to 128·tp
    assert plan.global_batch == 64 and plan.recipe.grad_accum == 32


def test_megatron_llama3_fp8_example():
    m = _read("megatron_train_llama3_8b_h100_fp8.sh").merged()
    assert (m["model"], m["precision"], m["zero"], m["seq_len"], m["gpus"]) == ("llama-3.1-8b", "fp8-mixed", 1, 8192, 8)
    assert (m["micro_batch"], m["grad_accum"], m["dropout"]) == (1, 16, 0.0)
    # the script's --cross-entropy-loss-fusion selects Megatron's fused loss (fewer logit passes)
    assert m["fused_loss"] is True
    assert not _read("megatron_train_gpt3_175b_distributed.sh").merged().get("fused_loss")
    assert not any("cross-entropy" in u for u in _read("megatron_train_llama3_8b_h100_fp8.sh").unknown_keys)


def test_megatron_gradient_dtype_and_fp8_weights():
    """The example's --grad-reduce-in-bf16 (a bf16 main-grad buffer) and --fp8-param-gather (fp8
    weights); the 175B example sets neither (fp32 main grads with --bf16/--fp16, bf16 weights)."""
    m = _read("megatron_train_llama3_8b_h100_fp8.sh").merged()
    assert (m["reduce_dtype"], m["fp8_params"]) == ("bf16", True)
    g = _read("megatron_train_gpt3_175b_distributed.sh").merged()
    assert "reduce_dtype" not in g and "fp8_params" not in g


def test_nemo1_distributed_fused_adam(tmp_path):
    """NeMo 1.x ``optim.name: distributed_fused_adam`` is Apex's DistributedFusedAdam sharded over
    DP, and ``optim.grad_sync_dtype`` its gradient dtype (NeMo Framework Launcher 24.07
    launcher_scripts/conf/training/nemotron/nemotron_340b.yaml: bf16)."""
    p = tmp_path / "nemo.sh"
    p.write_text("python megatron_gpt_pretraining.py trainer.devices=8 trainer.precision=bf16 "
                 "model.micro_batch_size=1 model.global_batch_size=64 model.encoder_seq_length=4096 "
                 "model.optim.name=distributed_fused_adam model.optim.grad_sync_dtype=bf16 "
                 "model.fp8=true model.fp8_params=true --factory llama3_8b\n")
    m = import_configs([p]).merged()
    assert (m["dist_optimizer"], m["zero"], m["reduce_dtype"], m["fp8_params"]) == ("apex", 1, "bf16", True)


def test_megatron_launch_line_keeps_tp4_pp2(tmp_path):
    """The issue's case: a launch line lost tp4/pp2 (195.2 vs 25.7 GiB)."""
    p = tmp_path / "launch.sh"
    p.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 4 "
                 "--pipeline-model-parallel-size 2 --sequence-parallel --num-layers 32 --hidden-size 4096 "
                 "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
                 "--swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear "
                 "--position-embedding-type rope --vocab-size 128256 --seq-length 4096 --micro-batch-size 1 "
                 "--global-batch-size 32 --bf16 --use-distributed-optimizer\n")
    m = import_configs([p]).merged()
    assert (m["tp"], m["pp"], m["model"], m["grad_accum"]) == (4, 2, "llama-3.1-8b", 32)
    flat = {**m, "tp": 1, "pp": 1, "grad_accum": 4}
    assert _peak(m) < 0.4 * _peak(flat)


def test_nemo_yaml_and_hydra_overrides(tmp_path):
    m = _read("nemo_megatron_gpt_config.yaml").merged()
    assert (m["model"], m["precision"], m["micro_batch"], m["seq_len"], m["optimizer"]) == ("gpt2", "fp16-mixed", 4, 512, "adamw-fused")
    p = tmp_path / "nemo.sh"
    p.write_text("python megatron_gpt_pretraining.py trainer.devices=8 trainer.num_nodes=2 trainer.precision=bf16 "
                 "model.tensor_model_parallel_size=4 model.pipeline_model_parallel_size=2 model.micro_batch_size=1 "
                 "model.global_batch_size=64 model.encoder_seq_length=4096 --factory llama3_8b\n")
    m = import_configs([p]).merged()
    assert (m["gpus"], m["gpus_per_node"], m["tp"], m["pp"], m["model"], m["grad_accum"]) == (16, 8, 4, 2, "llama-3.1-8b", 32)


# ----------------------------------------------------------------------------- round trips
ROUND = {
    "torchtitan-tp": dict(model="llama-3.1-8b", gpus=16, framework="fsdp2", zero=3, tp=2, seq_len=8192,
                          micro_batch=2, grad_accum=2, recompute="full", wrap="layers+embed+head"),
    "megatron-tp-pp": dict(model="llama-3.1-8b", gpus=16, framework="megatron-core", tp=4, pp=2, zero=1,
                           seq_len=4096, micro_batch=1, grad_accum=8, recompute="selective",
                           fused_loss=True),
    "megatron-fp8-weights": dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=16, framework="megatron-core",
                                 tp=2, zero=1, seq_len=8192, micro_batch=1, grad_accum=4,
                                 precision="fp8-mixed", reduce_dtype="bf16", fp8_params=True),
    "megatron-fsdp": dict(model="llama-3.1-8b", gpus=16, framework="megatron-core", zero=3, tp=2,
                          seq_len=4096, micro_batch=1, grad_accum=2, recompute="full"),
    "nemo-recipe": dict(model="llama-3.1-8b", gpus=16, framework="megatron-core", tp=2, cp=2, zero=1,
                        seq_len=8192, micro_batch=1, grad_accum=4, recompute="full", dropout=0.0),
    "deepspeed-offload": dict(model="qwen2.5-7b", gpus=8, framework="deepspeed", zero=2, offload="optimizer",
                              micro_batch=4, grad_accum=8, precision="fp16-mixed", seq_len=1024),
    "lora": dict(model="llama-3.1-8b", gpus=8, method="lora", lora_rank=32, seq_len=2048, micro_batch=2,
                 lora_targets=("k_proj", "o_proj", "q_proj", "v_proj"), grad_accum=4, recompute="full"),
    "fsdp2-tp-cp": dict(model="llama-3.1-8b", gpus=8, framework="fsdp2", zero=3, tp=2, cp=2, seq_len=8192),
    "fsdp1": dict(model="llama-3.1-8b", gpus=16, framework="pytorch-fsdp", zero=3, seq_len=4096, recompute="full"),
    "liger": dict(model="llama-3.1-8b", gpus=8, framework="pytorch-fsdp", zero=3, seq_len=4096, micro_batch=2,
                  liger_kernel=True),
}
#: targets whose own keys carry the whole plan (without the trainledger header)
SELF_CONTAINED = {"torchtitan", "megatron", "nemo"}


def _write(files, out: Path, strip: bool) -> list[Path]:
    paths = []
    for f in files:
        text = f.text
        if strip:
            if f.name.endswith(".json"):
                d = json.loads(text)
                d.pop("_trainledger", None)
                text = json.dumps(d)
            else:
                text = re.sub(r"^# trainledger-plan:.*$", "", text, flags=re.M)
        (out / f.name).write_text(text)
        paths.append(out / f.name)
    return paths


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
@pytest.mark.parametrize("name", list(ROUND))
def test_round_trip_every_export(name, fmt, tmp_path):
    inputs = PlanInputs(**ROUND[name])
    try:
        files = export_plan(inputs, fmt)
    except SpecError as exc:
        assert fmt not in ("torchrun", "slurm")
        assert len(str(exc)) > 30  # a reason, not a bare refusal
        return
    if fmt == "deepspeed" and inputs.framework not in ("deepspeed", "megatron-deepspeed"):
        inputs = inputs.model_copy(update={"framework": "deepspeed"})  # the export judges it under DeepSpeed
    if fmt in ("accelerate", "fsdp", "trainer-args") and build_plan(inputs).runtime.loading(inputs.zero, inputs.tp) == "sharded":
        # accelerate has no sharded load (torchtitan's): its nearest, one copy per node, is exported
        inputs = inputs.model_copy(update={"model_loading": "rank0"})
    plan = build_plan(inputs)
    for strip in ([False, True] if fmt in SELF_CONTAINED else [False]):
        out = tmp_path / ("strip" if strip else "head")
        out.mkdir()
        res = import_configs(_write(files, out, strip))
        back = build_plan(PlanInputs(**res.merged()))
        assert back == plan, (fmt, strip)
        assert estimate(back).memory.peak_allocated_bytes == estimate(plan).memory.peak_allocated_bytes


def test_exports_keep_tp_and_zero3_or_refuse():
    """The issue's case: tp2 + ZeRO-3 came out of accelerate / trainer-args exports as plain FSDP dp4."""
    inputs = PlanInputs(model="llama-3.1-8b", gpus=8, framework="fsdp2", zero=3, tp=2, seq_len=4096)
    (acc,) = export_plan(inputs, "accelerate")
    assert "parallelism_config_tp_size: 2" in acc.text and "parallelism_config_dp_shard_size: 4" in acc.text
    with pytest.raises(SpecError, match="accelerate"):
        export_plan(inputs, "trainer-args")
    with pytest.raises(SpecError, match="tp/cp"):
        export_plan(inputs, "fsdp")


def test_accelerate_parallelism_export_loads_in_accelerate(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    inputs = PlanInputs(**ROUND["fsdp2-tp-cp"])
    (f,) = export_plan(inputs, "accelerate")
    p = tmp_path / f.name
    p.write_text(f.text)
    cfg = load_config_from_file(str(p))
    assert cfg.parallelism_config["parallelism_config_tp_size"] == 2
    assert cfg.fsdp_config["fsdp_version"] == 2


def test_torchtitan_export_is_valid_toml_with_the_layout():
    import tomllib

    (f,) = export_plan(PlanInputs(**ROUND["torchtitan-tp"]), "torchtitan")
    d = tomllib.loads(f.text)
    assert d["model"] == {"name": "llama3", "flavor": "8B"}
    assert d["parallelism"]["tensor_parallel_degree"] == 2 and d["parallelism"]["data_parallel_shard_degree"] == 8
    assert d["training"]["seq_len"] == 8192 and d["training"]["global_batch_size"] == 32


def test_torchtitan_export_shards_what_the_estimate_prices_as_sharded(tmp_path):
    """fsdp2 --zero 0 is priced as full sharding (an FSDP stack always shards): the exported toml
    shards over the data-parallel ranks; it used to replicate (shard degree 1), which holds every
    state on each rank. A replicate-only toml imports with a note saying what the estimate misses."""
    import tomllib

    inputs = PlanInputs(model="llama-3.1-8b", gpus=8, framework="fsdp2", seq_len=4096)
    (f,) = export_plan(inputs, "torchtitan")
    par = tomllib.loads(f.text)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 8)
    p = tmp_path / "t.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n'
                 "data_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n")
    res = import_configs([p])
    assert res.merged()["zero"] == 0
    assert any("replicates every state" in n and "up to 8x" in n for n in res.notes)


def test_megatron_export_is_valid_bash(tmp_path):
    import subprocess

    (f,) = export_plan(PlanInputs(**ROUND["megatron-tp-pp"]), "megatron")
    subprocess.run(["bash", "-n", "-c", f.text], check=True)
    assert "--tensor-model-parallel-size 4" in f.text and "--seq-length 4096" in f.text


def test_torchtitan_for_loop_adamw_round_trips(tmp_path):
    """torchtitan's [optimizer] implementation = "for-loop" is torch's per-tensor AdamW
    (foreach=False): imported as adamw-loop and exported back as for-loop."""
    from trainledger.runconfig.export_tools import torchtitan_config
    p = tmp_path / "t.toml"
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n'
                 '[optimizer]\nname = "AdamW"\nimplementation = "for-loop"\n')
    m = import_configs([p]).merged()
    assert m["optimizer"] == "adamw-loop"
    plan = build_plan(PlanInputs(**{**m, "gpus": 8, "zero": 3, "framework": "fsdp2"}))
    assert torchtitan_config(plan)["optimizer"]["implementation"] == "for-loop"


def test_trainer_export_refuses_an_optimizer_it_cannot_name():
    with pytest.raises(SpecError, match="adamw-loop"):
        export_plan(PlanInputs(model="llama-3.1-8b", gpus=8, zero=3, optimizer="adamw-loop"), "trainer-args")


@pytest.mark.parametrize("pp,policy,want", [(1, None, True), (2, None, False), (2, "default", False),
                                            (2, "always", True), (1, "never", False), (2, "never", False)])
def test_torchtitan_reshard_policy_under_pipelining(tmp_path, pp, policy, want):
    """torchtitan's fsdp_reshard_after_forward "default" frees the gathered parameters after each
    forward except under PP, where a stage keeps them across its micro-batches (apply_fsdp: "For
    PP, do not reshard after forward"); "always" / "never" force it. The imported plan resolves
    the same way, and its export writes the policy back."""
    from trainledger.runconfig.export_tools import torchtitan_config
    p = tmp_path / "t.toml"
    par = f"pipeline_parallel_degree = {pp}\n" + (f'fsdp_reshard_after_forward = "{policy}"\n' if policy else "")
    p.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 2048\n[parallelism]\n' + par)
    m = import_configs([p]).merged()
    plan = build_plan(PlanInputs(**{**m, "gpus": 8, "zero": 3, "framework": "fsdp2", "pp": pp}))
    assert plan.runtime.reshards_after_forward(plan.layout.pp) is want
    assert torchtitan_config(plan)["parallelism"]["fsdp_reshard_after_forward"] == (
        "default" if want == (pp == 1) else ("always" if want else "never"))


@pytest.mark.parametrize("flavor,untied", [("8B", True), ("0.6B", False)])
def test_torchtitan_wraps_embedding_and_head_on_their_own(tmp_path, flavor, untied):
    """torchtitan's apply_fsdp (since 83e6941, #1094) makes tok_embeddings and [norm, output] FSDP
    groups of their own: an imported untied model gets --wrap layers+embed+head, which frees the
    gathered embedding and head outside their own forward and backward (a smaller peak than the
    root group holding them all step); a tied head (Qwen3 0.6B) stays in the root group."""
    name = "llama3" if flavor == "8B" else "qwen3"
    p = tmp_path / "t.toml"
    p.write_text(f'[model]\nname = "{name}"\nflavor = "{flavor}"\n[training]\nseq_len = 8192\n[parallelism]\n')
    res = import_configs([p])
    assert res.merged().get("wrap") == ("layers+embed+head" if untied else None)
    assert any("--wrap layers" in n for n in res.notes) == untied
    if untied:
        m = {**res.merged(), "gpus": 8, "zero": 3}
        assert _peak(m) < _peak({**m, "wrap": "layers"})


def test_torchtitan_export_refuses_a_grouping_it_cannot_run():
    inputs = PlanInputs(model="llama-3.1-8b", gpus=8, framework="fsdp2", zero=3, seq_len=4096)
    with pytest.raises(SpecError, match="--wrap layers\\+embed\\+head"):
        export_plan(inputs, "torchtitan")
    (f,) = export_plan(inputs.model_copy(update={"wrap": "layers+embed+head"}), "torchtitan")
    assert "[parallelism]" in f.text


def test_megatron_recompute_modules_are_read_whole_and_listed(tmp_path):
    """--recompute-modules takes several values (argparse nargs='+'); anything but the attention core
    is per-module recomputation the estimate sizes as the core's: said, never silent."""
    p = tmp_path / "run.sh"
    base = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 4 "
            "--vocab-size 32000 --seq-length 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--recompute-granularity selective ")
    p.write_text(base + "--recompute-modules mlp moe_act --use-distributed-optimizer\n")
    res = import_configs([p])
    assert res.merged()["recompute"] == "selective" and res.merged()["zero"] == 1
    assert any("--recompute-modules mlp moe_act" in u for u in res.unknown_keys)
    p.write_text(base + "--recompute-modules core_attn\n")
    assert not any("recompute" in u for u in import_configs([p]).unknown_keys)
