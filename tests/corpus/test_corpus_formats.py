"""Every input format gives the same statistics as tokenizing the texts directly (numpy summary)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from trainledger.corpus import CorpusOptions, analyze

pa = pytest.importorskip("pyarrow")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.ipc  # noqa: E402,F401
import pyarrow.parquet as pq  # noqa: E402


def assert_matches(stats: dict, lengths: list[int]) -> None:
    a = np.asarray(lengths)
    assert stats["samples"] == a.size
    assert stats["total_tokens"] == int(a.sum())
    assert stats["mean"] == pytest.approx(a.mean(), rel=1e-12)
    for key, q in (("median", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert stats[key] == pytest.approx(np.percentile(a, q), rel=1e-12), key
    assert stats["max"] == a.max() and stats["min"] == a.min()
    assert stats["std"] == pytest.approx(a.std(), rel=1e-9)
    assert stats["approximate"] is False


def run(paths, tok_path, **kw) -> dict:
    kw.setdefault("workers", 1)
    return analyze([str(p) for p in paths], CorpusOptions(tokenizer=str(tok_path), **kw))


def write_jsonl(path: Path, texts: list[str], opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t, "meta": {"lang": "xx"}}, ensure_ascii=False) + "\n")
    return path


def _table(texts):
    return pa.table({"id": list(range(len(texts))), "text": texts})


def _arrow(path: Path, texts: list[str], stream: bool) -> Path:
    table = _table(texts)
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=64):
            w.write_batch(batch)
    return path


def _csv(path: Path, texts: list[str], delimiter: str) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(["id", "text", "label"])
        for i, t in enumerate(texts):
            w.writerow([i, t, "x"])
    return path


WRITERS = {
    "jsonl": lambda d, t: write_jsonl(d / "a.jsonl", t),
    "jsonl.gz": lambda d, t: write_jsonl(d / "a.jsonl.gz", t, gzip.open),
    "json-as-jsonl": lambda d, t: write_jsonl(d / "a.json", t),
    "json.gz-as-jsonl": lambda d, t: write_jsonl(d / "a.json.gz", t, gzip.open),
    "json-array": lambda d, t: _dump(d / "a.json", [{"text": x, "n": i} for i, x in enumerate(t)]),
    "json-data": lambda d, t: _dump(d / "a.json", {"version": 1, "data": [{"text": x} for x in t]}),
    "json-columns": lambda d, t: _dump(d / "a.json", {"id": list(range(len(t))), "text": t}),
    "parquet": lambda d, t: _parquet(d / "a.parquet", t),
    "arrow-file": lambda d, t: _arrow(d / "a.arrow", t, stream=False),
    "arrow-stream": lambda d, t: _arrow(d / "a.arrow", t, stream=True),
    "feather": lambda d, t: _feather(d / "a.feather", t),
    "csv": lambda d, t: _csv(d / "a.csv", t, ","),
    "tsv": lambda d, t: _csv(d / "a.tsv", t, "\t"),
    "txt-lines": lambda d, t: _write(d / "a.txt", "\n".join(t) + "\n\n"),
}


def _dump(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return path


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _parquet(path: Path, texts: list[str]) -> Path:
    pq.write_table(_table(texts), str(path), row_group_size=50)
    return path


def _feather(path: Path, texts: list[str]) -> Path:
    feather.write_feather(_table(texts), str(path), chunksize=64)
    return path


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_format_matches_direct_tokenization(fmt, tmp_path, texts, tok_path, ref_lengths):
    path = WRITERS[fmt](tmp_path, texts)
    fields = ("text",) if fmt in ("csv", "tsv") else ()
    stats = run([path], tok_path, fields=fields)
    assert_matches(stats, ref_lengths)
    assert stats["errors"]["total"] == 0


def test_zstd(tmp_path, texts, tok_path, ref_lengths):
    zstandard = pytest.importorskip("zstandard")
    raw = write_jsonl(tmp_path / "raw.jsonl", texts).read_bytes()
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert_matches(run([tmp_path / "a.jsonl.zst"], tok_path), ref_lengths)


def test_csv_quoted_newlines_and_tabs(tmp_path, tok, tok_path):
    rows = ["first line\nsecond line, with a comma", 'a "quote" and\ttab', "plain"]
    for delim, name in ((",", "a.csv"), ("\t", "a.tsv")):
        stats = run([_csv(tmp_path / name, rows, delim)], tok_path, fields=("text",))
        assert_matches(stats, [len(tok.encode(r).ids) for r in rows])


def test_txt_one_sample_per_file(tmp_path, texts, tok_path, ref_lengths):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, t in enumerate(texts):
        (folder / f"{i:04d}.txt").write_text(t + "\n", encoding="utf-8")
    stats = run([folder], tok_path, text_mode="file")
    # one whole file per sample: the trailing newline is part of the document
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    assert_matches(stats, [len(tok.encode(t + "\n").ids) for t in texts])


def test_folder_and_glob_of_shards(tmp_path, texts, tok_path, ref_lengths):
    shards = tmp_path / "shards"
    (shards / "sub").mkdir(parents=True)
    write_jsonl(shards / "part-0.jsonl", texts[:150])
    write_jsonl(shards / "sub" / "part-1.jsonl", texts[150:300])
    pq.write_table(_table(texts[300:]), str(shards / "part-2.parquet"))
    (shards / ".hidden.jsonl").write_text("garbage\n")
    assert_matches(run([shards], tok_path), ref_lengths)
    stats = run([str(shards / "*.jsonl"), str(shards / "sub" / "*.jsonl")], tok_path)
    assert_matches(stats, ref_lengths[:300])


def _save_dataset(folder: Path, texts: list[str], shards: int = 2) -> None:
    """The on-disk layout of `datasets.Dataset.save_to_disk`: Arrow IPC streams + state.json."""
    folder.mkdir(parents=True)
    step = -(-len(texts) // shards)
    names = []
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        _arrow(folder / name, texts[k * step:(k + 1) * step], stream=True)
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_fingerprint": "f", "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))


def test_datasets_saved_folder_and_dict(tmp_path, texts, tok_path, ref_lengths):
    _save_dataset(tmp_path / "ds", texts)
    assert_matches(run([tmp_path / "ds"], tok_path), ref_lengths)
    dd = tmp_path / "dd"
    _save_dataset(dd / "train", texts[:300])
    _save_dataset(dd / "test", texts[300:], shards=1)
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert_matches(run([dd], tok_path), ref_lengths[:300])
    assert_matches(run([dd], tok_path, split="test"), ref_lengths[300:])


def test_cached_hub_dataset(tmp_path, monkeypatch, texts, tok_path, ref_lengths):
    snap = tmp_path / "cache" / "org___toy" / "default" / "0.0.0" / "abc123"
    snap.mkdir(parents=True)
    _arrow(snap / "toy-train-00000-of-00002.arrow", texts[:200], stream=True)
    _arrow(snap / "toy-train-00001-of-00002.arrow", texts[200:300], stream=True)
    _arrow(snap / "toy-test.arrow", texts[300:], stream=True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    assert_matches(run(["org/toy"], tok_path), ref_lengths[:300])
    assert_matches(run(["org/toy"], tok_path, split="test"), ref_lengths[300:])


def test_nested_and_multiple_fields(tmp_path, tok, tok_path, texts):
    path = tmp_path / "n.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for t in texts[:50]:
            f.write(json.dumps({"meta": {"body": t}, "title": "Title"}) + "\n")
    assert_matches(run([path], tok_path, fields=("meta.body",)), [len(tok.encode(t).ids) for t in texts[:50]])
    both = run([path], tok_path, fields=("title", "meta.body"))
    assert_matches(both, [len(tok.encode("Title\n" + t).ids) for t in texts[:50]])


def test_wordpiece_tokenizer_and_special_tokens(tmp_path, texts):
    from corpus_fixtures import train_tokenizer

    tok = train_tokenizer(texts, kind="wordpiece")
    tok.save(str(tmp_path / "wp.json"))
    path = write_jsonl(tmp_path / "a.jsonl", texts)
    with_specials = [len(tok.encode(t).ids) for t in texts]
    assert_matches(run([path], tmp_path / "wp.json"), with_specials)
    bare = run([path], tmp_path / "wp.json", add_special_tokens=False)
    assert bare["total_tokens"] == sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
    assert bare["total_tokens"] == sum(with_specials) - 2 * len(texts)


def test_parallel_equals_serial_and_direct(tmp_path, texts, tok_path, ref_lengths):
    """Byte-range chunks split lines across 4 KiB boundaries; 2 processes must count every line once."""
    many = texts * 5
    path = write_jsonl(tmp_path / "a.jsonl", many)
    pq.write_table(_table(many), str(tmp_path / "b.parquet"), row_group_size=100)
    serial = run([path, tmp_path / "b.parquet"], tok_path, workers=1, chunk_bytes=4096)
    parallel = run([path, tmp_path / "b.parquet"], tok_path, workers=2, chunk_bytes=4096)
    assert_matches(serial, ref_lengths * 10)
    assert_matches(parallel, ref_lengths * 10)
    assert parallel["throughput"]["workers"] == 2
    assert parallel["histogram"] == serial["histogram"] and parallel["padding"] == serial["padding"]
