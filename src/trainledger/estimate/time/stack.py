"""Stack profiles: what the software stack (``--framework``) changes in the time of the same work.

The same plan runs at a different speed under Megatron-Core + Transformer Engine, PyTorch FSDP2,
DeepSpeed or a Hugging Face Trainer, on the same GPUs. A :class:`StackProfile` holds, for one
framework on one GPU family (catalog/efficiency/stacks/<framework>.yaml):

* GEMM efficiency per dtype, **capped by the family's measured best-shape GEMM rate**
  (``matmul_best_shape`` in catalog/efficiency/<family>.yaml): no stack beats cuBLASLt's best tile
  on a square GEMM;
* attention efficiency of the stack's fused attention kernel;
* fused (TE / Apex / torch.compile) or unfused (PyTorch eager modules) elementwise kernels, which
  selects the streaming bytes per layer in :mod:`trainledger.estimate.time.work`;
* which collectives overlap: the share of TP traffic hidden behind GEMMs, FSDP prefetch, DP bucket
  overlap;
* the fixed cost of each collective launched on the critical path (charged per layer collective:
  TP all-reduces, FSDP all-gathers and reduce-scatters), and FSDP2's copy-in/copy-out passes;
* the optimizer step's HBM passes (fused Adam = 1, foreach AdamW more), and its host dispatch per
  parameter tensor where parameters are DTensors (FSDP2): the step takes the longer of the two;
* the HBM bytes of its cross-entropy loss per logit (Megatron's unfused vocab-parallel loss makes
  more passes over fp32 logits than PyTorch's log-softmax);
* a fixed host cost per optimizer step;
* whether its full recomputation stops early (torch's non-reentrant checkpoint) or re-runs the
  whole layer (``Runtime.checkpoint_early_stop`` overrides it per plan).

What the plan states about its run wins over the profile: its kernels (``Runtime.kernels``, e.g.
a torchtitan TOML with compile on) and whether its TP collectives overlap (``Runtime.tp_comm_overlap``,
e.g. a Megatron script's ``--tp-comm-overlap``). The user's time-model overrides (``TimeOptions``:
``--runtime`` for the kernels, ``--no-grad-overlap``, ``--matmul-efficiency``; ``tp_comm_overlap`` for
API callers) win over both. The power limit of the GPU
(``--power-limit-w``) scales the compute-bound rates through :func:`clock_scale`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from trainledger.spec.cluster import GpuSpec
from trainledger.errors import CatalogError
from trainledger.estimate.time.efficiency import GpuEfficiency, for_gpu, link_efficiency
from trainledger.estimate.options import TimeOptions

#: Exponent of the DVFS power law: dynamic power P = C·V²·f with the voltage scaled along with the
#: clock, so P ∝ f³ and f ∝ P^(1/3) (Mittal & Vetter 2014, "A survey of methods for analyzing and
#: improving GPU energy efficiency", ACM Computing Surveys 47(2), §2.1). The static part (the
#: GPU's idle power) does not scale with the clock.
DVFS_EXPONENT = 1.0 / 3.0
#: idle power as a share of TDP when the GPU file does not state it (same default as energy.py)
IDLE_FRACTION = 0.2


@dataclass(frozen=True, slots=True)
class StackProfile:
    """How one software stack runs on one GPU family (see the module docstring)."""

    framework: str
    family: str
    eff: GpuEfficiency           # the family's parameters with the stack's GEMM/attention rates
    kernels: str                 # 'megatron' (fused) | 'hf' (unfused): key of work.KERNEL_BYTES
    tp_overlap: float
    fsdp_prefetch: bool
    fsdp_copy_passes: float
    dp_overlap: bool
    collective_launch_s: float
    adamw_fused: bool            # the stack's 'adamw' is its own fused Adam (one pass), not torch's foreach
    host_step_s: float
    optimizer_dispatch_s: float = 0.0  # host seconds per parameter tensor per optimizer op (DTensor)
    selective_gemms: float = 0.0
    checkpoint_early_stop: bool = False  # full recompute stops at the last tensor the backward needs
    cp_rotate: str = "ring"        # 'ring' (P2P per step) | 'allgather' (one gather per layer)
    cp_kv_expanded: bool = False   # K/V exchanged after repeat_kv (n_heads, not n_kv_heads)
    cp_merge_bytes: tuple[float, float] = (0.0, 0.0)   # (fwd, bwd) bytes per output element per CP step
    cp_merge_bytes_fused: tuple[float, float] | None = None  # the same when kernels are fused (compiled)
    cp_kv_copies: bool = False       # eager ring copies the K/V chunk once per step (entry + per-step cat)
    cp_fused_sync: bool = False      # fused (compiled) runs wait on each CP collective where it is issued
    tp_overlap_chunks: bool = False  # TP overlap runs each TP GEMM as tp row chunks (AsyncTP)
    sac_regathers_tp: bool = False   # selective AC re-runs the SP all-gathers in the backward
    tp_fp8_allgather: bool = False   # fp8 recipes all-gather the SP activations/gradients in fp8
    lora_fp32_adapters: bool = False  # LoRA through peft, whose adapters of a 16-bit base are fp32
                                      # (work.PEFT_FP32_ADAPTER_BYTES)
    xent_bytes_per_vocab: float | None = None  # HBM bytes per logit of the loss, fwd + bwd
                                               # (None: PyTorch's, work.XENT_BYTES_PER_VOCAB)
    xent_bytes_per_vocab_fused: float | None = None  # the same with the stack's fused loss
    clock_scale: float = 1.0
    overrides: tuple[str, ...] = ()  # the user's time-model overrides (TimeOptions) applied
    stated: tuple[str, ...] = ()     # what the plan states over the profile (Runtime.kernels, .tp_comm_overlap)
    gpu: str = ""
    power_limit_w: float | None = None

    def xent_bytes(self, fused: bool) -> float | None:
        """HBM bytes per logit of the stack's loss (None: PyTorch's); ``fused``: the plan asks for
        the stack's fused loss (``Runtime.fused_loss``), where the stack has one."""
        if fused and self.xent_bytes_per_vocab_fused is not None:
            return self.xent_bytes_per_vocab_fused
        return self.xent_bytes_per_vocab

    def summary(self) -> dict[str, Any]:
        return {
            "framework": self.framework, "gpu_family": self.family,
            "file": f"catalog/efficiency/stacks/{self.framework}.yaml",
            "matmul_efficiency": dict(self.eff.matmul), "attention_efficiency": self.eff.attention,
            "kernels": "fused" if self.kernels == "megatron" else "unfused",
            "tp_comm_overlap": self.tp_overlap, "fsdp_prefetch": self.fsdp_prefetch,
            "fsdp_copy_passes": self.fsdp_copy_passes, "dp_overlap": self.dp_overlap,
            "collective_launch_s": self.collective_launch_s,
            "adamw_kernel": "fused" if self.adamw_fused else "foreach", "host_step_s": self.host_step_s,
            "optimizer_dispatch_s": self.optimizer_dispatch_s,
            "selective_recompute_gemms": self.selective_gemms,
            "checkpoint_early_stop": self.checkpoint_early_stop,
            "cp_rotate": self.cp_rotate, "cp_kv_expanded": self.cp_kv_expanded,
            "cp_merge_bytes": list(self.cp_merge_bytes),
            "cp_merge_bytes_fused": list(self.cp_merge_bytes_fused) if self.cp_merge_bytes_fused else None,
            "cp_kv_copies": self.cp_kv_copies, "cp_fused_sync": self.cp_fused_sync,
            "tp_overlap_chunks": self.tp_overlap_chunks, "sac_regathers_tp": self.sac_regathers_tp,
            "tp_fp8_allgather": self.tp_fp8_allgather,
            "xent_bytes_per_vocab": self.xent_bytes_per_vocab,
            "xent_bytes_per_vocab_fused": self.xent_bytes_per_vocab_fused,
            "clock_scale": self.clock_scale, "overrides": list(self.overrides),
            "stated": list(self.stated), "gpu": self.gpu, "power_limit_w": self.power_limit_w,
        }


