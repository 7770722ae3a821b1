"""Money: the run's cost in the cloud and on owned hardware, and the break-even month.

Glossary:
    H      GPU-hours of the run                 p_c   cloud price, USD per GPU-hour
    C      purchase price per GPU (server price / GPUs per server)
    L      lifetime, years                       m     yearly maintenance, fraction of C
    u      utilization of the owned hardware     e     electricity price, USD/kWh
    P      IT power per GPU while running, incl. its share of node overhead, W

    cloud  = H · p_c
    owned  = H · [ C · (1/L + m) / (8760 · u) ] + E_run · e       (E_run: kWh with PUE)
    month  = C·n/(12·L) + C·n·m/12 + 730 · n · (u·P + (1−u)·P_idle) · PUE/1000 · e   (n GPUs)
    break-even month  n* = C·n / (cloud_month(u) − opex_month(u)),  cloud_month(u) = 730·u·n·p_c

Owned hardware is written off straight-line over L years with no cost of capital; each used
GPU-hour carries the cost of the idle ones (÷ u). Cash break-even compares cumulative spend:
the purchase plus maintenance and electricity against renting the same used hours.
"""

from __future__ import annotations

import math
from typing import Any

from trainledger.errors import CatalogError
from trainledger.spec.plan import Plan
from trainledger.estimate.run.common import RunFigures, Section, run_figures
from trainledger.estimate.run.energy import PowerModel, energy_kwh, energy_section, power_model
from trainledger.estimate.options import CostOptions, EstimateOptions
from trainledger.estimate.run.prices import PriceCatalog, Quote, load_prices
from trainledger.estimate.terms import Term

HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12.0  # 730


def cloud_cost_usd(gpu_hours: float, usd_per_gpu_hour: float) -> float:
    """Cost of renting ``gpu_hours`` at ``usd_per_gpu_hour``."""
    return gpu_hours * usd_per_gpu_hour


def owned_fixed_usd_per_gpu_hour(capex_per_gpu: float, lifetime_years: float,
                                 maintenance_fraction: float, utilization: float) -> float:
    """Depreciation + maintenance per *used* GPU-hour: C·(1/L + m) / (8760·u)."""
    return capex_per_gpu * (1.0 / lifetime_years + maintenance_fraction) / (HOURS_PER_YEAR * utilization)


def owned_run_cost_usd(gpu_hours: float, capex_per_gpu: float, lifetime_years: float,
                       maintenance_fraction: float, utilization: float, kwh: float,
                       usd_per_kwh: float) -> dict[str, float]:
    """Cost of the run on owned hardware, by part: depreciation, maintenance, electricity."""
    per_h = HOURS_PER_YEAR * utilization
    dep = gpu_hours * capex_per_gpu / lifetime_years / per_h
    maint = gpu_hours * capex_per_gpu * maintenance_fraction / per_h
    elec = kwh * usd_per_kwh
    return {"depreciation_usd": dep, "maintenance_usd": maint, "electricity_usd": elec,
            "total_usd": dep + maint + elec}


def owned_monthly_usd(n_gpus: int, capex_per_gpu: float, lifetime_years: float,
                      maintenance_fraction: float, utilization: float, run_w_per_gpu: float,
                      idle_w_per_gpu: float, pue: float, usd_per_kwh: float) -> dict[str, float]:
    """Monthly cost of owning ``n_gpus``: write-off, maintenance, electricity at utilization u.

    ``run_w_per_gpu`` / ``idle_w_per_gpu`` include the GPU's share of node overhead (IT power).
    """
    capex = capex_per_gpu * n_gpus
    avg_w = utilization * run_w_per_gpu + (1.0 - utilization) * idle_w_per_gpu
    elec = HOURS_PER_MONTH * n_gpus * avg_w * pue / 1000.0 * usd_per_kwh
    dep = capex / (12.0 * lifetime_years)
    maint = capex * maintenance_fraction / 12.0
    return {"depreciation_usd": dep, "maintenance_usd": maint, "electricity_usd": elec,
            "total_usd": dep + maint + elec, "cash_opex_usd": maint + elec}


def break_even_month(capex: float, cloud_monthly_usd: float, owned_opex_monthly_usd: float) -> float | None:
    """Month at which buying (capex + running costs) has cost as much as renting; None: never."""
    saving = cloud_monthly_usd - owned_opex_monthly_usd
    if saving <= 0:
        return None
    return capex / saving


def cloud_quote(gpu: str, options: CostOptions | None = None, prices: PriceCatalog | None = None) -> Quote:
    """The price per GPU-hour the options ask for: the user's, a provider's, or the cheapest.

    ``--price-per-gpu-hour`` wins; else the named provider's price in the tier; with no provider,
    the cheapest catalog price of the tier for this GPU. Raises CatalogError when there is none.
    """
    options = options or CostOptions()
    prices = prices or load_prices(options.prices_file)
    if options.price_per_gpu_hour is not None:
        return Quote(options.provider or "user", options.pricing, options.price_per_gpu_hour,
                     "user (--price-per-gpu-hour)")
    if options.provider:
        return prices.quote(gpu, options.provider, options.pricing)
    tier = [q for q in prices.quotes_for(gpu) if q.tier == options.pricing]
    if not tier:
        raise CatalogError(f"no {options.pricing} price for GPU {gpu!r} in the price catalog; give "
                           f"--price-per-gpu-hour, --pricing or a --prices FILE (`trainledger prices`)")
    return tier[0]


def usd_per_gpu_hour(gpu: str, options: CostOptions | None = None) -> float | None:
    """:func:`cloud_quote`'s price, or None when the catalog has none (for ranking plans)."""
    try:
        return cloud_quote(gpu, options).usd_per_gpu_hour
    except CatalogError:
        return None


def _h(h: float) -> str:
    """GPU-hours in a trace: two significant digits below 10 (a short run is not '0.0 GPU-h')."""
    return f"{h:,.1f}" if h >= 10 else f"{h:.2g}"


def _cloud_quote(plan: Plan, options: CostOptions, prices: PriceCatalog) -> Quote:
    return cloud_quote(plan.cluster.gpu.name, options, prices)


def _owned_inputs(plan: Plan, options: CostOptions, prices: PriceCatalog) -> dict[str, Any] | None:
    server = prices.server_for(plan.cluster.gpu.name)
    price = options.server_price_usd if options.server_price_usd is not None else (server.usd if server else None)
    if price is None:
        return None
    per_server = options.gpus_per_server or (server.gpus_per_server if server else plan.cluster.gpus_per_node)

    def pick(opt: float | None, key: str, flag: str) -> tuple[float, str]:
        if opt is not None:
            return opt, f"user ({flag})"
        d = prices.default(key)
        return d.value, d.source

    out: dict[str, Any] = {"server_price_usd": price, "gpus_per_server": per_server,
                           "capex_per_gpu_usd": price / per_server,
                           "server": server.display_name if server and options.server_price_usd is None else "user",
                           "sources": {"server_price_usd": server.source if server and options.server_price_usd is None
                                       else "user (--server-price)"}}
    for name, opt, key, flag in (("lifetime_years", options.lifetime_years, "lifetime_years", "--lifetime-years"),
                                 ("maintenance_fraction", options.maintenance_fraction,
                                  "maintenance_fraction_per_year", "--maintenance-fraction"),
                                 ("utilization", options.utilization, "utilization", "--utilization"),
                                 ("electricity_usd_per_kwh", options.electricity_usd_per_kwh,
                                  "electricity_usd_per_kwh", "--electricity-price")):
        out[name], out["sources"][name] = pick(opt, key, flag)
    return out


def _monthly(plan: Plan, pm: PowerModel, own: dict[str, Any]) -> dict[str, float]:
    share = pm.node_overhead_w / pm.gpus_per_node
    return owned_monthly_usd(plan.cluster.world_size, own["capex_per_gpu_usd"], own["lifetime_years"],
                             own["maintenance_fraction"], own["utilization"], pm.gpu_power_w + share,
                             pm.idle_w + share, pm.pue, own["electricity_usd_per_kwh"])


def _break_even(v: dict[str, Any], notes: list[str], own: dict[str, Any], month: dict[str, float],
                n: int, usd_per_gpu_hour: float) -> None:
    v["cloud_usd_per_month"] = HOURS_PER_MONTH * own["utilization"] * n * usd_per_gpu_hour
    capex = own["capex_per_gpu_usd"] * n
    v["break_even_month"] = break_even_month(capex, v["cloud_usd_per_month"], month["cash_opex_usd"])
    v["break_even_trace"] = (f"capex ${capex:,.0f} / (cloud ${v['cloud_usd_per_month']:,.0f}/month − "
                             f"opex ${month['cash_opex_usd']:,.0f}/month) at utilization {own['utilization']:.0%}")
    if v["break_even_month"] is None:
        notes.append("owning never breaks even: running costs exceed the cloud bill at this utilization")
    elif v["break_even_month"] > 12 * own["lifetime_years"]:
        notes.append("break-even comes after the hardware's lifetime")


def _cloud_part(plan: Plan, run: RunFigures, quote: Quote, prices: PriceCatalog, v: dict[str, Any],
                terms: list[Term]) -> None:
    """Cloud cost of the run: GPU-hours × price, and the same hours at every catalog price."""
    h = run.gpu_hours
    v["cloud_usd"] = cloud_cost_usd(h, quote.usd_per_gpu_hour)
    v["cloud_trace"] = f"{_h(h)} GPU-h × ${quote.usd_per_gpu_hour:,.4g}/GPU-h"
    terms.append(Term("cloud_usd", v["cloud_usd"], "usd", quote.source, "GPU-hours × price per GPU-hour"))
    if plan.recipe.train_tokens:
        v["cloud_usd_per_million_tokens"] = v["cloud_usd"] / plan.recipe.train_tokens * 1e6
    v["cloud_quotes"] = [{"provider": q.provider, "pricing": q.tier, "usd_per_gpu_hour": q.usd_per_gpu_hour,
                          "cloud_usd": cloud_cost_usd(h, q.usd_per_gpu_hour)}
                         for q in prices.quotes_for(plan.cluster.gpu.name)]


