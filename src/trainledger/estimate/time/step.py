"""Step time, throughput, MFU/HFU and time-to-train of a Plan: the cost model of issue 4.

One optimizer step of a pipeline replica runs m = grad_accum micro-batches through p stages:

    step = m · t_mb + bubble + DP sync (exposed) + optimizer + data/host overhead
    t_mb = compute (GEMMs, attention, streaming kernels, kernel overhead; see ``work.py``)
           + exposed TP, CP, EP, PP and FSDP communication of one micro-batch
    bubble = (p-1)/v · t_mb   — 1F1B: bubble share (p-1)/(m+p-1) of the step (Narayanan et al.
             2021, arXiv:2104.04473, §2.2.1); interleaved with v virtual stages: (p-1)/v (§2.2.2)

What overlaps (and what does not):
* DP gradient all-reduce / ZeRO-1 reduce-scatter: bucketed and overlapped with the backward pass of
  the last micro-batch (PyTorch DDP, Li et al. 2020, arXiv:2006.15704; Megatron
  --overlap-grad-reduce); the last bucket is always exposed.
* FSDP / ZeRO-3 parameter all-gathers and gradient reduce-scatters: prefetched, overlapped with the
  micro-batch's compute; only the excess and the first unit's gather are exposed (Zhao et al.
  2023, arXiv:2304.11277, §3.3).
* TP (and SP) collectives: on the critical path between GEMMs — exposed, unless the runtime
  overlaps them (``TimeOptions.tp_comm_overlap``: Megatron-Core + Transformer Engine userbuffers).
* CP ring exchanges: overlapped with the attention of the same layer (Liu et al. 2023, Ring
  Attention, arXiv:2310.01889); the excess is exposed.
* EP all-to-all (dispatch and combine): exposed, unless the runtime overlaps it with the other
  micro-batch's compute (``TimeOptions.ep_comm_overlap``: DeepSeek-V3 DualPipe, arXiv:2412.19437
  §3.2.1). PP sends: exposed (small).
* Optimizer step and the bubble: exposed by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from trainledger.spec.layers import stage_tensors
from trainledger.spec.model import ModelSpec
from trainledger.spec.plan import Plan
from trainledger.units import DTYPE_BYTES, SECONDS_PER_DAY, SECONDS_PER_HOUR
from trainledger.estimate.time.comm import Topology, all_gather_s, all_reduce_s, p2p_s, topology
from trainledger.estimate.time.dispatch import dispatch_note, dispatch_s
from trainledger.estimate.time.compute import (FlopCount, attention_core_recomputed, checkpoint_stops_early,
                                              early_stop_flops_per_token,
                                              layer_kinds, lora_gemms, recompute_fraction, step_flops)
from trainledger.estimate.time.efficiency import (GpuEfficiency, LinkEfficiency, gemm_time_s,
                                                 link_efficiency, wave_efficiency)
from trainledger.estimate.options import TimeOptions
from trainledger.estimate.optimizers import DISPATCHES_PER_TENSOR, FOREACH_EXTRA_ACCESSES, STATES_PER_PARAM, bytes_per_state
from trainledger.estimate.time.stack import StackProfile, stack_profile
from trainledger.estimate.stage import Stage
from trainledger.estimate.time.intervals import time_interval
from trainledger.estimate.time.work import StageWork, routing_imbalance, shared_expert_s, stage_work
from trainledger.estimate.time.allocator import RetryTerm, allocator_retries
from trainledger.estimate.memory.runtimes import (fsdp_sharded, lora_layer_params, pipeline_nosync,
                                                  reshard_after_forward)

#: Host <-> GPU copies for offload: PCIe Gen4 x16 is 31.5 GB/s per direction (PCI-SIG), ~25 GB/s
#: achieved by pinned-memory cudaMemcpy.
HOST_PCIE_BYTES_PER_S = 25e9
#: DeepSpeed CPU-Adam streams at about half the host memory bandwidth (Ren et al. 2021,
#: ZeRO-Offload, arXiv:2101.06840, §5: 6x faster than PyTorch CPU Adam, memory-bound).
CPU_ADAM_BW_FRACTION = 0.5


_PEAK: dict[tuple, float] = {}


def _peak(gpu, dtype: str) -> float:
    key = (gpu.name, gpu.bf16_tflops, gpu.fp8_tflops, gpu.fp32_tflops, gpu.mxfp8_tflops, gpu.fp4_tflops, dtype)
    v = _PEAK.get(key)
    if v is None:
        v = _PEAK[key] = gpu.peak_flop_per_s(dtype)
    return v


def matmul_dtype(plan: Plan) -> str:
    """The dtype the GEMMs run in: fp8 only where the GPU has fp8 tensor cores; the block-scaled
    recipes' mxfp8/nvfp4 (a plan on a GPU without those rates is refused before this)."""
    c = plan.recipe.policy["compute"]
    gemm = plan.recipe.policy.get("gemm")
    if gemm is not None and plan.cluster.gpu.has_native(gemm):
        return gemm
    if c == "fp8":
        return "fp8" if plan.cluster.gpu.has_native("fp8") else "bf16"
    return c


def _peak16(plan: Plan) -> float:
    c = plan.recipe.policy["compute"]
    return _peak(plan.cluster.gpu, "fp16" if c == "fp16" else ("fp32" if c == "fp32" else "bf16"))


@dataclass(frozen=True)
class ComputeEstimate:
    """FLOPs, step time and its breakdown, throughput, MFU and HFU of one plan."""

    flops: FlopCount
    step_time_s: float
    tokens_per_step: int
    gpus: int
    peak_flop_per_s: float
    matmul_dtype: str
    family: str
    breakdown: dict[str, float]
    compute_parts: dict[str, float]
    hidden_comm: dict[str, float]
    bubble_fraction: float
    notes: tuple[str, ...] = ()
    peak16_flop_per_s: float = 0.0
    stack: dict[str, Any] = field(default_factory=dict)

    def interval(self, calibrated: bool = False) -> dict[str, Any]:
        """p10/p90 of the step time from the accuracy suite's residuals (estimate/time/intervals.py)."""
        return time_interval(self.step_time_s, str(self.stack.get("framework", "hf")),
                             str(self.stack.get("gpu_family", self.family)), calibrated, self.gpus)

    @property
    def model_flops_per_step(self) -> float:
        return self.flops.model

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def mfu(self) -> float:
        return self.flops.model / (self.step_time_s * self.gpus * self.peak_flop_per_s)

    @property
    def hfu(self) -> float:
        return self.flops.hardware / (self.step_time_s * self.gpus * self.peak_flop_per_s)

    @property
    def model_flop_per_s_per_gpu(self) -> float:
        return self.flops.model / self.step_time_s / self.gpus

    @property
    def exposed_comm_s(self) -> float:
        return sum(v for k, v in self.breakdown.items() if k.startswith("comm_"))

    @property
    def exposed_comm_fraction(self) -> float:
        return self.exposed_comm_s / self.step_time_s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.flops.to_dict())
        d.update(
            step_time_s=self.step_time_s, tokens_per_step=self.tokens_per_step,
            tokens_per_s=self.tokens_per_s, tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
            mfu=self.mfu, hfu=self.hfu,
            mfu_causal=self.flops.model_causal / (self.step_time_s * self.gpus * self.peak_flop_per_s),
            model_tflop_per_s_per_gpu=self.model_flop_per_s_per_gpu / 1e12,
            peak_flop_per_s=self.peak_flop_per_s, matmul_dtype=self.matmul_dtype,
            efficiency_family=self.family, breakdown=dict(self.breakdown),
            compute_parts=dict(self.compute_parts), hidden_comm=dict(self.hidden_comm),
            exposed_comm_s=self.exposed_comm_s, exposed_comm_fraction=self.exposed_comm_fraction,
            bubble_fraction=self.bubble_fraction, notes=list(self.notes),
        )
        if self.stack:
            d["stack_profile"] = dict(self.stack)
            iv = self.interval()
            d["step_time_interval_s"] = iv
            d["tokens_per_s_per_gpu_interval"] = {
                "p10": self.tokens_per_s_per_gpu / iv["factor_p90"],
                "p90": self.tokens_per_s_per_gpu / iv["factor_p10"]}
            d["mfu_interval"] = {"p10": self.mfu / iv["factor_p90"], "p90": self.mfu / iv["factor_p10"]}
        if self.peak16_flop_per_s and self.peak16_flop_per_s != self.peak_flop_per_s:
            d["mfu_vs_16bit_peak"] = self.flops.model / (
                self.step_time_s * self.gpus * self.peak16_flop_per_s)
        return d


