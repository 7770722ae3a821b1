"""One work unit, read and tokenized in one process: the worker side of the parallel scan.

A unit's result holds the token-length counts (length -> number of samples), record and error
counts, and at most a few error examples with their index inside the unit; the main process turns
those into ``file:line`` locations. Nothing grows with the unit's size except the counts, which are
bounded by the number of distinct lengths.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainledger.errors import CorpusError
from trainledger.corpus.fields import TextExtractor
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.readers import LINE_FORMATS, Unit, decode_line, iter_raw, parse_json_line
from trainledger.corpus.streams import Giant, RecordError
from trainledger.corpus.tokenizer import TokenCounter

MAX_EXAMPLES = 5
_BATCH = 512
_MASK = (1 << 64) - 1


@dataclass
class UnitResult:
    """What one unit contributed. ``examples`` hold (index in unit, kind, message)."""

    unit_index: int
    weight: int
    records: int = 0
    samples: int = 0
    items: int = 0
    blank: int = 0
    chat: int = 0
    replaced: int = 0
    counts: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    fatal: tuple | None = None
    cpu_s: float = 0.0


def keep_fraction(seed: int, source_index: int, offset: int, index: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, source, unit offset, record index).

    splitmix64 finalizer (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
    generators", OOPSLA) over a mix of the four keys: the sample drawn does not depend on how
    the files were split among workers.
    """
    x = (seed * 0x9E3779B97F4A7C15 + source_index * 0xD1B54A32D192ED03
         + offset * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB + 0x632BE59BD9B4E019) & _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return x / 18446744073709551616.0


class Worker:
    """Reads, extracts and tokenizes units with one tokenizer and one set of options."""

    def __init__(self, counter: TokenCounter, opts: CorpusOptions, sample_rate: float | None = None) -> None:
        self.counter, self.opts, self.rate = counter, opts, sample_rate
        self.extractor = TextExtractor(opts.fields)

    def run(self, unit_index: int, unit: Unit) -> UnitResult:
        cpu0 = time.process_time()
        res = UnitResult(unit_index=unit_index, weight=unit.weight)
        pending: dict[bool, list[str]] = {True: [], False: []}
        try:
            self._scan(unit, res, pending)
        except CorpusError as exc:  # the whole file is unreadable: counted, or fatal by flag
            if self.opts.on_error == "fail":
                raise
            self._error(res, -1, RecordError("unreadable", str(exc)))
        for special in (True, False):
            self._flush(pending, special, res)
        res.cpu_s = time.process_time() - cpu0
        return res

    def _scan(self, unit: Unit, res: UnitResult, pending: dict[bool, list[str]]) -> None:
        offset = unit.start if unit.kind == "range" else 0
        for index, raw in iter_raw(unit, self.opts, self.extractor.columns):
            res.items += 1
            if isinstance(raw, bytes) and not raw.strip():
                res.blank += 1
                continue
            if isinstance(raw, RecordError) and raw.kind == "truncated":  # the file's end, not a record
                self._error(res, index, raw)
                break
            res.records += 1
            if self.rate is not None and keep_fraction(self.opts.seed, unit.source_index, offset, index) >= self.rate:
                continue
            item = self._text(unit, raw, res)
            if isinstance(item, RecordError):
                self._error(res, index, item)
                if res.fatal:
                    break
                continue
            text, special = item
            pending[special].append(text)
            if len(pending[special]) >= _BATCH:
                self._flush(pending, special, res)

    def _text(self, unit: Unit, raw: Any, res: UnitResult) -> tuple[str, bool] | RecordError:
        if isinstance(raw, RecordError):
            return raw
        if isinstance(raw, Giant):
            return RecordError("giant", f"{raw.size:,} bytes in one record, over --max-line-bytes "
                               f"{self.opts.max_line_bytes:,}; skipped")
        if isinstance(raw, bytes):
            whole = unit.kind == "files"
            text, err, replaced = decode_line(raw, self.opts, whole)
            if err:
                return err
            res.replaced += replaced
            raw = text if whole or unit.source.fmt == "txt" else parse_json_line(text)
            if isinstance(raw, RecordError):
                return raw
        value = self.extractor.extract(raw)
        if isinstance(value, RecordError):
            return value
        if isinstance(value, str):
            return value, self.opts.add_special_tokens
        res.chat += 1
        if not self.opts.chat_template:
            from trainledger.corpus.chat import FALLBACK_FORMAT

            return "".join(FALLBACK_FORMAT.format(**m) for m in value), self.opts.add_special_tokens
        try:
            text, special = self.counter.chat.render(value)
        except Exception as exc:  # noqa: BLE001 - jinja2/template errors become a counted error
            return RecordError("template", f"chat template failed ({exc})")
        return text, special and self.opts.add_special_tokens

    def _error(self, res: UnitResult, index: int, err: RecordError) -> None:
        res.errors[err.kind] += 1
        if len(res.examples) < MAX_EXAMPLES:
            res.examples.append((index, err.kind, err.message))
        if self.opts.on_error == "fail":
            res.fatal = (index, err.kind, err.message)

    def _flush(self, pending: dict[bool, list[str]], special: bool, res: UnitResult) -> None:
        texts = pending[special]
        if texts:
            res.counts.update(self.counter.count(texts, special))
            res.samples += len(texts)
            pending[special] = []


# ---------------------------------------------------------------- process-pool entry points

_WORKER: Worker | None = None


def init_process(counter_state: dict, opts_json: str, sample_rate: float | None) -> None:
    """Pool initializer: one tokenizer per process, no nested thread pool."""
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    _WORKER = Worker(TokenCounter.from_state(counter_state), CorpusOptions.model_validate_json(opts_json),
                     sample_rate)


def run_unit(job: tuple[int, Unit]) -> UnitResult:
    assert _WORKER is not None, "init_process was not called"
    return _WORKER.run(*job)


@dataclass
class Tally:
    """Merged unit results, with error examples placed at file:line."""

    counts: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    records: int = 0
    samples: int = 0
    blank: int = 0
    chat: int = 0
    replaced: int = 0
    cpu_s: float = 0.0
    per_source: Counter = field(default_factory=Counter)
    line_base: Counter = field(default_factory=Counter)

    def add(self, res: UnitResult, unit: Unit, on_error: str) -> None:
        base = self.line_base[unit.source_index] if unit.kind == "range" else 0
        if res.fatal and on_error == "fail":
            raise CorpusError(f"{locate(unit, base, res.fatal[0])}: {res.fatal[2]} (--on-error fail; "
                              "--on-error skip counts and skips such records)")
        for index, _kind, message in res.examples:
            if len(self.examples) < 10:  # a whole-file message already names its file
                self.examples.append(message if index < 0 else f"{locate(unit, base, index)}: {message}")
        if unit.kind == "range":
            self.line_base[unit.source_index] += res.items
        self.counts.update(res.counts)
        self.errors.update(res.errors)
        self.per_source[unit.source_index] += res.records
        for name in ("records", "samples", "blank", "chat", "replaced", "cpu_s"):
            setattr(self, name, getattr(self, name) + getattr(res, name))


def locate(unit: Unit, base: int, index: int) -> str:
    """'file:line 12', 'file: row 7', or the file alone for a whole-file problem."""
    if index < 0:
        return unit.source.path
    if unit.kind == "files":
        return unit.files[index].path
    if unit.source.fmt in LINE_FORMATS:
        return f"{unit.source.path}:{base + index + 1}"
    noun = "record" if unit.source.fmt in ("json", "csv", "tsv") else "row"
    return f"{unit.source.path}: {noun} {index + 1}"
