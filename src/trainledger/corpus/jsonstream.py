"""Stream the records of a large JSON document one at a time (issue 20).

``json.loads`` of a 300 MB document of records took 3.5 GB: Python objects cost about ten times
their JSON text. A document shaped ``[record, ...]`` or ``{"key": [record, ...]}`` (one key) is
therefore split at its top-level commas by a small scanner — it tracks only strings, escapes and
bracket depth (RFC 8259 §2, §7), jumping between structural bytes with a regular expression — and
each record is parsed alone. Memory is one record (capped at ``--max-line-bytes``; a longer one
is skipped and counted as giant) plus one read buffer; time is linear in the file.

Other shapes (columns of equal length, anything else) return None and are read whole as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from trainledger.errors import CorpusError
from trainledger.corpus.options import CorpusOptions
from trainledger.corpus.sources import Source
from trainledger.corpus.streams import Giant, RecordError, open_binary, stream_error

_CHUNK = 1 << 20
_WS = b" \t\r\n"
_OUTSIDE = re.compile(rb'[",\[\]{}]')
_INSIDE = re.compile(rb'["\\]')
_EMPTY = object()
#: a one-key object ``{"key": [...]}`` this large or larger is streamed; smaller ones are read whole
#: (where a later key may still change how the document is read)
STREAM_OBJECT_BYTES = 16 << 20
_PREFIX = re.compile(rb'\s*(\[|\{\s*"(?:[^"\\]|\\.){0,200}"\s*:\s*\[)\s*', re.S)


def _opening(source: Source, opts: CorpusOptions) -> tuple[bytes, bool] | None:
    """(bytes before the first record, is it a one-key object) or None for another shape."""
    with open_binary(source, opts) as f:
        head = f.read(4096)
    m = _PREFIX.match(head)
    if not m:
        return None
    rest = head[m.end():]
    if not rest.startswith(b"{"):  # records are objects; an array of strings/numbers is not this shape
        return None
    in_object = m.group(1).startswith(b"{")
    if in_object and source.size < STREAM_OBJECT_BYTES:
        return None
    return head[:m.end()], in_object


def array_items(source: Source, opts: CorpusOptions) -> Iterator[Any] | None:
    """Records of a ``[...]`` / ``{"key": [...]}`` document, streamed; None for other shapes."""
    opening = _opening(source, opts)
    if opening is None:
        return None
    return _stream(source, opts, len(opening[0]), opening[1])


def _stream(source: Source, opts: CorpusOptions, skip: int, in_object: bool) -> Iterator[Any]:
    cap = opts.max_line_bytes
    depth = 0               # nesting inside the current record
    in_string = escape = False
    elem: list[bytes] = []  # bytes of the current record so far
    size = 0
    giant = False
    done = False            # the record array has closed
    tail: list[bytes] = []  # what follows the array (checked at the end)

    def finish() -> Any:
        nonlocal elem, size, giant
        if giant:
            out: Any = Giant(size)
        else:
            text = b"".join(elem).strip(_WS)
            if not text:
                out = _EMPTY
            else:
                try:
                    out = json.loads(text)
                except (ValueError, RecursionError) as exc:
                    out = RecordError("malformed", f"not valid JSON ({exc})")
        elem, size, giant = [], 0, False
        return out

    def keep(piece: bytes) -> None:
        nonlocal size, giant
        size += len(piece)
        if giant:
            return
        if size > cap:
            giant = True
            elem.clear()
            return
        elem.append(piece)

    with open_binary(source, opts) as f:
        f.read(skip)
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            if done:
                tail.append(chunk[:4096])
                continue
            pos, start, n = 0, 0, len(chunk)
            while pos < n:
                if in_string:
                    if escape:
                        escape = False
                        pos += 1
                        continue
                    m = _INSIDE.search(chunk, pos)
                    if m is None:
                        pos = n
                        break
                    pos = m.end()
                    if m.group() == b"\\":
                        escape = True
                    else:
                        in_string = False
                    continue
                m = _OUTSIDE.search(chunk, pos)
                if m is None:
                    pos = n
                    break
                c, pos = m.group(), m.end()
                if c == b'"':
                    in_string = True
                elif c in (b"[", b"{"):
                    depth += 1
                elif depth > 0 and c in (b"]", b"}"):
                    depth -= 1
                elif depth == 0 and c in (b",", b"]"):
                    keep(chunk[start:pos - 1])
                    rec = finish()
                    if rec is not _EMPTY:
                        yield rec
                    start = pos
                    if c == b"]":
                        done = True
                        tail.append(chunk[pos:pos + 4096])
                        break
                elif depth == 0:
                    raise CorpusError(f"{source.path}: not valid JSON (unexpected {c.decode()!r} in the "
                                      "record array)")
            if not done:
                keep(chunk[start:])
        err = stream_error(f)
    if err is not None:
        raise CorpusError(f"{source.path}: file ends early, is corrupt or has trailing data ({err})")
    if not done or in_string:
        raise CorpusError(f"{source.path}: not valid JSON (the record array does not end)")
    rest = b"".join(tail).strip(_WS)
    if (rest != b"}" if in_object else rest):
        raise CorpusError(f"{source.path}: only one record array is read from a large JSON document "
                          "(found more after it); convert it to JSON Lines (one record per line)")