def _owned_part(run: RunFigures, pm: PowerModel, own: dict[str, Any], v: dict[str, Any],
                terms: list[Term]) -> None:
    """Owned cost of the run: write-off and maintenance of the used hours, electricity of the run."""
    h = run.gpu_hours
    kwh = energy_kwh(h, pm.gpu_power_w, gpus_per_node=pm.gpus_per_node,
                     node_overhead_w=pm.node_overhead_w, pue=pm.pue)
    parts = owned_run_cost_usd(h, own["capex_per_gpu_usd"], own["lifetime_years"], own["maintenance_fraction"],
                               own["utilization"], kwh, own["electricity_usd_per_kwh"])
    v["owned_usd"] = parts["total_usd"]
    v["owned_breakdown"] = parts
    v["owned_trace"] = (f"{_h(h)} GPU-h × ${own['capex_per_gpu_usd']:,.0f}/GPU × "
                        f"(1/{own['lifetime_years']:g} y + {own['maintenance_fraction']:g}/y) / "
                        f"(8760 h × {own['utilization']:g}) + {kwh:,.1f} kWh × ${own['electricity_usd_per_kwh']:g}/kWh")
    terms.append(Term("owned_usd", v["owned_usd"], "usd", own["sources"]["server_price_usd"],
                      "straight-line write-off, no cost of capital; idle hours charged to used ones"))


def cost_section(plan: Plan, options: CostOptions, memory: Any = None, compute: Any = None,
                 time: Any = None, prices: PriceCatalog | None = None) -> Section:
    """The ``cost`` section: cloud cost, owned cost of the run and per month, break-even month."""
    prices = prices or load_prices(options.prices_file)
    run = run_figures(plan, compute, time)
    pm = power_model(plan, options, run, prices)
    terms: list[Term] = []
    notes: list[str] = []
    try:
        quote: Quote | None = _cloud_quote(plan, options, prices)
    except CatalogError as exc:
        if options.provider and options.provider.lower() not in prices.clouds:
            raise
        quote = None
        notes.append(f"{exc}")
    n = plan.cluster.world_size
    v: dict[str, Any] = {"cloud_usd": None, "owned_usd": None,
                         "usd_per_gpu_hour": quote.usd_per_gpu_hour if quote else None,
                         "provider": quote.provider if quote else options.provider, "pricing": options.pricing,
                         "cloud_usd_per_million_tokens": None, "owned_usd_per_month": None,
                         "cloud_usd_per_month": None, "break_even_month": None}
    if quote is not None:
        v["cloud_usd_per_hour"] = n * quote.usd_per_gpu_hour
    inputs: dict[str, Any] = {"gpu_hours": run.gpu_hours, "gpus": n,
                              "price": {**quote.detail, "source": quote.source} if quote else None}
    if not run.gpu_hours:
        notes.append("no run length: give --tokens (and a time model) for the cost of the run")
    elif quote is not None:
        _cloud_part(plan, run, quote, prices, v, terms)
    own = _owned_inputs(plan, options, prices)
    if own is None:
        notes.append(f"no server price for {plan.cluster.gpu.name}: give --server-price for the owned cost")
        return Section(values=v, inputs=inputs, terms=terms, notes=notes)
    inputs["owned"] = own
    inputs["power"] = pm.model_dump(exclude={"sources"})
    month = _monthly(plan, pm, own)
    v["owned_usd_per_month"] = month["total_usd"]
    v["owned_month_breakdown"] = month
    if quote is not None:
        _break_even(v, notes, own, month, n, quote.usd_per_gpu_hour)
    if run.gpu_hours:
        _owned_part(run, pm, own, v, terms)
    return Section(values=v, inputs=inputs, terms=terms, notes=notes)


def run_cost_usd(plan: Plan, time_estimate: Any, options: CostOptions | EstimateOptions | None = None) -> float:
    """Cloud cost of the run (USD) for ranking plans; ``inf`` when the run length is unknown.

    ``time_estimate`` is the time model's result (anything with ``total_s``/``gpu_hours`` or
    ``step_time_s``); the price comes from ``options`` (flags) or the catalog.
    """
    if isinstance(options, EstimateOptions):
        options = options.cost
    options = options or CostOptions()
    run = run_figures(plan, time_estimate, time_estimate)
    if not run.gpu_hours:
        return math.inf
    quote = _cloud_quote(plan, options, load_prices(options.prices_file))
    return cloud_cost_usd(run.gpu_hours, quote.usd_per_gpu_hour)


__all__ = ["cloud_quote", "usd_per_gpu_hour", "cloud_cost_usd", "owned_fixed_usd_per_gpu_hour", "owned_run_cost_usd", "owned_monthly_usd",
           "break_even_month", "cost_section", "run_cost_usd", "energy_section"]
