"""The one optimizer table, checked against its sources and read the same way by every section."""

from __future__ import annotations

import pytest

from trainledger.estimate import estimate
from trainledger.estimate.run.checkpoint import checkpoint_bytes
from trainledger.estimate.optimizers import BNB_BLOCK, STATES_PER_PARAM, state_bytes_per_param
from trainledger.load.plan import build_plan, parse_inputs


def test_state_counts_follow_the_algorithms():
    # AdamW: exp_avg + exp_avg_sq; Lion and SGD-momentum: one buffer; plain SGD: none.
    assert STATES_PER_PARAM["adamw"] == 2 and STATES_PER_PARAM["adamw-fused"] == 2
    assert STATES_PER_PARAM["lion"] == 1 and STATES_PER_PARAM["sgd-momentum"] == 1
    assert STATES_PER_PARAM["sgd"] == 0


def test_bitsandbytes_8bit_states_use_256_element_blocks():
    # bitsandbytes Optimizer2State.init_state: uint8 state1/state2 plus one fp32 absmax per 256 values
    assert BNB_BLOCK == 256
    assert state_bytes_per_param("adamw-8bit", "fp32") == pytest.approx(2 * (1 + 4 / 256))
    assert state_bytes_per_param("adamw", "fp32") == 8.0  # 2 fp32 states
    assert state_bytes_per_param("adamw", "bf16") == 4.0


@pytest.mark.parametrize("optimizer", ["adamw", "adamw-8bit", "lion", "sgd-momentum"])
def test_memory_and_checkpoint_read_the_same_table(optimizer):
    """The optimizer-state term of the memory ledger and the checkpoint's size agree per parameter."""
    plan = build_plan(parse_inputs({"model": "llama-3.2-1b", "optimizer": optimizer}))
    est = estimate(plan)
    n = plan.model.params.total
    mem_states = est.memory.breakdown.get("optimizer_states", 0)
    assert mem_states == pytest.approx(n * state_bytes_per_param(optimizer, "fp32"), rel=1e-6)
    ck = est.extra["checkpoint"].to_dict()
    full = next(t["value"] for t in ck["terms"] if t["name"] == "full_bytes")
    assert full == pytest.approx(checkpoint_bytes(n, 4, 0, state_bytes_per_param(optimizer, "fp32")), rel=1e-6)
