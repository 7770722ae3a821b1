"""`trainledger calibrate --measured-step-time/--log`: glue from flags to calibrate.calibrate_time."""

from __future__ import annotations

from typing import Any

from trainledger.errors import SpecError


def run_time_calibration(path: str | None, measured: tuple[float, ...], logs: tuple[str, ...],
                         at_seq_len: tuple[int, ...], plan_kw: dict[str, Any]) -> dict[str, Any]:
    """Build the measured run's plan(s), read the step times, fit and store the factors."""
    from trainledger.ledger import calibrate
    from trainledger.estimate.time.calibration import step_time_from_log
    from trainledger.ledger import Ledger
    from trainledger.load.plan import build_plan
    from trainledger.cli.options import inputs_from_options

    inputs = inputs_from_options(dict(plan_kw))
    n = len(measured) + len(logs)
    if at_seq_len and len(at_seq_len) != n:
        raise SpecError(f"--at-seq-len given {len(at_seq_len)} times for {n} measured runs; give "
                        "one per --measured-step-time/--log, in the same order")
    seqs = list(at_seq_len) or [inputs.seq_len] * n
    plans = [build_plan(inputs.model_copy(update={"seq_len": s})) for s in seqs]
    runs, what = [], []
    for plan, t in zip(plans, measured):
        runs.append((plan, float(t)))
        what.append("--measured-step-time")
    for plan, log in zip(plans[len(measured):], logs):
        t, how = step_time_from_log(log, plan.tokens_per_step, plan.cluster.world_size)
        runs.append((plan, t))
        what.append(f"{log}: {how}")
    with Ledger(path) as led:
        return calibrate.calibrate_time(led, runs, "; ".join(what))
