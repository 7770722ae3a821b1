"""Find the files of a dataset and say what format each one is in.

Accepted inputs (each PATH argument of ``trainledger corpus``):

* a file: ``.jsonl``/``.ndjson``, ``.json`` (an array of records, ``{"data": [...]}``, a mapping of
  equal-length columns, or JSON Lines under a ``.json`` name), ``.parquet``, ``.arrow`` (Arrow IPC
  file or stream), ``.feather``, ``.csv``, ``.tsv``, ``.txt``/``.text`` (one sample per line,
  or per file with ``text_mode="file"``); any of them compressed as ``.gz`` or ``.zst``;
* a folder: every such file below it, sorted — or, when it holds ``state.json`` /
  ``dataset_dict.json``, a Hugging Face ``datasets`` dataset saved with ``save_to_disk``;
* a glob such as ``shards/*.jsonl.zst``;
* a Hub dataset id (``org/name``) found in the local ``datasets`` cache (``load_dataset`` output).
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from trainledger.errors import CorpusError

#: file suffix -> format name
SUFFIX_FORMATS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
    ".arrow": "arrow", ".feather": "feather", ".ipc": "arrow", ".csv": "csv", ".tsv": "tsv",
    ".txt": "txt", ".text": "txt",
}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
ACCEPTED = ", ".join(sorted(SUFFIX_FORMATS)) + " (optionally .gz/.zst)"

_ARROW_FILE_MAGIC = b"ARROW1"
#: ``{builder}-{split}.arrow`` or ``{builder}-{split}-00000-of-00004.arrow`` in the datasets cache
_CACHE_SPLIT = re.compile(r"-([^-]+)(?:-\d{5}-of-\d{5})?\.arrow$")
_FEATHER_V1_MAGIC = b"FEA1"


@dataclass(frozen=True)
class Source:
    """One input file: its path, format, compression and size on disk (bytes)."""

    path: str
    fmt: str
    compression: str | None
    size: int

    def to_dict(self) -> dict:
        return {"path": self.path, "format": self.fmt, "compression": self.compression, "bytes": self.size}


def split_suffixes(path: str) -> tuple[str | None, str | None]:
    """(format, compression) from a file name, e.g. 'a.jsonl.zst' -> ('jsonl', 'zstd')."""
    p = Path(path)
    comp = COMPRESSIONS.get(p.suffix.lower())
    if comp:
        p = p.with_suffix("")
    return SUFFIX_FORMATS.get(p.suffix.lower()), comp


def _peek(path: str, n: int = 4096, compression: str | None = None) -> bytes:
    """The first n bytes of a file, decompressed (b"" when they cannot be decompressed here)."""
    try:
        if compression == "gzip":
            import gzip

            with gzip.open(path, "rb") as g:
                return g.read(n)
        if compression == "zstd":
            import zstandard

            with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as z:
                return z.read(n)
    except (ImportError, OSError, EOFError, ValueError):
        return b""
    with open(path, "rb") as f:
        return f.read(n)


def _json_flavor(path: str, compression: str | None) -> str:
    """A ``.json`` file holding JSON Lines is read as JSONL; one JSON document stays 'json'."""
    head = _peek(path, 1 << 16, compression).lstrip()
    if not head.startswith(b"{"):
        return "json"
    first, _, rest = head.partition(b"\n")
    try:
        json.loads(first)
    except ValueError:
        return "json"
    return "jsonl" if rest.strip() else "json"


def _arrow_flavor(path: str, fmt: str) -> str:
    head = _peek(path, 8)
    if head.startswith(_ARROW_FILE_MAGIC):
        return "arrow-file"
    if head.startswith(_FEATHER_V1_MAGIC):
        return "feather-v1"
    if fmt == "feather" and not head:
        return "arrow-file"
    return "arrow-stream"


def make_source(path: str, text_mode: str = "line") -> Source:
    """Classify one file; raise CorpusError for a name we cannot read."""
    fmt, comp = split_suffixes(path)
    if fmt is None:
        raise CorpusError(f"{path}: unknown file type; accepted: {ACCEPTED}")
    if comp and fmt in ("parquet", "arrow", "feather"):
        raise CorpusError(f"{path}: {fmt} files are compressed inside; decompress the outer {comp} first")
    if fmt == "json":
        fmt = _json_flavor(path, comp)
    elif fmt in ("arrow", "feather"):
        fmt = _arrow_flavor(path, fmt)
    elif fmt == "txt" and text_mode == "file":
        fmt = "txt-file"
    return Source(path=path, fmt=fmt, compression=comp, size=os.path.getsize(path))


#: a datasets state.json / dataset_dict.json is a few KB; more is not one
_MAX_META_BYTES = 4 * 1024 * 1024


def _read_meta(path: Path) -> object:
    from trainledger.errors import SpecError
    from trainledger.safety import read_text

    try:
        return json.loads(read_text(path, _MAX_META_BYTES, what="datasets metadata file"))
    except SpecError as exc:
        raise CorpusError(str(exc)) from None


def _plain_name(value: object) -> bool:
    """A file or folder name inside the dataset folder: no separators, not '.'/'..' (issue 20)."""
    return (isinstance(value, str) and value not in ("", ".", "..") and "/" not in value
            and "\\" not in value and "\x00" not in value)


def _saved_dataset_files(folder: Path, split: str | None, nested: bool = False) -> list[str] | None:
    """Arrow files of a ``datasets`` save_to_disk folder (Dataset or DatasetDict), else None."""
    state = folder / "state.json"
    if state.is_file():
        try:
            files = _read_meta(state)["_data_files"]  # type: ignore[index]
            names = [f["filename"] for f in files]
        except (KeyError, TypeError) as exc:
            raise CorpusError(f"{state}: not a datasets state.json ({exc})") from None
        except ValueError as exc:
            raise CorpusError(f"{state}: not a datasets state.json ({exc})") from None
        bad = next((n for n in names if not _plain_name(n)), None)
        if bad is not None:
            raise CorpusError(f"{state}: data file name {str(bad)[:80]!r} is not a file of this folder")
        return [str(folder / n) for n in names]
    ddict = folder / "dataset_dict.json"
    if ddict.is_file() and not nested:
        try:
            splits = list(_read_meta(ddict)["splits"])  # type: ignore[index]
        except (KeyError, TypeError) as exc:
            raise CorpusError(f"{ddict}: not a datasets dataset_dict.json ({exc})") from None
        except ValueError as exc:
            raise CorpusError(f"{ddict}: not a datasets dataset_dict.json ({exc})") from None
        bad = next((s for s in splits if not _plain_name(s)), None)
        if bad is not None:
            raise CorpusError(f"{ddict}: split {str(bad)[:80]!r} is not a folder name of this dataset")
        chosen = _choose_splits([str(s) for s in splits], split, str(folder))
        out: list[str] = []
        for s in chosen:
            out += _saved_dataset_files(folder / s, None, nested=True) or []
        return out
    return None


def _choose_splits(splits: list[str], split: str | None, where: str) -> list[str]:
    if split is None:
        return ["train"] if "train" in splits else splits
    if split not in splits:
        raise CorpusError(f"{where}: no split {split!r}; splits: {', '.join(splits)}")
    return [split]


def _regular(path: str) -> bool:
    """A regular file (following symlinks): a FIFO, socket or device — e.g. a ``/dev/zero`` symlink
    named ``x.csv`` — would hang or never end, so a folder scan leaves it out (issue 20)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _walk(folder: Path) -> list[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(root, name)
            if not name.startswith(".") and split_suffixes(name)[0] is not None and _regular(path):
                found.append(path)
    return found


def hf_datasets_cache() -> Path:
    """The local ``datasets`` cache folder (HF_DATASETS_CACHE, else HF_HOME/datasets)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "datasets"


def _cached_hub_dataset(ref: str, split: str | None) -> list[str] | None:
    """Arrow files of ``load_dataset(ref)`` output in the local cache, newest version first."""
    if "/" not in ref or ref.count("/") > 1 or any(c in ref for c in "*?["):
        return None
    root = hf_datasets_cache() / ref.replace("/", "___")
    if not root.is_dir():
        return None
    arrows = sorted(root.glob("*/*/*/*.arrow"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not arrows:
        return None
    newest = arrows[0].parent
    files = sorted(str(p) for p in newest.glob("*.arrow"))
    split_of = {f: m.group(1) for f in files if (m := _CACHE_SPLIT.search(Path(f).name))}
    if split_of:
        chosen = _choose_splits(sorted(set(split_of.values())), split, str(newest))
        files = [f for f in files if split_of.get(f) in chosen]
    return files


def discover(paths: list[str], text_mode: str = "line", split: str | None = None) -> list[Source]:
    """Every input file named by PATH arguments (files, folders, globs, cached Hub ids)."""
    if not paths:
        raise CorpusError("no input: give one or more files, folders or globs")
    files: list[str] = []
    for ref in paths:
        p = Path(ref)
        if p.is_file():
            files.append(str(p))
        elif p.exists() and not p.is_dir():
            raise CorpusError(f"{ref}: not a regular file (a FIFO, socket or device); give a data file")
        elif p.is_dir():
            saved = _saved_dataset_files(p, split)
            found = saved if saved is not None else _walk(p)
            if not found:
                raise CorpusError(f"{ref}: folder holds no readable data files ({ACCEPTED})")
            files += found
        elif any(c in ref for c in "*?["):
            found = sorted(f for f in glob.glob(ref, recursive=True) if _regular(f))
            if not found:
                raise CorpusError(f"{ref}: the pattern matches no file")
            files += found
        else:
            cached = _cached_hub_dataset(ref, split)
            if cached is None:
                raise CorpusError(f"{ref}: no such file, folder or glob, and no cached Hub dataset of "
                                  f"that name in {hf_datasets_cache()}")
            files += cached
    seen: set[str] = set()
    unique = [f for f in files if not (f in seen or seen.add(f))]
    odd = next((f for f in unique if not _regular(f)), None)
    if odd is not None:
        raise CorpusError(f"{odd}: not a regular file (a FIFO, socket, device or missing); give a data file")
    return [make_source(f, text_mode) for f in unique]
