"""Command-line interface: thin — parse, load, call the library, render (DESIGN.md §3.10).

Every command has ``--help``; every command that prints results has ``--json``. A user error
prints one line (``error: ...``) and exits non-zero — never a stack trace.
"""

from __future__ import annotations

import importlib
import sys

import click

from .. import __version__
from ..errors import TrainledgerError

#: command modules; each defines ``register(main)``. Imported lazily-safe: none imports torch.
COMMAND_MODULES = (
    "catalog_cmds",
    "estimate_cmd",
    "plan_cmd",
    "corpus_cmd",
    "verify_cmds",
    "ledger_cmds",
    "report_cmd",
    "serve_cmd",
    "export_cmd",
    "prices_cmd",
    "serve_plan_cmd",
)


class _Group(click.Group):
    def main(self, *args, **kwargs):  # type: ignore[override]
        kwargs.setdefault("standalone_mode", True)
        try:
            return super().main(*args, standalone_mode=False, **{k: v for k, v in kwargs.items() if k != "standalone_mode"})
        except TrainledgerError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainledger")
def main() -> None:
    """trainledger — what hardware an LLM training job really needs, and proof on the real machine.

    Run `trainledger plan` with no arguments to plan a built-in example job.
    """


for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f".{_name}", __name__)
    except ModuleNotFoundError as _exc:  # a command module not written yet
        if _exc.name and _exc.name.endswith(_name):
            continue
        raise
    _mod.register(main)
