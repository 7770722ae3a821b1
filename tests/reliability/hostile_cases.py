"""Hostile config.json and plan files, written to a folder (shared by tests and bench/fuzz_report.py).

Each case is (name, file name, bytes or a callable that makes the path). Every one must end in
one clear ``error:`` line (or, for the remote-code case, in a normal answer that ran nothing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 512}
DEPTH = 100_000


def _cfg(**over) -> bytes:
    return json.dumps({**LLAMA, **over}).encode()


def _raw_cfg(field: str, literal: str) -> bytes:
    """A config whose ``field`` is a raw JSON literal (NaN, Infinity, a 5000-digit integer)."""
    body = json.dumps({k: v for k, v in LLAMA.items() if k != field})
    return (body[:-1] + f', "{field}": {literal}}}').encode()


def _alias_bomb(key: str) -> bytes:
    """'Billion laughs': 9 levels of lists, each holding the previous one 9 times (9^9 leaves)."""
    parts = ["&a [x, x, x, x, x, x, x, x, x]"]
    parts += [f"&{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    return f"{key}: [{', '.join(parts)}]\n".encode()


#: config.json cases: (name, file name, content)
CONFIG_CASES: list[tuple[str, str, bytes]] = [
    ("int with 5000 digits", "config.json", _raw_cfg("hidden_size", "9" * 5000)),
    ("int 10**30", "config.json", _cfg(hidden_size=10**30)),
    ("float 1e400 (inf)", "config.json", _raw_cfg("num_hidden_layers", "1e400")),
    ("NaN", "config.json", _raw_cfg("vocab_size", "NaN")),
    ("-Infinity", "config.json", _raw_cfg("intermediate_size", "-Infinity")),
    ("negative size", "config.json", _cfg(num_hidden_layers=-3)),
    ("zero heads", "config.json", _cfg(num_attention_heads=0)),
    ("string where int", "config.json", _cfg(hidden_size="4096")),
    ("list where int", "config.json", _cfg(hidden_size=[64])),
    ("object where int", "config.json", _cfg(vocab_size={"n": 512})),
    ("bool where int", "config.json", _cfg(num_hidden_layers=True)),
    ("int where bool", "config.json", _cfg(tie_word_embeddings=3)),
    ("heads not dividing", "config.json", _cfg(num_key_value_heads=3)),
    ("model_type list", "config.json", _cfg(model_type=["llama"])),
    ("model_type object", "config.json", _cfg(model_type={"x": 1})),
    ("model_type missing", "config.json", json.dumps({k: v for k, v in LLAMA.items()
                                                       if k != "model_type"}).encode()),
    ("unknown architecture", "config.json", _cfg(model_type="mamba", architectures=["MambaForCausalLM"])),
    ("megabyte model_type", "config.json", _cfg(model_type="x" * 3_000_000)),
    ("megabyte unknown key", "config.json", _cfg(**{"k" * 2_000_000: 1})),
    ("file over 4 MiB", "config.json", _cfg(padding=["x" * 1000] * 5000)),
    ("JSON nested 100k deep", "config.json", b"[" * DEPTH + b"]" * DEPTH),
    ("value nested 100k deep", "config.json", b'{"model_type": "llama", "rope_scaling": ' +
     b"[" * DEPTH + b"]" * DEPTH + b"}"),
    ("YAML nested 100k deep", "config.yaml", b"a: " + b"[" * DEPTH + b"]" * DEPTH),
    ("YAML alias bomb", "config.yaml", _alias_bomb("model_type")),
    ("YAML python tag", "config.yaml", b"model_type: !!python/object/apply:os.system ['touch PWNED']\n"),
    ("top-level list", "config.json", b"[1, 2, 3]"),
    ("top-level null", "config.json", b"null"),
    ("empty file", "config.json", b""),
    ("binary garbage", "config.json", bytes(range(256)) * 64),
    ("invalid UTF-8", "config.json", b'{"model_type": "\xff\xfe\xfa"}'),
    ("truncated JSON", "config.json", _cfg()[:40]),
    ("text_config not an object", "config.json", _cfg(model_type="gemma3", text_config=[1])),
    ("MoE top_k > experts", "config.json", json.dumps({
        **LLAMA, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 9}).encode()),
]

#: plan-file cases: (name, file name, content)
PLAN_CASES: list[tuple[str, str, bytes]] = [
    ("TOML nested 100k deep", "plan.toml", b"gpus = " + b"[" * DEPTH + b"]" * DEPTH + b"\n"),
    ("YAML nested 100k deep", "plan.yaml", b"gpus: " + b"[" * DEPTH + b"]" * DEPTH + b"\n"),
    ("JSON nested 100k deep", "plan.json", b'{"gpus": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"),
    ("YAML alias bomb in model", "plan.yaml", _alias_bomb("model")),
    ("YAML alias bomb in lora_targets", "plan.yaml", _alias_bomb("lora_targets")),
    ("TOML file over 4 MiB", "plan.toml", b'model = "' + b"x" * (5 * 1024 * 1024) + b'"\n'),
    ("megabyte model name", "plan.yaml", b"model: " + b"x" * 900_000 + b"\n"),
    ("NaN seq_len", "plan.yaml", b"seq_len: .nan\n"),
    ("inf gpus", "plan.json", b'{"gpus": 1e400}'),
    ("huge micro_batch", "plan.yaml", b"micro_batch: " + b"9" * 400 + b"\n"),
    ("string gpus", "plan.yaml", b"gpus: eight\n"),
    ("list method", "plan.yaml", b"method: [full, lora]\n"),
    ("unknown keys", "plan.yaml", b"gpuz: 8\nmodle: x\n"),
    ("megabyte unknown key", "plan.yaml", b"k" * 500_000 + b": 1\n"),
    ("top-level list", "plan.yaml", b"- model\n- gpu\n"),
    ("YAML python tag", "plan.yaml", b"model: !!python/object/apply:os.system ['touch PWNED']\n"),
    ("invalid TOML", "plan.toml", b"model = \n"),
    ("model outside: /dev/zero", "plan.yaml", b"model: /dev/zero\n"),
    ("model outside: /etc/passwd", "plan.yaml", b"model: ../../../../../../etc/passwd\n"),
    ("gpu file is a device", "plan.yaml", b"gpu: /dev/zero.yaml\n"),
    ("model name 300 chars", "plan.yaml", b"model: " + b"y" * 300 + b"\n"),
    ("model name with NUL", "plan.json", b'{"model": "a\\u0000b"}'),
    ("unknown GPU", "plan.yaml", b"gpu: h1000-sxm\n"),
    ("tp does not divide", "plan.yaml", b"model: tiny-llama-debug\ngpus: 3\ntp: 2\n"),
]


def write_case(folder: Path, fname: str, content: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / fname
    path.write_bytes(content)
    return path


def special_paths(folder: Path) -> list[tuple[str, str]]:
    """Names that are not regular config files: devices, FIFOs, loops, folders, odd names."""
    folder.mkdir(parents=True, exist_ok=True)
    fifo = folder / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    loop = folder / "loop.json"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    (folder / "emptydir").mkdir(exist_ok=True)
    return [
        ("/dev/zero", "/dev/zero"),
        ("/dev/urandom as .json", "/dev/urandom"),
        ("FIFO named .json", str(fifo)),
        ("symlink loop", str(loop)),
        ("folder without config.json", str(folder / "emptydir")),
        ("missing file", str(folder / "missing.json")),
        ("name of 300 chars", "z" * 300),
        ("name of 1 MB", "q" * 1_000_000),
        ("path of 5000 components", "a/" * 5000 + "config.json"),
        ("/proc/self/environ", "/proc/self/environ"),
    ]


EVIL_MODULE = '''
import pathlib
pathlib.Path(__file__).with_name("PWNED").write_text("remote code ran")
class EvilConfig: pass
class EvilModel: pass
'''


def remote_code_folder(folder: Path, model_type: str = "llama") -> Path:
    """A model folder whose config.json points ``auto_map`` at a module that writes PWNED."""
    folder.mkdir(parents=True, exist_ok=True)
    for mod in ("modeling_evil", "configuration_evil"):
        (folder / f"{mod}.py").write_text(EVIL_MODULE)
    cfg = {**LLAMA, "model_type": model_type, "trust_remote_code": True,
           "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                        "AutoModel": "modeling_evil.EvilModel",
                        "AutoModelForCausalLM": "modeling_evil.EvilModel"}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder

