"""Command-line interface: thin — parse, load, call the library, render (DESIGN.md §3.10).

Every command has ``--help``; every command that prints results has ``--json``. A user error
prints one line (``error: ...``) and exits non-zero — never a stack trace.
"""

from __future__ import annotations

import importlib
import sys

import click

from trainledger import __version__
from trainledger.errors import TrainledgerError

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
    "check_cmd",
    "serve_plan_cmd",
)


#: command name -> the module that registers it, so a command imports only its own module
#: (`trainledger --version` and `trainledger gpus` do not load the estimator). A name not listed
#: here loads every module (a new module only needs to be in COMMAND_MODULES).
COMMAND_OF = {
    "models": "catalog_cmds", "model": "catalog_cmds", "gpus": "catalog_cmds", "networks": "catalog_cmds",
    "estimate": "estimate_cmd", "plan": "plan_cmd", "corpus": "corpus_cmd", "verify": "verify_cmds",
    "ledger": "ledger_cmds", "calibrate": "ledger_cmds", "report": "report_cmd", "serve": "serve_cmd",
    "export": "export_cmd", "prices": "prices_cmd", "serve-plan": "serve_plan_cmd",
}


class _Group(click.Group):
    _loaded: set[str]

    def _load(self, module: str) -> None:
        loaded = self.__dict__.setdefault("_loaded", set())
        if module in loaded:
            return
        loaded.add(module)
        try:
            mod = importlib.import_module(f".{module}", __name__)
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name and exc.name.endswith(module):
                return
            raise
        mod.register(self)

    def load_all(self) -> None:
        for name in COMMAND_MODULES:
            self._load(name)

    def get_command(self, ctx, cmd_name):  # type: ignore[override]
        if cmd_name not in self.commands:
            if cmd_name in COMMAND_OF:
                self._load(COMMAND_OF[cmd_name])
            if cmd_name not in self.commands:
                self.load_all()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):  # type: ignore[override]
        self.load_all()
        return super().list_commands(ctx)

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


