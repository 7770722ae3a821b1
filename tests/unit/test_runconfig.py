"""Export a plan as launch configs, read configs back, and check them with the real libraries."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from trainledger.errors import PlanError, SpecError
from trainledger.load.plan import PlanInputs, build_plan
from trainledger.runconfig import EXPORT_FORMATS, export_plan, import_configs
from trainledger.runconfig.arch import DECODER_LAYER_CLASS

LORA_8 = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, method="lora", lora_rank=32,
              lora_targets=("k_proj", "o_proj", "q_proj", "v_proj"), seq_len=2048, micro_batch=2,
              grad_accum=4, recompute="full", optimizer="adamw-fused", tokens=1e9)
FSDP_16 = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=16, zero=3, framework="fsdp2", seq_len=4096, micro_batch=1,
               grad_accum=2, recompute="full", precision="bf16-mixed")
ZERO2_OFF = dict(model="qwen2.5-7b", gpu="h100-sxm", gpus=8, zero=2, offload="optimizer", framework="deepspeed",
                 micro_batch=4, grad_accum=8, precision="fp16-mixed", seq_len=1024)
QLORA_1 = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=1, method="qlora", lora_rank=64,
               micro_batch=4, seq_len=2048)
PLANS = {"lora8": LORA_8, "fsdp16": FSDP_16, "zero2off": ZERO2_OFF, "qlora1": QLORA_1}


def _write(files, out: Path, strip_header: bool = False) -> list[Path]:
    paths = []
    for f in files:
        text = f.text
        if strip_header:
            if f.name.endswith(".json"):
                d = json.loads(text)
                d.pop("_trainledger", None)
                text = json.dumps(d)
            else:
                text = re.sub(r"^# trainledger-plan:.*$", "", text, flags=re.M)
        p = out / f.name
        p.write_text(text)
        paths.append(p)
    return paths


def test_decoder_layer_classes_exist_in_transformers():
    for model_type, cls in DECODER_LAYER_CLASS.items():
        mt = {"gemma3_text": "gemma3"}.get(model_type, model_type)
        mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        assert hasattr(mod, cls), f"{model_type}: transformers has no {cls}"


@pytest.mark.parametrize("name", list(PLANS))
@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_every_file_has_a_header_with_predictions(name, fmt, tmp_path):
    inputs = PlanInputs(**PLANS[name])
    try:
        files = export_plan(inputs, fmt)
    except SpecError as exc:  # e.g. fsdp export of a non-ZeRO-3 plan: an explained refusal
        assert fmt not in ("torchrun", "slurm")  # launchers never refuse
        assert any(w in str(exc) for w in ("ZeRO", "zero", "framework", "flavor", "trains all weights", "--wrap"))
        return
    for f in files:
        assert "trainledger" in f.text[:600]
        assert "peak" in f.text[:800].lower()
        assert PLANS[name]["model"] in f.text


def _roundtrip_files(name: str, tmp_path: Path, strip: bool) -> list[Path]:
    inputs = PlanInputs(**PLANS[name])
    plan = build_plan(inputs)
    fmts = ["trainer-args", "slurm"]
    if plan.layout.zero in (1, 2) or plan.layout.offload == "optimizer":
        fmts.append("deepspeed")
    elif plan.layout.zero == 3:
        fmts.append("fsdp")
    files = []
    for fmt in fmts:
        files += export_plan(inputs, fmt)
    return _write(files, tmp_path, strip_header=strip)


def _expected(name: str) -> dict:
    """A DeepSpeed config carries the DeepSpeed runtime: plans exported through one come back with
    framework deepspeed (whose memory semantics the export was judged under)."""
    spec = PLANS[name]
    plan = build_plan(PlanInputs(**spec))
    lay = plan.layout
    if lay.zero in (1, 2) or lay.offload == "optimizer":
        return {**spec, "framework": "deepspeed"}
    if plan.runtime.loading(lay.zero, lay.tp) == "sharded":
        # accelerate has no sharded load (torchtitan's): its FSDP2 loads one copy per node
        return {**spec, "model_loading": "rank0"}
    return spec


@pytest.mark.parametrize("name", list(PLANS))
def test_roundtrip_with_header(name, tmp_path):
    paths = _roundtrip_files(name, tmp_path, strip=False)
    res = import_configs(paths)
    assert not res.unknown_keys
    back = build_plan(PlanInputs(**res.merged()))
    assert back == build_plan(PlanInputs(**_expected(name)))


@pytest.mark.parametrize("name", list(PLANS))
def test_roundtrip_from_real_keys_only(name, tmp_path):
    """Without our header, the real config keys alone carry the recipe and layout back; only
    what those formats cannot hold (model, GPU type, seq length, token budget) is given again."""
    paths = _roundtrip_files(name, tmp_path, strip=True)
    res = import_configs(paths)
    assert res.header == {}
    spec = PLANS[name]
    given = {k: spec[k] for k in ("model", "gpu", "seq_len", "tokens") if k in spec}
    back = build_plan(PlanInputs(**{**res.merged(), **given}))
    assert back == build_plan(PlanInputs(**_expected(name)))


@pytest.mark.parametrize("name", ["lora8", "fsdp16", "zero2off"])
def test_accelerate_roundtrip_and_loads_in_accelerate(name, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    inputs = PlanInputs(**PLANS[name])
    paths = _write(export_plan(inputs, "accelerate"), tmp_path)
    cfg = load_config_from_file(str(paths[0]))  # accelerate rejects unknown keys itself
    plan = build_plan(inputs)
    assert cfg.num_processes == plan.cluster.world_size
    assert cfg.num_machines == plan.cluster.nodes
    # accelerate + trainer args together give the plan back
    paths += _write(export_plan(inputs, "trainer-args"), tmp_path)
    res = import_configs(paths)
    assert build_plan(PlanInputs(**res.merged())) == build_plan(PlanInputs(**_expected(name)))


@pytest.mark.parametrize("name", list(PLANS))
def test_training_args_construct_in_transformers(name, tmp_path):
    from transformers import HfArgumentParser, TrainingArguments

    inputs = PlanInputs(**PLANS[name])
    files = export_plan(inputs, "trainer-args")
    paths = _write(files, tmp_path)
    args_path = next(p for p in paths if p.name == "training_args.yaml")
    data = yaml.safe_load(args_path.read_text())
    data.pop("fsdp", None), data.pop("fsdp_config", None), data.pop("deepspeed", None)
    data["output_dir"] = str(tmp_path / "ckpt")
    data["use_cpu"] = True
    if data.get("bf16") or data.get("fp16"):
        data["bf16"] = data["fp16"] = False  # no GPU here; precision keys were checked by round trip
    # the file is a TRL config (trl sft --config): TrainingArguments plus TRL's model/SFT keys
    trl_keys = {"model_name_or_path", "max_length", "use_peft", "lora_r", "lora_alpha",
                "lora_target_modules", "load_in_4bit"}
    assert set(data) - {f.name for f in dataclasses.fields(TrainingArguments)} <= trl_keys
    assert data["max_length"] == inputs.seq_len
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(data, allow_extra_keys=True)
    plan = build_plan(inputs)
    assert args.per_device_train_batch_size == plan.recipe.micro_batch
    assert args.gradient_accumulation_steps == plan.recipe.grad_accum
    lora = next((p for p in paths if p.name == "lora_config.yaml"), None)
    if plan.recipe.method in ("lora", "qlora"):
        from peft import LoraConfig

        cfg = LoraConfig(**yaml.safe_load(lora.read_text()))
        assert cfg.r == plan.recipe.lora_rank
        assert set(cfg.target_modules) == set(plan.recipe.lora_targets)


@pytest.mark.parametrize("name", ["zero2off", "lora8"])
def test_deepspeed_config_parses_in_deepspeed(name, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed not installed (make test installs it)")
    from deepspeed.runtime.config import DeepSpeedConfig

    inputs = PlanInputs(**{**PLANS[name], "zero": 2, "framework": "deepspeed"})
    plan = build_plan(inputs)
    d = json.loads(export_plan(inputs, "deepspeed")[0].text)

    class _Mpu:  # DeepSpeed reads the data-parallel size from an mpu object
        def get_data_parallel_world_size(self):
            return plan.layout.dp_size

    import deepspeed.comm as dist

    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    cfg = DeepSpeedConfig(d, mpu=_Mpu())
    assert cfg.train_batch_size == plan.global_batch
    assert cfg.zero_optimization_stage == 2
    assert cfg.gradient_accumulation_steps == plan.recipe.grad_accum


def test_fsdp_json_constructs_training_arguments(tmp_path):
    from transformers import TrainingArguments

    inputs = PlanInputs(**FSDP_16)
    (f,) = export_plan(inputs, "fsdp")
    d = json.loads(f.text)
    assert d["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    cfg_path = tmp_path / "fsdp_config.json"
    cfg_path.write_text(json.dumps(d["fsdp_config"]))
    args = TrainingArguments(output_dir=str(tmp_path), fsdp=d["fsdp"], fsdp_config=str(cfg_path), use_cpu=True)
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]


def test_torchrun_export_runs_a_two_process_cpu_job(tmp_path):
    inputs = PlanInputs(model="tiny-llama-debug", gpu="h100-sxm", gpus=2, seq_len=64)
    (f,) = export_plan(inputs, "torchrun")
    script = tmp_path / f.name
    script.write_text(f.text)
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():.0f}")
        dist.destroy_process_group()
    """))
    env = {**os.environ, "TRAIN_SCRIPT": str(train), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rank 0 of 2 sum 3" in out.stdout and "rank 1 of 2 sum 3" in out.stdout


def test_slurm_script_requests_the_plans_nodes(tmp_path):
    (f,) = export_plan(PlanInputs(**FSDP_16), "slurm")
    assert "#SBATCH --nodes=2" in f.text and "#SBATCH --gpus-per-node=8" in f.text
    assert "--nnodes=2" in f.text and "--nproc-per-node=8" in f.text
    subprocess.run(["bash", "-n", "-c", f.text], check=True)


def test_contradicting_batch_sizes_show_the_arithmetic(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 4}))
    with pytest.raises(PlanError, match=r"2 × 4 = 8 does not divide 30"):
        import_configs([ds])
    ds.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 4}))
    acc = tmp_path / "acc.yaml"
    acc.write_text("distributed_type: DEEPSPEED\nnum_processes: 4\nnum_machines: 1\n")
    with pytest.raises(PlanError, match=r"dp = 8.*4 GPUs"):
        import_configs([acc, ds])