@dataclass(frozen=True)
class TimeEstimate:
    """Time to train a token budget: steps, wall-clock seconds, GPU-hours, scaling."""

    tokens: float
    steps: int
    total_s: float
    gpus: int
    scaling: list[dict[str, float]] = field(default_factory=list)
    interval: dict[str, Any] | None = None   # step-time factors p10/p90 (estimate/time/intervals.py)

    @property
    def days(self) -> float:
        return self.total_s / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.total_s * self.gpus / SECONDS_PER_HOUR

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tokens": self.tokens, "steps": self.steps, "total_s": self.total_s,
                             "days": self.days, "gpu_hours": self.gpu_hours, "gpus": self.gpus}
        if self.scaling:
            d["scaling"] = self.scaling
        if self.interval:
            lo, hi = self.interval["factor_p10"], self.interval["factor_p90"]
            d["days_interval"] = {"p10": self.days * lo, "p90": self.days * hi}
            d["gpu_hours_interval"] = {"p10": self.gpu_hours * lo, "p90": self.gpu_hours * hi}
            d["interval_basis"] = self.interval["basis"]
        return d


@dataclass(frozen=True, slots=True)
class _Comm:
    tp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0
    pp: float = 0.0
    fsdp: float = 0.0          # exposed per micro-batch
    fsdp_hidden: float = 0.0   # hidden per micro-batch
    tp_hidden: float = 0.0
    cp_hidden: float = 0.0
    ep_hidden: float = 0.0
    offload: float = 0.0
    fsdp_copy: float = 0.0     # FSDP2 copy-in/copy-out passes (compute stream)
    cp_merge: float = 0.0      # CP per-step output merge / gradient accumulation (compute stream)
    fsdp_step: float = 0.0     # exposed once per step (FSDP2 pipeline stages: ``_pipeline_fsdp``)
    fsdp_hidden_step: float = 0.0
    fsdp_copy_step: float = 0.0


class _Fsdp(NamedTuple):
    """Seconds of FSDP's per-unit collectives and copies: per micro-batch and once per step."""

    exposed: float = 0.0
    hidden: float = 0.0
    copy: float = 0.0
    exposed_step: float = 0.0
    hidden_step: float = 0.0
    copy_step: float = 0.0


def _stage_params(plan: Plan, ep_sharded: bool = False) -> float:
    """Parameters held by the busiest pipeline stage (before TP sharding).

    ``ep_sharded``: routed experts counted as this rank's 1/ep share (what an FSDP gather or a
    ZeRO shard of an expert-parallel layout moves: each EP rank owns E/ep experts, and expert
    weights are sharded over the expert-data-parallel group only; Megatron-Core MoE "parallel
    folding", Liu et al. 2025, arXiv:2504.14960, §3).
    """
    m, pp = plan.model, plan.layout.pp
    pc = m.params
    per_layer, outside = _layer_sums(m)
    lay = plan.layout
    if ep_sharded and m.moe is not None and (lay.ep > 1 or lay.expert_tp != lay.tp):
        # a rank holds E/(ep·etp) of the experts; the caller divides by tp, hence tp/(ep·etp)
        per_layer = per_layer - _busiest_layer_experts(m) * (1 - lay.tp / (lay.ep * lay.expert_tp))
    layers = math.ceil(m.num_layers / pp) * per_layer
    edge = pc.breakdown.get("lm_head", 0) or pc.embedding
    return float(layers + (edge if pp > 1 else outside))


@lru_cache(maxsize=64)
def _layer_sums(m: ModelSpec) -> tuple[int, int]:
    """(parameters of the largest decoder layer, parameters outside the decoder layers) of the
    model: ``_stage_params`` asks several times per step (a 405B has 126 layers to walk)."""
    pc = m.params
    return (max(pc.per_layer) if pc.per_layer else 0), pc.total - sum(pc.per_layer)


@lru_cache(maxsize=64)
def _busiest_layer_experts(m: ModelSpec) -> int:
    """Routed-expert parameters of the model's largest decoder layer (the first of them): a fact
    of the model, asked at every point of a scaling curve (``layer_params`` walks the layer)."""
    pc = m.params
    i = max(range(m.num_layers), key=lambda j: pc.per_layer[j])
    return m.layer_params(i).get("experts", 0)


def _trainable_stage_params(plan: Plan) -> float:
    r = plan.recipe
    if r.method not in ("lora", "qlora"):
        return _stage_params(plan)
    m = plan.model
    n_adapter = sum(k.count * sum(g.k * g.n * (g.experts or 1)
                                  for g in lora_gemms(m, k, r.lora_targets, r.lora_rank))
                    for k in layer_kinds(m))
    return n_adapter / plan.layout.pp


