"""`trainledger models`, `trainledger model show`, `trainledger gpus`, `trainledger networks`."""

from __future__ import annotations

import click

from trainledger.load import catalog
from trainledger.load.hf import load_model, preset_names
from trainledger.units import fmt_bytes, fmt_params
from trainledger.cli.output import echo_json, table


def register(main: click.Group) -> None:
    main.add_command(models_cmd)
    main.add_command(model_group)
    main.add_command(gpus_cmd)
    main.add_command(networks_cmd)


@click.command("models")
@click.argument("filter", required=False)
@click.option("--family", help="only this model_type (llama, qwen3_moe, deepseek_v3, generic, ...)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def models_cmd(filter: str | None, family: str | None, as_json: bool) -> None:
    """List bundled model presets (optionally those whose name or Hub id contains FILTER)."""
    rows = []
    for name in preset_names():
        spec = load_model(name)
        if filter and filter.lower() not in name and filter.lower() not in (spec.source or "").lower():
            continue
        if family and family.lower() != spec.model_type:
            continue
        p = spec.params
        rows.append({"name": name, "model_type": spec.model_type, "source": spec.source,
                     "params": p.total, "active_params": p.active, "layers": spec.num_layers,
                     "hidden": spec.hidden_size})
    if not rows and not as_json:
        click.echo(f"no preset matches {filter or ''!r}{' in family ' + family if family else ''}; "
                   "`trainledger models` lists them all")
        return
    if as_json:
        echo_json({"models": rows})
        return
    click.echo(table([[r["name"], r["model_type"], fmt_params(r["params"]),
                       fmt_params(r["active_params"]) if r["active_params"] != r["params"] else "",
                       r["layers"], r["hidden"], r["source"] or ""] for r in rows],
                     ["preset", "family", "params", "active", "layers", "hidden", "source"], "llrrrrl"))


@click.group("model")
def model_group() -> None:
    """Inspect one model spec."""


@model_group.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def model_show(ref: str, as_json: bool) -> None:
    """Parameter breakdown of a preset, config.json path or cached Hub id."""
    spec = load_model(ref)
    p = spec.params
    if as_json:
        d = spec.model_dump(mode="json")
        d["params"] = {"total": p.total, "breakdown": p.breakdown, "embedding": p.embedding,
                       "active": p.active, "per_layer": list(p.per_layer)}
        echo_json(d)
        return
    click.echo(f"{spec.name}  ({spec.model_type}{', ' + spec.source if spec.source else ''})")
    click.echo(f"  layers {spec.num_layers}, hidden {spec.hidden_size}, heads {spec.num_heads} "
               f"(kv {spec.num_kv_heads}, head dim {spec.head_dim}), ffn {spec.intermediate_size}, "
               f"vocab {spec.vocab_size}")
    rows = [[k, f"{v:,}", fmt_params(v), f"{100 * v / p.total:.1f}%"] for k, v in p.breakdown.items()]
    rows.append(["total", f"{p.total:,}", fmt_params(p.total), "100.0%"])
    if spec.is_moe:
        rows.append(["active per token", f"{p.active:,}", fmt_params(p.active), f"{100 * p.active / p.total:.1f}%"])
    click.echo(table(rows, ["component", "parameters", "", "share"], "lrrr"))
    click.echo(f"  bf16 weights: {fmt_bytes(spec.weight_bytes(2))}")
    for note in spec.notes:
        click.echo(f"  note: {note}")


@click.command("gpus")
@click.option("--vendor", help="only this vendor: nvidia, amd or intel")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def gpus_cmd(vendor: str | None, as_json: bool) -> None:
    """Show the GPU catalog: memory, bandwidth, dense (not sparse) peak throughput, link, power.

    Throughputs are dense TFLOP/s; bf16/fp16 are the fp32-accumulate tensor rates. Link bandwidth is
    per GPU, per direction. A GPU file path works wherever a name does (--gpu ./my-gpu.yaml).
    """
    gpus = catalog.all_gpus(vendor)
    if as_json:
        echo_json({"gpus": [g.model_dump(mode="json") | {"usable_bytes": g.usable_bytes} for g in gpus]})
        return

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    rows = [[g.name, g.display_name, f"{g.memory_gb:g} GB", fmt_bytes(g.usable_bytes),
             f"{g.hbm_tb_per_s:g}", rate(g.fp32_tflops), rate(g.tf32_tflops), rate(g.fp16_tflops),
             rate(g.bf16_tflops), rate(g.fp8_tflops), rate(g.int8_tops), f"{g.link} {g.link_gb_per_s:g}", f"{g.tdp_w:g}"]
            for g in gpus]
    click.echo(table(rows, ["name", "model", "memory", "usable", "mem TB/s", "fp32", "tf32", "fp16", "bf16",
                            "fp8", "int8 TOPS", "link GB/s/dir", "TDP W"], "lllrrrrrrrrlr"))
    click.echo("dense TFLOP/s unless noted; '-' = not in the datasheet; sources: trainledger gpus --json")


@click.command("networks")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def networks_cmd(as_json: bool) -> None:
    """Show the link/network catalog: bandwidth per direction (bits vs bytes spelled out), latency."""
    nets = catalog.all_networks()
    if as_json:
        echo_json({"networks": [n.model_dump(mode="json") | {"bytes_per_s": n.bytes_per_s} for n in nets]})
        return
    rows = [[n.name, n.display_name, n.scope, n.bandwidth_label, n.per, f"{n.latency_us:g}"] for n in nets]
    click.echo(table(rows, ["name", "link", "scope", "bandwidth per direction", "per", "latency us"],
                     "lllrlr"))
