"""Host (CPU-side) resources per node: RAM for offloaded states, pinned buffers, DataLoader workers
and checkpoint staging; host memory bandwidth that CPU offload needs.

Glossary:
    N     trainable parameters            d   ZeRO shard group (dp · cp)     t, p  TP, PP degrees
    g     GPUs per node                   W   DataLoader workers per GPU     S     step time, s

    offloaded states per GPU  = N/(t·p·d') · (4 master + 4 grad + o)   [+ w params with offload=params]
    (ZeRO-Offload keeps fp32 master weights, fp32 gradients and the optimizer states on the CPU and
    runs the optimizer there: Ren et al. 2021, arXiv:2101.06840, §4.1; d' = d under ZeRO ≥ 1, else 1)
    host RAM per node = g · offloaded + g·W·worker RSS + pinned batches + checkpoint staging
    host traffic per step per node = g · N/(t·p·d') · (read 4+4+o, write 4+o, write w for the GPU copy,
                                     plus the gradient copy in and the weight copy out over PCIe)
    bandwidth needed = traffic / S   (the CPU optimizer step may take at most the whole step)

Pinned DataLoader batches: ``pin_memory=True`` with PyTorch's default ``prefetch_factor=2`` keeps
2 batches per worker in page-locked memory (torch.utils.data.DataLoader documentation); a batch is
input ids, labels and attention mask as int64 (8 bytes each per token).
"""

from __future__ import annotations

from typing import Any

from trainledger.spec.plan import Plan
from trainledger.units import DTYPE_BYTES, GB
from trainledger.estimate.run.checkpoint import expert_split, moe_shard_bytes, rank_share
from trainledger.estimate.run.common import RunFigures, Section, run_figures, state_bytes_per_param, trainable_params
from trainledger.estimate.options import CostOptions
from trainledger.estimate.run.prices import PriceCatalog, load_prices
from trainledger.estimate.terms import Term

FP32 = 4
PREFETCH_FACTOR = 2          # torch.utils.data.DataLoader default
INT64_TENSORS_PER_TOKEN = 3  # input_ids, labels, attention_mask


def offloaded_bytes_per_param(optimizer_bytes: float, weight_bytes: float, offload: str) -> float:
    """Host bytes per (sharded) parameter under CPU offload: fp32 master + fp32 grad + states (+ params)."""
    if offload == "none":
        return 0.0
    b = FP32 + FP32 + optimizer_bytes
    if offload == "params":
        b += weight_bytes
    return b


def offload_traffic_bytes_per_param(optimizer_bytes: float, gpu_weight_bytes: float) -> float:
    """Host-memory bytes moved per parameter per optimizer step on the CPU.

    Reads master, gradient and states; writes master and states; writes the GPU weight copy; the
    gradient arrives (DMA write) and the weight copy leaves (DMA read) over PCIe.
    """
    reads = FP32 + FP32 + optimizer_bytes
    writes = FP32 + optimizer_bytes + gpu_weight_bytes
    dma = FP32 + gpu_weight_bytes
    return reads + writes + dma


def pinned_batch_bytes(workers: int, micro_batch: int, seq_len: int) -> float:
    """Page-locked memory of prefetched batches: workers × prefetch_factor × b·s × 3 int64 tensors."""
    return workers * PREFETCH_FACTOR * micro_batch * seq_len * INT64_TENSORS_PER_TOKEN * 8


def _params_per_gpu(plan: Plan, n_train: int) -> float:
    """Trainable parameters whose states one GPU holds (sharded by tp·pp and ZeRO; routed experts
    by their expert-parallel split: the checkpoint section's rank share at one byte per state)."""
    return rank_share(plan, n_train, 0.0, 1.0)


def _offload_bandwidth(plan: Plan, params_per_node: float, b: dict[str, float], run: RunFigures,
                       v: dict[str, Any], terms: list[Term]) -> None:
    """Host traffic of the CPU optimizer step per node, and the bandwidth that fits it in one step."""
    traffic = params_per_node * offload_traffic_bytes_per_param(b["optimizer"], b["weights"])
    v["offload_traffic_bytes_per_step"] = traffic
    v["offload_step_s"] = traffic / v["host_bandwidth_bytes_per_s"]
    if run.step_time_s:
        need = traffic / run.step_time_s
        v["offload_bandwidth_bytes_per_s"] = need
        v["bandwidth_ok"] = need <= v["host_bandwidth_bytes_per_s"]
    terms.append(Term("offload_traffic_bytes_per_step", traffic, "bytes",
                      "host reads/writes of the CPU optimizer step plus PCIe copies"))