def _dir() -> Path:
    return Path(str(resources.files("trainledger") / "catalog" / "efficiency" / "stacks"))


@lru_cache(maxsize=None)
def _stack_file(framework: str) -> dict[str, Any]:
    p = _dir() / f"{framework}.yaml"
    if not p.exists():
        raise CatalogError(f"no stack profile for framework {framework!r} "
                           f"(catalog/efficiency/stacks/{framework}.yaml)")
    d = yaml.safe_load(p.read_text(encoding="utf-8"))
    if not isinstance(d, dict) or not isinstance(d.get("defaults"), dict):
        raise CatalogError(f"{p}: expected a mapping with 'defaults'")
    return d


def stack_values(framework: str, family: str) -> dict[str, Any]:
    """The profile's keys for ``family``: defaults, then the family's overrides."""
    d = _stack_file(framework)
    out = dict(d["defaults"])
    fam = (d.get("families") or {}).get(family) or {}
    for k, v in fam.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


@lru_cache(maxsize=64)
def stops_early_by_default(framework: str, family: str = "") -> bool:
    """The stack's full recomputation stops early unless the plan says (``checkpoint_early_stop``
    in stacks/<framework>.yaml; read by the time model and by the importers' normalisation)."""
    return bool(stack_values(framework, family).get("checkpoint_early_stop", False))


