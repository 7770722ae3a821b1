"""Assemble the stats document (what ``trainledger corpus --json`` prints) from merged counts.

Top-level keys: ``kind``, ``version``, ``inputs``, ``tokenizer``, ``approximate``, ``records``,
``samples``, ``total_tokens``, ``mean``, ``median``, ``p90``, ``p95``, ``p99``, ``min``, ``max``,
``std``, ``histogram``, ``seq_len``, ``seq_len_source``, ``micro_batch``, ``truncation``,
``padding`` (one entry per strategy), ``recommendation``, ``sampling`` (null unless --sample),
``errors``, ``warnings``, ``throughput``. Token counts are tokens; times are seconds.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from trainledger.errors import CorpusError
from trainledger.corpus.batching import padding_table
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.recommend import STATS_KIND, STATS_VERSION, choose_strategy, round_seq_len
from trainledger.corpus.sources import Source
from trainledger.corpus.stats import histogram, sample_interval, summarize, truncation
from trainledger.corpus.tokenizer import TokenCounter

if TYPE_CHECKING:
    from trainledger.corpus.work import Tally

_MAX_LISTED_SOURCES = 50


def _no_samples(sources: list[Source], tally: "Tally") -> CorpusError:
    if tally.examples:
        return CorpusError(f"no sample could be read ({sum(tally.errors.values())} errors); first: {tally.examples[0]}")
    if tally.records:
        return CorpusError("no record was drawn by --sample; raise N")
    names = ", ".join(s.path for s in sources[:3]) + (" ..." if len(sources) > 3 else "")
    return CorpusError(f"no samples: the input is empty ({names})")


def _warnings(sources: list[Source], counter: TokenCounter, tally: "Tally", rate: float | None) -> list[str]:
    out = []
    if counter.approximate:
        out.append(f"token counts are an ESTIMATE (1 token per {counter.chars_per_token:g} characters); "
                   "pass --tokenizer tokenizer.json for exact counts")
    if tally.errors:
        kinds = ", ".join(f"{k} {v}" for k, v in tally.errors.most_common())
        out.append(f"skipped {sum(tally.errors.values())} bad records ({kinds}); first: {tally.examples[0]}")
    empty = [s.path for i, s in enumerate(sources) if s.fmt != "txt-file" and tally.per_source[i] == 0]
    if empty:
        out.append(f"{len(empty)} input file(s) hold no records: " + ", ".join(empty[:5]))
    if tally.chat and not counter.approximate and not counter.chat.uses_template:
        out.append(f"{tally.chat} chat records rendered with the {counter.chat.describe()}")
    if tally.replaced:
        out.append(f"{tally.replaced} records were not valid UTF-8; undecodable bytes became U+FFFD")
    if rate is not None:
        out.append(f"statistics from a random sample of {tally.samples} of {tally.records} records; "
                   "percentiles and padding are estimates")
    return out


def _scale(padding: dict[str, dict], factor: float) -> dict[str, dict]:
    if factor == 1.0:
        return padding
    keys = ("real_tokens", "padded_tokens", "padding_tokens", "sequences", "micro_batches")
    return {name: {k: (v * factor if k in keys else v) for k, v in row.items()} for name, row in padding.items()}


def _sampling(opts: CorpusOptions, tally: "Tally", rate: float, summary: dict) -> tuple[dict, float]:
    """The --sample block and the factor from sample to the whole corpus."""
    drawn = tally.samples + sum(tally.errors.values())
    valid_population = tally.records * tally.samples / drawn if drawn else 0.0
    ci = sample_interval(tally.counts, round(valid_population), opts.confidence)
    block = {"requested": opts.sample, "rate": rate, "population_records": tally.records,
             "estimated_samples": valid_population, "sample_total_tokens": summary["total_tokens"],
             "seed": opts.seed, "confidence": ci}
    return block, valid_population / tally.samples


def build_stats(paths: list[str], sources: list[Source], counter: TokenCounter, opts: CorpusOptions,
                tally: "Tally", rate: float | None, workers: int, elapsed: float) -> dict[str, Any]:
    if tally.samples == 0:
        raise _no_samples(sources, tally)
    counts: Counter = tally.counts
    summary = summarize(counts)
    rec_len, multiple = round_seq_len(summary["p99"])
    seq_len = opts.seq_len or rec_len
    padding = padding_table(counts, seq_len, opts.micro_batch)
    strategy, reason = choose_strategy(padding)
    sampling, factor = (None, 1.0) if rate is None else _sampling(opts, tally, rate, summary)
    stats: dict[str, Any] = {
        "kind": STATS_KIND, "version": STATS_VERSION,
        "inputs": {"paths": list(paths), "files": len(sources), "bytes": sum(s.size for s in sources),
                   "sources": [s.to_dict() for s in sources[:_MAX_LISTED_SOURCES]],
                   "fields": list(opts.fields) or "detected", "text_mode": opts.text_mode},
        "tokenizer": counter.describe() | {
            "add_special_tokens": opts.add_special_tokens,
            "chat": None if not tally.chat else ("fallback" if not opts.chat_template or counter.approximate
                                                 else counter.chat.describe())},
        "approximate": counter.approximate,
        "records": tally.records, "blank_lines": tally.blank, "chat_records": tally.chat,
    }
    stats.update(summary)
    stats["total_tokens"] = round(summary["total_tokens"] * factor)
    stats.update({
        "histogram": histogram(counts),
        "seq_len": seq_len, "seq_len_source": "given" if opts.seq_len else "recommended",
        "micro_batch": opts.micro_batch,
        "truncation": truncation(counts, seq_len),
        "padding": _scale(padding, factor),
        "recommendation": {"seq_len": rec_len, "covers": "p99", "multiple": multiple,
                           "strategy": strategy, "reason": reason},
        "sampling": sampling,
        "errors": {"total": sum(tally.errors.values()), "by_kind": dict(tally.errors), "examples": tally.examples},
        "warnings": _warnings(sources, counter, tally, rate),
        "throughput": _throughput(workers, elapsed, summary["total_tokens"], stats["inputs"]["bytes"])
        | {"cpu_s": tally.cpu_s},
    })
    return stats


def _throughput(workers: int, elapsed: float, tokens: int, n_bytes: int) -> dict:
    """Tokens counted (drawn ones only under --sample) and bytes read per second of wall time."""
    ok = elapsed > 0
    return {"workers": workers, "elapsed_s": elapsed, "tokens_per_s": tokens / elapsed if ok else None,
            "bytes_per_s": n_bytes / elapsed if ok else None}