def offloaded_states_bytes(plan: Plan) -> float:
    """Host RAM per node that the plan's CPU offload holds (0 without offload): every GPU's share
    of the fp32 master weights, gradients and optimizer states (+ parameters with offload=params)."""
    if plan.layout.offload == "none":
        return 0.0
    b = state_bytes_per_param(plan)
    per_gpu = _params_per_gpu(plan, trainable_params(plan))
    return plan.cluster.gpus_per_node * per_gpu * offloaded_bytes_per_param(b["optimizer"], b["weights"],
                                                                              plan.layout.offload)


#: what each ``Runtime.model_loading`` mode holds on a node's host while the model loads
LOADING_TEXT = {
    "every-rank": "every process builds the whole model on the CPU",
    "rank0": "one process per node builds the model on the CPU, the others start on the meta device",
    "sharded": "each rank reads only its shard",
    "to-gpu": "the quantized weights go tensor by tensor to each rank's GPU (device_map)",
}


def model_loading(plan: Plan) -> str:
    """How the plan's model reaches its GPUs (``Runtime.loading``); QLoRA loads through
    bitsandbytes with a device map, each tensor quantized on its way to the GPU (transformers loads
    quantized checkpoints on every rank, never to the meta device: ``load_state_dict`` excludes
    ``is_quantized`` from its rank-0-only paths)."""
    if plan.recipe.method == "qlora":
        return "to-gpu"
    return plan.runtime.loading(plan.layout.zero, plan.layout.tp)


def model_load_bytes(plan: Plan) -> float:
    """Host RAM per node while the model loads, before training starts (``model_loading``):

    * every-rank: each of the node's g processes materializes the whole model in its weight dtype
      (``from_pretrained`` on every rank; e.g. 8 × 160 GB for Falcon-40B in fp32 on a DGX node,
      pytorch/pytorch#105840);
    * rank0: one copy per node (accelerate's ``cpu_ram_efficient_loading``: transformers'
      ``load_state_dict`` maps non-local-rank-0 processes to the meta device under FSDP, and every
      global rank > 0 under DeepSpeed ZeRO-3; FSDP's ``sync_module_states`` broadcasts the weights);
    * sharded: each rank's shard of the weights (``checkpoint.moe_shard_bytes``);
    * to-gpu (QLoRA): nothing lasting.
    Checkpoint files are read through the page cache, which the kernel reclaims; not counted."""
    mode = model_loading(plan)
    if mode == "to-gpu":
        return 0.0
    params = plan.model.params.total
    wb = float(DTYPE_BYTES[plan.recipe.policy["weights"]])
    g = plan.cluster.gpus_per_node
    if mode == "every-rank":
        return g * params * wb
    if mode == "rank0":
        return params * wb
    lay = plan.layout
    n_exp, _ = expert_split(plan)
    # an FSDP stack shards the weights at every --zero (memory.runtimes.fsdp_sharded); Megatron and
    # DeepSpeed below ZeRO-3 replicate them over data parallelism
    zero = 3 if plan.runtime.is_fsdp else lay.zero
    return g * moe_shard_bytes(params, n_exp, wb, 0.0, tp=lay.tp, pp=lay.pp, zero=zero, zero_shards=lay.zero_shards,
                               ep=lay.ep, etp=lay.expert_tp, expert_dp=lay.expert_dp)


