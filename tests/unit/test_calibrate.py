"""Calibration: fitted corrections from synthetic ledger records, applied to estimates."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trainledger.ledger import calibrate
from trainledger.cli import main
from trainledger.errors import LedgerError
from trainledger.ledger import Ledger, Record, fingerprint

GIB = 2**30


def rec(i, measured, predicted, time=None, command="verify memory", kind="measurement"):
    return Record(id=i, kind=kind, command=command, created_at="t", env_id="e", env={}, plan_key=None,
                  plan=None, ok=True, result={"measured": measured, "predicted": predicted, "time": time})


def test_fit_medians_by_hand():
    recs = [
        # CPU: only the overhead (measured/predicted - 1 = 0.10)
        rec(1, {"device": "cpu", "peak_allocated_bytes": 11 * GIB}, {"peak_allocated_bytes": 10 * GIB}),
        # CUDA: overhead 0.20, reserve (13.2-12)/12 = 0.10, time scale 0.5 / 0.4 = 1.25, MFU 0.5/1.25 = 0.4
        rec(2, {"device": "cuda", "peak_allocated_bytes": 12 * GIB, "peak_reserved_bytes": int(13.2 * GIB)},
            {"peak_allocated_bytes": 10 * GIB, "mfu": 0.5}, {"measured": 0.5, "predicted": 0.4}),
        # CUDA: overhead -0.10, reserve (10.8-9)/9 = 0.20, time scale 0.3/0.4 = 0.75, MFU 0.5/0.75
        rec(3, {"device": "cuda", "peak_allocated_bytes": 9 * GIB, "peak_reserved_bytes": int(10.8 * GIB)},
            {"peak_allocated_bytes": 10 * GIB, "mfu": 0.5}, {"measured": 0.3, "predicted": 0.4}),
        # ignored: an OOM, another command, an estimate
        rec(4, {"device": "cuda", "oom": True, "peak_allocated_bytes": 80 * GIB}, {"peak_allocated_bytes": GIB}),
        rec(5, {"device": "cpu", "peak_allocated_bytes": GIB}, {"peak_allocated_bytes": GIB}, command="verify comm"),
        rec(6, {"device": "cpu", "peak_allocated_bytes": GIB}, {"peak_allocated_bytes": GIB}, kind="estimate"),
    ]
    f = calibrate.fit(recs)
    t = f["terms"]
    assert f["n_measurements"] == 3 and f["record_ids"] == [1, 2, 3]
    assert t["runtime_overhead_fraction"]["value"] == pytest.approx(0.10) and t["runtime_overhead_fraction"]["n"] == 3
    assert t["allocator_reserve_fraction"]["value"] == pytest.approx(0.15, rel=1e-6)
    assert t["allocator_reserve_fraction"]["n"] == 2
    assert t["step_time_scale"]["value"] == pytest.approx(1.0)
    assert t["achievable_mfu"]["value"] == pytest.approx((0.4 + 0.5 / 0.75) / 2)


def test_apply_terms():
    est = {"memory": {"peak_allocated_bytes": 1000, "peak_reserved_bytes": 1080},
           "compute": {"step_time_s": 2.0}}
    cal = {"n_measurements": 4, "id": 7, "terms": {
        "runtime_overhead_fraction": {"value": 0.1, "n": 4}, "allocator_reserve_fraction": {"value": 0.2, "n": 2},
        "step_time_scale": {"value": 1.5, "n": 2}, "achievable_mfu": {"value": None, "n": 0}}}
    out = calibrate.apply_terms(est, cal, "e")
    assert out["memory"]["calibrated_peak_allocated_bytes"] == 1100
    assert out["memory"]["calibrated_peak_reserved_bytes"] == 1320
    assert out["memory"]["peak_allocated_bytes"] == 1000  # the analytical value stays
    assert out["compute"]["calibrated_step_time_s"] == pytest.approx(3.0)
    assert out["calibration"] == {"calibrated": True, "env_id": "e", "n_measurements": 4, "calibration_id": 7,
                                  "terms": {"runtime_overhead_fraction": 0.1, "allocator_reserve_fraction": 0.2,
                                            "step_time_scale": 1.5}}
    assert "calibration" not in est and "calibrated_peak_allocated_bytes" not in est["memory"]
    raw = calibrate.apply_terms(est, None, "e")
    assert raw["calibration"]["calibrated"] is False and raw["calibration"]["n_measurements"] == 0


def test_calibrate_stores_and_applies(tmp_path):
    env = fingerprint()
    with Ledger(tmp_path / "l.db") as led:
        with pytest.raises(LedgerError, match="no usable"):
            calibrate.calibrate(led, env)
        for m, p in ((105, 100), (130, 100), (120, 100)):
            led.add("measurement", "verify memory", {"measured": {"device": "cpu", "peak_allocated_bytes": m},
                                                     "predicted": {"peak_allocated_bytes": p}}, env=env)
        fitted = calibrate.calibrate(led, env)
        assert fitted["n_measurements"] == 3
        assert fitted["terms"]["runtime_overhead_fraction"]["value"] == pytest.approx(0.20)
        assert led.list(kind="calibration")[0].id == fitted["id"]
        out = calibrate.apply({"memory": {"peak_allocated_bytes": 1000}}, env, led)
    assert out["calibration"]["calibrated"] is True and out["calibration"]["n_measurements"] == 3
    assert out["memory"]["calibrated_peak_allocated_bytes"] == 1200
    with Ledger(tmp_path / "other.db") as empty:
        assert calibrate.apply({"memory": {"peak_allocated_bytes": 1}}, env, empty)["calibration"]["calibrated"] is False


def test_cli_calibrate(tmp_path):
    db = tmp_path / "l.db"
    env = fingerprint()
    r = CliRunner().invoke(main, ["calibrate", "--ledger", str(db)])
    assert r.exit_code != 0 and "no usable" in r.output
    with Ledger(db) as led:
        led.add("measurement", "verify memory", {"measured": {"device": "cpu", "peak_allocated_bytes": 110},
                                                 "predicted": {"peak_allocated_bytes": 100}}, env=env)
    r = CliRunner().invoke(main, ["calibrate", "--ledger", str(db), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["n_measurements"] == 1 and d["terms"]["runtime_overhead_fraction"]["value"] == pytest.approx(0.1)
    r = CliRunner().invoke(main, ["calibrate", "--ledger", str(db), "--env", env["env_id"]])
    assert r.exit_code == 0 and "from 1 measurement(s)" in r.output and "runtime_overhead_fraction" in r.output


def test_finish_estimate_hook(tmp_path):
    db = str(tmp_path / "l.db")
    est = {"plan": {"model": "m"}, "memory": {"peak_allocated_bytes": 1000}}
    raw = calibrate.finish_estimate(est, ledger_path=db)
    assert raw["calibration"]["calibrated"] is False and raw["calibration"]["reason"].startswith("not asked")
    env = fingerprint()
    with Ledger(db) as led:
        assert led.get(raw["ledger_id"]).kind == "estimate" and led.get(raw["ledger_id"]).plan == {"model": "m"}
        led.add("measurement", "verify memory", {"measured": {"device": "cpu", "peak_allocated_bytes": 150},
                                                 "predicted": {"peak_allocated_bytes": 100}}, env=env)
        calibrate.calibrate(led, env)
    cal = calibrate.finish_estimate(est, calibrated=True, store=False, ledger_path=db)
    assert cal["calibration"]["calibrated"] is True and cal["calibration"]["n_measurements"] == 1
    assert cal["memory"]["calibrated_peak_allocated_bytes"] == 1500 and "ledger_id" not in cal


def test_estimate_command_is_stored_and_says_whether_calibrated(tmp_path):
    db = str(tmp_path / "l.db")
    base = ["estimate", "--model", "tiny-llama-debug", "--seq-len", "64", "--ledger", db]
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 0, r.output
    assert "calibration: not calibrated" in r.output
    r = CliRunner().invoke(main, base + ["--no-ledger", "--json"])
    assert json.loads(r.output)["calibration"]["calibrated"] is False
    env = fingerprint()
    with Ledger(db) as led:
        assert [x.kind for x in led.list()] == ["estimate"]  # --no-ledger stored nothing
        peak = led.list()[0].result["memory"]["peak_allocated_bytes"]
        led.add("measurement", "verify memory", {"measured": {"device": "cpu", "peak_allocated_bytes": 2 * peak},
                                                 "predicted": {"peak_allocated_bytes": peak}}, env=env)
        calibrate.calibrate(led, env)
    d = json.loads(CliRunner().invoke(main, base + ["--calibrated", "--json"]).output)
    assert d["calibration"]["calibrated"] is True and d["calibration"]["n_measurements"] == 1
    assert d["memory"]["calibrated_peak_allocated_bytes"] == 2 * d["memory"]["peak_allocated_bytes"]
    r = CliRunner().invoke(main, base + ["--calibrated"])
    assert "calibrated for environment" in r.output and "from 1 measurement(s)" in r.output
