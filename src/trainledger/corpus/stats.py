"""Summary statistics of token lengths kept as exact counts (length -> number of samples).

Counts make every statistic exact while memory stays bounded by the number of distinct lengths,
however many samples are read. Percentiles use linear interpolation between the two nearest
ranks — numpy's default ``method="linear"`` (Hyndman & Fan 1996, definition 7). ``std`` is the
population standard deviation (ddof = 0).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from statistics import NormalDist

PERCENTILES = {"median": 50, "p90": 90, "p95": 95, "p99": 99}


class Lengths:
    """A sorted view of length counts with rank lookups."""

    def __init__(self, counts: Mapping[int, int]) -> None:
        items = sorted((int(k), int(v)) for k, v in counts.items() if v > 0)
        self.values = [k for k, _ in items]
        self.counts = [v for _, v in items]
        self.cum: list[int] = []
        total = 0
        for v in self.counts:
            total += v
            self.cum.append(total)
        self.n = total

    def at_rank(self, r: int) -> int:
        """The r-th smallest length (0-based)."""
        return self.values[bisect.bisect_right(self.cum, r)]

    def percentile(self, q: float) -> float:
        """numpy.percentile(lengths, q) with the default linear method."""
        h = (self.n - 1) * q / 100.0
        lo = math.floor(h)
        a, b = self.at_rank(lo), self.at_rank(min(lo + 1, self.n - 1))
        return a + (h - lo) * (b - a)

    def sum(self) -> int:
        return sum(v * c for v, c in zip(self.values, self.counts))

    def clipped_sum(self, cap: int) -> int:
        return sum(min(v, cap) * c for v, c in zip(self.values, self.counts))


def summarize(counts: Mapping[int, int]) -> dict:
    """samples, total_tokens, mean, median, p90, p95, p99, min, max, std of the lengths."""
    lengths = Lengths(counts)
    n = lengths.n
    if n == 0:
        return {"samples": 0, "total_tokens": 0, "mean": None, "median": None, "p90": None, "p95": None,
                "p99": None, "min": None, "max": None, "std": None}
    s1 = lengths.sum()
    s2 = sum(v * v * c for v, c in zip(lengths.values, lengths.counts))
    out = {"samples": n, "total_tokens": s1, "mean": s1 / n}
    out.update({name: lengths.percentile(q) for name, q in PERCENTILES.items()})
    out.update({"min": lengths.values[0], "max": lengths.values[-1],
                "std": math.sqrt(max(s2 * n - s1 * s1, 0)) / n})
    return out


def _nice_step(x: float) -> int:
    """The smallest of 1, 2, 5 x 10^k that is >= x."""
    if x <= 1:
        return 1
    mag = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * mag >= x:
            return int(m * mag)
    return int(10 * mag)


def histogram(counts: Mapping[int, int], bins: int = 20) -> dict:
    """Equal-width bins [edges[i], edges[i+1]) up to p99, plus one overflow bin up to the max."""
    lengths = Lengths(counts)
    if lengths.n == 0:
        return {"edges": [], "counts": [], "overflow": False}
    p99 = lengths.percentile(99)
    width = _nice_step((p99 + 1) / bins)
    n_bins = max(1, math.ceil((p99 + 1) / width))
    edges = [i * width for i in range(n_bins + 1)]
    overflow = lengths.values[-1] >= edges[-1]
    if overflow:
        edges.append(lengths.values[-1] + 1)
    out = [0] * (len(edges) - 1)
    for v, c in zip(lengths.values, lengths.counts):
        i = min(v // width, n_bins) if v < edges[n_bins] else n_bins
        out[i] += c
    return {"edges": edges, "counts": out, "overflow": overflow}


def truncation(counts: Mapping[int, int], seq_len: int) -> dict:
    """How many samples and tokens are cut off at ``seq_len``."""
    lengths = Lengths(counts)
    over = [(v, c) for v, c in zip(lengths.values, lengths.counts) if v > seq_len]
    samples = sum(c for _, c in over)
    lost = sum((v - seq_len) * c for v, c in over)
    total = lengths.sum()
    return {"seq_len": seq_len, "samples": samples, "share": samples / lengths.n if lengths.n else 0.0,
            "tokens_lost": lost, "token_share": lost / total if total else 0.0}


def sample_interval(counts: Mapping[int, int], population: int, level: float) -> dict:
    """Confidence interval of the mean length and of the total tokens from a random sample.

    Normal approximation to the sampling distribution of the mean (central limit theorem) with the
    finite-population correction sqrt(1 - n/N) for sampling without replacement (Cochran,
    "Sampling Techniques", 3rd ed. 1977, eq. 2.12); the total is N x mean (eq. 2.16).
    """
    lengths = Lengths(counts)
    n = lengths.n
    if n < 2:
        return {"level": level, "mean": None, "total_tokens": None, "standard_error": None}
    mean = lengths.sum() / n
    ss = sum(c * (v - mean) ** 2 for v, c in zip(lengths.values, lengths.counts))
    sd = math.sqrt(ss / (n - 1))
    fpc = math.sqrt(max(0.0, 1.0 - n / population)) if population else 1.0
    se = sd / math.sqrt(n) * fpc
    z = NormalDist().inv_cdf(0.5 + level / 2)
    lo, hi = mean - z * se, mean + z * se
    return {"level": level, "mean": [lo, hi], "total_tokens": [lo * population, hi * population],
            "standard_error": se}
