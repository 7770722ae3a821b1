"""Open corpus files with caps, and the records' error markers (shared by every reader).

``open_binary`` returns a file's bytes, decompressed through a byte cap (zip-bomb guard) when it
is .gz or .zst; a decompression error that ends the stream early is kept on the stream
(:func:`stream_error`) rather than raised, so the records read before it are counted.
:class:`RecordError` and :class:`Giant` mark records that could not be read or were too long.
The format readers (``readers``, ``jsonstream``, ``parquet``) all build on this module.
"""

from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass
from typing import Any

from trainledger.errors import CorpusError, MissingDependency
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.sources import Source

#: read buffer of every opened file
READ_BUFFER = 1 << 20
_DECOMPRESS_STEP = 1 << 15
#: a compressed file may always expand to this many bytes, whatever its ratio
_DECOMPRESS_FLOOR = 16 << 20


@dataclass(frozen=True)
class RecordError:
    """A record that could not be read; ``kind`` is one of the counted error kinds."""

    kind: str  # malformed | encoding | binary | giant | missing_field | not_text | truncated | unreadable
    message: str



class Giant:
    """Marker for a line longer than the cap; ``size`` bytes were skipped."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


def pyarrow_modules():
    """Import pyarrow lazily; a MissingDependency names the pip command."""
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependency("reading Parquet/Arrow needs pyarrow: pip install 'trainledger[corpus]'") from None
    return pa, pq


# ---------------------------------------------------------------- opening with caps


class _CappedStream(io.RawIOBase):
    """A decompressed stream that raises CorpusError past ``limit`` bytes (zip-bomb guard)."""

    def __init__(self, inner: Any, limit: int, where: str) -> None:
        self.inner, self.limit, self.where, self.total = inner, limit, where, 0
        #: the decompression error that ended the stream (truncation, trailing garbage), or None.
        #: Kept instead of raised: raising from here dropped the lines already decompressed into
        #: the reader's buffer (issue 20: 42 of 500 records lost to trailing garbage).
        self.error: BaseException | None = None
        self._read = getattr(inner, "read1", None) or inner.read

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self.error is not None:
            return 0
        try:
            # read1: at most one read of the decompressor, so that an error on the next one cannot
            # discard bytes GzipFile had already decompressed into its own buffer
            data = self._read(min(len(buf), _DECOMPRESS_STEP))
        except truncation_errors() as exc:
            self.error = exc
            return 0
        n = len(data)
        self.total += n
        if self.total > self.limit:
            raise CorpusError(
                f"{self.where}: decompressed more than {self.limit:,} bytes (over the "
                "--max-decompression-ratio); refusing a possible zip bomb — raise the ratio if the file is real")
        buf[:n] = data
        return n


def open_binary(source: Source, opts: CorpusOptions) -> io.BufferedReader:
    """The file's bytes, decompressed (and capped) when it is .gz or .zst."""
    raw = open(source.path, "rb", buffering=READ_BUFFER)  # noqa: SIM115 - closed by the caller
    if source.compression is None:
        return raw
    limit = int(max(opts.max_decompression_ratio * source.size, _DECOMPRESS_FLOOR))
    if source.compression == "gzip":
        inner: Any = gzip.GzipFile(fileobj=raw, mode="rb")
    else:
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise MissingDependency(f"{source.path}: reading .zst needs zstandard: pip install zstandard") from None
        inner = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return io.BufferedReader(_CappedStream(inner, limit, source.path), buffer_size=READ_BUFFER)


_TRUNCATION_ERRORS: tuple[type[BaseException], ...] = (EOFError, gzip.BadGzipFile, OSError, zlib.error)


def stream_error(f: Any) -> BaseException | None:
    """The decompression error that ended ``f`` early (see :class:`_CappedStream`), or None."""
    return getattr(getattr(f, "raw", None), "error", None)


def truncated(exc: BaseException) -> RecordError:
    return RecordError("truncated", f"file ends early, is corrupt or has trailing data ({exc}); "
                       "the records before this point are counted")


def truncation_errors() -> tuple[type[BaseException], ...]:
    try:
        import zstandard
    except ImportError:
        return _TRUNCATION_ERRORS
    return (*_TRUNCATION_ERRORS, zstandard.ZstdError)