def _cp_comm(plan: Plan, topo: Topology, work: StageWork, prof: StackProfile, act: float,
             training: bool, rc: float) -> tuple[float, float, float]:
    """(total, exposed, merge) seconds of one micro-batch's context-parallel K/V exchange.

    Each CP rank holds s/c tokens; a layer's attention runs in c blockwise steps, one per K/V
    chunk, merged with the online-softmax rescaling (Liu et al. 2023, Ring Attention,
    arXiv:2310.01889). How the chunks travel is the stack's (``cp_rotate``):

    * ``ring``: before each of the c-1 later steps the chunk goes to the next rank (P2P), hidden
      behind the current step's attention; the backward sends K/V and the fp32 dK/dV partial sums
      (Megatron-Core / Transformer Engine CP, ``cp_comm_type=p2p``). Only the excess over the
      layer's attention is exposed.
    * ``allgather``: one all-gather of every rank's K/V per layer and pass, waited on after the
      first (diagonal) step — so it hides behind 1/c of the layer's attention only; the backward
      gathers K/V again and sends the fp32 dK/dV partial sums to the next rank after each of its
      c steps: each send is waited on after the next step's backward, the last one after the loop
      with nothing left to hide behind (PyTorch ``context_parallel``:
      ``_cp_options.rotate_method = ALL_GATHER``, the default, and
      ``_templated_ring_attention_backward``, whose dK/dV rotater is ``ALL_TO_ALL`` and whose
      final ``dkv_rotater.next_buffer()`` follows the loop;
      torch/distributed/tensor/experimental/_attention.py).

    ``cp_fused_sync``: with fused kernels (the stack's torch.compile of each block) the ring is
    traced into the compiled graph, where a functional collective is followed at once by its
    ``wait_tensor`` (torch/distributed/_functional_collectives.py, ``_maybe_wrap_tensor``: "if
    _are_we_tracing(): return wait_tensor(self)") and Inductor moves waits only with
    ``reorder_for_compute_comm_overlap`` (torch/_inductor/config.py, False by default): every
    exchange is exposed.

    ``cp_kv_expanded``: the stack exchanges K/V after ``repeat_kv`` (torchtitan's Llama calls
    repeat_kv before SDPA, so the CP hook sees n_heads K/V heads, not n_kv_heads).

    ``merge``: the stack's streaming work per blockwise step outside the attention kernel —
    the online-softmax merge of each step's output into the running fp32 output in the forward,
    the fp32 accumulation and rotation of dQ/dK/dV in the backward (``cp_merge_bytes``: bytes per
    element of the rank's attention output, per step, eager; ``cp_merge_bytes_fused`` when the
    kernels are fused; on the compute stream, never hidden). ``cp_kv_copies`` (eager only): the
    ring copies the rank's K/V at entry (``key.contiguous()``) and concatenates K|V before each
    later step (``torch.cat([key.flatten(), value.flatten()])``, built even where the all-gather
    rotater ignores it) — c copies of the chunk per pass; a compiled graph drops the unused ones
    and folds the layout copy into ``repeat_kv``.
    """
    lay, m = plan.layout, plan.model
    c = lay.cp
    if c <= 1:
        return 0.0, 0.0, 0.0
    tokens = Stage.of(plan).tokens_per_micro_batch
    width = (m.q_dim if prof.cp_kv_expanded else m.kv_dim) / lay.tp
    kv = tokens * 2 * width * act                      # this rank's K/V chunk
    layers = work.layers
    core_rc = attention_core_recomputed(plan.recipe, prof.selective_gemms)
    fwd_passes = (1.0 + rc + core_rc) if training else 1.0  # the ring runs again with the core
    fused = prof.kernels == "megatron"
    mb_f, mb_b = prof.cp_merge_bytes_fused if (fused and prof.cp_merge_bytes_fused) else prof.cp_merge_bytes
    out_el = tokens * m.q_dim / lay.tp   # elements of this rank's attention output
    hbm = plan.cluster.gpu.hbm_bytes_per_s * prof.eff.hbm
    merge = layers * c * out_el * (fwd_passes * mb_f + (mb_b if training else 0.0)) / hbm
    if prof.cp_kv_copies and not fused:
        passes = fwd_passes + (1.0 if training else 0.0)
        merge += layers * passes * c * 2.0 * kv / hbm    # read + write of the chunk per copy
    if prof.cp_rotate != "allgather":
        step = kv / topo.cp.beta + topo.cp.alpha
        t = layers * (c - 1) * step * ((1 + 2 + rc) if training else 1)
        exposed = t if (fused and prof.cp_fused_sync) else max(0.0, t - work.attention_s)
        return t, exposed, merge
    # the layer's forward attention (one pass): the attention time over its fwd/bwd/recompute mult
    a_fwd = work.attention_s / max(layers, 1.0) / (fwd_passes + (2.5 if training else 0.0))
    diag_f, diag_b = a_fwd / c, 2.5 * a_fwd / c
    ag = all_gather_s(topo.cp, c * kv)
    t = fwd_passes * ag
    exp = fwd_passes * max(0.0, ag - diag_f)
    if training:
        dkv = 2.0 * kv / topo.cp.beta + topo.cp.alpha   # fp32 dK/dV: twice the bf16 bytes
        t += ag + c * dkv
        exp += max(0.0, ag - diag_b) + (c - 1) * max(0.0, dkv - diag_b) + dkv
    if fused and prof.cp_fused_sync:
        exp = t
    return layers * t, layers * exp, merge


def chunk_share(plan: Plan) -> float:
    """Share of a stage's layers in its deepest model chunk: 1 without interleaving, 1/v with v
    virtual stages of equal depth (Narayanan et al. 2021, arXiv:2104.04473 §2.2.2: the interleaved
    bubble is (p-1)/v of a micro-batch's stage time). Uneven chunks (a stage's layers not divisible
    by v, as torch.distributed.pipelining allows) leave the warm-up and cool-down waiting on the
    deepest chunk: ceil(layers / v) of the stage's layers."""
    lay = plan.layout
    if lay.vp <= 1:
        return 1.0
    layers = Stage.of(plan).layers
    return math.ceil(layers / lay.vp) / layers


def bubble_s(plan: Plan, t_mb: float) -> float:
    """Seconds per step the busiest stage waits in the pipeline's warm-up and cool-down, ``t_mb``
    being one micro-batch's forward and backward on one stage.

    With m >= p micro-batches: (p-1)·t_mb, or (p-1)/v of it interleaved (``chunk_share``). With
    m < p there is nothing to interleave between: micro-batch j runs model chunk k on stage
    k mod p one chunk-step after micro-batch j-1, so no two micro-batches meet on a stage and the
    step takes the chain of p·v chunks plus m-1 chunk-steps, p·t + (m-1)·t/v per pass: a bubble
    of (p-m)·t_mb + (m-1)/v·t_mb, equal to (p-1)·t_mb at m = 1 whatever v is. Both agree at m = p;
    without interleaving either gives (p-1)·t_mb."""
    lay = plan.layout
    if lay.pp <= 1:
        return 0.0
    m = min(lay.pp_microbatches or plan.recipe.grad_accum, lay.pp)
    return ((lay.pp - m) + (m - 1) * chunk_share(plan)) * t_mb


def tp_overlap(plan: Plan, prof: StackProfile) -> float:
    """Share of the TP collectives the stack hides behind the GEMMs: the profile's (or the plan's,
    ``Runtime.tp_comm_overlap``), with sequence parallelism only (see ``_micro_batch_comm``)."""
    return prof.tp_overlap if plan.layout.sp else 0.0


