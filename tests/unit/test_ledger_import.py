"""`trainledger ledger import`: training logs become measurements `calibrate` fits from."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.ledger import calibrate
from trainledger.cli import main
from trainledger.errors import SpecError
from trainledger.ledger import Ledger
from trainledger.ledger.importer import detect_log, import_log, parse_log
from trainledger.load.plan import PlanInputs

PLAN = PlanInputs(model="llama-3.1-8b", gpus=8, framework="megatron-core", tp=2, zero=1, seq_len=4096,
                  micro_batch=1, grad_accum=4)

# Lines in the format of megatron/training/training.py training_log() and
# megatron/training/utils.py report_memory() (numbers illustrative)
MEGATRON_LOG = """\
 [2026-01-05 10:00:01] iteration        1/     100 | consumed samples:           16 | elapsed time per iteration (ms): 9000.0 | learning rate: 1.0E-05 | global batch size:    16 | lm loss: 1.2E+01 |
[Rank 0] (after 1 iterations) memory (MB) | allocated: 30000.0 | max allocated: 41000.5 | reserved: 45000.0 | max reserved: 45000.0
 [2026-01-05 10:00:03] iteration        2/     100 | consumed samples:           32 | elapsed time per iteration (ms): 2000.0 | learning rate: 2.0E-05 | global batch size:    16 | lm loss: 1.1E+01 |
 [2026-01-05 10:00:05] iteration        3/     100 | consumed samples:           48 | elapsed time per iteration (ms): 2200.0 | learning rate: 3.0E-05 | global batch size:    16 | lm loss: 1.0E+01 |
"""
# torchtitan/components/metrics.py log line, with its ANSI colours (numbers illustrative)
TORCHTITAN_LOG = (
    "[rank0]:[titan] 2026-01-05 10:00:00,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 12.0  "
    "\x1b[33mmemory: 40.10GiB(50.60%)  \x1b[34mtps: 1,000  \x1b[36mtflops: 50.1  \x1b[35mmfu: 5.07%\x1b[39m\n"
    "[rank0]:[titan] 2026-01-05 10:00:09,000 - root - INFO - \x1b[31mstep: 10  \x1b[32mloss: 8.0  "
    "\x1b[33mmemory: 42.50GiB(53.60%)  \x1b[34mtps: 4,096  \x1b[36mtflops: 200.5  \x1b[35mmfu: 20.27%\x1b[39m\n")


def test_megatron_log_is_parsed_and_calibrates(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(MEGATRON_LOG)
    assert detect_log(MEGATRON_LOG, "train.log") == "megatron"
    m = parse_log(MEGATRON_LOG, "megatron", warmup=1)
    assert m["step_time_s"] == pytest.approx(2.1)  # iteration 1 (warm-up) left out
    assert m["peak_allocated_bytes"] == int(41000.5 * 2**20) and m["peak_reserved_bytes"] == 45000 * 2**20
    db = tmp_path / "l.db"
    rec = import_log(log, PLAN, ledger_path=str(db))
    with Ledger(db) as led:
        stored = led.get(rec["id"])
        assert stored.command == "ledger import"
        fitted = calibrate.calibrate(led, stored.env)
    assert fitted["n_measurements"] == 1
    ratio = rec["measured"]["peak_allocated_bytes"] / rec["predicted"]["peak_allocated_bytes"] - 1
    assert fitted["terms"]["runtime_overhead_fraction"]["value"] == pytest.approx(ratio)
    assert fitted["terms"]["step_time_scale"]["value"] == pytest.approx(2.1 / rec["predicted"]["step_time_s"])


def test_torchtitan_log_step_time_from_tokens_per_second(tmp_path):
    log = tmp_path / "titan.log"
    log.write_text(TORCHTITAN_LOG)
    plan = PlanInputs(model="llama-3.1-8b", gpus=8, framework="fsdp2", zero=3, seq_len=8192, micro_batch=1)
    rec = import_log(log, plan, ledger_path=str(tmp_path / "l.db"))
    m = rec["measured"]
    assert m["peak_reserved_bytes"] == int(42.5 * 2**30)
    assert m["step_time_s"] == pytest.approx(8192 / 4096)  # 1 × 8192 tokens per GPU at 4096 tokens/s
    assert m["mfu"] == pytest.approx(0.2027)


def test_trainer_state_json_of_a_real_run(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from trainledger.load.hf import load_hf_config

    cfg = transformers.LlamaConfig(**{k: v for k, v in load_hf_config("tiny-llama-debug").items()
                                      if k not in ("model_type", "architectures")})
    ids = torch.randint(0, cfg.vocab_size, (8, 32))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), per_device_train_batch_size=2,
                                          max_steps=3, use_cpu=True, report_to=[], save_strategy="no")
    tr = transformers.Trainer(model=transformers.LlamaForCausalLM(cfg), args=args,
                              train_dataset=[{"input_ids": r, "labels": r} for r in ids])
    tr.train()
    state = tmp_path / "trainer_state.json"
    tr.state.save_to_json(str(state))
    plan = PlanInputs(model="tiny-llama-debug", seq_len=32, micro_batch=2, gpu="h100-sxm")
    rec = import_log(state, plan, ledger_path=str(tmp_path / "l.db"), device="cpu")
    assert rec["source"] == "import:hf-trainer-state" and rec["measured"]["step_time_s"] > 0
    assert "peak_allocated_bytes" not in rec["measured"]  # skip_memory_metrics defaults to True


def test_trainer_state_memory_metrics_give_the_peak():
    d = {"global_step": 10, "log_history": [
        {"loss": 2.0, "step": 5},
        {"train_runtime": 20.0, "train_steps_per_second": 0.5, "step": 10,
         "init_mem_gpu_alloc_delta": 16 * 2**30, "train_mem_gpu_alloc_delta": 32 * 2**30,
         "train_mem_gpu_peaked_delta": 8 * 2**30}]}
    m = parse_log(json.dumps(d), "hf-trainer-state")
    assert m["peak_allocated_bytes"] == 56 * 2**30 and m["step_time_s"] == 2.0


def test_wandb_summary_export():
    summary = {"_runtime": 3600.0, "_step": 1000, "train/train_steps_per_second": 0.25,
               "system.gpu.0.memoryAllocatedBytes": 70 * 2**30, "system.gpu.1.memoryAllocatedBytes": 72 * 2**30}
    text = json.dumps(summary)
    assert detect_log(text, "wandb-summary.json") == "wandb"
    m = parse_log(text, "wandb")
    assert m["step_time_s"] == 4.0 and m["device_used_bytes"] == 72 * 2**30


def test_unknown_log_is_a_clear_error():
    with pytest.raises(SpecError, match="not a training log"):
        detect_log("hello\nworld\n", "x.log")


def test_cli_ledger_import(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(MEGATRON_LOG)
    db = tmp_path / "l.db"
    r = CliRunner().invoke(main, ["ledger", "import", str(log), "--ledger", str(db), "--model", "llama-3.1-8b",
                                  "--gpus", "8", "--tp", "2", "--zero", "1", "--framework", "megatron-core",
                                  "--seq-len", "4096", "--grad-accum", "4", "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["source"] == "import:megatron" and rec["id"] >= 1
    r = CliRunner().invoke(main, ["calibrate", "--ledger", str(db), "--env", rec["env_id"], "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_measurements"] == 1
