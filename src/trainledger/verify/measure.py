"""Measure the peak memory of a plan's training step — the ground truth of the memory model.

Public API (stable; the estimator's accuracy tests code against it)::

    from trainledger.verify.measure import measure_memory, measure_memory_from_config

    m = measure_memory(plan, device="cpu" | "fake" | "cuda", steps=2, seed=0, cuda_autocast=True)
    m.peak_allocated_bytes   # int: peak live tensor bytes of the steady-state (last) step, i.e.
                             #      what torch.cuda.max_memory_allocated() reports for that step
    m.peak_reserved_bytes    # int | None: torch.cuda.max_memory_reserved() (cuda only)
    m.peak_phase             # "forward" | "backward" | "optimizer" | "zero_grad" ("decode" for inference)
    m.phase_peaks            # {phase: peak bytes within that phase}
    m.categories_at_peak     # {category: bytes live at the global peak}; keys = memtrace.CATEGORIES
    m.phase_categories       # {phase: {category: bytes live at that phase's peak}}
    m.start_bytes            # live bytes when the measured step began (weights, states, ...)
    m.timeline               # [(phase, live bytes)], <= 400 points, peaks kept (for a chart)
    m.kv_cache_bytes         # inference: KV-cache bytes live at the peak (part of "activations")
    m.step_time_s, m.forward_time_s, m.backward_time_s, m.backward_forward_ratio  (cuda: timed;
                             # cpu: wall time with the tracker on; fake: None)
    m.oom, m.oom_phase, m.oom_message   # cuda: an out-of-memory is a result, not a crash
    m.device, m.env, m.notes, m.to_dict()

    m = measure_memory_from_config(hf_config_dict, recipe, device="cpu", steps=2, seed=0,
                                   cuda_autocast=True)

``steps`` optimizer steps run (at least 2); the last one is measured, so optimizer states exist
(the first step understates the peak). Every byte figure counts storages rounded to CUDA's
512-byte blocks, on every device, so CPU/fake numbers are directly comparable with CUDA's.

Devices:

* ``cpu`` — real tensors, exact accounting by :class:`~trainledger.verify.memtrace.MemoryTracker`.
* ``fake`` — FakeTensors on the CPU: full-size models (8B, 70B) in seconds, no memory used.
  MoE models use transformers' default ``grouped_mm`` experts (shapes independent of routing).
* ``cuda`` — torch.cuda's own counters (``reset_peak_memory_stats`` around each phase); the
  category breakdown comes from one extra tracked step.

Where CPU/fake runs differ from CUDA (each run lists the ones that apply in ``m.notes``):

* autocast: CPU autocast's op lists differ from CUDA's. CUDA runs ``layer_norm``/``group_norm``,
  ``softmax``/``log_softmax`` (without dtype), ``pow``, ``exp``, ``sum``, ``rsqrt`` … in fp32
  (outputs fp32), CPU autocast leaves them in bf16 (e.g. gpt2's eager softmax would keep a bf16
  instead of an fp32 b×a×s×s tensor). By default (``cuda_autocast=True``) cpu/fake runs apply
  CUDA's lists on top of CPU autocast (:mod:`trainledger.verify.autocast_cuda`); only ops called
  from inside C++ composite ops keep CPU's policy. Llama-style models upcast explicitly and are
  unaffected either way.
* SDPA kernel: CPU runs its flash kernel for every dtype (saves output + fp32 logsumexp b×a×s,
  GQA without repeating K/V). CUDA (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) tries
  cuDNN first on Hopper/Blackwell with cuDNN > 9.15, then flash (fp16/bf16 only), then
  memory-efficient (also fp32; logsumexp padded to a multiple of 32 queries), all GQA-capable and
  saving the same output + logsumexp, so the saved activations agree up to that padding; their
  backward kernels allocate scratch internally (e.g. flash's fp32 dq accumulator and expanded
  dK/dV for GQA) that no dispatch-level tracker sees. With dropout > 0 the CPU falls back to the
  math kernel, which materializes b×a×s×s scores (CUDA's flash/cuDNN do not).
* kernel-internal scratch (flash backward's fp32 dq accumulator, cuBLAS workspaces) is invisible
  to a dispatch-level tracker; CUDA counts it while the kernel runs.
* the caching allocator books a whole large-pool block when splitting it would leave <= 1 MiB
  (c10/cuda/CUDACachingAllocator.cpp ``should_split``), so a tensor > 1 MiB may count up to 1 MiB
  more on CUDA than its 512-byte-rounded size; the count depends on the cache's state.
* AdamW's step counters live on the host in a CUDA run (non-fused): they are dropped from the
  count here. Fused AdamW keeps them on the device (counted).
"""

from __future__ import annotations

import time
from typing import Any