def _micro_batch_comm(plan: Plan, topo: Topology, work: StageWork, opts: TimeOptions,
                      links: LinkEfficiency, prof: StackProfile) -> _Comm:
    m, r, lay, cl = plan.model, plan.recipe, plan.layout, plan.cluster
    training = r.is_training
    act = 4.0 if r.policy["compute"] == "fp32" else 2.0
    tokens = Stage.of(plan).tokens_per_micro_batch
    A = tokens * m.hidden_size * act
    layers = work.layers
    rc = recompute_fraction(plan) if training else 0.0
    n_tp = layers * (2 + (2 if training else 0) + 2 * rc) + 2
    if training and r.recompute == "selective" and lay.sp and prof.sac_regathers_tp:
        # op-level SAC keeps reduce-scatter outputs but not all-gather outputs: the backward
        # re-runs the layer's two sequence-parallel all-gathers (= one all-reduce's traffic)
        n_tp += layers
    t_tp = n_tp * all_reduce_s(topo.tp, A)
    if prof.tp_fp8_allgather and lay.sp and lay.tp > 1 and matmul_dtype(plan) == "fp8":
        # Float8 TP (torchao Float8ColwiseParallel / PrepareFloat8ModuleInput, Float8RowwiseParallel):
        # each sequence-parallel all-gather moves the activation (forward) or the gradient of the
        # reduce-scatter's output (backward) already cast to float8, 1 byte per element; the
        # reduce-scatters stay in bf16. Per layer and pass: 2 all-gathers (+2 SAC re-gathers).
        n_ag = layers * (2 + (2 if training else 0) + 2 * rc)
        if training and r.recompute == "selective" and prof.sac_regathers_tp:
            n_ag += 2 * layers
        t_tp -= n_ag * (all_gather_s(topo.tp, A) - all_gather_s(topo.tp, A * DTYPE_BYTES["fp8"] / act))
    # the overlap runs on sequence parallelism's all-gathers and reduce-scatters (Transformer Engine's
    # userbuffers: Megatron-LM asserts --sequence-parallel with --tp-comm-overlap; torch AsyncTP
    # micro-pipelines the SP all-gather/reduce-scatter around its matmuls); TP without SP all-reduces
    # between the GEMMs, exposed
    ov = tp_overlap(plan, prof)
    # each TP collective is launched on the critical path between two GEMMs
    tp_launch = n_tp * prof.collective_launch_s if lay.tp > 1 else 0.0
    t_cp, cp_exposed, cp_merge = _cp_comm(plan, topo, work, prof, act, training, rc)
    t_ep = ep_shared = 0.0
    if m.moe is not None and lay.ep > 1:
        moe_layers = layers * sum(m.moe_layer_mask) / m.num_layers  # is_moe_layer of every layer
        size = tokens * m.hidden_size * act / lay.tp
        busiest = r.expert_load(routing_imbalance(tokens * lay.ep * m.moe.top_k, lay.ep))
        one = dispatch_s(topo.ep, m.moe, plan.runtime.moe_dispatcher, size, cl, links, busiest)
        t_ep = moe_layers * (2 + (2 if training else 0) + 2 * rc) * one
        if plan.runtime.moe_shared_expert_overlap and plan.runtime.moe_dispatcher != "allgather":
            # the shared experts on a side stream under each pass's dispatch + combine: forward (and
            # its recomputation) hides up to their forward GEMMs, backward up to their dgrad + wgrad
            t_sh = shared_expert_s(plan, prof.eff, _peak(cl.gpu, matmul_dtype(plan)) * prof.clock_scale,
                                   matmul_dtype(plan))
            bwd = (1.0 if r.method in ("lora", "qlora") else 2.0) if training else 0.0
            ep_shared = moe_layers * (min(2 * one, t_sh) * (1 + rc)
                                      + (min(2 * one, bwd * t_sh) if training else 0.0))
    t_pp = 0.0
    if lay.pp > 1:
        size = A / lay.tp if lay.sp else A
        t_pp = (2 if training else 1) * lay.vp * p2p_s(cl, size, topo.pp_crosses_node, links)
    fs = _fsdp_comm(plan, topo, work, prof, rc) if (fsdp_shards(plan) and topo.dp.n > 1 and training) else _Fsdp()
    off = 0.0
    if lay.offload == "params":
        off = (2 if training else 1) * _stage_params(plan) / lay.tp * 2.0 / HOST_PCIE_BYTES_PER_S
    ep_exposed = t_ep - ep_shared
    if opts.ep_comm_overlap or plan.runtime.ep_comm_overlap:  # under another micro-batch's compute
        ep_exposed = max(0.0, ep_exposed - work.total_s)
    return _Comm(tp=t_tp * (1 - ov) + tp_launch, cp=cp_exposed, fsdp_copy=fs.copy, cp_merge=cp_merge,
                 ep=ep_exposed, pp=t_pp, fsdp=fs.exposed, fsdp_hidden=fs.hidden, tp_hidden=t_tp * ov,
                 cp_hidden=t_cp - cp_exposed, ep_hidden=t_ep - ep_exposed, offload=off,
                 fsdp_step=fs.exposed_step, fsdp_hidden_step=fs.hidden_step, fsdp_copy_step=fs.copy_step)


def _fsdp_comm(plan: Plan, topo: Topology, work: StageWork, prof: StackProfile, rc: float) -> _Fsdp:
    """FSDP's per-unit collectives (one unit per decoder layer) and the copies around them.

    Per micro-batch: an all-gather in forward, again in backward (unless the stack keeps the
    gathered weights: fsdp2 ``reshard_after_forward=False``, SHARD_GRAD_OP), a reduce-scatter of the
    unit's gradients — each with its own ring latency (Zhao et al. 2023, arXiv:2304.11277, §3.3).
    Prefetching hides a unit's collectives behind the neighbouring unit's compute of the same
    phase: the forward gathers behind the forward, the backward gathers and reduce-scatters (one
    communicator: NCCL runs them one after the other) behind the backward and its recomputation;
    the excess of each phase, the first gather and the last reduce-scatter are exposed.
    LoRA (``memory.runtimes.fsdp_parts``): FSDP2 gathers a layer's base and adapters as one group
    and reduces only the adapters; FSDP1 with the adapters inside the layer's flat unit forms and
    reduces the unit's whole flat gradient (the frozen part zero-filled).

    FSDP2 pipeline stages (``memory.runtimes.pipeline_nosync``) move them once per step instead."""
    r, lay, dp = plan.recipe, plan.layout, topo.dp
    p = _stage_params(plan, ep_sharded=True) / lay.tp
    units = max(1.0, float(work.layers))
    wb = 2.0 if r.policy["compute"] in ("bf16", "fp16", "fp8") else 4.0
    gb = reduce_bytes(plan)
    launch = prof.collective_launch_s
    regather = fsdp_regathers(plan)
    # parameters of the stage gathered and of those whose gradients are formed and reduced
    p_gather = p_grad = p
    if r.method in ("lora", "qlora"):  # as ``memory.runtimes.fsdp_parts`` holds them
        p_gather = p + lora_layer_params(plan) * units
        # FSDP1, the adapters in the layer's flat unit: its whole flat gradient (the frozen part
        # zero-filled) is formed and reduced; else only the adapters'
        p_grad = p_gather if plan.runtime.framework == "pytorch-fsdp" else p_gather - p
    # one gather and one reduce-scatter per unit (a decoder layer), each with its launch
    ag_u, rs_u = all_gather_s(dp, p_gather * wb / units), all_gather_s(dp, p_grad * gb / units)
    ag, rs = units * (ag_u + launch), units * (rs_u + launch)  # per pass over the stage
    edge = ag_u + rs_u
    fwd_share = 1.0 / (1.0 + (1.0 if r.method in ("lora", "qlora") else 2.0) + rc)
    w_fwd, w_bwd = work.total_s * fwd_share, work.total_s * (1 - fwd_share)
    hbm = plan.cluster.gpu.hbm_bytes_per_s * prof.eff.hbm
    if pipeline_nosync(plan):
        return _pipeline_fsdp(plan, p_gather, p_grad, wb, gb, ag, rs, ag_u, w_fwd, w_bwd, hbm, prof)
    t_fwd, t_bwd = ag, (ag if regather else 0.0) + rs
    t = t_fwd + t_bwd
    exposed = max(edge, max(0.0, t_fwd - w_fwd) + max(0.0, t_bwd - w_bwd)) if prof.fsdp_prefetch else t
    # the copies around the collectives, on the compute stream: FSDP2's copy-out and copy-in,
    # FSDP1's flat-gradient passes, the stack's estimate for the others (DeepSpeed)
    copy = 0.0
    if plan.runtime.framework == "fsdp2":
        copy = (p_gather * fsdp2_copy_bytes(wb, 0.0, regather) + p_grad * (wb + gb)) / hbm
    elif plan.runtime.framework == "pytorch-fsdp":
        copy = p_grad * flat_gradient_bytes(wb, gb) / hbm
    elif prof.fsdp_copy_passes:
        copy = prof.fsdp_copy_passes * (2 * p_gather * wb + p_grad * max(gb, 4.0)) / hbm
    return _Fsdp(exposed, t - exposed, copy)


