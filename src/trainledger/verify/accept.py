"""``verify accept``: the delivery acceptance run of a plan, one pass/fail line per item.

Two torchrun launches (NCCL on GPUs, gloo on CPU) of :mod:`trainledger.verify._accept_worker`:

1. *run*: load the plan's model (random weights from its config) in the planned precision, check
   gradient accumulation against one joint batch, train ``steps_before`` steps at the longest
   sequence and the planned micro-batch, save a checkpoint atomically (temporary folder, sha256
   manifest, one rename), then train ``steps_after`` more steps — the uninterrupted reference;
2. *restore*: a fresh set of processes verifies the manifest, loads the checkpoint and trains the
   same ``steps_after`` steps on the same batches.

The continued losses must match the uninterrupted ones: the report says "bitwise" when every
loss and the final parameters are bit-identical (what a deterministic CPU run gives), otherwise
the largest relative loss difference, which must stay within ``LOSS_RTOL`` of the precision
(GPU kernels may reorder floating-point sums between runs). Every rank must have trained on its
own tokens with non-zero gradients; under DDP every replica's parameter checksum must agree;
under FSDP (ZeRO-3) every rank's shard must equal its shard in the uninterrupted run.

A rank that dies, hangs (collective timeout) or runs out of memory ends the run with a clear
failure naming the rank and the phase, never a hang: every collective and launch has a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError
from trainledger.verify.launch import FAULT_ENV, LaunchResult, torchrun

#: relative tolerance of continued vs uninterrupted losses, by precision policy.
LOSS_RTOL = {"fp32": 1e-5, "bf16-mixed": 1e-3, "fp16-mixed": 1e-3, "bf16": 1e-2, "fp16": 1e-2}
#: relative tolerance of accumulated vs joint-batch gradients (fp32 rounding / autocast rounding).
ACCUM_RTOL = {"fp32": 1e-4, "bf16-mixed": 2e-2, "fp16-mixed": 2e-2, "bf16": 5e-2, "fp16": 5e-2}
_TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ITEMS = ("load", "precision", "gradient accumulation", "forward/backward", "optimizer step",
         "checkpoint save", "restore in a fresh process", "continued loss", "every rank did work",
         "checksums agree")


def _item(name: str, ok: bool | None, detail: str) -> dict[str, Any]:
    return {"item": name, "status": "pass" if ok else ("fail" if ok is False else "not run"), "detail": detail}


def _launch(mode: str, inputs_path: Path, ckpt: Path, out: Path, o: dict[str, Any]) -> tuple[dict | None, LaunchResult]:
    args = ["--mode", mode, "--inputs", str(inputs_path), "--device", o["device"], "--ckpt", str(ckpt),
            "--steps-before", str(o["steps_before"]), "--steps-after", str(o["steps_after"]),
            "--accum-rtol", str(o["accum_rtol"]), "--timeout", str(o["collective_timeout_s"]),
            "--out", str(out)]
    launch = o.get("launcher") or torchrun  # a multi-node launcher: verify/multinode.py
    res = launch("trainledger.verify._accept_worker", args, o["nproc"], o["timeout_s"], env=o.get("env"))
    data = json.loads(out.read_text()) if res.ok and out.exists() else None
    return data, res


def corrupt(folder: Path) -> str:
    """Flip bytes in the middle of the largest data file of a checkpoint (fault injection)."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json"]
    victim = max(files, key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        chunk = f.read(16)
        f.seek(victim.stat().st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    return str(victim.relative_to(folder))


def _failure_text(res: LaunchResult, what: str) -> str:
    text = res.failure(what)
    if "OutOfMemoryError" in text:
        phase = next((st.get("phase") for st in res.rank_status.values() if st.get("state") == "error"), "?")
        text = f"does not fit: out of memory during '{phase}'; " + text
    return text


def run_accept(inputs: Any, device: str = "cpu", nproc: int = 2, steps_before: int = 2, steps_after: int = 2,
               timeout_s: float = 1800.0, collective_timeout_s: float = 120.0, workdir: str | None = None,
               env: dict[str, str] | None = None, launcher: Any = None) -> dict[str, Any]:
    """Run the acceptance test of ``inputs`` (a PlanInputs) and return the report."""
    from trainledger.load.plan import build_plan

    plan = build_plan(inputs)
    if not plan.recipe.is_training:
        raise VerifyError("the acceptance run trains; method inference has no training step to accept")
    prec = plan.recipe.precision
    o = {"device": device, "nproc": nproc, "steps_before": steps_before, "steps_after": steps_after,
         "accum_rtol": ACCUM_RTOL.get(prec, 5e-2), "collective_timeout_s": collective_timeout_s,
         "timeout_s": timeout_s, "env": env, "launcher": launcher}
    if steps_before < 1 or steps_after < 1:
        raise VerifyError("--steps-before and --steps-after must be at least 1")
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="trainledger-accept-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        ip = work / "plan_inputs.json"
        ip.write_text(json.dumps(inputs.model_dump(mode="json")))
        ckpt = work / "checkpoint"
        first, res1 = _launch("run", ip, ckpt, work / "run.json", o)
        report: dict[str, Any] = {"plan": inputs.model_dump(mode="json"), "device": device, "nproc": nproc,
                                  "steps_before": steps_before, "steps_after": steps_after, "run": first}
        if first is None:
            report["error"] = _failure_text(res1, "the acceptance run")
            report["failed_phase"] = res1.failed_phase()
            return _finish(report, plan, None, None)
        fault = os.environ.get(FAULT_ENV, "") if env is None else env.get(FAULT_ENV, "")
        if fault.startswith("corrupt-checkpoint"):
            report["fault"] = f"corrupted {corrupt(ckpt)}"
        second, res2 = _launch("restore", ip, ckpt, work / "restore.json", o)
        report["restore"] = second
        if second is None:
            report["error"] = _failure_text(res2, "the restore run")
        return _finish(report, plan, first, second)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def measured_memory(first: dict | None) -> dict[str, Any] | None:
    """The rank with the highest peak of the uninterrupted run (CUDA allocator numbers)."""
    if not first or not first.get("memory_per_rank"):
        return None
    ranks = first["memory_per_rank"]
    best = max(range(len(ranks)), key=lambda i: ranks[i].get("peak_allocated_bytes") or 0)
    return {**ranks[best], "rank": best}


def predicted_memory(plan: Any, device: str = "cuda") -> dict[str, Any] | None:
    """The estimate's memory section for the plan run on ``device`` (cpu runs dispatch torch's CPU
    attention kernels: ``MemoryOptions.device``); an error entry when the estimator cannot run it."""
    from trainledger.errors import TrainledgerError
    from trainledger.estimate import estimate
    from trainledger.estimate.options import EstimateOptions, MemoryOptions

    try:
        return estimate(plan, EstimateOptions(memory=MemoryOptions.for_run(device))).memory.to_dict()
    except TrainledgerError as exc:
        return {"error": str(exc)}


def _finish(report: dict[str, Any], plan: Any, first: dict | None, second: dict | None) -> dict[str, Any]:
    report["measured"] = measured_memory(first)
    report["predicted"] = predicted_memory(plan, report.get("device", "cuda"))
    items = build_items(plan, first, second, report.get("error"), report.get("failed_phase"))
    report["items"] = items
    report["ok"] = all(i["status"] in ("pass", "skip") for i in items)
    return report


def compare_losses(a: list[float], b: list[float], rtol: float) -> tuple[bool, str]:
    """Continued (b) vs uninterrupted (a) losses: bitwise, within rtol, or not."""
    if len(a) != len(b) or not a:
        return False, f"{len(b)} continued losses for {len(a)} uninterrupted ones"
    if all(x == y for x, y in zip(a, b)):
        return True, "bitwise identical"
    rel = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))
    return rel <= rtol, f"max relative difference {rel:.2e} ({'<=' if rel <= rtol else '>'} tolerance {rtol:g})"


