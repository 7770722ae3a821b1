"""Keep every verify result: failed and partial runs are recorded, and a result that cannot go
where it was asked (a read-only ledger, an unwritable ``--out``) is written somewhere it can, with
one line saying where (issue 20).

A verify run can take an hour of GPU time; losing its outcome to a permission error is the worst
failure it can have. :func:`record` stores a measurement in the ledger and, when the ledger cannot
take it, saves the same JSON to a fallback file (:func:`fallback_path`: the current folder, else the
temporary folder). :func:`recording_failures` turns a run that raised (a rank died, the deadline
passed) into a ``ok: false`` ledger record before the error is shown.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainledger.errors import LedgerError, TrainledgerError


def _stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


def fallback_path(command: str) -> Path | None:
    """A new file for a result that could not be stored where asked; None if no folder is writable."""
    name = "trainledger-" + re.sub(r"[^A-Za-z0-9]+", "-", command).strip("-") + f"-{_stamp()}.json"
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        try:
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            continue
        os.close(fd)
        return folder / name
    return None


def keep(command: str, payload: dict[str, Any], why: str, say: Callable[[str], None]) -> Path | None:
    """Write ``payload`` to a fallback file and say where (or that nothing could be written)."""
    path = fallback_path(command)
    text = json.dumps(payload, indent=1, sort_keys=True, default=str, allow_nan=True)
    if path is not None:
        try:
            path.write_text(text)
        except OSError:
            path = None
    if path is None:
        say(f"warning: {why}; no writable folder for the result either, so here it is:\n{text}")
        return None
    say(f"warning: {why}; the result is kept in {path}")
    return path


def record(command: str, result: dict[str, Any], *, ledger_path: str | None, off: bool,
           plan_summary: dict[str, Any] | None, ok: bool | None, say: Callable[[str], None]) -> int | None:
    """Store one measurement; a ledger that cannot take it leaves the result in a fallback file."""
    if off:
        return None
    from trainledger.ledger import Ledger

    try:
        with Ledger(ledger_path) as led:
            rid = led.add("measurement", command, result, plan=plan_summary, ok=ok)
            where = led.path
    except LedgerError as exc:
        keep(command, {"command": command, "ok": ok, "plan": plan_summary, "result": result},
             f"not stored in the ledger ({exc})", say)
        return None
    say(f"[trainledger] stored as record {rid} in {where}")
    return rid


def write_out(out_path: str, text: str, command: str, say: Callable[[str], None]) -> bool:
    """Write ``--out`` atomically; when that fails, keep the text in a fallback file instead."""
    from trainledger.safety import write_atomic

    try:
        write_atomic(out_path, text, what=f"{command} report")
    except (TrainledgerError, OSError) as exc:
        keep(command, json.loads(text), f"cannot write {out_path} ({exc})", say)
        return False
    say(f"[trainledger] report written to {out_path}")
    return True


@contextmanager
def recording_failures(command: str, *, ledger_path: str | None, off: bool,
                       plan_summary: dict[str, Any] | None, say: Callable[[str], None]) -> Iterator[None]:
    """Record a run that raised as a failed measurement (``ok: false``), then let the error show."""
    try:
        yield
    except (TrainledgerError, KeyboardInterrupt) as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        result = {"ok": False, "failed": True, "interrupted": interrupted,
                  "error": "interrupted (Ctrl-C)" if interrupted else str(exc),
                  "error_type": type(exc).__name__}
        try:
            record(command, result, ledger_path=ledger_path, off=off, plan_summary=plan_summary, ok=False, say=say)
        except Exception as inner:  # noqa: BLE001 - recording must never hide the run's own error
            say(f"warning: the failed run could not be recorded ({inner})")
        raise
