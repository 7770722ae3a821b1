"""Hostile config.json and plan files, and names that are not config files (issue 9, "Inputs").

Each must end in one clear error — the project's own TrainledgerError in the library; on the
command line a non-zero exit, exactly one ``error:`` line and no traceback — within a time
limit and a memory limit. A config whose ``auto_map`` points at remote code never runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_cases import (CONFIG_CASES, PLAN_CASES, remote_code_folder, special_paths,
                           write_case)

from trainledger.errors import TrainledgerError
from trainledger.load.hf import load_model
from trainledger.load.plan import build_plan, load_plan_file, parse_inputs

ROOT = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = 20.0
RSS_LIMIT_MB = 600  # a 4 MiB config must not cost more than this much memory to refuse


def _one_error_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg.strip(), "empty error message"
    assert "\n" not in msg.strip(), f"multi-line error: {msg[:300]!r}"
    assert len(msg) < 2000, f"error message of {len(msg)} characters"
    return msg


def _cli(args: list[str], cwd: Path | None = None, env: dict | None = None):
    """Run the CLI in a subprocess; return (rc, stdout, stderr, seconds, peak RSS MiB)."""
    code = ("import resource, sys, runpy\n"
            "sys.argv = ['trainledger'] + sys.argv[1:]\n"
            "try:\n    from trainledger.cli import main; main()\n"
            "finally:\n"
            "    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "    try:\n"  # VmHWM: ru_maxrss keeps the forking parent's peak across exec on Linux
            "        rss = next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:'))\n"
            "    except (OSError, StopIteration):\n        pass\n"
            "    sys.stderr.write('\\n#rss ' + str(rss))\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=TIME_LIMIT_S * 2, cwd=cwd,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    dt = time.monotonic() - t0
    err, _, rss = proc.stderr.rpartition("\n#rss ")
    return proc.returncode, proc.stdout, err, dt, int(rss or 0) / 1024


def assert_clean_cli_error(args: list[str], **kw) -> str:
    rc, out, err, dt, rss = _cli(args, **kw)
    assert rc != 0, f"exit 0 for hostile input; stdout: {out[:300]}"
    assert "Traceback" not in err + out, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines[:5]
    assert len(lines[0]) < 2000, f"error line of {len(lines[0])} characters"
    assert dt < TIME_LIMIT_S, f"{dt:.1f} s"
    assert rss < RSS_LIMIT_MB, f"peak RSS {rss:.0f} MiB"
    return lines[0]


# ------------------------------------------------------------------------------ library
@pytest.mark.parametrize("name,fname,content", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_hostile_config_library(tmp_path, name, fname, content):
    path = write_case(tmp_path, fname, content)
    t0 = time.monotonic()
    with pytest.raises(TrainledgerError) as info:
        load_model(str(path))
    assert time.monotonic() - t0 < TIME_LIMIT_S
    _one_error_line(info.value)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


@pytest.mark.parametrize("name,fname,content", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_hostile_plan_file_library(tmp_path, name, fname, content):
    path = write_case(tmp_path, fname, content)
    t0 = time.monotonic()
    with pytest.raises(TrainledgerError) as info:
        build_plan(parse_inputs(load_plan_file(path)))
    assert time.monotonic() - t0 < TIME_LIMIT_S
    _one_error_line(info.value)


@pytest.mark.timeout(60)
def test_special_paths_library(tmp_path):
    for name, ref in special_paths(tmp_path):
        t0 = time.monotonic()
        with pytest.raises(TrainledgerError) as info:
            load_model(ref)
        assert time.monotonic() - t0 < TIME_LIMIT_S, name
        _one_error_line(info.value)


# ---------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("name,fname,content", CONFIG_CASES[::3], ids=[c[0] for c in CONFIG_CASES[::3]])
def test_hostile_config_cli(tmp_path, name, fname, content):
    path = write_case(tmp_path, fname, content)
    assert_clean_cli_error(["model", "show", str(path)])


@pytest.mark.parametrize("name,fname,content", PLAN_CASES[::2], ids=[c[0] for c in PLAN_CASES[::2]])
def test_hostile_plan_file_cli(tmp_path, name, fname, content):
    path = write_case(tmp_path, fname, content)
    assert_clean_cli_error(["export", "--plan", str(path), "--to", "torchrun",
                            "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("i", range(4))
def test_special_paths_cli(tmp_path, i):
    """/dev/zero, /dev/urandom, a FIFO and a symlink loop: refused at once, never read."""
    name, ref = special_paths(tmp_path)[i]
    assert_clean_cli_error(["model", "show", ref])


def test_hostile_names_as_flags_cli(tmp_path):
    for args in (["plan", "--gpu", "x" * 300, "--max-gpus", "1"],
                 ["plan", "--model", "y" * 5000, "--max-gpus", "1", "--gpu", "h100-sxm"],
                 ["model", "show", "a/" * 3000]):
        line = assert_clean_cli_error(args)
        assert len(line) < 600, line


# --------------------------------------------------------------------------- remote code
def test_auto_map_never_imported_or_run(tmp_path):
    """auto_map names a module that writes PWNED when imported: nothing may import it."""
    folder = remote_code_folder(tmp_path / "evil")
    spec = load_model(str(folder))  # a supported model_type: counted from its dimensions
    assert spec.params.total > 0
    build_plan(parse_inputs({"model": str(folder), "gpus": 1}))
    assert "modeling_evil" not in sys.modules and "configuration_evil" not in sys.modules
    # the CLI run from inside the folder, with it on the import path
    rc, out, err, _, _ = _cli(["model", "show", str(folder)], cwd=folder,
                              env={"PYTHONPATH": f"{folder}{os.pathsep}{ROOT / 'src'}"})
    assert rc == 0, err[-1000:]
    assert not (folder / "PWNED").exists(), "remote code ran"


def test_auto_map_unknown_architecture_refused(tmp_path):
    folder = remote_code_folder(tmp_path / "evil2", model_type="evil")
    with pytest.raises(TrainledgerError) as info:
        load_model(str(folder))
    assert "not supported" in _one_error_line(info.value)
    assert not (folder / "PWNED").exists()


def test_auto_map_ignored_when_building_the_real_model(tmp_path):
    """verify's builder (transformers) gets the config without auto_map and never trusts remote code."""
    pytest.importorskip("transformers")
    from trainledger.load.hf import load_hf_config
    from trainledger.spec.recipe import Recipe
    from trainledger.verify.build import make_config

    folder = remote_code_folder(tmp_path / "evil3")
    sys.path.insert(0, str(folder))
    try:
        cfg = make_config(load_hf_config(str(folder)), Recipe())
    finally:
        sys.path.remove(str(folder))
    assert type(cfg).__name__ == "LlamaConfig"
    assert not getattr(cfg, "auto_map", None)
    assert not (folder / "PWNED").exists(), "remote code ran"
    assert "modeling_evil" not in sys.modules