@lru_cache(maxsize=64)
def tp_overlaps_by_default(framework: str, family: str = "") -> bool:
    """The stack overlaps its TP collectives unless the plan says (``tp_comm_overlap`` in
    stacks/<framework>.yaml: megatron-core on Hopper, as NeMo's recipes run it); read by the time
    model and by the importers' normalisation (a script stating the default states no choice)."""
    return float(stack_values(framework, family).get("tp_comm_overlap", 0.0)) > 0.0


def clock_scale(gpu: GpuSpec) -> float:
    """Sustained tensor-core clock under a power limit, relative to the TDP clock.

    f/f₀ = ((P_limit − P_idle) / (TDP − P_idle))^(1/3) (DVFS cube law on the dynamic share of the
    power); 1 when no limit is set or the limit is at or above TDP. Memory-bound kernels keep the
    HBM clock and are not scaled.
    """
    lim = getattr(gpu, "power_limit_w", None)
    if not lim or lim >= gpu.tdp_w:
        return 1.0
    idle = gpu.idle_w or IDLE_FRACTION * gpu.tdp_w
    dyn = max(lim - idle, 0.05 * gpu.tdp_w) / (gpu.tdp_w - idle)
    return min(1.0, dyn ** DVFS_EXPONENT)


_CACHE: dict[tuple, StackProfile] = {}


#: the stack whose attention is cuDNN's fused kernel (Transformer Engine's DotProductAttention):
#: its profile's ``attention_efficiency`` for a family is cuDNN's rate there
_CUDNN_STACK = "megatron-core"


def cudnn_attention_efficiency(gpu: GpuSpec) -> float:
    """η of cuDNN's fused attention on ``gpu``'s family (``--attention cudnn``, on any stack): the
    rate the megatron-core profile holds for that family, since that stack runs Transformer
    Engine's cuDNN attention (stacks/megatron-core.yaml: FlashAttention-3 paper's cuDNN bars on
    Hopper), else the family's own; one fact for every stack that selects the kernel."""
    fam = for_gpu(gpu)
    return _cudnn_rate(fam.family, fam.attention)


@lru_cache(maxsize=64)
def _cudnn_rate(family: str, family_rate: float) -> float:
    return float(stack_values(_CUDNN_STACK, family).get("attention_efficiency", family_rate))


