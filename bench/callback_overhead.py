"""Overhead of trainledger's run recorder (verify/callbacks.py) on a plain PyTorch loop.

Prints the mean step time of a small Llama-shaped model on this machine's CPU without the
recorder, with the recorder in timing-only mode (what a CUDA run costs: peak counters are read once
at the end), and with the CPU memory tracker on. Short: 3 rounds × 12 steps, alternating order.
"""

from __future__ import annotations

import statistics
import time

import torch
import transformers

from trainledger.verify.callbacks import track_run

STEPS, ROUNDS = 12, 3


def model():
    cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def loop(m, opt, run=None) -> float:
    t0 = time.perf_counter()
    for _ in range(STEPS):
        ids = torch.randint(0, 2048, (4, 128))
        if run is None:
            m(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            with run.step():
                m(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
    return (time.perf_counter() - t0) / STEPS


def main() -> None:
    torch.set_num_threads(1)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    loop(m, opt)  # warm-up
    base, timing, tracked = [], [], []
    for _ in range(ROUNDS):
        base.append(loop(m, opt))
        with track_run(m, store=False, track_cpu=False) as run:
            timing.append(loop(m, opt, run))
        with track_run(m, store=False, track_cpu=True) as run2:
            tracked.append(loop(m, opt, run2))
    b, t, k = statistics.median(base), statistics.median(timing), statistics.median(tracked)
    print(f"step time, median of {ROUNDS} rounds × {STEPS} steps (CPU, 1 thread):")
    print(f"  no recorder                 {b * 1e3:8.2f} ms")
    print(f"  recorder, timing only       {t * 1e3:8.2f} ms  ({100 * (t / b - 1):+.2f}%)")
    print(f"  recorder + CPU mem tracker  {k * 1e3:8.2f} ms  ({100 * (k / b - 1):+.2f}%)")
    print(f"  recorder's own time per run (start, per-step bookkeeping, counter reads): "
          f"{run.recorder.overhead_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
