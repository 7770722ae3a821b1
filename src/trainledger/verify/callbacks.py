"""Record the user's own training runs in the ledger: a transformers ``TrainerCallback``, a context
manager for a plain PyTorch loop, and a Lightning callback (when lightning is installed).

Each records, on rank 0 (with every rank's peak gathered when torch.distributed is initialised),
the peak allocated / reserved memory of the steady-state steps (the first ``warmup_steps`` are left
out: optimizer states appear in step 1), the mean step time, tokens/s, and the plan the run is
(derived in the process from the model's config, the Trainer's arguments, peft and the batches
seen), next to that plan's estimate — the record ``trainledger calibrate`` fits from.

On CUDA the memory figures are ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
(reset after warm-up): reading two counters per run, no per-step cost. On a CPU run they come
from :class:`~trainledger.verify.memtrace.MemoryTracker` (exact storage accounting with CUDA's
512-byte blocks, as ``verify memory`` does), which slows the CPU step; pass ``track_cpu=False``
for timing only. Step time is wall time between step ends (no synchronisation inside the loop).

Usage::

    trainer = Trainer(..., callbacks=[LedgerCallback()])          # transformers
    with track_run(model, seq_len=2048) as run:                     # plain loop
        for batch in loader:
            with run.step(tokens=batch["input_ids"].numel()):
                ...
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from trainledger.errors import MissingDependency, SpecError
from trainledger.verify.probe import catalog_gpu_here

#: the ledger command of a measured training run
RUN_COMMAND = "train run"


def _torch() -> Any:
    import torch

    return torch


def _rank_world() -> tuple[int, int]:
    torch = _torch()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _unwrap(model: Any) -> Any:
    """The Hugging Face model inside DDP/compile/Lightning wrappers (the module with a ``config``)."""
    for attr in ("module", "_orig_mod"):
        while hasattr(model, attr) and not hasattr(model, "config"):
            model = getattr(model, attr)
    if not hasattr(getattr(model, "config", None), "to_dict") and hasattr(model, "children"):
        for child in model.children():  # e.g. a LightningModule holding the model as an attribute
            if hasattr(getattr(child, "config", None), "to_dict"):
                return child
    return model


def derive_inputs(model: Any, *, seq_len: int | None = None, micro_batch: int | None = None,
                  grad_accum: int = 1, precision: str | None = None, recompute: str | None = None,
                  optimizer: str | None = None, gpus: int | None = None, gpu: str | None = None,
                  **extra: Any) -> tuple[dict[str, Any], Any]:
    """Plan inputs and the ModelSpec of the model in this process (config, peft, quantization)."""
    from trainledger.load.hf import from_hf_config

    model = _unwrap(model)
    inputs: dict[str, Any] = {}
    peft_cfg = getattr(model, "peft_config", None)
    base = model.get_base_model() if peft_cfg and hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    if cfg is None:
        raise SpecError("the model has no Hugging Face config; pass plan=PlanInputs(...) to the recorder")
    spec = from_hf_config(cfg.to_dict(), name=getattr(cfg, "_name_or_path", None) or cfg.model_type)
    if peft_cfg:
        lc = next(iter(peft_cfg.values()))
        four_bit = bool(getattr(base, "is_loaded_in_4bit", False))
        inputs.update(method="qlora" if four_bit else "lora", lora_rank=int(lc.r),
                      lora_alpha=float(lc.lora_alpha))
        tm = lc.target_modules
        if tm and not isinstance(tm, str):
            inputs["lora_targets"] = tuple(sorted(tm))
    else:
        inputs["method"] = "full"
    rank, world = _rank_world()
    inputs.update(gpus=gpus or world, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum)
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)  # torchrun: processes on this node
    if local and inputs["gpus"] % local == 0:
        inputs["gpus_per_node"] = local
    for k, v in (("precision", precision), ("recompute", recompute), ("optimizer", optimizer), ("gpu", gpu)):
        if v is not None:
            inputs[k] = v
    inputs.update({k: v for k, v in extra.items() if v is not None})
    if gpu is None:
        _torch()  # a clear MissingDependency without torch
        inputs["gpu"] = catalog_gpu_here() or "h100-sxm"
    return {k: v for k, v in inputs.items() if v is not None}, spec


class RunRecorder:
    """Framework-free core: call :meth:`step_begin`/:meth:`step_end` around each optimizer step,
    :meth:`finish` at the end. ``plan``: PlanInputs fields (dict) to use instead of deriving them."""

    def __init__(self, model: Any = None, *, plan: dict[str, Any] | None = None, warmup_steps: int = 1,
                 ledger: str | None = None, store: bool = True, track_cpu: bool = True,
                 log_to: tuple[str, ...] | str = "auto", **plan_hints: Any) -> None:
        self.model, self.plan_given, self.hints = model, plan, plan_hints
        self.warmup_steps, self.ledger_path, self.store = max(0, warmup_steps), ledger, store
        self.track_cpu, self.log_to = track_cpu, log_to
        self.step_times: list[float] = []
        self.tokens: list[int] = []
        self.steps = 0
        self.seen_shape: tuple[int, int] | None = None
        self.result: dict[str, Any] | None = None
        self.record_id: int | None = None
        self._t_last: float | None = None
        self._tracker: Any = None
        self._hook: Any = None
        self._cuda = False
        self.overhead_s = 0.0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        t0 = time.perf_counter()
        torch = _torch()
        self._cuda = torch.cuda.is_available() and self._on_cuda()
        if self.model is not None:
            self._hook = _unwrap(self.model).register_forward_pre_hook(self._see_batch, with_kwargs=True)
        if not self._cuda and self.track_cpu:
            from trainledger.verify.memtrace import MemoryTracker

            cfg = getattr(_unwrap(self.model), "config", None) if self.model is not None else None
            self._tracker = MemoryTracker(vocab_size=getattr(cfg, "vocab_size", None))
            if self.model is not None:
                self._tracker.register(self.model.parameters(), "weights")
            self._tracker.__enter__()
        self._t_last = time.perf_counter()
        self.overhead_s += self._t_last - t0

    def _on_cuda(self) -> bool:
        if self.model is None:
            return True
        p = next(iter(self.model.parameters()), None)
        return p is not None and p.device.type == "cuda"

    def _see_batch(self, module: Any, args: tuple, kwargs: dict) -> None:
        if self.seen_shape is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            shape = getattr(ids, "shape", None)
            if shape is not None and len(shape) == 2:
                self.seen_shape = (int(shape[0]), int(shape[1]))

    def step_begin(self) -> None:
        if self.steps == self.warmup_steps:
            t0 = time.perf_counter()
            if self._cuda:
                torch = _torch()
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            elif self._tracker is not None:
                self._tracker.reset_peaks()
            self._t_last = time.perf_counter()
            self.overhead_s += self._t_last - t0

    def step_end(self, tokens: int | None = None) -> None:
        now = time.perf_counter()
        self.steps += 1
        if self.steps > self.warmup_steps and self._t_last is not None:
            self.step_times.append(now - self._t_last)
            if tokens is None and self.seen_shape is not None:
                tokens = self.seen_shape[0] * self.seen_shape[1] * int(self.hints.get("grad_accum") or 1)
            if tokens:
                self.tokens.append(int(tokens))
        self._t_last = now
        self.overhead_s += time.perf_counter() - now

    def finish(self) -> dict[str, Any]:
        torch = _torch()
        t0 = time.perf_counter()
        if self._hook is not None:
            self._hook.remove()
        measured: dict[str, Any] = {"device": "cuda" if self._cuda else "cpu", "steps": self.steps,
                                    "warmup_steps": self.warmup_steps}
        if self._cuda:
            torch.cuda.synchronize()
            measured["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            measured["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        elif self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            measured["peak_allocated_bytes"] = int(self._tracker.peak.bytes)
            measured["peak_reserved_bytes"] = None
        if self.step_times:
            measured["step_time_s"] = statistics.mean(self.step_times)
            measured["step_time_median_s"] = statistics.median(self.step_times)
        if self.tokens and self.step_times:
            measured["tokens_per_s"] = sum(self.tokens) / sum(self.step_times)
        rank, world = _rank_world()
        measured["per_rank"] = _gather(measured, world)
        self.overhead_s += time.perf_counter() - t0
        measured["recorder_overhead_s"] = self.overhead_s
        self.result = self._with_prediction(measured)
        if rank == 0:
            if self.store:
                self._store()
            _log_external(self.result, self.log_to)
        return self.result

    # ----------------------------------------------------------------- plan and record
    def inputs(self) -> tuple[dict[str, Any], Any]:
        if self.plan_given is not None:
            return dict(self.plan_given), None
        hints = dict(self.hints)
        if self.seen_shape is not None:
            hints.setdefault("micro_batch", self.seen_shape[0])
            hints.setdefault("seq_len", self.seen_shape[1])
        if self.model is None:
            raise SpecError("no model and no plan: pass the model or plan=PlanInputs fields")
        return derive_inputs(self.model, **hints)

    def _with_prediction(self, measured: dict[str, Any]) -> dict[str, Any]:
        from trainledger.estimate import estimate
        from trainledger.load.plan import PlanInputs, build_plan

        out: dict[str, Any] = {"source": "callback", "measured": measured}
        try:
            inputs, spec = self.inputs()
            pin = PlanInputs(**inputs) if spec is None else PlanInputs(**{**inputs, "model": inputs.get("model", spec.name)})
            plan = build_plan(pin, model=spec)
            est = estimate(plan)
        except Exception as exc:  # noqa: BLE001 - a plan we cannot build is reported, not fatal
            out["plan_error"] = str(exc)
            return out
        out["plan"] = pin.model_dump(mode="json")
        out["predicted"] = {"peak_allocated_bytes": est.memory.peak_allocated_bytes,
                            "step_time_s": est.compute.step_time_s if est.compute else None,
                            "mfu": est.compute.mfu if est.compute else None}
        if measured.get("step_time_s") and out["predicted"]["step_time_s"]:
            out["time"] = {"measured": measured["step_time_s"], "predicted": out["predicted"]["step_time_s"]}
        return out

    def _store(self) -> None:
        from trainledger.ledger import Ledger, fingerprint

        with Ledger(self.ledger_path) as led:
            self.record_id = led.add("measurement", RUN_COMMAND, self.result, env=fingerprint(),
                                     plan=self.result.get("plan"), ok=None)


def _gather(measured: dict[str, Any], world: int) -> list[dict[str, Any]]:
    mine = {k: measured.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "step_time_s")}
    if world == 1:
        return [mine]
    torch = _torch()
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, mine)
    return out


def _log_external(result: dict[str, Any], log_to: tuple[str, ...] | str) -> None:
    """Estimate vs measured to W&B / MLflow / TensorBoard when installed and a run is active."""
    targets = ("wandb", "mlflow") if log_to == "auto" else tuple(log_to)
    m, p = result.get("measured", {}), result.get("predicted") or {}
    metrics = {"trainledger/measured_peak_allocated_gib": (m.get("peak_allocated_bytes") or 0) / 2**30,
               "trainledger/predicted_peak_allocated_gib": (p.get("peak_allocated_bytes") or 0) / 2**30,
               "trainledger/measured_step_time_s": m.get("step_time_s") or 0.0,
               "trainledger/predicted_step_time_s": p.get("step_time_s") or 0.0}
    if "wandb" in targets:
        with contextlib.suppress(ImportError):
            import wandb

            if wandb.run is not None:
                wandb.run.summary.update(metrics)
    if "mlflow" in targets:
        with contextlib.suppress(ImportError):
            import mlflow

            if mlflow.active_run() is not None:
                mlflow.log_metrics({k.replace("/", "_"): v for k, v in metrics.items()})
    if "tensorboard" in targets and isinstance(log_to, tuple):
        with contextlib.suppress(ImportError):
            from torch.utils.tensorboard import SummaryWriter

            w = SummaryWriter()
            for k, v in metrics.items():
                w.add_scalar(k, v, 0)
            w.close()


# ----------------------------------------------------------------------------- plain PyTorch loop
class _Run:
    def __init__(self, rec: RunRecorder) -> None:
        self.recorder = rec

    @contextlib.contextmanager
    def step(self, tokens: int | None = None) -> Iterator[None]:
        self.recorder.step_begin()
        yield
        self.recorder.step_end(tokens)

    @property
    def result(self) -> dict[str, Any] | None:
        return self.recorder.result


@contextlib.contextmanager
def track_run(model: Any = None, **kwargs: Any) -> Iterator[_Run]:
    """Record a plain PyTorch training loop; wrap each optimizer step in ``run.step(tokens=...)``."""
    rec = RunRecorder(model, **kwargs)
    rec.start()
    run = _Run(rec)
    try:
        yield run
    finally:
        rec.finish()


# ----------------------------------------------------------------------------- transformers
def _trainer_callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise MissingDependency("LedgerCallback needs transformers: pip install 'trainledger[verify]'") from None
    return TrainerCallback


def _hf_hints(args: Any) -> dict[str, Any]:
    optim = str(getattr(args, "optim", "adamw_torch")).split(".")[-1].lower()
    from trainledger.runconfig.formats import OPTIM_FROM_HF

    gc = getattr(args, "gradient_checkpointing", False) or getattr(args, "activation_checkpointing", False)
    hints = {"micro_batch": args.per_device_train_batch_size, "grad_accum": args.gradient_accumulation_steps,
             "precision": "bf16-mixed" if args.bf16 else "fp16-mixed" if args.fp16 else "fp32",
             "recompute": "full" if gc else "none", "optimizer": OPTIM_FROM_HF.get(optim, "adamw"),
             "grad_clip": args.max_grad_norm or 0.0}
    if getattr(args, "use_liger_kernel", False):  # the Trainer patched the model with Liger's kernels
        hints["liger_kernel"] = True
    return hints


def LedgerCallback(**kwargs: Any) -> Any:  # noqa: N802 - a class factory: transformers is optional
    """A ``transformers.TrainerCallback`` that records the run (see module docstring)."""
    base = _trainer_callback_base()

    class _LedgerCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.recorder: RunRecorder | None = None

        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            hints = {**_hf_hints(args), **kwargs.pop("hints", {})}
            self.recorder = RunRecorder(model, **{**kwargs, **{k: v for k, v in hints.items() if k not in kwargs}})
            self.recorder.start()

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            if self.recorder is not None:
                self.recorder.step_begin()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            if self.recorder is not None:
                self.recorder.step_end()

        def on_train_end(self, args, state, control, **kw):  # noqa: ANN001
            if self.recorder is not None:
                self.recorder.finish()

        @property
        def result(self) -> dict[str, Any] | None:
            return self.recorder.result if self.recorder else None

    return _LedgerCallback()


# ----------------------------------------------------------------------------- Lightning
def LightningLedgerCallback(**kwargs: Any) -> Any:  # noqa: N802
    """A Lightning ``Callback`` recording the run (needs ``lightning`` or ``pytorch_lightning``)."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise MissingDependency("LightningLedgerCallback needs lightning: pip install lightning") from None

    class _Cb(Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.recorder: RunRecorder | None = None

        def on_train_start(self, trainer, pl_module):  # noqa: ANN001
            self.acc = max(1, int(trainer.accumulate_grad_batches))
            self.recorder = RunRecorder(pl_module, **{"grad_accum": self.acc, **kwargs})
            self.recorder.start()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            if batch_idx % self.acc == 0:  # an optimizer step begins
                self.recorder.step_begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            if (batch_idx + 1) % self.acc == 0:
                self.recorder.step_end()

        @property
        def result(self) -> dict[str, Any] | None:
            return self.recorder.result if self.recorder else None

        def on_train_end(self, trainer, pl_module):  # noqa: ANN001
            self.recorder.finish()

    return _Cb()
