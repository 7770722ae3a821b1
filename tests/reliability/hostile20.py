"""Hostile inputs of issue 20, generated (nothing large is committed), and a runner that classifies
what one ``trainledger`` command did with one of them.

Every case is a CLI command run in a fresh subprocess under an address-space limit, with a time
limit: the answer is ``ok`` (exit 0), ``clean error`` (exit != 0 and the last line ``error: ...``),
``traceback``, ``hang`` (killed at the time limit) or ``crash`` (anything else, e.g. a signal).
Peak RSS is the process's VmHWM (Linux), reported by an atexit hook. Used by
tests/reliability/test_hostile_issue20.py (small sizes) and bench/fuzz_report.py (``scale``).
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
#: address space a case may map; a "before" run that explodes fails with MemoryError, not the host
AS_LIMIT_BYTES = 6 << 30
RSS_LIMIT_MB = 512.0

WRAPPER = r"""
import atexit, os, sys
def _rss():
    try:
        v = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')) / 1024
    except Exception:
        v = -1
    os.write(2, ("\n#rss %.1f\n" % v).encode())
atexit.register(_rss)
sys.argv = ['trainledger'] + sys.argv[1:]
from trainledger.cli import main
main()
"""


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    make: Callable[[Path, float], list[str]]  # (folder, scale) -> argv after "trainledger"


@dataclass
class Outcome:
    kind: str
    name: str
    status: str  # ok | clean error | traceback | hang | crash
    seconds: float
    rss_mb: float
    line: str


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT_BYTES, AS_LIMIT_BYTES))
    os.setsid()


def run_case(case: Case, folder: Path, scale: float = 1.0, timeout_s: float = 60.0,
             src: Path | None = None) -> Outcome:
    folder.mkdir(parents=True, exist_ok=True)
    argv = case.make(folder, scale)
    env = {**os.environ, "PYTHONPATH": str(src or ROOT / "src"), "HF_HUB_OFFLINE": "1",
           "TRAINLEDGER_LEDGER": str(folder / "ledger.db"), "COLUMNS": "200"}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *argv], cwd=folder, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_limits)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
        hung = True
    seconds = time.monotonic() - t0
    text = err.decode("utf-8", "replace")
    rss = -1.0
    lines = []
    for ln in text.splitlines():
        if ln.startswith("#rss "):
            rss = float(ln.split()[1])
        elif ln.strip():
            lines.append(ln.strip())
    last = lines[-1] if lines else ""
    if hung:
        status = "hang"
    elif "Traceback (most recent call last)" in text:
        status = "traceback"
    elif proc.returncode == 0:
        status = "ok"
    elif last.lower().startswith("error:"):
        status = "clean error"
    else:
        status = "crash"
    return Outcome(case.kind, case.name, status, seconds, rss, last[:300])


# ------------------------------------------------------------------------------------ helpers
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _json(path: Path, obj: object) -> Path:
    return _write(path, json.dumps(obj))


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.mkfifo(path)
    return path


def _symlink(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_symlink():
        os.symlink(target, path)
    return path


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _est(model: str) -> list[str]:
    return ["estimate", "--model", model, "--no-ledger"]


# ------------------------------------------------------------------------------------ config.json
def _cfg(**kw: object) -> Callable[[Path, float], list[str]]:
    def make(d: Path, s: float) -> list[str]:
        return _est(str(_json(d / "cfg" / "config.json", {**TINY, **kw})))
    return make


def _layers(n: int, dense_every: int) -> Callable[[Path, float], list[str]]:
    def make(d: Path, s: float) -> list[str]:
        cfg = {**TINY, "model_type": "qwen3_moe", "num_hidden_layers": n, "num_experts": 4,
               "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "mlp_only_layers": list(range(0, n, dense_every))}
        return _est(str(_json(d / "cfg" / "config.json", cfg)))
    return make


def _config_dir(d: Path, s: float) -> list[str]:
    (d / "m" / "config.json").mkdir(parents=True, exist_ok=True)
    return _est(str(d / "m"))


CONFIG = [
    Case("config.json", "config.json is a directory", _config_dir),
    Case("config.json", "/proc/self/mem", lambda d, s: _est("/proc/self/mem")),
    Case("config.json", "/dev/zero", lambda d, s: _est("/dev/zero")),
    Case("config.json", "FIFO named config.json", lambda d, s: _est(str(_fifo(d / "f" / "config.json")))),
    Case("config.json", "2 GB sparse config.json", lambda d, s: _est(str(_sparse(d / "big" / "config.json", 2 << 30)))),
    Case("config.json", "10,000 layers + 5,000 mlp_only_layers", _layers(10_000, 2)),
    Case("config.json", "1,024 layers + 512 mlp_only_layers", _layers(1024, 2)),
    Case("config.json", "mlp_only_layers of 100,000 entries",
         lambda d, s: _est(str(_json(d / "c" / "config.json", {**TINY, "model_type": "qwen3_moe", "num_experts": 4,
                                                                 "mlp_only_layers": list(range(100_000))})))),
    Case("config.json", "layer_types of numbers", _cfg(model_type="gemma2", layer_types=[1, 2])),
    Case("config.json", "hidden_size Infinity",
         lambda d, s: _est(str(_write(d / "c" / "config.json", json.dumps(TINY).replace('"hidden_size": 64', '"hidden_size": Infinity'))))),
    Case("config.json", "nested 100k deep", lambda d, s: _est(str(_write(d / "c" / "config.json", "[" * 100_000 + "]" * 100_000)))),
]


# ------------------------------------------------------------------------------------ plan files
def _plan(text: str) -> Callable[[Path, float], list[str]]:
    def make(d: Path, s: float) -> list[str]:
        return ["estimate", "--plan", str(_write(d / "p" / "plan.yaml", text)), "--no-ledger"]
    return make


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

PLAN = [
    Case("plan file", "tokens: .inf", _plan("model: llama-3.2-1b\ntokens: .inf\n")),
    Case("plan file", "tokens: .nan", _plan("model: llama-3.2-1b\ntokens: .nan\n")),
    Case("plan file", "lora_alpha: .inf", _plan("model: llama-3.2-1b\nmethod: lora\nlora_alpha: .inf\n")),
    Case("plan file", "YAML alias bomb", _plan(BOMB + "model: llama-3.2-1b\n")),
    Case("plan file", "plan is /dev/zero", lambda d, s: ["estimate", "--plan", str(_symlink(d / "z.yaml", "/dev/zero")), "--no-ledger"]),
]


# ------------------------------------------------------------------------------------ --from
def _from(name: str, text: str, *extra: str) -> Callable[[Path, float], list[str]]:
    def make(d: Path, s: float) -> list[str]:
        return ["estimate", "--model", "llama-3.2-1b", "--from", str(_write(d / "f" / name, text)), "--no-ledger", *extra]
    return make


def _from_path(make_path: Callable[[Path], Path]) -> Callable[[Path, float], list[str]]:
    def make(d: Path, s: float) -> list[str]:
        return ["estimate", "--model", "llama-3.2-1b", "--from", str(make_path(d)), "--no-ledger"]
    return make


IMPORTER = [
    Case("--from", "DeepSpeed micro-batch Infinity", _from("ds.json", '{"train_micro_batch_size_per_gpu": Infinity}')),
    Case("--from", "DeepSpeed grad-accum NaN", _from("ds.json", '{"train_batch_size": 8, "gradient_accumulation_steps": NaN}')),
    Case("--from", "DeepSpeed zero_optimization a string", _from("ds.json", '{"zero_optimization": "stage3"}')),
    Case("--from", "DeepSpeed zero_optimization a list", _from("ds.json", '{"zero_optimization": [3]}')),
    Case("--from", "DeepSpeed offload_optimizer a string", _from("ds.json", '{"zero_optimization": {"stage": 3, "offload_optimizer": "cpu"}}')),
    Case("--from", "DeepSpeed optimizer params a list", _from("ds.json", '{"train_batch_size": 8, "optimizer": {"type": "sgd", "params": [1]}}')),
    Case("--from", "DeepSpeed zero micro-batch", _from("ds.json", '{"train_micro_batch_size_per_gpu": 0}')),
    Case("--from", "DeepSpeed train_batch_size vs --gpus",
         _from("ds.json", '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}', "--gpus", "2")),
    Case("--from", "header micro_batch 0", _from("ds.json", '{"train_batch_size": 8, "_trainledger": {"inputs": {"micro_batch": 0}}}')),
    Case("--from", "header micro_batch a string", _from("ds.json", '{"train_batch_size": 8, "_trainledger": {"inputs": {"micro_batch": "x"}}}')),
    Case("--from", "header inputs a list", _from("ds.json", '{"train_batch_size": 8, "_trainledger": {"inputs": [1]}}')),
    Case("--from", "Accelerate num_processes Infinity", _from("acc.json", '{"distributed_type": "MULTI_GPU", "num_processes": Infinity}')),
    Case("--from", "Accelerate deepspeed_config a string", _from("acc.json", '{"distributed_type": "DEEPSPEED", "deepspeed_config": "x"}')),
    Case("--from", "Accelerate fsdp_config a list", _from("acc.json", '{"distributed_type": "FSDP", "fsdp_config": [1]}')),
    Case("--from", "TrainingArguments fsdp a number", _from("args.json", '{"output_dir": "o", "fsdp": 5}')),
    Case("--from", "TrainingArguments max_steps NaN", _from("args.json", '{"output_dir": "o", "max_steps": NaN}')),
    Case("--from", "TrainingArguments optim a list", _from("args.json", '{"output_dir": "o", "optim": ["adamw_torch"]}')),
    Case("--from", "peft lora_alpha a string", _from("adapter_config.json", '{"peft_type": "LORA", "r": 8, "lora_alpha": "sixteen"}')),
    Case("--from", "peft target_modules numbers", _from("adapter_config.json", '{"peft_type": "LORA", "r": 8, "target_modules": [1, 2]}')),
    Case("--from", "peft r Infinity", _from("adapter_config.json", '{"peft_type": "LORA", "r": Infinity, "lora_alpha": 16}')),
    Case("--from", "launch.sh -> /dev/zero", _from_path(lambda d: _symlink(d / "zero.sh", "/dev/zero"))),
    Case("--from", "launch.sh is a FIFO", _from_path(lambda d: _fifo(d / "fifo.sh"))),
    Case("--from", "launch.sh 2 GB sparse", _from_path(lambda d: _sparse(d / "big.sh", 2 << 30))),
]


# ------------------------------------------------------------------------------------ corpus
def _corpus(*extra: str) -> list[str]:
    return ["corpus", "-j", "1", "--json", *extra]


def _parquet_one_row_group(d: Path, s: float) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = int(4000 * s)
    text = "x" * 100_000
    t = pa.table({"text": pa.array([text] * rows).dictionary_encode()})
    p = d / "pq" / "big.parquet"
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, p, row_group_size=rows, compression="zstd")
    return _corpus(str(p))


def _json_document(d: Path, s: float) -> list[str]:
    p = d / "doc" / "records.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    rec = json.dumps({"text": "lorem ipsum dolor sit amet " * 36}).encode()
    n = int(300 * MIB * s) // (len(rec) + 2)
    with open(p, "wb") as f:
        f.write(b"[")
        block = b",\n".join([rec] * 1000)
        for _ in range(n // 1000):
            f.write(block + b",\n")
        f.write(rec + b"]")
    return _corpus(str(p))


def _small_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("hello world a b c".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _data(d: Path) -> Path:
    return _write(d / "data" / "chat.jsonl", "".join(
        json.dumps({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]}) + "\n"
        for _ in range(50)))


def _huge_tokenizer(d: Path, s: float) -> list[str]:
    return _corpus(str(_data(d)), "--tokenizer", str(_sparse(d / "tok" / "tokenizer.json", 2 << 30)))


def _huge_template_file(d: Path, s: float) -> list[str]:
    tok = _small_tokenizer(d / "tok")
    _sparse(tok.parent / "tokenizer_config.json", 3 << 30)
    return _corpus(str(_data(d)), "--tokenizer", str(tok.parent))


def _long_template(d: Path, s: float) -> list[str]:
    tok = _small_tokenizer(d / "tok")
    _json(tok.parent / "tokenizer_config.json", {"chat_template": "{{ messages }}" + " " * (4 * MIB)})
    return _corpus(str(_data(d)), "--tokenizer", str(tok.parent))


def _special_in_folder(d: Path, s: float) -> list[str]:
    folder = d / "scan"
    _write(folder / "good.jsonl", '{"text": "fine"}\n' * 20)
    _fifo(folder / "pipe.jsonl")
    _symlink(folder / "zero.csv", "/dev/zero")
    _symlink(folder / "zero.json", "/dev/zero")
    return _corpus(str(folder))


def _gzip_garbage(d: Path, s: float) -> list[str]:
    recs = "".join(json.dumps({"text": f"record {i} " * 40}) + "\n" for i in range(500)).encode()
    return _corpus(str(_write(d / "gz" / "data.jsonl.gz", gzip.compress(recs) + b"trailing garbage" * 64)))


def _giant_line(d: Path, s: float) -> list[str]:  # NUL bytes, no newline: one line of 1 GiB (sparse)
    return _corpus(str(_sparse(d / "giant" / "one.jsonl", int((1 << 30) * s))))


def _dataset_dict_dot(d: Path, s: float) -> list[str]:
    _json(d / "ds" / "dataset_dict.json", {"splits": ["."]})
    return _corpus(str(d / "ds"))


def _state_escape(d: Path, s: float) -> list[str]:
    _json(d / "ds2" / "state.json", {"_data_files": [{"filename": "../../../../etc/passwd"}]})
    return _corpus(str(d / "ds2"))


CORPUS = [
    Case("corpus", "Parquet: one row group, 4k x 100 KB dictionary strings", _parquet_one_row_group),
    Case("corpus", "JSON document of 300 MB", _json_document),
    Case("corpus", "tokenizer.json of 2 GB (sparse)", _huge_tokenizer),
    Case("corpus", "tokenizer_config.json of 3 GB (sparse)", _huge_template_file),
    Case("corpus", "chat template of 4 M characters", _long_template),
    Case("corpus", "FIFO and /dev/zero symlinks in a folder", _special_in_folder),
    Case("corpus", "gzip with trailing garbage", _gzip_garbage),
    Case("corpus", "one line of 1 GiB (sparse, 8 MiB work units)", _giant_line),
    Case("corpus", "dataset_dict.json split '.'", _dataset_dict_dot),
    Case("corpus", "state.json file outside the folder", _state_escape),
    Case("corpus", "FIFO named data.jsonl", lambda d, s: _corpus(str(_fifo(d / "p" / "data.jsonl")))),
]


# ------------------------------------------------------------------------------------ ledger
def _ledger(d: Path) -> Path:
    import sqlite3

    db = d / "l" / "ledger.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    if db.exists():
        return db
    c = sqlite3.connect(db)
    c.executescript("""
        CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, command TEXT NOT NULL,
          created_at TEXT NOT NULL, env_id TEXT NOT NULL, env TEXT NOT NULL, plan_key TEXT, plan TEXT, ok INTEGER,
          result TEXT NOT NULL);
        CREATE INDEX records_env ON records(env_id, kind);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);""")
    good = json.dumps({"measured": {"peak_allocated_bytes": 110, "device": "cpu"},
                       "predicted": {"peak_allocated_bytes": 100}, "pad": "x" * 2000})
    for i in range(200):
        result = "{bad json" if i == 3 else ('{"items": [1, 2]}' if i == 4 else good)
        c.execute("INSERT INTO records(kind, command, created_at, env_id, env, plan, ok, result) VALUES "
                  "('measurement', 'verify memory', '2026-01-01T00:00:00', 'e1', ?, ?, 1, ?)",
                  ("[1]" if i == 5 else '{"gpu_name": "x"}', '"not an object"' if i == 6 else None, result))
    c.commit()
    c.close()
    return db


def _damaged_page(d: Path) -> Path:
    db = d / "lp" / "ledger.db"
    if not db.exists():
        src = _ledger(d)
        db.parent.mkdir(parents=True, exist_ok=True)
        db.write_bytes(src.read_bytes())
        with open(db, "r+b") as f:
            f.seek(4096 * 100)
            f.write(b"\xff" * 8192)
    return db


LEDGER = [
    Case("ledger", "bad rows: list", lambda d, s: ["ledger", "list", "--ledger", str(_ledger(d))]),
    Case("ledger", "bad rows: show", lambda d, s: ["ledger", "show", "4", "--ledger", str(_ledger(d))]),
    Case("ledger", "bad rows: show (env a list)", lambda d, s: ["ledger", "show", "6", "--ledger", str(_ledger(d))]),
    Case("ledger", "bad rows: export csv", lambda d, s: ["ledger", "export", "--format", "csv", "--ledger", str(_ledger(d))]),
    Case("ledger", "bad rows: calibrate", lambda d, s: ["calibrate", "--env", "e1", "--ledger", str(_ledger(d))]),
    Case("ledger", "damaged page: show", lambda d, s: ["ledger", "show", "97", "--ledger", str(_damaged_page(d))]),
    Case("ledger", "damaged page: export", lambda d, s: ["ledger", "export", "--ledger", str(_damaged_page(d))]),
    Case("ledger", "damaged page: calibrate", lambda d, s: ["calibrate", "--env", "e1", "--ledger", str(_damaged_page(d))]),
    Case("ledger", "export --out unwritable", lambda d, s: ["ledger", "export", "--ledger", str(_ledger(d)), "--out", "/proc/version"]),
    Case("ledger", "ledger is a directory", lambda d, s: ["ledger", "list", "--ledger", str((d / "ldir").mkdir(exist_ok=True) or d / "ldir")]),
    Case("ledger", "ledger is /dev/zero", lambda d, s: ["ledger", "list", "--ledger", str(_symlink(d / "lz.db", "/dev/zero"))]),
]

ALL_CASES: list[Case] = CONFIG + PLAN + IMPORTER + CORPUS + LEDGER
KINDS = ["config.json", "plan file", "--from", "corpus", "ledger"]
