"""The README's stack/calibration section: every command shown runs and prints what is shown."""

from __future__ import annotations

from click.testing import CliRunner

from trainledger.cli import main


def _run(args: list[str]) -> str:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    return r.output


def test_readme_estimate_with_power_limit_and_interval():
    out = _run(["estimate", "-m", "llama-3.1-8b", "--gpu", "h100-sxm-96gb", "--power-limit-w", "500",
                "--gpus", "8", "--zero", "3", "--framework", "fsdp2", "--seq-len", "8192",
                "--micro-batch", "2", "--recompute", "selective", "--tokens", "1B", "--no-ledger"])
    assert "step 2.80 s: 46,733 tokens/s, 5,842 per GPU, 338 TFLOP/s per GPU, MFU 34.2%, HFU 35.1%" in out
    assert "step time p10-p90: 2.71 s - 3.26 s, MFU 29.4-35.3% (accuracy suite residuals, fsdp2/hopper (n=31))" in out
    assert "note: power limit 500 W of 700 W TDP: tensor clock x0.863 (DVFS cube law, estimate/time/stack.py)" in out


def test_readme_plan_any_gpu_count():
    out = _run(["plan", "-m", "llama-2-70b", "--method", "pretrain", "--tokens", "2T", "--global-batch", "1024", "--deadline-days",
                "30", "--gpu", "h100-sxm", "--max-gpus", "800", "--rank-by", "gpus", "--framework",
                "megatron-core", "--top", "2"])
    assert ('1*  h100-sxm   656  megatron-core dp41·tp4·pp4·v5 z1 mb1×24  '
            ' 54.5/79            5.07      1,211  54%  29.1 days (27.4 days-32.6 days)  458,763  $1,371,701') in out


def test_readme_calibrate_then_estimate(tmp_path):
    led = str(tmp_path / "l.db")
    flags = ["-m", "llama-3.1-8b", "--gpu", "h100-sxm", "--zero", "3", "--framework", "fsdp2",
             "--seq-len", "8192", "--micro-batch", "2", "--ledger", led]
    _run(["calibrate", *flags, "--gpus", "8", "--measured-step-time", "2.2"])
    out = _run(["estimate", *flags, "--gpus", "64", "--calibrated"])
    assert "calibrated step 2.20 s (x1.086, calibration 1; p10-p90 1.99 s - 2.57 s)" in out


def test_readme_moe_dispatcher_deepep():
    flags = ["estimate", "-m", "deepseek-v3", "--gpu", "h800", "--gpus", "2048", "--pp", "16", "--vp", "3",
             "--ep", "64", "--zero", "1", "--framework", "megatron-core", "--precision", "fp8-mixed",
             "--seq-len", "4096", "--global-batch", "15360", "--recompute", "full", "--no-ledger"]
    out = _run([*flags, "--moe-dispatcher", "deepep"])
    assert ("  step 34.57 s: 1,820,169 tokens/s, 889 per GPU, 250 TFLOP/s per GPU, MFU 12.6%, HFU 15.1% "
            "(matmuls in fp8, efficiency family hopper)") in out
    assert "  comm_ep              11.78 s  34.1%" in out
    base = _run([*flags, "--moe-dispatcher", "alltoall"])
    assert "  step 50.81 s:" in base and "  comm_ep              27.06 s  53.3%" in base
