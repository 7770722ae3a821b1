"""Statistics against numpy; padding waste against brute-force simulations of the batching."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from trainledger.corpus import batching
from trainledger.corpus.recommend import choose_strategy, round_seq_len
from trainledger.corpus.stats import histogram, sample_interval, summarize, truncation


def _lengths(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(5, 1.1, n).astype(int))


@pytest.mark.parametrize("seed,n", [(0, 1), (1, 2), (2, 7), (3, 1000), (4, 20_000)])
def test_summary_matches_numpy(seed, n):
    a = _lengths(seed, n)
    s = summarize(Counter(a.tolist()))
    assert s["samples"] == n and s["total_tokens"] == a.sum()
    assert s["mean"] == pytest.approx(a.mean()) and s["std"] == pytest.approx(a.std(), abs=1e-9)
    for key, q in (("median", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert s[key] == pytest.approx(np.percentile(a, q)), key
    assert (s["min"], s["max"]) == (a.min(), a.max())


def test_histogram_counts_every_sample_in_its_bin():
    a = _lengths(5, 5000)
    h = histogram(Counter(a.tolist()))
    edges = np.array(h["edges"])
    direct = [int(((a >= lo) & (a < hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:])]
    assert h["counts"] == direct and sum(direct) == a.size
    assert h["overflow"] and edges[-2] > np.percentile(a, 99) and edges[-1] == a.max() + 1


def test_truncation_matches_numpy():
    a = _lengths(6, 3000)
    t = truncation(Counter(a.tolist()), 512)
    assert t["samples"] == (a > 512).sum()
    assert t["tokens_lost"] == np.clip(a - 512, 0, None).sum()
    assert t["share"] == pytest.approx((a > 512).mean())


# ------------------------------------------------- brute-force batching, written apart from the library


def sim_padded(a: np.ndarray, s: int, b: int, order: np.ndarray) -> int:
    """Pad every micro-batch of the given order to its longest (truncated) sample."""
    x = np.minimum(a[order], s)
    return sum(int(x[i:i + b].max()) * len(x[i:i + b]) for i in range(0, len(x), b))


@pytest.mark.parametrize("n,b", [(6, 2), (7, 3), (5, 5), (6, 4)])
def test_pad_to_longest_is_the_exact_mean_over_all_orders(n, b):
    a = np.array([5, 1, 9, 9, 3, 12, 7][:n])
    orders = list(itertools.permutations(range(n)))
    mean = np.mean([sim_padded(a, 10, b, np.array(o)) for o in orders])
    got = batching.pad_to_longest(Counter(a.tolist()), 10, b)
    assert got["padded_tokens"] == pytest.approx(mean, rel=1e-9)
    assert got["real_tokens"] == np.minimum(a, 10).sum()


def test_pad_to_longest_matches_random_shuffles():
    a = _lengths(7, 2003)  # not a multiple of b: one short last batch
    rng = np.random.default_rng(0)
    sims = np.array([sim_padded(a, 1024, 8, rng.permutation(a.size)) for _ in range(300)])
    got = batching.pad_to_longest(Counter(a.tolist()), 1024, 8)["padded_tokens"]
    assert abs(got - sims.mean()) < 4 * sims.std(ddof=1) / math.sqrt(sims.size)


def test_other_strategies_match_direct_simulation():
    a = _lengths(8, 1001)
    counts, s, b = Counter(a.tolist()), 768, 16
    clipped = np.minimum(a, s)
    pad_max = batching.pad_to_max(counts, s, b)
    assert pad_max["padded_tokens"] == a.size * s and pad_max["real_tokens"] == clipped.sum()
    bucket = batching.bucketed(counts, s, b)
    assert bucket["padded_tokens"] == sim_padded(a, s, b, np.argsort(a, kind="stable"))
    stream = np.concatenate([np.ones(k) for k in a])  # every token of every sample, in a row
    seqs = [stream[i:i + s] for i in range(0, stream.size, s)]
    pack = batching.packing(counts, s, b)
    assert pack["sequences"] == len(seqs) and pack["padded_tokens"] == len(seqs) * s
    assert pack["waste"] == pytest.approx(1 - a.sum() / (len(seqs) * s))
    assert pack["micro_batches"] == -(-len(seqs) // b)
    for row in (pad_max, bucket, pack):
        assert row["waste"] == pytest.approx(1 - row["real_tokens"] / row["padded_tokens"])


def test_strategies_order_and_recommendation():
    a = _lengths(9, 4000)
    table = batching.padding_table(Counter(a.tolist()), 1024, 8)
    w = {k: v["waste"] for k, v in table.items()}
    assert w["pad_to_max"] >= w["pad_to_longest"] >= w["bucketed"] >= 0
    assert w["packing"] < 1024 / a.sum() + 1e-12
    assert choose_strategy(table)[0] == "bucketed"  # sorted batches of similar lengths pad < 5%
    uniform = batching.padding_table(Counter({100: 64}), 128, 8)
    assert choose_strategy(uniform)[0] == "pad_to_longest"
    assert round_seq_len(608.0) == (640, 64) and round_seq_len(64) == (64, 64)
    assert round_seq_len(1025) == (1152, 128) and round_seq_len(3) == (64, 64)


def test_sample_interval_covers_the_truth():
    """Over 200 random draws of 300 from 20 000, the 95% interval holds the mean about 95% of the time."""
    pop = _lengths(10, 20_000)
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(200):
        draw = rng.choice(pop, 300, replace=False)
        ci = sample_interval(Counter(draw.tolist()), pop.size, 0.95)
        lo, hi = ci["mean"]
        hits += lo <= pop.mean() <= hi
        assert ci["total_tokens"][0] == pytest.approx(lo * pop.size)
    assert 0.88 <= hits / 200 <= 0.99
