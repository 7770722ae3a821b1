"""Time calibration from measured runs: measure the baseline on your machine, then extrapolate.

The analytical step time splits into terms (``ComputeEstimate`` breakdown and compute parts):

    t = f_g · G + f_a · A + f_m · M + f_x · X + F
    G  GEMMs (plus the kernel launches between them)   A  attention kernels
    M  memory-bound work (elementwise, optimizer, FSDP copies)   X  exposed communication
    F  fixed host cost per step

and the pipeline bubble, which is (p-1)/v micro-batches of the same mix, split over the terms in
proportion. A calibration is the factor set f that makes the model reproduce measured step times
of the *same environment*:

* one run: one number cannot separate the terms, so the discrepancy is shared out by how
  uncertain each term's rate is: the factors are the smallest change, in units of each term's
  relative uncertainty σ_k (``TERM_UNCERTAINTY``, from the ranges the efficiency files cite), that
  reproduces the measurement — minimise Σ ((f_k − 1)/σ_k)² subject to Σ f_k·t_k = measured, i.e.
  f_k − 1 = σ_k²·t_k · (measured − Σ t) / Σ σ_j²·t_j². A large, uncertain term (GEMMs of a big
  model, the host cost of a tiny step, exposed communication of a comm-bound layout) takes most of
  it; a term that is a small or well-known share of the step stays near 1;
* two runs at different sequence lengths: the attention share differs between them (it grows ∝ s
  per token while GEMMs do not), so f_a and f_g (= f_m) are solved from the 2×2 linear system.

The factors are keyed by an environment fingerprint — GPU model, power limit, software stack,
matmul dtype (fp8 recipe), attention kernel, kernel fusion — and are refused for an estimate whose
fingerprint differs in the stack, the GPU or the precision (a Megatron-Core factor says nothing
about FSDP2 eager kernels; a bf16 factor nothing about fp8 GEMMs), with the reason.

Measured step times come from ``--measured-step-time``, a Hugging Face ``trainer_state.json``
(``train_runtime`` / ``global_step``, or ``train_steps_per_second``), a torchtitan log (``tps:`` =
tokens/s per GPU), a Megatron-LM / NeMo log (``elapsed time per iteration (ms)``) or a ``verify``
result (``time.measured``). Logs give many steps: the median after the first ``WARMUP_STEPS``
logged ones is used (compilation, allocator warm-up and data-loader start are not the steady state).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainledger.errors import PlanError, SpecError

#: logged steps skipped at the start of a log (torch.compile, NCCL init, allocator warm-up)
WARMUP_STEPS = 2
#: a fitted compute factor outside this range means the measurement does not describe the plan
FACTOR_RANGE = (0.2, 5.0)
#: Relative uncertainty of each term's rate before calibration (one standard deviation), from the
#: published ranges the efficiency files quote (half the range over its midpoint):
#: GEMMs — large bf16 GEMMs 260-280 of 312 TFLOP/s on A100, 700-780 of 989 on H100
#:   (catalog/efficiency/ampere.yaml, hopper.yaml): ±4-5%;
#: attention — FlashAttention-2 on A100 190-225 TFLOP/s (ampere.yaml), cuDNN/FA3 backward 450-550 on
#:   H100 (hopper.yaml, stacks/megatron-core.yaml): ±8-10%;
#: memory-bound kernels — STREAM-like kernels reach 75-85% of the HBM datasheet rate
#:   (hbm_efficiency 0.80 in the family files): ±6%;
#: exposed communication — the hidden share of overlapped TP traffic ~0.6-0.8 (Wang et al. 2023,
#:   arXiv:2302.08005, Fig. 9; interconnect.yaml tp_overlap_fraction 0.7) leaves an exposed share of
#:   0.2-0.4, and overlapped collectives slow GEMMs by 10-30% (interconnect.yaml overlap_slowdown): ±30%;
#: fixed host cost per step — stacks/*.yaml host_step_s is an estimate with no published figure: ±100%.
TERM_UNCERTAINTY = {"gemm": 0.05, "attention": 0.10, "memory": 0.06, "comm": 0.30, "fixed": 1.0}
#: fingerprint keys that must match for a calibration to transfer (the rest is informational)
MUST_MATCH = ("gpu", "framework", "matmul_dtype", "power_limit_w")
#: keys that must match where both the calibration and the estimate state them: the stack's release
#: (NeMo 24.07 and Megatron-Core r0.12 run the same Llama-3 8B FP8 job 12.5% apart per GPU,
#: groundtruth nemo_24_07_perf.yaml vs megatron_lm_readme_scaling.yaml) and the attention kernel
#: (its factor says nothing about another kernel)
MUST_MATCH_IF_STATED = ("stack_version", "attention")


def fingerprint(comp: Mapping[str, Any], plan: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The environment a calibration is valid for, from an estimate's compute dict (and plan)."""
    st = comp.get("stack_profile") or {}
    plan = plan or {}
    runtime = plan.get("runtime") if isinstance(plan.get("runtime"), Mapping) else {}
    return {
        "gpu": st.get("gpu") or plan.get("gpu"),
        "power_limit_w": st.get("power_limit_w", plan.get("power_limit_w")),
        "framework": st.get("framework"), "matmul_dtype": comp.get("matmul_dtype"),
        "stack_version": plan.get("stack_version") or runtime.get("stack_version"),
        "attention": plan.get("attention"), "kernels": st.get("kernels"),
        "gpu_family": st.get("gpu_family"),
    }


