"""``verify scaling``: does the plan's data-parallel layout scale on this machine?

Step time of the plan's model (its precision, micro-batch, accumulation, recompute; DDP, or FSDP2
for ZeRO-3) at 1, 2, 4 ... N ranks, one torchrun launch per world size. Weak scaling: every rank
keeps the plan's micro-batch, so tokens per step grow with N. Scaling efficiency

    E(N) = throughput(N) / (N · throughput(1)),   throughput = tokens per step / step time

(the usual weak-scaling efficiency, e.g. Narayanan et al. 2021, arXiv:2104.04473, §5.1 reports
it the same way), judged ``good`` above 0.85, ``needs work`` from 0.6 to 0.85 and
``layout problem`` below 0.6. Tensor and pipeline parallelism are not run here. On CPU every
world size runs with the same threads per rank (cores // N), so a rank stands for one device.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from ..errors import VerifyError

GOOD = 0.85
NEEDS_WORK = 0.60


def world_sizes(n: int) -> list[int]:
    """1, 2, 4 ... up to n, and n itself."""
    if n < 1:
        raise VerifyError(f"--nproc must be at least 1 (got {n})")
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def scaling_efficiency(tokens_per_s_1: float, tokens_per_s_n: float, n: int) -> float:
    """throughput(N) / (N · throughput(1))."""
    if tokens_per_s_1 <= 0 or n < 1:
        raise ValueError("throughput at 1 rank and N must be positive")
    return tokens_per_s_n / (n * tokens_per_s_1)


def judge(eff: float) -> str:
    if eff > GOOD:
        return "good"
    if eff >= NEEDS_WORK:
        return "needs work"
    return "layout problem"


def run_scaling(inputs: Any, device: str, nproc: int, steps: int = 5, warmup: int = 2,
                timeout_s: float = 1800.0, collective_timeout_s: float = 120.0,
                env: dict[str, str] | None = None, progress=None) -> dict[str, Any]:
    from ..planfile import build_plan
    from .launch import torchrun

    plan = build_plan(inputs)
    lay = plan.layout
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1 or lay.ep > 1:
        raise VerifyError(f"verify scaling runs DP/FSDP only; the plan has tp={lay.tp} pp={lay.pp} "
                          f"cp={lay.cp} ep={lay.ep} — set them to 1 to measure data-parallel scaling")
    if device == "cpu":  # every world size gets the same threads per rank, as GPUs get one GPU each
        import os

        env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)), **(env or {})}
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainledger-scaling-") as tmp:
        ip = Path(tmp) / "plan_inputs.json"
        ip.write_text(json.dumps(inputs.model_dump(mode="json")))
        for n in world_sizes(nproc):
            if progress:
                progress(f"scaling: {n} rank(s)")
            out = Path(tmp) / f"n{n}.json"
            args = ["--inputs", str(ip), "--device", device, "--steps", str(steps), "--warmup", str(warmup),
                    "--timeout", str(collective_timeout_s), "--out", str(out)]
            res = torchrun("trainledger.verify._scaling_worker", args, n, timeout_s, env=env)
            if not res.ok or not out.exists():
                raise VerifyError(res.failure(f"verify scaling at {n} rank(s)"))
            rows.append(json.loads(out.read_text()))
    return finish({"plan": inputs.model_dump(mode="json"), "device": device, "runs": rows})


def finish(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["runs"]
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["efficiency"] = scaling_efficiency(base, r["tokens_per_s"], r["world_size"])
        r["verdict"] = judge(r["efficiency"])
    last = rows[-1]
    result["efficiency"] = last["efficiency"]
    result["verdict"] = last["verdict"]
    result["ok"] = last["world_size"] == 1 or last["verdict"] != "layout problem"
    return result


def render(result: dict[str, Any]) -> str:
    from ..format import table

    rows = [[r["world_size"], f"{r['step_time_s'] * 1e3:.1f}", f"{r['tokens_per_step']:,}",
             f"{r['tokens_per_s']:,.0f}", f"{r['efficiency']:.2f}", r["verdict"]] for r in result["runs"]]
    head = (f"data-parallel scaling of {result['plan']['model']} on {result['device']} "
            f"({'FSDP' if result['runs'][-1]['sharded'] else 'DDP'})")
    tail = (f"efficiency at {result['runs'][-1]['world_size']} ranks: {result['efficiency']:.2f} -> "
            f"{result['verdict']} (good > {GOOD}, needs work {NEEDS_WORK}-{GOOD}, layout problem < {NEEDS_WORK})")
    return "\n".join([head, table(rows, ["ranks", "step ms", "tokens/step", "tokens/s", "efficiency", "verdict"],
                                  "rrrrrl"), tail])
