"""verify accept: item logic, checkpoint manifest, the CPU end-to-end run and injected faults."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import VerifyError
from trainledger.load.plan import build_plan, parse_inputs
from trainledger.verify import accept as A
from trainledger.verify._accept_worker import MANIFEST, file_digests, verify_manifest

TINY = {"model": "tiny-llama-debug", "precision": "fp32", "seq_len": 16, "gpus": 2}


def test_compare_losses():
    assert A.compare_losses([1.0, 2.0], [1.0, 2.0], 1e-5) == (True, "bitwise identical")
    ok, how = A.compare_losses([1.0, 2.0], [1.0, 2.000001], 1e-5)
    assert ok and "max relative difference 5.00e-07" in how
    ok, how = A.compare_losses([1.0], [1.1], 1e-5)
    assert not ok and "> tolerance" in how
    assert A.compare_losses([1.0, 2.0], [1.0], 1e-5)[0] is False


def test_phase_to_item():
    assert A._item_of_phase("backward step 3") == "forward/backward"
    assert A._item_of_phase("grad-accum check") == "gradient accumulation"
    assert A._item_of_phase("save checkpoint") == "checkpoint save"
    assert A._item_of_phase(None) == "load"


def run_result(**over):
    r = {"params": 10, "world_size": 2, "device": "cpu", "backend": "gloo", "sharded": False, "load_seconds": 1.0,
         "param_dtype": "float32", "seq_len": 16, "micro_batch": 1, "grad_accum": 1,
         "grad_accum_check": {"ok": True, "relative_error": 1e-7, "rtol": 1e-4},
         "params_changed_by_step": True, "checkpoint": {"files": 3, "bytes": 100, "seconds": 0.1},
         "losses_before": [5.0], "losses_after": [4.9], "grad_norms": [1.0, 1.0],
         "ranks": [{"rank": i, "steps": 2, "tokens": 32, "nonzero_grad_steps": 2, "finite": True,
                    "checksum": "abc"} for i in range(2)]}
    r.update(over)
    return r


def test_items_from_results():
    plan = build_plan(parse_inputs(TINY))
    items = A.build_items(plan, run_result(), run_result(losses_before=[]), None)
    assert [i["item"] for i in items] == list(A.ITEMS) and all(i["status"] == "pass" for i in items)
    lazy = run_result(ranks=[{"rank": 0, "steps": 2, "tokens": 32, "nonzero_grad_steps": 2, "finite": True,
                              "checksum": "a"},
                             {"rank": 1, "steps": 2, "tokens": 32, "nonzero_grad_steps": 0, "finite": True,
                              "checksum": "b"}])
    st = {i["item"]: i["status"] for i in A.build_items(plan, lazy, lazy, None)}
    assert st["every rank did work"] == "fail" and st["checksums agree"] == "fail"
    drift = {i["item"]: i for i in A.build_items(plan, run_result(), run_result(losses_after=[4.8]), None)}
    assert drift["continued loss"]["status"] == "fail"
    bf16 = {i["item"]: i["status"] for i in A.build_items(plan, run_result(param_dtype="bfloat16"), None, "boom")}
    assert bf16["precision"] == "fail" and bf16["restore in a fresh process"] == "fail"
    assert bf16["continued loss"] == "not run"
    skipped = run_result(grad_accum_check={"ok": None, "rtol": 1e-4, "relative_error": None, "skipped": "too big"})
    items = A.build_items(plan, skipped, run_result(), None)
    assert [i["status"] for i in items].count("skip") == 1
    assert A._finish({}, plan, skipped, run_result())["ok"] is True  # a skipped check is not a failure
    failed = A.build_items(plan, None, None, "rank 1 died", phase="backward step 0")
    assert [i["status"] for i in failed[:4]] == ["not run", "not run", "not run", "fail"]
    assert failed[3]["item"] == "forward/backward" and failed[3]["detail"] == "rank 1 died"


def test_manifest_detects_corruption(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "a.bin").write_bytes(b"x" * 1000)
    (ck / "b.bin").write_bytes(b"y" * 10)
    (ck / MANIFEST).write_text(json.dumps({"files": file_digests(ck)}))
    assert set(verify_manifest(ck)) == {"a.bin", "b.bin"}
    assert A.corrupt(ck) == "a.bin"
    with pytest.raises(VerifyError, match="file a.bin is corrupted"):
        verify_manifest(ck)
    (ck / "b.bin").unlink()
    with pytest.raises(VerifyError, match="b.bin is missing|a.bin is corrupted"):
        verify_manifest(ck)
    (ck / MANIFEST).unlink()
    with pytest.raises(VerifyError, match="no manifest.json"):
        verify_manifest(ck)


@pytest.mark.slow
def test_cli_accept_fsdp_two_gloo_ranks(tmp_path):
    """End to end: FSDP2 (ZeRO-3) with bf16 autocast, accumulation, checkpoint, fresh restore."""
    pytest.importorskip("torch")
    out = tmp_path / "report.json"
    r = CliRunner().invoke(main, ["verify", "accept", "--model", "tiny-llama-debug", "--precision", "bf16-mixed",
                                  "--zero", "3", "--seq-len", "32", "--micro-batch", "2", "--grad-accum", "2",
                                  "--gpus", "2", "--nproc", "2", "--steps-before", "1", "--steps-after", "2",
                                  "--out", str(out), "--ledger", str(tmp_path / "l.db"), "--timeout", "180"])
    assert r.exit_code == 0, r.output
    assert r.output.count("  PASS ") == len(A.ITEMS) and "bitwise identical" in r.output
    rep = json.loads(out.read_text())
    assert rep["ok"] is True and [i["status"] for i in rep["items"]] == ["pass"] * len(A.ITEMS)
    assert rep["run"]["sharded"] is True and rep["run"]["losses_after"] == rep["restore"]["losses_after"]
    # the interface later benchmarks read: measured (CUDA allocator numbers; None on CPU) and predicted
    assert rep["measured"]["peak_allocated_bytes"] is None and rep["measured"]["device"] == "cpu"
    assert rep["predicted"]["peak_allocated_bytes"] > 0 and "breakdown" in rep["predicted"]
    # every rank trained 3 steps x 2 micro-batches x 2 samples x 32 tokens on its own shard
    assert [x["tokens"] for x in rep["run"]["ranks"]] == [3 * 2 * 2 * 32] * 2
    assert len({x["checksum"] for x in rep["run"]["ranks"]}) == 2
    r = CliRunner().invoke(main, ["ledger", "list", "--ledger", str(tmp_path / "l.db")])
    assert "verify accept" in r.output and "10/10 items pass" in r.output


def fault(spec: str, **kw):
    inputs = parse_inputs(TINY)
    t0 = time.monotonic()
    rep = A.run_accept(inputs, "cpu", 2, 1, 1, timeout_s=120, env={"TRAINLEDGER_FAULT": spec}, **kw)
    return rep, time.monotonic() - t0


@pytest.mark.slow
def test_killed_rank():
    rep, dt = fault("kill:1:backward", collective_timeout_s=30)
    assert rep["ok"] is False and dt < 60
    bad = next(i for i in rep["items"] if i["status"] == "fail")
    assert bad["item"] == "forward/backward"
    assert "rank 1 stopped during 'backward step 0'" in bad["detail"] and "SIGKILL" in bad["detail"]


@pytest.mark.slow
def test_out_of_memory_is_a_result():
    rep, _ = fault("oom:0:backward", collective_timeout_s=30)
    assert rep["ok"] is False
    assert rep["error"].startswith("does not fit: out of memory during 'backward step 0'")


@pytest.mark.slow
def test_corrupted_checkpoint():
    """DDP fp32: the first run passes every item up to the save; the restore sees the damage."""
    rep, _ = fault("corrupt-checkpoint:0:x", collective_timeout_s=30)
    st = {i["item"]: i for i in rep["items"]}
    assert [st[n]["status"] for n in A.ITEMS[:6]] == ["pass"] * 6, A.render(rep)
    assert rep["run"]["sharded"] is False
    assert st["restore in a fresh process"]["status"] == "fail"
    assert "is corrupted (sha256" in st["restore in a fresh process"]["detail"]
    assert rep["ok"] is False and rep["fault"].startswith("corrupted ")


@pytest.mark.slow
def test_hung_rank_times_out():
    rep, dt = fault("hang:1:optimizer", collective_timeout_s=4)
    assert rep["ok"] is False and dt < 90
    assert "rank 1 stopped during 'optimizer step 0'" in rep["error"]


@pytest.mark.gpu
def test_accept_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    n = min(2, torch.cuda.device_count())
    inputs = parse_inputs({**TINY, "precision": "bf16-mixed", "gpus": n})
    rep = A.run_accept(inputs, "cuda", n, 1, 1, timeout_s=300)
    assert rep["ok"] is True, A.render(rep)
    m = rep["measured"]
    assert m["peak_allocated_bytes"] > 0 and set(m["phase_peaks"]) == {"forward", "backward", "optimizer"}
