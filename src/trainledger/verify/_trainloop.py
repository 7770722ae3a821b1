"""A distributed training loop of a plan, shared by ``verify accept`` and ``verify scaling``.

Runs inside a torchrun worker. The model, its precision, recomputation and LoRA come from
:func:`trainledger.verify.build.build_model` and the optimizer from
:func:`trainledger.verify.train_step.make_optimizer` (the same code ``verify memory`` measures).
What this module adds: data parallelism (DDP for ZeRO 0-2, FSDP2 ``fully_shard`` per decoder
layer for ZeRO 3), deterministic data per (step, rank, micro-batch) so a restored run sees
exactly the batches an uninterrupted run sees, gradient accumulation with ``no_sync``, checkpoints
through ``torch.distributed.checkpoint`` and parameter checksums.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from trainledger.errors import VerifyError
from trainledger.load.hf import load_hf_config
from trainledger.load.plan import build_plan, parse_inputs


class PhasePeaks:
    """Per-phase peak allocated/reserved bytes from CUDA's caching allocator (no-op on CPU).

    ``torch.cuda.reset_peak_memory_stats`` at every phase start, ``max_memory_allocated`` at its
    end; the maximum over all steps is kept.
    """

    def __init__(self, device: str) -> None:
        self.on = device == "cuda"
        self.allocated: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        self.phase: str | None = None

    def enter(self, phase: str) -> None:
        self.close()
        if self.on:
            import torch

            torch.cuda.reset_peak_memory_stats()
        self.phase = phase

    def close(self) -> None:
        if self.on and self.phase:
            import torch

            a, r = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            self.allocated[self.phase] = max(self.allocated.get(self.phase, 0), a)
            self.reserved[self.phase] = max(self.reserved.get(self.phase, 0), r)
        self.phase = None

    def to_dict(self) -> dict[str, Any]:
        self.close()
        if not self.on:
            return {"peak_allocated_bytes": None, "device": "cpu",
                    "note": "CPU has no allocator statistics; `verify memory --device cpu` measures tensors"}
        peak_phase = max(self.allocated, key=self.allocated.get) if self.allocated else None
        return {"peak_allocated_bytes": max(self.allocated.values(), default=0),
                "peak_reserved_bytes": max(self.reserved.values(), default=0), "peak_phase": peak_phase,
                "phase_peaks": dict(self.allocated), "phase_reserved": dict(self.reserved), "device": "cuda"}


def _seed(*parts: int) -> int:
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:6], "little")


class DistTrainer:
    """The plan's model on this rank, wrapped for data parallelism, with its optimizer."""

    def __init__(self, inputs: dict[str, Any], device: str, rank: int, world: int, seed: int = 0) -> None:
        import torch

        from trainledger.verify.build import build_model, check_measurable
        from trainledger.verify.train_step import make_optimizer

        self.inputs = parse_inputs(inputs, "plan")
        self.plan = build_plan(self.inputs)
        check_measurable(self.plan)
        self.recipe = self.plan.recipe
        if not self.recipe.is_training:
            raise VerifyError("the acceptance and scaling runs train; method inference has no step")
        self.device, self.rank, self.world, self.seed = device, rank, world, seed
        self.built = build_model(load_hf_config(self.inputs.model), self.recipe, device, seed)
        self.raw = self.built.model
        self.notes = list(self.built.notes)
        self.sharded = self.plan.layout.zero == 3 and world > 1
        self.model = self._wrap(self.raw)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.recipe, self.params, device, self.notes)
        self.scaler = torch.amp.GradScaler(device) if self.recipe.precision == "fp16-mixed" else None
        self.vocab = self.built.vocab_size
        self.n_params = sum(p.numel() for p in self.raw.parameters())
        self.memory = PhasePeaks(device)

    def _wrap(self, model: Any) -> Any:
        if self.world == 1:
            return model
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            from trainledger.verify.build import _decoder_layers

            for layer in _decoder_layers(model):
                fully_shard(layer)
            fully_shard(model)
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        if self.plan.layout.zero in (1, 2):
            self.notes.append(f"ZeRO-{self.plan.layout.zero} runs as DDP (replicated states) here")
        return DDP(model, device_ids=None if self.device == "cpu" else [self.model_device().index])

    def model_device(self) -> Any:
        return next(self.raw.parameters()).device

    def batch(self, step: int, micro: int) -> Any:
        """Token ids of (step, rank, micro): the same in every run of the same plan and seed."""
        import torch

        r = self.recipe
        g = torch.Generator().manual_seed(_seed(self.seed, step, self.rank, micro))
        ids = torch.randint(0, self.vocab, (r.micro_batch, r.seq_len), generator=g)
        return ids.to(self.model_device())

    def loss_of(self, model: Any, ids: Any) -> Any:
        from trainledger.verify.train_step import autocast_context

        with autocast_context(self.recipe, self.model_device().type):
            return model(input_ids=ids, labels=ids, use_cache=False).loss

    def step(self, step: int, status: Any = None) -> dict[str, Any]:
        """One optimizer step: grad_accum micro-batches (no_sync but the last), clip, step, zero."""
        import contextlib

        import torch

        r = self.recipe
        total = 0.0
        mem = self.memory
        for micro in range(r.grad_accum):
            if status:
                status.enter(f"forward step {step}")
            last = micro == r.grad_accum - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
            with sync:
                mem.enter("forward")
                loss = self.loss_of(self.model, self.batch(step, micro)) / r.grad_accum
                total += float(loss.detach())
                if status:
                    status.enter(f"backward step {step}")
                mem.enter("backward")
                (self.scaler.scale(loss) if self.scaler else loss).backward()
        if status:
            status.enter(f"optimizer step {step}")
        mem.enter("optimizer")
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip = r.grad_clip if r.grad_clip is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip, foreach=True)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mem.close()
        return {"step": step, "loss": total, "grad_norm": norm,
                "tokens": r.grad_accum * r.micro_batch * r.seq_len}

    # ------------------------------------------------------------------ checksums
    def local_tensors(self) -> list[tuple[str, Any]]:
        out = []
        for name, p in self.raw.named_parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            out.append((name, t))
        return out

    def checksum(self) -> str:
        """sha256 over this rank's parameter bytes (its shard under FSDP, the replica under DDP)."""
        import torch

        h = hashlib.sha256()
        for name, t in self.local_tensors():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optimizer": optim_sd}

    def save(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self.state(), checkpoint_id=path)

    def load(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        st = self.state()
        dcp.load(st, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=st["model"],
                       optim_state_dict=st["optimizer"])


def _host_grads(params: list[Any]) -> list[Any]:
    """This rank's gradients (local shards under FSDP) copied to host memory as fp32."""
    out = []
    for p in params:
        g = p.grad
        if g is not None:
            g = g.to_local() if hasattr(g, "to_local") else g
            g = g.detach().to("cpu", copy=True).float()
        out.append(g)
    return out


def grad_accum_check(tr: DistTrainer, rtol: float) -> dict[str, Any]:
    """Accumulated gradients of two parts of a batch vs one backward over the whole batch.

    With micro-batch b >= 2 the planned micro-batch is split into rows [0, b//2) and [b//2, b)
    (so the check never needs more memory than the plan); with b = 1 two micro-batches are joined
    (a batch of 2, skipped with a note when that does not fit). Each part's mean loss is weighted by
    its share of the rows: every row has the same number of labelled tokens, so the weighted sum
    equals the joint batch's mean loss and the gradients must agree up to rounding. The
    accumulated gradients are kept in host memory, not on the device.
    """
    import torch

    model = tr.raw
    params = [p for p in model.parameters() if p.requires_grad]
    full = tr.batch(-1, 0)
    b = full.shape[0]
    parts = [full[: b // 2], full[b // 2:]] if b >= 2 else [full, tr.batch(-1, 1)]
    joint = full if b >= 2 else torch.cat(parts)
    rows = joint.shape[0]
    try:
        for ids in parts:
            (tr.loss_of(model, ids) * (ids.shape[0] / rows)).backward()
        acc = _host_grads(params)
        model.zero_grad(set_to_none=True)
        tr.loss_of(model, joint).backward()
        ref = _host_grads(params)
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        return {"ok": None, "rtol": rtol, "relative_error": None,
                "skipped": "a joint batch of 2 samples does not fit next to the model (micro-batch 1)"}
    model.zero_grad(set_to_none=True)
    pairs = [(x, y) for x, y in zip(acc, ref) if x is not None and y is not None]
    num = math.sqrt(sum(float((x - y).pow(2).sum()) for x, y in pairs))
    den = math.sqrt(sum(float(y.pow(2).sum()) for _, y in pairs)) or 1.0
    rel = num / den
    how = f"2 halves of micro-batch {b}" if b >= 2 else "2 micro-batches of 1"
    return {"relative_error": rel, "rtol": rtol, "ok": rel <= rtol, "how": how}