@pytest.mark.parametrize("name,fname,content", PLAN_CASES[1::2], ids=[c[0] for c in PLAN_CASES[1::2]])
def test_hostile_plan_file_estimate_cli(tmp_path, name, fname, content):
    path = write_case(tmp_path, fname, content)
    assert_clean_cli_error(["estimate", "--plan", str(path)])


#: every other file a plan names: corpus stats, prices, a GPU spec — each hostile in its own way
SIDE_FILES = [
    ("--corpus", "stats.json", b"[" * 100_000 + b"]" * 100_000),
    ("--corpus", "stats.json", b'{"kind": "trainledger.corpus.stats", "seq_len": ' + b"9" * 5000 + b"}"),
    ("--corpus", "stats.json", b"\xff\xfe not json"),
    ("--prices", "prices.yaml", b"a: &a [x, x]\nb: " + b"[" * 50_000 + b"]" * 50_000 + b"\n"),
    ("--prices", "prices.yaml", b"!!python/object/apply:os.system ['touch PWNED']\n"),
    ("--gpu", "gpu.yaml", b"name: evil\nmemory_gib: .inf\n"),
    ("--gpu", "gpu.yaml", b"- just\n- a list\n"),
]


@pytest.mark.parametrize("flag,fname,content", SIDE_FILES, ids=[f"{f} {c[:20]!r}" for f, _, c in SIDE_FILES])
def test_hostile_side_files_estimate_cli(tmp_path, flag, fname, content):
    path = write_case(tmp_path, fname, content)
    assert_clean_cli_error(["estimate", "-m", "tiny-llama-debug", flag, str(path)], cwd=tmp_path)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("flag", ["--corpus", "--prices", "--gpu"])
def test_side_files_that_are_devices_or_fifos(tmp_path, flag):
    fifo = tmp_path / ("x.json" if flag == "--corpus" else "x.yaml")
    os.mkfifo(fifo)
    for ref in (str(fifo), "/dev/zero"):
        assert_clean_cli_error(["estimate", "-m", "tiny-llama-debug", flag, ref])
