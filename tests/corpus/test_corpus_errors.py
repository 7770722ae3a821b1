"""Bad input: empty, malformed, missing fields, binary garbage, mixed encodings, truncation, bombs."""

from __future__ import annotations

import gzip
import json
import os
import sys

import pytest

from trainledger.corpus import CorpusOptions, analyze
from trainledger.errors import CorpusError, MissingDependency


def _run(paths, **kw):
    kw.setdefault("workers", 1)
    return analyze([str(p) for p in paths], CorpusOptions(**kw))


def _lines(path, lines: list[bytes]):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def good(i: int) -> bytes:
    return json.dumps({"text": "word " * (i % 7 + 1)}).encode()


def test_empty_inputs(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(CorpusError, match="empty"):
        _run([tmp_path / "empty.jsonl"])
    _lines(tmp_path / "ok.jsonl", [good(1)])
    stats = _run([tmp_path / "empty.jsonl", tmp_path / "ok.jsonl"])
    assert stats["samples"] == 1 and any("hold no records" in w for w in stats["warnings"])


@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_malformed_lines_are_located_counted_skipped_or_fatal(tmp_path, chunk):
    lines = [good(i) for i in range(2000)]
    lines[2] = b'{"text": "unterminated'
    lines[1499] = b"[1, 2"
    path = _lines(tmp_path / "m.jsonl", lines)
    stats = _run([path], chunk_bytes=chunk)  # 4 KiB chunks: line numbers must survive the split
    assert stats["samples"] == 1998 and stats["records"] == 2000
    assert stats["errors"]["by_kind"] == {"malformed": 2}
    assert stats["errors"]["examples"][0].startswith(f"{path}:3: not valid JSON")
    assert stats["errors"]["examples"][1].startswith(f"{path}:1500: not valid JSON")
    assert any("skipped 2 bad records" in w for w in stats["warnings"])
    with pytest.raises(CorpusError, match=r"m\.jsonl:3: not valid JSON.*--on-error fail"):
        _run([path], chunk_bytes=chunk, on_error="fail")


def test_missing_field_names_the_fields_that_exist(tmp_path):
    path = _lines(tmp_path / "f.jsonl", [json.dumps({"body": "x", "id": 1}).encode()] * 3)
    with pytest.raises(CorpusError, match=r"no field 'text'; fields: body, id"):
        _run([path], fields=("text",))
    path2 = _lines(tmp_path / "g.jsonl", [json.dumps({"a": 1, "b": [1]}).encode()])
    with pytest.raises(CorpusError, match=r"no text field found; fields: a, b; name one with --field"):
        _run([path2])


def test_binary_garbage(tmp_path):
    rng_bytes = os.urandom(200_000)
    (tmp_path / "junk.jsonl").write_bytes(rng_bytes)
    with pytest.raises(CorpusError, match="no sample could be read"):
        _run([tmp_path / "junk.jsonl"])
    mixed = _lines(tmp_path / "mixed.jsonl", [good(1), b"\x00\x01\x02binary\x00", good(2)])
    stats = _run([mixed])
    assert stats["samples"] == 2 and stats["errors"]["by_kind"] == {"binary": 1}
    assert stats["errors"]["examples"][0].startswith(f"{mixed}:2: binary")


def test_mixed_encodings(tmp_path):
    latin1 = json.dumps({"text": "café crème"}, ensure_ascii=False).encode("latin-1")
    path = _lines(tmp_path / "enc.jsonl", [good(1), latin1, good(2)])
    stats = _run([path])
    assert stats["errors"]["by_kind"] == {"encoding": 1}
    assert f"{path}:2: not valid UTF-8 (byte 0xe9" in stats["errors"]["examples"][0]
    replaced = _run([path], encoding_errors="replace")
    assert replaced["samples"] == 3 and replaced["errors"]["total"] == 0
    assert any("U+FFFD" in w for w in replaced["warnings"])


def test_giant_lines_are_capped_and_counted(tmp_path):
    lines = [good(i) for i in range(10)]
    lines[4] = json.dumps({"text": "x" * 50_000}).encode()
    path = _lines(tmp_path / "g.jsonl", lines + [b'{"bad'])
    stats = _run([path], max_line_bytes=10_000)
    assert stats["samples"] == 9 and stats["errors"]["by_kind"] == {"giant": 1, "malformed": 1}
    assert stats["errors"]["examples"][0].startswith(f"{path}:5: 50,0")
    assert stats["errors"]["examples"][1].startswith(f"{path}:11:")  # numbering continues after the giant


def test_truncated_gzip_keeps_what_was_read(tmp_path):
    data = gzip.compress(b"".join(good(i) + b"\n" for i in range(50_000)))
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    stats = _run([tmp_path / "t.jsonl.gz"])
    assert 10_000 < stats["samples"] < 50_000
    assert stats["errors"]["by_kind"] == {"truncated": 1} and stats["records"] == stats["samples"]
    with pytest.raises(CorpusError, match=r"t\.jsonl\.gz:\d+: file ends early"):
        _run([tmp_path / "t.jsonl.gz"], on_error="fail")


def test_zip_bomb_is_refused(tmp_path):
    line = b'{"text": "' + b"a" * 2000 + b'"}\n'
    (tmp_path / "bomb.jsonl.gz").write_bytes(gzip.compress(line * 12_000, 9))  # 24 MB from ~50 kB
    with pytest.raises(CorpusError, match="zip bomb"):
        _run([tmp_path / "bomb.jsonl.gz"], on_error="fail")
    stats = _run([tmp_path / "bomb.jsonl.gz"])  # skip: what came before the cap counts, loudly
    assert stats["errors"]["by_kind"] == {"unreadable": 1} and stats["samples"] < 12_000
    assert any("zip bomb" in w for w in stats["warnings"])


def test_truncated_parquet_is_skipped_or_fatal(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a b c"] * 100}), str(tmp_path / "ok.parquet"))
    raw = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(raw[: len(raw) // 2])
    stats = _run([tmp_path / "ok.parquet", tmp_path / "cut.parquet"])
    assert stats["samples"] == 100 and stats["errors"]["by_kind"] == {"unreadable": 1}
    with pytest.raises(CorpusError, match="cut.parquet: cannot read parquet"):
        _run([tmp_path / "ok.parquet", tmp_path / "cut.parquet"], on_error="fail")


def test_unknown_inputs(tmp_path):
    (tmp_path / "a.xlsx").write_bytes(b"x")
    with pytest.raises(CorpusError, match=r"unknown file type; accepted: .*\.jsonl"):
        _run([tmp_path / "a.xlsx"])
    with pytest.raises(CorpusError, match="matches no file"):
        _run([str(tmp_path / "*.parquet")])
    with pytest.raises(CorpusError, match="no such file, folder or glob"):
        _run([tmp_path / "missing.jsonl"])
    _lines(tmp_path / "ok.jsonl", [good(1)])
    with pytest.raises(CorpusError, match="huggingface-cli download org/nothing"):
        _run([tmp_path / "ok.jsonl"], tokenizer="org/nothing")
    (tmp_path / "tok.json").write_text("{}")
    with pytest.raises(CorpusError, match="not a tokenizers tokenizer.json"):
        _run([tmp_path / "ok.jsonl"], tokenizer=str(tmp_path / "tok.json"))


def test_missing_pyarrow_names_the_pip_command(tmp_path, monkeypatch):
    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    for mod in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(MissingDependency, match=r"pip install 'trainledger\[corpus\]'"):
        _run([tmp_path / "a.parquet"])


def test_missing_column_in_parquet_names_the_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a b"], "x": [1]}), str(tmp_path / "p.parquet"))
    with pytest.raises(CorpusError, match=r"p\.parquet: no column 'text'; columns: body, x$"):
        _run([tmp_path / "p.parquet"], fields=("text",))
