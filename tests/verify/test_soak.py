"""verify soak: telemetry (NVML through a fixture, host), judging, and the 2-rank gloo run with a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainledger.cli import main
from trainledger.errors import VerifyError
from trainledger.load.plan import parse_inputs
from trainledger.verify import soak as S
from trainledger.verify.telemetry import (KEYS, HostSampler, NvmlSampler, ReplayNvml, decode_throttle,
                                          open_sampler)

FIXTURE = Path(__file__).parent / "fixtures" / "nvml_h100_soak.json"
TINY = {"model": "tiny-llama-debug", "precision": "fp32", "seq_len": 16, "gpus": 2}


def fixture_samples(n: int | None = None) -> list[dict]:
    s = NvmlSampler(ReplayNvml.load(FIXTURE))
    assert s.kind == "nvml" and s.device_name == "NVIDIA H100 80GB HBM3"
    k = len(json.loads(FIXTURE.read_text())["samples"])
    return [s.sample() for _ in range(n or k)]


def test_throttle_bits_follow_nvml_h():
    assert decode_throttle(0) == [] and decode_throttle(None) is None
    assert decode_throttle(0x40 | 0x4) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_nvml_path_reads_the_fixture():
    rows = fixture_samples()
    assert set(rows[0]) == set(KEYS)
    first, hot = rows[0], rows[-1]
    assert first["temperature_c"] == 41 and first["throttle"] == ["gpu_idle"] and first["power_w"] == 112.0
    assert hot["temperature_c"] == 88 and hot["clock_mhz"] == 1755 and hot["throttle"] == ["hw_thermal_slowdown"]
    assert hot["utilization_pct"] == 100 and hot["memory_used_bytes"] == 71302021120
    assert hot["pcie_tx_bytes_per_s"] == 18500 * 1024 and hot["nvlink_errors"] == 0 and hot["pcie_replays"] == 0
    assert [r["xid_events"] for r in rows] == [0] * 10 + [1, 1]  # XID 48 arrives with sample 10
    assert [r["ecc_corrected"] for r in rows][7:9] == [0, 2] and {r["ecc_uncorrected"] for r in rows} == {0}


def test_unsupported_nvml_calls_read_as_none(tmp_path):
    data = json.loads(FIXTURE.read_text())
    for s in data["samples"]:
        s["nvmlDeviceGetPowerUsage"] = {"error": "Not Supported"}
        for k in [k for k in s if k.startswith("nvmlDeviceGetNvLinkErrorCounter")]:
            del s[k]
    p = tmp_path / "f.json"
    p.write_text(json.dumps(data))
    row = NvmlSampler(ReplayNvml.load(p)).sample()
    assert row["power_w"] is None and row["nvlink_errors"] is None and row["temperature_c"] == 41


def test_host_sampler_has_every_key():
    s = open_sampler("cpu")
    assert isinstance(s, HostSampler)
    row = s.sample()
    assert set(row) == set(KEYS) and row["memory_used_bytes"] > 0 and row["power_w"] is None


def series_from(rows: list[dict], step_times: list[float] | None = None) -> dict:
    return {"0": [{"t": float(i), "step": i, "attempt": 0, "steps": 1, "loss": 5.0, "grad_norm": 1.0,
                   "step_time_s": (step_times or [0.1] * len(rows))[i], **r} for i, r in enumerate(rows)]}


def raw(series: dict, events: list[dict] | None = None, fault: str | None = None) -> dict:
    ck = {"rank": 0, "event": "checkpoint", "t": 1.0, "step": 1, "checksums": ["a"] * len(series)}
    return {"series": series, "events": [ck] + (events or []), "nproc": len(series), "fault": fault,
            "plan": TINY}


def by_name(res: dict) -> dict:
    return {c["check"]: c for c in res["checks"]}


def test_fixture_soak_crosses_the_thermal_thresholds():
    res = S.evaluate(raw(series_from(fixture_samples())), S.SoakThresholds())
    c = by_name(res)
    assert res["ok"] is False
    assert c["temperature"]["status"] == "fail" and c["temperature"]["value"] == 88
    assert c["clock"]["status"] == "fail" and c["clock"]["value"] == pytest.approx(1 - 1755 / 1980)
    assert c["throttling"]["status"] == "fail" and c["throttling"]["value"] == ["hw_thermal_slowdown"]
    assert c["XID errors"]["status"] == "fail" and c["XID errors"]["value"] == 1
    assert c["ECC uncorrected"]["status"] == "pass" and c["link errors"]["status"] == "pass"
    names = [x.split(":")[0] for x in res["crossed"]]
    assert names == ["temperature", "clock", "throttling", "XID errors"]
    # the same recording under looser thresholds passes
    loose = S.SoakThresholds(max_temperature_c=90, max_clock_drop=0.2, fail_on_slowdown=False, max_xid_events=1)
    assert S.evaluate(raw(series_from(fixture_samples())), loose)["ok"] is True
    # the first eight samples (before the GPU runs hot) pass the defaults
    assert S.evaluate(raw(series_from(fixture_samples(8))), S.SoakThresholds())["ok"] is True


def test_soak_in_the_report():
    from trainledger.report import build_report, render
    from trainledger.report.data import soak_section

    ev = [{"rank": 1, "event": "fault", "t": 3.0, "step": 4}]
    res = S.evaluate(raw(series_from(fixture_samples()), ev, "kill:1:3"), S.SoakThresholds())
    data = build_report(parse_inputs(TINY, "t"), sweeps_on=False, soak_result=json.loads(json.dumps(res)))
    html = render(data, "html")
    assert "Soak test" in html and "limit 85 °C" in html and "rank 1 killed" in html
    assert html.count("<svg") >= 5 and "crossed: temperature" in html
    with pytest.raises(Exception, match="verify soak --out"):
        soak_section({"checks": None})


def test_step_time_drift():
    times = [0.5, 0.5] + [0.10] * 8 + [0.13] * 8  # warm-up samples are dropped
    rows = [dict.fromkeys(KEYS) for _ in times]
    res = S.evaluate(raw(series_from(rows, times)), S.SoakThresholds())
    c = by_name(res)["step-time drift"]
    assert c["status"] == "fail" and c["value"] == pytest.approx(0.3)
    assert S.evaluate(raw(series_from(rows, times)), S.SoakThresholds(max_step_time_drift=0.35))["ok"]


def test_recovery_from_events():
    ev = [{"rank": 0, "event": "start", "t": 0.0, "attempt": 0}, {"rank": 1, "event": "start", "t": 0.0, "attempt": 0},
          {"rank": 1, "event": "fault", "t": 10.0, "step": 12},
          {"rank": 0, "event": "start", "t": 14.0, "attempt": 1}, {"rank": 1, "event": "start", "t": 14.5, "attempt": 1},
          {"rank": 0, "event": "restore", "t": 20.0, "step": 10, "seconds": 1.5, "match": True},
          {"rank": 1, "event": "restore", "t": 20.0, "step": 10, "seconds": 1.2, "match": True},
          {"rank": 0, "event": "first_step", "t": 21.0, "attempt": 1, "step": 11},
          {"rank": 1, "event": "first_step", "t": 21.5, "attempt": 1, "step": 11}]
    rec = S.recovery(ev)
    assert rec["recovery_s"] == 11.5 and rec["restarted_after_s"] == 4.0 and rec["steps_redone"] == 2
    assert rec["load_s"] == 1.5 and rec["restored_step"] == 10
    rows = [dict.fromkeys(KEYS)] * 3
    series = {"0": series_from(rows)["0"], "1": series_from(rows)["0"]}
    res = S.evaluate(raw(series, ev, "kill:1:8"), S.SoakThresholds(max_recovery_s=10))
    assert by_name(res)["recovery time"]["status"] == "fail"
    assert any(x.startswith("recovery time: ") and "(limit 10 s)" in x for x in res["crossed"])
    assert S.evaluate(raw(series, ev, "kill:1:8"), S.SoakThresholds())["ok"] is True
    bad = [dict(e, match=False) if e["event"] == "restore" and e["rank"] == 1 else e for e in ev]
    c = by_name(S.evaluate(raw(series, bad, "kill:1:8"), S.SoakThresholds()))["restore checksums"]
    assert c["status"] == "fail" and "rank(s) [1]" in c["detail"]
    # killed and never back: fails, naming it
    res = S.evaluate(raw(series, ev[:3], "kill:1:8"), S.SoakThresholds())
    assert by_name(res)["recovery time"]["status"] == "fail" and by_name(res)["restore checksums"]["status"] == "fail"


def test_worker_errors_and_the_launchers_summary_both_reach_the_verdict():
    rows = [dict.fromkeys(KEYS)] * 3
    series = {"0": series_from(rows)["0"], "1": series_from(rows)["0"]}
    ev = [{"rank": 0, "event": "error", "t": 9.0, "attempt": 0, "error": "RuntimeError: Connection reset by peer"}]
    r = dict(raw(series, ev), error="torchrun exited with code 1; last output: " + "x " * 50
             + "rank : 1 (local_rank: 1) exitcode : -9 (pid: 42) attempt 1")
    res = S.evaluate(r, S.SoakThresholds())
    assert res["ok"] is False
    msg = res["crossed"][0]
    assert msg.startswith("torchrun exited with code 1; rank 0 (attempt 0): RuntimeError: Connection reset")
    assert msg.endswith("launcher's last output: " + "x " * 28 + "rank : 1 (local_rank: 1) exitcode : -9 (pid: 42) attempt 1")
    # a rank that fails only in leaving the group after training ended: a note, not a failure
    down = [{"rank": 1, "event": "teardown", "t": 30.0, "attempt": 1, "error": "RuntimeError: Connection reset by peer"}]
    res = S.evaluate(raw(series, down), S.SoakThresholds())
    assert res["ok"] is True and res["notes"] == [
        "rank 1 (attempt 1) left the process group with an error after training ended: RuntimeError: "
        "Connection reset by peer"]
    assert S.render(res).endswith("  note: " + res["notes"][0])


def test_fault_spec_is_validated():
    with pytest.raises(VerifyError, match="--kill-after"):
        S._fault_spec(2, 60, 1, None, 1)
    with pytest.raises(VerifyError, match="ranks are 0..1"):
        S._fault_spec(2, 60, 2, 10, 1)
    with pytest.raises(VerifyError, match="within the --duration"):
        S._fault_spec(2, 60, 1, 60, 1)
    with pytest.raises(VerifyError, match="--max-restarts"):
        S._fault_spec(2, 60, 1, 10, 0)
    assert S._fault_spec(2, 60, 1, 12.5, 1) == "kill:1:12.5"


@pytest.mark.slow
def test_cli_soak_two_gloo_ranks_with_a_killed_rank(tmp_path):
    """About a minute: 2 gloo ranks train for 20 s, rank 1 is killed, torchrun restarts the group,
    every rank restores the checkpoint with its saved checksum and trains again. The NVML path runs
    inside the workers from the fixture's first (cool) samples."""
    pytest.importorskip("torch")
    data = json.loads(FIXTURE.read_text())
    data["samples"] = data["samples"][:8]
    fx = tmp_path / "cool.json"
    fx.write_text(json.dumps(data))
    out, led = tmp_path / "soak.json", tmp_path / "l.db"
    r = CliRunner().invoke(main, ["verify", "soak", "--model", "tiny-llama-debug", "--precision", "fp32",
                                  "--seq-len", "16", "--gpus", "2", "--nproc", "2", "--duration", "20s",
                                  "--checkpoint-interval", "2s", "--kill-rank", "1", "--kill-after", "6s",
                                  "--max-step-time-drift", "10", "--telemetry-fixture", str(fx),
                                  "--out", str(out), "--ledger", str(led), "--timeout", "240"])
    tail = json.loads(out.read_text()).get("log_tail", "") if out.exists() else ""
    assert r.exit_code == 0, r.output + "\nlauncher output:\n" + tail
    assert "verdict: PASS" in r.output
    res = json.loads(out.read_text())
    c = by_name(res)
    assert [c[n]["status"] for n in ("training ran", "checkpoint checksums", "restore checksums", "recovery time",
                                     "temperature", "clock", "throttling", "XID errors")] == ["pass"] * 8
    rec = res["recovery"]
    assert rec["killed_rank"] == 1 and rec["steps_redone"] >= 1 and 0 < rec["recovery_s"] < 240
    assert {e["rank"] for e in res["events"] if e["event"] == "restore"} == {0, 1}
    assert {e["attempt"] for e in res["events"] if e["event"] == "start"} == {0, 1}
    assert set(res["series"]) == {"0", "1"} and all(s["temperature_c"] <= 84 for s in res["series"]["0"])
    # the verdict is a function of the recording: a tighter recovery bound fails and names it
    again = S.evaluate(res, S.SoakThresholds(max_recovery_s=rec["recovery_s"] / 2))
    assert again["ok"] is False and again["crossed"][0].startswith("recovery time: ")
    r = CliRunner().invoke(main, ["ledger", "list", "--ledger", str(led)])
    assert "verify soak" in r.output and "checks pass, recovery " in r.output