def test_files_that_disagree_are_an_error(tmp_path):
    a = tmp_path / "ds.json"
    a.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    b = tmp_path / "args.json"
    b.write_text(json.dumps({"per_device_train_batch_size": 4, "output_dir": "x"}))
    with pytest.raises(PlanError, match="micro_batch: ds.json says 2 but args.json says 4"):
        import_configs([a, b])


def test_unknown_keys_are_reported_not_ignored(tmp_path):
    b = tmp_path / "args.json"
    b.write_text(json.dumps({"per_device_train_batch_size": 4, "output_dir": "x", "learning_rate": 1e-4,
                             "per_device_batch": 8}))
    res = import_configs([b])
    assert res.unknown_keys == ["args.json: per_device_batch"]
    assert "args.json: learning_rate" in res.ignored_keys
    assert res.merged()["micro_batch"] == 4


def test_auto_values_defer_to_other_files(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                              "train_batch_size": "auto", "zero_optimization": {"stage": 3}}))
    args = tmp_path / "args.yaml"
    args.write_text("per_device_train_batch_size: 2\ngradient_accumulation_steps: 8\noutput_dir: x\n")
    res = import_configs([ds, args])
    m = res.merged()
    assert (m["micro_batch"], m["grad_accum"], m["zero"]) == (2, 8, 3)


