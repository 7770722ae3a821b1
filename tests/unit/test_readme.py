"""The README cannot drift: every command it shows runs here, and every output it shows is produced here.

Rules (README.md is the only input):

* A ```` ```console ```` block holds commands (lines starting with ``$ trainledger``, continued with
  a trailing ``\\``) each followed by its output. The test runs each command in a fresh temporary
  folder and compares the output line by line, exactly, except:

  - ```` ```console head=N ```` shows only the first N lines of each command's output: those must
    match, the rest is not shown;
  - volatile figures — wall-clock timings of the search (``in 398.6 ms (1,515/s)``) and report
    time stamps — are compared as placeholders (``_VOLATILE``). Every estimate figure is exact:
    the estimator is deterministic, so a changed number is a changed README.

* A ```` ```bash ```` block is usage (commands that need a GPU, the network or the user's files):
  not run, but every ``trainledger`` command in it must exist and every ``--flag`` must be an
  option of that command (this catches promises of absent features such as ``plan --from``).

* The README is for a user who has only the package: no links into the development repository's
  design notes and no internal issue numbers.

``TRAINLEDGER_README_UPDATE=1 pytest tests/unit/test_readme.py`` rewrites the outputs of the
console blocks from real runs (then review the diff).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from trainledger.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(\w*)(.*)$")
_VOLATILE = [
    (re.compile(r"searched ([\d,]+) layouts in [\d.,]+ ?(ms|s|min)? ?\([\d,]+/s\)"), r"searched \1 layouts in <t>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"), "<date>"),
]


def blocks(text: str) -> list[tuple[str, str, int, list[str]]]:
    """(language, options, first line number, lines) of every fenced block."""
    out, cur = [], None
    for i, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m and cur is None:
            cur = (m.group(1), m.group(2).strip(), i + 1, [])
        elif line.startswith("```") and cur is not None:
            out.append(cur)
            cur = None
        elif cur is not None:
            cur[3].append(line)
    return out


def console_runs(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) pairs of a console block."""
    runs: list[tuple[str, list[str]]] = []
    cmd = None
    for line in lines:
        if cmd is not None and cmd.endswith("\\"):
            cmd = cmd[:-1] + " " + line.strip()
            runs[-1] = (cmd, [])
            continue
        if line.startswith("$ "):
            cmd = line[2:].strip()
            runs.append((cmd, []))
        elif runs:
            runs[-1][1].append(line)
    return [(c, out) for c, out in runs]


def normalize(line: str) -> str:
    for rx, repl in _VOLATILE:
        line = rx.sub(repl, line)
    return line.rstrip()


#: commands other than trainledger that a console block may show (read files the block wrote)
_SHELL = ("head", "grep", "tail", "cat", "ls")


def _filter(lines: list[str], stage: str) -> list[str]:
    """One pipe stage after a trainledger command: grep [-E] PATTERN, head/tail -n N or -N."""
    args = shlex.split(stage)
    if args[0] == "grep":  # grep [-E] [-A N] PATTERN
        after = int(args[args.index("-A") + 1]) if "-A" in args else 0
        rest = [a for i, a in enumerate(args[1:], 1) if not a.startswith("-") and args[i - 1] != "-A"]
        out, left = [], -1
        for ln in lines:
            if re.search(rest[0], ln):
                out.append(ln)
                left = after
            elif left > 0:
                out.append(ln)
                left -= 1
        return out
    if args[0] in ("head", "tail"):
        n = int(args[-1].lstrip("-"))
        return lines[:n] if args[0] == "head" else lines[-n:]
    raise AssertionError(f"README pipe stage not supported by the test: {stage}")