def _pipeline_fsdp(plan: Plan, p_gather: float, p_grad: float, wb: float, gb: float, ag: float, rs: float,
                   edge: float, w_fwd: float, w_bwd: float, hbm: float, prof: StackProfile) -> _Fsdp:
    """FSDP2's collectives and copies on a pipeline stage (``memory.runtimes.pipeline_nosync``), per step.

    Gathers: a group gathered stays gathered after its backward, so with
    ``reshard_after_forward=False`` (torchtitan's default under PP) the stage gathers once per step,
    in its first forward; with ``True`` every backward gathers again (the forward resharded), and
    the forwards before the first backward gather too (1F1B's warm-up: up to pp of them on the first
    stage, the busiest one). Each gather hides behind the forward or backward it prefetches for.
    Reduce-scatter: once per step, after the stage's last backward (``perform_reduce_grad``
    issues every group's reduce back to back): nothing is left to overlap it on the first stage,
    which finishes last, so all of it is exposed.
    Copies (:func:`fsdp2_nosync_copy_bytes`, counted against torch by
    tests/unit/test_gradient_copy_passes.py): a copy-out per gather (2 x wb); each micro-batch's
    unsharded gradient is kept: the first cast to the reduce dtype (``to_accumulated_grad_if_needed``:
    wb + gb), each later one added to it (``accumulate_unsharded_grad_if_needed``: wb + 2 gb; in the
    param dtype autograd's in-place accumulation: 3 wb); one copy-in of the sum before the
    reduce-scatter (2 gb)."""
    m = plan.recipe.grad_accum
    regather = reshard_after_forward(plan)
    fwd_gathers = min(m, plan.layout.pp) if regather else 1
    bwd_gathers = m if regather else 0

    def exposed(t: float, window: float) -> float:
        return max(edge, t - window) if prof.fsdp_prefetch else t

    ag_exposed = fwd_gathers * exposed(ag, w_fwd) + bwd_gathers * exposed(ag, w_bwd)
    ag_total = (fwd_gathers + bwd_gathers) * ag
    copy = (p_gather * fsdp2_nosync_copy_bytes(wb, 0.0, m, fwd_gathers + bwd_gathers)
            + p_grad * fsdp2_nosync_copy_bytes(wb, gb, m, 0))
    return _Fsdp(exposed_step=ag_exposed + rs, hidden_step=ag_total - ag_exposed, copy_step=copy / hbm)


def fsdp2_nosync_copy_bytes(wb: float, gb: float, micro_batches: int, gathers: int) -> float:
    """HBM bytes per parameter per step of FSDP2's copies on a pipeline stage (gradient sync only
    after the last micro-batch; see :func:`_pipeline_fsdp`): a copy-out per gather, the unsharded
    gradient's cast (first micro-batch) and accumulation (the others), one copy-in. ``gb`` = 0: a
    frozen base (LoRA), no gradient passes."""
    copy = 2 * wb * gathers
    if gb:
        later = wb + 2 * gb if gb != wb else 3 * wb
        copy += (wb + gb if gb != wb else 0.0) + (micro_batches - 1) * later + 2 * gb
    return copy


def _tp_decomposition_s(plan: Plan, prof: StackProfile, peak: float, dtype: str) -> float:
    """Extra GEMM seconds of one micro-batch when TP overlap splits each TP GEMM into tp chunks.

    PyTorch AsyncTP (torch._inductor micro-pipeline TP: fused all-gather+matmul and
    matmul+reduce-scatter) runs a TP GEMM as tp GEMMs of M/tp rows each, one per arriving shard.
    Each piece fills its last wave of SM tiles only partly, so the split GEMM runs at
    wave_efficiency(M/tp, N) instead of wave_efficiency(M, N) (the PyTorch AsyncTP post names this
    cost: discuss.pytorch.org/t/209487, "wave quantization"). The split passes: the forward of
    column-parallel GEMMs (output N = n/tp) and the input-gradient (dgrad) of row-parallel GEMMs
    (output k/tp); the other passes have the full hidden size as N and lose nothing.
    """
    lay, r, m = plan.layout, plan.recipe, plan.model
    if not (prof.tp_overlap_chunks and tp_overlap(plan, prof) > 0 and lay.tp > 1):
        return 0.0
    eff, tp = prof.eff, lay.tp
    M = Stage.of(plan).tokens_per_micro_batch
    hbm = plan.cluster.gpu.hbm_bytes_per_s
    eta = eff.matmul_max(dtype)
    bpe = DTYPE_BYTES.get(dtype, 2.0)
    training = r.is_training
    fwd_mult = 1.0 + (recompute_fraction(plan) if training else 0.0) + (
        prof.selective_gemms if training and r.recompute == "selective" else 0.0)
    share = math.ceil(m.num_layers / lay.pp) / m.num_layers
    extra = 0.0
    for kind in layer_kinds(m):
        for g in kind.gemms:
            if g.experts or g.split not in ("col", "row"):
                continue
            if g.split == "col":     # forward: (M x k) @ (k x n/tp)
                k, n, passes = g.k, g.n / tp, fwd_mult
            else:                    # dgrad: (M x n) @ (n x k/tp)
                k, n, passes = g.n, g.k / tp, (1.0 if training else 0.0)
            if not passes:
                continue
            t = gemm_time_s(M * g.mult, k, n, peak, hbm, eff, eta, bpe)
            loss = (wave_efficiency(M * g.mult, n, eff, k)
                    / wave_efficiency(M * g.mult / tp, n, eff, k))
            extra += kind.count * share * passes * t * max(0.0, loss - 1.0)
    return extra


def fsdp_shards(plan: Plan) -> bool:
    """Whether each micro-batch gathers and reduce-scatters parameters per FSDP unit: ZeRO-3 on any
    stack, and every plan of an FSDP stack, as the memory model holds them
    (``memory.runtimes.fsdp_sharded``): zero 0 or 3 is FULL_SHARD, 1 or 2 SHARD_GRAD_OP. Except
    FSDP2 stages under torch.distributed.pipelining with zero 1/2: the schedule runs every
    micro-batch but the last without gradient sync and keeps the parameters gathered (the memory
    model's ``pipeline_nosync``), so they move once per step, as ZeRO-1/2's data-parallel sync."""
    lay = plan.layout
    if lay.zero == 3:
        return True
    if not fsdp_sharded(plan):
        return False
    return lay.zero == 0 or not pipeline_nosync(plan)


def fsdp_regathers(plan: Plan) -> bool:
    """Whether the backward gathers a unit's parameters again: on an FSDP stack unless it keeps
    them from the forward (``reshard_after_forward=False``, or SHARD_GRAD_OP under ``--zero 1/2``:
    the memory model's ``runtimes.reshard_after_forward``); always under another stack's ZeRO-3."""
    return reshard_after_forward(plan) if fsdp_sharded(plan) else True


def fsdp2_copy_bytes(wb: float, gb: float, regather: bool) -> float:
    """HBM bytes per parameter per micro-batch of FSDP2's copies (``fully_shard``).

    Each all-gather lands in one flat buffer that is copied out into the per-parameter tensors
    (``split_with_sizes_copy``: a read and a write in the param dtype ``wb``), in the forward and
    again in the backward unless the layer kept its gathered weights
    (``reshard_after_forward=False``); the gradients are copied into the reduce-scatter input in
    the reduce dtype (``torch._chunk_cat``: ``wb`` read, ``gb`` written; none for a frozen base,
    ``gb`` = 0). The division by the world size runs inside NCCL (``ReduceOp.AVG`` for fp32 and
    bf16 since pytorch/pytorch PRs #120919 and #123362, 2024), with no pass of its own.
    Source: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (``foreach_all_gather_copy_out``,
    ``foreach_reduce``); counted against torch 2.13 by tests/unit/test_gradient_copy_passes.py."""
    return 2 * wb * (2 if regather else 1) + (wb + gb if gb else 0.0)


