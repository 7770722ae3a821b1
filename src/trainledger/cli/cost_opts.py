"""Price, facility and data-pipeline flags (``--price-per-gpu-hour``, ``--pue`` ...) shared by
``estimate`` and ``plan``, and the plain-text lines of the energy/cost/io/host/checkpoint sections.

Thin: parse flags into :class:`~trainledger.estimate.options.CostOptions`, format figures the
library computed. No arithmetic beyond unit display.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from pydantic import ValidationError

from trainledger.spec.base import spec_error
from trainledger.estimate.options import CostOptions
from trainledger.units import fmt_bytes, fmt_rate, fmt_seconds

COST_OPTIONS: list[Callable] = [
    click.option("--provider", help="cloud provider in the price catalog: aws, gcp, azure, lambda, coreweave [cheapest]"),
    click.option("--pricing", type=click.Choice(["on-demand", "reserved", "spot"]), help="pricing tier [on-demand]"),
    click.option("--price-per-gpu-hour", type=float, help="USD per GPU-hour (overrides the catalog)"),
    click.option("--prices", "prices_file", type=click.Path(dir_okay=False, exists=True),
                 help="price file (YAML/JSON, same shape as catalog/prices/*.yaml)"),
    click.option("--electricity-price", "electricity_usd_per_kwh", type=float, help="USD per kWh [0.0804, EIA 2023]"),
    click.option("--pue", type=float, help="power usage effectiveness [1.58, Uptime 2023]"),
    click.option("--carbon-kg-per-kwh", type=float, help="grid CO2 intensity, kg/kWh [0.3733, EPA eGRID2022]"),
    click.option("--gpu-power-w", type=float, help="average power per GPU, W [idle..TDP by utilization]"),
    click.option("--node-overhead-w", type=float, help="non-GPU power per node, W [server max - GPU TDP]"),
    click.option("--server-price", "server_price_usd", type=float, help="purchase price of one GPU server, USD"),
    click.option("--gpus-per-server", type=int, help="GPUs in the priced server [8]"),
    click.option("--lifetime-years", type=float, help="years owned hardware is written off over [5]"),
    click.option("--maintenance-fraction", type=float, help="yearly maintenance as a fraction of the price [0.20]"),
    click.option("--utilization", type=float, help="share of owned hours doing useful work [0.80]"),
    click.option("--storage-read-gb-per-s", type=float, help="storage read bandwidth per node, GB/s"),
    click.option("--storage-write-gb-per-s", type=float, help="storage write bandwidth per node, GB/s"),
    click.option("--storage-iops", type=float, help="4 KiB random-read IOPS per node"),
    click.option("--data-format", type=click.Choice(["tokenized", "raw"]), help="data on disk [tokenized]"),
    click.option("--bytes-per-token", type=float, help="bytes on disk per token [2 or 4 per id; raw ~4]"),
    click.option("--dataloader-workers", type=int, help="DataLoader workers per GPU [4]"),
    click.option("--tokenizer-bytes-per-s", "tokenizer_bytes_per_s_per_core", type=float,
                 help="tokenizer throughput per CPU core, bytes/s [2.3e6]"),
    click.option("--checkpoint-interval", "checkpoint_interval_s", type=float,
                 help="seconds of training between full checkpoints [3600]"),
    click.option("--checkpoints-kept", type=int, help="full checkpoints kept on storage [3]"),
    click.option("--failures-per-gpu-hour", type=float,
                 help="unexpected interruptions per GPU-hour [1.97e-5: Llama 3, 419 in 54 days on 16,384 GPUs]"),
    click.option("--restart-s", type=float, help="seconds from an interruption to training again [600]"),
]

_KEYS = ("provider", "pricing", "price_per_gpu_hour", "prices_file", "electricity_usd_per_kwh", "pue",
         "carbon_kg_per_kwh", "gpu_power_w", "node_overhead_w", "server_price_usd", "gpus_per_server",
         "lifetime_years", "maintenance_fraction", "utilization", "storage_read_gb_per_s",
         "storage_write_gb_per_s", "storage_iops", "data_format", "bytes_per_token", "dataloader_workers",
         "tokenizer_bytes_per_s_per_core", "checkpoint_interval_s", "checkpoints_kept",
         "failures_per_gpu_hour", "restart_s")


def cost_options(func: Callable) -> Callable:
    """Decorator adding every price/facility/data flag to a click command."""
    for opt in reversed(COST_OPTIONS):
        func = opt(func)
    return func


def _flag_of() -> dict[str, str]:
    """CostOptions field -> the flag that sets it (``electricity_usd_per_kwh`` -> ``--electricity-price``)."""
    params = cost_options(lambda **kw: None).__click_params__  # type: ignore[attr-defined]
    return {p.name: p.opts[0] for p in params}


def cost_options_from_kwargs(kwargs: dict[str, Any]) -> CostOptions:
    """Pop the cost flags from a command's kwargs into a validated CostOptions."""
    data = {k: kwargs.pop(k) for k in _KEYS if k in kwargs}
    data = {k: v for k, v in data.items() if v is not None}
    try:
        return CostOptions.model_validate(data)
    except ValidationError as exc:
        from trainledger.cli.options import with_flags

        flags = {k: v for k, v in _flag_of().items() if k in data}
        raise with_flags(spec_error(exc, "cost options"), "cost options", flags) from None


def _rate(bytes_per_s: float) -> str:
    return fmt_rate(bytes_per_s) if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:,.1f} kB/s"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:,.2f}"