def run_command(cmd: str, cwd: Path) -> list[str]:
    """Run one console command in ``cwd``: trainledger in-process (with pipe stages), or a file reader."""
    import subprocess

    first, *stages = [x.strip() for x in re.split(r" \| ", cmd)]
    args = shlex.split(first, comments=True)
    if args[0] in _SHELL:
        assert not stages, cmd
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=True).stdout
        return out.rstrip("\n").splitlines()
    assert args[0] == "trainledger", f"README console commands start with trainledger: {cmd}"
    old = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(main, args[1:], catch_exceptions=False)
    finally:
        os.chdir(old)
    lines = r.stdout.rstrip("\n").splitlines()  # progress and notes on stderr are not shown ...
    if r.exit_code:  # ... but the one `error:` line a failed command prints is what the user reads
        lines += [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    for st in stages:
        lines = _filter(lines, st)
    return lines


def _head(opts: str) -> int | None:
    m = re.search(r"head=(\d+)", opts)
    return int(m.group(1)) if m else None


def _console_blocks() -> list[tuple[int, str, list[str]]]:
    return [(start, opts, lines) for lang, opts, start, lines in blocks(README.read_text()) if lang == "console"]


@pytest.mark.parametrize("start,opts,lines", _console_blocks(), ids=lambda x: str(x) if isinstance(x, int) else "")
def test_console_block_output_is_real(start, opts, lines, tmp_path):
    # examples that read the repository's sample configs (tests/data/...) see them from the scratch folder
    (tmp_path / "tests").symlink_to(README.parent / "tests", target_is_directory=True)
    head = _head(opts)
    for cmd, shown in console_runs(lines):
        real = run_command(cmd, tmp_path)
        real = real[:head] if head else real
        assert [normalize(x) for x in shown] == [normalize(x) for x in real], \
            f"README.md line {start}: `{cmd}` prints something else; TRAINLEDGER_README_UPDATE=1 rewrites it"


def _commands_in_bash_blocks() -> list[tuple[int, str]]:
    out = []
    for lang, _opts, start, lines in blocks(README.read_text()):
        if lang not in ("bash", "console"):
            continue
        joined: list[tuple[int, str]] = []
        for i, line in enumerate(lines):
            s = line.strip().removeprefix("$ ")
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + s)
            elif s.startswith("trainledger "):
                joined.append((start + i, s))
        out += joined
    return out


def _resolve(args: list[str]) -> tuple[click.Command, list[str]]:
    cmd: click.Command = main
    rest = list(args)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(None, rest[0])  # type: ignore[arg-type]
        assert sub is not None, f"no command `{rest[0]}`"
        cmd, rest = sub, rest[1:]
    return cmd, rest


@pytest.mark.parametrize("line,cmd", _commands_in_bash_blocks(), ids=lambda x: str(x) if isinstance(x, int) else "")
def test_every_shown_command_and_flag_exists(line, cmd):
    args = shlex.split(re.split(r" \| ", cmd)[0], comments=True)
    args = args[: args.index(">")] if ">" in args else args
    command, rest = _resolve(args[1:])
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    flags = [a.split("=")[0] for a in rest if a.startswith("-") and a != "-"]
    unknown = [f for f in flags if f not in known]
    assert not unknown, f"README.md line {line}: `{command.name}` has no option {unknown}"


def test_readme_is_written_for_a_user_with_only_the_package():
    text = README.read_text()
    assert "DESIGN.md" not in text and "../shared" not in text
    assert not re.search(r"\(issue \d+|issue #?\d+\)|\bissue \d+\b", text), "internal issue numbers"


def update_readme() -> None:
    """Rewrite the outputs of every console block from real runs (TRAINLEDGER_README_UPDATE=1)."""
    import tempfile

    text = README.read_text().splitlines()
    out: list[str] = []
    i = 0
    while i < len(text):
        line = text[i]
        m = FENCE.match(line)
        if not (m and m.group(1) == "console"):
            out.append(line)
            i += 1
            continue
        head = _head(m.group(2))
        j = i + 1
        body = []
        while not text[j].startswith("```"):
            body.append(text[j])
            j += 1
        out.append(line)
        with tempfile.TemporaryDirectory() as tmp:
            # the same scratch folder as the test: the repository's sample configs under tests/
            (Path(tmp) / "tests").symlink_to(README.parent / "tests", target_is_directory=True)
            for cmd, _shown in console_runs(body):
                out += _command_lines(body, cmd)
                real = run_command(cmd, Path(tmp))
                out += real[:head] if head else real
        out.append(text[j])
        i = j + 1
    README.write_text("\n".join(out) + "\n")


def _command_lines(body: list[str], cmd: str) -> list[str]:
    """The command as written (with its continuation lines)."""
    for k, ln in enumerate(body):
        if ln.startswith("$ "):
            lines = [ln]
            while lines[-1].endswith("\\"):
                k += 1
                lines.append(body[k])
            joined = " ".join(x.strip().rstrip("\\").strip() for x in lines)[2:]
            if " ".join(joined.split()) == " ".join(cmd.replace("\\", " ").split()):
                return lines
    return [f"$ {cmd}"]


if __name__ == "__main__" or os.environ.get("TRAINLEDGER_README_UPDATE") == "1":
    update_readme()
