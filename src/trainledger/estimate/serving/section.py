"""The serving section of an inference plan, and its memory section under a serving engine.

``memory_estimate(plan)`` gives the Estimate's memory section when an engine (vLLM, SGLang,
TensorRT-LLM) serves the plan: weights, the batch's KV cache, profile-run activations, CUDA
graphs, non-torch buffers and the CUDA context, with the engine's own fit rule (the batch's KV
must fit the pool the engine carves out of ``gpu_memory_utilization`` × capacity).

``serving_section(plan, prices)`` adds latency and throughput: TTFT, TPOT and tokens/s at the
plan's batch, the throughput-latency curve over concurrency, the largest concurrency the KV pool
allows, and cost and energy per million output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainledger.spec.plan import Plan
from trainledger.units import gib
from trainledger.estimate.terms import Term
from trainledger.estimate.memory.result import MemoryEstimate
from trainledger.estimate.serving.memory import EngineMemory, engine_memory
from trainledger.estimate.serving.perf import ServingPerf

#: not modelled (stated in every serving section)
NOT_MODELLED = (
    "speculative decoding (draft/MTP/EAGLE tokens per step)",
    "prefix caching (shared prompt prefixes reuse KV blocks and skip their prefill)",
    "disaggregated prefill (separate prefill and decode GPUs)",
    "output-length distributions (every request generates --generate-len tokens)",
)

_SRC = {
    "weights": "Σ linears × bytes(format incl. scales/zeros) / TP + vocab-parallel embedding/lm_head "
               "(estimate/serving/quant.py, memory.py)",
    "kv_cache": "batch × cdiv(ctx, block)·block × layers × per-token KV (GQA k//t heads, replicated when "
                "k < t; MLA latent (d_c + d_R)) (estimate/serving/kv.py)",
    "activations": "peak of vLLM's profile run: forward over max_num_batched_tokens + sampler logits "
                   "(vllm/v1/worker/gpu_worker.py determine_available_memory)",
    "cuda_graphs": "graph pool: largest captured decode batch's working set + per-graph overhead "
                   "(vllm/config/compilation.py cudagraph_capture_sizes)",
    "other": "non-torch memory the profile adds: cuBLAS workspaces, NCCL/custom all-reduce buffers "
             "(catalog/serving/engines.yaml, assumption)",
}


def memory_estimate(plan: Plan, opts: Any = None):
    """The memory section (a ``MemoryEstimate``) of an inference plan served by an engine."""
    em = engine_memory(plan)
    total = plan.cluster.gpu.usable_bytes
    breakdown = {"weights": int(em.weights), "kv_cache": int(em.batch_kv), "activations": int(em.activations),
                 "cuda_graphs": int(em.cuda_graphs), "other": int(em.non_torch)}
    breakdown = {k: v for k, v in breakdown.items() if v > 0}
    peak = sum(breakdown.values())
    device = peak + int(em.cuda_context)
    budget = em.weights + em.kv_pool + em.activations + em.cuda_graphs + em.non_torch + em.cuda_context
    headroom = min(max(1.0 - budget / total, 0.0), 0.89)
    terms = [Term(k, v, "bytes", _SRC[k]) for k, v in breakdown.items()]
    terms.append(Term("cuda_context", int(em.cuda_context), "bytes",
                      "CUDA context + kernels, outside the engine's gpu_memory_utilization share"))
    notes = [f"{em.engine}: KV pool {gib(em.kv_pool):.2f} GiB = {em.num_blocks} blocks of {em.block_size} tokens "
             f"({em.kv.dtype}, {em.kv.bytes_per_token:,.0f} bytes per token on this GPU); the batch of "
             f"{em.batch} × {em.max_model_len} tokens uses {gib(em.batch_kv):.2f} GiB",
             f"max concurrency for {em.max_model_len} tokens per request: {em.max_concurrency:.2f}x "
             f"(vLLM's start-up line); longest single context: {em.longest_context:,} tokens"]
    if em.kv.replicated and not em.kv.latent:
        notes.append(f"{plan.model.num_kv_heads} KV heads < tp={plan.layout.tp}: each rank keeps a replica of "
                     f"its head (vLLM get_num_kv_heads: max(1, k // tp))")
    if em.kv.latent and plan.layout.tp > 1:
        notes.append("MLA latent cache: every TP rank holds the whole latent (it is shared by all heads)")
    notes += em.notes
    est = MemoryEstimate(
        peak_allocated_bytes=peak, peak_reserved_bytes=peak, device_total_bytes=device, peak_phase="decode",
        breakdown=breakdown, phases={"prefill": peak, "decode": peak},
        timeline=[("weights loaded", int(em.weights)), ("after profile", int(em.weights + em.activations)),
                  ("serving", peak)],
        usable_bytes=total, headroom=headroom, host_bytes=0, terms=terms,
        runtime_terms={"cuda_context": int(em.cuda_context)}, notes=notes,
    )
    if not em.fits:
        est.suggestions = _suggestions(plan)
    return est


def _suggestions(plan: Plan) -> list[dict[str, Any]]:
    """Single changes that make the batch fit the engine's KV pool (cheapest first)."""
    s, lay = plan.serving, plan.layout
    options: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    if s.kv_cache_dtype not in ("fp8",):
        options.append(("--kv-cache-dtype fp8", {"kv_cache_dtype": "fp8"}, {}))
    if s.quantization == "none" and plan.recipe.policy["weights"] != "fp8":
        options.append(("--quantization fp8", {"quantization": "fp8"}, {}))
        options.append(("--quantization awq (int4, g128)", {"quantization": "awq"}, {}))
    for tp in (lay.tp * 2, lay.tp * 4):
        if tp <= 64 and plan.model.num_heads % tp == 0:
            options.append((f"--tp {tp} --gpus {tp * lay.pp}", {}, {"tp": tp}))
    if plan.recipe.micro_batch > 1:
        options.append((f"--micro-batch {max(plan.recipe.micro_batch // 2, 1)}", {}, {"batch": True}))
    out = []
    for text, serv, lay_change in options:
        try:
            p = _variant(plan, serv, lay_change)
            em = engine_memory(p)
        except Exception:  # noqa: BLE001 - a variant the layout rules reject is simply not offered
            continue
        if em.fits:
            out.append({"change": text, "peak_allocated_gib": round(gib(em.weights + em.batch_kv + em.activations), 2),
                        "device_total_bytes": int(em.weights + em.batch_kv + em.activations + em.cuda_graphs
                                                  + em.non_torch + em.cuda_context),
                        "max_concurrency": round(em.max_concurrency, 2)})
    return out


