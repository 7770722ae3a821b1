"""Time model vs a real GPU (issue 15): GEMM rates by shape, fused attention by sequence length,
and single-GPU training steps of the ``hf`` stack, each beside what the estimator predicts.

Run it once whenever a CUDA GPU is at hand (about 3 minutes on one H200); it writes
``bench/results/time_cuda_<gpu>.json`` (commit it with the command that produced it). The catalog's
per-family constants (``matmul_best_shape``, ``half_dim``, ``attention_efficiency``,
``attention_half_seq``) and the hf stack's are checked against these files, not fitted to them.

* gemm: ``torch.matmul`` (bf16) and ``torch._scaled_mm`` (fp8 e4m3, bf16 out) on random data,
  the median of CUDA-event-timed repeats after warm-ups; predicted by ``efficiency.gemm_time_s``
  with the GPU family's constants.
* attention FLOPs are counted as the time model counts them (causal keys s/2, backward 2.5x
  forward); predicted by ``efficiency.attention_efficiency`` with the hf stack's constants.
* linear: the GEMMs of an ``nn.Linear`` as training runs them (forward, dgrad, wgrad; weights at
  initialisation's std) beside ``a @ b``, for Llama-3.2-1B's and Qwen2.5-7B's shapes.
* clock: 8192^3 bf16 GEMMs back to back, on zeros, and with memory-bound copies between them,
  with NVML's SM clock and board power sampled (the power limit sets the GEMM clock).
* attention: ``scaled_dot_product_attention`` causal, bf16, forward + backward, per SDPA backend
  (what SDPA picks by itself, flash, cuDNN); see above for the FLOP count.
* step: verify's StepRunner (the plain Hugging Face model, SDPA, torch AdamW) on one GPU, median
  of timed steps after warm-up steps; predicted by ``estimate_compute`` for ``--framework hf``;
  profiled rows add their kernels' device time summed by term (``KERNEL_TERMS``).

Usage: python bench/time_cuda.py [--gpu h200] [--only gemm|linear|clock|attention|step] [--profile-all] [--tag T] [--smoke]
``--profile-all``: every step row also profiled, its kernels summed by term of the time model;
``--tag T`` writes ``time_cuda_<gpu>_T.json``.
``--smoke`` runs tiny sizes on the CPU (checks the script, measures nothing worth keeping).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trainledger.estimate.time import estimate_compute
from trainledger.estimate.time.efficiency import attention_efficiency, for_gpu, gemm_time_s
from trainledger.estimate.time.stack import stack_profile
from trainledger.load.catalog import load_gpu
from trainledger.load.plan import PlanInputs, build_plan

ROOT = Path(__file__).resolve().parents[1]

#: (M, K, N): squares, then the GEMMs of one 8192-token micro-batch of Llama-3.1-8B (qkv, o, the
#: fused gate+up, down, lm_head) and of Llama-3.2-1B, then small and skinny ones
GEMMS = [(n, n, n) for n in (1024, 2048, 4096, 8192, 16384)] + [
    (8192, 4096, 6144), (8192, 4096, 4096), (8192, 4096, 28672), (8192, 14336, 4096),
    (8192, 4096, 128256), (8192, 2048, 3072), (8192, 2048, 16384), (8192, 8192, 2048),
    (2048, 2048, 2048), (512, 4096, 4096), (128, 8192, 8192), (65536, 1024, 1024),
]
FP8_GEMMS = [(n, n, n) for n in (2048, 4096, 8192, 16384)] + [(8192, 4096, 28672), (8192, 14336, 4096)]
#: (tokens, in, out) of nn.Linear layers: Llama-3.2-1B's at 8192 tokens (q, k+v, gate/up, down,
#: lm_head) and Qwen2.5-7B's at 4096 (q, up, down, lm_head)
LINEARS = [(8192, 2048, 2048), (8192, 2048, 512), (8192, 2048, 8192), (8192, 8192, 2048), (8192, 2048, 128256),
           (4096, 3584, 3584), (4096, 3584, 18944), (4096, 18944, 3584), (4096, 3584, 152064)]
#: (batch, heads, seq, head_dim)
ATTENTION = [(16, 32, 1024, 128), (8, 32, 2048, 128), (4, 32, 4096, 128), (2, 32, 8192, 128),
             (1, 32, 16384, 128), (1, 32, 32768, 128), (8, 32, 2048, 64), (2, 32, 8192, 64)]
STEPS = [
    ("Llama-3.2-1B bf16-mixed s2048 b4", dict(model="llama-3.2-1b", seq_len=2048, micro_batch=4)),
    ("Qwen2.5-0.5B bf16-mixed s2048 b8", dict(model="qwen2.5-0.5b", seq_len=2048, micro_batch=8)),
    ("Qwen2.5-1.5B bf16 recompute s4096 b4", dict(model="qwen2.5-1.5b", seq_len=4096, micro_batch=4,
                                                  precision="bf16", recompute="full")),
    ("Llama-3.2-3B bf16-mixed s2048 b2", dict(model="llama-3.2-3b", seq_len=2048, micro_batch=2)),
    ("Llama-3.2-3B fused bf16-mixed s4096 b2", dict(model="llama-3.2-3b", seq_len=4096, micro_batch=2,
                                                    optimizer="adamw-fused")),
    ("Qwen2.5-7B bf16 s2048 b2", dict(model="qwen2.5-7b", seq_len=2048, micro_batch=2, precision="bf16")),
    ("Llama-3.1-8B LoRA s4096 b2", dict(model="llama-3.1-8b", seq_len=4096, micro_batch=2, method="lora")),
    ("Llama-3.2-1B bf16-mixed s8192 b1", dict(model="llama-3.2-1b", seq_len=8192, micro_batch=1)),
]
SMOKE_STEPS = [("tiny-llama bf16-mixed s128 b2", dict(model="tiny-llama-debug", seq_len=128, micro_batch=2))]


class Timer:
    """Median seconds of ``fn`` over ``reps`` calls after ``warm`` calls (CUDA events on the GPU)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch, self.cuda = torch, device == "cuda"

    def __call__(self, fn: Any, warm: int = 3, reps: int = 10) -> float:
        torch = self.torch
        for _ in range(warm):
            fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def bench_gemm(gpu: Any, device: str, smoke: bool) -> list[dict[str, Any]]:
    import torch

    timer, eff, rows = Timer(device), for_gpu(gpu), []
    cases = [("bf16", s) for s in GEMMS] + [("fp8", s) for s in FP8_GEMMS]
    if smoke:
        cases = [("bf16", (64, 128, 96)), ("fp8", (64, 128, 96))]
    for dtype, (M, K, N) in cases:
        a = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=device, dtype=torch.bfloat16)
        if dtype == "bf16":
            def fn(a=a, b=b):
                return a @ b
        else:
            if device != "cuda":
                continue
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
            one = torch.ones((), device=device)

            def fn(a8=a8, b8=b8, one=one):
                return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        t = timer(fn, reps=5 if M * K * N > 2**40 else 10)
        peak = gpu.peak_flop_per_s(dtype)
        pred = gemm_time_s(M, K, N, peak, gpu.hbm_bytes_per_s, eff, eff.matmul_max(dtype), 1.0 if dtype == "fp8" else 2.0)
        rows.append({"dtype": dtype, "M": M, "K": K, "N": N, "measured_s": t, "predicted_s": pred,
                     "measured_tflops": 2 * M * K * N / t / 1e12, "predicted_tflops": 2 * M * K * N / pred / 1e12,
                     "measured_over_predicted_rate": pred / t})
        print(f"gemm {dtype:4s} {M:6d}x{K:6d}x{N:6d}  meas {rows[-1]['measured_tflops']:7.1f} TFLOP/s  "
              f"pred {rows[-1]['predicted_tflops']:7.1f}  ratio {pred / t:5.3f}", flush=True)
        del a, b
    return rows


