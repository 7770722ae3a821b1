import os
import subprocess
import sys
from pathlib import Path


def test_import_does_not_import_torch():
    code = "import sys, trainledger, trainledger.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "trainledger", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "trainledger" in out.stdout


def _imported_after(args: list[str], tmp_path=None) -> set[str]:
    """Heavy modules a fresh `trainledger ARGS` process has imported when it exits."""
    code = ("import runpy, sys, atexit\n"
            "atexit.register(lambda: print('MODS', *[m for m in ('pydantic', 'transformers', 'peft', 'torch') "
            "if m in sys.modules]))\n"
            f"sys.argv = ['trainledger'] + {args!r}\n"
            "runpy.run_module('trainledger', run_name='__main__')\n")
    src = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed copy
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("MODS"))
    return set(line.split()[1:])


def test_version_imports_no_pydantic():
    """`trainledger --version` must not load the models and catalog (it took 1.3 s)."""
    assert _imported_after(["--version"]) == set()


def test_from_training_args_does_not_import_transformers(tmp_path):
    """--from training_args.yaml reads TrainingArguments' field names from source, not by import (7-18 s)."""
    (tmp_path / "training_args.yaml").write_text("per_device_train_batch_size: 2\nbf16: true\n"
                                                 "gradient_accumulation_steps: 4\n")
    mods = _imported_after(["estimate", "-m", "qwen2.5-0.5b", "--seq-len", "1024",  # a file without it is an error
                            "--from", str(tmp_path / "training_args.yaml")])
    assert not mods & {"transformers", "peft", "torch"}


def test_trainer_field_names_match_the_installed_transformers():
    import dataclasses

    import pytest

    tr = pytest.importorskip("transformers")
    from trainledger.runconfig.formats import _trainer_fields

    assert _trainer_fields() == {f.name for f in dataclasses.fields(tr.TrainingArguments)}
