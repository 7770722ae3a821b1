"""Stream the records of one work unit, whatever the file format.

``iter_raw(unit, opts)`` yields ``(index, raw)`` pairs: ``index`` counts records inside the unit
(a line number for line files, a row number for columnar files), ``raw`` is what the sampler may
skip cheaply before ``decode`` turns it into a record (dict, str or list of messages) or a
:class:`RecordError`. Memory stays bounded: line files are read line by line with a per-line cap,
columnar files one record batch / row group at a time, compressed files through a decompression
cap (zip-bomb guard).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainledger.errors import CorpusError
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.sources import Source
from trainledger.corpus.streams import (
    READ_BUFFER, Giant, RecordError, open_binary, pyarrow_modules, stream_error, truncated, truncation_errors,
)
from trainledger.corpus.jsonstream import array_items
from trainledger.corpus.parquet import iter_parquet

LINE_FORMATS = ("jsonl", "txt")



@dataclass(frozen=True)
class Unit:
    """A piece of work for one process.

    ``range``: bytes [start, end) of an uncompressed line file (a line belongs to the unit holding
    its first byte). ``stride``: records (or batches / row groups) i of the file with
    ``i % stride == start``. ``files``: whole small files, one sample each (txt per file).
    """

    source: Source
    source_index: int
    kind: str
    start: int = 0
    end: int = 0
    stride: int = 1
    files: tuple[Source, ...] = ()

    @property
    def weight(self) -> int:
        """Bytes this unit accounts for in the progress bar."""
        if self.kind == "range":
            return self.end - self.start
        if self.kind == "files":
            return sum(s.size for s in self.files)
        return self.source.size // self.stride



# ---------------------------------------------------------------- line files




def _skip_rest(f: io.BufferedReader, first: bytes, limit: int | None = None) -> int:
    """Bytes up to and including the next newline (or EOF); stops early after ``limit`` bytes."""
    skipped = len(first)
    while limit is None or skipped < limit:
        more = f.readline(READ_BUFFER if limit is None else min(READ_BUFFER, limit - skipped))
        skipped += len(more)
        if not more or more.endswith(b"\n"):
            return skipped
    return skipped


def _read_lines(f: io.BufferedReader, cap: int, budget: int | None) -> Iterator[bytes | Giant]:
    """Lines of ``f`` until ``budget`` bytes were passed (a line starting inside it is whole)."""
    used = 0
    while budget is None or used < budget:
        line = f.readline(cap + 1)
        if not line:
            return
        if len(line) > cap and not line.endswith(b"\n"):
            size = _skip_rest(f, line)
            used += size
            yield Giant(size)
            continue
        used += len(line)
        yield line


def _iter_lines(unit: Unit, opts: CorpusOptions) -> Iterator[tuple[int, Any]]:
    with open_binary(unit.source, opts) as f:
        budget = None
        if unit.kind == "range":
            budget = unit.end - unit.start
            if unit.start > 0:
                f.seek(unit.start - 1)
                # the line holding byte start-1 belongs to the previous unit; look no further than
                # this unit's own bytes for its end (a giant line is scanned once, not per unit)
                budget -= _skip_rest(f, b"", limit=budget + 1) - 1
        index = 0
        try:
            for line in _read_lines(f, opts.max_line_bytes, budget):
                if isinstance(line, bytes) and not line.endswith(b"\n") and stream_error(f) is not None:
                    break  # the line the stream broke off in: part of the truncation, not a record
                if unit.kind == "stride" and index % unit.stride != unit.start:
                    index += 1
                    continue
                yield index, line
                index += 1
        except truncation_errors() as exc:
            yield index, truncated(exc)
            return
        err = stream_error(f)
        if err is not None:
            yield index, truncated(err)


def decode_line(raw: bytes, opts: CorpusOptions, whole: bool = False) -> tuple[str | None, RecordError | None, bool]:
    """(text, error, replaced): UTF-8 text of a line without its line ending (``whole``: kept as is)."""
    if b"\x00" in raw:
        return None, RecordError("binary", "binary data (NUL bytes), not text"), False
    end = "" if whole else "\r\n"
    try:
        return raw.decode("utf-8").rstrip(end), None, False
    except UnicodeDecodeError as exc:
        if opts.encoding_errors == "replace":
            return raw.decode("utf-8", errors="replace").rstrip(end), None, True
        bad = raw[exc.start:exc.start + 1].hex()
        return None, RecordError("encoding", f"not valid UTF-8 (byte 0x{bad} at column {exc.start + 1}); "
                                 "fix the file or pass --encoding-errors replace"), False


def parse_json_line(text: str) -> Any:
    """A JSON record, or a RecordError for malformed JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        return RecordError("malformed", f"not valid JSON ({exc})")


# ---------------------------------------------------------------- whole documents


def _read_document(source: Source, opts: CorpusOptions) -> bytes:
    with open_binary(source, opts) as f:
        data = f.read(opts.max_document_bytes + 1)
        err = stream_error(f)
    if err is not None:
        raise CorpusError(f"{source.path}: file ends early, is corrupt or has trailing data ({err})")
    if len(data) > opts.max_document_bytes:
        raise CorpusError(f"{source.path}: one JSON document larger than {opts.max_document_bytes:,} bytes; "
                          "convert it to JSON Lines (one record per line) to stream it")
    return data