def host_section(plan: Plan, options: CostOptions, memory: Any = None, compute: Any = None,
                 time: Any = None, prices: PriceCatalog | None = None,
                 checkpoint: Section | None = None) -> Section:
    """The ``host`` section: RAM per node by part vs installed, host bandwidth for CPU offload."""
    prices = prices or load_prices(options.prices_file)
    c, lay, r = plan.cluster, plan.layout, plan.recipe
    b = state_bytes_per_param(plan)
    n_train = trainable_params(plan)
    per_gpu = _params_per_gpu(plan, n_train)
    g = c.gpus_per_node
    d_workers = prices.default("dataloader_workers_per_gpu")
    workers = options.dataloader_workers if options.dataloader_workers is not None else int(d_workers.value)
    rss = prices.default("worker_ram_bytes")
    offload = offloaded_states_bytes(plan)
    pinned_batches = g * pinned_batch_bytes(workers, r.micro_batch, r.seq_len)
    staging = checkpoint.get("bytes_per_writer_node", 0.0) if checkpoint is not None else 0.0
    parts = {"offloaded_states_bytes": offload, "pinned_batch_bytes": pinned_batches,
             "dataloader_workers_bytes": g * workers * rss.value, "checkpoint_staging_bytes": staging}
    total = sum(parts.values())
    load = model_load_bytes(plan) if r.is_training else 0.0
    loading = model_loading(plan)
    v: dict[str, Any] = {"ram_bytes": total, **parts, "installed_ram_bytes": c.host_ram_bytes,
                         "ram_fits": None if c.host_ram_bytes is None else total <= c.host_ram_bytes,
                         "model_load_bytes": load, "model_loading": loading,
                         "load_fits": None if c.host_ram_bytes is None else load <= c.host_ram_bytes,
                         "offload_bandwidth_bytes_per_s": None,
                         "host_bandwidth_bytes_per_s": c.host_mem_bw_gb_per_s * GB,
                         "offload_step_s": None, "bandwidth_ok": True}
    inputs = {"trainable_params": n_train, "params_per_gpu": per_gpu, "gpus_per_node": g,
              "offload": lay.offload, "zero": lay.zero, "bytes_per_param": b, "workers_per_gpu": workers,
              "worker_ram_bytes": rss.value, "micro_batch": r.micro_batch, "seq_len": r.seq_len,
              "memory_model_host_bytes_per_gpu": getattr(memory, "host_bytes", None)}
    terms = [Term("offloaded_states_bytes", offload, "bytes", "Ren et al. 2021 (ZeRO-Offload), §4.1",
                  "fp32 master + fp32 grads + optimizer states on the CPU"),
             Term("dataloader_workers_bytes", parts["dataloader_workers_bytes"], "bytes", rss.source),
             Term("checkpoint_staging_bytes", staging, "bytes", "checkpoint section: bytes per writer node",
                  "async save stages a node's shards in host RAM before writing"),
             Term("model_load_bytes", load, "bytes", "transformers modeling_utils load_state_dict (meta device "
                  "off local rank 0 under FSDP cpu_ram_efficient_loading, off rank 0 under ZeRO-3); "
                  "pytorch/pytorch#105840", f"{loading}: {LOADING_TEXT[loading]}; "
                  "before training, not added to ram_bytes")]
    notes: list[str] = []
    if lay.offload != "none":
        _offload_bandwidth(plan, g * per_gpu, b, run_figures(plan, compute, time), v, terms)
    if c.host_ram_bytes is None:
        notes.append("host RAM: the node's installed RAM is not known for a PCIe card; give --host-ram-gib "
                     "to check the need against it")
    elif not v["ram_fits"]:
        notes.append(f"host RAM: {total / 2**30:,.0f} GiB needed per node, "
                     f"{c.host_ram_bytes / 2**30:,.0f} GiB installed")
    if v["load_fits"] is False:
        notes.append(_load_note(plan, load, c.host_ram_bytes))
    if not v["bandwidth_ok"]:
        notes.append("CPU offload needs more host memory bandwidth than the node has: the optimizer "
                     "step on the CPU will exceed the GPU step time")
    return Section(values=v, inputs=inputs, terms=terms, notes=notes)


def _load_note(plan: Plan, load: float, ram: float) -> str:
    """Why the model does not load in the node's RAM, and what does."""
    mode, fw = model_loading(plan), plan.runtime.framework
    if mode == "rank0":  # one copy per node is already too much: only a sharded load helps
        fix = ("a sharded load: --model-loading sharded (torchtitan's meta-device init + DCP, DeepSpeed "
               "ZeRO-3's zero.Init, Megatron's distributed checkpoint)")
    elif mode == "sharded":
        fix = "more nodes (each holds only its ranks' shards) or nodes with more RAM (--host-ram-gib)"
    else:
        fix = {"hf": "shard the load: --zero 3 (accelerate's FSDP loads on local rank 0), --framework "
                     "deepspeed --zero 3 (zero.Init) or --framework pytorch-fsdp",
               "deepspeed": "--zero 3 (zero.Init: only rank 0 reads the checkpoint, each rank keeps its partition)",
               }.get(fw, "--model-loading rank0 (accelerate's fsdp_cpu_ram_efficient_loading) or a sharded load")
    return (f"host RAM at model load: {LOADING_TEXT[mode]} ({mode}): {load / 2**30:,.0f} GiB per node, "
            f"{ram / 2**30:,.0f} GiB installed: the processes are killed for lack of host memory before "
            f"training starts; {fix}")


def host_shortfall(plan: Plan) -> tuple[str, float] | None:
    """(what, bytes per node) when the node's installed host RAM cannot hold the plan's offloaded
    states or its model while it loads, else None (the planner's host check)."""
    ram = plan.cluster.host_ram_bytes
    if ram is None:
        return None
    off = offloaded_states_bytes(plan)
    if off > ram:
        return "the optimizer states offloaded to make it fit", off
    load = model_load_bytes(plan) if plan.recipe.is_training else 0.0
    if load > ram:
        mode = model_loading(plan)
        return f"the model while it loads ({mode}: {LOADING_TEXT[mode]})", load
    return None