_PHASE_ITEMS = (("grad-accum", "gradient accumulation"), ("forward", "forward/backward"),
                ("backward", "forward/backward"), ("optimizer", "optimizer step"),
                ("save", "checkpoint save"), ("gather", "every rank did work"))


def _item_of_phase(phase: str | None) -> str:
    """The acceptance item a failing worker phase belongs to ('load' when unknown)."""
    for prefix, item in _PHASE_ITEMS:
        if phase and phase.startswith(prefix):
            return item
    return "load"


def build_items(plan: Any, first: dict | None, second: dict | None, error: str | None,
                phase: str | None = None) -> list[dict[str, Any]]:
    """The pass/fail items of an acceptance report from the two runs' results."""
    if first is None:
        k = ITEMS.index(_item_of_phase(phase))
        items = [_item(n, None, "no result: the run failed in a later phase") for n in ITEMS[:k]]
        items.append(_item(ITEMS[k], False, error or "the run did not finish"))
        return items + [_item(n, None, "not reached") for n in ITEMS[k + 1:]]
    items = _run_items(plan, first)
    if second is None:
        items.append(_item("restore in a fresh process", False, error or "the restore run did not finish"))
        return items + [_item(n, None, "not reached") for n in ITEMS[7:]]
    return items + _restore_items(plan, first, second)


