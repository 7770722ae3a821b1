"""Fault injection helpers shared by tests/reliability/test_faults.py and bench/faults.py.

* ``small_disk(kib)``: a real full disk — a tmpfs of ``kib`` KiB mounted on a temporary folder
  (needs root and a kernel that allows it; yields None otherwise, and callers fall back to
  ``RLIMIT_FSIZE``, which fails writes past a size with EFBIG instead of ENOSPC);
* ``ledger_full_disk`` / ``report_full_disk`` / ``accept_full_disk``: one fault case each,
  returning a dict that says what happened, how long it took and whether the data survived;
* ``timeout_audit``: every subprocess, wait and process-group call in the package, and whether it
  carries a timeout (the collectives inherit the process group's timeout).
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src" / "trainledger"


@contextlib.contextmanager
def small_disk(kib: int) -> Iterator[Path | None]:
    """A folder on a ``kib``-KiB tmpfs, or None when mounting is not permitted here."""
    d = Path(tempfile.mkdtemp(prefix="tl-full-"))
    mounted = False
    if sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("mount"):
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(d)],
                           capture_output=True, timeout=30)
        mounted = r.returncode == 0
    try:
        yield d if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)
        shutil.rmtree(d, ignore_errors=True)


def _fill(folder: Path) -> None:
    """Fill the rest of a small disk with one file."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()


def _free(folder: Path) -> None:
    with contextlib.suppress(OSError):
        (folder / "filler").unlink()


LEDGER_FSIZE_WRITER = r"""
import json, resource, signal, sys
from trainledger.ledger import Ledger
from trainledger.errors import LedgerError
led = Ledger(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
lim = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))
out = []
for n in (50_000, 500_000, 3_000_000):
    try:
        led.add("measurement", "big", {"blob": "x" * n}, env={"env_id": "e"})
        out.append("stored")
    except LedgerError as exc:
        out.append("LedgerError: " + str(exc))
print(json.dumps(out))
"""


def _try_add(led: Any, n: int) -> str:
    from trainledger.errors import LedgerError

    try:
        led.add("measurement", "big", {"blob": "x" * n}, env={"env_id": "e"})
        return "stored"
    except LedgerError as exc:
        return "LedgerError: " + str(exc)


def ledger_full_disk(work: Path) -> dict[str, Any]:
    """A ledger with 20 records whose disk fills up: the open ledger's writes fail with a clear
    LedgerError, a new process gets a clear LedgerError, and once space is back nothing is lost."""
    import json

    from trainledger.errors import LedgerError
    from trainledger.ledger import Ledger

    t0 = time.monotonic()
    with small_disk(2048) as disk:
        db = (disk or work) / "ledger.db"
        led = Ledger(db)
        for i in range(20):
            led.add("measurement", "before", {"i": i}, env={"env_id": "e"})
        if disk is not None:
            how = "tmpfs full (ENOSPC)"
            _fill(disk)
            outcomes = [_try_add(led, n) for n in (50_000, 500_000, 3_000_000)]
            try:
                Ledger(db).close()
                outcomes.append("reopened")
            except LedgerError as exc:
                outcomes.append("LedgerError: " + str(exc))
            led.close()
            _free(disk)
        else:
            how = "RLIMIT_FSIZE (EFBIG)"
            led.close()
            size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
            r = subprocess.run([sys.executable, "-c", LEDGER_FSIZE_WRITER, str(db), str(size + 64_000)],
                               capture_output=True, text=True, timeout=120)
            outcomes = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else [r.stderr[-500:]]
        with Ledger(db) as led:
            before = sorted(x.result["i"] for x in led.list(command="before"))
            after_id = led.add("measurement", "after", {"ok": True}, env={"env_id": "e"})
        con = sqlite3.connect(db)
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        con.close()
    return {"how": how, "outcomes": outcomes, "previous_intact": before == list(range(20)),
            "integrity": integrity, "writable_after": after_id > 20, "seconds": time.monotonic() - t0}


def report_full_disk(work: Path) -> dict[str, Any]:
    """``trainledger report --out`` onto a full disk: one error line, the old report untouched."""
    t0 = time.monotonic()
    with small_disk(64) as disk:
        if disk is None:
            return {"skipped": "cannot mount a tmpfs here"}
        old = disk / "report.html"
        old.write_text("previous report")
        _fill(disk)
        r = subprocess.run([sys.executable, "-m", "trainledger", "report", "-m", "tiny-llama-debug",
                            "--out", str(old)], capture_output=True, text=True, timeout=300)
        left = sorted(p.name for p in disk.iterdir() if p.name not in ("report.html", "filler"))
        return {"rc": r.returncode, "stderr_lines": [ln for ln in r.stderr.splitlines() if ln.strip()],
                "previous_intact": old.read_text() == "previous report", "temp_files_left": left,
                "seconds": time.monotonic() - t0}


