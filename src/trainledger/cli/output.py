"""JSON output of the commands (tables and JSON themselves live in :mod:`trainledger.format`)."""

from __future__ import annotations

from typing import Any

import click

from trainledger.format import table, to_json

__all__ = ["echo_json", "table", "to_json"]


def echo_json(obj: Any) -> None:
    click.echo(to_json(obj))