def test_not_a_config_file_is_a_clear_error(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SpecError, match="not a DeepSpeed, Accelerate"):
        import_configs([p])
    with pytest.raises(SpecError, match="no such file"):
        import_configs([tmp_path / "missing.json"])


def test_cli_export_then_estimate_from(tmp_path):
    from click.testing import CliRunner

    from trainledger.cli import main

    r = CliRunner().invoke(main, ["export", "--model", "llama-3.1-8b", "--gpus", "8", "--method", "lora",
                                  "--to", "accelerate", "--to", "trainer-args", "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    written = json.loads(r.output)["files"]
    assert {Path(w["path"]).name for w in written} == {"accelerate_config.yaml", "training_args.yaml", "lora_config.yaml"}
    args = ["estimate", "--model", "llama-3.1-8b"]
    for w in written:
        args += ["--from", w["path"]]
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)["plan"]  # notes on what was read go to stderr
    assert plan["method"] == "lora" and plan["gpus"] == 8


@pytest.mark.parametrize("zero,strategy", [(0, "FULL_SHARD"), (1, "SHARD_GRAD_OP"), (2, "SHARD_GRAD_OP"),
                                           (3, "FULL_SHARD")])
def test_fsdp_stack_exports_the_sharding_the_models_price(zero, strategy, tmp_path):
    """On an FSDP stack every --zero shards (memory.runtimes.fsdp_sharded, time.step.fsdp_shards):
    0 is FULL_SHARD, 1 (FSDP has no optimizer-only sharding) SHARD_GRAD_OP, as the estimate prices."""
    inputs = PlanInputs(model="llama-3.2-1b", gpus=8, framework="pytorch-fsdp", zero=zero)
    paths = _write(export_plan(inputs, "accelerate"), tmp_path)
    cfg = yaml.safe_load(paths[0].read_text())
    assert cfg["distributed_type"] == "FSDP"
    assert cfg["fsdp_config"]["fsdp_sharding_strategy"] == strategy


def test_accelerate_fsdp_no_shard_imports_as_ddp(tmp_path):
    """FSDP's NO_SHARD replicates like DDP: the hf stack without ZeRO (on an FSDP stack every
    --zero shards)."""
    from trainledger.estimate.time import estimate_compute

    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP",
                                    "num_machines": 1, "num_processes": 8,
                                    "fsdp_config": {"fsdp_sharding_strategy": "NO_SHARD"}}))
    res = import_configs([path])
    merged = res.merged()
    assert merged["framework"] == "hf" and merged["zero"] == 0
    plan = build_plan(PlanInputs(model="llama-3.2-1b", **merged))
    bd = estimate_compute(plan).breakdown
    assert bd.get("ddp_copy", 0.0) > 0 and bd.get("fsdp_copy", 0.0) == 0.0


@pytest.mark.parametrize("zero,words", [(2, "shard_grad_op"), (3, "full_shard"), (0, "full_shard")])
def test_trainer_args_fsdp_words_follow_the_priced_sharding(zero, words, tmp_path):
    inputs = PlanInputs(model="llama-3.2-1b", gpus=8, framework="pytorch-fsdp", zero=zero)
    paths = _write(export_plan(inputs, "trainer-args"), tmp_path)
    args = yaml.safe_load(next(p for p in paths if p.name == "training_args.yaml").read_text())
    assert args["fsdp"] == f"{words} auto_wrap"
    # and the Trainer's fsdp words come back as the same plan
    back = import_configs(paths).merged()
    assert build_plan(PlanInputs(**{**back, "model": "llama-3.2-1b"})).layout.zero == (2 if zero == 2 else 3)
