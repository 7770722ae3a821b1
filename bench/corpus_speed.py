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
import resource
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


def baseline(path: Path, tok_path: Path) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    total = 0
    with open(path, "rb") as f:
        for line in f:
            total += len(tok.encode(json.loads(line)["text"]).ids)
    return total


_WORKER_CPU: list[float] = []


def ours(path: Path, tok_path: Path, workers: int) -> int:
    stats = analyze([str(path)], CorpusOptions(tokenizer=str(tok_path), workers=workers))
    if stats["throughput"]["workers"] > 1:  # pool processes are not our children (forkserver)
        _WORKER_CPU.append(stats["throughput"]["cpu_s"])
    return stats["total_tokens"]


def _cpu_s() -> float:
    """CPU seconds of this process plus those the pool workers reported."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime + sum(_WORKER_CPU)


def measure(runs: dict, repeat: int) -> dict[str, list[tuple[int, float, float, float]]]:
    """(tokens, wall s, CPU s, 1-min load average at start) per run; the order rotates each round."""
    out: dict[str, list] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            load, cpu0, t0 = os.getloadavg()[0], _cpu_s(), time.perf_counter()
            tokens = runs[name]()
            out[name].append((tokens, time.perf_counter() - t0, _cpu_s() - cpu0, load))
            print(f"  round {r + 1}: {name:<22} {out[name][-1][1]:7.1f} s wall, "
                  f"{out[name][-1][2]:7.1f} s CPU, load {load:.1f}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GB", help="JSONL size, e.g. 1GB, 200MB [1GB]")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the best wall time of each path counts [1]")
    ap.add_argument("--dir", default="/tmp", help="where the generated files go [/tmp]")
    args = ap.parse_args()
    size = parse_bytes(args.size)
    path = Path(args.dir) / f"trainledger_corpus_bench_{size}.jsonl"
    tok_path = Path(args.dir) / "trainledger_corpus_bench_tokenizer.json"
    generate(path, size)
    train(path, tok_path)
    runs = {"baseline (loop, 1 proc)": lambda: baseline(path, tok_path),
            "ours, 1 worker": lambda: ours(path, tok_path, 1),
            f"ours, {args.workers} workers": lambda: ours(path, tok_path, args.workers)}
    results = measure(runs, args.repeat)
    best = {name: min(rs, key=lambda r: r[1]) for name, rs in results.items()}
    base = best["baseline (loop, 1 proc)"]
    print(f"{'path':<24}{'tokens':>13}{'best s':>9}{'tokens/s':>12}{'CPU s':>9}{'load':>6}{'vs baseline':>13}")
    for name, (tokens, wall, cpu, load) in best.items():
        print(f"{name:<24}{tokens:>13,}{wall:>9.1f}{tokens / wall:>12,.0f}{cpu:>9.1f}{load:>6.1f}"
              f"{base[1] / wall:>12.2f}x")
    if len({r[0] for rs in results.values() for r in rs}) != 1:
        print("MISMATCH: the paths counted different token totals")
        return 1
    par = best[f"ours, {args.workers} workers"]
    print(f"wall-clock ratio ours x{args.workers} / baseline = {base[1] / par[1]:.2f} (goal >= 1.8 on 2 cores); "
          f"ours x{args.workers} / ours x1 = {best['ours, 1 worker'][1] / par[1]:.2f}; {os.cpu_count()} cores, "
          "load = 1-min load average at the start (other jobs share the machine: noisy)")
    cpu_ratio = base[2] / (par[2] / min(args.workers, os.cpu_count() or 1))
    print(f"CPU-time projection for {args.workers} idle cores: baseline CPU s / (ours x{args.workers} CPU s / "
          f"{args.workers}) = {cpu_ratio:.2f} (assumes the workers' CPU time divides evenly over free cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
