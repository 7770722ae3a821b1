"""Issue 20: every hostile file is one clear line (or a counted report), in bounded memory and time.

Each case of hostile20.py (config.json, plan files, --from configs and launch scripts, corpus
inputs, damaged ledgers) runs as a ``trainledger`` command in a fresh subprocess at a small scale:
no traceback, no hang, no crash, peak RSS under the limit. Then the corpus answers themselves:
nothing is lost to trailing gzip data, special files in a folder are left out, a giant line is
scanned once, a streamed JSON array reads exactly what ``json.loads`` reads.
"""

from __future__ import annotations

import gzip
import json
import os
import time

import pytest
from hostile20 import ALL_CASES, RSS_LIMIT_MB, run_case

from trainledger.corpus import CorpusOptions, analyze
from trainledger.errors import CorpusError

SCALE = 0.05


@pytest.mark.parametrize("case", ALL_CASES, ids=[f"{c.kind}: {c.name}" for c in ALL_CASES])
def test_hostile_input_is_one_clear_line(tmp_path, case):
    o = run_case(case, tmp_path, SCALE, timeout_s=60)
    assert o.status in ("ok", "clean error"), o
    assert 0 < o.rss_mb < RSS_LIMIT_MB, o
    if o.status == "clean error":
        assert len(o.line) < 400 and "Traceback" not in o.line


def _opts(**kw):
    return CorpusOptions(workers=1, **kw)


def test_gzip_trailing_garbage_loses_no_record(tmp_path):
    recs = "".join(json.dumps({"text": f"record {i} " * 40}) + "\n" for i in range(500)).encode()
    p = tmp_path / "d.jsonl.gz"
    p.write_bytes(gzip.compress(recs) + b"trailing garbage" * 64)
    s = analyze([str(p)], _opts())
    assert s["samples"] == 500 and s["errors"]["by_kind"] == {"truncated": 1}


def test_special_files_in_a_folder_are_left_out(tmp_path):
    (tmp_path / "good.jsonl").write_text('{"text": "fine"}\n' * 20)
    os.mkfifo(tmp_path / "pipe.jsonl")
    os.symlink("/dev/zero", tmp_path / "zero.csv")
    s = analyze([str(tmp_path)], _opts())
    assert s["samples"] == 20 and s["inputs"]["files"] == 1
    with pytest.raises(CorpusError, match="not a regular file"):
        analyze([str(tmp_path / "pipe.jsonl")], _opts())


def test_a_giant_line_is_scanned_once(tmp_path):
    p = tmp_path / "one.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"text": "short"}\n')
        f.truncate(256 << 20)  # then 256 MiB of NUL bytes without a newline (sparse)
    t0 = time.monotonic()
    s = analyze([str(p)], _opts(chunk_bytes=1 << 20))  # 256 work units inside the one line
    assert time.monotonic() - t0 < 20
    assert s["samples"] == 1 and s["errors"]["by_kind"] == {"giant": 1}


TRICKY = [{"text": 'quote " and \\ backslash ] } , [ {'}, {"text": "\u00e9\u4e2d \\u005d"}, None, 3, "str",
          {"messages": [{"role": "user", "content": "[nested, {list}]"}]}, {"text": ""}, {"a": [[[]]]}]


@pytest.mark.parametrize("wrap", [False, True])
def test_a_streamed_json_array_reads_what_json_loads_reads(tmp_path, monkeypatch, wrap):
    from trainledger.corpus import jsonstream
    from trainledger.corpus.options import CorpusOptions as Opts
    from trainledger.corpus.sources import make_source

    monkeypatch.setattr(jsonstream, "STREAM_OBJECT_BYTES", 0)  # stream the {"data": [...]} shape too
    recs = [{"text": "x"}] + TRICKY * 50
    doc = {"data": recs} if wrap else recs
    p = tmp_path / "d.json"
    p.write_text(json.dumps(doc, indent=1))
    got = list(jsonstream.array_items(make_source(str(p)), Opts()))
    assert got == recs


def test_a_json_array_that_does_not_end_is_one_error(tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('[{"text": "a"}, {"text": "b"}, {"text": "c')
    try:
        s = analyze([str(p)], _opts())
    except CorpusError as exc:  # nothing could be read: one error line
        assert "does not end" in str(exc)
    else:  # the records before the cut are counted, the cut is one counted error
        assert s["samples"] == 2 and s["errors"]["by_kind"] == {"unreadable": 1}, s["errors"]
