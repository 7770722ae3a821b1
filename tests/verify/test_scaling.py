"""verify scaling: efficiency arithmetic and verdicts, and a 1 -> 2 gloo-rank run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import VerifyError
from trainledger.load.plan import parse_inputs
from trainledger.verify import scaling as S


def test_world_sizes():
    assert S.world_sizes(1) == [1]
    assert S.world_sizes(2) == [1, 2]
    assert S.world_sizes(6) == [1, 2, 4, 6]
    assert S.world_sizes(8) == [1, 2, 4, 8]
    with pytest.raises(VerifyError):
        S.world_sizes(0)


def test_efficiency_and_verdicts():
    # 8 ranks reach 6.8x the one-rank throughput: 6.8 / 8 = 0.85
    assert S.scaling_efficiency(1000.0, 6800.0, 8) == pytest.approx(0.85)
    assert S.judge(0.86) == "good"
    assert S.judge(0.85) == "needs work"  # "good above 0.85"
    assert S.judge(0.60) == "needs work"
    assert S.judge(0.59) == "layout problem"


def _run(n: int, tokens_per_s: float, spread: float = 0.01, steps: int = 10) -> dict:
    """A synthetic run of n ranks: 100 tokens per rank per step, step times within ±spread."""
    tokens = 100 * n
    t = tokens / tokens_per_s
    times = [t * (1 + spread * (2 * i / (steps - 1) - 1)) for i in range(steps)]
    return {"world_size": n, "tokens_per_s": tokens_per_s, "tokens_per_step": tokens, "step_time_s": t,
            "step_times_s": times}


def test_finish_on_synthetic_runs():
    runs = [_run(1, 100.0), _run(2, 190.0), _run(4, 200.0)]
    r = S.finish({"runs": runs})
    assert [x["efficiency"] for x in r["runs"]] == pytest.approx([1.0, 0.95, 0.5])
    assert [x["verdict"] for x in r["runs"]] == ["baseline", "good", "layout problem"]
    assert r["ok"] is False and r["efficiency"] == pytest.approx(0.5)


def test_tensor_parallel_is_refused():
    inputs = parse_inputs({"model": "tiny-llama-debug", "gpus": 2, "tp": 2})
    with pytest.raises(VerifyError, match="DP/FSDP only"):
        S.run_scaling(inputs, "cpu", 2)


@pytest.mark.slow
def test_cli_scaling_two_gloo_ranks(tmp_path):
    pytest.importorskip("torch")
    r = CliRunner().invoke(main, ["verify", "scaling", "--model", "tiny-llama-debug", "--seq-len", "32",
                                  "--precision", "fp32", "--grad-accum", "2", "--nproc", "2", "--steps", "2", "--json",
                                  "--ledger", str(tmp_path / "l.db"), "--timeout", "180"])
    assert r.exit_code in (0, 1), r.output  # 1 = "layout problem" on a busy 2-core machine
    d = json.loads(r.output[r.output.index("{"):])
    one, two = d["runs"]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert two["tokens_per_step"] == 2 * one["tokens_per_step"] == 2 * 2 * 32
    assert one["efficiency"] == pytest.approx(1.0)
    assert two["efficiency"] == pytest.approx(two["tokens_per_s"] / (2 * one["tokens_per_s"]))
    assert (r.exit_code == 1) == (two["verdict"] == "layout problem")


def test_too_few_steps_give_no_verdict():
    """3 timed steps (issue 18: efficiency 3.36 'good' from warm-up noise) is inconclusive."""
    r = S.finish({"runs": [_run(1, 100.0, steps=3), _run(2, 672.0, steps=3)]})
    assert r["verdict"] == "inconclusive" and "at least 10" in r["why"]
    assert r["ok"] is True


def test_noisy_interval_spanning_verdicts_is_inconclusive():
    r = S.finish({"runs": [_run(1, 100.0, spread=0.3), _run(2, 150.0, spread=0.3)]})
    lo, hi = r["efficiency_interval"]
    assert lo < S.NEEDS_WORK < hi or lo < S.GOOD < hi
    assert r["verdict"] == "inconclusive"


def test_efficiency_above_one_says_why():
    within = S.finish({"runs": [_run(1, 100.0, spread=0.05), _run(2, 202.0, spread=0.05)]})
    assert within["efficiency"] > 1 and "within the measurement noise" in within["why"]
    beyond = S.finish({"runs": [_run(1, 100.0), _run(2, 300.0)]})
    assert beyond["efficiency"] == pytest.approx(1.5) and "beyond the noise" in beyond["why"]
    assert "note: above 1 beyond the noise" in S.render({**beyond, "plan": {"model": "m"},
                                                         "device": "cpu", "runs": [
                                                             {**x, "sharded": False} for x in beyond["runs"]]})


def test_cli_defaults_measure_enough_steps():
    cmd = main.get_command(None, "verify").get_command(None, "scaling")
    defaults = {p.name: p.default for p in cmd.params}
    assert defaults["steps"] >= S.MIN_STEPS and defaults["warmup"] >= 1
