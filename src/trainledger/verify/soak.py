"""``verify soak``: the acceptance training loop for a duration, with telemetry, checkpoints and faults.

The duration counts training time from the first step (model loading is not part of it); one
torchrun launch of :mod:`trainledger.verify._soak_worker` with ``--max-restarts`` (torchrun's
elastic agent restarts the whole worker group when a rank dies; PyTorch docs, "torchrun (Elastic
Launch)"). The workers train the plan's model until the deadline, record per-rank time series
(step time, loss, and the device telemetry of :mod:`trainledger.verify.telemetry`: temperature,
SM clock, power, utilization, throttle reasons, ECC, XID, NVLink and PCIe counters; host sensors on
CPU), write a checkpoint every ``checkpoint_interval_s`` with every rank's parameter checksum, and
after a restart load the last checkpoint and compare the restored checksums with the saved ones.
``--kill-rank R --kill-after S`` SIGKILLs rank R after S seconds of training (first attempt, once a
checkpoint exists and a step has run since); the measured recovery time runs from the kill to the moment every rank has
finished a step again.

:func:`evaluate` turns the recorded run into checks against :class:`SoakThresholds`; it is pure
(no torch), so a stored result can be judged again under other thresholds. Threshold defaults:

* temperature 85 °C — the acceptance practice this command serves (issue 19: GPUs throttling
  above ~85 °C); NVIDIA's slowdown temperature of a given board is read by ``nvidia-smi -q``;
* SM clock drop 10% below the run's early median, step-time drift 10% (last vs first quarter) —
  assumptions: sustained losses that large change the plan's time estimate materially;
* recovery 600 s — the restart time the goodput model assumes by default
  (``catalog/prices/facility.yaml`` ``restart_s``), so a pass means the plan's goodput holds;
* ECC uncorrected errors, XID events, NVLink errors and PCIe replays: none may appear.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from trainledger.spec.base import Spec
from trainledger.errors import VerifyError
from trainledger.verify.launch import free_port, run_bounded

#: samples dropped at the start of every attempt before judging step time (warm-up, allocator).
WARMUP_SAMPLES = 2
#: most samples per rank kept in the result (a long soak is thinned evenly).
MAX_SAMPLES = 2000


class SoakThresholds(Spec):
    """Pass thresholds of a soak (see the module docstring for where each default comes from)."""

    max_temperature_c: float = Field(85.0, gt=0, le=200, description="hottest reading allowed, °C")
    max_clock_drop: float = Field(0.10, ge=0, le=1, description="SM clock below (1 - this) x early median fails")
    max_step_time_drift: float = Field(0.10, ge=0, le=100,
                                       description="median step time of the last quarter over the first, minus 1")
    max_recovery_s: float = Field(600.0, gt=0, description="seconds from a rank's death to every rank training again")
    max_ecc_uncorrected: int = Field(0, ge=0, description="new uncorrected ECC errors allowed")
    max_xid_events: int = Field(0, ge=0, description="XID critical errors allowed")
    max_link_errors: int = Field(0, ge=0, description="new NVLink error counts + PCIe replays allowed")
    fail_on_slowdown: bool = Field(True, description="a thermal/power-brake/hardware slowdown throttle reason fails")


def _read_jsonl(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in sorted(folder.glob("rank*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by SIGKILL
    return out


def collect(work: Path) -> dict[str, Any]:
    """Series and events the workers journaled in ``work`` (they survive restarts)."""
    samples = _read_jsonl(work / "series")
    events = _read_jsonl(work / "events")
    t0 = min([e["t"] for e in events if e["event"] == "start"] or [0.0])
    series: dict[str, list[dict[str, Any]]] = {}
    for s in sorted(samples, key=lambda s: s["t"]):
        s = {**s, "t": s["t"] - t0}
        series.setdefault(str(s.pop("rank")), []).append(s)
    for k, v in series.items():
        if len(v) > MAX_SAMPLES:
            stride = len(v) / MAX_SAMPLES
            series[k] = [v[int(i * stride)] for i in range(MAX_SAMPLES)]
    return {"series": series, "events": sorted(({**e, "t": e["t"] - t0} for e in events), key=lambda e: e["t"]),
            "t0": t0}


def run_soak(inputs: Any, device: str = "cpu", nproc: int = 2, duration_s: float = 600.0,
             checkpoint_interval_s: float = 60.0, sample_interval_s: float = 1.0,
             kill_rank: int | None = None, kill_after_s: float | None = None, max_restarts: int = 1,
             thresholds: SoakThresholds | None = None, timeout_s: float | None = None,
             collective_timeout_s: float = 120.0, workdir: str | None = None,
             telemetry_fixture: str | None = None) -> dict[str, Any]:
    """Run the soak of ``inputs`` (a PlanInputs) and return the judged result."""
    from trainledger.load.plan import build_plan

    plan = build_plan(inputs)
    if not plan.recipe.is_training:
        raise VerifyError("the soak trains; method inference has no training step to soak")
    fault = _fault_spec(nproc, duration_s, kill_rank, kill_after_s, max_restarts)
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="trainledger-soak-"))
    if (work / "series").exists() or (work / "checkpoint").exists():
        raise VerifyError(f"{work} holds an earlier soak; give an empty --workdir")
    work.mkdir(parents=True, exist_ok=True)
    try:
        ip = work / "plan_inputs.json"
        ip.write_text(json.dumps(inputs.model_dump(mode="json")))
        args = ["--inputs", str(ip), "--device", device, "--workdir", str(work), "--duration", str(duration_s),
                "--checkpoint-interval", str(checkpoint_interval_s),
                "--sample-interval", str(sample_interval_s), "--timeout", str(collective_timeout_s)]
        if fault:
            args += ["--fault", fault]
        if telemetry_fixture:
            args += ["--telemetry-fixture", str(Path(telemetry_fixture).resolve())]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts",
               str(max_restarts), "--monitor-interval", "0.2", "-m", "trainledger.verify._soak_worker", *args]
        import os

        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        limit = timeout_s or duration_s + 600.0 * (max_restarts + 1)
        rc, timed_out, tail, elapsed = run_bounded(cmd, limit, env=env)
        raw = collect(work)
        reap(raw["events"])
        raw.update(plan=inputs.model_dump(mode="json"), device=device, nproc=nproc, duration_s=duration_s,
                   checkpoint_interval_s=checkpoint_interval_s, sample_interval_s=sample_interval_s, fault=fault, max_restarts=max_restarts,
                   returncode=rc, timed_out=timed_out, elapsed_s=elapsed)
        if rc != 0 or timed_out:
            raw["log_tail"] = tail[-4000:]
            raw["error"] = (f"torchrun stopped at the deadline of {limit:.0f} s" if timed_out else
                            f"torchrun exited with code {rc}") + "; last output: " + " ".join(tail.split()[-60:])
        return evaluate(raw, thresholds or SoakThresholds())
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def reap(events: list[dict[str, Any]]) -> list[int]:
    """SIGKILL worker processes of this soak still alive after torchrun ended (a hung attempt's
    workers run in their own sessions and outlive the launcher's process group). Returns their pids."""
    import os
    import signal

    killed = []
    for pid in {e["pid"] for e in events if e["event"] == "start" and e.get("pid")}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"trainledger.verify._soak_worker" not in f.read():
                    continue
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (OSError, ProcessLookupError):
            continue
    return killed


def _fault_spec(nproc: int, duration_s: float, rank: int | None, after_s: float | None,
                restarts: int) -> str | None:
    """``kill:RANK:SECONDS`` for the worker; the rank dies at a step boundary once a checkpoint exists."""
    if rank is None and after_s is None:
        return None
    if rank is None or after_s is None:
        raise VerifyError("fault injection needs both --kill-rank and --kill-after")
    if not 0 <= rank < nproc:
        raise VerifyError(f"--kill-rank {rank}: ranks are 0..{nproc - 1}")
    if not 0 <= after_s < duration_s:
        raise VerifyError(f"--kill-after {after_s:g} s: must fall within the --duration of {duration_s:g} s")
    if restarts < 1:
        raise VerifyError("a killed rank needs a restart: give --max-restarts 1 or more")
    return f"kill:{rank}:{after_s:g}"


# ------------------------------------------------------------------------------- judging
def _check(name: str, ok: bool | None, value: Any, threshold: Any, detail: str) -> dict[str, Any]:
    return {"check": name, "status": "pass" if ok else ("fail" if ok is False else "not measured"),
            "value": value, "threshold": threshold, "detail": detail}


def _values(series: dict[str, list[dict]], key: str) -> dict[str, list[float]]:
    return {r: [s[key] for s in ss if s.get(key) is not None] for r, ss in series.items()}


def _increase(series: dict[str, list[dict]], key: str) -> tuple[int | None, str]:
    """Largest rise of a cumulative counter on one rank over the run (None: not read)."""
    best, who = None, ""
    for r, vals in _values(series, key).items():
        if vals:
            rise = int(max(vals) - vals[0])
            if best is None or rise > best:
                best, who = rise, r
    return best, who


def _steady(ss: list[dict]) -> list[dict]:
    """Samples past each attempt's warm-up samples."""
    seen: dict[int, int] = {}
    out = []
    for s in ss:
        a = s.get("attempt", 0)
        seen[a] = seen.get(a, 0) + 1
        if seen[a] > WARMUP_SAMPLES:
            out.append(s)
    return out


def recovery(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Kill -> restart -> restore -> every rank past a step again, in seconds (None without a fault)."""
    kill = next((e for e in events if e["event"] == "fault"), None)
    if kill is None:
        return None
    after = [e for e in events if e["t"] > kill["t"]]
    starts = [e["t"] for e in after if e["event"] == "start"]
    restores = [e for e in after if e["event"] == "restore"]
    firsts = [e["t"] for e in after if e["event"] == "first_step" and e.get("attempt", 0) > 0]
    ranks = {e["rank"] for e in events if e["event"] == "start"}
    done = len({e["rank"] for e in after if e["event"] == "first_step"}) == len(ranks) and firsts
    return {"killed_rank": kill["rank"], "killed_at_step": kill["step"],
            "restarted_after_s": min(starts) - kill["t"] if starts else None,
            "restored_step": restores[0]["step"] if restores else None,
            "load_s": max(e["seconds"] for e in restores) if restores else None,
            "recovery_s": max(firsts) - kill["t"] if done else None,
            "steps_redone": kill["step"] - restores[0]["step"] if restores else None,
            "kill_t": kill["t"], "recovered_t": max(firsts) if done else None}


def evaluate(raw: dict[str, Any], th: SoakThresholds) -> dict[str, Any]:
    """Judge a recorded soak: a list of checks, the thresholds crossed, and ``ok``."""
    series, events = raw.get("series") or {}, raw.get("events") or []
    checks = [_progress_check(raw, series), *_checkpoint_checks(raw, events)]
    rec = recovery(events)
    if raw.get("fault"):
        v = rec["recovery_s"] if rec else None
        checks.append(_check("recovery time", v is not None and v <= th.max_recovery_s, v, th.max_recovery_s,
                             "no recovery: the group did not train again after the kill" if v is None else
                             f"rank {rec['killed_rank']} killed at step {rec['killed_at_step']}; torchrun "
                             f"restarted the group after {rec['restarted_after_s']:.1f} s, restored step "
                             f"{rec['restored_step']} in {rec['load_s']:.1f} s ({rec['steps_redone']} steps redone), "
                             f"every rank training again {v:.1f} s after the kill (limit {th.max_recovery_s:g} s)"))
    checks += _telemetry_checks(series, th)
    crossed = [f"{c['check']}: {c['detail']}" for c in checks if c["status"] == "fail"]
    errors = [f"rank {e['rank']} (attempt {e.get('attempt', 0)}): {e['error']}" for e in events if e["event"] == "error"]
    if errors and raw.get("error"):
        # the workers' own errors first, then what the launcher printed last (its failure summary
        # names the rank, attempt and exit code of the failure that ended it)
        head, _, tail = raw["error"].partition("; last output: ")
        raw = {**raw, "error": head + "; " + "; ".join(errors[:4])
               + (f"; launcher's last output: {' '.join(tail.split()[-40:])}" if tail else "")}
    notes = [f"rank {e['rank']} (attempt {e.get('attempt', 0)}) left the process group with an error after "
             f"training ended: {e['error']}" for e in events if e["event"] == "teardown"]
    ok = not crossed and not raw.get("error")
    if raw.get("error"):
        crossed.insert(0, raw["error"])
    return {**raw, "thresholds": th.model_dump(), "recovery": rec, "checks": checks, "crossed": crossed,
            "summary": summarize(series), "notes": notes, "ok": ok}


def _progress_check(raw: dict[str, Any], series: dict[str, list[dict]]) -> dict[str, Any]:
    steps = {r: len(ss) for r, ss in series.items()}
    losses = [s["loss"] for ss in series.values() for s in ss]
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    ok = len(steps) == raw.get("nproc") and all(n > 0 for n in steps.values()) and finite
    return _check("training ran", ok, sum(steps.values()), None,
                  f"{len(steps)} of {raw.get('nproc')} rank(s) recorded {', '.join(f'{n}' for n in steps.values())} "
                  f"step(s); losses {'finite' if finite else 'NOT finite'}")


def _checkpoint_checks(raw: dict[str, Any], events: list[dict]) -> list[dict[str, Any]]:
    cks = {e["step"]: e for e in events if e["event"] == "checkpoint" and e["rank"] == 0}
    sharded = (raw.get("plan") or {}).get("zero") == 3 and raw.get("nproc", 1) > 1
    if not cks:
        out = [_check("checkpoint checksums", False, 0, None, "no checkpoint was written: run longer or lower "
                      "--checkpoint-every")]
    elif sharded:
        out = [_check("checkpoint checksums", True, len(cks), None, f"{len(cks)} checkpoint(s); FSDP shards "
                      "differ by design, each is checked against its restore")]
    else:
        bad = [s for s, e in cks.items() if len(set(e["checksums"])) != 1]
        out = [_check("checkpoint checksums", not bad, len(cks), None,
                      f"{len(cks)} checkpoint(s), every replica's parameter checksum identical" if not bad else
                      f"replicas differ at step(s) {bad}")]
    restores = [e for e in events if e["event"] == "restore"]
    if restores:
        bad = [e["rank"] for e in restores if not e["match"]]
        out.append(_check("restore checksums", not bad, len(restores), None,
                          f"{len(restores)} rank(s) restored step {restores[0]['step']}: checksums equal the saved "
                          "ones" if not bad else f"rank(s) {bad} restored parameters that differ from the saved ones"))
    elif raw.get("fault"):
        out.append(_check("restore checksums", False, 0, None, "no restore happened after the injected fault"))
    return out


def _telemetry_checks(series: dict[str, list[dict]], th: SoakThresholds) -> list[dict[str, Any]]:
    out = []
    temps = {r: max(v) for r, v in _values(series, "temperature_c").items() if v}
    if temps:
        r, t = max(temps.items(), key=lambda kv: kv[1])
        out.append(_check("temperature", t <= th.max_temperature_c, t, th.max_temperature_c,
                          f"hottest {t:.0f} °C on rank {r} (limit {th.max_temperature_c:g} °C)"))
    else:
        out.append(_check("temperature", None, None, th.max_temperature_c, "no temperature sensor"))
    out.append(_clock_check(series, th))
    out.append(_drift_check(series, th))
    slow = sorted({x for ss in series.values() for s in ss for x in (s.get("throttle") or [])
                   if x in _slowdown()})
    seen = any(s.get("throttle") is not None for ss in series.values() for s in ss)
    out.append(_check("throttling", (not slow or not th.fail_on_slowdown) if seen else None, slow, None,
                      ("slowdown reasons seen: " + ", ".join(slow)) if slow else
                      ("no thermal or power slowdown" if seen else "throttle reasons not readable (host)")))
    for key, name, limit in (("ecc_uncorrected", "ECC uncorrected", th.max_ecc_uncorrected),
                             ("xid_events", "XID errors", th.max_xid_events)):
        v, r = _increase(series, key)
        out.append(_check(name, None if v is None else v <= limit, v, limit,
                          "not readable" if v is None else f"{v} new on rank {r} (limit {limit})"))
    nv, _ = _increase(series, "nvlink_errors")
    pr, _ = _increase(series, "pcie_replays")
    links = None if nv is None and pr is None else (nv or 0) + (pr or 0)
    out.append(_check("link errors", None if links is None else links <= th.max_link_errors, links,
                      th.max_link_errors, "not readable" if links is None else
                      f"NVLink errors +{nv if nv is not None else 'n/a'}, PCIe replays +{pr if pr is not None else 'n/a'}"))
    return out


def _slowdown() -> tuple[str, ...]:
    from trainledger.verify.telemetry import SLOWDOWN_REASONS

    return SLOWDOWN_REASONS


def _clock_check(series: dict[str, list[dict]], th: SoakThresholds) -> dict[str, Any]:
    worst, who = None, ""
    for r, vals in _values(series, "clock_mhz").items():
        if len(vals) < 4:
            continue
        base = statistics.median(vals[: max(1, len(vals) // 4)])
        drop = 1 - min(vals) / base
        if worst is None or drop > worst[0]:
            worst, who = (drop, min(vals), base), r
    if worst is None:
        return _check("clock", None, None, th.max_clock_drop, "no clock reading")
    drop, low, base = worst
    return _check("clock", drop <= th.max_clock_drop, drop, th.max_clock_drop,
                  f"lowest {low:,.0f} MHz on rank {who} = {drop:.1%} below its early median {base:,.0f} MHz "
                  f"(limit {th.max_clock_drop:.0%})")


def _drift_check(series: dict[str, list[dict]], th: SoakThresholds) -> dict[str, Any]:
    worst, who = None, ""
    for r, ss in series.items():
        vals = [s["step_time_s"] for s in _steady(ss)]
        if len(vals) < 8:
            continue
        q = len(vals) // 4
        first, last = statistics.median(vals[:q]), statistics.median(vals[-q:])
        drift = last / first - 1
        if worst is None or drift > worst[0]:
            worst, who = (drift, first, last), r
    if worst is None:
        return _check("step-time drift", None, None, th.max_step_time_drift, "fewer than 8 steady samples per rank")
    d, a, b = worst
    return _check("step-time drift", d <= th.max_step_time_drift, d, th.max_step_time_drift,
                  f"median step {a:.3f} s in the first quarter, {b:.3f} s in the last on rank {who}: {d:+.1%} "
                  f"(limit {th.max_step_time_drift:+.0%})")


def summarize(series: dict[str, list[dict]]) -> dict[str, Any]:
    """Per rank: steps, median step time, last loss, and min/max of each telemetry reading."""
    out: dict[str, Any] = {}
    for r, ss in series.items():
        d: dict[str, Any] = {"samples": len(ss)}
        steady = [s["step_time_s"] for s in _steady(ss)]
        d["median_step_time_s"] = statistics.median(steady) if steady else None
        d["last_loss"] = ss[-1]["loss"] if ss else None
        for key in ("temperature_c", "clock_mhz", "power_w", "utilization_pct", "memory_used_bytes"):
            vals = [s[key] for s in ss if s.get(key) is not None]
            d[key] = {"min": min(vals), "max": max(vals)} if vals else None
        out[r] = d
    return out


def render(result: dict[str, Any]) -> str:
    p = result.get("plan") or {}
    lines = [f"soak: {p.get('model')}, {result.get('nproc')} {result.get('device')} rank(s), "
             f"{result.get('duration_s', 0):g} s, a checkpoint every {result.get('checkpoint_interval_s', 0):g} s"
             + (f", fault {result['fault']}" if result.get("fault") else "")]
    for c in result["checks"]:
        lines.append(f"  {c['status'].upper():<12} {c['check']:<21} {c['detail']}")
    lines.append("verdict: " + ("PASS" if result["ok"] else "FAIL"))
    for x in result["crossed"]:
        lines.append(f"  crossed: {x}")
    for x in result.get("notes") or []:
        lines.append(f"  note: {x}")
    return "\n".join(lines)


__all__ = ["SoakThresholds", "collect", "evaluate", "recovery", "render", "run_soak", "summarize"]
