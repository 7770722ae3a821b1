"""Energy of a training run: GPU power at the predicted utilization, node overhead, PUE.

Glossary:
    P_idle, P_tdp  GPU idle power and board power (TDP), W       u    GPU busy fraction (0..1)
    f_busy         fraction of TDP a GPU draws while busy         P_n  non-GPU power of a node, W
    H_gpu          GPU-hours of the run                           g    GPUs per node
    PUE            facility power / IT power

    P_gpu = P_idle + (f_busy · P_tdp − P_idle) · u                  (linear power model)
    E_IT  = H_gpu · P_gpu + (H_gpu / g) · P_n                        (Wh)
    E     = E_IT · PUE / 1000                                        (kWh)

The linear utilization model is the one of Fan, Weber & Barroso 2007, "Power provisioning for a
warehouse-sized computer" (ISCA '07, §4.1: P(u) = P_idle + (P_busy − P_idle)·u). The busy power
defaults to TDP, as in Touvron et al. 2023 (Llama 2, arXiv:2307.09288, Table 2), which makes the
GPU term an upper bound; real training draws somewhat less. The node overhead defaults to the
non-GPU share of the server's maximum system power (DGX H100: 10.2 kW max with 8 × 700 W GPUs,
NVIDIA DGX H100 User Guide), also an upper bound.
"""

from __future__ import annotations

from typing import Any

from trainledger.spec.plan import Plan
from trainledger.spec.base import Spec
from trainledger.estimate.run.common import RunFigures, Section, run_figures
from trainledger.estimate.options import CostOptions
from trainledger.estimate.memo import last_call
from trainledger.estimate.run.prices import PriceCatalog, load_prices
from trainledger.estimate.terms import Term

#: Idle power when a GPU spec gives none: 20% of TDP (the default documented on GpuSpec.idle_w).
IDLE_FRACTION_OF_TDP = 0.20

SRC_LINEAR = "Fan, Weber & Barroso 2007 (ISCA), §4.1 linear power model P(u) = P_idle + (P_busy - P_idle)·u"


def gpu_average_power_w(tdp_w: float, idle_w: float, busy_fraction: float,
                        busy_power_fraction: float = 1.0) -> float:
    """Average GPU power (W): linear between idle and ``busy_power_fraction`` × TDP by busy fraction."""
    busy_w = busy_power_fraction * tdp_w
    return idle_w + (busy_w - idle_w) * busy_fraction


def node_overhead_w(gpus_per_node: int, tdp_w: float, *, system_max_w: float | None = None,
                    gpus_per_server: int | None = None, overhead_fraction: float = 0.0) -> float:
    """Non-GPU power per node (CPUs, memory, NICs, fans, storage), W.

    With a server's maximum system power: (system_max − gpus_per_server · TDP), scaled to the
    node's GPU count. Otherwise ``overhead_fraction`` × the node's GPU TDP.
    """
    if system_max_w is not None and gpus_per_server:
        per_gpu = max(system_max_w - gpus_per_server * tdp_w, 0.0) / gpus_per_server
        return per_gpu * gpus_per_node
    return overhead_fraction * gpus_per_node * tdp_w


def energy_kwh(gpu_hours: float, gpu_power_w: float, *, gpus_per_node: int = 8,
               node_overhead_w: float = 0.0, pue: float = 1.0) -> float:
    """Facility energy (kWh) of ``gpu_hours`` at ``gpu_power_w`` per GPU plus node overhead, × PUE.

    E = (H_gpu · P_gpu + H_gpu / g · P_n) · PUE / 1000. Example: Llama 2 7B, 184,320 A100
    GPU-hours at 400 W, PUE 1, no overhead: 73,728 kWh (Touvron et al. 2023, Table 2).
    """
    node_hours = gpu_hours / gpus_per_node
    return (gpu_hours * gpu_power_w + node_hours * node_overhead_w) * pue / 1000.0


def carbon_kg(kwh: float, kg_per_kwh: float) -> float:
    """CO2-equivalent emissions (kg) of ``kwh`` at a grid intensity in kg/kWh."""
    return kwh * kg_per_kwh


class PowerModel(Spec):
    """The resolved power inputs of a plan (W), each with where it came from."""

    gpu_power_w: float
    tdp_w: float
    idle_w: float
    busy_fraction: float
    busy_power_fraction: float
    node_overhead_w: float
    gpus_per_node: int
    pue: float
    sources: dict[str, str]

    @property
    def node_power_w(self) -> float:
        """IT power of one node: its GPUs plus the overhead."""
        return self.gpus_per_node * self.gpu_power_w + self.node_overhead_w


def power_model(plan: Plan, options: CostOptions, run: RunFigures,
                prices: PriceCatalog | None = None) -> PowerModel:
    """Resolve the power inputs of ``plan``: option overrides, then the catalog's defaults.

    Remembered for the last (plan, options, run, prices) objects: the energy and the cost
    section of one ledger ask in turn (plan, options and run are frozen, the price catalog is
    the one ``load_prices`` caches and shares; the result is frozen)."""
    return _power_model(plan, options, run, prices or load_prices(options.prices_file))


