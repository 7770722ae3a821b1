"""Read Parquet in bounded memory, whatever its row groups (issue 20).

``read_row_group`` decodes a whole row group at once: a 400 KB file whose one row group holds
thousands of copies of a long dictionary-encoded string expanded to 4.4 GB. Here the rows are
streamed with ``ParquetFile.iter_batches`` (Apache Arrow, pyarrow.parquet docs) in batches of at
most :data:`BATCH_ROWS` rows, string columns are kept dictionary-encoded while read
(``read_dictionary``), and before a batch becomes Python objects the bytes of every row are
measured from its Arrow buffers (dictionary value lengths taken per index): a batch above
:data:`BATCH_BYTES` is converted row by row, and a row above ``--max-line-bytes`` is skipped and
counted as giant without being materialized.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainledger.errors import CorpusError
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.streams import Giant, pyarrow_modules

#: rows per streamed batch
BATCH_ROWS = 256
#: bytes of one batch converted to Python objects at once
BATCH_BYTES = 32 << 20


def _row_bytes(pa: Any, pc: Any, col: Any) -> list[int]:
    """Bytes of each row of one column, dictionary values counted per use."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    if pa.types.is_dictionary(t):
        lengths = _row_bytes(pa, pc, col.dictionary)
        return [0 if i is None else lengths[i] for i in col.indices.to_pylist()]
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return pc.fill_null(pc.binary_length(col), 0).to_pylist()
    try:
        width = max(1, t.bit_width // 8)
    except ValueError:  # nested (lists of messages, structs): the bytes each row's slice references
        return [col.slice(i, 1).nbytes for i in range(len(col))]
    return [width] * len(col)


def iter_parquet(unit: Any, opts: CorpusOptions, columns: Any) -> Iterator[tuple[int, Any]]:
    """(row index, record dict) of the row groups ``unit`` owns; a giant row yields Giant."""
    pa, pq = pyarrow_modules()
    import pyarrow.compute as pc

    path = unit.source.path
    try:
        probe = pq.ParquetFile(path)
        names = probe.schema_arrow.names
        wanted = columns(names) if columns else None
        if wanted:
            missing = [c for c in wanted if c not in names]
            if missing:
                raise CorpusError(f"{path}: no column {missing[0]!r}; columns: {', '.join(names)}")
        schema = probe.schema_arrow
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                   or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
        pf = pq.ParquetFile(path, read_dictionary=strings or None)
        row = 0
        for k in range(pf.metadata.num_row_groups):
            n_rows = pf.metadata.row_group(k).num_rows
            if k % unit.stride != unit.start:
                row += n_rows
                continue
            j = 0
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[k], columns=wanted or None,
                                         use_threads=False):
                per_col = [_row_bytes(pa, pc, c) for c in batch.columns]
                sizes = [sum(x) for x in zip(*per_col)] if per_col else [0] * batch.num_rows
                if sum(sizes) <= BATCH_BYTES and max(sizes, default=0) <= opts.max_line_bytes:
                    for rec in batch.to_pylist():
                        yield row + j, rec
                        j += 1
                    continue
                for i in range(batch.num_rows):
                    if sizes[i] > opts.max_line_bytes:
                        yield row + j, Giant(sizes[i])
                    else:
                        yield row + j, batch.slice(i, 1).to_pylist()[0]
                    j += 1
            row += n_rows
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise CorpusError(f"{path}: cannot read parquet ({exc})") from None
