"""Single-thread tokenizer throughput (bytes of text per second per core).

The source of the ``tokenizer_bytes_per_s_per_core`` default in
``catalog/prices/facility.yaml``. Trains a byte-level BPE (32k vocab) on text files found on
this machine (no download) and encodes 4,000-character documents on one thread.
Run: ``RAYON_NUM_THREADS=1 python bench/tokenizer_throughput.py``.
"""

from __future__ import annotations

import glob
import os
import sys
import time


def main() -> int:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        print("needs the corpus extra: pip install -e '.[corpus]'")
        return 0
    import transformers

    root = os.path.dirname(transformers.__file__)
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))[:600]
    corpus = "\n".join(open(f, errors="ignore").read() for f in files)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus.splitlines(), trainers.BpeTrainer(vocab_size=32000, min_frequency=2))
    docs = [corpus[i : i + 4000] for i in range(0, len(corpus), 4000)]
    n_bytes = sum(len(d.encode()) for d in docs)
    t0 = time.perf_counter()
    n_tokens = sum(len(tok.encode(d).ids) for d in docs)
    dt = time.perf_counter() - t0
    print(f"single-thread encode: {n_bytes / dt / 1e6:.2f} MB/s over {n_bytes / 1e6:.1f} MB, "
          f"{n_bytes / n_tokens:.2f} bytes/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
