"""Hostile corpus inputs: zip bombs (gzip, zstd), giant lines, deep nesting, truncation, bad UTF-8.

Each case runs ``trainledger.corpus.analyze`` in a fresh subprocess and measures its peak RSS
(``resource.getrusage`` ru_maxrss; on Linux /proc/self/status VmHWM, because ru_maxrss keeps the
forking parent's high-water mark across exec), so one case's memory cannot hide behind another's. The answer
must be a report that counts the bad records or one CorpusError — bounded in time and memory,
never a traceback. (Ordinary bad input — malformed lines, missing fields, small bombs — is covered
by tests/corpus/test_corpus_errors.py; these are the large and adversarial cases.)

Bombs are built by concatenating one small compressed member/frame many times (valid gzip and
zstd streams), so a 1 GiB bomb costs milliseconds to make.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TIME_LIMIT_S = 30.0
RSS_LIMIT_MB = 400.0
MIB = 1 << 20

RUNNER = r"""
import json, resource, sys, time
from trainledger.corpus import CorpusOptions, analyze
from trainledger.errors import TrainledgerError
t0 = time.monotonic()
try:
    s = analyze(sys.argv[2:], CorpusOptions(workers=int(sys.argv[1]), quiet=True) if 'quiet' in
                CorpusOptions.model_fields else CorpusOptions(workers=int(sys.argv[1])))
    out = {"ok": True, "samples": s["samples"], "errors": s["errors"]["by_kind"],
           "warnings": s.get("warnings", [])}
except TrainledgerError as e:
    out = {"ok": False, "error": type(e).__name__, "message": str(e)}
out["seconds"] = time.monotonic() - t0
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
try:  # Linux keeps the parent's high-water mark in ru_maxrss across fork+exec; VmHWM is this image's
    out["rss_mb"] = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")) / 1024
except (OSError, StopIteration):
    pass
print("#result " + json.dumps(out))
"""


def run_corpus(paths: list[Path], workers: int = 1) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(workers), *map(str, paths)],
                          capture_output=True, text=True, timeout=TIME_LIMIT_S * 3)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("#result ")), None)
    assert line, proc.stdout[-1000:] + proc.stderr[-2000:]
    return json.loads(line[len("#result "):])


def _gzip_repeat(path: Path, member: bytes, times: int, head: bytes = b"") -> Path:
    one = gzip.compress(member, 9)
    path.write_bytes((gzip.compress(head) if head else b"") + one * times)
    return path


def _zstd_repeat(path: Path, member: bytes, times: int) -> Path:
    zstandard = pytest.importorskip("zstandard")
    one = zstandard.ZstdCompressor(level=19).compress(member)
    path.write_bytes(one * times)
    return path


def _lines_mib() -> bytes:
    line = b'{"text": "' + b"a" * 1000 + b'"}\n'
    return line * (MIB // len(line))


def bomb_gzip(d: Path) -> Path:  # 256 MiB of JSON lines from ~260 kB (gzip's ratio tops out near 1000)
    return _gzip_repeat(d / "bomb.jsonl.gz", _lines_mib(), 256)


def bomb_zstd(d: Path) -> Path:  # 1 GiB of JSON lines from a few KB
    return _zstd_repeat(d / "bomb.jsonl.zst", _lines_mib(), 1024)


def giant_line_gzip(d: Path) -> Path:  # one 1 GiB line
    return _gzip_repeat(d / "giant.jsonl.gz", b"b" * MIB, 1024, head=b'{"text": "')


def giant_line_plain(d: Path) -> Path:  # 48 MiB without a newline (over the 32 MiB line cap)
    p = d / "giant.jsonl"
    with p.open("wb") as f:
        f.write(b'{"text": "')
        for _ in range(48):
            f.write(b"c" * MIB)
    return p


def deep_jsonl(d: Path) -> Path:
    p = d / "deep.jsonl"
    p.write_bytes(b'{"text": "fine"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n" + b'{"text": "also fine"}\n')
    return p


def deep_json(d: Path) -> Path:
    p = d / "deep.json"
    p.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    return p


def truncated_zstd(d: Path) -> Path:
    zstandard = pytest.importorskip("zstandard")
    import random

    rnd = random.Random(0)
    body = b"".join(json.dumps({"text": " ".join(str(rnd.random()) for _ in range(20))}).encode() + b"\n"
                    for _ in range(20_000))
    z = zstandard.ZstdCompressor().compress(body)
    p = d / "cut.jsonl.zst"
    p.write_bytes(z[: len(z) // 2])
    return p


def bad_utf8_everywhere(d: Path) -> Path:
    p = d / "bad.jsonl.gz"
    rows = [b'{"text": "ok %d"}' % i if i % 3 else b'{"text": "\xff\xfe\xc3\x28"}' for i in range(3000)]
    p.write_bytes(gzip.compress(b"\n".join(rows) + b"\n"))
    return p


def garbage_gzip(d: Path) -> Path:
    p = d / "garbage.jsonl.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 200)
    return p


CASES = {
    "gzip bomb 256 MiB": (bomb_gzip, "refused"),
    "zstd bomb 1 GiB": (bomb_zstd, "refused"),
    "gzip single 1 GiB line": (giant_line_gzip, "refused"),
    "plain 48 MiB line": (giant_line_plain, "refused"),
    "JSONL line nested 100k deep": (deep_jsonl, "counted"),
    "JSON document nested 100k deep": (deep_json, "refused"),
    "truncated zstd": (truncated_zstd, "counted"),
    "invalid UTF-8 in gzip": (bad_utf8_everywhere, "counted"),
    "gzip header then garbage": (garbage_gzip, "refused"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_corpus_bounded(tmp_path, name):
    make, expect = CASES[name]
    res = run_corpus([make(tmp_path)])
    log = os.environ.get("TRAINLEDGER_FUZZ_LOG")  # bench/fuzz_report.py prints time and peak RSS
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"corpus": name, "seconds": res["seconds"], "rss_mb": res["rss_mb"],
                                "answer": "report" if res["ok"] else res["error"]}) + "\n")
    assert res["seconds"] < TIME_LIMIT_S, res
    assert res["rss_mb"] < RSS_LIMIT_MB, res
    if res["ok"]:
        assert sum(res["errors"].values()) >= 1, f"bad input not reported: {res}"
        assert any("skipped" in w or "zip bomb" in w for w in res["warnings"]), res
    else:
        assert res["error"] == "CorpusError", res
        assert "\n" not in res["message"].strip() and len(res["message"]) < 2000, res
    if expect == "counted":
        assert res["ok"] and res["samples"] >= 1, res


def test_bombs_with_worker_processes(tmp_path):
    """The same guards hold when the work is split over worker processes."""
    res = run_corpus([giant_line_gzip(tmp_path), bomb_zstd(tmp_path), deep_jsonl(tmp_path)], workers=2)
    assert res["seconds"] < TIME_LIMIT_S and res["rss_mb"] < RSS_LIMIT_MB, res
    assert res["ok"] and res["errors"].get("unreadable", 0) >= 2, res


def test_corpus_cli_bomb_one_error_line(tmp_path):
    path = giant_line_gzip(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "trainledger", "corpus", "-q", "-j", "1", str(path)],
                          capture_output=True, text=True, timeout=TIME_LIMIT_S * 2)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
