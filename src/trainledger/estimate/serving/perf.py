"""Latency and throughput of serving: prefill, decode, TTFT, TPOT, tokens/s over batch size.

One engine step on one GPU is the sum over the decoder layers of its pipeline stage of:

* every weight GEMM (M new tokens × K) · (K × N/t): t = max(2·M·K·N / (peak · η(M,N,K)),
  (weight bytes + activation bytes) / (HBM · η_dec)) — the roofline (Williams et al. 2009, CACM
  52(4)); weight bytes count the quantized format (scales and zeros included, :mod:`.quant`).
  Decode with a small batch is bound by streaming the weights once per step; a large batch or a
  prefill is bound by the tensor cores. fp8/int8 GEMMs run at their own peak; int4/nf4 weights are
  dequantized inside a 16-bit GEMM (Marlin, Frantar et al. 2024, arXiv:2408.11743) at
  ``int4_gemm_efficiency`` of the 16-bit peak.
* routed experts at batch M: the experts one step touches, E·(1 − (1 − k/E)^M) under uniform
  routing (expected distinct experts among M·k draws; Fedus et al. 2022, arXiv:2101.03961, §2.2
  load balancing), each streamed once; at small batch MoE decode reads few experts, at large batch
  all of them.
* attention: decode reads every cached token of every sequence once (KV bytes / (HBM ·
  η_attn)); prefill runs flash attention over the causal half of the s×s scores (Dao 2023,
  arXiv:2307.08691) at the family's fused-attention efficiency (catalog/efficiency).
* two TP all-reduces of M·h activations per layer on the node's link (Shoeybi et al. 2019,
  arXiv:1909.08053, Fig. 3; alpha-beta model of :mod:`trainledger.estimate.time.comm`).
* per-kernel overhead (CUDA-graph replay in decode, eager launches in prefill), the lm_head over
  the sequences that sample, and the engine's CPU time per step.

Prefill of b prompts of s tokens is one step with M = b·s; time to first token = that step.
Decode of b sequences at context c: time per output token = one step with M = b. Static batching
(TensorRT-LLM gptSessionBenchmark): throughput = b·n_out / (prefill + Σ decode steps), the decode
sum integrated over the growing context. Continuous batching with chunked prefill (vLLM, SGLang):
in steady state each step decodes C sequences and prefills C·s_in/s_out prompt tokens; TPOT is the
step time, output tokens/s = C / step time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from trainledger.spec.plan import Plan
from trainledger.estimate.time.comm import all_reduce_s, group
from trainledger.estimate.time.compute import layer_kinds
from trainledger.estimate.time.efficiency import attention_efficiency, for_gpu
from trainledger.estimate.serving.engine import kernels_for, resolve
from trainledger.estimate.serving.kv import kv_dtype, kv_layout
from trainledger.estimate.serving.memory import act_bytes, served_format

#: rows per expert block of the fused MoE kernel at small batch: the tokens routed to one expert
#: are padded to a multiple of it (vllm/model_executor/layers/fused_moe/fused_moe.py
#: ``get_default_config``: BLOCK_SIZE_M 16 for small M; ``moe_align_block_size``).
MOE_BLOCK_M = 16
#: int4-weight GEMMs (Marlin) work on 16-row activation tiles and stay memory-bound up to batch
#: 16-32 (Frantar et al. 2024, arXiv:2408.11743, §4 and Fig. 1)
DEQUANT_BLOCK_M = 16
#: kernels a routed-expert MLP adds over a dense one in vLLM's fused MoE path: router GEMM,
#: topk_softmax, moe_align_block_size, two grouped GEMMs, silu_and_mul, moe_sum replace gate_up,
#: act, down (vllm/model_executor/layers/fused_moe/fused_moe.py ``fused_experts``): 7 - 3 = 4
MOE_EXTRA_KERNELS = 4
#: a shared expert runs as a dense MLP beside them: gate_up, act, down
SHARED_EXPERT_KERNELS = 3
#: MLA adds the q/kv down-projections and their norms to the attention block (q_a, q_a_norm,
#: kv_a, kv_a_norm; DeepSeek-V2 §2.1): 4
MLA_EXTRA_KERNELS = 4
#: decode-context sample points used to integrate a static batch's decode phase
DECODE_SAMPLES = 12
#: elementwise traffic per token and layer, in units of h·c bytes (2 norms read+write, residual
#: adds, RoPE, SiLU·mul in and out): ~12 h-wide passes (vLLM fused RMSNorm+residual kernels)
ELEMENTWISE_PASSES = 12


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one engine step on one GPU, by part."""

    gemm: float
    attention: float
    comm: float
    other: float  # elementwise, kernel overheads, lm_head, engine CPU

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.comm + self.other