def flat_gradient_bytes(wb: float, gb: float) -> float:
    """HBM bytes per parameter per micro-batch that FSDP1 spends forming a unit's reduce-scatter
    input (``pytorch-fsdp``: one FlatParameter per wrapped unit).

    The unit's parameters are views of its flat parameter (``FlatParamHandle._get_unflat_views``:
    ``torch.split`` of the flat tensor, then ``view``), so autograd hands the unit's gradient to the
    flat parameter through the split's backward, which concatenates the views' gradients into one
    new flat tensor: one read and one write of the gradient in the compute dtype (``wb``). FSDP's
    post-backward hook then casts it to the reduce dtype when that differs (Composer's 'DEFAULT'
    mixed precision from 0.16.4: bf16 compute, fp32 reduce; ``wb`` read + ``gb`` written) and
    divides it in place by the gradient pre-divide factor before the reduce-scatter (a read and a
    write in the reduce dtype; the factor exceeds 1 on every sharded group, 2 or more ranks:
    ``_get_gradient_predivide_factor``; "quite expensive", pytorch/pytorch issue #128918, where FSDP2
    dropped it). Sources: torch/distributed/fsdp/_flat_param.py,
    _runtime_utils.py ``_post_backward_hook`` / ``_reduce_grad`` (torch 2.x), the same steps in
    torch 1.13's fully_sharded_data_parallel.py ``_post_backward_hook``. FSDP2 forms its
    reduce-scatter input by its own copy-in (:func:`fsdp2_copy_bytes`).
    The cast and the divide run on FSDP's post-backward stream beside the next unit's backward;
    memory-bound kernels there take SMs and HBM bandwidth from it, so their passes are counted
    like the compute stream's (no measurement separates them)."""
    cast = wb + gb if gb != wb else 0.0
    return 2 * wb + cast + 2 * gb


def reduce_bytes(plan: Plan) -> float:
    """Bytes per gradient element the data-parallel reduction moves: the gradients' dtype, or bf16
    when a mixed policy reduces in bf16 — FSDP MixedPrecision(reduce_dtype=bf16) (FSDP1
    MixedPrecision / FSDP2 MixedPrecisionPolicy; Composer's 'PURE' mode: only the reduced shard is
    cast to the fp32 parameter's dtype), Megatron --grad-reduce-in-bf16, NeMo grad_sync_dtype: bf16
    (the same buffer the memory model keeps)."""
    r = plan.recipe
    gb = float(DTYPE_BYTES[r.policy["grads"]])
    if r.precision.endswith("-mixed") and plan.runtime.reduce_dtype == "bf16":
        return min(gb, 2.0)
    return gb


def _dp_sync(plan: Plan, topo: Topology, work: StageWork, prof: StackProfile,
             links: LinkEfficiency) -> tuple[float, float]:
    """(exposed, hidden) seconds of the once-per-step DP sync (ZeRO 0/1/2).

    ZeRO-0: all-reduce of the gradients, overlapped with the last micro-batch's backward.
    ZeRO-1/2 (Megatron distributed optimizer, DeepSpeed): reduce-scatter of the gradients
    (overlapped with the last backward; ZeRO-2 with every backward) and all-gather of the updated
    16-bit parameters, overlapped with the next step's first forward (--overlap-param-gather).
    """
    r, lay = plan.recipe, plan.layout
    if not r.is_training or topo.dp.n <= 1 or fsdp_shards(plan):
        return 0.0, 0.0
    if r.method in ("lora", "qlora"):
        p = _trainable_stage_params(plan) / lay.tp
    else:
        p = _stage_params(plan, ep_sharded=True) / lay.tp
    g = p * reduce_bytes(plan)
    bwd, fwd = work.total_s * (2.0 / 3.0), work.total_s / 3.0
    if lay.zero == 0:
        parts = [(all_reduce_s(topo.dp, g), bwd, all_reduce_s(topo.dp, min(g, links.dp_bucket_bytes)))]
    else:
        rs = all_gather_s(topo.dp, g)
        if lay.zero == 2:  # reduce-scatter after every micro-batch's backward
            rs_exposed = max(0.0, rs - bwd) * (r.grad_accum - 1)
            rs_win = bwd
        else:
            rs_exposed, rs_win = 0.0, bwd
        ag = all_gather_s(topo.dp, p * 2.0)
        bucket = all_gather_s(topo.dp, min(g, links.dp_bucket_bytes))
        parts = [(rs, rs_win, bucket), (ag, fwd, 0.0), (rs_exposed, 0.0, 0.0)]
    total = sum(t for t, _, _ in parts)
    if not prof.dp_overlap:
        return total, 0.0
    exposed = sum(max(last, t - window) for t, window, last in parts)
    return exposed, total - exposed


#: share of the step above which the time notes name the weight- and gradient-sized copies
COPIES_NOTE_SHARE = 0.05


def _passes_text(plan: Plan, bd: dict[str, float]) -> str:
    """What the copies of ``bd`` are, for the note above."""
    out = []
    if bd.get("amp_weight_passes", 0.0):
        out.append("autocast's fp32->16-bit weight casts every forward and the fp32 gradient's cast "
                   "and accumulation; 16-bit weights, --precision bf16, have none")
    if bd.get("ddp_copy", 0.0):
        out.append("DDP's bucket copies" + ("" if plan.runtime.gradient_as_bucket_view
                                            else "; --gradient-as-bucket-view halves them"))
    if bd.get("fsdp_copy", 0.0):
        out.append({"pytorch-fsdp": "FSDP1's flat-gradient concatenation, cast and pre-divide",
                    "fsdp2": "FSDP2's copy-out after each all-gather and copy-in before each "
                             "reduce-scatter"}.get(plan.runtime.framework, "the ZeRO buffers' copies"))
    return "; ".join(out)


def ddp_copy_s(plan: Plan, topo: Topology, prof: StackProfile) -> float:
    """Seconds per step of DDP's gradient copies (``hf`` with data parallelism and no ZeRO: torch
    DistributedDataParallel), once per optimizer step (the Trainer accumulates under ``no_sync``).

    The reducer copies each gradient into its bucket, dividing by the world size on the way
    (``Reducer::mark_variable_ready_dense``: ``at::mul_out(bucket_view, grad, 1/div_factor)``, one
    read and one write of the gradient), and after the all-reduce copies the bucket back into
    ``.grad`` (``finalize_bucket_dense``/``copy_bucket_to_grad``): a second read and write. With
    ``gradient_as_bucket_view`` the gradients are the bucket views: one in-place divide only
    (torch/csrc/distributed/c10d/reducer.cpp). Memory-bound passes on the compute stream."""
    r, lay = plan.recipe, plan.layout
    if (not r.is_training or topo.dp.n <= 1 or lay.zero != 0
            or plan.runtime.framework != "hf"):
        return 0.0
    passes = 1 if plan.runtime.gradient_as_bucket_view else 2
    p = _trainable_stage_params(plan) / lay.tp
    gb = float(DTYPE_BYTES[r.policy["grads"]])
    return passes * 2 * p * gb / (plan.cluster.gpu.hbm_bytes_per_s * prof.eff.hbm)


#: HBM bytes per weight element of autocast's cast (fp32 -> 16-bit: read 4, write 2) and of the
#: cast's backward (the 16-bit weight gradient -> fp32: read 2, write 4)
AMP_CAST_BYTES = 6.0
#: an fp32 gradient accumulated into ``.grad`` (AccumulateGrad's ``add_``: read 4 + 4, write 4)
GRAD_ACCUMULATE_BYTES = 12.0


def amp_weight_passes_s(plan: Plan, prof: StackProfile) -> tuple[float, float]:
    """(seconds per micro-batch, seconds per step) of the weight-sized passes of torch AMP on fp32
    weights: the ``hf`` stack without ZeRO (one GPU or DDP; FSDP and DeepSpeed gather 16-bit weights).

    Autocast casts every linear layer's fp32 weight to the 16-bit compute dtype each time it runs
    (torch.amp.autocast: the cast copy is kept only within one autocast region; aten ``_to_copy``),
    so once per forward and again per recomputed layer; the backward of that cast turns the 16-bit
    weight gradient into fp32. From the second micro-batch of a step on, AccumulateGrad adds each
    new fp32 gradient into ``.grad`` (the first is taken over as is: the Trainer zeroes with
    ``set_to_none``). A frozen fp32 base (LoRA on an fp32 checkpoint) is cast, with no gradient.
    Counted op by op against torch (tests/unit/test_gradient_copy_passes.py)."""
    r, lay, m = plan.recipe, plan.layout, plan.model
    if (not r.is_training or plan.runtime.framework != "hf" or lay.zero != 0
            or not r.precision.endswith("-mixed") or r.policy["weights"] != "fp32"):
        return 0.0, 0.0
    pc = m.params
    layers = math.ceil(m.num_layers / lay.pp) * (max(pc.per_layer) if pc.per_layer else 0) / lay.tp
    head = m.vocab_size * m.hidden_size / lay.tp  # the lm_head's matmul (tied or not), last stage
    rc = recompute_fraction(plan)
    cast = AMP_CAST_BYTES * ((layers + head) + rc * layers)
    trainable = r.method not in ("lora", "qlora")
    grad = AMP_CAST_BYTES * (layers + head) if trainable else 0.0
    accumulate = (GRAD_ACCUMULATE_BYTES * _stage_params(plan) / lay.tp * (r.grad_accum - 1)
                  if trainable else 0.0)
    hbm = plan.cluster.gpu.hbm_bytes_per_s * prof.eff.hbm
    return (cast + grad) / hbm, accumulate / hbm


