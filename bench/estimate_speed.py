"""Speed of one memory estimate (issue 3): the planner runs it 10^5 times, so it must take well
under 1 ms of CPU time. Prints µs of process CPU time per ``estimate_memory`` call (no
suggestions) for a spread of plans, and per full ``trainledger.estimate`` for reference.

Usage: python bench/estimate_speed.py [--n N]
"""

from __future__ import annotations

import sys
import time

from trainledger.estimate import estimate
from trainledger.estimate.memory import estimate_memory
from trainledger.estimate.options import MemoryOptions
from trainledger.load.plan import PlanInputs, build_plan

PLANS = {
    "8B full, 1 GPU": dict(model="llama-3.1-8b", seq_len=4096),
    "8B LoRA, eager": dict(model="llama-3.1-8b", seq_len=4096, method="lora", attention="eager"),
    "70B, 64 GPUs tp8 pp2 ZeRO-1": dict(model="llama-3.1-70b", seq_len=8192, gpus=64, tp=8, pp=2,
                                        zero=1, grad_accum=8),
    "Mixtral 8x7B, 16 GPUs ep8 ZeRO-3": dict(model="mixtral-8x7b", seq_len=4096, gpus=16, ep=8, zero=3),
    "DeepSeek-V3 inference": dict(model="deepseek-v3", method="inference", precision="bf16", gpus=16,
                                  tp=16, seq_len=8192),
}
LIMIT_US = 1000.0


def per_call_us(fn, n: int) -> float:
    fn()  # warm the per-model caches
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def main(argv: list[str]) -> int:
    n = int(argv[argv.index("--n") + 1]) if "--n" in argv else 2000
    opts = MemoryOptions(suggestions=False)
    worst = 0.0
    print(f"{'plan':36s} {'memory µs':>10s} {'full estimate µs':>17s}")
    for name, kw in PLANS.items():
        p = build_plan(PlanInputs(**kw))
        us = per_call_us(lambda p=p: estimate_memory(p, opts, suggest=False), n)
        full = per_call_us(lambda p=p: estimate(p), max(n // 20, 10))
        worst = max(worst, us)
        print(f"{name:36s} {us:10.1f} {full:17.1f}")
    print(f"slowest memory estimate: {worst:.1f} µs (limit {LIMIT_US:.0f} µs)")
    return 0 if worst < LIMIT_US else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
