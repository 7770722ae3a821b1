"""Serving planner: the cheapest GPU type × TP × replica count that meets a load and latency SLOs.

For each candidate GPU and tensor-parallel degree t (dividing the attention heads, within one
node), one replica of t GPUs is evaluated with the serving model (:mod:`trainledger.estimate.serving`):

1. the engine's KV pool bounds the concurrency C_max of a replica (vLLM's accounting);
2. for C = 1, 2, 4, … C_max the steady state of continuous batching gives the replica's rate,
   C / TPOT / n_out requests per second, and the replicas the load needs, ceil(offered ÷ rate)
   (the load spread evenly: an ideal router);
3. at that load per replica, TTFT (prefill plus the M/D/1 wait for the prefills ahead,
   :func:`~trainledger.estimate.serving.perf.prefill_queueing`) and TPOT are taken at the median
   prompt (p50) and at the p99 prompt with the p99 queue wait and the slow step that carries a
   prefill chunk (p99);
4. when only the TTFT SLO fails, more replicas are tried (up to :data:`MAX_EXTRA_REPLICAS` times
   the throughput count): the queue wait falls as each replica's load does (an operator keeps
   headroom for latency), and the fewest replicas that meet the SLO are kept (bisection: the wait
   falls monotonically with the replicas);
5. the C meeting every SLO with the fewest replicas is the candidate's operating point.

Ranking: cloud USD per hour of the whole deployment, then fewer GPUs. Each candidate reports cost
and energy per million output tokens at the offered load, cloud and owned. Prompt lengths come from
``--seq-len`` (p50 = p99) or a ``trainledger corpus --json`` stats file (median, p99, mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainledger.load.catalog import all_gpus
from trainledger.errors import PlanError, SpecError, TrainledgerError
from trainledger.load.plan import PlanInputs, build_plan

DEFAULT_TPS = (1, 2, 4, 8)


@dataclass
class PromptLengths:
    """Prompt tokens per request: median, 99th percentile and mean."""

    p50: int
    p99: int
    mean: float
    source: str


@dataclass
class ServeCandidate:
    gpu: str
    tp: int
    replicas: int = 0
    concurrency: int = 0
    ok: bool = False
    reason: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "tp": self.tp, "replicas": self.replicas, "gpus": self.gpus,
                "concurrency_per_replica": self.concurrency, "ok": self.ok, "reason": self.reason,
                "figures": dict(self.figures), "cost": dict(self.cost), "plan_inputs": dict(self.inputs)}


def prompt_lengths(inputs: PlanInputs, corpus: str | None) -> PromptLengths:
    if corpus:
        from trainledger.corpus.recommend import load_stats

        st = load_stats(corpus)
        try:
            return PromptLengths(int(st["median"]), int(st["p99"]), float(st["mean"]), f"corpus stats {corpus}")
        except (KeyError, TypeError, ValueError):
            raise SpecError(f"{corpus}: corpus stats lack median/p99/mean; regenerate with `trainledger corpus --json`") from None
    return PromptLengths(inputs.seq_len, inputs.seq_len, float(inputs.seq_len), "--seq-len (every prompt)")


def _slo_ok(inputs: PlanInputs, p50: dict[str, float], p99: dict[str, float]) -> str:
    """'' when every SLO holds, else the first one broken, with the numbers."""
    checks = (("ttft_p50_s", p50["ttft_s"], "TTFT p50"), ("ttft_p99_s", p99["ttft_p99_s"], "TTFT p99"),
              ("tpot_p50_s", p50["tpot_s"], "TPOT p50"), ("tpot_p99_s", p99["tpot_p99_s"], "TPOT p99"))
    for key, value, name in checks:
        limit = getattr(inputs, key)
        if limit is not None and value > limit:
            return f"{name} {value * 1e3:.1f} ms > {limit * 1e3:.1f} ms"
    return ""


#: replicas beyond the throughput count tried for a TTFT SLO, as a multiple of that count (a search
#: bound, not a model constant: at 1/8 of the throughput-limited load the prefill queue is short)
MAX_EXTRA_REPLICAS = 8


def _latency_replicas(at: Any, lo: int, why: str, p50: dict, p99: dict) -> tuple[int, str, dict, dict]:
    """The fewest replicas in [lo, MAX_EXTRA_REPLICAS·lo] whose queue wait meets the TTFT SLOs.

    Only the prefill queue depends on the replica count (each replica's load λ falls as replicas are
    added); if the most replicas tried still miss the SLO, the miss at ``lo`` is returned."""
    hi = lo * MAX_EXTRA_REPLICAS
    meets = at(hi)
    if meets[0]:  # no replica count helps: name what still fails with the most replicas (TPOT, prefill itself)
        return lo, (meets[0] if not meets[0].startswith("TTFT") else why), p50, p99
    while hi - lo > 1:  # invariant: lo misses, hi meets (``meets`` is at(hi))
        mid = (lo + hi) // 2
        res = at(mid)
        if res[0]:
            lo = mid
        else:
            hi, meets = mid, res
    return hi, *meets


def evaluate(inputs: PlanInputs, gpu: str, tp: int, prompts: PromptLengths,
             cost_options: Any = None) -> ServeCandidate:
    """One GPU type × TP degree: the best concurrency meeting the SLOs and the replicas needed."""
    from trainledger.estimate.serving import ServingPerf, engine_memory
    from trainledger.estimate.serving.section import cost_per_million, curve_points

    cand = ServeCandidate(gpu=gpu, tp=tp)
    data = inputs.model_dump()
    data.update(gpu=gpu, tp=tp, gpus=tp, gpus_per_node=None, dp=None, pp=1, method="inference",
                seq_len=max(prompts.p99, 1), micro_batch=1, corpus=None)
    try:
        plan = build_plan(PlanInputs.model_validate(data))
    except TrainledgerError as exc:
        cand.reason = str(exc)
        return cand
    cand.inputs = {k: v for k, v in PlanInputs.model_validate(data).model_dump(mode="json", exclude_defaults=True).items()}
    em = engine_memory(plan)
    if em.kv_pool <= 0 or em.concurrency < 1:
        cand.reason = (f"weights {em.weights / 2**30:.1f} GiB leave no KV pool for a {em.max_model_len}-token "
                       f"sequence on {tp}× {gpu}")
        return cand
    perf = ServingPerf(plan)
    out = max(inputs.generate_len, 1)
    best = None
    for c in curve_points(max(1, em.steady_concurrency(prompts.mean, out))):
        mean = perf.continuous(c, prompts.mean, out)
        rate = mean["requests_per_s"]

        def at(replicas: int, c: int = c, rate: float = rate) -> tuple[str, dict[str, float], dict[str, float]]:
            lam = (inputs.requests_per_s or rate) / replicas  # offered load per replica (open loop)
            p50 = perf.continuous(c, prompts.p50, out, lam)
            p99 = perf.continuous(c, prompts.p99, out, lam)
            return _slo_ok(inputs, p50, p99), p50, p99

        replicas = max(1, math.ceil(inputs.requests_per_s / rate - 1e-9)) if inputs.requests_per_s else 1
        why, p50, p99 = at(replicas)
        if why and inputs.requests_per_s and why.startswith("TTFT"):
            replicas, why, p50, p99 = _latency_replicas(at, replicas, why, p50, p99)
        if why:
            cand.reason = cand.reason or f"at concurrency {c}: {why}"
            continue
        if best is None or replicas < best[0]:
            best = (replicas, c, p50, p99, mean)
    if best is None:
        return cand
    replicas, c, p50, p99, mean = best
    rate = mean["requests_per_s"]
    rps = inputs.requests_per_s or rate
    cand.replicas = replicas
    cand.concurrency = c
    cand.ok = True
    cand.reason = ""
    cand.figures = {"ttft_p50_s": p50["ttft_s"], "ttft_p99_s": p99["ttft_p99_s"], "tpot_p50_s": p50["tpot_s"],
                    "tpot_p99_s": p99["tpot_p99_s"], "itl_p99_s": p99["tpot_worst_s"],
                    "requests_per_s_per_replica": rate,
                    "output_tokens_per_s_per_replica": mean["output_tokens_per_s"],
                    "output_tokens_per_s_per_gpu": mean["output_tokens_per_s_per_gpu"],
                    "max_concurrency": em.max_concurrency, "offered_requests_per_s": rps,
                    "utilization": rps / (cand.replicas * rate)}
    per_replica = cost_per_million(plan, mean, None, cost_options)
    cost = dict(per_replica)
    load_tps = rps * out  # output tokens/s the deployment actually serves
    hours_per_m = 1e6 / load_tps / 3600.0 if load_tps > 0 else float("inf")
    n = cand.gpus
    if "cloud_usd_per_gpu_hour" in per_replica:
        cost["cloud_usd_per_hour"] = per_replica["cloud_usd_per_gpu_hour"] * n
        cost["cloud_usd_per_million_output_tokens"] = cost["cloud_usd_per_hour"] * hours_per_m
    if "owned_usd_per_gpu_hour" in per_replica:
        cost["owned_usd_per_hour"] = per_replica["owned_usd_per_gpu_hour"] * n
        cost["owned_usd_per_million_output_tokens"] = cost["owned_usd_per_hour"] * hours_per_m
    if "power_w_per_replica" in per_replica:
        kw = per_replica["power_w_per_replica"] * cand.replicas / 1000.0
        cost["kwh_per_million_output_tokens"] = kw * hours_per_m
    cand.cost = cost
    return cand


def serve_plan(inputs: PlanInputs, gpus: list[str] | None = None, tps: tuple[int, ...] = DEFAULT_TPS,
               corpus: str | None = None, cost_options: Any = None) -> dict[str, Any]:
    """Every candidate, feasible ones ranked cheapest first (cloud USD/h, then GPU count)."""
    if inputs.requests_per_s is None:
        raise PlanError("a serving plan needs the load: give --requests-per-s (and SLOs such as "
                        "--ttft-p99-s 2 --tpot-p99-s 0.1)")
    prompts = prompt_lengths(inputs, corpus)
    names = gpus or [g.name for g in all_gpus() if g.vendor == "nvidia"]
    cands = []
    for g in names:
        for tp in tps:
            cands.append(evaluate(inputs, g, tp, prompts, cost_options))
    ok = [c for c in cands if c.ok]

    def key(c: ServeCandidate) -> tuple[float, int]:
        usd = c.cost.get("cloud_usd_per_hour")
        return (usd if usd is not None else float("inf"), c.gpus)

    ok.sort(key=key)
    rejected = [c for c in cands if not c.ok]
    return {"model": inputs.model, "engine": inputs.serving_engine, "requests_per_s": inputs.requests_per_s,
            "prompt_tokens": {"p50": prompts.p50, "p99": prompts.p99, "mean": prompts.mean, "source": prompts.source},
            "output_tokens": max(inputs.generate_len, 1),
            "slo": {k: getattr(inputs, k) for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")},
            "candidates": [c.to_dict() for c in ok], "rejected": [c.to_dict() for c in rejected],
            "best": ok[0].to_dict() if ok else None}
