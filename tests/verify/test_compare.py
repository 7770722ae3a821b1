"""Measured vs predicted memory: the term -> category mapping and `verify memory`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.verify import compare as C

MIB = 2**20


def test_mapping_sums_terms_into_categories():
    pred = C.predicted_by_category({"weights": 100, "master_weights": 50, "dynamic_cache": 7, "activations": 3,
                                    "kv_cache": 5, "ddp_buckets": 11, "some_new_term": 1, "logits": 9})
    # DDP's buckets are a runtime buffer: the sharded measurement files them under sharding_buffers
    assert pred["weights"] == 150 and pred["activations"] == 15 and pred["other"] == 1
    assert pred["sharding_buffers"] == 11
    assert pred["logits"] == 9 and pred["gradients"] == 0
    assert set(C.TERM_TO_CATEGORY.values()) <= set(C.CATEGORIES)


def test_compare_memory_rows():
    measured = {"peak_allocated_bytes": 1000, "peak_reserved_bytes": None, "peak_phase": "backward",
                "categories_at_peak": {"weights": 400, "activations": 500, "other": 100},
                "phase_peaks": {"forward": 900, "backward": 1000}}
    predicted = {"peak_allocated_bytes": 1100, "peak_phase": "backward",
                 "breakdown": {"weights": 400, "activations": 600, "dynamic_cache": 100},
                 "phases": {"forward": 950, "backward": 1100}}
    c = C.compare_memory(measured, predicted)
    rows = {r["name"]: r for r in c["categories"]}
    assert rows["activations"]["measured"] == 500 and rows["activations"]["predicted"] == 700
    assert rows["activations"]["relative_error"] == pytest.approx(0.4)  # (700 - 500) / 500
    assert rows["other"]["predicted"] == 0 and rows["other"]["relative_error"] == pytest.approx(-1.0)
    assert rows["weights"]["difference"] == 0
    assert [r["name"] for r in c["totals"]] == ["peak allocated"]  # no reserved number on CPU
    assert c["totals"][0]["relative_error"] == pytest.approx(0.1)
    assert c["mapping"]["dynamic_cache"] == "activations"
    assert C.compare_time(0.5, 0.4, "cpu")["note"].startswith("measured on CPU")
    assert "note" not in C.compare_time(0.5, 0.4, "cuda") and C.compare_time(None, 1.0, "cuda") is None


def fake_measurement(**kw):
    d = {"peak_allocated_bytes": 10 * MIB, "peak_reserved_bytes": None, "peak_phase": "optimizer",
         "phase_peaks": {"forward": 8 * MIB}, "categories_at_peak": {"weights": 10 * MIB}, "device": "cpu",
         "step_time_s": 0.1, "oom": False, "oom_phase": None, "notes": []}
    d.update(kw)
    return SimpleNamespace(to_dict=lambda: d)


# foreach AdamW: its step counters are host tensors, so the measured Adam states are exactly the two
# moments (fused AdamW, the hf default, keeps a step tensor per parameter on the device)
ARGS = ["verify", "memory", "--model", "tiny-llama-debug", "--seq-len", "32", "--precision", "fp32",
        "--optimizer", "adamw"]


def test_cli_tolerance_and_oom_exit_codes(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    import trainledger.verify.measure as M

    monkeypatch.setattr(M, "measure_memory", lambda plan, device, steps: fake_measurement(peak_allocated_bytes=1))
    r = CliRunner().invoke(main, ARGS + ["--tolerance", "0.1", "--no-ledger"])
    assert r.exit_code == 1 and "FAIL  peak error" in r.output
    monkeypatch.setattr(M, "measure_memory", lambda plan, device, steps: fake_measurement(
        oom=True, oom_phase="backward", peak_allocated_bytes=80 * 2**30))
    r = CliRunner().invoke(main, ARGS + ["--no-ledger"])
    assert r.exit_code == 1 and "does not fit: out of memory in backward (80.00 GiB allocated)" in r.output


@pytest.mark.slow
def test_cli_memory_on_cpu(tmp_path):
    pytest.importorskip("torch")
    db = tmp_path / "l.db"
    r = CliRunner().invoke(main, ARGS + ["--device", "cpu", "--json", "--ledger", str(db)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    m, p = d["measured"], d["predicted"]
    assert m["peak_allocated_bytes"] > 0 and m["device"] == "cpu" and p["peak_allocated_bytes"] > 0
    assert set(m["phase_peaks"]) >= {"forward", "backward", "optimizer"}
    cats = {row["name"]: row for row in d["comparison"]["categories"]}
    # fp32 AdamW on the tiny preset: weights, gradients and both Adam moments are exact on both sides
    assert cats["weights"]["measured"] > 0 and cats["optimizer_states"]["measured"] == 2 * cats["weights"]["measured"]
    r = CliRunner().invoke(main, ["calibrate", "--ledger", str(db), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["n_measurements"] == 1


def test_missing_torch_names_the_extra(monkeypatch):
    import trainledger.cli.verify_cmds as V

    monkeypatch.setattr(V.importlib.util, "find_spec", lambda name: None)
    for cmd in (["verify", "memory"], ["verify", "comm"], ["verify", "accept"], ["verify", "scaling"]):
        r = CliRunner().invoke(main, cmd + ["--no-ledger"])
        assert r.exit_code == 2 and "pip install 'trainledger[verify]'" in r.output, cmd
