"""The facility sheet: what a data-centre team asks before the order — power per node and rack,
racks and floor space, UPS capacity with redundancy, cooling load, facility power with PUE.

Glossary:
    P_n   maximum power of one GPU server, W (the server datasheet's system maximum; without a
          server file, g · TDP · (1 + overhead fraction), the energy section's node overhead rule)
    n     nodes of the plan             g   GPUs per node         P_r  rack power budget, W
    U_r   rack units of a rack          U_n rack units of a node  pf   power factor
    nodes per rack  k = min(floor(P_r / P_n), floor(U_r / U_n))   racks = ceil(n / k)
    IT peak        P_IT = n · P_n
    UPS            S = P_IT / pf (kVA); N+r: ceil(S / module) + r modules; 2N: 2 · ceil(S / module)
    cooling        Q = P_IT (all electrical power ends as heat) = P_IT · 3.412142 BTU/h per W
                   = P_IT / 3516.85 tons of refrigeration (1 ton = 12,000 BTU/h)
    facility peak  P_IT · PUE

Unit definitions: 1 W = 3.412142 BTU(IT)/h; 1 ton of refrigeration = 12,000 BTU/h = 3.51685 kW
(ASHRAE Handbook—Fundamentals, SI/I-P conversion factors). Defaults are in
``catalog/prices/datacenter.yaml`` and ``facility.yaml`` with their sources; the sheet lists the
source of every row. Network switches, storage and management servers are not counted.
"""

from __future__ import annotations

import math
from typing import Any

from trainledger.estimate.run.prices import PriceCatalog, load_prices
from trainledger.spec.plan import Plan

#: BTU (International Table) per hour in one watt (ASHRAE Handbook—Fundamentals, conversion factors).
BTU_PER_H_PER_W = 3.412142
#: Watts in one ton of refrigeration (12,000 BTU/h by definition).
W_PER_TON = 12_000 / BTU_PER_H_PER_W


def node_power_w(plan: Plan, prices: PriceCatalog) -> tuple[float, str]:
    """Maximum power of one node: the server datasheet's, scaled to the node's GPUs, or TDP-based."""
    c = plan.cluster
    server = prices.server_for(c.gpu.name)
    if server is not None and server.system_power_max_w:
        w = server.system_power_max_w * c.gpus_per_node / server.gpus_per_server
        return w, f"{server.system_power_source or server.source} ({server.display_name or server.name})"
    f = prices.default("node_overhead_fraction")
    tdp = c.gpu.tdp_w
    return (c.gpus_per_node * tdp * (1 + f.value),
            f"{c.gpus_per_node} x {tdp:g} W TDP x (1 + {f.value:g} node overhead); overhead: {f.source}")


def ups_modules(kva: float, module_kva: float, redundant: int) -> int:
    """Modules of an N+r UPS carrying ``kva``."""
    return math.ceil(kva / module_kva) + redundant


def facility_sheet(plan: Plan, est: dict[str, Any] | None = None, prices: PriceCatalog | None = None) -> dict[str, Any]:
    """Rows of the facility sheet (item, value, source) and the figures behind them (W, m², kVA)."""
    prices = prices or load_prices()
    d = {k: prices.default(k) for k in ("rack_power_kw", "rack_units", "node_rack_units", "rack_floor_m2",
                                        "ups_power_factor", "ups_module_kva", "ups_redundant_modules", "pue")}
    c = plan.cluster
    p_node, p_src = node_power_w(plan, prices)
    by_power = math.floor(d["rack_power_kw"].value * 1000 / p_node)
    by_space = math.floor(d["rack_units"].value / d["node_rack_units"].value)
    per_rack = max(1, min(by_power, by_space))
    racks = math.ceil(c.nodes / per_rack)
    it_w = c.nodes * p_node
    kva = it_w / d["ups_power_factor"].value / 1000
    mod, red = d["ups_module_kva"].value, int(d["ups_redundant_modules"].value)
    n_plus = ups_modules(kva, mod, red)
    two_n = 2 * math.ceil(kva / mod)
    pue = (est or {}).get("energy", {}).get("inputs", {}).get("pue") or d["pue"].value
    f = {"node_power_w": p_node, "nodes": c.nodes, "nodes_per_rack": per_rack, "racks": racks,
         "rack_power_w": per_rack * p_node, "it_peak_w": it_w, "ups_kva": kva, "ups_modules_n_plus": n_plus,
         "ups_modules_2n": two_n, "ups_installed_kva_n_plus": n_plus * mod, "ups_installed_kva_2n": two_n * mod,
         "cooling_btu_per_h": it_w * BTU_PER_H_PER_W, "cooling_tons": it_w / W_PER_TON,
         "facility_peak_w": it_w * pue, "pue": pue, "floor_m2": racks * d["rack_floor_m2"].value,
         "limited_by": "power" if by_power < by_space else "rack space"}
    avg_kw = (est or {}).get("energy", {}).get("facility_power_kw")
    if avg_kw is not None:
        f["facility_average_w"] = avg_kw * 1000
    return {"figures": f, "rows": _rows(f, d, p_src, red, mod, avg_kw)}