def _run_items(plan: Any, first: dict[str, Any]) -> list[dict[str, Any]]:
    """load, precision, gradient accumulation, forward/backward, optimizer step, checkpoint save."""
    r = plan.recipe
    items = [_item("load", True, f"{plan.model.name}: {first['params']:,} parameters on "
                   f"{first['world_size']} {first['device']} rank(s), {first['backend']}, "
                   f"{'FSDP shards' if first['sharded'] else 'replicas'}, {first['load_seconds']:.1f} s")]
    want = _TORCH_DTYPE.get(r.policy["weights"], r.policy["weights"])
    items.append(_item("precision", first["param_dtype"] == want,
                       f"{r.precision}: weights {first['param_dtype']} (planned {want}), compute {r.policy['compute']}"))
    ga = first["grad_accum_check"]
    if ga.get("ok") is None:
        items.append({"item": "gradient accumulation", "status": "skip", "detail": ga["skipped"]})
    else:
        items.append(_item("gradient accumulation", ga["ok"],
                           f"{ga.get('how', '2 micro-batches')} accumulated vs one backward over all of them: "
                           f"relative error {ga['relative_error']:.2e} (tolerance {ga['rtol']:g}); "
                           f"plan accumulates {first['grad_accum']}"))
    losses = first["losses_before"] + first["losses_after"]
    finite = all(isinstance(x, float) and abs(x) < float("inf") and x == x for x in losses)
    grads = all(0 < g < float("inf") for g in first["grad_norms"])
    items.append(_item("forward/backward", finite and grads,
                       f"seq {first['seq_len']} x micro-batch {first['micro_batch']}: losses "
                       f"{', '.join(f'{x:.4f}' for x in losses)}; grad norms finite and > 0: {grads}"))
    changed = bool(first.get("params_changed_by_step"))
    items.append(_item("optimizer step", changed, "parameters changed by the first optimizer step" if changed
                       else "parameters did not change after an optimizer step"))
    ck = first.get("checkpoint", {})
    items.append(_item("checkpoint save", bool(ck.get("files")),
                       f"{ck.get('files')} file(s), {ck.get('bytes', 0) / 2**20:.1f} MiB in {ck.get('seconds', 0):.2f} s, "
                       "written to a temporary folder with a sha256 manifest, then renamed"))
    return items


def _restore_items(plan: Any, first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """restore, continued loss, every rank did work, checksums agree."""
    items = [_item("restore in a fresh process", True,
                   f"manifest verified, checkpoint loaded by {second['world_size']} new process(es)")]
    ok, how = compare_losses(first["losses_after"], second["losses_after"], LOSS_RTOL.get(plan.recipe.precision, 1e-2))
    same = [a["checksum"] for a in first["ranks"]] == [b["checksum"] for b in second["ranks"]]
    items.append(_item("continued loss", ok, f"{how}; final parameters {'bit-identical' if same else 'differ'} "
                       f"to the uninterrupted run"))
    expect = len(first["losses_before"]) + len(first["losses_after"])
    lazy = [x["rank"] for x in first["ranks"] if x["steps"] != expect or x["tokens"] <= 0
            or x["nonzero_grad_steps"] != x["steps"] or not x["finite"]]
    items.append(_item("every rank did work", not lazy,
                       f"{len(first['ranks'])} rank(s) x {expect} steps x {first['ranks'][0]['tokens'] // max(1, expect):,} "
                       f"tokens" + (f"; ranks without work: {lazy}" if lazy else "")))
    sums = [x["checksum"] for x in first["ranks"]]
    if first["sharded"]:
        items.append(_item("checksums agree", same, "each rank's FSDP shard equals its shard in the restored run"
                           if same else "a shard differs between the uninterrupted and the restored run"))
    else:
        agree = len(set(sums)) == 1
        items.append(_item("checksums agree", agree, f"{len(sums)} replica checksum(s) "
                           f"{'identical' if agree else 'differ'}: {', '.join(s[:12] for s in sums)}"))
    return items


def render(report: dict[str, Any]) -> str:
    lines = [f"acceptance run: {report['plan']['model']}, {report['nproc']} {report['device']} rank(s)"
             + (f" (the plan has {report['plan']['gpus']} GPUs)" if report["plan"].get("gpus") != report["nproc"] else "")]
    for i in report["items"]:
        lines.append(f"  {i['status'].upper():<7} {i['item']:<27} {i['detail']}")
    m, p = report.get("measured"), report.get("predicted") or {}
    if m and m.get("peak_allocated_bytes") is not None:
        from trainledger.units import fmt_bytes

        lines.append(f"  memory: peak {fmt_bytes(m['peak_allocated_bytes'])} allocated in {m.get('peak_phase')} "
                     f"(rank {m['rank']}); predicted {fmt_bytes(p.get('peak_allocated_bytes') or 0)}")
    if report.get("fault"):
        lines.append(f"  fault injected: {report['fault']}")
    lines.append("verdict: " + ("PASS" if report["ok"] else "FAIL"))
    return "\n".join(lines)