def _linear_variants(M: int, K: int, N: int, device: str) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    dy = torch.randn(M, N, device=device, dtype=torch.bfloat16)
    w_init = torch.randn(N, K, device=device, dtype=torch.bfloat16) * 0.02
    w_rand = torch.randn(N, K, device=device, dtype=torch.bfloat16)
    b_nn = torch.randn(K, N, device=device, dtype=torch.bfloat16)
    return {"matmul_nn_randn": lambda: x @ b_nn, "linear_fwd_randn": lambda: F.linear(x, w_rand),
            "linear_fwd_init": lambda: F.linear(x, w_init), "linear_dgrad_init": lambda: dy @ w_init,
            "linear_wgrad": lambda: dy.t() @ x}


def bench_linear(gpu: Any, device: str, smoke: bool) -> list[dict[str, Any]]:
    """The GEMMs of an nn.Linear as training runs them: F.linear's forward (x·Wᵀ), the input
    gradient (dy·W) and the weight gradient (dyᵀ·x), with the weight drawn as at initialisation
    (std 0.02, transformers' initializer_range) or as randn, each against ``a @ b`` on randn."""
    timer, eff, rows = Timer(device), for_gpu(gpu), []
    peak = gpu.peak_flop_per_s("bf16")
    for M, K, N in ([(64, 128, 96)] if smoke else LINEARS):
        variants = _linear_variants(M, K, N, device)
        pred = gemm_time_s(M, K, N, peak, gpu.hbm_bytes_per_s, eff, eff.matmul_max("bf16"), 2.0)
        row: dict[str, Any] = {"M": M, "K": K, "N": N, "predicted_s": pred}
        for name, fn in variants.items():
            t = timer(fn, reps=20)
            row[name + "_s"] = t
            row[name + "_tflops"] = 2 * M * K * N / t / 1e12
        rows.append(row)
        print(f"linear {M:5d}x{K:5d}x{N:6d} pred {2 * M * K * N / pred / 1e12:6.1f} | "
              + " ".join(f"{k} {row[k + '_tflops']:6.1f}" for k in variants), flush=True)
        del variants
    return rows