class ServingPerf:
    """The per-plan constants of the step-time model (derived once, then evaluated many times)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        m, lay, gpu = plan.model, plan.layout, plan.cluster.gpu
        self.es = resolve(plan)
        self.kern = kernels_for(plan)
        self.eff = for_gpu(gpu)
        self.fmt = served_format(plan)
        self.c = act_bytes(plan)
        self.t, self.p = lay.tp, lay.pp
        self.hbm = gpu.hbm_bytes_per_s
        dt = self.fmt.gemm_dtype
        self.peak16 = gpu.peak_flop_per_s("bf16" if gpu.bf16_tflops else "fp16")
        if dt == "fp4" and self.kern.fp4_over_fp8 > 0:  # FP4 tensor cores (Blackwell)
            self.peak, dt = gpu.peak_flop_per_s("fp8") * self.kern.fp4_over_fp8, "fp8"
        else:
            if dt == "fp4":  # no FP4 tensor cores: dequantized into a 16-bit GEMM (Marlin W4A16)
                self.fmt = dataclasses.replace(self.fmt, dequant=True, gemm_dtype="bf16")
                dt = "bf16"
            self.peak = gpu.peak_flop_per_s(dt)
        if self.fmt.dequant:
            self.eta_max = self.kern.int4_gemm_efficiency
            self.peak = self.peak16
        else:
            self.eta_max = self.eff.matmul_max(dt)
        self.kv = kv_layout(m, self.t, self.p, kv_dtype(plan.serving.kv_cache_dtype, plan.recipe.policy["compute"]),
                            self.es.latent)
        self.kinds = layer_kinds(m)
        self.stage_frac = math.ceil(m.num_layers / self.p) / m.num_layers
        self.tp_group = group(plan.cluster, self.t, 1)
        self.kernels_per_step = sum(kind.count * (self.kern.kernels_per_layer + extra_kernels(kind, m))
                                    for kind in self.kinds) * self.stage_frac
        # every weight GEMM of every layer kind with its TP-split shape and bytes per weight: they
        # do not depend on the step's token count, and ``_gemms`` runs for every step evaluated
        # (each row also carries its shape factor nk and K + N, the parts of ``_gemm`` that do not
        # depend on the token count, computed by the same expressions)
        self.gemm_table: list[tuple[int, list[tuple[float, float, float, float, float, float, float]]]] = []
        d = self.eff.half_dim
        for kind in self.kinds:
            rows = []
            for g in kind.gemms:
                K, N = float(g.k), float(g.n)
                if g.split == "col":
                    N /= self.t
                elif g.split == "row":
                    K /= self.t
                bw = self.fmt.other_bytes if g.name == "router" else self.fmt.linear_bytes(g.k, g.n)
                rows.append((K, N, bw, float(g.experts), g.mult, (N / (N + d)) * (K / (K + d)), K + N))
            self.gemm_table.append((kind.count, rows))

    # ------------------------------------------------------------------ pieces
    def _gemm(self, M: float, K: float, N: float, bytes_w: float, n_mat: float = 1.0,
              nk: float | None = None, k_plus_n: float | None = None) -> float:
        """One weight GEMM family: ``n_mat`` matrices of K×N streamed, M tokens in total.
        ``nk``, ``k_plus_n``: the shape factor and K + N when the caller has them (``gemm_table``)."""
        if M <= 0:
            return 0.0
        d = self.eff.half_dim
        if nk is None:
            nk = (N / (N + d)) * (K / (K + d))
        if k_plus_n is None:
            k_plus_n = K + N
        if n_mat > 1 or self.fmt.dequant:  # grouped expert GEMM / int4 Marlin: rows padded to the M block
            block = MOE_BLOCK_M if n_mat > 1 else DEQUANT_BLOCK_M
            rows = n_mat * math.ceil(M / n_mat / block) * block
            t_c = 2.0 * rows * K * N / (self.peak * self.eta_max * nk)
        else:
            eta = self.eta_max * (M / (M + d)) * nk
            t_c = 2.0 * M * K * N / (self.peak * eta)
        t_m = (n_mat * K * N * bytes_w + self.c * M * k_plus_n) / (self.hbm * self.kern.decode_hbm_efficiency)
        return max(t_c, t_m)

    def _gemms(self, M: float) -> float:
        s = 0.0
        for count, rows in self.gemm_table:
            layer = 0.0
            for K, N, bw, E, k, nk, kn in rows:
                if E:
                    touched = E * (1.0 - (1.0 - k / E) ** M)
                    layer += self._gemm(M * k, K, N, bw, max(touched, 1.0), nk, kn)
                else:
                    layer += self._gemm(M, K, N, bw, 1.0, nk, kn)
            s += count * self.stage_frac * layer
        return s

    def _attention_decode(self, seqs: float, ctx: float) -> float:
        """Decode attention of ``seqs`` sequences at context ``ctx``: read the cache once per layer."""
        kv = self.kv
        slid = min(ctx, kv.window) if kv.window else ctx
        kv_bytes = seqs * kv.bytes_per_token_layer * (kv.full_layers * ctx + kv.sliding_layers * slid)
        m = self.plan.model
        if self.es.kv_reads_per_query_head and m.mla is None:
            kv_bytes *= m.num_heads / m.num_kv_heads
        t_mem = kv_bytes / (self.hbm * self.kern.attention_decode_efficiency)
        flops = 0.0
        for kind in self.kinds:
            per_tok = 2.0 * kind.heads / self.t * (kind.d_qk + kind.d_v) * min(ctx, kind.window or ctx)
            flops += kind.count * self.stage_frac * seqs * per_tok
        return max(t_mem, flops / (self.peak16 * self.eff.attention))

    def _attention_prefill(self, seqs: float, s: float) -> float:
        """Causal flash attention over ``seqs`` prompts of ``s`` tokens."""
        tot = 0.0
        for kind in self.kinds:
            keys = kind.attn_keys(int(s), causal=True)
            flops = seqs * s * 2.0 * kind.heads / self.t * (kind.d_qk + kind.d_v) * keys
            eta = attention_efficiency(self.eff, min(s, kind.window or s), 0.5 * (kind.d_qk + kind.d_v))
            tot += kind.count * self.stage_frac * flops / (self.peak16 * eta)
        return tot

    def _comm(self, M: float) -> float:
        if self.t <= 1:
            return 0.0
        layers = math.ceil(self.plan.model.num_layers / self.p)
        return 2 * layers * all_reduce_s(self.tp_group, M * self.plan.model.hidden_size * self.c)

    def _other(self, M: float, samples: float, graphs: bool) -> float:
        m = self.plan.model
        layers = math.ceil(m.num_layers / self.p)
        ew = layers * ELEMENTWISE_PASSES * M * m.hidden_size * self.c / (self.hbm * self.eff.hbm)
        graphs = graphs or self.es.native_launch
        per_kernel = self.kern.kernel_overhead_graph_s if graphs else self.eff.kernel_overhead_s
        kern = self.kernels_per_step * per_kernel
        head = self._gemm(samples, m.hidden_size, m.vocab_size / self.t, self.fmt.other_bytes)
        return ew + kern + head + self.es.step_overhead_s

    # ------------------------------------------------------------------ steps
    def step(self, decode_seqs: float, ctx: float, prefill_seqs: float = 0.0, prompt: float = 0.0) -> StepTime:
        """One engine step on one GPU of the busiest stage: ``decode_seqs`` sequences at context
        ``ctx`` plus ``prefill_seqs`` prompts of ``prompt`` tokens."""
        M = decode_seqs + prefill_seqs * prompt
        att = 0.0
        if decode_seqs:
            att += self._attention_decode(decode_seqs, ctx)
        if prefill_seqs and prompt:
            att += self._attention_prefill(prefill_seqs, prompt)
        # vLLM V1 replays piecewise CUDA graphs for any step of at most the largest captured size
        graphs = self.es.cuda_graphs and M <= self.es.cuda_graph_max_batch
        samples = decode_seqs + prefill_seqs
        return StepTime(self._gemms(M), att, self._comm(M), self._other(M, samples, graphs))

    def stage_to_token(self, t_stage: float) -> float:
        """Latency of one step through all ``p`` pipeline stages (no pipelining within a sequence)."""
        return t_stage * self.p

    def prefill_s(self, batch: float, prompt: float) -> float:
        """Time to first token of ``batch`` prompts prefilling together (chunked by the step budget)."""
        budget = float(self.es.max_num_batched_tokens)
        tokens = batch * prompt
        if self.es.engine in ("vllm", "sglang") and tokens > budget:
            chunks = math.ceil(tokens / budget)
            per = self.step(0, 0, budget / prompt, prompt).total
            return self.stage_to_token(per * chunks)
        return self.stage_to_token(self.step(0, 0, batch, prompt).total)

    def decode_s(self, batch: float, ctx: float) -> float:
        """Time per output token for ``batch`` sequences at context ``ctx``."""
        return self.stage_to_token(self.step(batch, ctx).total)

    def static_batch(self, batch: int, prompt: int, out: int) -> dict[str, float]:
        """A static batch (all prompts prefilled, then ``out``−1 decode steps): latency and throughput."""
        t_pre = self.prefill_s(batch, prompt)
        n_dec = max(out - 1, 0)
        t_dec = 0.0
        if n_dec:
            k = min(DECODE_SAMPLES, n_dec)
            width = n_dec / k
            for i in range(k):
                ctx = prompt + (i + 0.5) * width
                t_dec += width * self.decode_s(batch, ctx)
        total = t_pre + t_dec
        gpus = self.t * self.p
        tps = batch * out / total if total > 0 else 0.0
        return {"ttft_s": t_pre, "tpot_s": t_dec / n_dec if n_dec else 0.0, "e2e_s": total,
                "output_tokens_per_s": tps, "output_tokens_per_s_per_gpu": tps / gpus}

    def continuous(self, concurrency: float, prompt: float, out: float,
                   arrival_rate: float | None = None) -> dict[str, float]:
        """Steady state of continuous batching with chunked prefill at ``concurrency`` sequences.

        A round gives each of the C running sequences one token and admits C/n_out new prompts
        (their prefill rides in the same steps, vLLM/SGLang chunked prefill): TPOT = round time.
        A step carrying a whole prefill chunk (the step budget less the decodes) is the slow step
        (``tpot_worst_s``: the inter-token latency's tail, vLLM's ITL p99). A request's TPOT is its own
        mean over its n_out − 1 decode steps (vLLM benchmark_serving: (e2e − TTFT)/(n_out − 1)): with a
        share q of the steps carrying a chunk (q from the mean round time), the chunk steps one request
        meets are Binomial(n, q); their 99th percentile gives ``tpot_p99_s`` between the mean and
        the slow step. A new prompt needs cdiv(s_in, budget − C) chunk steps before its first token,
        after waiting for the prompts ahead of it (:func:`prefill_queueing`). ``arrival_rate``
        (requests/s, open loop) defaults to the closed loop of C users, (C − 1) / e2e.
        """
        C = max(concurrency, 1.0)
        ctx = prompt + out / 2.0
        pre_seqs = C / max(out, 1.0)  # prompts admitted per round in steady state
        st = self.step(C, ctx, pre_seqs, prompt)
        tpot = self.stage_to_token(st.total)
        room = max(self.es.max_num_batched_tokens - C, 1.0)
        chunk = min(room, prompt)
        t_chunk = self.stage_to_token(self.step(C, ctx, chunk / max(prompt, 1.0), prompt).total)
        t_dec = self.stage_to_token(self.step(C, ctx).total)
        tpot_p99 = request_tpot_p99(tpot, t_dec, max(t_chunk, tpot), max(out - 1.0, 1.0))
        if C <= 1:
            service = self.prefill_s(1, prompt)
        else:
            service = math.ceil(prompt / room) * t_chunk
        wait, wait99 = prefill_queueing(service, tpot, out, C, arrival_rate)
        tps = C / tpot
        gpus = self.t * self.p
        return {"concurrency": C, "ttft_s": service + wait, "ttft_p99_s": service + wait99,
                "prefill_s": service, "prefill_wait_s": wait, "tpot_s": tpot, "tpot_p99_s": tpot_p99,
                "tpot_worst_s": max(t_chunk, tpot),
                "e2e_s": service + wait + out * tpot, "output_tokens_per_s": tps,
                "output_tokens_per_s_per_gpu": tps / gpus, "requests_per_s": tps / max(out, 1.0),
                "gemm_s": st.gemm, "attention_s": st.attention, "comm_s": st.comm, "other_s": st.other}


#: z-score of the 99th percentile of a normal distribution (long outputs: Binomial -> normal)
Z99 = 2.326
#: decode steps per request up to which the Binomial quantile is summed exactly
EXACT_STEPS = 2048


def binomial_p99(n: int, q: float) -> int:
    """Smallest k with P(Binomial(n, q) <= k) >= 0.99 (exact up to EXACT_STEPS, then normal)."""
    if q <= 0.0:
        return 0
    if q >= 1.0:
        return n
    if n > EXACT_STEPS:
        return min(n, math.ceil(n * q + Z99 * math.sqrt(n * q * (1.0 - q))))
    pmf = (1.0 - q) ** n if n * math.log1p(-q) > -700 else 0.0
    if pmf == 0.0:  # underflow: far from the mode, the normal quantile is exact enough
        return min(n, math.ceil(n * q + Z99 * math.sqrt(n * q * (1.0 - q))))
    cdf, k = pmf, 0
    while cdf < 0.99 and k < n:
        pmf *= (n - k) / (k + 1) * q / (1.0 - q)
        k += 1
        cdf += pmf
    return k


def request_tpot_p99(mean: float, plain: float, slow: float, steps: float) -> float:
    """p99 over requests of a request's mean time per output token.

    Steps take ``plain`` (decodes only) or ``slow`` (decodes plus a prefill chunk) seconds; the share
    q of slow steps follows from the ``mean`` step time. A request of n = ``steps`` decode steps
    meets K ~ Binomial(n, q) slow ones; its TPOT is plain + (K/n)·(slow − plain), at K's 99th
    percentile (:func:`binomial_p99`).
    """
    if slow <= plain:
        return mean
    q = min(max((mean - plain) / (slow - plain), 0.0), 1.0)
    n = max(1, round(steps))
    return max(mean, plain + binomial_p99(n, q) / n * (slow - plain))


#: highest prefill utilization the closed-loop estimate shows (beyond it the queue only grows)
RHO_MAX = 0.95


def prefill_queueing(service: float, tpot: float, out: float, users: float,
                     arrival_rate: float | None = None) -> tuple[float, float]:
    """(mean, p99) wait of a new prompt for the prefills ahead of it.

    Prefills are served one chunk budget at a time, so new prompts queue for the prefill slot: an
    M/D/1 queue with service time S and utilization ρ = λ·S. Mean wait (Pollaczek-Khinchine):
    W = ρ·S / (2(1 − ρ)). p99: the M/M/1 tail P(W > t) = ρ·e^{−(1−ρ)t/S} scaled by Kingman's
    (1 + c_s²)/2 = 1/2 for deterministic service (Kingman 1961, Proc. Camb. Phil. Soc. 57(4)):
    t99 = S·ln(100ρ) / (2(1 − ρ)). Closed loop of C users: λ = (C − 1) / (S + n_out·TPOT).
    """
    if service <= 0:
        return 0.0, 0.0
    lam = arrival_rate if arrival_rate is not None else max(users - 1.0, 0.0) / (service + out * tpot)
    rho = min(lam * service, RHO_MAX)
    if rho <= 0:
        return 0.0, 0.0
    mean = rho * service / (2.0 * (1.0 - rho))
    p99 = service * max(0.0, math.log(100.0 * rho)) / (2.0 * (1.0 - rho))
    return mean, p99


def extra_kernels(kind, m) -> int:
    """Kernels a layer of ``kind`` launches beyond a dense GQA layer (MoE block, MLA attention)."""
    extra = 0
    if kind.is_moe:
        extra += MOE_EXTRA_KERNELS
        if m.moe is not None and m.moe.num_shared_experts:
            extra += SHARED_EXPERT_KERNELS
    if m.mla is not None:
        extra += MLA_EXTRA_KERNELS
    return extra
