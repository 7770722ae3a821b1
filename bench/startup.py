"""Start-up time of CLI commands: wall-clock of a fresh process, and the heavy modules it imported.

    python bench/startup.py            # 5 runs of each command, median and min printed
    python bench/startup.py --runs 3

Each command runs in a new interpreter (``python -m trainledger ...``), as a user runs it; the
figures include interpreter start. A command must import only what it needs: ``--version`` no
pydantic, ``estimate --from training_args.yaml`` no transformers/peft/torch (issue 18, item 10).
Timings on a shared machine are noisy; compare the min of several runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("pydantic", "transformers", "peft", "torch", "numpy", "fastapi")
PROBE = ("import runpy, sys, atexit\n"
         "atexit.register(lambda: sys.stderr.write('\\nHEAVY ' + ' '.join(m for m in {heavy!r} if m in sys.modules) + '\\n'))\n"
         "sys.argv = ['trainledger'] + {args!r}\n"
         "runpy.run_module('trainledger', run_name='__main__')\n")


def run(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, args=args)], capture_output=True,
                       text=True, env=env)
    dt = time.perf_counter() - t0
    heavy = next((ln[6:] for ln in p.stderr.splitlines() if ln.startswith("HEAVY ")), "?")
    if p.returncode not in (0,):
        heavy += f" (exit {p.returncode}: {p.stderr.strip().splitlines()[0] if p.stderr.strip() else ''})"
    return dt, heavy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    tmp = Path(tempfile.mkdtemp(prefix="tl-startup-"))
    subprocess.run([sys.executable, "-m", "trainledger", "export", "--method", "lora", "--to", "trainer-args",
                    "--out", str(tmp)], env=env, check=True, capture_output=True)
    cmds = {
        "--version": ["--version"],
        "--help": ["--help"],
        "gpus": ["gpus"],
        "estimate": ["estimate"],
        "estimate --from training_args.yaml": ["estimate", "--from", str(tmp / "training_args.yaml")],
    }
    print(f"{'command':40s} {'median s':>9s} {'min s':>7s}  heavy modules imported")
    for name, args in cmds.items():
        times, heavy = [], ""
        for _ in range(a.runs):
            dt, heavy = run(args, env)
            times.append(dt)
        print(f"{name:40s} {statistics.median(times):9.3f} {min(times):7.3f}  {heavy or '-'}")


if __name__ == "__main__":
    main()
