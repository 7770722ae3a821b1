"""Padding waste of four ways to batch samples of known lengths into micro-batches of b samples.

Symbols: N samples with token lengths l_i, sequence length s (longer samples are truncated to s,
except by packing), micro-batch b. ``real`` tokens are the tokens trained on, ``padded`` the tokens
the GPU computes (real + padding); ``waste = 1 - real / padded``.

* ``pad_to_max`` — every sample padded to s (tokenizer ``padding="max_length"``):
  padded = N·s.
* ``pad_to_longest`` — random order, each micro-batch padded to its longest sample (dynamic
  padding, e.g. ``DataCollatorWithPadding``). Reported as the exact expectation over random
  shuffles: each micro-batch of a random permutation is a uniformly random m-subset, and for the
  sorted lengths P(max of m ≤ v) = C(#{l ≤ v}, m) / C(N, m) (hypergeometric), so
  E[padded] = ⌊N/b⌋·b·E[max of b] + r·E[max of r] with r = N mod b.
* ``bucketed`` — samples sorted by length, then cut into micro-batches (length-grouped
  sampling). A global sort is the best case; samplers that sort inside mega-batches (e.g.
  transformers' ``group_by_length``) land between this and ``pad_to_longest``.
* ``packing`` — all samples concatenated and cut into sequences of exactly s tokens (no
  truncation); only the last sequence is padded: padded = ⌈Σl/s⌉·s. Samples then share
  sequences; keeping them apart needs per-document attention masks or position-id resets.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from trainledger.corpus.stats import Lengths

STRATEGIES = ("pad_to_max", "pad_to_longest", "bucketed", "packing")


def clip_counts(counts: Mapping[int, int], seq_len: int) -> Counter:
    """Length counts after truncation at ``seq_len``."""
    out: Counter = Counter()
    for v, c in counts.items():
        out[min(int(v), seq_len)] += c
    return out


def _log_comb(a: int, m: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(m + 1) - math.lgamma(a - m + 1)


def expected_max(lengths: Lengths, m: int) -> float:
    """E[max] of a uniformly random m-subset (without replacement) of the lengths."""
    n = lengths.n
    if m <= 0:
        return 0.0
    if m >= n:
        return float(lengths.values[-1])
    log_total = _log_comb(n, m)
    expected, prev = 0.0, 0.0
    for v, cum in zip(lengths.values, lengths.cum):
        p = 0.0 if cum < m else math.exp(_log_comb(cum, m) - log_total)
        expected += v * (p - prev)
        prev = p
    return expected


def _result(real: float, padded: float, sequences: float, b: int) -> dict:
    return {"real_tokens": real, "padded_tokens": padded, "padding_tokens": padded - real,
            "waste": 1.0 - real / padded if padded else 0.0, "sequences": sequences,
            "tokens_per_sequence": padded / sequences if sequences else 0.0,
            "micro_batches": math.ceil(sequences / b) if sequences else 0}


def pad_to_max(counts: Mapping[int, int], seq_len: int, b: int) -> dict:
    lengths = Lengths(clip_counts(counts, seq_len))
    return _result(lengths.sum(), lengths.n * seq_len, lengths.n, b)


def pad_to_longest(counts: Mapping[int, int], seq_len: int, b: int) -> dict:
    lengths = Lengths(clip_counts(counts, seq_len))
    full, rest = divmod(lengths.n, b)
    padded = full * b * expected_max(lengths, b) + rest * expected_max(lengths, rest)
    return _result(lengths.sum(), padded, lengths.n, b)


def bucketed(counts: Mapping[int, int], seq_len: int, b: int) -> dict:
    """Sorted by length, cut into micro-batches of b; each padded to its last (longest) sample."""
    lengths = Lengths(clip_counts(counts, seq_len))
    padded, start = 0, 0
    for v, c in zip(lengths.values, lengths.counts):
        full_batch_ends = (start + c) // b - start // b  # positions k·b-1 inside [start, start+c)
        padded += full_batch_ends * b * v
        start += c
    rest = lengths.n % b
    if rest:
        padded += rest * lengths.values[-1]
    return _result(lengths.sum(), padded, lengths.n, b)


def packing(counts: Mapping[int, int], seq_len: int, b: int) -> dict:
    total = Lengths(counts).sum()
    sequences = math.ceil(total / seq_len)
    return _result(total, sequences * seq_len, sequences, b)


def padding_table(counts: Mapping[int, int], seq_len: int, b: int) -> dict[str, dict]:
    """All four strategies at sequence length s and micro-batch b."""
    if not counts or sum(counts.values()) == 0:
        return {}
    return {"pad_to_max": pad_to_max(counts, seq_len, b), "pad_to_longest": pad_to_longest(counts, seq_len, b),
            "bucketed": bucketed(counts, seq_len, b), "packing": packing(counts, seq_len, b)}