def json_records(data: Any, where: str) -> list[Any]:
    """Records of a JSON document: a list, {"<key>": [records]}, or a mapping of equal columns."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1 and all(isinstance(r, dict) for r in next(iter(lists.values()))[:10]):
            return next(iter(lists.values()))
        if lists and len(lists) == len(data) and len({len(v) for v in lists.values()}) == 1:
            keys = list(lists)
            return [dict(zip(keys, row)) for row in zip(*lists.values())]
    raise CorpusError(f"{where}: expected a JSON array of records, {{\"data\": [records]}} or a mapping of "
                      "equal-length columns")


def _iter_json(unit: Unit, opts: CorpusOptions) -> Iterator[tuple[int, Any]]:
    streamed = array_items(unit.source, opts)
    if streamed is not None:  # an array of records (or {"key": [records]}): one record in memory at a time
        for i, rec in enumerate(streamed):
            if i % unit.stride == unit.start:
                yield i, rec
        return
    data = _read_document(unit.source, opts)
    try:
        doc = json.loads(data.decode("utf-8", errors="strict" if opts.encoding_errors == "strict" else "replace"))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{unit.source.path}: not valid UTF-8 at byte {exc.start}; "
                          "pass --encoding-errors replace") from None
    except (ValueError, RecursionError) as exc:
        raise CorpusError(f"{unit.source.path}: not valid JSON ({exc})") from None
    for i, rec in enumerate(json_records(doc, unit.source.path)):
        if i % unit.stride == unit.start:
            yield i, rec


def _iter_csv(unit: Unit, opts: CorpusOptions) -> Iterator[tuple[int, Any]]:
    csv.field_size_limit(opts.max_line_bytes)
    delimiter = "\t" if unit.source.fmt == "tsv" else ","
    errors = "strict" if opts.encoding_errors == "strict" else "replace"
    with open_binary(unit.source, opts) as fb, io.TextIOWrapper(fb, encoding="utf-8", errors=errors, newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        i = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                err = stream_error(fb)
                if err is not None:
                    yield i, truncated(err)
                return
            except csv.Error as exc:
                row = RecordError("malformed", f"bad CSV ({exc})")
            except UnicodeDecodeError as exc:
                yield i, RecordError("encoding", f"not valid UTF-8 ({exc.reason}); pass --encoding-errors replace")
                return
            if i % unit.stride == unit.start:
                if isinstance(row, dict) and None in row:
                    row = RecordError("malformed", f"{len(row[None]) + len(row) - 1} fields where the "
                                      f"header has {len(row) - 1}")
                yield i, row
            i += 1


def _iter_text_files(unit: Unit, opts: CorpusOptions) -> Iterator[tuple[int, Any]]:
    for i, src in enumerate(unit.files):
        with open_binary(src, opts) as f:
            data = f.read(opts.max_document_bytes + 1)
            err = stream_error(f)
        if err is not None:
            yield i, RecordError("malformed", f"{src.path}: file ends early, is corrupt or has trailing data ({err})")
        elif len(data) > opts.max_document_bytes:
            yield i, Giant(len(data))
        else:
            yield i, data


# ---------------------------------------------------------------- columnar files


def _batches(source: Source) -> Iterator[Any]:
    pa, pq = pyarrow_modules()
    fmt = source.fmt
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(source.path)
            for i in range(pf.metadata.num_row_groups):
                yield pf.metadata.row_group(i).num_rows, (lambda i=i, pf=pf: pf.read_row_group(i))
        elif fmt == "arrow-file":
            reader = pa.ipc.open_file(pa.memory_map(source.path, "r"))
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                yield batch.num_rows, (lambda b=batch: b)
        elif fmt == "feather-v1":
            import pyarrow.feather as feather

            table = feather.read_table(source.path)
            yield table.num_rows, (lambda t=table: t)
        else:
            for batch in pa.ipc.open_stream(pa.memory_map(source.path, "r")):
                yield batch.num_rows, (lambda b=batch: b)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise CorpusError(f"{source.path}: cannot read {fmt} ({exc})") from None


def _iter_columnar(unit: Unit, opts: CorpusOptions, columns: Any) -> Iterator[tuple[int, Any]]:
    if unit.source.fmt == "parquet":
        yield from iter_parquet(unit, opts, columns)
        return
    row = 0
    for k, (n_rows, load) in enumerate(_batches(unit.source)):
        if k % unit.stride == unit.start:
            table = load()
            names = table.schema.names
            wanted = columns(names) if columns else None
            if wanted:
                missing = [c for c in wanted if c not in names]
                if missing:
                    raise CorpusError(f"{unit.source.path}: no column {missing[0]!r}; columns: {', '.join(names)}")
                table = table.select(wanted)
            for j, rec in enumerate(table.to_pylist()):
                yield row + j, rec
        row += n_rows


def iter_raw(unit: Unit, opts: CorpusOptions, columns: Any = None) -> Iterator[tuple[int, Any]]:
    """(index, raw) pairs of one unit; ``columns(names)`` picks the columns a columnar file needs."""
    fmt = unit.source.fmt
    if unit.kind == "files":
        return _iter_text_files(unit, opts)
    if fmt in LINE_FORMATS:
        return _iter_lines(unit, opts)
    if fmt == "json":
        return _iter_json(unit, opts)
    if fmt in ("csv", "tsv"):
        return _iter_csv(unit, opts)
    return _iter_columnar(unit, opts, columns)
