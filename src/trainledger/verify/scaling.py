"""``verify scaling``: does the plan's data-parallel layout scale on this machine?

Step time of the plan's model (its precision, micro-batch, accumulation, recompute; DDP, or FSDP2
for ZeRO-3) at 1, 2, 4 ... N ranks, one torchrun launch per world size. Weak scaling: every rank
keeps the plan's micro-batch, so tokens per step grow with N. Scaling efficiency

    E(N) = throughput(N) / (N · throughput(1)),   throughput = tokens per step / step time

(the usual weak-scaling efficiency, e.g. Narayanan et al. 2021, arXiv:2104.04473, §5.1 reports
it the same way), judged ``good`` above 0.85, ``needs work`` from 0.6 to 0.85 and
``layout problem`` below 0.6.

A verdict needs enough samples: each world size times at least ``MIN_STEPS`` steps after
``MIN_WARMUP`` untimed warm-up steps (the first steps pay allocator growth, kernel selection and
lazy initialisation). The efficiency carries an interval from the interquartile range of the step
times of both runs (slowest-quartile N-rank run against fastest-quartile 1-rank run and the
reverse); a verdict is given only when the whole interval falls in one band, else it is
``inconclusive``. Efficiency above 1 (superlinear) is reported with its reason: within the
interval it is noise; beyond it, the 1-rank baseline ran slower per token than one of N ranks. Tensor and pipeline parallelism are not run here. On CPU every
world size runs with the same threads per rank (cores // N), so a rank stands for one device.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError

GOOD = 0.85
NEEDS_WORK = 0.60
#: fewest timed steps per world size for a verdict; 10 gives quartiles of 2-3 samples each
MIN_STEPS = 10
#: untimed warm-up steps before timing (allocator growth, kernel autotuning, lazy init)
MIN_WARMUP = 3


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


def _quartiles(times: list[float]) -> tuple[float, float]:
    """(25th, 75th) percentile of step times (linear interpolation, numpy's default method)."""
    xs = sorted(times)

    def q(p: float) -> float:
        k = (len(xs) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return q(0.25), q(0.75)


def efficiency_interval(base: dict[str, Any], run: dict[str, Any]) -> tuple[float, float]:
    """Efficiency range from the interquartile step times of the 1-rank and the N-rank runs."""
    n = run["world_size"]
    if n == 1:
        return 1.0, 1.0
    b25, b75 = _quartiles(base.get("step_times_s") or [base["step_time_s"]])
    r25, r75 = _quartiles(run.get("step_times_s") or [run["step_time_s"]])
    tps = run["tokens_per_step"] / base["tokens_per_step"]  # = N: weak scaling
    return tps * b25 / (n * r75), tps * b75 / (n * r25)


def judge_measured(eff: float, lo: float, hi: float, steps: int) -> tuple[str, str]:
    """(verdict, why) of one measured efficiency with its interval and sample count."""
    if steps < MIN_STEPS:
        return "inconclusive", f"only {steps} timed steps; measure at least {MIN_STEPS} (--steps)"
    if judge(lo) != judge(hi):
        return "inconclusive", (f"the interval {lo:.2f}-{hi:.2f} spans more than one verdict: the step times "
                                f"are too noisy; more --steps or a quieter machine")
    why = ""
    if eff > 1:
        why = (f"above 1 within the measurement noise (interval {lo:.2f}-{hi:.2f})" if lo <= 1 else
               f"above 1 beyond the noise (interval {lo:.2f}-{hi:.2f}): the 1-rank run was slower per token "
               f"than each of the N ranks (e.g. on CPU: different threads or cache per rank); the layout "
               f"does not gain from N ranks, compare the step times")
    return judge(eff), why


def run_scaling(inputs: Any, device: str, nproc: int, steps: int = MIN_STEPS, warmup: int = MIN_WARMUP,
                timeout_s: float = 1800.0, collective_timeout_s: float = 120.0,
                env: dict[str, str] | None = None, progress=None) -> dict[str, Any]:
    from trainledger.load.plan import build_plan
    from trainledger.verify.launch import torchrun

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
    return finish({"plan": inputs.model_dump(mode="json"), "device": device, "runs": rows,
                   "steps": steps, "warmup": warmup})


def finish(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["runs"]
    base = rows[0]
    for r in rows:
        steps = len(r.get("step_times_s") or []) or result.get("steps", 0)
        r["efficiency"] = scaling_efficiency(base["tokens_per_s"], r["tokens_per_s"], r["world_size"])
        lo, hi = efficiency_interval(base, r)
        r["efficiency_interval"] = [lo, hi]
        if r["world_size"] == 1:
            r["verdict"], r["why"] = "baseline", ""
        else:
            r["verdict"], r["why"] = judge_measured(r["efficiency"], lo, hi, steps)
    last = rows[-1]
    result["efficiency"] = last["efficiency"]
    result["efficiency_interval"] = last["efficiency_interval"]
    result["verdict"] = last["verdict"]
    result["why"] = last["why"]
    result["ok"] = last["world_size"] == 1 or last["verdict"] != "layout problem"
    return result


def render(result: dict[str, Any]) -> str:
    from trainledger.format import table

    rows = [[r["world_size"], f"{r['step_time_s'] * 1e3:.1f}", f"{r['tokens_per_step']:,}",
             f"{r['tokens_per_s']:,.0f}", f"{r['efficiency']:.2f}",
             "-" if r["world_size"] == 1 else "{:.2f}-{:.2f}".format(*r["efficiency_interval"]), r["verdict"]]
            for r in result["runs"]]
    head = (f"data-parallel scaling of {result['plan']['model']} on {result['device']} "
            f"({'FSDP' if result['runs'][-1]['sharded'] else 'DDP'})")
    lo, hi = result.get("efficiency_interval") or (result["efficiency"], result["efficiency"])
    tail = (f"efficiency at {result['runs'][-1]['world_size']} ranks: {result['efficiency']:.2f} "
            f"(interquartile {lo:.2f}-{hi:.2f}) -> {result['verdict']} (good > {GOOD}, needs work "
            f"{NEEDS_WORK}-{GOOD}, layout problem < {NEEDS_WORK}; median of the timed steps after "
            f"{result.get('warmup', '?')} warm-up steps)")
    why = [f"note: {result['why']}"] if result.get("why") else []
    return "\n".join([head, table(rows, ["ranks", "step ms", "tokens/step", "tokens/s", "efficiency",
                                         "interval", "verdict"], "rrrrrrl"), tail, *why])
