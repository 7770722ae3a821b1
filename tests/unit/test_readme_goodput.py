"""The README's goodput worked example: its command is run and every output line it shows must appear."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from trainledger.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def example() -> tuple[list[str], list[str]]:
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- goodput-example")[1].split("<!-- /goodput-example -->")[0]
    cmd, out = re.findall(r"```(?:bash)?\n(.*?)```", block, re.S)
    args = shlex.split(cmd.replace("\\\n", " "))
    assert args[0] == "trainledger"
    return args[1:], [ln for ln in out.splitlines() if ln.strip()]


def test_readme_goodput_example_is_what_the_command_prints():
    args, lines = example()
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    printed = r.output.splitlines()
    for ln in lines:
        assert ln in printed, f"README line not printed by `trainledger {' '.join(args)}`:\n{ln}"
