"""Guards for untrusted input: config and plan files, pasted JSON, names that may be paths.

Users paste configs from anywhere and serve trainledger to a team (issue 9), so every reader
bounds what one input can cost before the domain code sees it:

* files: only regular files are read (a FIFO, ``/dev/zero`` or a directory never is), at most
  :data:`MAX_FILE_BYTES` bytes, whatever ``stat`` claims (``/proc`` files report size 0);
* parsed data: at most :data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES` values, counted
  with repetition so that YAML alias bombs ("billion laughs", shared lists referenced 9^9 times)
  are stopped after a bounded walk instead of expanded by a later ``repr`` or ``json.dumps``;
* messages: values shown in an error are cut with :func:`clip` (a bounded ``reprlib`` repr), so a
  megabyte string or a deep list never becomes a megabyte error line;
* names that may be paths: :func:`path_exists` / :func:`is_file` answer False instead of raising
  for names the OS refuses (too long, NUL bytes, loops);
* files we write (reports, exports, measurements): :func:`write_atomic` (temporary file + rename),
  so a reader never sees half a file and a failed write leaves the previous one intact.

Nothing here imports anything heavy; every error is a :class:`~trainledger.errors.SpecError`
(a failed write: :class:`~trainledger.errors.TrainledgerError`).
"""

from __future__ import annotations

import os
import reprlib
import stat
import tempfile
from pathlib import Path
from typing import Any

from trainledger.errors import SpecError, TrainledgerError

__all__ = ["MAX_FILE_BYTES", "MAX_DEPTH", "MAX_NODES", "MAX_STRING_CHARS", "read_text", "check_tree",
           "clip", "shorten", "path_exists", "is_file", "is_dir", "write_atomic"]

#: a config, plan, catalog or price file larger than this is not a config (the largest bundled
#: file, a model preset with its layer list, is under 10 KiB)
MAX_FILE_BYTES = 4 * 1024 * 1024
#: nesting levels of a parsed config (a real config.json nests 3-4 levels: rope_scaling, text_config)
MAX_DEPTH = 64
#: values in one parsed document, aliases counted every time they are reached
MAX_NODES = 200_000
#: longest string value accepted in a parsed document
MAX_STRING_CHARS = 1024 * 1024

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


def clip(value: Any, limit: int = 60) -> str:
    """A repr of ``value`` of at most ``limit`` characters, computed in bounded time."""
    try:
        shown = _REPR.repr(value)
    except Exception:  # a hostile __repr__ must not turn a clear error into a crash
        shown = f"<{type(value).__name__}>"
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def shorten(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters with '...' in the middle (paths keep both ends)."""
    text = str(text)
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return text[:half] + "..." + text[-half:]


def _os_ok(fn, path: str | os.PathLike[str]) -> bool:
    try:
        return bool(fn(Path(path)))
    except (OSError, ValueError):  # ENAMETOOLONG, ELOOP, EACCES, embedded NUL byte
        return False


def path_exists(path: str | os.PathLike[str]) -> bool:
    """``Path.exists`` that answers False for names the OS refuses instead of raising."""
    return _os_ok(Path.exists, path)


def is_file(path: str | os.PathLike[str]) -> bool:
    return _os_ok(Path.is_file, path)


def is_dir(path: str | os.PathLike[str]) -> bool:
    return _os_ok(Path.is_dir, path)


def read_text(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES, what: str = "config file") -> str:
    """The text of a regular file of at most ``limit`` bytes (invalid UTF-8 replaced), else SpecError.

    The file is opened first and checked with ``fstat`` on the open descriptor, so a path that is
    swapped for a FIFO or device between the check and the read is still refused; the read stops
    at ``limit + 1`` bytes whatever the size ``stat`` reports.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise SpecError(f"{shorten(str(p))}: cannot read ({reason})") from None
    try:
        data = _read_regular(fd, limit, p, what)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SpecError(f"{p}: more than {limit} bytes is too large for a {what} (limit {limit})")
    return data.decode("utf-8", errors="replace")


def _read_regular(fd: int, limit: int, p: Path, what: str) -> bytes:
    """At most ``limit + 1`` bytes of the open regular file ``fd``; SpecError for anything else.

    A directory (``fdopen`` would raise IsADirectoryError) and any read error (``/proc/self/mem``
    answers EIO) are one clear line, not a traceback (issue 20).
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        raise SpecError(f"{shorten(str(p))}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise SpecError(f"{shorten(str(p))}: {kind}; a {what} is a regular file")
    size = os.fstat(fd).st_size
    if size > limit:  # said at once (a 2 GB file is not read to find out); /proc files say 0 and are read
        raise SpecError(f"{shorten(str(p))}: {size:,} bytes is too large for a {what} (limit {limit:,})")
    try:
        os.set_blocking(fd, True)
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
    except OSError as exc:
        raise SpecError(f"{shorten(str(p))}: cannot read ({exc.strerror or exc}); a {what} is a "
                        "regular file") from None
    return b"".join(chunks)


def check_tree(data: Any, where: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
               max_string: int = MAX_STRING_CHARS) -> Any:
    """Return ``data`` unchanged if it is a reasonable parsed document, else raise SpecError.

    Iterative (no recursion limit to hit) and bounded: stops after ``max_nodes`` visits.
    """
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise SpecError(f"{where}: more than {max_nodes:,} values (YAML aliases counted each time "
                            "they are used); a config file is far smaller")
        if isinstance(obj, str):
            if len(obj) > max_string:
                raise SpecError(f"{where}: a text value of {len(obj):,} characters (limit {max_string:,})")
            continue
        if isinstance(obj, dict):
            children = [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set)):
            children = list(obj)
        else:
            continue
        if depth >= max_depth and children:
            raise SpecError(f"{where}: nested more than {max_depth} levels deep; a config file is flat")
        stack.extend((c, depth + 1) for c in children)
    return data


def write_atomic(path: str | Path, text: str, what: str = "report") -> Path:
    """Write ``text`` to ``path`` via a temporary file in the same folder and an atomic rename.

    A reader never sees a half-written report; a crash leaves the previous file intact.
    """
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise SpecError(f"{p}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:  # a read-only folder
        raise TrainledgerError(f"{p}: cannot write the {what} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be shared
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):  # a full disk or a read-only folder: one clear line, file intact
            raise TrainledgerError(f"{p}: cannot write the {what} ({exc.strerror or exc}); "
                                   "any previous file there is unchanged") from None
        raise
    return p
