"""Time calibration from measured runs (issue 15): fit, transfer, refusal, log parsing, CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import PlanError, SpecError
from trainledger.estimate.time import calibration as cal
from trainledger.estimate.time import estimate_compute
from trainledger.load.plan import PlanInputs, build_plan


def _run(**kw):
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, seq_len=4096, framework="fsdp2")
    base.update(kw)
    p = build_plan(PlanInputs(**base))
    d = estimate_compute(p).to_dict()
    return p, d, cal.fingerprint(d, {"attention": p.recipe.attention, "runtime": p.runtime.summary()})


def test_one_run_reproduces_the_measurement_with_the_least_weighted_change():
    _, d, fp = _run()
    meas = 1.3 * d["step_time_s"]
    fit = cal.fit([(d, fp, meas)])
    f, t, sig = fit["factors"], cal.terms(d), cal.TERM_UNCERTAINTY
    assert cal.calibrated_step_s(d, f) == pytest.approx(meas, rel=1e-9)
    # optimality (Lagrange): (f_k - 1) / (σ_k² t_k) is the same multiplier for every term, so no
    # move along the constraint Σ f_k t_k = measured lowers Σ ((f_k - 1)/σ_k)²
    lam = {k: (f[k] - 1) / (sig[k] ** 2 * t[k]) for k in t if t[k] > 0}
    assert max(lam.values()) == pytest.approx(min(lam.values()), rel=1e-9)
    cost = sum(((f[k] - 1) / sig[k]) ** 2 for k in t)
    a, b = "gemm", "attention"
    for eps in (1e-3, -1e-3):  # shift time from one term to another, the total unchanged
        g = dict(f, **{a: f[a] + eps / t[a], b: f[b] - eps / t[b]})
        assert cal.calibrated_step_s(d, g) == pytest.approx(meas, rel=1e-9)
        assert sum(((g[k] - 1) / sig[k]) ** 2 for k in t) > cost
    # every factor moves the same way as the measurement, the uncertain ones the most per second
    assert all(v >= 1.0 for v in f.values()) and f["attention"] > 1.0 and f["gemm"] > 1.0


def test_two_runs_at_different_lengths_separate_attention_from_gemm():
    _, d1, fp = _run(seq_len=2048)
    _, d2, _ = _run(seq_len=32768)
    t1, t2 = cal.terms(d1), cal.terms(d2)
    truth = {"gemm": 1.1, "attention": 1.6, "memory": 1.1, "comm": 1.0, "fixed": 1.0}
    m1, m2 = (sum(t[k] * truth[k] for k in t) for t in (t1, t2))
    fit = cal.fit([(d1, fp, m1), (d2, fp, m2)])
    assert fit["factors"]["gemm"] == pytest.approx(1.1, rel=1e-6)
    assert fit["factors"]["attention"] == pytest.approx(1.6, rel=1e-6)
    # the fit predicts a third length it never saw
    _, d3, _ = _run(seq_len=8192)
    t3 = cal.terms(d3)
    assert cal.calibrated_step_s(d3, fit["factors"]) == pytest.approx(sum(t3[k] * truth[k] for k in t3))


@pytest.mark.parametrize("other", [dict(framework="megatron-core"), dict(gpu="a100-sxm-80gb"),
                                   dict(precision="fp8-mixed"), dict(power_limit_w=500)])
def test_transfer_across_stack_gpu_precision_or_power_is_refused(other):
    _, d, fp = _run()
    fit = cal.fit([(d, fp, 1.2 * d["step_time_s"])])
    _, d2, fp2 = _run(**other)
    got = cal.apply(d2, fp2, fit)
    assert not got["calibrated"] and "refused" in got["reason"]
    _, d3, fp3 = _run(gpus=16)  # same environment, other GPU count: applies
    assert cal.apply(d3, fp3, fit)["calibrated"]


def test_transfer_across_stack_releases_or_attention_kernels_is_refused_where_both_state_them():
    _, d, fp = _run(stack_version="torchtitan-2412")
    assert fp["stack_version"] == "torchtitan-2412"
    fit = cal.fit([(d, fp, 1.2 * d["step_time_s"])])
    for other in (dict(stack_version="torchtitan-2506"), dict(attention="eager")):
        _, d2, fp2 = _run(**other)
        got = cal.apply(d2, fp2, fit)
        assert not got["calibrated"] and next(iter(other)) in got["reason"]
    _, d3, fp3 = _run(gpus=16, stack_version="torchtitan-2412")  # the same release: applies
    assert cal.apply(d3, fp3, fit)["calibrated"]
    _, d4, fp4 = _run(gpus=16)  # the estimate states no release: the calibration applies
    assert fp4["stack_version"] is None and cal.apply(d4, fp4, fit)["calibrated"]


def test_cli_calibration_keyed_by_stack_version(tmp_path):
    led = str(tmp_path / "ledger.db")
    flags = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3", "--framework", "fsdp2"]
    r = CliRunner().invoke(main, ["calibrate", *flags, "--stack-version", "torchtitan-2412",
                                  "--measured-step-time", "1.0", "--ledger", led])
    assert r.exit_code == 0, r.output
    assert "fsdp2 torchtitan-2412" in r.output
    for version, applied in (("torchtitan-2412", True), ("torchtitan-2506", False)):
        r = CliRunner().invoke(main, ["estimate", *flags, "--stack-version", version, "--calibrated",
                                      "--ledger", led, "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        assert out["plan"]["runtime"]["stack_version"] == version
        tc = out["compute"]["time_calibration"]
        assert tc["calibrated"] is applied
        if not applied:
            assert "stack_version 'torchtitan-2412' vs 'torchtitan-2506'" in tc["reason"]
    r = CliRunner().invoke(main, ["estimate", *flags, "--stack-version", "bad;version", "--json"])
    assert r.exit_code != 0


def test_a_measurement_that_cannot_be_this_plan_is_an_error():
    _, d, fp = _run()
    with pytest.raises(PlanError, match="outside"):
        cal.fit([(d, fp, 50 * d["step_time_s"])])


def test_step_time_from_logs(tmp_path):
    hf = tmp_path / "trainer_state.json"
    hf.write_text(json.dumps({"global_step": 100, "log_history": [
        {"loss": 2.0, "step": 10}, {"train_runtime": 250.0, "train_steps_per_second": 0.4, "step": 100}]}))
    assert cal.step_time_from_log(hf, 1e6, 8)[0] == pytest.approx(2.5)
    titan = tmp_path / "titan.log"
    titan.write_text("\n".join(f"[rank0]: step: {i}  loss: 9.1  memory: 30GiB(31%)  tps: {v}  tflops: 300  mfu: 30%"
                               for i, v in ((1, "900"), (2, "4,000"), (3, "5,000"), (4, "5,000"), (5, "5,200"))))
    t, how = cal.step_time_from_log(titan, 8 * 16384, 8)
    assert t == pytest.approx(16384 / 5000) and "torchtitan" in how
    meg = tmp_path / "megatron.log"
    meg.write_text("\n".join(f" iteration {i:8d}/  100 | consumed samples: {i * 8} | elapsed time per "
                             f"iteration (ms): {ms} | learning rate: 1E-4 |"
                             for i, ms in ((1, 9000.0), (2, 1300.0), (3, 1200.0), (4, 1210.0), (5, 1190.0))))
    assert cal.step_time_from_log(meg, 1, 1)[0] == pytest.approx(1.2)
    bad = tmp_path / "empty.log"
    bad.write_text("nothing here")
    with pytest.raises(SpecError):
        cal.step_time_from_log(bad, 1, 1)


def test_cli_calibrate_then_estimate_calibrated(tmp_path):
    led = str(tmp_path / "ledger.db")
    flags = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3",
             "--framework", "fsdp2"]
    r = CliRunner().invoke(main, ["calibrate", *flags, "--measured-step-time", "1.0", "--ledger", led, "--json"])
    assert r.exit_code == 0, r.output
    fitted = json.loads(r.output)
    assert fitted["n_runs"] == 1 and fitted["fingerprint"]["framework"] == "fsdp2"
    r = CliRunner().invoke(main, ["estimate", *flags[:4], "--gpus", "16", "--zero", "3", "--framework",
                                  "fsdp2", "--calibrated", "--ledger", led, "--json"])
    assert r.exit_code == 0, r.output
    comp = json.loads(r.output)["compute"]
    assert comp["time_calibration"]["calibrated"] and comp["calibrated_step_time_s"] > comp["step_time_s"]
    r = CliRunner().invoke(main, ["estimate", *flags[:4], "--gpus", "16", "--zero", "3", "--framework",
                                  "megatron-core", "--calibrated", "--ledger", led, "--json"])
    comp = json.loads(r.output)["compute"]
    assert not comp["time_calibration"]["calibrated"] and "megatron-core" in comp["time_calibration"]["reason"]


@pytest.mark.parametrize("kw", [
    dict(framework="pytorch-fsdp", reduce_dtype="fp32", grad_accum=2),       # FSDP1 flat gradients
    dict(framework="hf", zero=0, model="llama-3.2-1b", grad_accum=2),        # DDP's bucket copies
    dict(framework="fsdp2", model="llama-2-13b", gpu="a100-sxm-80gb", gpus=64, micro_batch=2,
         attention="flash"),                                                  # allocator retries
    dict(framework="megatron-core", zero=1, tp=2, pp=2, grad_accum=8),        # a pipeline's bubble
])
def test_calibration_terms_hold_every_second_of_the_step(kw):
    """With every factor 1 the calibrated step is the estimate's step: each breakdown term belongs
    to one calibration term (a term left out would be dropped from every calibrated figure)."""
    _, d, _ = _run(**kw)
    assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"])
    assert cal.calibrated_step_s(d, {}) == pytest.approx(d["step_time_s"])
    if kw.get("model") == "llama-2-13b":
        assert d["breakdown"]["allocator_retries"] > 0
    if kw["framework"] == "hf":
        assert d["breakdown"]["ddp_copy"] > 0
