"""`trainledger prices [GPU]`: the price catalog — cloud GPU-hour prices, server prices, facility defaults."""

from __future__ import annotations

import click

from trainledger.estimate.run.prices import load_prices
from trainledger.cli.output import echo_json, table


def register(main: click.Group) -> None:
    main.add_command(prices_cmd)


@click.command("prices")
@click.argument("gpu", required=False)
@click.option("--prices", "prices_file", type=click.Path(dir_okay=False, exists=True),
              help="merge this price file over the catalog")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def prices_cmd(gpu: str | None, prices_file: str | None, as_json: bool) -> None:
    """Cloud prices per GPU-hour (by provider and tier), server prices and facility defaults."""
    cat = load_prices(prices_file)
    if gpu:
        from trainledger.errors import CatalogError, did_you_mean
        from trainledger.load.catalog import entries

        known = list(entries("gpus"))
        if not any(gpu.lower() in g for g in known):  # a typo, not a GPU without a price
            raise CatalogError(f"unknown gpu {gpu!r}.{did_you_mean(gpu, known)} (`trainledger gpus` lists them)")
    rows = []
    for prov, cloud in sorted(cat.clouds.items()):
        for g, tiers in sorted(cloud.gpus.items()):
            if gpu and gpu.lower() not in g:
                continue
            for tier, p in tiers.items():
                rows.append({"provider": prov, "gpu": g, "pricing": tier, "usd_per_gpu_hour": p.usd_per_gpu_hour,
                             "instance": p.instance, "as_of": p.as_of, "source": cloud.source})
    servers = [s.model_dump(mode="json") for s in cat.servers if not gpu or gpu.lower() in s.gpu]
    facility = {k: v.model_dump() for k, v in cat.facility.values.items()}
    if as_json:
        echo_json({"cloud": rows, "servers": servers, "facility": facility})
        return
    if gpu and not rows:
        click.echo(f"no cloud price for {gpu!r} in the price catalog: give --price-per-gpu-hour to estimate, "
                   "or a --prices FILE with your own prices")
    if gpu and not servers:
        click.echo(f"no server price for {gpu!r}: give --server-price for the owned-hardware cost")
    if gpu and not (rows and servers):
        click.echo("")
    click.echo(table([[r["provider"], r["gpu"], r["pricing"], f"{r['usd_per_gpu_hour']:.3f}", r["instance"] or "",
                       str(r["as_of"] or "")] for r in rows],
                     ["provider", "gpu", "pricing", "$/GPU-h", "instance", "as of"], "lllrll"))
    click.echo("")
    click.echo(table([[s["name"], s["gpu"], s["gpus_per_server"], f"{s['usd']:,.0f}", str(s["as_of"] or "")]
                      for s in servers], ["server", "gpu", "gpus", "usd", "as of"], "llrrl"))
    click.echo("")
    click.echo(table([[k, f"{v['value']:g}", v["source"][:90]] for k, v in facility.items()],
                     ["facility default", "value", "source"], "lrl"))