@last_call
def _power_model(plan: Plan, options: CostOptions, run: RunFigures, prices: PriceCatalog) -> PowerModel:
    gpu, c = plan.cluster.gpu, plan.cluster
    idle = gpu.idle_w if gpu.idle_w is not None else IDLE_FRACTION_OF_TDP * gpu.tdp_w
    f_busy = prices.default("gpu_busy_power_fraction")
    src = {"tdp_w": f"{gpu.display_name} datasheet ({gpu.source})",
           "idle_w": "GPU spec" if gpu.idle_w is not None else "assumed 20% of TDP (GpuSpec.idle_w default)",
           "busy_fraction": run.busy_source, "busy_power_fraction": f_busy.source}
    if options.gpu_power_w is not None:
        p_gpu, src["gpu_power_w"] = options.gpu_power_w, "user (--gpu-power-w)"
    else:
        p_gpu = gpu_average_power_w(gpu.tdp_w, idle, run.busy_fraction, f_busy.value)
        src["gpu_power_w"] = SRC_LINEAR
    server = prices.server_for(gpu.name)
    if options.node_overhead_w is not None:
        p_node, src["node_overhead_w"] = options.node_overhead_w, "user (--node-overhead-w)"
    elif server is not None and server.system_power_max_w:
        p_node = node_overhead_w(c.gpus_per_node, gpu.tdp_w, system_max_w=server.system_power_max_w,
                                 gpus_per_server=server.gpus_per_server)
        src["node_overhead_w"] = f"{server.display_name}: system max {server.system_power_max_w:.0f} W " \
                                 f"minus GPU TDP ({server.system_power_source or server.source})"
    else:
        frac = prices.default("node_overhead_fraction")
        p_node = node_overhead_w(c.gpus_per_node, gpu.tdp_w, overhead_fraction=frac.value)
        src["node_overhead_w"] = frac.source
    pue_v = options.pue if options.pue is not None else prices.default("pue").value
    src["pue"] = "user (--pue)" if options.pue is not None else prices.default("pue").source
    return PowerModel(gpu_power_w=p_gpu, tdp_w=gpu.tdp_w, idle_w=idle, busy_fraction=run.busy_fraction,
                      busy_power_fraction=f_busy.value, node_overhead_w=p_node,
                      gpus_per_node=c.gpus_per_node, pue=pue_v, sources=src)


def energy_section(plan: Plan, options: CostOptions, memory: Any = None, compute: Any = None,
                   time: Any = None, prices: PriceCatalog | None = None) -> Section:
    """The ``energy`` section: facility power, kWh per step, per run and per token, CO2."""
    prices = prices or load_prices(options.prices_file)
    run = run_figures(plan, compute, time)
    pm = power_model(plan, options, run, prices)
    c = plan.cluster
    facility_kw = pm.node_power_w * c.nodes * pm.pue / 1000.0
    intensity = options.carbon_kg_per_kwh
    i_src = "user (--carbon-kg-per-kwh)"
    if intensity is None:
        d = prices.default("carbon_kg_per_kwh")
        intensity, i_src = d.value, d.source
    v: dict[str, Any] = {"kwh": None, "kwh_per_token": None, "kwh_per_million_tokens": None,
                         "gpu_kwh": None, "node_overhead_kwh": None, "cooling_and_losses_kwh": None,
                         "facility_power_kw": facility_kw, "kwh_per_step": None, "co2_kg": None}
    if run.step_time_s:
        v["kwh_per_step"] = facility_kw * run.step_time_s / 3600.0
    inputs = {"gpu_hours": run.gpu_hours, "gpus": c.world_size, "nodes": c.nodes,
              **pm.model_dump(exclude={"sources"}), "carbon_kg_per_kwh": intensity,
              "tokens": plan.recipe.train_tokens, "step_time_s": run.step_time_s}
    terms = [Term("gpu_power_w", pm.gpu_power_w, "W", pm.sources["gpu_power_w"],
                  "P_gpu = P_idle + (f_busy·TDP - P_idle)·u", {"u": pm.busy_fraction}),
             Term("node_overhead_w", pm.node_overhead_w, "W", pm.sources["node_overhead_w"],
                  "non-GPU power per node at the server's maximum (upper bound)"),
             Term("pue", pm.pue, "ratio", pm.sources["pue"])]
    notes = []
    if run.gpu_hours:
        kwh = energy_kwh(run.gpu_hours, pm.gpu_power_w, gpus_per_node=pm.gpus_per_node,
                         node_overhead_w=pm.node_overhead_w, pue=pm.pue)
        gpu_kwh = run.gpu_hours * pm.gpu_power_w / 1000.0
        node_kwh = run.gpu_hours / pm.gpus_per_node * pm.node_overhead_w / 1000.0
        v.update(kwh=kwh, gpu_kwh=gpu_kwh, node_overhead_kwh=node_kwh,
                 cooling_and_losses_kwh=max(0.0, kwh - gpu_kwh - node_kwh),  # PUE 1: no -1e-15
                 co2_kg=carbon_kg(kwh, intensity))
        v["kwh_trace"] = (f"({run.gpu_hours:,.1f} GPU-h × {pm.gpu_power_w:,.0f} W + "
                          f"{run.gpu_hours / pm.gpus_per_node:,.1f} node-h × {pm.node_overhead_w:,.0f} W) "
                          f"× PUE {pm.pue:g} / 1000")
        if plan.recipe.train_tokens:
            v["kwh_per_token"] = kwh / plan.recipe.train_tokens
            v["kwh_per_million_tokens"] = kwh / plan.recipe.train_tokens * 1e6
        terms.append(Term("kwh", kwh, "kWh", "energy_kwh(): (H_gpu·P_gpu + H_gpu/g·P_n)·PUE/1000",
                          detail={"gpu_hours": run.gpu_hours}))
        terms.append(Term("co2_kg", v["co2_kg"], "kg", i_src, "kWh × grid intensity"))
    else:
        notes.append("no run length: give --tokens (and a time model) for kWh per run and per token")
    return Section(values=v, inputs=inputs, terms=terms, notes=notes)
