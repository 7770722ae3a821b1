"""Token-length statistics of a user's dataset, padding waste of batching strategies, plan hints.

    >>> from trainledger.corpus import analyze, CorpusOptions, plan_hints
    >>> stats = analyze(["data/*.jsonl"], CorpusOptions(tokenizer="tokenizer.json", micro_batch=8))
    >>> plan_hints(stats)["seq_len"]

Modules: ``sources`` (find files, detect formats), ``readers`` (stream records with caps),
``fields`` (which part is the text; chat, prompt/response), ``chat`` (chat templates),
``tokenizer`` (exact or labelled approximate counts), ``work`` (one unit in one process),
``run`` (units on all cores), ``stats`` (exact summaries from counts), ``batching`` (padding
waste of four strategies), ``recommend`` (sequence length, strategy, plan hints), ``report``
(the stats document), ``render`` (terminal text). Heavy libraries (tokenizers, pyarrow,
zstandard, jinja2) are imported only when a file or option needs them.
"""

from __future__ import annotations

from trainledger.corpus.batching import STRATEGIES, padding_table
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.recommend import STATS_KIND, load_stats, plan_hints
from trainledger.corpus.run import analyze
from trainledger.corpus.stats import histogram, summarize

__all__ = [
    "CorpusOptions",
    "STATS_KIND",
    "STRATEGIES",
    "analyze",
    "histogram",
    "load_stats",
    "padding_table",
    "plan_hints",
    "summarize",
]
