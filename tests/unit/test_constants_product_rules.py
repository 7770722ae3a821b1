"""Two product rules written as numbers in the code, tested as behaviour with inputs that would
break them (issue 13 item 9: the mutation probe found no test that saw them).

* At most six suggestions when a plan does not fit (estimate/memory/suggest.py): the list is a
  short menu of the cheapest single changes, not every variant that fits.
* A time interval is taken from a stack/GPU-family's own residuals only when the accuracy suite
  holds at least five measurements of that pair (estimate/time/intervals.py); with fewer, the
  pooled residuals of all cases, widened, stand in.

The expected numbers (six, five) are the rules themselves, not the estimator's output; the
inputs are chosen so that a larger cap or a larger minimum would change the result.
"""

from __future__ import annotations

import pytest

from trainledger.estimate.memory import estimate_memory, suggest
from trainledger.estimate.options import MemoryOptions
from trainledger.estimate.time import intervals
from trainledger.load.plan import PlanInputs, build_plan

#: the product rule: at most six suggestions
SIX = 6
#: the product rule: a stack/family interval needs at least five measured cases
FIVE = 5

#: Llama-3.2-1B, AdamW, bf16-mixed, 8 x A100-40GB without ZeRO, micro-batch 2 of 2048 tokens:
#: slightly over the budget, so that many single changes fit (recompute, 16-bit weights, ZeRO-1/2/3,
#: 8-bit states, offload, LoRA, QLoRA, more GPUs): ten at the time of writing, more than six
OVER = dict(model="llama-3.2-1b", gpu="a100-sxm-40gb", gpus=8, seq_len=2048, micro_batch=2)


def _all_fitting(plan, monkeypatch) -> list[str]:
    """Every single change that fits, in cost order (the cap lifted)."""
    with monkeypatch.context() as m:
        m.setattr(suggest, "MAX_SUGGESTIONS", 10_000)
        est = estimate_memory(plan, MemoryOptions())
    return [s["change"] for s in est.suggestions]


def test_no_more_than_six_suggestions_when_more_changes_fit(monkeypatch):
    plan = build_plan(PlanInputs(**OVER))
    est = estimate_memory(plan, MemoryOptions())
    assert not est.fits
    every = _all_fitting(plan, monkeypatch)
    assert len(every) > SIX, f"the plan must admit more than six fitting changes to test the cap: {every}"
    shown = [s["change"] for s in est.suggestions]
    assert len(shown) == SIX, shown
    assert shown == every[:SIX]  # the six cheapest, in cost order
    assert all(s["fits"] for s in est.suggestions)


def _table(n_own: int) -> dict:
    return {"pooled": {"n": 228, "p10": -0.05, "p90": 0.11},
            "stacks": {"fsdp2/hopper": {"n": n_own, "p10": -0.02, "p90": 0.03, "median": 0.0}}}


@pytest.mark.parametrize("n_own,own", [(FIVE, True), (FIVE + 1, True), (FIVE - 1, False), (1, False)])
def test_a_stack_family_interval_needs_five_measured_cases(monkeypatch, n_own, own):
    monkeypatch.setattr(intervals, "_table", lambda: _table(n_own))
    lo, hi, basis = intervals.rate_interval("fsdp2", "hopper")
    if own:
        assert (lo, hi) == (-0.02, 0.03)
        assert f"n={n_own}" in basis and "fsdp2/hopper" in basis
    else:  # the pooled residuals, widened by UNSEEN_WIDENING (an extrapolation)
        assert (lo, hi) == pytest.approx((-0.05 * intervals.UNSEEN_WIDENING, 0.11 * intervals.UNSEEN_WIDENING))
        assert "pooled" in basis