def _rows(f: dict[str, Any], d: dict[str, Any], p_src: str, red: int, mod: float, avg_kw: float | None) -> list[dict]:
    kw = lambda w: f"{w / 1000:,.1f} kW"  # noqa: E731
    rows = [
        {"item": "peak power per node", "value": kw(f["node_power_w"]), "source": p_src},
        {"item": "nodes per rack", "value": f"{f['nodes_per_rack']} (limited by {f['limited_by']}: "
         f"{d['rack_power_kw'].value:g} kW, {d['rack_units'].value:g}U racks, {d['node_rack_units'].value:g}U nodes)",
         "source": f"rack power: {d['rack_power_kw'].source}; rack height: {d['rack_units'].source}; node height: "
                   f"{d['node_rack_units'].source}"},
        {"item": "peak power per rack", "value": kw(f["rack_power_w"]), "source": "nodes per rack x node peak power"},
        {"item": "racks (GPU nodes only)", "value": f"{f['racks']:,} for {f['nodes']:,} node(s)",
         "source": "ceil(nodes / nodes per rack); network, storage and management racks not counted"},
        {"item": "floor space", "value": f"{f['floor_m2']:,.0f} m2 ({f['floor_m2'] * 10.7639:,.0f} ft2)",
         "source": d["rack_floor_m2"].source},
        {"item": "IT peak power", "value": kw(f["it_peak_w"]), "source": "nodes x node peak power"},
        {"item": f"UPS, N+{red}", "value": f"{f['ups_kva']:,.0f} kVA load: {f['ups_modules_n_plus']} x {mod:g} kVA "
         f"modules = {f['ups_installed_kva_n_plus']:,.0f} kVA installed",
         "source": f"power factor {d['ups_power_factor'].value:g} ({d['ups_power_factor'].source}); module: "
                   f"{d['ups_module_kva'].source}; redundancy: {d['ups_redundant_modules'].source}"},
        {"item": "UPS, 2N", "value": f"{f['ups_modules_2n']} x {mod:g} kVA modules = {f['ups_installed_kva_2n']:,.0f} "
         "kVA installed", "source": "two full paths, each carrying the whole load (Uptime Tier 4)"},
        {"item": "cooling load", "value": f"{kw(f['it_peak_w'])} of heat = {f['cooling_btu_per_h'] / 1e6:,.2f} M BTU/h "
         f"= {f['cooling_tons']:,.0f} tons of refrigeration",
         "source": "all IT power ends as heat; 1 W = 3.412142 BTU/h, 1 ton = 12,000 BTU/h (ASHRAE Fundamentals)"},
        {"item": "facility peak power", "value": f"{kw(f['facility_peak_w'])} at PUE {f['pue']:g}",
         "source": f"IT peak x PUE; PUE: {d['pue'].source}"},
    ]
    if avg_kw is not None:
        rows.append({"item": "facility average power (training)", "value": f"{avg_kw:,.1f} kW",
                     "source": "energy section: GPU power at the predicted busy fraction + node overhead, x PUE"})
    return rows
