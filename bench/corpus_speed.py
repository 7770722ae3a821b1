"""Corpus scan throughput: our parallel path vs a plain single-process loop, same tokenizer.

    python bench/corpus_speed.py                 # 1 GB JSONL in /tmp (generated once, then reused)
    python bench/corpus_speed.py --size 100MB --workers 2

Generates a JSONL file of log-normally long texts, trains a BPE tokenizer (8k vocab) on a slice
of it with the ``tokenizers`` library, then times

* ``baseline``: ``for line in file: len(tok.encode(json.loads(line)["text"]))`` in one process;
* ``ours x1``: ``trainledger.corpus.analyze(workers=1)``;
* ``ours xN``: ``trainledger.corpus.analyze(workers=N)`` (default: all cores).

and checks that all three count the same number of tokens. Goal (issue 6): ours xN >= 1.8x the
baseline on 2 cores. Timings on a shared machine are noisy; run it twice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainledger.corpus import CorpusOptions, analyze  # noqa: E402
from trainledger.units import parse_bytes  # noqa: E402


def make_pool(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ten", "ra", "vo", "sun", "e", "tri", "dal", "qu", "ix", "an", "or", "pe", "st"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(5000)]
    lines = []
    for i in range(n):
        k = max(1, int(rng.lognormvariate(4.3, 1.0)))
        text = " ".join(rng.choice(words) for _ in range(k)) + "."
        lines.append((json.dumps({"id": i, "text": text}) + "\n").encode())
    return lines


def generate(path: Path, size: int) -> None:
    if path.exists() and abs(path.stat().st_size - size) < 2 << 20:
        print(f"reusing {path} ({path.stat().st_size / 1e9:.2f} GB)")
        return
    pool, rng, written = make_pool(20_000), random.Random(1), 0
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        while written < size:
            chunk = b"".join(rng.choice(pool) for _ in range(2000))
            f.write(chunk)
            written += len(chunk)
    print(f"wrote {path} ({written / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")


def train(path: Path, out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if out.exists():
        return
    texts = [json.loads(line)["text"] for line in make_pool(5000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>"]))
    tok.save(str(out))


def baseline(path: Path, tok_path: Path) -> tuple[int, float]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    t0, total = time.perf_counter(), 0
    with open(path, "rb") as f:
        for line in f:
            total += len(tok.encode(json.loads(line)["text"]).ids)
    return total, time.perf_counter() - t0


def ours(path: Path, tok_path: Path, workers: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    stats = analyze([str(path)], CorpusOptions(tokenizer=str(tok_path), workers=workers))
    return stats["total_tokens"], time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GB", help="JSONL size, e.g. 1GB, 200MB [1GB]")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dir", default="/tmp", help="where the generated files go [/tmp]")
    args = ap.parse_args()
    size = parse_bytes(args.size)
    path = Path(args.dir) / f"trainledger_corpus_bench_{size}.jsonl"
    tok_path = Path(args.dir) / "trainledger_corpus_bench_tokenizer.json"
    generate(path, size)
    train(path, tok_path)
    rows = [("baseline (1 process, loop)", *baseline(path, tok_path)),
            ("ours, 1 worker", *ours(path, tok_path, 1)),
            (f"ours, {args.workers} workers", *ours(path, tok_path, args.workers))]
    base_rate = rows[0][1] / rows[0][2]
    print(f"{'path':<28}{'tokens':>15}{'seconds':>10}{'tokens/s':>14}{'vs baseline':>13}")
    for name, tokens, secs in rows:
        print(f"{name:<28}{tokens:>15,}{secs:>10.1f}{tokens / secs:>14,.0f}{tokens / secs / base_rate:>12.2f}x")
    if len({r[1] for r in rows}) != 1:
        print("MISMATCH: the paths counted different token totals")
        return 1
    ratio = rows[2][1] / rows[2][2] / base_rate
    print(f"ratio ours x{args.workers} / baseline = {ratio:.2f} (goal >= 1.8 on 2 cores; "
          f"{os.cpu_count()} cores here, shared machine: noisy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
