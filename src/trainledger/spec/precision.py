"""The precision policy a job runs under: the default per method, hardware checks, and its text.

When the user names no precision, the policy is the one the reference runtime (transformers +
peft + the Trainer) ends up with for that method:

* ``pretrain`` and ``full``: fp32 weights, gradients and AdamW states with bf16 autocast
  (``Trainer(bf16=True)`` on a model built by ``from_config`` — whose parameters take torch's default
  dtype, fp32 — or loaded with ``dtype=torch.float32``): ``bf16-mixed``.
  Note: transformers >= 5 loads a checkpoint in its stored dtype (``from_pretrained(dtype="auto")``
  is the default, transformers v5 release notes), so a full fine-tune of a bf16 checkpoint that is
  not loaded in fp32 trains pure bf16: that is ``--precision bf16``.
* ``lora`` and ``qlora``: the frozen base stays in the checkpoint's dtype (``dtype="auto"``; qlora:
  bitsandbytes 4-bit with the other weights in that dtype) and peft keeps the adapters, their
  gradients and optimizer states in fp32 (``get_peft_model(autocast_adapter_dtype=True)``, the
  default since peft 0.12, peft/tuners/tuners_utils.py ``_cast_adapter_dtype``): ``bf16`` for a bf16
  checkpoint, ``fp16`` for an fp16 one, ``bf16-mixed`` for an fp32 one (fp32 base under autocast).
* ``inference``: the weights in the checkpoint's dtype, no autocast (``bf16``/``fp16``/``fp32``).

A GPU without bf16 tensor cores (the datasheet gives no bf16 rate: V100, T4) falls back to the
fp16 variant of the default, and says so; a precision named explicitly that the GPU cannot run
(bf16 on V100/T4, fp8 without fp8 tensor cores) is an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainledger.errors import PlanError
from trainledger.spec.recipe import BLOCK_SCALED, Recipe

if TYPE_CHECKING:
    from trainledger.spec.cluster import GpuSpec
    from trainledger.spec.model import ModelSpec

#: checkpoint dtype -> policy that keeps it (LoRA base, inference); an fp32 checkpoint trains under autocast
_KEEP = {"bf16": "bf16", "fp16": "fp16"}
_NO_BF16 = {"bf16-mixed": "fp16-mixed", "bf16": "fp16"}


def default_precision(method: str, model: "ModelSpec | None", gpu: "GpuSpec | None") -> tuple[str, str]:
    """(precision, why) the reference runtime runs ``method`` under on ``gpu``; see the module docstring."""
    ckpt = (model.checkpoint_dtype if model is not None else None) or "bf16"
    stated = "" if model is None or model.checkpoint_dtype else " (config.json states no dtype: bf16 assumed)"
    if method in ("pretrain", "full"):
        prec, why = "bf16-mixed", f"default for {method}: fp32 weights, grads and optimizer states, bf16 autocast"
    elif method in ("lora", "qlora"):
        prec = _KEEP.get(ckpt, "bf16-mixed")
        base = "4-bit base, other weights" if method == "qlora" else "frozen base"
        why = (f"default for {method}: {base} in the checkpoint's {ckpt}{stated} as transformers loads it, "
               f"no autocast (the Trainer's default), adapters, their grads and optimizer states fp32 as peft keeps them")
    else:
        prec = _KEEP.get(ckpt, "fp32")
        why = f"default for inference: weights in the checkpoint's {ckpt}{stated} as transformers loads them"
    if gpu is not None and prec in _NO_BF16 and not gpu.has_native("bf16"):
        prec = _NO_BF16[prec]
        why += f"; fp16 instead of bf16 because {gpu.display_name} has no bf16 tensor cores"
    return prec, why


def check_precision(precision: str, gpu: "GpuSpec") -> None:
    """Refuse a precision the GPU has no tensor cores for (an explicit choice; defaults fall back)."""
    if precision in ("bf16", "bf16-mixed") and not gpu.has_native("bf16"):
        raise PlanError(f"{gpu.display_name} has no bf16 tensor cores (its datasheet lists no bf16 rate): "
                        f"bf16 matmuls would run without them. Use --precision "
                        f"{_NO_BF16[precision]}, or leave --precision out for the GPU's default")
    if precision == "fp8-mixed" and not gpu.has_native("fp8"):
        raise PlanError(f"{gpu.display_name} has no fp8 tensor cores (fp8 needs Hopper, Ada, Blackwell or "
                        f"MI300): use --precision bf16-mixed, or a GPU with fp8 support")
    if precision in BLOCK_SCALED and not gpu.has_native(BLOCK_SCALED[precision]):
        field = {"mxfp8": "mxfp8_tflops", "nvfp4": "fp4_tflops"}[BLOCK_SCALED[precision]]
        fallback = "fp8-mixed" if gpu.has_native("fp8") else "bf16-mixed"
        raise PlanError(field="precision", message=
                        f"{gpu.display_name} has no block-scaled {BLOCK_SCALED[precision]} tensor cores (its "
                        f"catalog entry gives no {field}; MX/NVFP4 GEMMs need Blackwell): use --precision "
                        f"{fallback}, or a GPU whose datasheet lists {field}")


def check_recipe_method(precision: str, method: str) -> None:
    """The block-scaled recipes are training recipes: serving picks its weight format with --quantization."""
    if precision in BLOCK_SCALED and method == "inference":
        raise PlanError(field="precision", message=
                        f"--precision {precision} is a training recipe (Transformer Engine block scaling); "
                        f"for inference keep bf16 and choose --quantization nvfp4 (W4A4) or fp8")


def policy_text(r: Recipe, model: "ModelSpec", gpu: "GpuSpec") -> str:
    """What a plan's precision keeps in which dtype, and whether it was the method's default."""
    pol = r.policy
    lora = r.method in ("lora", "qlora")
    if r.method == "inference":
        what = f"weights {pol['weights']}, compute {pol['compute']}"
    elif lora:
        base = "4-bit base + " + ("bf16" if pol["compute"] == "bf16" else pol["compute"]) if r.method == "qlora" \
            else f"frozen base {pol['weights']}"
        what = f"{base}, adapters + grads + optimizer states fp32, compute {pol['compute']}"
    else:
        master = "" if pol["master"] == "none" else f", master {pol['master']}"
        comp = pol["compute"]
        if "gemm" in pol:
            kept = r.bf16_layers(model.num_layers)
            comp = (f"linear-layer GEMMs {pol['gemm']}" + (f" except {kept} of {model.num_layers} layers in bf16"
                                                          if kept else "") + ", other ops bf16")
        what = (f"weights {pol['weights']}{master}, grads {pol['grads']}, optimizer states {pol['states']}, "
                f"compute {comp}")
    prec, why = default_precision(r.method, model, gpu)
    if prec == r.precision:
        return f"{r.precision} ({what}; {why})"
    return f"{r.precision} ({what}; chosen with --precision, the default for {r.method} here is {prec})"
