"""Goodput of a long run: interruptions, the optimal checkpoint interval, lost work, added days and cost.

Glossary (Daly 2006 symbols):
    λ     unexpected interruptions per GPU-hour        N   GPUs of the job
    M     mean time between interruptions of the job, s: M = 3600 / (λ · N)
    δ     write time of one checkpoint, s (checkpoint section; training pauses while writing)
    R     restart time after an interruption, s (detect, reschedule, reload the checkpoint)
    τ     seconds of training between checkpoints      T_s  failure-free training time, s

    τ_Young = sqrt(2 δ M)                                          (Young 1974, CACM 17(9):530-531)
    τ_Daly  = sqrt(2 δ M) · [1 + ⅓ sqrt(δ/2M) + ⅑ (δ/2M)] − δ   for δ < 2M;  M otherwise
                                                                   (Daly 2006, FGCS 22(3):303-312, higher-order estimate)
    T_w     = M · e^{R/M} · (e^{(τ+δ)/M} − 1) · T_s / τ           (Daly 2006, complete model: expected
              wall-clock time with exponential failures, which may strike while computing,
              checkpointing or restarting)
    goodput = T_s / T_w;  interruptions = T_w / M;  checkpoint time = (T_s/τ)·δ;
    restart time = interruptions · R;  lost work (rework) = T_w − T_s − checkpoint − restart time

The interruption rate defaults to the Llama 3 405B pre-training: 419 unexpected interruptions in a
54-day snapshot on 16,384 H100 GPUs (Dubey et al. 2024, "The Llama 3 Herd of Models",
arXiv:2407.21783, §3.3.4, Table 5), scaled linearly with the job's GPU count (a synchronous job
stops when any of its GPUs, hosts or links fails; 78% of the 419 were hardware). Daly's three
published optima (his Figs. 3-5: δ = 5 min, R = 10 min, M = 24 h / 6 h / 15 min give τ = 117 /
57 / 9.1 min) are golden tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainledger.spec.plan import Plan
from trainledger.units import SECONDS_PER_DAY, SECONDS_PER_HOUR
from trainledger.estimate.run.common import Section, run_figures
from trainledger.estimate.run.checkpoint import FAILURES_PER_GPU_HOUR, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS, LLAMA3_SNAPSHOT_HOURS
from trainledger.estimate.options import CostOptions
from trainledger.estimate.run.prices import PriceCatalog, load_prices
from trainledger.estimate.terms import Term

SRC_LLAMA3 = ("Dubey et al. 2024 (Llama 3, arXiv:2407.21783), §3.3.4, Table 5: 419 unexpected interruptions "
              "in a 54-day snapshot on 16,384 H100 GPUs")
SRC_YOUNG = "Young 1974, CACM 17(9), first-order optimum sqrt(2·δ·M)"
SRC_DALY = "Daly 2006, FGCS 22(3):303-312, higher-order estimate of the optimum interval"
SRC_DALY_TW = "Daly 2006, FGCS 22(3):303-312, complete model: T_w = M·e^(R/M)·(e^((τ+δ)/M) − 1)·T_s/τ"

#: Root causes of the 419 unexpected interruptions (Dubey et al. 2024, Table 5): (component,
#: category, count). The table prints 30.1% for the 148 faulty-GPU interruptions; 148/419 is 35.3%
#: (the other rows match count/419), so shares here are computed from the counts.
LLAMA3_CAUSES: tuple[tuple[str, str, int], ...] = (
    ("Faulty GPU", "GPU", 148), ("GPU HBM3 Memory", "GPU", 72), ("Software Bug", "Dependency", 54),
    ("Network Switch/Cable", "Network", 35), ("Host Maintenance", "Unplanned Maintenance", 32),
    ("GPU SRAM Memory", "GPU", 19), ("GPU System Processor", "GPU", 17), ("NIC", "Host", 7),
    ("NCCL Watchdog Timeouts", "Unknown", 7), ("Silent Data Corruption", "GPU", 6),
    ("GPU Thermal Interface + Sensor", "GPU", 6), ("SSD", "Host", 3), ("Power Supply", "Host", 3),
    ("Server Chassis", "Host", 2), ("IO Expansion Board", "Host", 2), ("Dependency", "Dependency", 2),
    ("CPU", "Host", 2), ("System Memory", "Host", 2),
)
#: Planned interruptions in the same snapshot (firmware upgrades, configuration or dataset updates);
#: they are scheduled after a checkpoint, so they cost a restart but no lost work (§3.3.4).
LLAMA3_PLANNED_INTERRUPTIONS = 47


def job_mtbf_s(failures_per_gpu_hour: float, gpus: int) -> float:
    """Mean time between interruptions of a synchronous job on ``gpus`` GPUs: 3600 / (λ·N) seconds."""
    return SECONDS_PER_HOUR / (failures_per_gpu_hour * gpus)


def expected_interruptions(failures_per_gpu_hour: float, gpus: int, hours: float) -> float:
    """Expected interruptions (Poisson mean) in ``hours`` of wall-clock time on ``gpus`` GPUs: λ·N·h."""
    return failures_per_gpu_hour * gpus * hours


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's first-order optimal checkpoint interval sqrt(2 δ M) (Young 1974, CACM 17(9))."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (Daly 2006): sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + ⅑·(δ/2M)] − δ.

    For δ ≥ 2M the series does not apply and Daly takes τ = M.
    """
    if write_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = write_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * write_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write_s


