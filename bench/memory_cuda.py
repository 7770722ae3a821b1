"""Memory estimate vs torch.cuda on a real GPU (issue 3): run this once whenever a CUDA GPU is at
hand; it measures real-size configurations with ``torch.cuda.max_memory_allocated/reserved`` and
writes ``bench/results/memory_cuda_<gpu>.json`` (commit it). The reserve/context terms of
``catalog/runtime/cuda.yaml`` are calibrated from those files.

Usage: python bench/memory_cuda.py [--gpu h200] [--only SUBSTRING]   (needs torch with CUDA;
``--device cpu --only 0.5B`` checks the script on the CPU and writes under /tmp)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainledger.estimate.memory import estimate_memory
from trainledger.load.plan import PlanInputs, build_plan

ROOT = Path(__file__).resolve().parents[1]

CASES: list[tuple[str, dict]] = [
    ("Qwen2.5-0.5B bf16-mixed s2048", dict(model="qwen2.5-0.5b", seq_len=2048, micro_batch=4)),
    ("Qwen2.5-1.5B bf16-mixed s2048", dict(model="qwen2.5-1.5b", seq_len=2048, micro_batch=2)),
    ("Qwen2.5-1.5B pure bf16 recompute", dict(model="qwen2.5-1.5b", seq_len=4096, micro_batch=4,
                                              precision="bf16", recompute="full")),
    ("Qwen2.5-7B pure bf16 s1024", dict(model="qwen2.5-7b", seq_len=1024, micro_batch=1, precision="bf16")),
    ("Qwen2.5-7B LoRA s4096", dict(model="qwen2.5-7b", seq_len=4096, micro_batch=1, method="lora")),
    ("Llama-3.2-1B bf16-mixed s4096", dict(model="llama-3.2-1b", seq_len=4096, micro_batch=2)),
    ("Llama-3.2-1B fused recompute", dict(model="llama-3.2-1b", seq_len=8192, micro_batch=2,
                                          recompute="full", optimizer="adamw-fused")),
    ("Llama-3.2-3B bf16-mixed s2048", dict(model="llama-3.2-3b", seq_len=2048, micro_batch=1)),
    ("Llama-3.2-3B LoRA pure bf16", dict(model="llama-3.2-3b", seq_len=4096, micro_batch=2, method="lora",
                                         precision="bf16")),
    ("Llama-3.2-3B eager s1024", dict(model="llama-3.2-3b", seq_len=1024, micro_batch=1, attention="eager")),
    ("Llama-3.1-8B LoRA recompute", dict(model="llama-3.1-8b", seq_len=4096, micro_batch=2, method="lora",
                                         recompute="full")),
    ("Llama-3.2-1B inference b8 s4096", dict(model="llama-3.2-1b", seq_len=4096, micro_batch=8,
                                             method="inference", precision="bf16", generate_len=32)),
]


def case_inputs(kw: dict) -> dict:
    """A case's plan inputs: what runs here for inference is transformers' generate, so the plan's
    serving engine is hf (as ``verify memory`` does); the vLLM accounting is ``estimate``'s."""
    return {**kw, "serving_engine": "hf"} if kw.get("method") == "inference" else kw


def _driver_overhead() -> dict[str, float]:
    """MiB the process holds on the GPU beyond the caching allocator's reserve: CUDA context,
    loaded kernels, cuBLAS/cuDNN handles and workspaces (device used by cudaMemGetInfo minus
    ``memory_reserved``; the GPU runs nothing else)."""
    import torch

    if not torch.cuda.is_initialized():
        torch.zeros(1, device="cuda")
        ctx_only = torch.cuda.mem_get_info()
        a = torch.randn(256, 256, device="cuda")
        (a @ a).sum().item()  # creates the cuBLAS handle and its workspace
        del a
    else:
        ctx_only = None
    free, total = torch.cuda.mem_get_info()
    mib = 2**20
    out = {"used_mib": (total - free) / mib, "reserved_mib": torch.cuda.memory_reserved() / mib,
           "overhead_mib": (total - free - torch.cuda.memory_reserved()) / mib}
    if ctx_only is not None:
        out["context_only_mib"] = (ctx_only[1] - ctx_only[0]) / mib - 2.0  # less the 2 MiB segment
        # the capacity the memory model uses (GpuSpec.cuda_total_bytes) and the driver's own view
        out["cuda_total_mib"] = total / mib
        out.update(_nvidia_smi())
    print(f"driver overhead: {out}", flush=True)
    return out


def _nvidia_smi() -> dict[str, str]:
    """nvidia-smi's total (and, on drivers that report it, reserved) framebuffer and the driver
    version (empty when nvidia-smi is absent): with ``cuda_total_mib`` they measure the driver's
    reserve that the catalog reads from torch's OOM messages."""
    import subprocess

    for fields in (("memory.total", "memory.reserved", "driver_version"), ("memory.total", "driver_version")):
        try:
            line = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                   "-i", "0"], capture_output=True, text=True, timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return {"nvidia_smi_" + f.replace(".", "_"): v.strip() for f, v in zip(fields, line.strip().split(","))}
    return {}


def main(argv: list[str]) -> int:
    from trainledger.verify.measure import measure_memory

    gpu = argv[argv.index("--gpu") + 1] if "--gpu" in argv else "h200"
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():  # skips cleanly (`make bench` runs it too), and never
            print("skipped: no CUDA GPU")  # overwrites the committed measurement with errors
            return 0
    out = ROOT / "bench" / "results" / f"memory_cuda_{gpu}.json"
    rows = []
    context = _driver_overhead() if device == "cuda" else None
    for name, kw in CASES:
        if only and only not in name:
            continue
        if device == "cuda":  # each case starts from an empty cache: its reserved peak is its own
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        plan = build_plan(PlanInputs(gpu=gpu, **case_inputs(kw)))
        est = estimate_memory(plan, suggest=False)
        try:
            m = measure_memory(plan, device=device, steps=2)
        except Exception as exc:  # one failing case is a result; the others still run
            rows.append({"name": name, "inputs": kw, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"{name:36s} {rows[-1]['error']}", flush=True)
            continue
        row = {"name": name, "inputs": kw, "predicted_allocated": est.peak_allocated_bytes,
               "measured_allocated": m.peak_allocated_bytes, "predicted_reserved": est.peak_reserved_bytes,
               "measured_reserved": m.peak_reserved_bytes, "pred_phase": est.peak_phase,
               "meas_phase": m.peak_phase, "oom": m.oom, "env": m.env, "notes": m.notes,
               "measured_categories": m.categories_at_peak, "step_time_s": m.step_time_s,
               "driver_overhead_after": _driver_overhead() if device == "cuda" else None,
               "error": (est.peak_allocated_bytes - m.peak_allocated_bytes) / max(m.peak_allocated_bytes, 1)}
        rows.append(row)
        print(f"{name:36s} pred {est.peak_allocated_bytes / 2**30:8.2f} GiB  meas "
              f"{m.peak_allocated_bytes / 2**30:8.2f} GiB  {row['error']:+.2%}  reserved pred/meas "
              f"{est.peak_reserved_bytes / 2**30:.2f}/{(m.peak_reserved_bytes or 0) / 2**30:.2f} GiB", flush=True)
        if device == "cuda":
            out.write_text(json.dumps({"context_at_start": context, "rows": rows}, indent=1, default=str))
    if device != "cuda":
        out = Path("/tmp") / out.name
    out.write_text(json.dumps({"context_at_start": context, "rows": rows}, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
