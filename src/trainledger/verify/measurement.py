"""What a memory measurement returns and the helpers every way of measuring shares.

:class:`MemoryMeasurement` (the result of ``measure_memory``, ``measure_sharded`` and the CUDA run),
the environment fingerprint, the notes on what a CPU / fake run differs in from CUDA, and the
registration of a step's standing state (weights, gradients, optimizer states) with a tracker.
``verify/measure.py`` (one process) and ``verify/sharded.py`` (rank 0 on the fake process group)
both build on it; neither imports the other's internals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainledger.spec.recipe import Recipe

NOTE_AUTOCAST_CPU = ("CPU autocast keeps layer_norm/softmax/pow/sum outputs in bf16 where CUDA "
                     "autocast runs them in fp32")
NOTE_AUTOCAST_EMULATED = ("CUDA's autocast fp32 op lists applied on top of CPU autocast (layer_norm, "
                          "softmax, pow, sum, exp ... in fp32); ops called inside C++ composites keep CPU's policy")
NOTE_TRACKER_SCOPE = ("kernel-internal scratch buffers (e.g. flash-attention backward's fp32 dq "
                      "accumulator, cuBLAS workspace) are not seen; CUDA counts them while the kernel runs")
NOTE_SDPA_CPU = ("SDPA on CPU uses its flash kernel for every dtype; CUDA uses cuDNN/flash for bf16/fp16 "
                 "and memory-efficient attention for fp32 (logsumexp padded to 32 queries); their "
                 "backward scratch (dq accumulator, expanded GQA dK/dV) is not counted here")
NOTE_ALLOCATOR = ("sizes rounded to CUDA's 512-byte blocks; CUDA may book up to 1 MiB more per tensor "
                  "> 1 MiB when it hands out an unsplit large block")
NOTE_DROPOUT_CPU = "attention dropout > 0: CPU SDPA falls back to the math kernel (b×a×s×s scores)"
NOTE_STEP_COUNTERS = "AdamW step counters are host tensors in a CUDA run: not counted"


@dataclass
class MemoryMeasurement:
    """Measured memory of one steady-state step. Bytes are ints; times are seconds."""

    peak_allocated_bytes: int
    peak_phase: str | None
    phase_peaks: dict[str, int]
    categories_at_peak: dict[str, int]
    phase_categories: dict[str, dict[str, int]]
    device: str
    start_bytes: int = 0
    peak_reserved_bytes: int | None = None
    phase_reserved: dict[str, int] = field(default_factory=dict)
    step_time_s: float | None = None
    forward_time_s: float | None = None
    backward_time_s: float | None = None
    oom: bool = False
    oom_phase: str | None = None
    oom_message: str | None = None
    tracker_peak_bytes: int | None = None
    timeline: list[tuple[str, int]] = field(default_factory=list)
    kv_cache_bytes: int | None = None
    serving: dict[str, Any] = field(default_factory=dict)  # inference on cuda: TTFT, TPOT, tokens/s
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def backward_forward_ratio(self) -> float | None:
        if self.forward_time_s and self.backward_time_s is not None:
            return self.backward_time_s / self.forward_time_s
        return None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["backward_forward_ratio"] = self.backward_forward_ratio
        return d


def environment(device: str) -> dict[str, str]:
    """Versions and device name, for the ledger's environment fingerprint."""
    import platform

    import torch
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "device": device}
    try:
        import peft

        env["peft"] = peft.__version__
    except ImportError:
        pass
    if device == "cuda" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda"] = str(torch.version.cuda)
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def optimizer_states(opt: Any) -> list[Any]:
    """The optimizer's state tensors that live on the device (host step counters left out)."""
    from trainledger.verify.train_step import host_step_counters, optimizer_state_tensors

    host = {id(t) for t in host_step_counters(opt)}
    return [t for t in optimizer_state_tensors(opt) if id(t) not in host]


def register_state(tracker: Any, runner: Any) -> None:
    """Count what lives before the measured step: weights, buffers, grads, optimizer states."""
    model = runner.model
    params = list(model.parameters())
    tracker.register(params, "weights")
    tracker.register(model.buffers(), "other")
    tracker.register([p.grad for p in params], "gradients")
    if runner.optimizer is not None:
        from trainledger.verify.train_step import host_step_counters

        tracker.register(optimizer_states(runner.optimizer), "optimizer_states")
        counters = host_step_counters(runner.optimizer)
        tracker.ignore(counters)


def tracked_notes(built: Any, recipe: Recipe, cuda_autocast: bool = True) -> list[str]:
    """The CPU-vs-CUDA differences that apply to this run."""
    notes = [NOTE_TRACKER_SCOPE, NOTE_ALLOCATOR]
    if recipe.precision in ("bf16-mixed", "fp16-mixed") and built.device != "cuda" and recipe.is_training:
        notes.append(NOTE_AUTOCAST_EMULATED if cuda_autocast else NOTE_AUTOCAST_CPU)
    if recipe.attention != "eager":
        notes.append(NOTE_SDPA_CPU)
        if recipe.dropout > 0:
            notes.append(NOTE_DROPOUT_CPU)
    if recipe.optimizer == "adamw" and recipe.is_training:
        notes.append(NOTE_STEP_COUNTERS)
    return notes
