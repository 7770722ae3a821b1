"""Training-run recorders: a tiny transformers model trained a few CPU steps with the callback writes
a ledger record (measured vs predicted, plan derived in-process) that `calibrate` fits from."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainledger.ledger import calibrate  # noqa: E402
from trainledger.load.hf import load_hf_config  # noqa: E402
from trainledger.ledger import Ledger  # noqa: E402
from trainledger.verify.callbacks import RUN_COMMAND, LedgerCallback, LightningLedgerCallback, track_run  # noqa: E402


def _tiny_model():
    cfg = transformers.LlamaConfig(**{k: v for k, v in load_hf_config("tiny-llama-debug").items()
                                      if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg), cfg


@pytest.fixture()
def ledger_path(tmp_path, monkeypatch):
    p = tmp_path / "ledger.db"
    monkeypatch.setenv("TRAINLEDGER_LEDGER", str(p))
    return p


def test_trainer_callback_records_a_run_that_calibrate_uses(ledger_path, tmp_path):
    model, cfg = _tiny_model()
    ids = torch.randint(0, cfg.vocab_size, (16, 64))
    ds = [{"input_ids": r, "labels": r} for r in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                                          max_steps=4, use_cpu=True, report_to=[], save_strategy="no")
    cb = LedgerCallback()
    transformers.Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    res = cb.result
    m, p = res["measured"], res["predicted"]
    assert m["device"] == "cpu" and m["steps"] == 4 and m["step_time_s"] > 0
    assert res["plan"]["seq_len"] == 64 and res["plan"]["micro_batch"] == 2 and res["plan"]["method"] == "full"
    assert m["tokens_per_s"] == pytest.approx(2 * 64 / m["step_time_s"], rel=0.3)
    # the estimate of the derived plan is within 10% of the tracked peak (exact storage accounting)
    assert abs(m["peak_allocated_bytes"] / p["peak_allocated_bytes"] - 1) < 0.10
    with Ledger(ledger_path) as led:
        (rec,) = led.list(kind="measurement")
        assert rec.command == RUN_COMMAND
        fitted = calibrate.calibrate(led, rec.env)
    assert fitted["n_measurements"] == 1 and fitted["record_ids"] == [rec.id]
    assert fitted["terms"]["runtime_overhead_fraction"]["n"] == 1


def test_plain_loop_context_manager_with_peft_lora(ledger_path):
    peft = pytest.importorskip("peft")
    model, cfg = _tiny_model()
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with track_run(model, store=True) as run:
        for _ in range(3):
            with run.step():
                ids = torch.randint(0, cfg.vocab_size, (2, 32))
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
    res = run.result
    assert res["plan"]["method"] == "lora" and res["plan"]["lora_rank"] == 4
    assert res["plan"]["lora_targets"] == ["q_proj", "v_proj"]
    assert (res["plan"]["seq_len"], res["plan"]["micro_batch"]) == (32, 2)
    assert abs(res["measured"]["peak_allocated_bytes"] / res["predicted"]["peak_allocated_bytes"] - 1) < 0.15


def test_recorder_overhead_is_measured_and_small():
    """Timing-only mode (what a CUDA run costs: counters read once): the recorder's own time."""
    model, cfg = _tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with track_run(model, store=False, track_cpu=False) as run:
        for _ in range(5):
            with run.step():
                ids = torch.randint(0, cfg.vocab_size, (2, 32))
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
    m = run.result["measured"]
    total = m["step_time_s"] * (m["steps"] - m["warmup_steps"])
    assert m["recorder_overhead_s"] < 0.01 * total + 0.5  # plan derivation + estimate at the end included


def test_estimate_and_measurement_go_to_an_active_wandb_run(monkeypatch):
    from trainledger.verify.callbacks import _log_external

    summary: dict = {}
    fake = types.SimpleNamespace(run=types.SimpleNamespace(summary=summary))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    _log_external({"measured": {"peak_allocated_bytes": 2**30, "step_time_s": 0.5},
                   "predicted": {"peak_allocated_bytes": 2**31, "step_time_s": 0.4}}, "auto")
    assert summary["trainledger/measured_peak_allocated_gib"] == 1.0
    assert summary["trainledger/predicted_peak_allocated_gib"] == 2.0


def test_lightning_callback_needs_lightning():
    try:
        import lightning  # noqa: F401
    except ImportError:
        from trainledger.errors import MissingDependency

        with pytest.raises(MissingDependency, match="lightning"):
            LightningLedgerCallback()
    else:
        assert LightningLedgerCallback() is not None


def test_lightning_callback_records_a_run(ledger_path, tmp_path):
    lightning = pytest.importorskip("lightning")
    model, cfg = _tiny_model()

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.DataLoader(torch.randint(0, cfg.vocab_size, (8, 32)), batch_size=2)
    cb = LightningLedgerCallback()
    trainer = lightning.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, callbacks=[cb], default_root_dir=str(tmp_path))
    trainer.fit(Module(), data)
    res = cb.result
    assert res["plan"]["seq_len"] == 32 and res["plan"]["micro_batch"] == 2
    assert res["measured"]["steps"] == 3
    assert abs(res["measured"]["peak_allocated_bytes"] / res["predicted"]["peak_allocated_bytes"] - 1) < 0.15