def stack_profile(framework: str, gpu: GpuSpec, opts: TimeOptions | None = None,
                  stated_kernels: str | None = None, stated_tp_overlap: bool | None = None) -> StackProfile:
    """The profile of ``framework`` on ``gpu``'s family, with what the plan states (``stated_kernels``:
    fused | unfused, ``stated_tp_overlap``: the plan's ``Runtime.kernels`` and ``.tp_comm_overlap``,
    None = the profile's) and then the user's overrides applied."""
    opts = opts or TimeOptions()
    key = (framework, gpu.name, gpu.architecture, getattr(gpu, "power_limit_w", None), gpu.tdp_w, gpu.idle_w,
           opts.runtime, opts.tp_comm_overlap, opts.overlap_grad_reduce, opts.matmul_efficiency,
           stated_kernels, stated_tp_overlap)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    fam = for_gpu(gpu)
    v = stack_values(framework, fam.family)
    # the ceiling: the family's measured best-shape GEMM rate; a family without one (Blackwell, Ada,
    # CDNA, Volta: extrapolated, see their files) is capped at its own rate, so no stack is assumed
    # to beat an extrapolation (stacks/megatron-core.yaml's 0.90 is a "cut to the cap" value)
    best = fam.matmul_best or fam.matmul
    try:
        mm = {dt: min(float(x), float(best.get(dt, 1.0)))
              for dt, x in {**fam.matmul, **(v.get("matmul_efficiency") or {})}.items()}
        eff = replace(fam, matmul=mm, attention=float(v.get("attention_efficiency", fam.attention)),
                      kernel_overhead_s=float(v.get("kernel_overhead_s", fam.kernel_overhead_s)))
        kernels = {"fused": "megatron", "unfused": "hf"}[str(v.get("kernels", "unfused"))]
        tp_overlap = float(v.get("tp_comm_overlap", 0.0))
        prof = dict(fsdp_prefetch=bool(v.get("fsdp_prefetch", True)),
                    fsdp_copy_passes=float(v.get("fsdp_copy_passes", 0.0)),
                    dp_overlap=bool(v.get("dp_overlap", True)),
                    collective_launch_s=float(v.get("collective_launch_s", 0.0)),
                    adamw_fused={"fused": True, "foreach": False}[str(v.get("adamw_kernel", "foreach"))],
                    optimizer_dispatch_s=float(v.get("optimizer_dispatch_s", 0.0)),
                    host_step_s=float(v.get("host_step_s", link_efficiency().step_overhead_s)),
                    selective_gemms=float(v.get("selective_recompute_gemms", 0.0)),
                    checkpoint_early_stop=bool(v.get("checkpoint_early_stop", False)),
                    cp_rotate=str(v.get("cp_rotate", "ring")),
                    cp_kv_expanded=bool(v.get("cp_kv_expanded", False)),
                    cp_merge_bytes=(float((v.get("cp_merge_bytes") or {}).get("fwd", 0.0)),
                                    float((v.get("cp_merge_bytes") or {}).get("bwd", 0.0))),
                    cp_merge_bytes_fused=(
                        (float(v["cp_merge_bytes_fused"].get("fwd", 0.0)),
                         float(v["cp_merge_bytes_fused"].get("bwd", 0.0)))
                        if isinstance(v.get("cp_merge_bytes_fused"), dict) else None),
                    cp_kv_copies=bool(v.get("cp_kv_copies", False)),
                    cp_fused_sync=bool(v.get("cp_fused_sync", False)),
                    tp_overlap_chunks=bool(v.get("tp_overlap_chunks", False)),
                    sac_regathers_tp=bool(v.get("sac_regathers_tp", False)),
                    tp_fp8_allgather=bool(v.get("tp_fp8_allgather", False)),
                    lora_fp32_adapters=bool(v.get("lora_fp32_adapters", False)),
                    **{k: (float(v[k]) if v.get(k) is not None else None)
                       for k in ("xent_bytes_per_vocab", "xent_bytes_per_vocab_fused")})
        for k in ("xent_bytes_per_vocab", "xent_bytes_per_vocab_fused"):
            if prof[k] is not None and prof[k] <= 0:
                raise ValueError(f"{k} {prof[k]} (> 0)")
        if prof["cp_rotate"] not in ("ring", "allgather"):
            raise ValueError(f"cp_rotate {prof['cp_rotate']!r} (ring | allgather)")
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"catalog/efficiency/stacks/{framework}.yaml: invalid value ({exc})") from None
    over, stated = [], []
    if stated_kernels is not None:  # stated by the plan (an imported config's compile / TE layers)
        kernels = {"fused": "megatron", "unfused": "hf"}[stated_kernels]
        stated.append("kernels")
    if stated_tp_overlap is not None:
        tp_overlap = link_efficiency().tp_overlap_fraction if stated_tp_overlap else 0.0
        stated.append("tp_comm_overlap")
    if opts.matmul_efficiency is not None:
        eff = eff.with_matmul(opts.matmul_efficiency)
        over.append("matmul_efficiency")
    if opts.runtime is not None:
        kernels = opts.runtime
        over.append("runtime")
    if opts.tp_comm_overlap is not None:
        tp_overlap = link_efficiency().tp_overlap_fraction if opts.tp_comm_overlap else 0.0
        over.append("tp_comm_overlap")
    if not opts.overlap_grad_reduce:
        prof["dp_overlap"] = False
        over.append("overlap_grad_reduce")
    out = StackProfile(framework=framework, family=fam.family, eff=eff, kernels=kernels,
                       tp_overlap=tp_overlap, clock_scale=clock_scale(gpu), overrides=tuple(over), stated=tuple(stated),
                       gpu=gpu.name, power_limit_w=getattr(gpu, "power_limit_w", None), **prof)
    if len(_CACHE) > 512:
        _CACHE.clear()
    _CACHE[key] = out
    return out
