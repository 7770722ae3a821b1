"""Hostile-input report (issue 20): per input kind, cases tried / clean errors / tracebacks / hangs
/ peak RSS; and (``--suite``) the fuzz counts of the reliability suite (issue 9).

    python bench/fuzz_report.py                        # every issue-20 case at full size
    python bench/fuzz_report.py --scale 0.25 --kind corpus
    python bench/fuzz_report.py --src /tmp/old/src     # the same cases against another source tree
    python bench/fuzz_report.py --suite [--scale 4]    # pytest tests/reliability with hypothesis stats

The issue-20 cases (tests/reliability/hostile20.py) are generated in a temporary folder (sparse
files for the multi-GB ones) and each runs as one ``trainledger`` command in a fresh subprocess
under a 6 GiB address-space limit and a time limit; a case is ``ok``, a ``clean error`` (one
``error:`` line), a ``traceback``, a ``hang`` (killed at the limit) or a ``crash``. Peak RSS is the
process's VmHWM. Exit status 1 when any case tracebacked, hung, crashed or passed the RSS limit.
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


def hostile_main(a: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT / "tests" / "reliability"))
    import shutil

    from hostile20 import ALL_CASES, KINDS, RSS_LIMIT_MB, run_case

    src = Path(a.src).resolve() if a.src else None
    cases = [c for c in ALL_CASES if not a.kind or c.kind == a.kind]
    tmp = Path(tempfile.mkdtemp(prefix="tl-hostile-"))
    outcomes = []
    try:
        for i, case in enumerate(cases):
            o = run_case(case, tmp / f"case{i}", a.scale, a.timeout, src)
            outcomes.append(o)
            if a.verbose:
                print(f"  {o.status:<11} {o.seconds:6.1f} s {o.rss_mb:7.1f} MiB  {o.kind:<11} {o.name}: {o.line[:110]}",
                      flush=True)
            shutil.rmtree(tmp / f"case{i}", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for kind in [k for k in KINDS if any(o.kind == k for o in outcomes)]:
        mine = [o for o in outcomes if o.kind == kind]
        count = Counter(o.status for o in mine)
        rows.append({"kind": kind, "cases": len(mine), "ok": count["ok"], "clean_errors": count["clean error"],
                     "tracebacks": count["traceback"], "hangs": count["hang"], "crashes": count["crash"],
                     "peak_rss_mb": max(o.rss_mb for o in mine), "max_seconds": max(o.seconds for o in mine)})
    bad = [o for o in outcomes if o.status in ("traceback", "hang", "crash") or o.rss_mb > RSS_LIMIT_MB]
    if a.json:
        print(json.dumps({"rows": rows, "cases": [o.__dict__ for o in outcomes]}, indent=1))
        return 1 if bad else 0
    print(f"hostile inputs (issue 20), scale {a.scale:g}, time limit {a.timeout:g} s per case, "
          f"RSS limit {RSS_LIMIT_MB:.0f} MiB, source {src or ROOT / 'src'}")
    print(f"{'input kind':<12} {'cases':>5} {'ok':>4} {'clean err':>9} {'traceback':>9} {'hang':>5} {'crash':>5} "
          f"{'peak RSS MiB':>12} {'max s':>6}")
    for r in rows:
        print(f"{r['kind']:<12} {r['cases']:>5} {r['ok']:>4} {r['clean_errors']:>9} {r['tracebacks']:>9} "
              f"{r['hangs']:>5} {r['crashes']:>5} {r['peak_rss_mb']:>12.0f} {r['max_seconds']:>6.1f}")
    for o in bad:
        why = o.status if o.status != "ok" and o.status != "clean error" else f"RSS {o.rss_mb:.0f} MiB"
        print(f"  FAIL {o.kind}: {o.name}: {why}: {o.line[:140]}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="store_true", help="the issue-9 reliability suite counts instead")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="size of the generated inputs (issue 20) / schemathesis examples (--suite)")
    ap.add_argument("--kind", help="only this input kind (config.json, plan file, --from, corpus, ledger)")
    ap.add_argument("--src", help="source tree to test (default: this checkout's src)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--verbose", "-v", action="store_true", help="one line per case")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    return suite_main(a) if a.suite else hostile_main(a)


def suite_main(a: argparse.Namespace) -> int:
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
