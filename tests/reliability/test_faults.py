"""Faults end in a clear failure record, never a hang, and never lose what was stored (issue 9).

Covered elsewhere and not repeated here: a killed rank, an injected OOM, a hung rank and a
corrupted checkpoint in ``verify accept`` (tests/verify/test_accept.py, tests/verify/test_comm.py);
two ledger writers at once and a ledger writer killed mid-transaction or at a random moment
(tests/unit/test_ledger.py). Added here: the timeout audit of every blocking call, a full disk
under the ledger, the report writer and the acceptance checkpoint, a crash between a report's
write and its rename, and a corpus worker killed by the OS.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap

import pytest
from faults_lib import (accept_full_disk, corpus_dead_worker, ledger_full_disk, report_full_disk,
                        small_disk, timeout_audit)

from trainledger.verify.launch import error_line


def _can_mount() -> bool:
    with small_disk(16) as d:
        return d is not None


needs_tmpfs = pytest.mark.skipif(not _can_mount(), reason="cannot mount a tmpfs (needs root on Linux)")


def test_every_blocking_call_has_a_timeout():
    rows = timeout_audit()
    kinds = {r["call"] for r in rows}
    assert {"subprocess.Popen", "init_process_group"} <= kinds, rows  # the audit sees the launcher
    missing = [r for r in rows if not r["timeout"]]
    assert not missing, f"blocking calls without a timeout: {missing}"


def test_init_process_group_gets_the_collective_timeout(monkeypatch):
    """Collectives inherit the process group's timeout: init_distributed must always pass one."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    from trainledger.verify import launch

    seen = {}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(kw, backend=backend))
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    try:
        launch.init_distributed("cpu", 7.0)
    except Exception:  # anything after the call (device setup) is not what this test is about
        pass
    assert seen.get("timeout") is not None and seen["timeout"].total_seconds() == 7.0


def test_error_line_names_a_full_disk():
    class CheckpointException(BaseException):  # the shape of torch.distributed.checkpoint's
        def __init__(self, failures):
            super().__init__("CheckpointException ranks:dict_keys([0])\nTraceback ...\n  File ...")
            self.failures = failures

    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/__0_0.distcp")
    line = error_line(CheckpointException({0: (full, None)}))
    assert line == "disk full: No space left on device writing /ckpt/__0_0.distcp"
    other = error_line(RuntimeError("a\nmulti-line\n  message"))
    assert "\n" not in other and other.startswith("RuntimeError: a multi-line")


def test_ledger_on_a_full_disk(tmp_path):
    res = ledger_full_disk(tmp_path)
    assert res["outcomes"], res
    failed = [o for o in res["outcomes"] if o.startswith("LedgerError")]
    assert failed, f"no write failed on the full disk ({res['how']}): {res}"
    for o in failed:
        assert "cannot write the ledger" in o or "cannot open the ledger" in o, o
        assert "no transaction is active" not in o and "move the file away" not in o, o
    assert res["previous_intact"] and res["integrity"] == "ok" and res["writable_after"], res
    assert res["seconds"] < 120


@needs_tmpfs
def test_report_on_a_full_disk(tmp_path):
    res = report_full_disk(tmp_path)
    assert res["rc"] != 0
    assert len(res["stderr_lines"]) == 1 and res["stderr_lines"][0].startswith("error: "), res
    assert "No space left" in res["stderr_lines"][0]
    assert res["previous_intact"] and res["temp_files_left"] == [], res


CRASH_BEFORE_RENAME = textwrap.dedent("""
    import os, signal, sys
    from trainledger.safety import write_atomic
    real = os.replace
    def crash(src, dst):
        os.kill(os.getpid(), signal.SIGKILL)  # power cut between the write and the rename
    os.replace = crash
    write_atomic(sys.argv[1], "<html>new report</html>" * 10000)
""")


def test_report_crash_before_rename_keeps_previous(tmp_path):
    path = tmp_path / "report.html"
    path.write_text("previous report")
    r = subprocess.run([sys.executable, "-c", CRASH_BEFORE_RENAME, str(path)], timeout=120)
    assert r.returncode == -9
    assert path.read_text() == "previous report"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "report.html"]
    assert all(p.startswith(".report.html.") and p.endswith(".tmp") for p in leftovers), leftovers


@needs_tmpfs
@pytest.mark.slow
def test_acceptance_checkpoint_on_a_full_disk(tmp_path):
    pytest.importorskip("torch")
    res = accept_full_disk(tmp_path)
    assert res["ok"] is False
    assert res["failed_phase"] == "save checkpoint", res
    # one line naming the phase and each rank; "disk full" whenever the rank saw the OSError itself
    # (a rank that only gets another rank's pickled failure sees a RuntimeError without its cause)
    assert "\n" not in res["error"] and "raised during 'save checkpoint'" in res["error"], res["error"]
    assert res["seconds"] < 240


def test_corpus_worker_killed_is_an_error_not_a_hang(tmp_path):
    res = corpus_dead_worker(tmp_path)
    if res["killed"] is None:
        pytest.skip("the run finished before a worker could be killed")
    assert not res["hung"], res
    assert res["rc"] != 0
    assert len(res["stderr_lines"]) == 1 and "worker process died" in res["stderr_lines"][0], res
    assert res["seconds"] < 60
