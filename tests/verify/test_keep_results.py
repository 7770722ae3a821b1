"""Issue 20, verify: stopped ranks are killed with their launcher; failed runs, unwritable --out
and read-only ledgers never lose a result and never show a traceback."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
import traceback

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import LedgerError, VerifyError
from trainledger.ledger import Ledger
from trainledger.verify.launch import _alive, parse_fault, run_bounded

#: a launcher like torchrun: the "rank" runs in a session of its own and stops itself (SIGSTOP)
LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import os, signal, sys; open(sys.argv[1], 'w').write(str(os.getpid())); os.kill(os.getpid(), signal.SIGSTOP)",
        sys.argv[1]], start_new_session=True)
    time.sleep(3600)
""")


def test_a_stopped_rank_in_its_own_session_is_killed_at_the_deadline(tmp_path):
    pid_file = tmp_path / "rank.pid"
    rc, timed_out, _, elapsed = run_bounded([sys.executable, "-c", LAUNCHER, str(pid_file)], timeout_s=1.5)
    pid = int(pid_file.read_text())
    try:
        assert timed_out and elapsed < 15
        deadline = time.monotonic() + 3
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the stopped rank was left behind"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_stop_is_an_injectable_fault():
    assert parse_fault("stop:1:all_reduce") == ("stop", 1, "all_reduce")


def _invoke(args):
    r = CliRunner().invoke(main, args)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        pytest.fail("traceback:\n" + "".join(traceback.format_exception(r.exception)))
    return r


def test_a_failed_comm_run_is_recorded(tmp_path, monkeypatch):
    from trainledger.verify import comm

    def fail(*a, **k):
        raise VerifyError("verify comm on 2 cpu rank(s) did not finish within 3 s and was stopped; "
                          "rank 1 stopped during 'all_reduce 1 KiB'")

    monkeypatch.setattr(comm, "run_comm", fail)
    db = tmp_path / "l.db"
    r = _invoke(["verify", "comm", "--ledger", str(db), "--timeout", "3"])
    assert r.exit_code != 0 and "did not finish" in r.output
    with Ledger(db) as led:
        (rec,) = led.list()
    assert rec.command == "verify comm" and rec.ok is False and rec.kind == "measurement"
    assert "rank 1 stopped" in rec.result["error"] and rec.result["failed"] is True


REPORT = {"ok": True, "runs": [], "checks": [], "note": "fake acceptance report"}


@pytest.fixture
def fake_accept(monkeypatch):
    from trainledger.verify import accept

    monkeypatch.setattr(accept, "run_accept", lambda *a, **k: dict(REPORT))
    monkeypatch.setattr(accept, "render", lambda report: "acceptance: fake")


def test_unwritable_out_keeps_the_report(tmp_path, monkeypatch, fake_accept):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "l.db"
    r = _invoke(["verify", "accept", "--model", "tiny-llama-debug", "--ledger", str(db),
                 "--out", "/proc/no-such-dir/report.json"])
    assert r.exit_code == 0, r.output
    kept = [p for p in tmp_path.glob("trainledger-verify-accept-*.json")]
    assert len(kept) == 1 and json.loads(kept[0].read_text())["note"] == "fake acceptance report"
    assert f"kept in {kept[0]}" in r.output
    with Ledger(db) as led:
        assert [x.command for x in led.list()] == ["verify accept"]


def test_read_only_ledger_keeps_the_result(tmp_path, monkeypatch, fake_accept):
    monkeypatch.chdir(tmp_path)

    def refuse(self, *a, **k):
        raise LedgerError(f"{self.path}: the ledger is read-only")

    monkeypatch.setattr(Ledger, "add", refuse)
    r = _invoke(["verify", "accept", "--model", "tiny-llama-debug", "--ledger", str(tmp_path / "l.db")])
    assert r.exit_code == 0, r.output
    (kept,) = tmp_path.glob("trainledger-verify-accept-*.json")
    data = json.loads(kept.read_text())
    assert data["result"]["note"] == "fake acceptance report" and data["ok"] is True
    assert "not stored in the ledger" in r.output and "read-only" in r.output
