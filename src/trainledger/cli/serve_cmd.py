"""`trainledger serve`: the local web app (127.0.0.1 by default)."""

from __future__ import annotations

import click

from trainledger.web import DEFAULT_HOST, DEFAULT_PORT


def register(main: click.Group) -> None:
    main.add_command(serve_cmd)


@click.command("serve")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="address to bind; anything but 127.0.0.1/localhost exposes the app to the network")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, help="TCP port")
def serve_cmd(host: str, port: int) -> None:
    """Start the local web app: pick a model, set the recipe, layout and hardware, see memory,
    fit, step time and cost update; run the planner; download the report. Needs
    `pip install 'trainledger[web]'`."""
    from trainledger.web import serve

    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host}: anyone who can reach this address can use the app", err=True)
    click.echo(f"trainledger web app on http://{'[' + host + ']' if ':' in host else host}:{port}/  (Ctrl-C stops it)")
    serve(host, port)