def _usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def ledger_lines(extra: dict[str, Any]) -> list[str]:
    """Plain-text lines for the energy, cost, io, host and checkpoint sections (those present)."""
    out: list[str] = []
    e, c, io, h, ck, ic = (extra.get(k) for k in ("energy", "cost", "io", "host", "checkpoint", "interconnect"))
    if e is not None:
        kwh, co2 = e.get("kwh"), e.get("co2_kg")
        co2_text = "" if co2 is None else f", {co2 / 1000:,.1f} t CO2" if co2 >= 1000 else f", {co2:,.1f} kg CO2"
        out.append(f"energy      {'n/a' if kwh is None else _num(kwh) + ' kWh'} (facility {e.get('facility_power_kw'):,.1f} kW, "
                   f"PUE {e.inputs.get('pue'):g}, {e.inputs.get('gpu_power_w'):,.0f} W/GPU{co2_text})")
    if c is not None:
        if c.get("cloud_usd") is not None:
            out.append(f"cloud       {_usd(c['cloud_usd'])} = {c['cloud_trace']} ({c.get('provider')} {c.get('pricing')})")
        elif c.get("cloud_usd_per_hour") is not None:
            out.append(f"cloud       ${c['cloud_usd_per_hour']:,.2f} per hour at ${c['usd_per_gpu_hour']:,.4g}/GPU-h "
                       f"({c.get('provider')} {c.get('pricing')}); give --tokens for the run")
        if c.get("owned_usd_per_month") is not None:
            be = c.get("break_even_month")
            be_text = ("n/a (no cloud price)" if c.get("cloud_usd_per_month") is None
                       else "never" if be is None else f"{be:.1f} months")
            out.append(f"owned       {_usd(c.get('owned_usd'))} for the run, {_usd(c.get('owned_usd_per_month'))}/month; "
                       f"break-even vs cloud: {be_text}")
    if io is not None and io.get("read_bytes_per_s") is not None:
        out.append(f"data        {_rate(io['read_bytes_per_s_per_node'])} and {io['iops_per_node']:,.0f} IOPS per node"
                   f"{', STARVED: ' + '; '.join(io['reasons']) if io.get('starved') else ' (storage keeps up)'}")
    if ck is not None:
        out.append(f"checkpoint  {fmt_bytes(ck['full_bytes'])} full ({fmt_bytes(ck['shard_bytes'])} per shard), "
                   f"export {fmt_bytes(ck['weights_export_bytes'])}, write {fmt_seconds(ck['write_s'])}, "
                   f"{ck['time_share']:.1%} of time at one per {fmt_seconds(ck['interval_s'])}")
    if h is not None:
        inst = h.get("installed_ram_bytes")
        out.append(f"host RAM    {fmt_bytes(h['ram_bytes'])} per node "
                   + (f"of {fmt_bytes(inst)}{'' if h['ram_fits'] else ' (DOES NOT FIT)'}" if inst is not None
                      else "(installed RAM not known for a PCIe card: --host-ram-gib)")
                   + ("" if h.get("offload_bandwidth_bytes_per_s") is None else
                      f"; offload needs {_rate(h['offload_bandwidth_bytes_per_s'])} host bandwidth")
                   + ("" if not h.get("model_load_bytes") else
                      f"; {fmt_bytes(h['model_load_bytes'])} while the model loads ({h['model_loading']}"
                      f"{', DOES NOT FIT' if h.get('load_fits') is False else ''})"))
    if ic is not None and ic.get("groups"):
        parts = [f"{k} {g['bytes_per_step'] / 1e9:,.1f} GB/step"
                 + ("" if g["utilization"] is None else f" = {g['utilization']:.0%} of {g['link']}")
                 for k, g in ic["groups"].items()]
        out.append("links       " + ", ".join(parts) + ("" if ic.get("ok") else " (TOO SLOW)"))
    g = extra.get("goodput")
    out += goodput_lines(g)
    if ck is not None and g is not None and g.get("goodput") is not None and g.get("interval_s") is not None \
            and abs(g["interval_s"] - ck["interval_s"]) > 1e-6 * ck["interval_s"]:
        # two sections, two intervals (the catalog's default, the Daly optimum): say so, not silently
        out.append(f"  note: the checkpoint line assumes one per {fmt_seconds(ck['interval_s'])} (its default), goodput "
                   f"the Daly optimum {fmt_seconds(g['interval_s'])}; --checkpoint-interval sets both")
    for name, sec in extra.items():
        if name in ("energy", "cost", "io", "host", "checkpoint", "interconnect", "goodput"):
            out += [f"  note ({name}): {n}" for n in getattr(sec, "notes", [])]
    return out


def goodput_lines(g: Any) -> list[str]:
    """The goodput section: interruptions, checkpoint interval (Young, Daly), goodput, added days and cost."""
    if g is None or g.get("goodput") is None or g.get("daly_interval_s") is None:
        return []
    out = [f"goodput     {g['goodput']:.1%} at a checkpoint every {fmt_seconds(g['interval_s'])} "
           f"(Daly optimum {fmt_seconds(g['daly_interval_s'])}, Young {fmt_seconds(g['young_interval_s'])}; "
           f"MTBF {fmt_seconds(g['mtbf_s'])}, write {fmt_seconds(g['write_s'])}, restart {fmt_seconds(g['restart_s'])})"]
    if g.get("wall_s") is not None:
        usd = "" if g.get("added_usd") is None else f", {_usd(g['added_usd'])}"
        out.append(f"failures    {g['interruptions']:,.1f} interruptions: +{g['added_days']:,.2f} days "
                   f"({g['added_gpu_hours']:,.0f} GPU-h{usd}) = checkpoints {fmt_seconds(g['checkpoint_s'])} + "
                   f"restarts {fmt_seconds(g['restart_total_s'])} + lost work {fmt_seconds(g['lost_work_s'])}; "
                   f"{g['wall_days']:,.2f} days wall-clock")
    return out