def _optimizer_s(plan: Plan, eff: GpuEfficiency, topo: Topology, adamw_fused: bool = True,
                 dispatch_s: float = 0.0) -> float:
    """Time of the optimizer step over this GPU's shard of the trainable parameters: the longer of
    its HBM streaming and its host dispatch.

    The bytes: one pass over weights, gradients and states (plus the gradient's norm and reduce
    accesses), and the extra accesses of a multi-kernel (foreach) implementation
    (``optimizers.FOREACH_EXTRA_ACCESSES``, in the states' dtype); ``adamw_fused``: the stack's
    ``adamw`` is its own fused Adam (DeepSpeed, Megatron), which has none; torch's fused AdamW
    (``adamw-fused``) has none on any stack.
    ``dispatch_s``: the stack's host seconds per parameter tensor per optimizer op (FSDP2: every
    parameter is a DTensor, whose ops go through sharding propagation tensor by tensor; pytorch
    issue #134191). The host issues the step's kernels op by op, so when that takes longer than
    the kernels themselves the GPU waits for it: a foreach AdamW (8 ops per tensor,
    ``optimizers.DISPATCHES_PER_TENSOR``) is host-bound where the fused one (1 op) is not."""
    r, lay, cl = plan.recipe, plan.layout, plan.cluster
    if not r.is_training:
        return 0.0
    p = _trainable_stage_params(plan) / lay.tp
    if lay.zero >= 1 or fsdp_shards(plan):
        p /= max(1, topo.dp.n)
    pol = r.policy
    sb = bytes_per_state(r.optimizer, pol["states"])
    wb, gb = DTYPE_BYTES[pol["weights"]], DTYPE_BYTES[pol["grads"]]
    mb = DTYPE_BYTES.get(pol["master"], 0.0) if pol["master"] != "none" else 0.0
    per = 2 * STATES_PER_PARAM[r.optimizer] * sb + 3 * gb + (2 * mb + wb if mb else 2 * wb)
    if lay.offload in ("optimizer", "params"):
        host_bw = cl.host_mem_bw_gb_per_s * 1e9 / cl.gpus_per_node * CPU_ADAM_BW_FRACTION
        return p * per / host_bw + p * (gb + wb) / HOST_PCIE_BYTES_PER_S
    extra = 0 if (r.optimizer == "adamw" and adamw_fused) else FOREACH_EXTRA_ACCESSES[r.optimizer]
    gpu_s = p * (per + extra * DTYPE_BYTES[pol["states"]]) / (cl.gpu.hbm_bytes_per_s * eff.hbm)
    if r.optimizer == "adamw-loop":
        # a per-tensor loop launches each op as its own kernel for every tensor: at least the
        # family's per-kernel overhead each, however small the tensor
        dispatch_s = max(dispatch_s, eff.kernel_overhead_s)
    if dispatch_s <= 0:
        return gpu_s
    lora = r.lora_targets if r.method in ("lora", "qlora") else None
    host_s = dispatch_s * DISPATCHES_PER_TENSOR[r.optimizer] * stage_tensors(plan.model, lay.pp, lora)
    return max(gpu_s, host_s)


class StepFigures(NamedTuple):
    """The step of one plan before it is presented: what ``estimate_compute`` reports and what a
    scaling-curve point reads (``point_figures``)."""

    bd: dict[str, float]        # seconds per step by term (before ``--mfu`` forcing)
    step: float                 # seconds per step (``--mfu`` applied)
    flops: FlopCount
    work: StageWork
    comm: _Comm
    hidden: dict[str, float]
    prof: StackProfile
    peak_mm: float
    peak16: float
    dtype: str
    clk: float
    retry: RetryTerm


def _step_figures(plan: Plan, opts: TimeOptions, shared_work: list[StageWork] | None,
                  shared_flops: list[FlopCount] | None = None, brief: bool = False) -> StepFigures:
    """``brief``: only the step's seconds are read (a scaling-curve point): the allocator term
    may stop at a bound of its stage's memory (``phases.allocator_pressure``)."""
    gpu, lay, r = plan.cluster.gpu, plan.layout, plan.recipe
    rt = plan.runtime
    prof = stack_profile(rt.framework, gpu, opts, rt.kernels, rt.tp_comm_overlap)
    eff = prof.eff
    links = link_efficiency()
    dtype = matmul_dtype(plan)
    peak_mm, peak16 = _peak(gpu, dtype), _peak16(plan)
    clk = prof.clock_scale  # power limit: compute-bound rates follow the tensor clock
    if shared_work:
        work = shared_work[0]
    else:
        work = stage_work(plan, eff, peak_mm * clk, peak16 * clk, dtype, prof.kernels,
                          prof.selective_gemms, prof.xent_bytes(plan.runtime.fused_loss),
                          prof.lora_fp32_adapters, checkpoint_stops_early(plan))
        if shared_work is not None:
            shared_work.append(work)
    topo = topology(plan.cluster, lay.tp, lay.cp, lay.ep, lay.dp_size, lay.pp, links, lay.expert_tp)
    c = _micro_batch_comm(plan, topo, work, opts, links, prof)
    waves = _tp_decomposition_s(plan, prof, peak_mm * clk, dtype)
    amp_mb, amp_step = amp_weight_passes_s(plan, prof)
    t_mb = (work.total_s + c.tp + c.cp + c.ep + c.pp + c.fsdp + c.offload + c.fsdp_copy
            + c.cp_merge + waves + amp_mb)
    m = r.grad_accum
    bubble = bubble_s(plan, t_mb)
    dp_exp, dp_hidden = _dp_sync(plan, topo, work, prof, links)
    if shared_flops:
        flops = shared_flops[0]
    else:
        flops = step_flops(plan)
        if shared_flops is not None:
            shared_flops.append(flops)
    opt_s = _optimizer_s(plan, eff, topo, prof.adamw_fused, prof.optimizer_dispatch_s)
    bd = {
        "compute": m * work.total_s, "comm_tp": m * c.tp, "comm_cp": m * c.cp, "comm_ep": m * c.ep,
        "comm_pp": m * c.pp, "comm_dp": m * c.fsdp + c.fsdp_step + dp_exp, "offload": m * c.offload,
        "fsdp_copy": m * c.fsdp_copy + c.fsdp_copy_step, "ddp_copy": ddp_copy_s(plan, topo, prof),
        "amp_weight_passes": m * amp_mb + amp_step,
        "cp_merge": m * c.cp_merge, "tp_split_waves": m * waves,
        "bubble": bubble, "optimizer": opt_s, "data": prof.host_step_s,
    }
    hidden = {"tp": m * c.tp_hidden, "cp": m * c.cp_hidden, "ep": m * c.ep_hidden,
              "dp": m * c.fsdp_hidden + c.fsdp_hidden_step + dp_hidden}
    bd["overlap_contention"] = links.overlap_slowdown * sum(hidden.values())
    # near-capacity memory (estimate/time/allocator.py); a scaling-curve point reads only its seconds
    retry = allocator_retries(plan, brief=brief)
    bd["allocator_retries"] = retry.seconds
    step = sum(bd.values())
    if opts.mfu is not None:
        step = flops.model / (plan.cluster.world_size * peak_mm * opts.mfu)
    return StepFigures(bd, step, flops, work, c, hidden, prof, peak_mm, peak16, dtype, clk, retry)