def bench_clock(gpu: Any, device: str, smoke: bool) -> list[dict[str, Any]]:
    """GEMM rate and SM clock, back to back and with memory-bound kernels between them.

    The datasheet's dense rate is at the boost clock it names (H100/H200 SXM: 1830 MHz); under a
    sustained GEMM load the 700 W limit pulls the clock below it, while a training step's
    streaming kernels leave power headroom. Each case runs ~1.5 s of 8192^3 bf16 GEMMs while a
    thread samples NVML's SM clock and board power every 5 ms."""
    import threading

    import torch

    n = 256 if smoke else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b_init = b * 0.02
    z = torch.zeros(n, n, device=device, dtype=torch.bfloat16)
    big = torch.empty(2**29 if not smoke else 2**10, device=device, dtype=torch.bfloat16)  # 1 GiB
    big2 = torch.empty_like(big)
    nvml = None
    if device == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device()))
        except Exception:  # no NVML: rates only
            nvml = None
    cases = {"back_to_back_randn": (a, b, 0), "back_to_back_init_weights": (a, b_init, 0),
             "back_to_back_zeros": (z, z, 0), "gemm_then_copy_randn": (a, b, 1),
             "gemm_then_2_copies_randn": (a, b, 2)}
    rows = []
    for name, (x, w, copies) in cases.items():
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample(samples=samples, stop=stop):
            while nvml and not stop.is_set():
                lib, h = nvml
                samples.append((lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM),
                                lib.nvmlDeviceGetPowerUsage(h) / 1e3))
                time.sleep(0.005)

        events = []
        reps = 4 if smoke else 1500 // (1 + copies)
        for _ in range(20 if not smoke else 1):  # warm to a steady clock
            x @ w
        th = threading.Thread(target=sample)
        th.start()
        for _ in range(reps):
            if device == "cuda":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                x @ w
                e1.record()
                events.append((e0, e1))
            else:
                t0 = time.perf_counter()
                x @ w
                events.append(time.perf_counter() - t0)
            for _ in range(copies):
                big2.copy_(big)
        if device == "cuda":
            torch.cuda.synchronize()
        stop.set()
        th.join()
        times = sorted((e0.elapsed_time(e1) / 1e3) if device == "cuda" else e0 for e0, e1 in
                       (ev if isinstance(ev, tuple) else (ev, None) for ev in events))
        t = statistics.median(times[len(times) // 4:])  # the steady part
        clocks = [c for c, _ in samples[len(samples) // 4:]]
        power = [p for _, p in samples[len(samples) // 4:]]
        rows.append({"case": name, "gemm_s": t, "tflops": 2 * n**3 / t / 1e12,
                     "sm_clock_mhz": statistics.median(clocks) if clocks else None,
                     "power_w": statistics.median(power) if power else None, "samples": len(samples)})
        print(f"clock {name:28s} {rows[-1]['tflops']:7.1f} TFLOP/s  SM {rows[-1]['sm_clock_mhz']} MHz  "
              f"power {rows[-1]['power_w']} W", flush=True)
    return rows


def bench_attention(gpu: Any, device: str, smoke: bool) -> list[dict[str, Any]]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    timer = Timer(device)
    eff = stack_profile("hf", gpu, None).eff
    peak = gpu.peak_flop_per_s("bf16")
    # "default": what SDPA picks by itself, as a Hugging Face model's attention does
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    if device != "cuda":
        backends = {"math": SDPBackend.MATH}
    cases = [(1, 2, 64, 32)] if smoke else ATTENTION
    rows = []
    for name, backend in backends.items():
        for b, h, s, d in cases:
            q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16)

            def fwd(q=q, k=k, v=v):
                return sdpa(q, k, v, is_causal=True)

            def fwd_bwd(q=q, k=k, v=v, grad=grad):
                out = sdpa(q, k, v, is_causal=True)
                out.backward(grad)
                q.grad = k.grad = v.grad = None

            try:
                with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
                    t_f, t_fb = timer(fwd), timer(fwd_bwd)
            except RuntimeError as exc:  # backend unavailable for this shape / build
                rows.append({"backend": name, "b": b, "h": h, "s": s, "d": d, "error": str(exc).splitlines()[0]})
                print(f"attention {name} s{s} d{d}: {rows[-1]['error']}", flush=True)
                continue
            flops_f = 4.0 * b * h * s * (s / 2) * d  # QK^T and PV over the causal keys, as the time model
            eta = attention_efficiency(eff, s, d)
            pred = flops_f * 3.5 / (peak * eta)
            rows.append({"backend": name, "b": b, "h": h, "s": s, "d": d, "fwd_s": t_f, "fwd_bwd_s": t_fb,
                         "fwd_tflops": flops_f / t_f / 1e12, "fwd_bwd_tflops": 3.5 * flops_f / t_fb / 1e12,
                         "measured_efficiency": 3.5 * flops_f / t_fb / peak, "predicted_efficiency": eta,
                         "predicted_fwd_bwd_s": pred, "measured_over_predicted_rate": pred / t_fb})
            print(f"attention {name:5s} b{b:2d} h{h} s{s:5d} d{d:3d}  fwd {rows[-1]['fwd_tflops']:6.1f}  "
                  f"fwd+bwd {rows[-1]['fwd_bwd_tflops']:6.1f} TFLOP/s  eta meas {rows[-1]['measured_efficiency']:.3f} "
                  f"pred {eta:.3f}", flush=True)
            del q, k, v, grad
    return rows


#: rows whose step is also profiled (kernel time by op: where a miss comes from); --profile-all: every row
PROFILED = ["Llama-3.1-8B LoRA s4096 b2", "Llama-3.2-1B bf16-mixed s2048 b4", "Qwen2.5-1.5B bf16 recompute s4096 b4"]

#: kernel-name fragments of each term of the time model (first match wins; the rest is elementwise)
KERNEL_TERMS = (("optimizer", ("multi_tensor_apply", "adam")),
                ("attention", ("sdpa", "flash", "fmha", "attention", "attn")),
                ("matmul", ("nvjet", "gemm", "xmma", "cutlass", "cublas", "sm90_", "splitk")),
                ("loss", ("softmax", "nll_loss", "cross_entropy")))


def _term(kernel: str) -> str:
    k = kernel.lower()
    for term, keys in KERNEL_TERMS:
        if any(key in k for key in keys):
            return term
    return "elementwise"


def _profile(runner: Any) -> dict[str, Any]:
    """Device time of one step (torch.profiler): by kernel, and summed by term of the time model."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.step()
    kernels = []
    for e in prof.key_averages():
        if "cuda" not in str(getattr(e, "device_type", "")).lower() or "#" in e.key:
            # an operator or a runtime call (its kernels are listed themselves), or a user range
            # such as "Optimizer.step#AdamW.step" that torch also records on the GPU (it spans
            # kernels listed themselves; time_cuda_h200_profile.json was written before this
            # rule: its optimizer term holds that range too)
            continue
        dev = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if dev > 0:
            kernels.append({"kernel": e.key, "ms": dev / 1e3, "count": e.count, "term": _term(e.key)})
    kernels.sort(key=lambda r: -r["ms"])
    terms: dict[str, float] = {}
    for k in kernels:
        terms[k["term"]] = terms.get(k["term"], 0.0) + k["ms"]
    print("    kernel ms by term: " + ", ".join(f"{t} {v:.1f}" for t, v in sorted(terms.items())), flush=True)
    for k in kernels[:12]:
        print(f"    {k['ms']:8.2f} ms {k['count']:6d}x {k['term']:11s} {k['kernel'][:80]}", flush=True)
    return {"kernel_ms_by_term": terms, "kernel_ms_total": sum(terms.values()),
            "kernels": [k for k in kernels if k["ms"] >= 0.05]}


def bench_steps(gpu_name: str, device: str, smoke: bool) -> list[dict[str, Any]]:
    import torch

    from trainledger.load.hf import load_hf_config
    from trainledger.verify.build import build_model
    from trainledger.verify.train_step import StepRunner

    rows = []
    for name, kw in (SMOKE_STEPS if smoke else STEPS):
        profile = name in PROFILED
        plan = build_plan(PlanInputs(gpu=gpu_name, framework="hf", **kw))
        comp = estimate_compute(plan)
        try:
            built = build_model(load_hf_config(plan.model.name), plan.recipe, device=device, seed=0)
            runner = StepRunner(built, plan.recipe, seed=0)
            times = {}

            def timed_phase(phase: str, _times=times):
                import contextlib

                @contextlib.contextmanager
                def cm():
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    yield
                    if device == "cuda":
                        torch.cuda.synchronize()
                    _times.setdefault(phase, []).append(time.perf_counter() - t0)
                return cm()

            for _ in range(2):
                runner.step()
            times.clear()
            steps = []
            for _ in range(2 if smoke else 5):
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                runner.step(timed_phase)
                if device == "cuda":
                    torch.cuda.synchronize()
                steps.append(time.perf_counter() - t0)
            meas = statistics.median(steps)
            row = {"name": name, "inputs": kw, "measured_step_s": meas, "steps_s": steps,
                   "phases_s": {k: statistics.median(v) for k, v in times.items()},
                   "predicted_step_s": comp.step_time_s, "predicted_breakdown_s": comp.breakdown,
                   "predicted_compute_parts_s": comp.compute_parts,
                   "measured_over_predicted_time": meas / comp.step_time_s,
                   "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}
            print(f"step {name:42s} meas {meas * 1e3:8.1f} ms  pred {comp.step_time_s * 1e3:8.1f} ms  "
                  f"meas/pred {row['measured_over_predicted_time']:.3f}  phases "
                  + " ".join(f"{k} {v * 1e3:.1f}" for k, v in row["phases_s"].items()), flush=True)
            if profile and device == "cuda":
                row["profile"] = _profile(runner)
            del runner, built
        except Exception as exc:  # an OOM or a missing kernel is a result for this row, not the run
            row = {"name": name, "inputs": kw, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                   "predicted_step_s": comp.step_time_s}
            print(f"step {name}: {row['error']}", flush=True)
        rows.append(row)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return rows


def main(argv: list[str]) -> int:
    import torch

    from trainledger.verify.measurement import environment

    gpu_name = argv[argv.index("--gpu") + 1] if "--gpu" in argv else "h200"
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    smoke = "--smoke" in argv
    if "--profile-all" in argv:
        PROFILED.extend(name for name, _ in STEPS)
    tag = argv[argv.index("--tag") + 1] if "--tag" in argv else ""
    device = "cpu" if smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():  # skips cleanly: `make bench` runs it too
        print("skipped: no CUDA GPU (--smoke checks the script on the CPU)")
        return 0
    gpu = load_gpu(gpu_name)
    out: dict[str, Any] = {"gpu": gpu_name, "env": environment(device),
                           "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "torch": torch.__version__}
    path = ROOT / "bench" / "results" / f"time_cuda_{gpu_name}{'_' + tag if tag else ''}.json"
    if smoke:
        path = Path("/tmp") / "time_cuda_smoke.json"
    sections = {"gemm": lambda: bench_gemm(gpu, device, smoke),
                "linear": lambda: bench_linear(gpu, device, smoke),
                "clock": lambda: bench_clock(gpu, device, smoke),
                "attention": lambda: bench_attention(gpu, device, smoke),
                "step": lambda: bench_steps(gpu_name, device, smoke)}
    for name, run in sections.items():
        if only in ("", name):
            out[name] = run()
            path.write_text(json.dumps(out, indent=1, default=str))  # kept if a later section fails
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
