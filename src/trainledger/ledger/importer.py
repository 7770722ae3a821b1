"""Import a training log into the ledger: measured memory and step time next to the plan's estimate.

Formats (``detect_log`` picks one from the content):

* ``hf-trainer-state`` — transformers' ``trainer_state.json``: ``log_history``'s final entry holds
  ``train_runtime``, ``train_steps_per_second``; with ``skip_memory_metrics=False`` the
  ``TrainerMemoryTracker`` deltas (transformers/trainer_utils.py): peak allocated during training =
  ``init_mem_gpu_alloc_delta`` (the model) + ``train_mem_gpu_alloc_delta`` + ``train_mem_gpu_peaked_delta``.
* ``wandb`` — a W&B run export: ``wandb-summary.json`` or a history JSON-lines/CSV export. Step time
  from ``train/train_steps_per_second`` or ``_runtime``/``_step``; ``system.gpu.N.memoryAllocatedBytes``
  is NVML's used device memory (kept as ``device_used_bytes``, not torch's allocated).
* ``torchtitan`` — its metric lines ``step: N  loss: …  memory: X GiB(P%)  tps: T  tflops: …  mfu: M%``
  (torchtitan/components/metrics.py: memory is ``max_reserved``, tps is tokens/s per device).
* ``megatron`` — Megatron-LM's ``iteration N/M | … | elapsed time per iteration (ms): T`` lines and
  ``memory (MB) | allocated: … | max allocated: … | reserved: … | max reserved: …``
  (megatron/training/training.py ``training_log``, megatron/training/utils.py ``report_memory``).

The first ``warmup`` reported steps are left out of step-time averages (compilation, allocator
warm-up). Records are ``measurement``s of command ``ledger import`` in the environment of the GPU the
plan names, which ``trainledger calibrate --env ID`` fits.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from pathlib import Path
from typing import Any

from trainledger.errors import SpecError

LOG_FORMATS = ("hf-trainer-state", "wandb", "torchtitan", "megatron")
IMPORT_COMMAND = "ledger import"
MIB, GIB = 2**20, 2**30
#: largest log read (a long Megatron run logs ~1 KB per iteration)
LOG_LIMIT_BYTES = 512 * MIB

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TT = re.compile(r"step:\s*(\d+).*?memory:\s*([\d.]+)\s*GiB.*?tps:\s*([\d,]+)(?:.*?mfu:\s*([\d.]+)%)?")
_MEG_IT = re.compile(r"iteration\s+(\d+)\s*/\s*\d+.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEG_MEM = re.compile(r"memory \(MB\)\s*\|\s*allocated:\s*([\d.]+)\s*\|\s*max allocated:\s*([\d.]+)\s*\|"
                      r"\s*reserved:\s*([\d.]+)\s*\|\s*max reserved:\s*([\d.]+)")


def detect_log(text: str, name: str) -> str:
    head = text[:200_000]
    if name.endswith(".json") and '"log_history"' in head:
        return "hf-trainer-state"
    if "_runtime" in head or "system.gpu." in head or "wandb" in name.lower():
        return "wandb"
    clean = _ANSI.sub("", head)
    if _TT.search(clean):
        return "torchtitan"
    if _MEG_IT.search(clean) or _MEG_MEM.search(clean):
        return "megatron"
    raise SpecError(f"{name}: not a training log trainledger reads (formats: {', '.join(LOG_FORMATS)}); "
                    "pass --format")


def _steady(xs: list[float], warmup: int) -> list[float]:
    return xs[warmup:] if len(xs) > warmup else xs[-1:]


def parse_log(text: str, fmt: str, warmup: int = 1) -> dict[str, Any]:
    """``measured`` fields of one log: device, step_time_s, peak bytes where the log has them."""
    if fmt == "hf-trainer-state":
        return _hf_state(text)
    if fmt == "wandb":
        return _wandb(text, warmup)
    text = _ANSI.sub("", text)
    if fmt == "torchtitan":
        return _torchtitan(text, warmup)
    if fmt == "megatron":
        return _megatron(text, warmup)
    raise SpecError(f"unknown log format {fmt!r}; formats: {', '.join(LOG_FORMATS)}")


def _hf_state(text: str) -> dict[str, Any]:
    try:
        d = json.loads(text)
        hist = d["log_history"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise SpecError("trainer_state.json: no log_history (is this a transformers trainer_state.json?)") from None
    final = next((e for e in reversed(hist) if isinstance(e, dict) and "train_runtime" in e), None)
    if final is None:
        raise SpecError("trainer_state.json: the run did not finish (no train_runtime in log_history)")
    out: dict[str, Any] = {"device": "cuda", "steps": d.get("global_step")}
    sps = final.get("train_steps_per_second")
    if sps:
        out["step_time_s"] = 1.0 / sps
        out["note"] = "train_runtime / steps: includes start-up, evaluation and checkpoint saves"
    keys = ("init_mem_gpu_alloc_delta", "train_mem_gpu_alloc_delta", "train_mem_gpu_peaked_delta")
    mem = {**{k: e[k] for e in hist if isinstance(e, dict) for k in keys if k in e}}
    if "train_mem_gpu_peaked_delta" in mem:
        out["peak_allocated_bytes"] = int(sum(mem.get(k, 0) for k in keys))
    return out


def _rows(text: str) -> list[dict[str, Any]]:
    s = text.lstrip()
    if s.startswith("{") and "\n{" not in s.strip():
        return [json.loads(s)]
    if s.startswith("{"):
        return [json.loads(ln) for ln in s.splitlines() if ln.strip()]
    if s.startswith("["):
        return list(json.loads(s))
    return [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(text))]


def _num(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def _wandb(text: str, warmup: int) -> dict[str, Any]:
    try:
        rows = _rows(text)
    except (json.JSONDecodeError, csv.Error) as exc:
        raise SpecError(f"W&B export: not JSON, JSON lines or CSV ({exc})") from None
    out: dict[str, Any] = {"device": "cuda"}
    sps = [r["train/train_steps_per_second"] for r in rows if isinstance(r.get("train/train_steps_per_second"), float | int)]
    if sps:
        out["step_time_s"] = 1.0 / sps[-1]
    else:
        pts = sorted((r["_step"], r["_runtime"]) for r in rows
                     if isinstance(r.get("_step"), float | int) and isinstance(r.get("_runtime"), float | int))
        if len(pts) >= 2 + warmup:
            (s0, t0), (s1, t1) = pts[warmup], pts[-1]
            if s1 > s0:
                out["step_time_s"] = (t1 - t0) / (s1 - s0)
                out["note"] = "W&B _step counts log calls; equal to optimizer steps when logged every step"
    used = [v for r in rows for k, v in r.items()
            if re.fullmatch(r"system[./]gpu\.\d+\.memoryAllocatedBytes", str(k)) and isinstance(v, float | int)]
    if used:
        out["device_used_bytes"] = int(max(used))
    if "step_time_s" not in out and not used:
        raise SpecError("W&B export: neither step timing (_step/_runtime, train/train_steps_per_second) nor "
                        "GPU memory (system.gpu.N.memoryAllocatedBytes) found")
    return out


def _torchtitan(text: str, warmup: int) -> dict[str, Any]:
    hits = [(int(m.group(1)), float(m.group(2)), float(m.group(3).replace(",", "")),
             float(m.group(4)) if m.group(4) else None) for m in _TT.finditer(text)]
    if not hits:
        raise SpecError("torchtitan log: no 'step: N … memory: … tps: …' lines")
    steady = hits[warmup:] if len(hits) > warmup else hits[-1:]
    out: dict[str, Any] = {"device": "cuda", "steps": hits[-1][0],
                           "peak_reserved_bytes": int(max(h[1] for h in hits) * GIB),
                           "tokens_per_s_per_gpu": statistics.mean(h[2] for h in steady)}
    mfus = [h[3] for h in steady if h[3] is not None]
    if mfus:
        out["mfu"] = statistics.mean(mfus) / 100
    return out


def _megatron(text: str, warmup: int) -> dict[str, Any]:
    its = [(int(m.group(1)), float(m.group(2))) for m in _MEG_IT.finditer(text)]
    mems = [tuple(float(x) for x in m.groups()) for m in _MEG_MEM.finditer(text)]
    if not its and not mems:
        raise SpecError("Megatron log: no 'iteration … elapsed time per iteration (ms)' or 'memory (MB)' lines")
    out: dict[str, Any] = {"device": "cuda"}
    if its:
        out["steps"] = its[-1][0]
        out["step_time_s"] = statistics.mean(_steady([t for _, t in its], warmup)) / 1000
    if mems:
        out["peak_allocated_bytes"] = int(max(m[1] for m in mems) * MIB)
        out["peak_reserved_bytes"] = int(max(m[3] for m in mems) * MIB)
    return out


def import_log(path: str | Path, inputs: Any, fmt: str = "auto", warmup: int = 1,
               ledger_path: str | None = None, store: bool = True, device: str = "cuda") -> dict[str, Any]:
    """Read a training log, estimate its plan, store measured vs predicted; returns the record."""
    from trainledger.estimate import estimate
    from trainledger.ledger import Ledger, env_id_of
    from trainledger.load.plan import build_plan
    from trainledger.safety import read_text

    p = Path(path)
    text = read_text(p, limit=LOG_LIMIT_BYTES, what="training log")
    fmt = detect_log(text, p.name) if fmt == "auto" else fmt
    measured = parse_log(text, fmt, warmup)
    measured["device"] = device  # the logs are GPU runs; a CPU trial run is --device cpu
    plan = build_plan(inputs)
    est = estimate(plan)
    if "tokens_per_s_per_gpu" in measured and "step_time_s" not in measured:
        per_gpu_tokens = plan.tokens_per_step / plan.cluster.world_size
        measured["step_time_s"] = per_gpu_tokens / measured["tokens_per_s_per_gpu"]
    predicted = {"peak_allocated_bytes": est.memory.peak_allocated_bytes,
                 "device_total_bytes": est.memory.device_total_bytes,
                 "step_time_s": est.compute.step_time_s if est.compute else None,
                 "mfu": est.compute.mfu if est.compute else None}
    result: dict[str, Any] = {"source": f"import:{fmt}", "file": p.name, "measured": measured,
                              "predicted": predicted, "plan": inputs.model_dump(mode="json")}
    if measured.get("step_time_s") and predicted["step_time_s"]:
        result["time"] = {"measured": measured["step_time_s"], "predicted": predicted["step_time_s"]}
    c = plan.cluster
    env = {"gpu_name": c.gpu.display_name, "gpu_count": c.world_size, "driver": None, "cuda": None,
           "torch": None, "transformers": None, "cpu_model": None, "host": None, "source": "imported log"}
    env["env_id"] = env_id_of(env)
    result["env_id"] = env["env_id"]
    if store:
        with Ledger(ledger_path) as led:
            result["id"] = led.add("measurement", IMPORT_COMMAND, result, env=env, plan=result["plan"])
    return result