def point_figures(plan: Plan, opts: TimeOptions, shared_work: list[StageWork],
                  shared_flops: list[FlopCount] | None = None) -> dict[str, float]:
    """A scaling-curve point of ``plan``: the figures ``estimate_compute(plan, opts, shared_work)``
    reports for it (step time, tokens/s, per GPU, MFU), computed the same way, without its notes and
    breakdown (a point shows none). ``shared_flops``: a holder for the step's FLOPs (``step_flops``),
    the same at every point of a curve (one global batch of one model and recipe): the first point
    derives them, the others read them."""
    f = _step_figures(plan, opts, shared_work, shared_flops, brief=True)
    gpus = plan.cluster.world_size
    tokens_per_s = plan.tokens_per_step / f.step
    return {"step_time_s": f.step, "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / gpus,
            "mfu": f.flops.model / (f.step * gpus * f.peak_mm)}


def estimate_compute(plan: Plan, opts: TimeOptions | None = None,
                     shared_work: list[StageWork] | None = None) -> ComputeEstimate:
    """FLOPs, step time (with breakdown), tokens/s, MFU and HFU of ``plan``.

    ``shared_work``: a holder for the compute work of one micro-batch on the busiest stage
    (``work.stage_work``), which does not depend on the data-parallel degree, the accumulation or
    the node count: plans that differ only in those (the scaling curve) derive it once."""
    opts = opts or TimeOptions()
    f = _step_figures(plan, opts, shared_work)
    gpu, lay = plan.cluster.gpu, plan.layout
    bd, flops, work, hidden, prof = f.bd, f.flops, f.work, f.hidden, f.prof
    eff, clk, retry, peak_mm = prof.eff, f.clk, f.retry, f.peak_mm
    m = plan.recipe.grad_accum
    bubble = bd["bubble"]
    step = sum(bd.values())
    kernels = "fused" if prof.kernels == "megatron" else ("unfused except Liger's" if plan.liger else "unfused")
    notes = [f"stack profile: catalog/efficiency/stacks/{prof.framework}.yaml on {eff.family} "
             f"(catalog/efficiency/{eff.family}.yaml); kernels {kernels}, TP comm "
             f"{100 * tp_overlap(plan, prof):.0f}% overlapped"
             + (f"; stated by the plan: {', '.join(prof.stated)}" if prof.stated else "")
             + (f"; overrides: {', '.join(prof.overrides)}" if prof.overrides else "")]
    if lay.tp > 1 and not lay.sp and prof.tp_overlap > 0:
        notes.append("TP comm overlap needs sequence parallelism (--sp): without it the TP all-reduces run "
                     "exposed between the GEMMs")
    if clk < 1.0:
        notes.append(f"power limit {gpu.power_limit_w:g} W of {gpu.tdp_w:g} W TDP: tensor clock "
                     f"x{clk:.3f} (DVFS cube law, estimate/time/stack.py)")
    if lay.pp > 1 and m < lay.pp:
        # fewer micro-batches than stages: the pipeline never fills, and each stage idles at least
        # as long as it computes ((p-1)/(m+p-1) >= 1/2 of the step; Narayanan et al. 2021 §2.2.1)
        p4 = 4 * lay.pp  # m = 4·p leaves (p-1)/(5p-1) < 20% of the ideal step idle
        notes.append(f"pipeline never fills: {m} micro-batch{'es' if m > 1 else ''} per step for {lay.pp} "
                     f"stages, the bubble is {100 * bubble / step:.0f}% of the step; --grad-accum {p4} "
                     f"(1F1B idles {100 * (lay.pp - 1) / (p4 + lay.pp - 1):.0f}%) shrinks it; interleaved stages "
                     "(--vp) help only once there are as many micro-batches as stages")
    layers = Stage.of(plan).layers
    if lay.vp > 1 and layers % lay.vp:
        notes.append(f"uneven virtual stages: {layers} layers per stage in {lay.vp} chunks, the deepest "
                     f"{math.ceil(layers / lay.vp)} layers deep, sets the bubble; Megatron-LM needs --vp to "
                     "divide the stage's layers")
    note = dispatch_note(plan)
    if note:
        notes.append(note)
    if retry.pressure.note():
        notes.append(f"{retry.pressure.note()}; allocator_retries prices each at "
                     f"{1e3 * retry.retry_s:g} ms (catalog/runtime/cuda.yaml)")
    if plan.recipe.is_training and plan.recipe.recompute == "full":
        skips = early_stop_flops_per_token(plan)
        if skips:
            notes.append("full recomputation stops early (torch's non-reentrant checkpoint): each layer's "
                         "last GEMM (MLP down, or its LoRA B where an adapter wraps it) is not re-run; "
                         "--no-checkpoint-early-stop for a reentrant one "
                         "(transformers < 5 by default, deepspeed.checkpointing)")
        elif checkpoint_stops_early(plan):
            notes.append("full recomputation re-runs every GEMM: a norm, dropout or MoE combine after the "
                         "last one keeps the checkpoint's early stop from skipping it")
    passes = bd.get("amp_weight_passes", 0.0) + bd.get("ddp_copy", 0.0) + bd.get("fsdp_copy", 0.0)
    if passes > COPIES_NOTE_SHARE * step:
        notes.append(f"{1e3 * passes:.1f} ms ({100 * passes / step:.0f}%) of the step are weight- and "
                     "gradient-sized copies (" + _passes_text(plan, bd) + "): they scale with the "
                     "parameters, not the tokens, so fewer, larger micro-batches amortize them")
    if flops.hardware < flops.model:
        notes.append("HFU < MFU: the flash kernel skips the masked half of the causal score matrix, "
                     "while model FLOPs count the full s×s product (Megatron/PaLM convention)")
    if opts.mfu is not None:
        forced = f.step
        bd = {k: v * forced / step for k, v in bd.items()}
        notes.append(f"step time forced by --mfu {opts.mfu:g} (breakdown scaled proportionally)")
        step = forced
    parts = {"matmul": m * work.matmul_s, "attention": m * work.attention_s,
             "elementwise": m * work.elementwise_s, "kernel_overhead": m * work.overhead_s}
    return ComputeEstimate(
        flops=flops, step_time_s=step, tokens_per_step=plan.tokens_per_step,
        gpus=plan.cluster.world_size, peak_flop_per_s=peak_mm, matmul_dtype=f.dtype,
        family=eff.family, breakdown={k: v for k, v in bd.items() if v or k == "compute"},
        compute_parts=parts, hidden_comm={k: v for k, v in hidden.items() if v},
        bubble_fraction=bubble / step if step else 0.0, notes=tuple(notes), peak16_flop_per_s=f.peak16,
        stack=prof.summary(),
    )


def estimate_time(plan: Plan, comp: ComputeEstimate,
                  scaling: list[dict[str, float]] | None = None) -> TimeEstimate | None:
    """Time to train the plan's token budget (None when the recipe has no ``train_tokens``)."""
    tokens = plan.recipe.train_tokens
    if not tokens:
        return None
    steps = math.ceil(tokens / comp.tokens_per_step)
    return TimeEstimate(tokens=tokens, steps=steps, total_s=steps * comp.step_time_s,
                        gpus=comp.gpus, scaling=scaling or [],
                        interval=comp.interval() if comp.stack else None)