def mismatch(cal_fp: Mapping[str, Any], fp: Mapping[str, Any]) -> str | None:
    """Why a calibration of ``cal_fp`` must not be applied to an estimate of ``fp`` (None: it may)."""
    diffs = [f"{k} {cal_fp.get(k)!r} vs {fp.get(k)!r}" for k in MUST_MATCH if cal_fp.get(k) != fp.get(k)]
    diffs += [f"{k} {cal_fp.get(k)!r} vs {fp.get(k)!r}" for k in MUST_MATCH_IF_STATED
              if cal_fp.get(k) and fp.get(k) and cal_fp.get(k) != fp.get(k)]
    if not diffs:
        return None
    return ("calibration refused: measured on another environment (" + "; ".join(diffs) +
            "); a fit transfers only within one GPU, power limit, software stack (and its release, "
            "where stated), attention kernel and precision")


def terms(comp: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per step by calibration term (G, A, M, X, F), the bubble split in proportion."""
    bd, parts = comp["breakdown"], comp["compute_parts"]
    g = parts.get("matmul", 0.0) + parts.get("kernel_overhead", 0.0) + bd.get("tp_split_waves", 0.0)
    a = parts.get("attention", 0.0)
    m = (parts.get("elementwise", 0.0) + bd.get("fsdp_copy", 0.0) + bd.get("ddp_copy", 0.0)
         + bd.get("amp_weight_passes", 0.0)
         + bd.get("offload", 0.0) + bd.get("cp_merge", 0.0))
    x = sum(v for k, v in bd.items() if k.startswith("comm_")) + bd.get("overlap_contention", 0.0)
    per_mb = g + a + m + x
    bubble = bd.get("bubble", 0.0)
    if bubble and per_mb > 0:
        g, a, m, x = (v * (1 + bubble / per_mb) for v in (g, a, m, x))
    m += bd.get("optimizer", 0.0)
    # per step and at no compute rate: the host's step and the allocator's retries (device syncs)
    f = bd.get("data", 0.0) + bd.get("allocator_retries", 0.0)
    return {"gemm": g, "attention": a, "memory": m, "comm": x, "fixed": f}


def calibrated_step_s(comp: Mapping[str, Any], factors: Mapping[str, float]) -> float:
    t = terms(comp)
    return sum(t[k] * float(factors.get(k, 1.0)) for k in t)


def fit(runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any], float]]) -> dict[str, Any]:
    """Factors from one or two measured runs: [(compute dict, fingerprint, measured step s)]."""
    if not runs:
        raise PlanError("calibrate: no measured run given")
    fp0 = runs[0][1]
    for _, fp, _ in runs[1:]:
        why = mismatch(fp0, fp)
        if why:
            raise PlanError(f"calibrate: the runs are of different environments: {why}")
    for _, _, meas in runs:
        if not meas or meas <= 0:
            raise PlanError("calibrate: a measured step time must be > 0 seconds")
    ts = [terms(c) for c, _, _ in runs]
    if len(runs) == 1:
        factors = _uncertainty_weighted(ts[0], runs[0][2])
        method = "one run: the discrepancy shared by each term's size and rate uncertainty"
    elif _collinear(ts):
        f = _ratio_factor(ts, [r[2] for r in runs])  # least squares: (m - X - F) / C
        factors = {"gemm": f, "attention": f, "memory": f, "comm": 1.0, "fixed": 1.0}
        method = "one factor (runs with the same attention share)"
    else:
        (t1, t2), (m1, m2) = ts[:2], (runs[0][2], runs[1][2])
        a11, a12 = t1["gemm"] + t1["memory"], t1["attention"]
        a21, a22 = t2["gemm"] + t2["memory"], t2["attention"]
        b1 = m1 - t1["comm"] - t1["fixed"]
        b2 = m2 - t2["comm"] - t2["fixed"]
        det = a11 * a22 - a12 * a21
        fg = (b1 * a22 - a12 * b2) / det
        fa = (a11 * b2 - a21 * b1) / det
        factors = {"gemm": fg, "attention": fa, "memory": fg, "comm": 1.0, "fixed": 1.0}
        method = "GEMM and attention factors from two runs at different sequence lengths"
    lo, hi = FACTOR_RANGE
    # the compute rates must stay within FACTOR_RANGE; the host and exposed-communication terms
    # (absolute seconds known to within their size) only need to stay non-negative
    bad = {k: v for k, v in factors.items()
           if (k in ("gemm", "attention", "memory") and not lo <= v <= hi) or v < 0}
    if bad:
        raise PlanError(f"calibrate: fitted factors {bad} are outside {lo}-{hi}: the measured step "
                        "time does not describe this plan (check GPUs, batch, sequence length, stack)")
    resid = [calibrated_step_s(c, factors) / m - 1 for c, _, m in runs]
    return {"kind": "time", "factors": factors, "fingerprint": dict(fp0), "n_runs": len(runs),
            "method": method, "residuals": resid,
            "measured_step_s": [r[2] for r in runs],
            "predicted_step_s": [c["step_time_s"] for c, _, _ in runs]}


def _uncertainty_weighted(t: Mapping[str, float], measured: float) -> dict[str, float]:
    """Factors f_k = 1 + σ_k²·t_k·(measured − Σt)/Σσ_j²·t_j²: the least change, in units of
    each term's uncertainty, that reproduces one measured step (see the module docstring)."""
    sig = TERM_UNCERTAINTY
    den = sum((sig[k] * t[k]) ** 2 for k in t)
    if den <= 0:
        raise PlanError("calibrate: the estimate has no time terms to calibrate")
    d = (measured - sum(t.values())) / den
    return {k: 1.0 + d * sig[k] ** 2 * t[k] for k in t}


def _compute(t: Mapping[str, float]) -> float:
    return t["gemm"] + t["attention"] + t["memory"]


def _ratio_factor(ts: list[dict[str, float]], meas: list[float]) -> float:
    num = sum(_compute(t) * (m - t["comm"] - t["fixed"]) for t, m in zip(ts, meas))
    den = sum(_compute(t) ** 2 for t in ts)
    return num / max(den, 1e-24)


def _collinear(ts: list[dict[str, float]]) -> bool:
    """Whether the runs have (nearly) the same attention share: no second factor can be fitted."""
    shares = [t["attention"] / max(_compute(t), 1e-12) for t in ts]
    return max(shares) - min(shares) < 0.02


def apply(comp: Mapping[str, Any], fp: Mapping[str, Any], cal: Mapping[str, Any]) -> dict[str, Any]:
    """The calibrated step time of an estimate, or the reason the calibration does not apply."""
    why = mismatch(cal.get("fingerprint") or {}, fp)
    if why:
        return {"calibrated": False, "reason": why}
    t = calibrated_step_s(comp, cal["factors"])
    return {"calibrated": True, "step_time_s": t, "factors": dict(cal["factors"]),
            "scale": t / comp["step_time_s"], "n_runs": cal.get("n_runs")}


# -- measured step times from logs ----------------------------------------------------------------

_TITAN = re.compile(r"step:\s*(\d+).*?\btps:\s*([\d,\.]+)")
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*\d+.*?elapsed time per iteration \(ms\):\s*([\d\.]+)")


def _median_after_warmup(values: list[float]) -> float:
    if not values:
        raise SpecError("no step timings found in the log")
    steady = values[WARMUP_STEPS:] or values[-1:]
    return statistics.median(steady)


def step_time_from_log(path: str | Path, tokens_per_step: float, gpus: int) -> tuple[float, str]:
    """(measured step seconds, what was read) from a trainer_state.json, torchtitan, Megatron log
    or a verify result JSON."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SpecError(f"{p}: cannot read the log ({exc.strerror})") from None
    if p.suffix == ".json" or text.lstrip().startswith("{"):
        try:
            d = json.loads(text)
        except json.JSONDecodeError:
            d = None
        if isinstance(d, dict):
            if "log_history" in d:  # Hugging Face Trainer state
                for e in reversed(d["log_history"]):
                    if e.get("train_steps_per_second"):
                        return 1.0 / float(e["train_steps_per_second"]), "trainer_state.json train_steps_per_second"
                    if e.get("train_runtime") and d.get("global_step"):
                        return float(e["train_runtime"]) / d["global_step"], "trainer_state.json train_runtime/global_step"
                raise SpecError(f"{p}: trainer_state.json has no train_runtime or "
                                "train_steps_per_second (the run did not finish)")
            t = d.get("time") if isinstance(d.get("time"), dict) else None
            if t and t.get("measured"):
                return float(t["measured"]), "verify result time.measured"
            if d.get("step_time_s"):
                return float(d["step_time_s"]), "step_time_s"
    titan = [float(v.replace(",", "")) for _, v in _TITAN.findall(text)]
    if titan:
        tps = _median_after_warmup(titan)
        return tokens_per_step / (tps * gpus), f"torchtitan tps (median of {len(titan)} logged steps)"
    mega = [float(v) / 1000.0 for _, v in _MEGATRON.findall(text)]
    if mega:
        return _median_after_warmup(mega), f"Megatron elapsed time per iteration ({len(mega)} logged)"
    raise SpecError(f"{p}: no step timings found (expected a trainer_state.json, torchtitan "
                    "'tps:' lines, Megatron 'elapsed time per iteration (ms)' lines or a verify result)")