from trainledger.errors import VerifyError
from trainledger.spec.recipe import Recipe
from trainledger.verify.build import build_model, fake_runtime, require
from trainledger.verify.measurement import (  # noqa: F401  (the public result type, re-exported)
    NOTE_ALLOCATOR, NOTE_AUTOCAST_CPU, NOTE_AUTOCAST_EMULATED, NOTE_DROPOUT_CPU, NOTE_SDPA_CPU,
    NOTE_STEP_COUNTERS, NOTE_TRACKER_SCOPE, MemoryMeasurement, environment, optimizer_states,
    register_state, tracked_notes,
)
from trainledger.verify.sharded import measure_sharded

DEVICES = ("cpu", "fake", "cuda")


def measure_memory(plan: Any, device: str = "cpu", steps: int = 2, seed: int = 0,
                   cuda_autocast: bool = True) -> MemoryMeasurement:
    """Measure the plan's per-GPU memory by running its model (see the module docstring)."""
    from trainledger.load.hf import load_hf_config
    from trainledger.verify.build import check_measurable

    check_measurable(plan)
    lay = plan.layout
    rt = getattr(plan, "runtime", None)
    fw = rt.framework if rt is not None else "hf"
    sharded = max(lay.tp, lay.pp, lay.cp, lay.ep) > 1 or lay.zero or lay.offload != "none" or fw != "hf" \
        or (lay.dp_size > 1 and plan.recipe.is_training)
    if sharded:  # rank 0 of the real runtime on torch's fake process group (verify/sharded.py)
        if device == "cuda":
            raise VerifyError("a sharded plan is measured on the fake process group (no GPU needed): use "
                              "--device fake; on GPUs run the job itself under torchrun")
        m = measure_sharded(plan, steps=steps, seed=seed, cuda_autocast=cuda_autocast)
        if device == "cpu":
            m.notes.append("sharded plans are measured with FakeTensors on the fake process group (device fake)")
        return m
    hf_config = load_hf_config(plan.model.name)
    m = measure_memory_from_config(hf_config, plan.recipe, device=device, steps=steps, seed=seed,
                                   cuda_autocast=cuda_autocast)
    return m


def measure_memory_from_config(hf_config: dict[str, Any], recipe: Recipe, device: str = "cpu",
                               steps: int = 2, seed: int = 0, cuda_autocast: bool = True) -> MemoryMeasurement:
    """Measure a model given as a raw config.json mapping, under ``recipe``.

    ``cuda_autocast`` (cpu/fake, mixed precision): apply CUDA's fp32 autocast lists on top of CPU
    autocast (see :mod:`trainledger.verify.autocast_cuda`); False measures CPU autocast as it is.
    """
    if device not in DEVICES:
        raise VerifyError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if steps < 1 or (recipe.is_training and steps < 2):
        raise VerifyError("steps must be >= 2 for training (the last, steady-state step is measured)")
    require("torch")
    built = build_model(hf_config, recipe, device=device, seed=seed)
    if device == "cuda":
        from trainledger.verify.cuda_run import run_cuda

        m = run_cuda(built, recipe, steps, seed)
    else:
        m = _run_tracked(built, recipe, steps, seed, cuda_autocast)
    m.env = environment(device)
    m.recipe = recipe.model_dump(mode="json")
    m.notes = built.notes + m.notes
    return m


def _run_tracked(built: Any, recipe: Recipe, steps: int, seed: int, cuda_autocast: bool) -> MemoryMeasurement:
    """CPU or fake: warm-up steps untracked, the last step under the MemoryTracker."""
    import contextlib

    from trainledger.verify.memtrace import MemoryTracker
    from trainledger.verify.train_step import StepRunner

    fake = fake_runtime(built.fake_mode) if built.device == "fake" else contextlib.nullcontext()
    with fake:
        runner = StepRunner(built, recipe, seed=seed, cuda_autocast=cuda_autocast)
        for _ in range(steps - 1):
            runner.step()
        tracker = MemoryTracker(vocab_size=built.vocab_size)
        register_state(tracker, runner)
        tracker.reset_peaks()
        runner.on_grads = lambda grads: tracker.label(grads, "gradients")
        runner.on_states = lambda opt: tracker.label(optimizer_states(opt), "optimizer_states")
        runner.on_cache = lambda tensors: tracker.tag(tensors, "kv_cache")
        t0 = time.perf_counter()
        with tracker:
            runner.step(tracker.phase)
        wall = time.perf_counter() - t0
    rep = tracker.report()
    notes = runner.notes + tracked_notes(built, recipe, cuda_autocast)
    if rep.late_registered:
        notes.append(f"{rep.late_registered} storages were first seen as op inputs (made outside the tracker)")
    return MemoryMeasurement(
        peak_allocated_bytes=rep.peak_bytes, peak_phase=rep.peak_phase, phase_peaks=rep.phase_peaks,
        categories_at_peak=rep.categories_at_peak, phase_categories=rep.phase_categories,
        device=built.device, start_bytes=rep.start_bytes,
        step_time_s=None if built.device == "fake" else wall, notes=notes,
        tracker_peak_bytes=rep.peak_bytes, timeline=rep.timeline,
        kv_cache_bytes=rep.tags_at_peak.get("kv_cache") if not recipe.is_training else None,
    )
