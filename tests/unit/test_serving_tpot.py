"""TPOT p99 as vLLM's benchmark reports it: the 99th percentile over requests of each request's
mean time per output token ((e2e - TTFT) / (n_out - 1)), not the slowest single step (that is ITL)."""

from __future__ import annotations

import math

import pytest

from trainledger.estimate.serving.perf import EXACT_STEPS, Z99, ServingPerf, binomial_p99, request_tpot_p99
from trainledger.load.plan import PlanInputs, build_plan


def _quantile_by_sum(n: int, q: float) -> int:
    cdf = 0.0
    for k in range(n + 1):
        cdf += math.comb(n, k) * q**k * (1 - q) ** (n - k)
        if cdf >= 0.99:
            return k
    return n


@pytest.mark.parametrize("n,q", [(1, 0.1), (1, 0.005), (10, 0.1), (99, 0.1), (200, 0.02), (500, 0.5)])
def test_binomial_quantile_equals_the_sum_of_the_pmf(n, q):
    assert binomial_p99(n, q) == _quantile_by_sum(n, q)


def test_normal_tail_for_long_outputs():
    assert Z99 == pytest.approx(2.3263, abs=5e-4)  # the standard normal's 0.99 quantile
    n, q = 100_000, 0.1
    assert binomial_p99(n, q) == math.ceil(n * q + Z99 * math.sqrt(n * q * (1 - q)))


def _quantile_exact(n: int, num: int, den: int) -> int:
    """K's 0.99 quantile for q = num/den in integer arithmetic: the smallest k with
    100·Σ_{i<=k} C(n,i)·num^i·(den-num)^(n-i) >= 99·den^n (no rounding at any n)."""
    target, cdf = 99 * den**n, 0
    for k in range(n + 1):
        cdf += 100 * math.comb(n, k) * num**k * (den - num) ** (n - k)
        if cdf >= target:
            return k
    return n


@pytest.mark.parametrize("num,den", [(1, 10_000), (1, 1000), (3, 1000), (1, 100), (3, 100), (1, 20), (1, 5)])
def test_normal_quantile_past_exact_steps_is_within_one_slow_step_of_the_exact_one(num, den):
    """Where the exact sum stops (n > EXACT_STEPS) the normal quantile takes over. Across the next
    quarter of n (the range a 1.25x threshold would hand back to the exact sum) it agrees with the
    exact Binomial quantile to one slow step, i.e. a request TPOT within (slow - plain)/n < 0.05% of
    the step-time spread: where the threshold sits trades speed, not accuracy (an equivalent mutant
    for the probe)."""
    for n in range(EXACT_STEPS + 1, EXACT_STEPS + EXACT_STEPS // 4 + 1, EXACT_STEPS // 16):
        assert abs(binomial_p99(n, num / den) - _quantile_exact(n, num, den)) <= 1


def test_hand_worked_request_tpot():
    # steps of 0.1 s, or 0.3 s with a prefill chunk; mean 0.12 s -> q = 0.1 of the steps are slow.
    # One decode step: P(K = 0) = 0.9 < 0.99, so the p99 request met the slow step: 0.3 s.
    assert request_tpot_p99(0.12, 0.1, 0.3, 1) == pytest.approx(0.3)
    # 99 steps: K's p99 is the summed quantile; TPOT = 0.1 + K/99 * 0.2
    assert request_tpot_p99(0.12, 0.1, 0.3, 99) == pytest.approx(0.1 + _quantile_by_sum(99, 0.1) / 99 * 0.2)


def test_limits():
    assert request_tpot_p99(0.12, 0.1, 0.3, 1e7) == pytest.approx(0.12, rel=2e-3)  # long outputs: the mean
    assert request_tpot_p99(0.1, 0.1, 0.3, 50) == pytest.approx(0.1)                # no prefill chunks: no tail
    assert request_tpot_p99(0.1, 0.1, 0.1, 50) == 0.1
    tail = [request_tpot_p99(0.12, 0.1, 0.3, n) for n in (1, 10, 100, 1000, 10_000)]
    assert tail == sorted(tail, reverse=True)  # more tokens per request average more steps


def test_serving_figures_order_mean_p99_worst():
    plan = build_plan(PlanInputs(model="llama-3.1-8b", gpu="h100-sxm", method="inference", seq_len=2048))
    perf = ServingPerf(plan)
    for out in (16, 256):
        f = perf.continuous(32, 2048, out)
        assert f["tpot_s"] <= f["tpot_p99_s"] <= f["tpot_worst_s"]
    short, long = perf.continuous(32, 2048, 256), perf.continuous(32, 2048, 1024)

    def gap(f):
        return (f["tpot_p99_s"] - f["tpot_s"]) / (f["tpot_worst_s"] - f["tpot_s"])

    assert gap(long) < gap(short)


@pytest.mark.parametrize("batch,prompt,out", [(1, 128, 2048), (64, 1024, 4096), (256, 32, 8192), (16, 100, 13)])
def test_static_batch_tpot_is_the_mean_over_every_decode_step(batch, prompt, out):
    """A static batch's TPOT is the mean time of its out - 1 decode steps, step i attending to
    prompt + i tokens (vLLM benchmark_serving: (e2e - TTFT) / (n_out - 1)). ``static_batch``
    integrates the decode phase on DECODE_SAMPLES midpoints instead of stepping through every
    token; a decode step's time is affine in the context (KV reads grow by one token's bytes per
    step), and the midpoint rule is exact for an affine integrand whatever the number of samples:
    the count trades nothing but speed (an equivalent mutant for the probe)."""
    perf = ServingPerf(build_plan(PlanInputs(model="llama-3.1-8b", gpu="h100-sxm", method="inference")))
    n = out - 1
    steps = [perf.decode_s(batch, prompt + i) for i in range(1, n + 1)]
    slope = (steps[-1] - steps[0]) / max(n - 1, 1)
    assert all(s == pytest.approx(steps[0] + slope * i, rel=1e-9) for i, s in enumerate(steps))  # affine
    assert perf.static_batch(batch, prompt, out)["tpot_s"] == pytest.approx(sum(steps) / n, rel=1e-3)
