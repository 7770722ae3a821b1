"""The measurement ledger: every estimate and measurement, stored in a local SQLite file.

One row per record: its kind (``estimate``, ``measurement``, ``calibration``), the command that
made it (``verify memory``, ``estimate``, ...), the time (UTC, ISO 8601), the plan (flat JSON),
the environment fingerprint (GPU, driver, torch, transformers, host) with its short id, whether
the check passed, and the result (JSON).

Concurrency and crash safety come from SQLite itself (https://sqlite.org/wal.html,
https://sqlite.org/atomiccommit.html): the database runs in WAL mode, every write is one
``BEGIN IMMEDIATE`` transaction, and a busy timeout makes a second writer wait for the first
instead of failing. On a network filesystem (NFS home directories of clusters) the rollback
journal is used instead of WAL, which needs all writers on one host (fsdetect.py). A process killed mid-write leaves the last committed state intact: the
unfinished transaction is rolled back the next time the file is opened.

Path: ``--ledger PATH`` > ``$TRAINLEDGER_LEDGER`` > ``$XDG_DATA_HOME/trainledger/ledger.db``
(default ``~/.local/share/trainledger/ledger.db``). Never imports torch.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import io
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainledger.errors import LedgerError

__all__ = ["Ledger", "Record", "default_path", "open_ledger", "plan_key", "fingerprint", "KINDS"]

KINDS = ("estimate", "measurement", "calibration")
#: seconds a writer waits for another writer's transaction before giving up.
BUSY_TIMEOUT_S = 30.0
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    command TEXT NOT NULL,
    created_at TEXT NOT NULL,
    env_id TEXT NOT NULL,
    env TEXT NOT NULL,
    plan_key TEXT,
    plan TEXT,
    ok INTEGER,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_env ON records(env_id, kind);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def default_path() -> Path:
    """``$TRAINLEDGER_LEDGER``, else ``$XDG_DATA_HOME/trainledger/ledger.db`` (~/.local/share)."""
    env = os.environ.get("TRAINLEDGER_LEDGER")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "trainledger" / "ledger.db"


def plan_key(plan: Mapping[str, Any] | None) -> str | None:
    """A short stable hash of a flat plan mapping: records of the same plan share it."""
    if not plan:
        return None
    blob = json.dumps(plan, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Record:
    """One row of the ledger."""

    id: int
    kind: str
    command: str
    created_at: str
    env_id: str
    env: dict[str, Any]
    plan_key: str | None
    plan: dict[str, Any] | None
    ok: bool | None
    result: dict[str, Any]
    #: why the row could not be read in full (damaged JSON), or None
    damaged: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id, "kind": self.kind, "command": self.command,
            "created_at": self.created_at, "env_id": self.env_id, "env": self.env,
            "plan_key": self.plan_key, "plan": self.plan, "ok": self.ok, "result": self.result,
        }
        if self.damaged:
            d["damaged"] = self.damaged
        return d


def _row(r: sqlite3.Row) -> Record:
    """A Record from one row; a row whose JSON is damaged is kept, marked, with empty fields."""
    damaged = []

    def obj(col: str, optional: bool = False) -> Any:
        raw = r[col]
        if optional and not raw:
            return None
        try:
            v = json.loads(raw)
        except (TypeError, ValueError, RecursionError):
            damaged.append(f"{col} is not valid JSON")
            return None if optional else {}
        if not isinstance(v, dict):
            damaged.append(f"{col} is not a JSON object")
            return None if optional else {}
        return v

    env, plan, result = obj("env"), obj("plan", optional=True), obj("result")
    ok = r["ok"]
    return Record(
        id=r["id"], kind=str(r["kind"]), command=str(r["command"]), created_at=str(r["created_at"]),
        env_id=str(r["env_id"]), env=env, plan_key=r["plan_key"], plan=plan,
        ok=None if ok is None or not isinstance(ok, int) else bool(ok), result=result,
        damaged="; ".join(damaged) or None,
    )


class Ledger:
    """A SQLite ledger file. Cheap to open; every method is one short transaction."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path).expanduser() if path else default_path()
        #: True when the file (or its folder) cannot be written: records can be read, not added
        self.read_only = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                mode = self._open_rw()
            except sqlite3.OperationalError as exc:
                if not self.path.is_file() or not _read_only_error(exc):
                    raise
                if getattr(self, "_conn", None) is not None:
                    self._conn.close()
                mode = self._open_ro()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):  # I/O, full disk, locked: the file is fine
                raise LedgerError(f"{self.path}: cannot open the ledger ({exc}); check the free space and "
                                  "permissions of its folder, or pass --ledger PATH") from None
            raise LedgerError(
                f"{self.path}: cannot open the ledger ({exc}); move the file away or pass "
                f"--ledger PATH to use another one"
            ) from None
        except OSError as exc:
            raise LedgerError(f"{self.path}: cannot create the ledger ({exc.strerror})") from None
        self.journal_mode = str(mode).lower()

    def _open_rw(self) -> str:
        self._conn = sqlite3.connect(
            str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        from trainledger.ledger.fsdetect import ledger_journal_mode  # WAL needs one host: not on NFS (fsdetect.py)

        want = ledger_journal_mode(self.path)
        mode = self._retry_locked(lambda: self._conn.execute(f"PRAGMA journal_mode = {want}").fetchone()[0])
        self._conn.execute("PRAGMA synchronous = NORMAL" if want == "WAL" else "PRAGMA synchronous = FULL")
        with self._tx():
            for stmt in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                self._conn.execute(stmt)
            self._conn.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        return mode

    def _open_ro(self) -> str:
        """A ledger we may not write (read-only file or folder): open it for reading only.

        A WAL database needs its -shm file; where that cannot be created the file is opened as
        immutable (https://sqlite.org/uri.html#uriimmutable), which is right for a ledger nobody
        can write.
        """
        uri = self.path.resolve().as_uri()
        last: Exception | None = None
        for query in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                self._conn = sqlite3.connect(uri + query, uri=True, timeout=BUSY_TIMEOUT_S,
                                             isolation_level=None, check_same_thread=False)
                self._conn.row_factory = sqlite3.Row
                mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
                self._conn.execute("SELECT COUNT(*) FROM records").fetchone()
                self.read_only = True
                return mode
            except sqlite3.OperationalError as exc:
                last = exc
        assert last is not None
        raise last

    def _retry_locked(self, fn: Any) -> Any:
        """fn() until it stops failing with "database is locked" (or BUSY_TIMEOUT_S passes).

        Switching a new file to WAL needs an exclusive lock and SQLite does not call the busy
        handler for it, so several processes opening a new ledger at once raced (issue 20).
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(0.1, delay * 2)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``BEGIN IMMEDIATE`` takes the write lock up front (no deadlock)."""
        if self.read_only:
            raise LedgerError(f"{self.path}: the ledger is read-only (no write permission on the file "
                              "or its folder); pass --ledger PATH to record elsewhere")
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            yield self._conn
        except BaseException:
            if self._conn.in_transaction:  # SQLite already rolled back on SQLITE_FULL / IOERR
                self._conn.execute("ROLLBACK")
            raise
        else:
            try:
                self._conn.execute("COMMIT")
            except BaseException:  # e.g. the disk filled up while the WAL was written
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def add(
        self,
        kind: str,
        command: str,
        result: Mapping[str, Any],
        *,
        env: Mapping[str, Any] | None = None,
        plan: Mapping[str, Any] | None = None,
        ok: bool | None = None,
    ) -> int:
        """Store one record and return its id. ``env`` defaults to this machine's fingerprint."""
        if kind not in KINDS:
            raise LedgerError(f"unknown record kind {kind!r}; accepted: {', '.join(KINDS)}")
        if env is None:
            env = fingerprint()
        env = dict(env)
        env_id = env.get("env_id") or env_id_of(env)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
        values = (
            kind, command, now, env_id, _dumps(env), plan_key(plan),
            _dumps(plan) if plan else None, None if ok is None else int(bool(ok)), _dumps(result),
        )
        try:
            with self._tx() as c:
                cur = c.execute(
                    "INSERT INTO records(kind, command, created_at, env_id, env, plan_key, plan, ok,"
                    " result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    values,
                )
                return int(cur.lastrowid)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: cannot write the ledger ({exc})") from None

    def list(
        self,
        kind: str | None = None,
        env_id: str | None = None,
        command: str | None = None,
        limit: int | None = None,
    ) -> list[Record]:
        """Records, newest first, optionally filtered."""
        where, args = [], []
        for col, val in (("kind", kind), ("env_id", env_id), ("command", command)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        sql = "SELECT * FROM records"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        try:
            return [_row(r) for r in self._conn.execute(sql, args)]
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: cannot read the ledger ({exc})") from None

    def get(self, record_id: int) -> Record:
        try:
            r = self._conn.execute("SELECT * FROM records WHERE id = ?", (int(record_id),)).fetchone()
        except (sqlite3.DatabaseError, OverflowError) as exc:
            raise LedgerError(f"{self.path}: cannot read the ledger ({exc})") from None
        if r is None:
            raise LedgerError(f"{self.path}: no record with id {record_id} (`trainledger ledger list`)")
        return _row(r)

    def count(self) -> int:
        try:
            return int(self._conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: cannot read the ledger ({exc})") from None

    def export(self, fmt: str = "jsonl", **filters: Any) -> str:
        """All matching records as JSON lines, one JSON array, or CSV (JSON columns as text)."""
        records = list(reversed(self.list(**filters)))
        if fmt == "jsonl":
            return "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in records)
        if fmt == "json":
            return json.dumps([r.to_dict() for r in records], indent=2, sort_keys=True) + "\n"
        if fmt == "csv":
            buf = io.StringIO()
            cols = ["id", "kind", "command", "created_at", "env_id", "plan_key", "ok", "env", "plan",
                    "result"]
            w = csv.writer(buf)
            w.writerow(cols)
            for r in records:
                d = r.to_dict()
                w.writerow([json.dumps(d[c], sort_keys=True) if isinstance(d[c], (dict, list)) else
                            ("" if d[c] is None else d[c]) for c in cols])
            return buf.getvalue()
        raise LedgerError(f"unknown export format {fmt!r}; accepted: jsonl, json, csv")


def _nvml_gpus() -> dict[str, Any]:
    """GPU name, count and driver through NVML, without torch; empty when there is no GPU."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no GPU
        return {}
    try:
        n = pynvml.nvmlDeviceGetCount()
        names = [_s(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "gpu_name": names[0] if names else None, "gpu_count": n,
            "driver": _s(pynvml.nvmlSystemGetDriverVersion()),
            "cuda": f"{cuda // 1000}.{(cuda % 1000) // 10}",
        }
    except Exception:  # noqa: BLE001
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or None


def fingerprint() -> dict[str, Any]:
    """This machine's environment: GPU (NVML), driver, CUDA, torch, transformers, CPU, host.

    Reads package versions from their metadata, so it never imports torch.
    """
    import platform
    import socket

    env: dict[str, Any] = {"gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None}
    env.update(_nvml_gpus())
    env.update({
        "torch": dist_version("torch"), "transformers": dist_version("transformers"),
        "python": platform.python_version(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "host": socket.gethostname(), "platform": platform.platform(),
    })
    env["env_id"] = env_id_of(env)
    return env


def env_id_of(env: Mapping[str, Any]) -> str:
    """Short id of an environment: the hash of the fields a calibration depends on."""
    keys = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "transformers", "cpu_model")
    blob = json.dumps({k: env.get(k) for k in keys}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _read_only_error(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "readonly" in msg or "read-only" in msg or "unable to open" in msg


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=_default, allow_nan=True)


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def open_ledger(path: str | Path | None = None) -> Ledger:
    """Open (creating when needed) the ledger at ``path`` or the default location."""
    return Ledger(path)
