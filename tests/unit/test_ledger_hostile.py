"""Issue 20, ledger: concurrent first opens, damaged rows and pages, read-only ledgers."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import traceback

import pytest
from click.testing import CliRunner

from trainledger import ledger as ledger_mod
from trainledger.cli import main
from trainledger.errors import LedgerError
from trainledger.ledger import Ledger

ENV = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "driver": "550.54", "cuda": "12.4",
       "torch": "2.13.0", "transformers": "5.0", "cpu_model": "Xeon"}
MEASURED = {"measured": {"peak_allocated_bytes": 110, "device": "cpu"}, "predicted": {"peak_allocated_bytes": 100}}


def _opener(paths, barrier, errors):
    for p in paths:
        barrier.wait()
        try:
            Ledger(p).close()
        except Exception as exc:  # noqa: BLE001
            errors.put(f"{type(exc).__name__}: {exc}")


def test_many_processes_opening_a_new_ledger_at_once(tmp_path):
    ctx = mp.get_context("fork")
    rounds, procs = 40, 8
    paths = [str(tmp_path / f"l{i}.db") for i in range(rounds)]
    barrier, errors = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_opener, args=(paths, barrier, errors)) for _ in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found[:3]
    assert all(p.exitcode == 0 for p in ps)


def _cli(*args):
    r = CliRunner().invoke(main, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        pytest.fail("traceback:\n" + "".join(traceback.format_exception(r.exception)))
    assert "Traceback" not in r.output
    return r


@pytest.fixture
def damaged_rows(tmp_path):
    db = tmp_path / "l.db"
    with Ledger(db) as led:
        for _ in range(3):
            led.add("measurement", "verify memory", MEASURED, env=ENV, plan={"model": "m"}, ok=True)
        env_id = led.list()[0].env_id
    c = sqlite3.connect(db)
    c.execute("UPDATE records SET result = '{\"measured\": ' WHERE id = 1")     # not JSON
    c.execute("UPDATE records SET env = '[1, 2]', plan = '\"x\"' WHERE id = 2")  # not objects
    c.execute("UPDATE records SET result = '{\"measured\": \"x\", \"predicted\": [1]}' WHERE id = 3")
    c.commit()
    c.close()
    return db, env_id


def test_a_damaged_row_is_one_clear_line(damaged_rows):
    db, env_id = damaged_rows
    r = _cli("ledger", "list", "--ledger", str(db))
    assert r.exit_code == 0 and "damaged row: result is not valid JSON" in r.output
    r = _cli("ledger", "list", "--ledger", str(db), "--json")
    assert r.exit_code == 0
    for i in (1, 2, 3):
        r = _cli("ledger", "show", str(i), "--ledger", str(db))
        assert r.exit_code == 0
    assert "damaged row" in _cli("ledger", "show", "2", "--ledger", str(db)).output
    for fmt in ("jsonl", "json", "csv"):
        r = _cli("ledger", "export", "--ledger", str(db), "--format", fmt)
        assert r.exit_code == 0 and (fmt == "csv" or "damaged" in r.output)
    r = _cli("calibrate", "--ledger", str(db), "--env", env_id, "--json")
    assert r.exit_code == 0 and json.loads(r.output)["record_ids"] == [2]  # the one whole measurement


def test_a_damaged_page_is_one_clear_line(tmp_path):
    db = tmp_path / "l.db"
    with Ledger(db) as led:
        for _ in range(200):
            led.add("measurement", "verify memory", {**MEASURED, "pad": "x" * 2000}, env=ENV)
        env_id = led.list(limit=1)[0].env_id
    c = sqlite3.connect(db)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    with open(db, "r+b") as f:
        for page in (100, 101):  # two leaf pages of the records table, in the middle
            f.seek(4096 * page)
            f.write(b"\xff" * 4096)
    outs = [_cli("ledger", "list", "--ledger", str(db), "--limit", "1000"),
            _cli("ledger", "export", "--ledger", str(db)),
            _cli("calibrate", "--ledger", str(db), "--env", env_id)]
    outs += [_cli("ledger", "show", str(i), "--ledger", str(db)) for i in range(85, 110)]
    assert any(o.exit_code and o.output.startswith("error:") and "malformed" in o.output for o in outs)
    for o in outs:
        assert o.exit_code == 0 or o.output.count("\n") == 1  # an answer, or one error line


def test_a_read_only_ledger_can_be_listed(tmp_path, monkeypatch):
    db = tmp_path / "l.db"
    with Ledger(db) as led:
        rid = led.add("estimate", "estimate", {"x": 1}, env=ENV)
    real_connect = sqlite3.connect

    def read_only_connect(database, *a, uri=False, **k):  # what SQLite sees on a file we may not write
        if not uri:
            database, uri = f"file:{database}?mode=ro", True
        return real_connect(database, *a, uri=uri, **k)

    monkeypatch.setattr(ledger_mod.sqlite3, "connect", read_only_connect)
    with Ledger(db) as led:
        assert led.read_only
        assert [r.id for r in led.list()] == [rid] and led.get(rid).result == {"x": 1}
        with pytest.raises(LedgerError, match="read-only"):
            led.add("estimate", "estimate", {"x": 2}, env=ENV)
    r = _cli("ledger", "list", "--ledger", str(db))
    assert r.exit_code == 0 and "estimate" in r.output