def _variant(plan: Plan, serv: dict[str, Any], lay_change: dict[str, Any]) -> Plan:
    from trainledger.spec.cluster import Cluster

    upd: dict[str, Any] = {}
    if serv:
        upd["serving"] = plan.serving.updated(serv)  # (model_copy without pydantic's copy machinery)
    if lay_change.get("batch"):
        upd["recipe"] = plan.recipe.updated({"micro_batch": max(plan.recipe.micro_batch // 2, 1)})
    if "tp" in lay_change:
        tp = lay_change["tp"]
        n = tp * plan.layout.pp
        per_node = min(n, plan.cluster.gpus_per_node if n >= plan.cluster.gpus_per_node else n)
        cl = Cluster(gpu=plan.cluster.gpu, gpus_per_node=per_node, nodes=max(1, n // per_node),
                     intra=plan.cluster.intra, inter=plan.cluster.inter)
        upd["cluster"] = cl
        upd["layout"] = plan.layout.updated({"tp": tp, "dp": 1})
    # the plan with these parts replaced, checked as Plan(...) would (only the checks that read them)
    return plan.variant(**upd)


@dataclass
class ServingEstimate:
    """The serving section: engine memory, latency and throughput, cost and energy per token."""

    engine: str
    engine_text: str
    memory: EngineMemory
    at_batch: dict[str, float]
    static: dict[str, float]
    curve: list[dict[str, float]]
    max_throughput: dict[str, float]
    cost: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    not_modelled: tuple[str, ...] = NOT_MODELLED

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "engine_text": self.engine_text, "memory": self.memory.to_dict(),
                "at_batch": dict(self.at_batch), "static_batch": dict(self.static),
                "curve": [dict(c) for c in self.curve], "max_throughput": dict(self.max_throughput),
                "cost": dict(self.cost), "notes": list(self.notes), "not_modelled": list(self.not_modelled)}


def curve_points(limit: int) -> list[int]:
    """Concurrency levels of the throughput-latency curve: powers of two up to ``limit``."""
    pts = [1]
    while pts[-1] * 2 <= limit:
        pts.append(pts[-1] * 2)
    if pts[-1] != limit and limit > 1:
        pts.append(limit)
    return pts


def serving_section(plan: Plan, prices: Any = None, cost_options: Any = None) -> ServingEstimate:
    """Latency, throughput, concurrency, cost and energy of an inference plan (module docstring)."""
    perf = ServingPerf(plan)
    em = engine_memory(plan)
    r = plan.recipe
    prompt, out = r.seq_len, max(r.generate_len, 1)
    b = r.micro_batch
    seen: dict[int, dict[str, float]] = {}

    def continuous(c: int) -> dict[str, float]:
        # the batch, the curve's points and the largest concurrency (the curve's last point) are
        # each evaluated once; every figure gets its own copy
        if c not in seen:
            seen[c] = perf.continuous(c, prompt, out)
        return dict(seen[c])

    at = continuous(b)
    static = perf.static_batch(b, prompt, out)
    limit = max(1, em.steady_concurrency(prompt, out))
    curve = [continuous(c) for c in curve_points(limit)]
    best = continuous(limit)
    notes = [f"batch = --micro-batch {b} concurrent sequences of {prompt} prompt + {out} output tokens"]
    if r.generate_len == 0:
        notes.append("--generate-len 0: every request is a prefill with one output token, so TPOT carries a "
                     "whole prompt; give --generate-len for decode figures")
    if plan.layout.pp > 1:
        notes.append("pipeline parallel: a token passes every stage in turn (latency × pp); micro-batch "
                     "interleaving across stages is not modelled")
    if em.concurrency < b:
        notes.append(f"the KV pool holds {em.max_concurrency:.1f} sequences of {em.max_model_len} tokens: "
                     f"the batch of {b} does not run at once (the engine queues the rest)")
    cost = cost_per_million(plan, best, prices, cost_options)
    return ServingEstimate(engine=em.engine, engine_text=perf.es.text, memory=em, at_batch=at, static=static,
                           curve=curve, max_throughput=best, cost=cost, notes=notes)


def cost_per_million(plan: Plan, best: dict[str, float], prices: Any, cost_options: Any) -> dict[str, Any]:
    """USD and kWh per million output tokens at the largest concurrency, cloud and owned.

    Cloud: the catalog's (or the user's) price per GPU-hour × GPUs per replica × hours per million
    tokens. Owned: write-off and maintenance per used GPU-hour, C·(1/L + m)/(8760·u)
    (:func:`trainledger.estimate.run.cost.owned_fixed_usd_per_gpu_hour`), plus electricity. Power: the
    linear model P = idle + (busy·TDP − idle)·busy fraction (energy.py), GPUs busy all the time.
    """
    from trainledger.errors import CatalogError
    from trainledger.estimate.run.common import RunFigures
    from trainledger.estimate.run.cost import cloud_quote, owned_fixed_usd_per_gpu_hour
    from trainledger.estimate.run.energy import power_model
    from trainledger.estimate.options import CostOptions
    from trainledger.estimate.run.prices import load_prices

    opts = cost_options or CostOptions()
    gpus = plan.layout.tp * plan.layout.pp
    tps = best["output_tokens_per_s"]
    out: dict[str, Any] = {"gpus_per_replica": gpus, "output_tokens_per_s_per_replica": tps,
                           "at_concurrency": best["concurrency"]}
    if tps <= 0:
        return out
    hours_per_m = 1e6 / tps / 3600.0
    try:
        prices = prices or load_prices(opts.prices_file)
    except CatalogError as exc:
        out["note"] = str(exc)
        return out
    run = RunFigures(None, None, None, None, None, 1.0, "serving: GPUs busy every step")
    pm = power_model(plan, opts, run, prices)
    share = pm.node_overhead_w / pm.gpus_per_node
    it_w = (pm.gpu_power_w + share) * gpus
    out["power_w_per_replica"] = it_w
    out["kwh_per_million_output_tokens"] = it_w * pm.pue * hours_per_m / 1000.0
    try:
        q = cloud_quote(plan.cluster.gpu.name, opts, prices)
        out["cloud_usd_per_gpu_hour"] = q.usd_per_gpu_hour
        out["cloud_provider"] = q.provider
        out["cloud_usd_per_million_output_tokens"] = q.usd_per_gpu_hour * gpus * hours_per_m
    except CatalogError as exc:
        out["cloud_note"] = str(exc)
    server = prices.server_for(plan.cluster.gpu.name)
    price = opts.server_price_usd or (server.usd if server else None)
    if price is not None:
        per_server = opts.gpus_per_server or (server.gpus_per_server if server else plan.cluster.gpus_per_node)

        def pick(v: float | None, key: str) -> float:
            return v if v is not None else prices.default(key).value

        fixed = owned_fixed_usd_per_gpu_hour(price / per_server, pick(opts.lifetime_years, "lifetime_years"),
                                             pick(opts.maintenance_fraction, "maintenance_fraction_per_year"),
                                             pick(opts.utilization, "utilization"))
        elec = (pm.gpu_power_w + share) * pm.pue / 1000.0 * pick(opts.electricity_usd_per_kwh, "electricity_usd_per_kwh")
        out["owned_usd_per_gpu_hour"] = fixed + elec
        out["owned_usd_per_million_output_tokens"] = (fixed + elec) * gpus * hours_per_m
    return out