def accept_full_disk(work: Path) -> dict[str, Any]:
    """The acceptance run with its checkpoint folder on a full disk: a failure record, no hang."""
    from trainledger.load.plan import parse_inputs
    from trainledger.verify import accept as A

    t0 = time.monotonic()
    with small_disk(96) as disk:
        if disk is None:
            return {"skipped": "cannot mount a tmpfs here"}
        inputs = parse_inputs({"model": "tiny-llama-debug", "precision": "fp32", "seq_len": 16, "gpus": 2})
        rep = A.run_accept(inputs, "cpu", 2, 1, 1, timeout_s=240, collective_timeout_s=30,
                           workdir=str(disk / "work"))
    return {"ok": rep["ok"], "error": rep.get("error"), "failed_phase": rep.get("failed_phase"),
            "seconds": time.monotonic() - t0}


# ------------------------------------------------------------------------ timeout audit
_SUBPROCESS_FNS = {"run", "call", "check_call", "check_output"}


def _kw(call: ast.Call, name: str) -> bool:
    return any(k.arg == name for k in call.keywords)


def timeout_audit(root: Path = SRC) -> list[dict[str, Any]]:
    """Every blocking call that could hang, with whether it is bounded by a timeout.

    subprocess.run/call/check_*: ``timeout=``; ``.wait()`` / ``.communicate()``: a timeout
    argument; ``Popen``: the same function waits on it with a timeout; ``init_process_group``:
    a ``timeout`` in its keywords (every collective of the group inherits it); ``urlopen`` and
    ``requests`` calls: ``timeout=``.
    """
    rows = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                continue
            body_src = ast.get_source_segment(path.read_text(encoding="utf-8"), fn) or ""
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                attr = node.func.attr
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
                kind = ok = None
                if owner == "subprocess" and attr in _SUBPROCESS_FNS:
                    kind, ok = f"subprocess.{attr}", _kw(node, "timeout")
                elif owner == "subprocess" and attr == "Popen":
                    kind, ok = "subprocess.Popen", ".wait(timeout=" in body_src or ".communicate(timeout=" in body_src
                elif attr in ("wait", "communicate") and owner not in ("asyncio", "threading", "os"):
                    if attr == "wait" and owner in ("cond", "event", "lock"):
                        continue
                    kind, ok = f".{attr}()", bool(node.args) or _kw(node, "timeout")
                elif attr == "init_process_group":
                    kind = "init_process_group"
                    ok = _kw(node, "timeout") or ('"timeout"' in body_src and any(
                        k.arg is None for k in node.keywords))
                elif attr == "urlopen" or owner == "requests":
                    kind, ok = attr, _kw(node, "timeout")
                if kind and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                        kind and isinstance(fn, ast.Module) and not _inside_function(tree, node)):
                    rows.append({"file": str(path.relative_to(root.parent)), "line": node.lineno,
                                 "call": kind, "timeout": bool(ok)})
    seen, out = set(), []
    for r in rows:  # nested functions are walked twice
        key = (r["file"], r["line"], r["call"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _inside_function(tree: ast.AST, target: ast.AST) -> bool:
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(n is target for n in ast.walk(fn)):
            return True
    return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def corpus_dead_worker(work: Path) -> dict[str, Any]:
    """``trainledger corpus -j 2`` whose worker is SIGKILLed (as the OOM killer would): an error, no hang."""
    import signal

    work.mkdir(parents=True, exist_ok=True)
    line = b'{"text": "' + b"word " * 60 + b'"}\n'
    block = line * (8 * 1024 * 1024 // len(line))
    for k in range(6):
        (work / f"part{k}.jsonl").write_bytes(block * 3)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trainledger", "corpus", "-q", "-j", "2", str(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    try:
        deadline = time.monotonic() + 60
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            for server in _children(proc.pid):
                workers = _children(server)
                if workers:
                    time.sleep(0.5)  # let it start on a unit
                    os.kill(workers[0], signal.SIGKILL)
                    killed = workers[0]
                    break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        return {"killed": killed, "hung": True, "seconds": time.monotonic() - t0}
    return {"killed": killed, "hung": False, "rc": proc.returncode,
            "stderr_lines": [ln for ln in err.splitlines() if ln.strip()],
            "seconds": time.monotonic() - t0}
