"""Fuzz counts of the reliability suite (issue 9): hypothesis examples run per property, hostile
inputs survived, schemathesis cases per API operation.

    python bench/fuzz_report.py                  # the suite's own (CI) example counts
    python bench/fuzz_report.py --scale 4        # 4x the schemathesis examples per operation

Runs ``pytest tests/reliability`` (all but the fault tests, which ``bench/faults.py`` reports)
with hypothesis statistics, a JUnit XML report and a log of every schemathesis case, then prints
three tables. Exit status 1 when any test failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["test_props_estimate.py", "test_props_plan.py", "test_props_config.py", "test_hostile_files.py",
         "test_hostile_corpus.py", "test_web_fuzz.py"]
HOSTILE = {"test_hostile_files.py": "config/plan files, odd paths, remote code",
           "test_hostile_corpus.py": "corpus bombs, giant lines, deep JSON",
           "test_web_fuzz.py": "web bodies, pasted configs, client-named files"}
_STAT_HEAD = re.compile(r"^(tests/reliability/\S+?)::(\S+?):\s*$")
_STAT_LINE = re.compile(r"- (\d+) passing, (\d+) failing, and (\d+) invalid test cases")


def parse_statistics(text: str) -> dict[str, dict[str, int]]:
    """test -> {run, invalid} summed over hypothesis phases (explicit, reuse, generate, shrink)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"run": 0, "invalid": 0, "blocks": 0})
    current = None
    for line in text.splitlines():
        m = _STAT_HEAD.match(line.strip())
        if m:
            current = f"{Path(m.group(1)).name}::{m.group(2)}"
            out[current]["blocks"] += 1
            continue
        m = _STAT_LINE.search(line)
        if m and current:
            out[current]["run"] += int(m.group(1)) + int(m.group(2))
            out[current]["invalid"] += int(m.group(3))
    return dict(out)


def parse_junit(path: Path) -> dict[str, Counter]:
    """file -> Counter(passed, failed, skipped) over its test cases."""
    res: dict[str, Counter] = defaultdict(Counter)
    for tc in ET.parse(path).getroot().iter("testcase"):
        f = tc.get("classname", "").split(".")[-1] + ".py"
        if tc.find("failure") is not None or tc.find("error") is not None:
            res[f]["failed"] += 1
        elif tc.find("skipped") is not None:
            res[f]["skipped"] += 1
        else:
            res[f]["passed"] += 1
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply schemathesis examples per operation")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tl-fuzz-"))
    log, junit = tmp / "schemathesis.jsonl", tmp / "junit.xml"
    env = {**os.environ, "TRAINLEDGER_FUZZ_LOG": str(log), "HF_HUB_OFFLINE": "1",
           "TRAINLEDGER_FUZZ_EXAMPLES": str(int(40 * a.scale))}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
           f"--junitxml={junit}", *[f"tests/reliability/{f}" for f in FILES]]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    (tmp / "pytest.txt").write_text(proc.stdout + proc.stderr)
    stats = parse_statistics(proc.stdout)
    outcomes = parse_junit(junit) if junit.exists() else {}
    cases = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    corpus = [c for c in cases if "corpus" in c]
    cases = [c for c in cases if "op" in c]
    ops: dict[str, Counter] = defaultdict(Counter)
    for c in cases:
        ops[c["op"]][str(c["status"])] += 1
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if a.json:
        print(json.dumps({"properties": stats, "outcomes": {k: dict(v) for k, v in outcomes.items()},
                          "schemathesis": {k: dict(v) for k, v in ops.items()}, "corpus": corpus,
                          "pytest": summary}, indent=1))
        return 0 if proc.returncode == 0 else 1
    print("hypothesis examples run per property (passing + failing, all phases; invalid = filtered out)")
    for name, s in sorted(stats.items()):
        if "conforms_to_its_schema" in name:
            continue
        print(f"  {s['run']:>6}  ({s['invalid']:>4} invalid)  {name}")
    total = sum(s["run"] for n, s in stats.items() if "conforms_to_its_schema" not in n)
    print(f"  {total:>6}  examples in all\n")
    print("hostile inputs survived (test cases passed / run)")
    for f, what in HOSTILE.items():
        o = outcomes.get(f, Counter())
        hostile = o["passed"] + o["failed"]
        print(f"  {o['passed']:>4} / {hostile:<4} {f:<24} {what}")
    print("\nhostile corpus inputs (fresh subprocess each): time and peak RSS")
    for c in corpus:
        print(f"  {c['seconds']:6.2f} s {c['rss_mb']:7.1f} MiB  {c['corpus']:<32} -> {c['answer']}")
    print()
    print("schemathesis cases per API operation (status codes answered)")
    for op, cnt in sorted(ops.items()):
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(cnt.items()))
        print(f"  {sum(cnt.values()):>5}  {op:<22} {codes}")
    print(f"  {len(cases):>5}  cases in all, {sum(1 for c in cases if c['status'] >= 500)} answered 5xx\n")
    print(f"pytest: {summary}" + ("" if proc.returncode == 0 else f" (output: {tmp / 'pytest.txt'})"))
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
