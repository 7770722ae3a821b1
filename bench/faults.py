"""Fault cases survived: dead rank, OOM, hung rank, full disk, killed ledger writer, corrupted
checkpoint, dead corpus worker (issue 9). Each is bounded in time; prints one line per case.

    python bench/faults.py            # every case (a few minutes on 2 CPU cores)
    python bench/faults.py --quick    # skip the torchrun-based cases

"Survived" means: the run ended (no hang) within its bound with a clear failure record, and no
stored data was lost. The cases reuse the project's own machinery: ``verify accept`` with
``$TRAINLEDGER_FAULT`` (kill / oom / hang / corrupt-checkpoint), the verify launcher's deadlines,
the SQLite ledger, the atomic report writer and the corpus worker pool. Full-disk cases use a
real tmpfs when this process may mount one (root on Linux), else ``RLIMIT_FSIZE``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import faults_lib as F  # noqa: E402

TINY = {"model": "tiny-llama-debug", "precision": "fp32", "seq_len": 16, "gpus": 2}


def accept_fault(spec: str, collective_timeout_s: float = 30) -> dict:
    from trainledger.load.plan import parse_inputs
    from trainledger.verify import accept as A

    t0 = time.monotonic()
    rep = A.run_accept(parse_inputs(TINY), "cpu", 2, 1, 1, timeout_s=180,
                       collective_timeout_s=collective_timeout_s, env={"TRAINLEDGER_FAULT": spec})
    bad = [i for i in rep["items"] if i["status"] == "fail"]
    record = rep.get("error") or (bad[0]["detail"] if bad else "")
    return {"ok": rep["ok"], "record": record, "seconds": time.monotonic() - t0}


def case_dead_rank() -> tuple[bool, str, float]:
    r = accept_fault("kill:1:backward")
    ok = r["ok"] is False and "rank 1 stopped" in r["record"] and r["seconds"] < 120
    return ok, r["record"], r["seconds"]


def case_oom() -> tuple[bool, str, float]:
    r = accept_fault("oom:0:backward")
    ok = r["ok"] is False and "out of memory" in r["record"] and r["seconds"] < 120
    return ok, r["record"], r["seconds"]


def case_hung_rank() -> tuple[bool, str, float]:
    r = accept_fault("hang:1:optimizer", collective_timeout_s=5)
    ok = r["ok"] is False and "rank 1 stopped" in r["record"] and r["seconds"] < 150
    return ok, r["record"], r["seconds"]


def case_corrupt_checkpoint() -> tuple[bool, str, float]:
    r = accept_fault("corrupt-checkpoint:0:x")
    ok = r["ok"] is False and "corrupted" in r["record"] and r["seconds"] < 150
    return ok, r["record"], r["seconds"]


def case_checkpoint_full_disk() -> tuple[bool, str, float] | None:
    r = F.accept_full_disk(Path(tempfile.mkdtemp()))
    if "skipped" in r:
        return None
    ok = r["ok"] is False and r["failed_phase"] == "save checkpoint" and "\n" not in (r["error"] or "")
    return ok, r["error"] or "", r["seconds"]


def case_ledger_full_disk() -> tuple[bool, str, float]:
    r = F.ledger_full_disk(Path(tempfile.mkdtemp()))
    errs = [o for o in r["outcomes"] if o.startswith("LedgerError")]
    ok = bool(errs) and r["previous_intact"] and r["integrity"] == "ok" and r["writable_after"]
    return ok, f"{r['how']}: {errs[0] if errs else 'no error'}; 20 earlier records intact", r["seconds"]


def case_report_full_disk() -> tuple[bool, str, float] | None:
    r = F.report_full_disk(Path(tempfile.mkdtemp()))
    if "skipped" in r:
        return None
    ok = r["rc"] != 0 and len(r["stderr_lines"]) == 1 and r["previous_intact"] and not r["temp_files_left"]
    return ok, (r["stderr_lines"] or [""])[0] + "; previous report intact", r["seconds"]


WRITER = textwrap.dedent("""
    import sys
    from trainledger.ledger import Ledger
    led = Ledger(sys.argv[1])
    i = 0
    while True:
        led.add("measurement", "loop", {"i": i, "pad": "x" * 4000}, env={"env_id": "e"})
        print(i, flush=True)
        i += 1