def daly_wall_s(solve_s: float, interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall-clock seconds to finish ``solve_s`` of work (Daly 2006, complete model).

    T_w = M·e^(R/M)·(e^((τ+δ)/M) − 1)·T_s/τ. Raises OverflowError when the job practically never
    finishes (segments many times longer than the MTBF).
    """
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + write_s) / m) * solve_s / interval_s


@dataclass(frozen=True)
class Goodput:
    """Expected overheads of one run under Daly's model (seconds; the fraction is T_s / T_w)."""

    solve_s: float
    wall_s: float
    interval_s: float
    interruptions: float
    checkpoint_s: float
    restart_s: float
    lost_work_s: float

    @property
    def goodput(self) -> float:
        return self.solve_s / self.wall_s

    @property
    def added_s(self) -> float:
        return self.wall_s - self.solve_s


def goodput(solve_s: float, interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> Goodput:
    """Daly's expected wall time of ``solve_s`` and its split into checkpoints, restarts and lost work."""
    wall = daly_wall_s(solve_s, interval_s, write_s, restart_s, mtbf_s)
    n = wall / mtbf_s
    ck = solve_s / interval_s * write_s
    rs = n * restart_s
    return Goodput(solve_s, wall, interval_s, n, ck, rs, max(wall - solve_s - ck - rs, 0.0))


def cause_breakdown(interruptions: float) -> list[dict[str, Any]]:
    """``interruptions`` split by the Llama 3 root-cause shares (Table 5), largest first."""
    return [{"component": c, "category": cat, "share": k / LLAMA3_INTERRUPTIONS,
             "interruptions": interruptions * k / LLAMA3_INTERRUPTIONS} for c, cat, k in LLAMA3_CAUSES]


def _rate(options: CostOptions) -> tuple[float, str]:
    if options.failures_per_gpu_hour is not None:
        return options.failures_per_gpu_hour, "user (--failures-per-gpu-hour)"
    return FAILURES_PER_GPU_HOUR, SRC_LLAMA3 + f" = {FAILURES_PER_GPU_HOUR:.4g} per GPU-hour"


def _pick(user: float | None, prices: PriceCatalog, key: str, flag: str) -> tuple[float, str]:
    if user is not None:
        return user, f"user ({flag})"
    d = prices.default(key)
    return d.value, d.source


@dataclass(frozen=True)
class GoodputInputs:
    """The resolved inputs of the goodput model, each with where it came from."""

    mtbf_s: float
    write_s: float
    restart_s: float
    interval_s: float
    rate: float
    sources: dict[str, str]


def goodput_inputs(plan: Plan, options: CostOptions, write_s: float,
                   prices: PriceCatalog | None = None) -> GoodputInputs:
    """MTBF, δ, R and τ for ``plan``: the user's checkpoint interval, else Daly's optimum."""
    prices = prices or load_prices(options.prices_file)
    rate, r_src = _rate(options)
    mtbf = job_mtbf_s(rate, plan.cluster.world_size)
    restart, rs_src = _pick(options.restart_s, prices, "restart_s", "--restart-s")
    if options.checkpoint_interval_s is not None:
        tau, t_src = options.checkpoint_interval_s, "user (--checkpoint-interval)"
    else:
        tau, t_src = daly_interval_s(write_s, mtbf), SRC_DALY + " (no --checkpoint-interval given)"
    return GoodputInputs(mtbf, write_s, restart, tau, rate,
                         {"failures_per_gpu_hour": r_src, "restart_s": rs_src, "interval_s": t_src})


def plan_write_s(plan: Plan, options: CostOptions) -> float:
    """δ of ``plan``: the checkpoint section's write time (full checkpoint over the writer nodes)."""
    from trainledger.units import GB
    from trainledger.estimate.run.checkpoint import full_checkpoint_bytes, plan_writer_nodes, write_time_s

    full = full_checkpoint_bytes(plan)
    bw = (options.storage_write_gb_per_s or plan.cluster.storage.write_gb_per_s) * GB
    return write_time_s(full, plan_writer_nodes(plan), bw) if full else 0.0


def wall_factor(plan: Plan, options: CostOptions | None = None) -> float:
    """T_w / T_s of ``plan`` (≥ 1; inf when the run would never finish), for the planner's deadline bound.

    1 for a plan that writes no checkpoint (inference).
    """
    options = options or CostOptions()
    prices = load_prices(options.prices_file)
    write_s = plan_write_s(plan, options)
    if write_s <= 0:
        return 1.0
    gi = goodput_inputs(plan, options, write_s, prices)
    try:
        return 1.0 / goodput(1.0, gi.interval_s, gi.write_s, gi.restart_s, gi.mtbf_s).goodput
    except OverflowError:
        return math.inf


def goodput_section(plan: Plan, options: CostOptions, memory: Any = None, compute: Any = None,
                    time: Any = None, prices: PriceCatalog | None = None, *, checkpoint: Any = None,
                    cost: Any = None) -> Section:
    """The ``goodput`` section: interruptions, Young/Daly intervals, goodput, added days and cost."""
    prices = prices or load_prices(options.prices_file)
    n = plan.cluster.world_size
    notes: list[str] = []
    write_s = float(checkpoint.get("write_s") or 0.0) if checkpoint is not None else 0.0
    if plan.recipe.method == "inference" or write_s <= 0:
        notes.append("no training checkpoint to write: goodput not modeled")
        return Section(values={"goodput": None}, notes=notes)
    gi = goodput_inputs(plan, options, write_s, prices)
    run = run_figures(plan, compute, time)
    solve = run.run_s or SECONDS_PER_DAY  # the fractions do not depend on T_s
    v: dict[str, Any] = {"mtbf_s": gi.mtbf_s, "failures_per_gpu_hour": gi.rate, "write_s": write_s,
                         "restart_s": gi.restart_s, "young_interval_s": young_interval_s(write_s, gi.mtbf_s),
                         "daly_interval_s": daly_interval_s(write_s, gi.mtbf_s), "interval_s": gi.interval_s}
    try:
        g = goodput(solve, gi.interval_s, write_s, gi.restart_s, gi.mtbf_s)
        opt = goodput(solve, v["daly_interval_s"], write_s, gi.restart_s, gi.mtbf_s)
    except OverflowError:
        notes.append(f"the job practically never finishes: MTBF {gi.mtbf_s:,.0f} s is far shorter than a "
                     f"checkpoint interval plus its write ({gi.interval_s + write_s:,.0f} s); use fewer GPUs, "
                     "faster checkpoints or a lower failure rate")
        v["goodput"] = 0.0
        return Section(values=v, inputs=dict(gi.sources), notes=notes)
    v["goodput"] = g.goodput
    v["goodput_at_daly_interval"] = opt.goodput
    if run.run_s:
        _run_values(v, g, n, cost)
    else:
        notes.append("no run length: give --tokens for the interruptions, added days and cost of the run")
    v["causes"] = cause_breakdown(v.get("interruptions") or 0.0)
    inputs = {"gpus": n, "solve_s": run.run_s, **{f"{k}_source": s for k, s in gi.sources.items()}}
    notes.append("interruptions scale linearly with GPU count (Poisson, exponential inter-arrival); planned "
                 f"maintenance ({LLAMA3_PLANNED_INTERRUPTIONS} in the Llama 3 snapshot) is left out")
    return Section(values=v, inputs=inputs, terms=_terms(v, gi), notes=notes)


def _run_values(v: dict[str, Any], g: Goodput, n: int, cost: Any) -> None:
    v.update(solve_s=g.solve_s, wall_s=g.wall_s, wall_days=g.wall_s / SECONDS_PER_DAY,
             interruptions=g.interruptions, checkpoint_s=g.checkpoint_s, restart_total_s=g.restart_s,
             lost_work_s=g.lost_work_s, added_s=g.added_s, added_days=g.added_s / SECONDS_PER_DAY,
             added_gpu_hours=g.added_s * n / SECONDS_PER_HOUR)
    price = cost.get("usd_per_gpu_hour") if cost is not None else None
    v["added_usd"] = v["added_gpu_hours"] * price if price else None
    base = cost.get("cloud_usd") if cost is not None else None
    v["cloud_usd_with_failures"] = base + v["added_usd"] if base is not None and v["added_usd"] is not None else None


def _terms(v: dict[str, Any], gi: GoodputInputs) -> list[Term]:
    out = [Term("mtbf_s", gi.mtbf_s, "s", gi.sources["failures_per_gpu_hour"],
                "3600 / (λ·N): any GPU's failure stops the synchronous job"),
           Term("young_interval_s", v["young_interval_s"], "s", SRC_YOUNG),
           Term("daly_interval_s", v["daly_interval_s"], "s", SRC_DALY),
           Term("restart_s", gi.restart_s, "s", gi.sources["restart_s"])]
    if v.get("wall_s") is not None:
        out.append(Term("wall_s", v["wall_s"], "s", SRC_DALY_TW,
                        "exponential failures; failures may also strike while checkpointing or restarting"))
    return out


__all__ = ["LLAMA3_CAUSES", "LLAMA3_GPUS", "LLAMA3_INTERRUPTIONS", "LLAMA3_SNAPSHOT_HOURS", "Goodput",
           "cause_breakdown", "daly_interval_s", "daly_wall_s", "expected_interruptions", "goodput",
           "goodput_section", "job_mtbf_s", "wall_factor", "young_interval_s"]
