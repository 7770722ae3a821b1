"""The README's serving section: every command shown runs, and every output line shown is printed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainledger.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _session() -> list[tuple[list[str], list[str]]]:
    text = README.read_text()
    body = text[text.index("## Serving: `--method inference`"):]
    block = body[body.index("```console") + len("```console"):]
    block = block[: block.index("```")]
    lines = block.replace("\\\n    ", " ").strip().splitlines()
    out: list[tuple[list[str], list[str]]] = []
    for ln in lines:
        if ln.startswith("$ "):
            argv = shlex.split(ln[2:])
            out.append((argv[: argv.index("|")] if "|" in argv else argv, []))  # a pipe stage filters
        elif ln.strip() != "..." and out:
            out[-1][1].append(ln)
    return out


@pytest.mark.parametrize("idx", range(4))
def test_readme_serving_commands(idx: int, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    cmds = _session()
    for argv, _ in cmds[: idx + 1]:  # earlier commands write the files later ones read
        if argv[0] == "tail":
            continue
        r = runner.invoke(main, argv[1:])
        assert r.exit_code == 0, r.output
        out = r.output
    argv, shown = cmds[idx]
    if argv[0] == "tail":
        out = "\n".join(Path(argv[-1]).read_text().splitlines()[-int(argv[1][1:]):])
    norm = lambda s: re.sub(r"\s+", " ", s.strip())  # noqa: E731 - table padding differs with filtered rows
    got = {norm(ln) for ln in out.splitlines()}
    missing = [ln for ln in shown if norm(ln) and norm(ln) not in got and not set(ln.strip()) <= {"-", " "}]
    assert not missing, f"{' '.join(argv)}: README lines not printed: {missing}"
