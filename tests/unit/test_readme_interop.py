"""The README's `trainledger check` examples are what the commands print (section: Other tools' configs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from trainledger.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Other tools' configs, your own runs, your cluster")
    return text[start:text.index("\n## ", start + 5)]


def test_readme_check_examples(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    block = re.search(r"```console\n(.*?)```", _section(), re.S).group(1)
    runs = re.split(r"^\$ ", block, flags=re.M)[1:]
    assert len(runs) == 3
    for run in runs:
        cmd, *expected = run.strip("\n").split("\n")
        argv = shlex.split(cmd)
        assert argv[0] == "trainledger"
        r = CliRunner().invoke(main, argv[1:])
        for line in expected:
            assert line in r.output, (cmd, r.output)
