"""Recommend a sequence length and a batching strategy; turn corpus stats into plan inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainledger.errors import CorpusError

STATS_KIND = "trainledger.corpus.stats"
STATS_VERSION = 1

#: a strategy that wastes at most this share of the computed tokens on padding is good enough
ACCEPTABLE_WASTE = 0.05


def round_seq_len(p99: float) -> tuple[int, int]:
    """(sequence length covering p99, the multiple used): 64 up to 1024 tokens, 128 above.

    Multiples of 64/128 keep matmul shapes aligned to tensor-core tiles (NVIDIA, "Matrix
    Multiplication Background User's Guide", https://docs.nvidia.com/deeplearning/performance/
    dl-performance-matrix-multiplication/index.html, "Tensor Core Requirements").
    """
    multiple = 64 if p99 <= 1024 else 128
    return max(multiple, multiple * math.ceil(p99 / multiple)), multiple


def choose_strategy(padding: dict[str, dict]) -> tuple[str, str]:
    """(strategy, reason): the simplest one wasting at most ACCEPTABLE_WASTE, else packing."""
    for name, why in (("pad_to_longest", "random batches already waste little"),
                      ("bucketed", "length-grouped batches (best case: a global length sort) cut the "
                                   "padding below the threshold")):
        waste = padding[name]["waste"]
        if waste <= ACCEPTABLE_WASTE:
            return name, f"{why} ({100 * waste:.1f}% padding)"
    best = min(padding["pad_to_longest"]["waste"], padding["bucketed"]["waste"])
    return "packing", (f"every padded strategy wastes at least {100 * best:.1f}% of the compute; packing "
                       f"wastes {100 * padding['packing']['waste']:.2f}% (mask attention per document)")


def load_stats(path: str | Path) -> dict:
    """Read a ``trainledger corpus --json`` file and check that it is one."""
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: no such corpus stats file (write one with `trainledger corpus ... --json > {p}`)")
    from trainledger.safety import read_text

    try:  # bounded read of a regular file; RecursionError: JSON nested deeper than the parser goes
        data = json.loads(read_text(p, 64 << 20, what="corpus stats file"))
    except (ValueError, RecursionError) as exc:
        raise CorpusError(f"{p}: not valid JSON ({exc}); --corpus takes the stats that `trainledger corpus "
                          f"DATA --json > stats.json` writes, not the dataset itself") from None
    if not isinstance(data, dict) or data.get("kind") != STATS_KIND:
        raise CorpusError(f"{p}: not the JSON output of `trainledger corpus --json` (no kind {STATS_KIND!r})")
    return data


def plan_hints(stats: dict | str | Path) -> dict[str, Any]:
    """What a plan takes from corpus stats (a parsed dict or the path of the JSON file).

    ``seq_len``: the sequence length the padding was computed for; ``strategy``: the recommended
    batching; ``tokens_per_sample_effective``: tokens computed per training sequence, padding
    included; ``padding_fraction``: the share of those that is padding; ``total_tokens``: real
    tokens trained per epoch; ``tokens``: tokens computed per epoch, padding included — the token
    budget to plan with, so that steps x (micro-batch x seq_len) matches the padded work.
    """
    data = load_stats(stats) if isinstance(stats, (str, Path)) else stats
    try:
        rec = data["recommendation"]
        row = data["padding"][rec["strategy"]]
        return {
            "seq_len": int(data["seq_len"]),
            "micro_batch": int(data["micro_batch"]),
            "strategy": rec["strategy"],
            "tokens_per_sample_effective": float(row["tokens_per_sequence"]),
            "padding_fraction": float(row["waste"]),
            "total_tokens": int(round(row["real_tokens"])),
            "tokens": int(round(row["padded_tokens"])),
            "sequences": int(round(row["sequences"])),
            "approximate": bool(data.get("approximate")),
            "sampled": data.get("sampling") is not None,
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CorpusError(f"corpus stats lack {exc}; regenerate them with `trainledger corpus ... --json`") from None
