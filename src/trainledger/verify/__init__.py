"""Verification on the real machine: the only package of trainledger that imports torch.

torch, transformers and peft are imported lazily inside functions, so ``import trainledger.verify``
stays cheap and works without them; calling a measurement without them raises
:class:`~trainledger.errors.MissingDependency` naming ``pip install 'trainledger[verify]'``.

Memory measurement (ground truth of the memory model)::

    from trainledger.verify.measure import measure_memory
    m = measure_memory(plan, device="cpu" | "fake" | "cuda")

See :mod:`trainledger.verify.measure` for the result's fields and the CPU-vs-CUDA differences,
and :mod:`trainledger.verify.memtrace` for the storage-exact tracker and its categories.
"""

from __future__ import annotations

from typing import Any

__all__ = ["measure_memory", "measure_memory_from_config", "CATEGORIES", "PHASES"]

#: Categories of a memory breakdown (same as trainledger.verify.memtrace.CATEGORIES, torch-free).
CATEGORIES: tuple[str, ...] = (
    "weights", "gradients", "optimizer_states", "autocast_weight_copies", "logits",
    "optimizer_temporaries", "activations", "other", "sharding_buffers",
)
#: Phases of a training step (inference runs have "forward" and "decode").
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "zero_grad")


def measure_memory(plan: Any, device: str = "cpu", steps: int = 2, seed: int = 0) -> Any:
    """Measure a plan's peak memory; see :func:`trainledger.verify.measure.measure_memory`."""
    from trainledger.verify.measure import measure_memory as _measure

    return _measure(plan, device=device, steps=steps, seed=seed)


def measure_memory_from_config(hf_config: dict[str, Any], recipe: Any, device: str = "cpu",
                               steps: int = 2, seed: int = 0) -> Any:
    """Measure a raw config.json mapping; see :mod:`trainledger.verify.measure`."""
    from trainledger.verify.measure import measure_memory_from_config as _measure

    return _measure(hf_config, recipe, device=device, steps=steps, seed=seed)