""")


def case_killed_ledger_writer() -> tuple[bool, str, float]:
    """SIGKILL a writer 10 times at random moments; every acknowledged record must survive."""
    import random
    import sqlite3

    from trainledger.ledger import Ledger

    t0 = time.monotonic()
    db = Path(tempfile.mkdtemp()) / "ledger.db"
    acked = 0
    rnd = random.Random(0)
    for _ in range(10):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
        last, until = None, time.monotonic() + rnd.uniform(0.3, 1.5)
        while time.monotonic() < until:
            line = p.stdout.readline()
            if not line:
                break
            last = int(line)
        os.kill(p.pid, signal.SIGKILL)
        rest = p.stdout.read().split()
        p.wait(timeout=30)
        last = int(rest[-1]) if rest else last
        acked += (last + 1) if last is not None else 0
    with Ledger(db) as led:
        n = led.count()
    con = sqlite3.connect(db)
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    ok = acked <= n <= acked + 10 and integrity == "ok"
    return ok, f"10 kills: {n} records stored, {acked} acknowledged, integrity {integrity}", time.monotonic() - t0


TWO_WRITERS = textwrap.dedent("""
    import sys
    from trainledger.ledger import Ledger
    led = Ledger(sys.argv[1])
    for i in range(int(sys.argv[3])):
        led.add("measurement", "w", {"writer": sys.argv[2], "i": i}, env={"env_id": "e"})
""")


def case_two_writers() -> tuple[bool, str, float]:
    from trainledger.ledger import Ledger

    t0 = time.monotonic()
    db = Path(tempfile.mkdtemp()) / "ledger.db"
    Ledger(db).close()
    n = 300
    procs = [subprocess.Popen([sys.executable, "-c", TWO_WRITERS, str(db), tag, str(n)]) for tag in "ab"]
    for p in procs:
        p.wait(timeout=120)
    with Ledger(db) as led:
        recs = led.list()
    got = {t: sorted(r.result["i"] for r in recs if r.result["writer"] == t) for t in "ab"}
    ok = all(got[t] == list(range(n)) for t in "ab") and all(p.returncode == 0 for p in procs)
    return ok, f"2 x {n} concurrent writes: {len(recs)} stored", time.monotonic() - t0


def case_corpus_dead_worker() -> tuple[bool, str, float] | None:
    r = F.corpus_dead_worker(Path(tempfile.mkdtemp()))
    if r["killed"] is None:
        return None
    ok = not r["hung"] and r["rc"] != 0 and len(r["stderr_lines"]) == 1
    return ok, (r.get("stderr_lines") or ["hung"])[0], r["seconds"]


def case_timeout_audit() -> tuple[bool, str, float]:
    t0 = time.monotonic()
    rows = F.timeout_audit()
    bad = [r for r in rows if not r["timeout"]]
    return not bad, f"{len(rows)} blocking calls, {len(bad)} without a timeout", time.monotonic() - t0


CASES = [
    ("dead rank (SIGKILL in backward)", case_dead_rank, True),
    ("OOM (injected in backward)", case_oom, True),
    ("hung rank (collective timeout)", case_hung_rank, True),
    ("corrupted checkpoint", case_corrupt_checkpoint, True),
    ("full disk: checkpoint save", case_checkpoint_full_disk, True),
    ("full disk: ledger", case_ledger_full_disk, False),
    ("full disk: report", case_report_full_disk, False),
    ("killed ledger writer x10", case_killed_ledger_writer, False),
    ("two ledger writers at once", case_two_writers, False),
    ("corpus worker killed (OOM killer)", case_corpus_dead_worker, False),
    ("timeouts on every blocking call", case_timeout_audit, False),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the torchrun-based cases")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for name, fn, slow in CASES:
        if slow and a.quick:
            continue
        try:
            res = fn()
        except Exception as exc:  # a case that crashes is a case not survived
            res = (False, f"{type(exc).__name__}: {exc}", 0.0)
        status = "skipped" if res is None else ("survived" if res[0] else "FAILED")
        detail, secs = ("cannot mount a tmpfs here", 0.0) if res is None else (res[1], res[2])
        rows.append({"case": name, "status": status, "seconds": round(secs, 1), "record": detail})
        if not a.json:
            print(f"{status:<9} {secs:6.1f} s  {name:<36} {' '.join(str(detail).split())[:150]}", flush=True)
    survived = sum(r["status"] == "survived" for r in rows)
    failed = sum(r["status"] == "FAILED" for r in rows)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"fault cases survived: {survived}/{survived + failed}"
              + (f" ({len(rows) - survived - failed} skipped)" if len(rows) > survived + failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
